#!/usr/bin/env python3
"""The torch ring attention baseline: ring attention forward and backward at W ranks (one
process per GPU under torchrun), built the way ring-flash-attention and TransformerEngine's
context parallelism build it, on torch alone (no flash_attn package):

  torchrun --nproc-per-node W torch_ring.py --shapes bench/shapes/ring.txt --out rows.jsonl

Per ring step, the local query block against the K/V block held, through torch's fused SDPA
kernels with their log-sum-exp (`aten._scaled_dot_product_flash_attention` or
`aten._scaled_dot_product_cudnn_attention`), merged into an fp32 output by the log-sum-exp;
the next K/V block moves to the successor with `dist.batch_isend_irecv` while the block
computes. Backward: per step the block's `..._backward` with the merged o and lse, dQ added up
locally in fp32, each K/V block's fp32 dK/dV partial travelling around the ring with it (the
block's own step on the way adds its share) back to its owner. Causal shapes in the zigzag
layout (rank r holds chunks r and 2W-1-r of 2W), others contiguous; GQA: K/V travel with their
own heads and are expanded to the query heads for each block (dK/dV summed back).

Protocol: the whole sequence's q, k uniform in [-2, 2), v, dO in [-1, 1), bf16, generated alike
on every rank from one seed; each rank takes its rows. Each backend's ring is checked first
against a single-GPU SDPA (autograd) over the whole sequence: max |err| <= 2e-2 · max |ref| for
o, dq, dk, dv of this rank's rows, on every rank. Then `warmup` calls of each, `rounds` rounds of
`iters` calls per backend, alternating, each call between CUDA events after a barrier; rank 0's
medians. Rows: torch_ring_flash, torch_ring_cudnn and torch_ring (the faster, `algo` names it),
ops ringAttention and ringAttentionBackward; TFLOP/s per GPU = 4·B·Hq·S²·D / W / t, halved when
causal, backward 2.5 × that. Exit 1 when no backend passes its check on a shape.
"""
import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_attention import read_shapes  # noqa: E402  (bench/shapes/ring.txt: attention.txt's line format)


def positions(seq, world, rank, zigzag):
    """The sequence positions rank holds, in its row order (the product's rule: split.h)."""
    if not zigzag:
        n = seq // world
        return list(range(rank * n, (rank + 1) * n))
    c = seq // (2 * world)
    return list(range(rank * c, (rank + 1) * c)) + list(range((2 * world - 1 - rank) * c, (2 * world - rank) * c))


class Backend:
    """One of torch's fused SDPA kernels with its log-sum-exp, forward and backward, on (B, H, S, D)
    views. lse is kept as (B, H, S, 1) fp32; each kernel's own form is made from it."""

    def __init__(self, name):
        import torch
        self.name = name
        self.aten = torch.ops.aten
        self.aux = {}  # (Sq, Sk, causal) -> the forward's auxiliary outputs for its backward

    def fwd(self, q, k, v, causal):
        if self.name == "flash":
            r = self.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal, False)
        else:
            r = self.aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, causal, False)
        out, lse = r[0], r[1]
        key = (q.shape[2], k.shape[2], causal)
        if key not in self.aux:
            self.aux[key] = (tuple(r[2:8]), lse.dim())
        lse = lse.reshape(lse.shape[0], lse.shape[1], -1)[:, :, : q.shape[2]]
        return out, lse.unsqueeze(-1)

    def bwd(self, dout, q, k, v, out, lse, causal):
        (cum_q, cum_k, max_q, max_k, seed, offset), lse_dim = self.aux[(q.shape[2], k.shape[2], causal)]
        lse = lse.contiguous() if lse_dim == 4 else lse.squeeze(-1).contiguous()
        if self.name == "flash":
            return self.aten._scaled_dot_product_flash_attention_backward(
                dout, q, k, v, out, lse, cum_q, cum_k, max_q, max_k, 0.0, causal, seed, offset)
        return self.aten._scaled_dot_product_cudnn_attention_backward(
            dout, q, k, v, out, lse, seed, offset, None, cum_q, cum_k, max_q, max_k, 0.0, causal)


class Ring:
    """Ring attention over the process group for one shape; tensors are (B, H, S_r, D) views of
    (B, S_r, H, D) storage, as a model holds them."""

    def __init__(self, rank, world, causal, q_heads, kv_heads):
        self.rank, self.world, self.causal = rank, world, causal
        self.group = q_heads // kv_heads
        self.next, self.prev = (rank + 1) % world, (rank - 1) % world

    def exchange(self, send, recv):
        """Sends `send` to the successor and receives `recv` from the predecessor, started now."""
        import torch.distributed as dist
        if self.world == 1:
            return []
        # (B, H, S, D) views of (B, S, H, D) storage go as that storage (same bytes, contiguous).
        def dense(t):
            return t if t.is_contiguous() else t.transpose(1, 2)
        ops = [dist.P2POp(dist.isend, dense(t), self.next) for t in send]
        ops += [dist.P2POp(dist.irecv, dense(t), self.prev) for t in recv]
        return dist.batch_isend_irecv(ops)

    def prefetch(self, cur, step):
        """Before ring step `step`'s compute: the next step's K/V block (buffers like `cur`'s)
        started from the predecessor while `cur` goes to the successor; ([], None) at the last."""
        if step + 1 == self.world:
            return [], None
        nxt = (self.like(cur[0]), self.like(cur[1]))
        return self.exchange(cur, nxt), nxt

    def pairs(self, step, s_r):
        """The (query rows, key rows, causal) blocks of ring step `step`: the zigzag rule."""
        all_rows, half = slice(None), s_r // 2
        if not self.causal:
            return [(all_rows, all_rows, False)]
        if step == 0:
            return [(all_rows, all_rows, True)]  # chunks r < 2W-1-r: one causal block
        src = (self.rank - step) % self.world
        if src < self.rank:  # both query chunks see the block's first chunk, neither its second
            return [(all_rows, slice(0, half), False)]
        return [(slice(half, None), all_rows, False)]  # only the second query chunk sees it, all of it

    @staticmethod
    def like(t):
        """An empty tensor laid out as t (a (B, H, S, D) view of (B, S, H, D) storage stays one)."""
        import torch
        return torch.empty_like(t) if t.is_contiguous() else torch.empty_like(t.transpose(1, 2)).transpose(1, 2)

    def expand(self, t):
        return t if self.group == 1 else t.repeat_interleave(self.group, dim=1)

    def reduce_heads(self, t):
        if self.group == 1:
            return t
        b, h, s, d = t.shape
        return t.view(b, h // self.group, self.group, s, d).sum(2)

    def forward(self, be, q, k, v):
        import torch
        import torch.nn.functional as F
        B, H, S, D = q.shape
        out = torch.empty(B, S, H, D, device=q.device, dtype=torch.float32).transpose(1, 2)
        lse = torch.empty(B, H, S, 1, device=q.device, dtype=torch.float32)
        cur = (k, v)
        for step in range(self.world):
            reqs, nxt = self.prefetch(cur, step)
            kx, vx = self.expand(cur[0]), self.expand(cur[1])
            for qs, ks, c in self.pairs(step, S):
                bo, bl = be.fwd(q[:, :, qs], kx[:, :, ks], vx[:, :, ks], c)
                if step == 0:
                    out[:, :, qs] = bo
                    lse[:, :, qs] = bl
                else:
                    o_s, l_s = out[:, :, qs], lse[:, :, qs]
                    o_s.sub_(torch.sigmoid(bl - l_s) * (o_s - bo.float()))
                    l_s.sub_(F.logsigmoid(l_s - bl))
            for r in reqs:
                r.wait()
            if nxt is not None:
                cur = nxt
        o = torch.empty(B, S, H, D, device=q.device, dtype=q.dtype).transpose(1, 2)
        o.copy_(out)
        return o, lse

    def backward(self, be, dout, q, k, v, out, lse):
        import torch
        B, H, S, D = q.shape
        dq = torch.zeros(B, H, S, D, device=q.device, dtype=torch.float32)
        cur = (k, v)
        dkv, dkv_reqs = None, []
        for step in range(self.world):
            reqs, nxt = self.prefetch(cur, step)
            kx, vx = self.expand(cur[0]), self.expand(cur[1])
            part = (torch.zeros(k.shape, device=q.device, dtype=torch.float32),
                    torch.zeros(v.shape, device=q.device, dtype=torch.float32))
            for qs, ks, c in self.pairs(step, S):
                g = be.bwd(dout[:, :, qs], q[:, :, qs], kx[:, :, ks], vx[:, :, ks], out[:, :, qs], lse[:, :, qs], c)
                dq[:, :, qs] += g[0]
                part[0][:, :, ks] += self.reduce_heads(g[1].float())
                part[1][:, :, ks] += self.reduce_heads(g[2].float())
            if dkv is not None:  # the block's partial so far, from the predecessor
                for r in dkv_reqs:
                    r.wait()
                part[0].add_(dkv[0])
                part[1].add_(dkv[1])
            if self.world > 1:  # on to the next rank (after the last step: back to the owner)
                dkv = (torch.empty_like(part[0]), torch.empty_like(part[1]))
                dkv_reqs = self.exchange(part, dkv)
            else:
                dkv = part
            for r in reqs:
                r.wait()
            if nxt is not None:
                cur = nxt
        for r in dkv_reqs:
            r.wait()
        grads = []
        for t in (dq, dkv[0], dkv[1]):
            b, h, s, d = t.shape
            g = torch.empty(b, s, h, d, device=q.device, dtype=q.dtype).transpose(1, 2)
            g.copy_(t)
            grads.append(g)
        return grads


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", required=True)
    ap.add_argument("--out", required=True, help="rows as JSON lines (rank 0)")
    ap.add_argument("--backends", type=lambda x: [i for i in x.split(",") if i], default=["flash", "cudnn"],
                    help="torch's fused SDPA kernels to build the ring on (flash, cudnn; default both)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    for b in args.backends:
        if b not in ("flash", "cudnn"):
            raise SystemExit(f"--backends: unknown backend {b!r} (flash, cudnn)")

    from common import torch_dist
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    rank, world, dev = torch_dist.init()
    torch.backends.cuda.matmul.allow_tf32 = False
    out_file = open(args.out, "w") if rank == 0 else None
    failed = 0

    def barrier():
        dist.barrier(device_ids=[dev.index])

    def timed(fn):
        ts = []
        for _ in range(args.iters):
            barrier()
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            fn()
            e1.record()
            e1.synchronize()
            ts.append(e0.elapsed_time(e1))
        return ts

    for label, B, S, Hq, Hkv, D, causal in read_shapes(args.shapes):
        zigzag = bool(causal)
        if S % (2 * world if zigzag else world):
            raise SystemExit(f"{label}: seq {S} must split into {2 * world if zigzag else world} equal chunks")
        g = torch.Generator(device=dev).manual_seed(1234)
        qf = (torch.rand(B, S, Hq, D, device=dev, generator=g) * 4 - 2).to(torch.bfloat16)
        kf = (torch.rand(B, S, Hkv, D, device=dev, generator=g) * 4 - 2).to(torch.bfloat16)
        vf = (torch.rand(B, S, Hkv, D, device=dev, generator=g) * 2 - 1).to(torch.bfloat16)
        dof = (torch.rand(B, S, Hq, D, device=dev, generator=g) * 2 - 1).to(torch.bfloat16)
        pos = torch.tensor(positions(S, world, rank, zigzag), device=dev)
        q, k, v, do = (t[:, pos].contiguous().transpose(1, 2) for t in (qf, kf, vf, dof))
        # The single-GPU reference over the whole sequence (autograd through SDPA), this rank's rows.
        qr, kr, vr = (t.transpose(1, 2).detach().requires_grad_() for t in (qf, kf, vf))
        o_ref = F.scaled_dot_product_attention(qr, kr, vr, is_causal=bool(causal), enable_gqa=Hq != Hkv)
        o_ref.backward(dof.transpose(1, 2))
        ref = [t[:, :, pos].float() for t in (o_ref.detach(), qr.grad, kr.grad, vr.grad)]
        del qr, kr, vr, o_ref, qf, kf, vf, dof
        torch.cuda.empty_cache()
        ring = Ring(rank, world, bool(causal), Hq, Hkv)
        good = []
        for name in args.backends:
            be = Backend(name)
            try:
                o, lse = ring.forward(be, q, k, v)
                grads = ring.backward(be, do, q, k, v, o, lse)
                torch.cuda.synchronize()
                errs = [((a.float() - r).abs().max() / r.abs().max()).item() for a, r in zip([o, *grads], ref)]
                msg = ""
            except RuntimeError as e:  # a kernel that does not take this shape
                errs, msg = None, str(e).splitlines()[0]
            ok = errs is not None and all(e <= 2e-2 for e in errs)
            verdict = torch.tensor([1 if ok else 0], device=dev)
            dist.all_reduce(verdict, op=dist.ReduceOp.MIN)
            if errs is None:
                print(f"{label}: rank {rank}: torch_ring_{name} unavailable: {msg}", flush=True)
            elif not ok:
                print(f"{label}: rank {rank}: torch_ring_{name} FAILED its check: max |err| / max |ref| of "
                      f"o, dq, dk, dv = {', '.join(f'{e:.2e}' for e in errs)}", flush=True)
            if verdict.item() == 1:
                good.append((name, be, o, lse))
        if not good:
            failed += 1
            continue
        fwd_t = {n: [] for n, *_ in good}
        bwd_t = {n: [] for n, *_ in good}
        for _ in range(args.warmup):
            for n, be, o, lse in good:
                ring.forward(be, q, k, v)
                ring.backward(be, do, q, k, v, o, lse)
        torch.cuda.synchronize()
        for rnd in range(args.rounds):
            for n, be, o, lse in (good if rnd % 2 == 0 else good[::-1]):
                fwd_t[n] += timed(lambda: ring.forward(be, q, k, v))
                bwd_t[n] += timed(lambda: ring.backward(be, do, q, k, v, o, lse))
        if rank == 0:
            flops = 4.0 * B * Hq * S * S * D / (2 if causal else 1) / world
            shape = dict(batch=B, s=S, q_heads=Hq, kv_heads=Hkv, d=D, causal=bool(causal),
                         layout="zigzag" if zigzag else "contiguous")
            line = f"{label:18s} W={world}:"
            for op, times, f in (("ringAttention", fwd_t, flops), ("ringAttentionBackward", bwd_t, 2.5 * flops)):
                med = {n: statistics.median(t) for n, t in times.items()}
                best = min(med, key=med.get)
                for impl, n in [(f"torch_ring_{n}", n) for n in med] + [("torch_ring", best)]:
                    row = dict(family="attention", op=op, impl=impl, world=world, shape=shape, dtype="bf16",
                               ms_median=med[n], tflops=f / (med[n] * 1e-3) / 1e12, gbps=None, label=label,
                               algo=n)
                    out_file.write(json.dumps(row) + "\n")
                line += f" {op} " + " ".join(f"{n} {med[n]:.3f} ms {f / (med[n] * 1e-3) / 1e12:.0f}" for n in med)
            out_file.flush()
            print(line + " TFLOP/s per GPU", flush=True)
        del q, k, v, do, good, ref
        torch.cuda.empty_cache()
    torch_dist.finish(out_file)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
