#!/usr/bin/env python3
"""GEMM baseline: cuBLAS (torch.matmul, bf16) on any list of shapes; with --lib, also our GEMM
(libfc_gemm_bench.so, gemm_lib.cu, through ctypes), interleaved with cuBLAS in one process on
the same tensors, so that both run under the same clocks and temperature.

  torch_gemm.py --shapes bench/shapes/gemm.txt --out rows.jsonl [--lib libfc_gemm_bench.so]
  torch_gemm.py --m 1000 --n 4104 --k 2056 [--m 1 --n 8192 --k 8192] --out rows.jsonl --lib ...
  torch_gemm.py --random 64 [--seed S] [--layouts nk,kn] --out rows.jsonl --lib ...

Shapes: any mix of shape files (--shapes, repeatable: "<label> <M> <N> <K> <nk|kn>" per line),
explicit shapes (--m/--n/--k, repeatable, each a comma list: the i-th M goes with the i-th N and
K, a single value stands for all) and a seeded random set (--random N: M, N and K each uniform
in [1, 16384]; --seed, else one chosen at run time, printed and written into the rows; --align A
rounds N and K up to multiples of A, the engine's own grid without the staged copies). Explicit
and random shapes run in each layout of --layouts (default both: nk, C = A * B^T with B: N x K;
kn, C = A * B with B: K x N). Tensors are dense at the shape as given, nothing padded: ours
takes rows that are not a multiple of 8 elements through its staged launch, whose copies are
inside its timed call (kernels/gemm/gemm.h, launch_gemm_staged).

Protocol: inputs uniform random bf16 in [-1, 1) (never zeros: a GEMM of zeros draws less power and
runs faster); every output checked element by element against an fp32 reference (tolerance:
bench/common/check.h) before it is timed; `warmup` launches of each, then `rounds` rounds of
launches per implementation, alternating (ours, cuBLAS, ours, ...), one CUDA event pair per
launch with no synchronisation in between (`iters` per round, fewer for long GEMMs: about
--round-ms per round, at least 5); the median over all timed launches. Rows of explicit and
random shapes name their set (`set`: "explicit" or "random-<seed>"), which the report
tabulates apart from the shape files' rows. cuBLAS runs as torch runs it by default (split-K
partial sums may be rounded to bf16, so its check allows for that).
Each shape's line names our launch's plan (tile, grid, CTA pairs or consumers taking turns,
stream-K tiles, staged operands). At the end: ours / cuBLAS throughput per set, geometric mean,
worst, and shapes below 0.8. Exit 1 on a mismatch.
"""
import argparse
import ctypes
import json
import os
import statistics
import sys


MAX_DIM = 16384  # the random set's dimensions: uniform in [1, MAX_DIM]


def read_shapes(path):
    shapes = []
    for line in open(path):
        words = line.split("#")[0].split()
        if not words:
            continue
        if len(words) != 5 or words[4] not in ("nk", "kn"):
            raise SystemExit(f"{path}: expected '<label> <M> <N> <K> <nk|kn>', got {line!r}")
        shapes.append((words[0], int(words[1]), int(words[2]), int(words[3]), words[4] == "kn"))
    return shapes


def int_list(text, what):
    try:
        v = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"--{what}: expected integers separated by commas, got {text!r}")
    if not v or any(x < 1 for x in v):
        raise SystemExit(f"--{what}: dimensions must be >= 1, got {text!r}")
    return v


def explicit_shapes(ms, ns, ks):
    """The i-th of each of --m/--n/--k (all occurrences, comma lists joined); a list of one value
    stands for every i."""
    ms, ns, ks = ([x for t in (v or []) for x in int_list(t, w)] for v, w in ((ms, "m"), (ns, "n"), (ks, "k")))
    if not (ms or ns or ks):
        return []
    if not (ms and ns and ks):
        raise SystemExit("--m, --n and --k go together")
    count = max(len(ms), len(ns), len(ks))
    for v, w in ((ms, "m"), (ns, "n"), (ks, "k")):
        if len(v) not in (1, count):
            raise SystemExit(f"--{w}: {len(v)} values where the others give {count}")
    pick = lambda v, i: v[0] if len(v) == 1 else v[i]
    return [(pick(ms, i), pick(ns, i), pick(ks, i)) for i in range(count)]


def random_shapes(count, seed, align=1):
    """count (M, N, K), each uniform in [1, MAX_DIM]; N and K then rounded up to a multiple of
    `align` (down where that passes MAX_DIM)."""
    import random
    rng = random.Random(seed)
    up = lambda x: min(-(-x // align) * align, MAX_DIM // align * align)
    return [(m, up(n), up(k)) for m, n, k in (tuple(rng.randint(1, MAX_DIM) for _ in range(3))
                                               for _ in range(count))]


def shape_list(args):
    """[(set, label, M, N, K, kn)] and the random set's seed (None without one)."""
    layouts = [x.strip() for x in args.layouts.split(",") if x.strip()]
    if not layouts or any(x not in ("nk", "kn") for x in layouts):
        raise SystemExit(f"--layouts: nk, kn or both, got {args.layouts!r}")
    out = []
    for path in args.shapes or []:
        out += [(None,) + s for s in read_shapes(path)]
    for m, n, k in explicit_shapes(args.m, args.n, args.k):
        out += [("explicit", f"{m}x{n}x{k}", m, n, k, lay == "kn") for lay in layouts]
    seed = None
    if args.random:
        if args.random < 0 or args.align < 1:
            raise SystemExit("--random: a count >= 0; --align: >= 1")
        seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
        print(f"random set: {args.random} shapes, M, N, K uniform in [1, {MAX_DIM}], seed {seed}", flush=True)
        name = f"random-{seed}" + (f"-align{args.align}" if args.align > 1 else "")
        for m, n, k in random_shapes(args.random, seed, args.align):
            out += [(name, f"r{m}x{n}x{k}", m, n, k, lay == "kn") for lay in layouts]
    elif args.seed is not None:
        raise SystemExit("--seed goes with --random")
    if not out:
        raise SystemExit("no shapes: give --shapes FILE, --m/--n/--k, or --random N")
    return out, seed


def geomean(xs):
    import math
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", action="append", help="shape file (repeatable)")
    ap.add_argument("--m", action="append", help="M of explicit shapes: a value or a comma list (repeatable)")
    ap.add_argument("--n", action="append", help="N of explicit shapes")
    ap.add_argument("--k", action="append", help="K of explicit shapes")
    ap.add_argument("--random", type=int, default=0, help="this many random shapes")
    ap.add_argument("--seed", type=int, help="the random set's seed (default: chosen and printed)")
    ap.add_argument("--layouts", default="nk,kn", help="layouts of explicit and random shapes")
    ap.add_argument("--align", type=int, default=1,
                    help="round the random set's N and K up to a multiple of this (its set: random-<seed>-align<A>)")
    ap.add_argument("--round-ms", type=float, default=25.0, help="about this long per timed round")
    ap.add_argument("--out", required=True, help="rows as JSON lines")
    ap.add_argument("--lib", help="libfc_gemm_bench.so: time ours too, interleaved")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    shapes, seed = shape_list(args)

    import torch
    torch.backends.cuda.matmul.allow_tf32 = False  # the reference is fp32
    lib = None
    if args.lib:
        lib = ctypes.CDLL(os.path.abspath(args.lib))
        lib.fc_gemm_bf16.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int] * 4 + [ctypes.c_void_p]
        lib.fc_gemm_bf16.restype = ctypes.c_int
        lib.fc_gemm_bf16_plan.argtypes = [ctypes.c_int] * 4 + [ctypes.POINTER(ctypes.c_int)]
        lib.fc_gemm_bf16_plan.restype = ctypes.c_int

    def plan_text(M, N, K, kn):
        """Our launch's plan at a shape (gemm_lib.cu, fc_gemm_bf16_plan), for the log line."""
        p = (ctypes.c_int * 9)()
        rc = lib.fc_gemm_bf16_plan(M, N, K, int(kn), p)
        if rc != 0:
            return f"plan: cudaError {rc}"
        tile, mb, nb, ctas, sk, pingpong, pairs, st_a, st_b = list(p)
        staged = "+".join(x for x, on in (("A", st_a), ("B", st_b)) if on) or "none"
        how = "pairs" if pairs else "turns" if pingpong else "single"
        return f"plan 128x{tile} {mb}x{nb} tiles on {ctas} CTAs {how} stream-K {sk} staged {staged}"

    def time_launches(fn, iters):
        ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(iters)]
        for e0, e1 in ev:
            e0.record()
            fn()
            e1.record()
        torch.cuda.synchronize()
        return [e0.elapsed_time(e1) for e0, e1 in ev]

    failed = 0
    ratios = {}  # set -> [(ours / cuBLAS throughput, label, layout)]
    with open(args.out, "w") as out:
        for sname, label, M, N, K, kn in shapes:
            g = torch.Generator(device="cuda").manual_seed(1234)
            a = (torch.rand(M, K, device="cuda", generator=g) * 2 - 1).to(torch.bfloat16)
            b = (torch.rand((K, N) if kn else (N, K), device="cuda", generator=g) * 2 - 1).to(torch.bfloat16)
            c = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
            stream = torch.cuda.current_stream().cuda_stream
            bt = b if kn else b.t()

            def ours():
                rc = lib.fc_gemm_bf16(a.data_ptr(), b.data_ptr(), c.data_ptr(), M, N, K, int(kn),
                                      ctypes.c_void_p(stream))
                if rc != 0:
                    raise RuntimeError(f"fc_gemm_bf16 returned cudaError {rc}")
                return c

            def cublas():
                return torch.matmul(a, bt)

            impls = ([("fusedcomm", ours)] if lib else []) + [("cublas", cublas)]
            ref = a.float() @ bt.float()
            absdot = a.float().abs() @ bt.float().abs()
            ok = True
            for name, fn in impls:  # each checked before it is timed
                c.fill_(float("nan"))  # ours writes c: an unwritten element fails
                got = fn().float()
                # cuBLAS as torch runs it by default may round split-K partial sums to bf16
                # (allow_bf16_reduced_precision_reduction): a wider bound on the sum of |a*b|.
                atol = 1e-3 if name == "cublas" else 2e-5
                bad = ~((got - ref).abs() <= 8e-3 * ref.abs() + atol * absdot + 1e-6)
                if bad.any():
                    i = int(bad.flatten().nonzero()[0])
                    print(f"{label} {M}x{N}x{K}: {name} FAILED its check: {int(bad.sum())} mismatches, "
                          f"first C[{i}] = {got.flatten()[i].item()}, expected {ref.flatten()[i].item()}",
                          flush=True)
                    ok = False
            del ref, absdot, got
            if not ok:
                failed += 1
                continue
            for _ in range(args.warmup):
                for _, fn in impls:
                    fn()
            # Launches per round: about --round-ms of the slower impl, between 5 and --iters.
            probe = max(statistics.median(time_launches(fn, 3)) for _, fn in impls)
            iters = max(5, min(args.iters, int(args.round_ms / max(probe, 1e-3))))
            times = {name: [] for name, _ in impls}
            for _ in range(args.rounds):
                for name, fn in impls:
                    times[name] += time_launches(fn, iters)
            flops = 2.0 * M * N * K
            line = f"{label:24s} {M:6d} {N:6d} {K:6d} {'kn' if kn else 'nk'}:"
            if lib:
                line = f"{line[:-1]} [{plan_text(M, N, K, kn)}]:"
            for name, _ in impls:
                ms = statistics.median(times[name])
                row = dict(family="gemm", op="gemm", impl=name, world=1,
                           shape=dict(m=M, n=N, k=K, layout="kn" if kn else "nk"), dtype="bf16",
                           ms_median=ms, tflops=flops / (ms * 1e-3) / 1e12, gbps=None, label=label)
                if sname:
                    row["set"] = sname
                if sname and sname.startswith("random-"):
                    row["seed"] = seed
                out.write(json.dumps(row) + "\n")
                line += f" {name} {ms:.4f} ms {row['tflops']:.1f} TFLOP/s"
            if lib:
                r = statistics.median(times["cublas"]) / statistics.median(times["fusedcomm"])
                ratios.setdefault(sname or "shape files", []).append((r, label, "kn" if kn else "nk"))
                line += f" ours/cuBLAS {r:.3f}"
            out.flush()
            print(line, flush=True)
            del a, b, c
            torch.cuda.empty_cache()
    if ratios:
        print("\nours / cuBLAS throughput (above 1: ours is faster)")
        print(f"{'set':24s} {'shapes':>6s} {'geomean':>8s} {'worst':>7s} {'<0.8':>5s}  worst shape")
        for sname, v in ratios.items():
            w = min(v)
            low = sum(1 for x in v if x[0] < 0.8)
            print(f"{sname:24s} {len(v):6d} {geomean([x[0] for x in v]):8.3f} {w[0]:7.3f} {low:5d}  {w[1]} {w[2]}")
    if failed:
        print(f"{failed} shape(s) FAILED their check")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
