#!/usr/bin/env python3
"""MoE layer baselines (torch.distributed on NCCL, one process per GPU, bf16) on moe_bench's shape
list and routing, timed as moe_bench.cu times ours (2 warm-up calls, one timed call that sizes
the batches, each impl run back to back for --sustain-ms, then --batches batches of
back-to-back calls between CUDA events on rank 0, a barrier and a sync before each; the median
of the per-call batch means).

impls per (op, shape):
  torch_a2a_grouped_mm   moeDispatchGemm as torch users write it: the per-expert counts exchanged
                         with all_to_all_single (read on the host: the row split sizes), the
                         pairs' rows sorted by expert and sent with all_to_all_single, the
                         received rows put in expert order, then torch._grouped_mm with the
                         local experts' W1 (experts × ffn × hidden, as a transposed view)
  torch_a2a              moeCombine: the expert rows (the received rows themselves, hidden wide)
                         back to source order and home with all_to_all_single, then the weighted
                         sum per token in fp32
Each impl's output is checked before it is timed: the grouped GEMM against an fp32 reference per
expert (the bound of bench/common/check.h), the combine against x_t · Σ_q w_q.

  torchrun --nproc-per-node W torch_moe_dist.py --shapes bench/shapes/moe_layer.txt --out rows.jsonl

Routing (moe_bench.cu's): token t of rank s picks experts (b + q · max(1, E // k)) mod E for q < k,
b = splitmix64 chain (seed, s, t) mod E (uniform) or mod ceil(E / 4) (skewed); slot q's weight
(q + 1) / (k (k + 1) / 2). NCCL_NVLS_ENABLE=0 must be set (run.sh does).
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
import torch_dist  # noqa: E402

MASK = (1 << 64) - 1


def splitmix(z):
    z = (z + 0x9E3779B97F4A7C15) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def routing(tokens, experts, topk, kind, seed, rank):
    """Rank `rank`'s (ids, weights) as lists of T lists of k, moe_bench.cu's rule."""
    step = max(1, experts // topk)
    bases = (experts + 3) // 4 if kind == "skewed" else experts
    r0 = splitmix(splitmix(seed) ^ rank)
    ids = []
    for t in range(tokens):
        b = splitmix(r0 ^ t) % bases
        ids.append([(b + q * step) % experts for q in range(topk)])
    wts = [[(q + 1) / (topk * (topk + 1) / 2) for q in range(topk)]] * tokens
    return ids, wts


def read_shapes(path):
    out = []
    for line in open(path):
        w = line.split("#")[0].split()
        if not w:
            continue
        if len(w) != 7 or w[6] not in ("uniform", "skewed"):
            raise SystemExit(f"{path}: expected '<label> <hidden> <ffn> <experts> <topk> <tokens> "
                             f"<uniform|skewed>', got {line!r}")
        out.append((w[0], int(w[1]), int(w[2]), int(w[3]), int(w[4]), int(w[5]), w[6]))
    return out


def split_count(n, w, r):
    return n // w + (1 if r < n % w else 0)


def split_offset(n, w, r):
    return r * (n // w) + min(r, n % w)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", required=True)
    ap.add_argument("--out", default="")
    ap.add_argument("--seed", type=int, default=12345)
    ap.add_argument("--batch-ms", type=float, default=25.0)
    ap.add_argument("--batches", type=int, default=7)
    ap.add_argument("--sustain-ms", type=float, default=500.0)
    args = ap.parse_args()
    shapes = read_shapes(args.shapes)

    import torch
    import torch.distributed as dist
    rank, world, dev = torch_dist.init()
    torch.backends.cuda.matmul.allow_tf32 = False
    out = open(args.out, "w") if rank == 0 and args.out else None
    failed = 0

    def time_call(call):
        return torch_dist.sized_median_ms(call, dev, args.batch_ms, args.sustain_ms, args.batches)[0]

    for label, H, F, E, K, T, kind in shapes:
        El, first = split_count(E, world, rank), split_offset(E, world, rank)
        ids_l, wts_l = routing(T, E, K, kind, args.seed, rank)
        ids = torch.tensor(ids_l, device=dev, dtype=torch.int64).view(T, K)
        wts = torch.tensor(wts_l, device=dev, dtype=torch.float32).view(T, K)
        g = torch.Generator(device="cuda").manual_seed(1000 + rank)
        x = (torch.rand(T, H, device=dev, generator=g) * 2 - 1).to(torch.bfloat16)
        w1 = (torch.rand(max(El, 1), F, H, device=dev, generator=g) * 2 - 1).to(torch.bfloat16)
        w1t = w1.transpose(1, 2)
        owners_split = [split_count(E, world, p) for p in range(world)]
        state = {}

        def dispatch():
            flat = ids.flatten()
            order = torch.argsort(flat, stable=True)  # pairs by expert, then (token, slot)
            counts_e = torch.bincount(flat, minlength=E).to(torch.int64)
            recv_counts = torch.empty(world * El, device=dev, dtype=torch.int64)
            dist.all_to_all_single(recv_counts, counts_e, [El] * world, owners_split)
            send_rows = counts_e.split(owners_split)
            cm = recv_counts.view(world, El)  # [source][local expert]
            # The host needs the split sizes (the baseline's host round trip).
            sizes = torch.cat([torch.stack([s.sum() for s in send_rows]), cm.sum(1)]).tolist()
            send_split, recv_split = sizes[:world], sizes[world:]
            n = sum(recv_split)
            x_send = x[order // K]
            x_recv = torch.empty(n, H, device=dev, dtype=torch.bfloat16)
            dist.all_to_all_single(x_recv, x_send, recv_split, send_split)
            # Source-major blocks to expert-major order (expert, source, token, slot).
            starts = torch.cumsum(cm.flatten(), 0) - cm.flatten()  # each (s, e) block's start
            lens = cm.t().flatten()
            st_e = starts.view(world, El).t().flatten()
            excl = torch.cumsum(lens, 0) - lens
            perm = torch.repeat_interleave(st_e - excl, lens, output_size=n) + torch.arange(n, device=dev)
            x_exp = x_recv[perm]
            offs = torch.cumsum(cm.sum(0), 0).to(torch.int32)
            y = torch._grouped_mm(x_exp, w1t[:El], offs=offs, out_dtype=torch.bfloat16) if El else x_exp[:, :0]
            state.update(order=order, perm=perm, x_exp=x_exp, offs=offs, send_split=send_split,
                         recv_split=recv_split, y=y)
            return y

        def combine():
            rows = state["x_exp"]  # the expert rows: the received rows sent back unchanged
            back = torch.empty_like(rows)
            back[state["perm"]] = rows
            home = torch.empty(T * K, H, device=dev, dtype=torch.bfloat16)
            dist.all_to_all_single(home, back, state["send_split"], state["recv_split"])
            pairs = torch.empty_like(home)
            pairs[state["order"]] = home
            return (pairs.view(T, K, H).float() * wts[..., None]).sum(1).to(torch.bfloat16)

        # Checks: the grouped GEMM per expert, the combine.
        y = dispatch()
        bad = 0
        offs = [0] + state["offs"].tolist()
        for e in range(El):
            lo, hi = offs[e], offs[e + 1]
            if hi > lo:
                a = state["x_exp"][lo:hi].float()
                b = w1[e].float().t()
                ref, mag = a @ b, a.abs() @ b.abs()
                bad += int((~((y[lo:hi].float() - ref).abs() <= 8e-3 * ref.abs() + 1e-3 * mag + 1e-6)).sum())
        got = combine().float()
        want = (x.float() * wts.sum(1, keepdim=True))
        bad_c = int((~((got - want).abs() <= 8e-3 * want.abs() + 1e-6)).sum())
        verdict = torch.tensor([bad, bad_c], device=dev)
        dist.all_reduce(verdict)
        if int(verdict.sum()):
            if rank == 0:
                print(f"{label}: torch baseline FAILED its check: {verdict.tolist()} mismatches", flush=True)
            failed += 1
            continue
        n_local = offs[-1]
        t_d = time_call(dispatch)
        t_c = time_call(combine)
        if rank == 0:
            sent = T * K * H * 2
            shape = dict(tokens=T, hidden=H, ffn=F, experts=E, topk=K, routing=kind, rows=n_local)
            for op, impl, t, flops in (("moeDispatchGemm", "torch_a2a_grouped_mm", t_d, 2.0 * n_local * F * H),
                                       ("moeCombine", "torch_a2a", t_c, 0.0)):
                row = dict(family="moe", op=op, impl=impl, world=world, shape=shape, dtype="bf16", ms_median=t,
                           tflops=flops / (t * 1e-3) / 1e12 if flops else None, gbps=sent / (t * 1e-3) / 1e9,
                           label=label)
                out and out.write(json.dumps(row) + "\n")
                print(f"{label:22s} W={world} {op:16s} {impl:22s} {t:8.4f} ms", flush=True)
        del x, w1, w1t, state
        torch.cuda.empty_cache()
    torch_dist.finish(out)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
