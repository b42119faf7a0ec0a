#!/usr/bin/env python3
"""GEMM baseline: cuBLAS (torch.matmul, bf16) on the shapes of a list; with --lib, also our GEMM
(libfc_gemm_bench.so, gemm_lib.cu, through ctypes), interleaved with cuBLAS in one process on
the same tensors, so that both run under the same clocks and temperature.

  torch_gemm.py --shapes bench/shapes/gemm.txt --out rows.jsonl [--lib libfc_gemm_bench.so]

Protocol: inputs uniform random bf16 in [-1, 1) (never zeros: a GEMM of zeros draws less power and
runs faster); every output checked element by element against an fp32 reference (tolerance:
bench/common/check.h) before it is timed; `warmup` launches of each, then `rounds` rounds of
`iters` launches per implementation, alternating (ours, cuBLAS, ours, ...), one CUDA event pair
per launch with no synchronisation in between; the median over all timed launches. Exit 1 on a
mismatch.
"""
import argparse
import ctypes
import json
import os
import statistics
import sys


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


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", required=True)
    ap.add_argument("--out", required=True, help="rows as JSON lines")
    ap.add_argument("--lib", help="libfc_gemm_bench.so: time ours too, interleaved")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    shapes = read_shapes(args.shapes)

    import torch
    torch.backends.cuda.matmul.allow_tf32 = False  # the reference is fp32
    lib = None
    if args.lib:
        lib = ctypes.CDLL(os.path.abspath(args.lib))
        lib.fc_gemm_bf16.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int] * 4 + [ctypes.c_void_p]
        lib.fc_gemm_bf16.restype = ctypes.c_int

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
        for label, M, N, K, kn in shapes:
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
                bad = ~((got - ref).abs() <= 8e-3 * ref.abs() + 2e-5 * absdot + 1e-6)
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
            times = {name: [] for name, _ in impls}
            for _ in range(args.rounds):
                for name, fn in impls:
                    times[name] += time_launches(fn)
            flops = 2.0 * M * N * K
            line = f"{label:24s} {M:6d} {N:6d} {K:6d} {'kn' if kn else 'nk'}:"
            for name, _ in impls:
                ms = statistics.median(times[name])
                row = dict(family="gemm", op="gemm", impl=name, world=1,
                           shape=dict(m=M, n=N, k=K, layout="kn" if kn else "nk"), dtype="bf16",
                           ms_median=ms, tflops=flops / (ms * 1e-3) / 1e12, gbps=None, label=label)
                out.write(json.dumps(row) + "\n")
                line += f" {name} {ms:.4f} ms {row['tflops']:.1f} TFLOP/s"
            out.flush()
            print(line, flush=True)
            del a, b, c
            torch.cuda.empty_cache()
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
