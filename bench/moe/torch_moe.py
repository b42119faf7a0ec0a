#!/usr/bin/env python3
"""MoE grouped GEMM on one GPU: ours (libfc_moe_bench.so, moe_lib.cu, through ctypes) against
torch._grouped_mm (bf16, offsets form) and dense cuBLAS (torch.mm of all the rows with one
expert's weight: equal FLOPs), interleaved in one process on the same tensors, so that all run
under the same clocks and temperature.

  torch_moe.py --shapes bench/shapes/moe.txt --lib libfc_moe_bench.so --out rows.jsonl
  torch_moe.py ... --variants t128,t256g1,c66     also ours with the launch's choices forced

Shapes (bench/shapes/moe.txt): "<label> <K> <N> <experts> <rows per expert> <routing> <nk|kn>".
A holds every routed row (rows × K), expert e's rows contiguous (the dispatch's row order);
W holds the experts' weights one after the other: experts × N × K (nk, C_e = A_e · W_eᵀ) or
experts × K × N (kn, C_e = A_e · W_e). routing: `balanced` (every expert <rows per expert>
rows) or `skewed-<seed>` (the same total split by seeded log-normal weights, one expert in eight
given nothing: unequal and empty segments). Variants (--variants, comma list): ours with
tile_n (tNNN), raster height (gNN), CTA count (cNNN) or C's stores (s1: from registers only)
forced (kernels/moe/moe.h, GroupedGemmArgs), rows `fusedcomm_<variant>`.

Protocol as bench/gemm/torch_gemm.py: inputs uniform random bf16 in [-1, 1); every output
checked element by element against an fp32 reference (per expert; ours poisoned first, so an
unwritten row fails) before it is timed; warm-up, then alternating rounds of back-to-back
launches, one CUDA event pair per launch; medians. TFLOP/s = 2 · rows · N · K / t. At the end:
ours / torch._grouped_mm and ours / dense cuBLAS throughput per routing, geometric mean and
worst. Exit 1 on a mismatch.
"""
import argparse
import ctypes
import json
import math
import os
import statistics
import sys


def read_shapes(path):
    out = []
    for line in open(path):
        w = line.split("#")[0].split()
        if not w:
            continue
        if len(w) != 7 or w[6] not in ("nk", "kn") or not (w[5] == "balanced" or w[5].startswith("skewed-")):
            raise SystemExit(f"{path}: expected '<label> <K> <N> <experts> <rows/expert> "
                             f"<balanced|skewed-SEED> <nk|kn>', got {line!r}")
        label, k, n, e, r = w[0], int(w[1]), int(w[2]), int(w[3]), int(w[4])
        if min(k, n, e) < 1 or r < 0:
            raise SystemExit(f"{path}: sizes must be positive: {line!r}")
        out.append((label, k, n, e, r, w[5], w[6] == "kn"))
    return out


def parse_variant(v):
    """'t128g1c66s1' -> dict(tile_n=128, group_m=1, num_ctas=66, tma_store=1)."""
    import re
    keys = {"t": "tile_n", "g": "group_m", "c": "num_ctas", "s": "tma_store"}
    parts = re.findall(r"([tgcs])(\d+)", v)
    if not parts or "".join(a + b for a, b in parts) != v:
        raise SystemExit(f"--variants: {v!r} is not of the form t<tile_n>g<group_m>c<ctas>s<tma_store>")
    return {keys[a]: int(b) for a, b in parts}


def segment_sizes(experts, per_expert, routing):
    """Rows per expert: all equal, or a seeded skewed split of the same total."""
    if routing == "balanced":
        return [per_expert] * experts
    import random
    rng = random.Random(int(routing.split("-", 1)[1]))
    total = experts * per_expert
    w = [math.exp(1.0 * rng.gauss(0, 1)) for _ in range(experts)]
    for e in rng.sample(range(experts), max(1, experts // 8)) if experts > 1 else []:
        w[e] = 0.0
    s = sum(w)
    sizes = [int(total * x / s) for x in w]
    live = [e for e in range(experts) if w[e] > 0]
    for i in range(total - sum(sizes)):  # the rounding's remainder, one row each
        sizes[live[i % len(live)]] += 1
    return sizes


def geomean(xs):
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", required=True, action="append", help="shape file (repeatable)")
    ap.add_argument("--lib", help="libfc_moe_bench.so: time ours too")
    ap.add_argument("--variants", default="", help="ours with forced choices, e.g. t128,g1")
    ap.add_argument("--only", default="", help="run only the labels containing this text")
    ap.add_argument("--out", required=True, help="rows as JSON lines")
    ap.add_argument("--round-ms", type=float, default=25.0)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    shapes = [s for p in args.shapes for s in read_shapes(p) if args.only in s[0]]
    variants = [(v, parse_variant(v)) for v in args.variants.split(",") if v.strip()]

    import torch
    torch.backends.cuda.matmul.allow_tf32 = False  # the reference is fp32
    lib = None
    if args.lib:
        lib = ctypes.CDLL(os.path.abspath(args.lib))
        lib.fc_grouped_gemm_bf16_forced.argtypes = ([ctypes.c_void_p] * 4 + [ctypes.c_int, ctypes.c_long]
                                                    + [ctypes.c_int] * 3 + [ctypes.c_void_p] + [ctypes.c_int] * 4)
        lib.fc_grouped_gemm_bf16_forced.restype = ctypes.c_int
    grouped_mm = getattr(torch, "_grouped_mm", None)

    def time_launches(fn, iters):
        ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
        for e0, e1 in ev:
            e0.record()
            fn()
            e1.record()
        torch.cuda.synchronize()
        return [e0.elapsed_time(e1) for e0, e1 in ev]

    failed = 0
    ratios = {}  # (baseline, routing kind) -> [(ours / baseline throughput, label)]
    with open(args.out, "w") as out:
        for label, K, N, E, per, routing, kn in shapes:
            sizes = segment_sizes(E, per, routing)
            rows = sum(sizes)
            bounds = [0]
            for s in sizes:
                bounds.append(bounds[-1] + s)
            g = torch.Generator(device="cuda").manual_seed(1234)
            a = (torch.rand(rows, K, device="cuda", generator=g) * 2 - 1).to(torch.bfloat16)
            w = (torch.rand((E, K, N) if kn else (E, N, K), device="cuda", generator=g) * 2 - 1).to(torch.bfloat16)
            c = torch.empty(rows, N, device="cuda", dtype=torch.bfloat16)
            offsets = torch.tensor(bounds, device="cuda", dtype=torch.int64)  # ours: E + 1 starts
            offs = torch.tensor(bounds[1:], device="cuda", dtype=torch.int32)  # torch: E ends
            wt = w if kn else w.transpose(1, 2)  # E × K × N view
            w0 = wt[0]
            stream = torch.cuda.current_stream().cuda_stream

            def make_ours(f):
                def run():
                    rc = lib.fc_grouped_gemm_bf16_forced(a.data_ptr(), w.data_ptr(), c.data_ptr(),
                                                         offsets.data_ptr(), E, rows, N, K, int(kn),
                                                         ctypes.c_void_p(stream), f.get("tile_n", 0),
                                                         f.get("num_ctas", 0), f.get("group_m", 0),
                                                         f.get("tma_store", 0))
                    if rc != 0:
                        raise RuntimeError(f"fc_grouped_gemm_bf16 returned cudaError {rc}")
                    return c
                return run

            impls = []
            if lib:
                impls.append(("fusedcomm", make_ours({})))
                impls += [("fusedcomm_" + v, make_ours(f)) for v, f in variants]
            if grouped_mm is not None:
                impls.append(("torch_grouped_mm", lambda: grouped_mm(a, wt, offs=offs, out_dtype=torch.bfloat16)))
            impls.append(("cublas_dense", lambda: torch.mm(a, w0)))

            # The reference in fp32, per expert (and for the dense baseline, of one expert's
            # weight): the exact products and the sums of their magnitudes (the bound's scale).
            ref = torch.empty(rows, N, device="cuda", dtype=torch.float32)
            absdot = torch.empty_like(ref)
            for e in range(E):
                lo, hi = bounds[e], bounds[e + 1]
                if hi > lo:
                    ae, we = a[lo:hi].float(), wt[e].float()
                    torch.mm(ae, we, out=ref[lo:hi])
                    torch.mm(ae.abs(), we.abs(), out=absdot[lo:hi])
            ok = {}
            for name, fn in impls:
                c.fill_(float("nan"))  # ours writes c: an unwritten row fails
                try:
                    got = fn()
                except Exception as ex:  # a baseline that refuses the point: an error row
                    print(f"{label} {routing}: {name} raised {type(ex).__name__}: {ex}", flush=True)
                    ok[name] = False
                    continue
                if name == "cublas_dense":
                    r, ad = a.float() @ w0.float(), a.float().abs() @ w0.float().abs()
                else:
                    r, ad = ref, absdot
                atol = 2e-5 if name.startswith("fusedcomm") else 1e-3
                bad = ~((got.float() - r).abs() <= 8e-3 * r.abs() + atol * ad + 1e-6)
                nb = int(bad.sum())
                ok[name] = nb == 0
                if nb:
                    i = int(bad.flatten().nonzero()[0])
                    print(f"{label} {routing}: {name} FAILED its check: {nb} mismatches, first C[{i // N}, "
                          f"{i % N}] = {got.flatten()[i].item()}, expected {r.flatten()[i].item()}", flush=True)
                del got, r, ad, bad
            del ref, absdot
            torch.cuda.empty_cache()
            if any(not v for n, v in ok.items() if n.startswith("fusedcomm")):
                failed += 1  # ours failed its check (a baseline's failure is an error row only)
            impls = [(n, f) for n, f in impls if ok[n]]
            for _ in range(args.warmup):
                for _, fn in impls:
                    fn()
            probe = max(statistics.median(time_launches(fn, 3)) for _, fn in impls)
            iters = max(5, min(args.iters, int(args.round_ms / max(probe, 1e-3))))
            times = {name: [] for name, _ in impls}
            for _ in range(args.rounds):
                for name, fn in impls:
                    times[name] += time_launches(fn, iters)
            flops = 2.0 * rows * N * K
            shape = dict(experts=E, rows=rows, rows_per_expert=per, n=N, k=K, routing=routing,
                         layout="kn" if kn else "nk", empty=sum(1 for s in sizes if s == 0),
                         max_rows=max(sizes))
            line = f"{label:14s} E={E:3d} rows={rows:6d} {N:5d}x{K:5d} {routing:9s} {shape['layout']}:"
            for name, _ in impls:
                t = statistics.median(times[name])
                row = dict(family="moe", op="groupedGemm", impl=name, world=1, shape=shape, dtype="bf16",
                           ms_median=t, tflops=flops / (t * 1e-3) / 1e12, gbps=None, label=label)
                out.write(json.dumps(row) + "\n")
                line += f" {name} {t:.4f} ms {row['tflops']:.0f} TF/s"
            for name, good in ok.items():
                if not good:
                    out.write(json.dumps(dict(family="moe", op="groupedGemm", impl=name, world=1, shape=shape,
                                              dtype="bf16", ms_median=None, label=label,
                                              error="failed its check")) + "\n")
            if "fusedcomm" in times:
                kind = "balanced" if routing == "balanced" else "skewed"
                tag = "balanced>=512" if kind == "balanced" and per >= 512 else kind
                for base in ("torch_grouped_mm", "cublas_dense"):
                    if base in times:
                        r = statistics.median(times[base]) / statistics.median(times["fusedcomm"])
                        ratios.setdefault((base, tag), []).append((r, f"{label} {per} {routing}"))
                        line += f" ours/{base} {r:.3f}"
            out.flush()
            print(line, flush=True)
            del a, w, c, wt, w0
            torch.cuda.empty_cache()
    if ratios:
        print("\nours / baseline throughput (above 1: ours is faster)")
        print(f"{'baseline':18s} {'routing':14s} {'points':>6s} {'geomean':>8s} {'worst':>7s}  worst point")
        for (base, tag), v in sorted(ratios.items()):
            wv = min(v)
            print(f"{base:18s} {tag:14s} {len(v):6d} {geomean([x[0] for x in v]):8.3f} {wv[0]:7.3f}  {wv[1]}")
    if failed:
        print(f"{failed} point(s) FAILED their check")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
