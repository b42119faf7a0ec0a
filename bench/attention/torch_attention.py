#!/usr/bin/env python3
"""Attention forward (or, with --backward, backward) baselines: torch scaled_dot_product_attention
with its cuDNN and flash backends on the shapes of a list; with --lib, also ours
(libfc_attn_bench.so, attn_lib.cu, through ctypes), interleaved with them in one process on the
same tensors.

  torch_attention.py --shapes bench/shapes/attention.txt --out rows.jsonl [--lib libfc_attn_bench.so]
  torch_attention.py --backward --shapes bench/shapes/attention_bwd.txt --out rows.jsonl [--lib ...]

Protocol: q, k uniform in [-2, 2), v in [-1, 1), bf16, (B, S, H, D) as ours takes them (torch gets
the (B, H, S, D) views of the same storage). Every output checked against an fp32 reference on
sampled query rows of every (batch, head) before timing (tolerance 6e-3 + 1e-2·|ref|; ours'
lse too). Then `warmup` launches of each, `rounds` rounds of `iters` launches per
implementation, alternating, one CUDA event pair per launch; the median over all timed
launches. TFLOP/s = 4·B·Hq·S²·D / t, halved when causal. Exit 1 on a mismatch.

Backward: dO uniform in [-1, 1) as well; ours takes o and lse from our forward, torch's backends
their own forward's autograd graph, and each call is one backward (torch.autograd.grad of the
SDPA output, retain_graph; ours launch_attention_bwd, δ included). Each implementation's dq of
the query heads of K/V head 0 and dk, dv of K/V head 0 (batch 0) are checked first against an
fp32 reference of the whole sequence (max |err| <= 2e-2 · max |ref| per tensor). TFLOP/s =
2.5 · 4·B·Hq·S²·D / t, halved when causal.
"""
import argparse
import ctypes
import json
import math
import os
import statistics
import sys


def read_shapes(path):
    """<label> <batch> <seq> <q_heads> <kv_heads> <head_dim> <causal 0|1> per line (# comments)."""
    shapes = []
    for line in open(path):
        words = line.split("#")[0].split()
        if not words:
            continue
        if len(words) != 7:
            raise SystemExit(f"{path}: expected '<label> <B> <S> <Hq> <Hkv> <D> <causal>', got {line!r}")
        shapes.append((words[0], *map(int, words[1:])))
    return shapes


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", required=True)
    ap.add_argument("--out", required=True, help="rows as JSON lines")
    ap.add_argument("--lib", help="libfc_attn_bench.so: time ours too, interleaved")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--check-rows", type=int, default=256, help="query rows checked per (batch, head)")
    ap.add_argument("--backward", action="store_true", help="time the backward instead of the forward")
    ap.add_argument("--torch-backends", type=lambda x: [i for i in x.split(",") if i], default=["cudnn", "flash"],
                    help="torch SDPA backends timed beside ours (cudnn, flash; default both)")
    ap.add_argument("--dq-paths", type=lambda x: [int(i) for i in x.split(",") if i], default=[],
                    help="backward: also time these forced dQ paths (1: separate pass, 2: vector "
                         "reductions, 3: TMA reduce-adds)")
    ap.add_argument("--variants", type=lambda x: [tuple(i.split("=", 1)) for i in x.split(",") if i], default=[],
                    help="backward: also time other builds of libfc_attn_bench.so, NAME=PATH,... "
                         "(rows fusedcomm_NAME, their tuned choice)")
    args = ap.parse_args()
    shapes = read_shapes(args.shapes)
    if args.backward:
        sys.exit(run_backward(args, shapes))

    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    torch.backends.cuda.matmul.allow_tf32 = False
    TORCH_BACKENDS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}
    for b in args.torch_backends:
        if b not in TORCH_BACKENDS:
            raise SystemExit(f"--torch-backends: unknown backend {b!r} (cudnn, flash)")
    lib = None
    if args.lib:
        lib = ctypes.CDLL(os.path.abspath(args.lib))
        lib.fc_attention_bf16.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int] * 7 + [ctypes.c_void_p]
        lib.fc_attention_bf16.restype = ctypes.c_int

    def time_launches(fn):
        ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(args.iters)]
        for e0, e1 in ev:
            e0.record()
            fn()
            e1.record()
        torch.cuda.synchronize()
        return [e0.elapsed_time(e1) for e0, e1 in ev]

    failed = 0
    with open(args.out, "w") as out:
        for label, B, S, Hq, Hkv, D, causal in shapes:
            g = torch.Generator(device="cuda").manual_seed(1234)
            q = ((torch.rand(B, S, Hq, D, device="cuda", generator=g) * 4 - 2)).to(torch.bfloat16)
            k = ((torch.rand(B, S, Hkv, D, device="cuda", generator=g) * 4 - 2)).to(torch.bfloat16)
            v = ((torch.rand(B, S, Hkv, D, device="cuda", generator=g) * 2 - 1)).to(torch.bfloat16)
            o = torch.empty(B, S, Hq, D, device="cuda", dtype=torch.bfloat16)
            lse = torch.empty(B, Hq, S, device="cuda", dtype=torch.float32)
            qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
            stream = torch.cuda.current_stream().cuda_stream
            gqa = Hq != Hkv

            def ours():
                rc = lib.fc_attention_bf16(q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), lse.data_ptr(),
                                           B, S, S, Hq, Hkv, D, causal, ctypes.c_void_p(stream))
                if rc != 0:
                    raise RuntimeError(f"fc_attention_bf16 returned cudaError {rc}")
                return o

            def sdpa(backend):
                def fn():
                    with sdpa_kernel(backend):
                        return F.scaled_dot_product_attention(qt, kt, vt, is_causal=bool(causal),
                                                              enable_gqa=gqa).transpose(1, 2)
                return fn

            impls = ([("fusedcomm", ours)] if lib else []) + [
                (f"torch_sdpa_{b}", sdpa(TORCH_BACKENDS[b])) for b in args.torch_backends]
            # fp32 reference on sampled query rows (all of them for short sequences).
            rows = torch.linspace(0, S - 1, min(S, args.check_rows), device="cuda").round().long().unique()
            kf = kt.float().repeat_interleave(Hq // Hkv, dim=1)
            vf = vt.float().repeat_interleave(Hq // Hkv, dim=1)
            qs = qt[:, :, rows].float()
            sc = (qs @ kf.transpose(-1, -2)) / math.sqrt(D)
            if causal:
                sc = sc.masked_fill(torch.arange(S, device="cuda")[None, :] > rows[:, None], float("-inf"))
            ref_lse = torch.logsumexp(sc, dim=-1)
            ref = (torch.softmax(sc, dim=-1) @ vf).transpose(1, 2)  # (B, rows, Hq, D)
            del kf, vf, sc, qs
            good = []
            for name, fn in impls:  # each checked before it is timed
                o.fill_(float("nan"))
                lse.fill_(float("nan"))
                try:
                    got = fn()[:, rows].float()
                except RuntimeError as e:  # a backend that does not take this shape
                    print(f"{label}: {name} unavailable: {str(e).splitlines()[0]}", flush=True)
                    continue
                bad = ~((got - ref).abs() <= 6e-3 + 1e-2 * ref.abs())
                if name == "fusedcomm":
                    bad_l = ~((lse[:, :, rows] - ref_lse).abs() <= 2e-3 + 1e-4 * ref_lse.abs())
                    if bad_l.any():
                        print(f"{label}: {name} lse FAILED its check: {int(bad_l.sum())} mismatches", flush=True)
                        failed += 1
                        continue
                if bad.any():
                    i = int(bad.flatten().nonzero()[0])
                    print(f"{label}: {name} FAILED its check: {int(bad.sum())} mismatches, first "
                          f"{got.flatten()[i].item()} vs {ref.flatten()[i].item()}", flush=True)
                    if name == "fusedcomm":
                        failed += 1
                    continue
                good.append((name, fn))
            del ref, ref_lse
            for _ in range(args.warmup):
                for _, fn in good:
                    fn()
            times = {name: [] for name, _ in good}
            for _ in range(args.rounds):
                for name, fn in good:
                    times[name] += time_launches(fn)
            flops = 4.0 * B * Hq * S * S * D / (2 if causal else 1)
            line = f"{label:16s} B={B:3d} S={S:6d} Hq={Hq} Hkv={Hkv} D={D} causal={causal}:"
            for name, _ in good:
                ms = statistics.median(times[name])
                row = dict(family="attention", op="attention", impl=name, world=1,
                           shape=dict(batch=B, s=S, q_heads=Hq, kv_heads=Hkv, d=D, causal=bool(causal)),
                           dtype="bf16", ms_median=ms, tflops=flops / (ms * 1e-3) / 1e12, gbps=None, label=label)
                out.write(json.dumps(row) + "\n")
                line += f" {name} {row['tflops']:.0f}"
            out.flush()
            print(line + " TFLOP/s", flush=True)
            del q, k, v, o, lse, qt, kt, vt
            torch.cuda.empty_cache()
    sys.exit(1 if failed else 0)


def run_backward(args, shapes):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    torch.backends.cuda.matmul.allow_tf32 = False
    TORCH_BACKENDS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}
    for b in args.torch_backends:
        if b not in TORCH_BACKENDS:
            raise SystemExit(f"--torch-backends: unknown backend {b!r} (cudnn, flash)")
    lib = None
    if args.lib:
        lib = ctypes.CDLL(os.path.abspath(args.lib))
        lib.fc_attention_bf16.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int] * 7 + [ctypes.c_void_p]
        lib.fc_attention_bf16.restype = ctypes.c_int
        lib.fc_attention_backward_bf16.argtypes = ([ctypes.c_void_p] * 11 + [ctypes.c_int] * 8 +
                                                   [ctypes.c_void_p])
        lib.fc_attention_backward_bf16.restype = ctypes.c_int
    if args.variants and not lib:
        raise SystemExit("--variants needs --lib")
    variants = []
    for name, path in args.variants:
        vlib = ctypes.CDLL(os.path.abspath(path))
        vlib.fc_attention_backward_bf16.argtypes = lib.fc_attention_backward_bf16.argtypes
        vlib.fc_attention_backward_bf16.restype = ctypes.c_int
        variants.append((name, vlib))

    def time_launches(fn):
        ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(args.iters)]
        for e0, e1 in ev:
            e0.record()
            fn()
            e1.record()
        torch.cuda.synchronize()
        return [e0.elapsed_time(e1) for e0, e1 in ev]

    failed = 0
    with open(args.out, "w") as out:
        for label, B, S, Hq, Hkv, D, causal in shapes:
            g = torch.Generator(device="cuda").manual_seed(1234)
            q = ((torch.rand(B, S, Hq, D, device="cuda", generator=g) * 4 - 2)).to(torch.bfloat16)
            k = ((torch.rand(B, S, Hkv, D, device="cuda", generator=g) * 4 - 2)).to(torch.bfloat16)
            v = ((torch.rand(B, S, Hkv, D, device="cuda", generator=g) * 2 - 1)).to(torch.bfloat16)
            do = ((torch.rand(B, S, Hq, D, device="cuda", generator=g) * 2 - 1)).to(torch.bfloat16)
            group = Hq // Hkv
            gqa = group != 1
            scale = 1.0 / math.sqrt(D)
            stream = torch.cuda.current_stream().cuda_stream
            # fp32 reference: the query heads of K/V head 0, batch 0, the whole sequence.
            kf, vf = k[0, :, 0].float(), v[0, :, 0].float()
            ref_dq, ref_dk, ref_dv = [], torch.zeros_like(kf), torch.zeros_like(vf)
            for h in range(group):
                qf, gf = q[0, :, h].float(), do[0, :, h].float()
                sc = (qf @ kf.T) * scale
                if causal:
                    sc.masked_fill_(torch.ones(S, S, device="cuda", dtype=torch.bool).triu_(1), float("-inf"))
                p = torch.softmax(sc, dim=-1)
                del sc
                of = p @ vf
                ref_dv += p.T @ gf
                ds = p * (gf @ vf.T - (gf * of).sum(-1, keepdim=True))
                del p
                ref_dq.append((ds @ kf) * scale)
                ref_dk += (ds.T @ qf) * scale
                del ds
            ref_dq = torch.stack(ref_dq, dim=1)  # (S, group, D)

            impls = []
            if lib:
                o = torch.empty_like(q)
                lse = torch.empty(B, Hq, S, device="cuda", dtype=torch.float32)
                delta = torch.empty(B, Hq, S, device="cuda", dtype=torch.float32)
                dq_acc = torch.empty(B, S, Hq, D, device="cuda", dtype=torch.float32)
                dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
                rc = lib.fc_attention_bf16(q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), lse.data_ptr(),
                                           B, S, S, Hq, Hkv, D, causal, ctypes.c_void_p(stream))
                if rc != 0:
                    raise RuntimeError(f"fc_attention_bf16 returned cudaError {rc}")

                def ours(dq_path, impl=lib):
                    def fn():
                        rc = impl.fc_attention_backward_bf16(
                            q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), lse.data_ptr(), do.data_ptr(),
                            dq.data_ptr(), dk.data_ptr(), dv.data_ptr(), delta.data_ptr(), dq_acc.data_ptr(),
                            dq_path, B, S, S, Hq, Hkv, D, causal, ctypes.c_void_p(stream))
                        if rc != 0:
                            raise RuntimeError(f"fc_attention_backward_bf16 returned cudaError {rc}")
                        return dq, dk, dv
                    return lambda: fn
                # ours as users get it, and the dQ path tuning.h did not pick for comparison
                impls.append(("fusedcomm", ours(0)))
                for path in args.dq_paths:
                    impls.append(({1: "fusedcomm_dq_pass", 2: "fusedcomm_dq_red", 3: "fusedcomm_dq_tma"}[path],
                                  ours(path)))
                for name, vlib in variants:
                    impls.append((f"fusedcomm_{name}", ours(0, vlib)))

            def sdpa(backend):
                def make():  # the forward once, then each call one backward
                    qt = q.transpose(1, 2).detach().requires_grad_()
                    kt = k.transpose(1, 2).detach().requires_grad_()
                    vt = v.transpose(1, 2).detach().requires_grad_()
                    with sdpa_kernel(backend):
                        ot = F.scaled_dot_product_attention(qt, kt, vt, is_causal=bool(causal), enable_gqa=gqa)
                    gt = torch.empty_like(ot).copy_(do.transpose(1, 2))

                    def fn():
                        gq, gk, gv = torch.autograd.grad(ot, (qt, kt, vt), gt, retain_graph=True)
                        return gq.transpose(1, 2), gk.transpose(1, 2), gv.transpose(1, 2)
                    return fn
                return make

            impls += [(f"torch_sdpa_{b}", sdpa(TORCH_BACKENDS[b])) for b in args.torch_backends]
            good = []
            for name, make in impls:  # each checked before it is timed
                try:
                    fn = make()
                    gq, gk, gv = fn()
                except RuntimeError as e:  # a backend that does not take this shape
                    print(f"{label}: {name} unavailable: {str(e).splitlines()[0]}", flush=True)
                    if name.startswith("fusedcomm"):
                        failed += 1
                    continue
                bad = []
                for what, got, ref in (("dq", gq[0, :, :group], ref_dq), ("dk", gk[0, :, 0], ref_dk),
                                       ("dv", gv[0, :, 0], ref_dv)):
                    err = (got.float() - ref).abs().max().item()
                    mx = ref.abs().max().item()
                    if not err <= 2e-2 * mx + 1e-5:
                        bad.append(f"{what} max|err| {err:.3e} vs max|ref| {mx:.3e}")
                if bad:
                    print(f"{label}: {name} FAILED its check: {'; '.join(bad)}", flush=True)
                    if name.startswith("fusedcomm"):
                        failed += 1
                    continue
                good.append((name, fn))
            del ref_dq, ref_dk, ref_dv, kf, vf
            for _ in range(args.warmup):
                for _, fn in good:
                    fn()
            times = {name: [] for name, _ in good}
            for _ in range(args.rounds):
                for name, fn in good:
                    times[name] += time_launches(fn)
            flops = 2.5 * 4.0 * B * Hq * S * S * D / (2 if causal else 1)
            line = f"{label:18s} B={B:3d} S={S:6d} Hq={Hq} Hkv={Hkv} D={D} causal={causal}:"
            for name, _ in good:
                ms = statistics.median(times[name])
                row = dict(family="attention", op="attentionBackward", impl=name, world=1,
                           shape=dict(batch=B, s=S, q_heads=Hq, kv_heads=Hkv, d=D, causal=bool(causal)),
                           dtype="bf16", ms_median=ms, tflops=flops / (ms * 1e-3) / 1e12, gbps=None, label=label)
                out.write(json.dumps(row) + "\n")
                line += f" {name} {row['tflops']:.0f}"
            out.flush()
            print(line + " TFLOP/s", flush=True)
            del good, impls
            torch.cuda.empty_cache()
    return 1 if failed else 0


if __name__ == "__main__":
    main()
