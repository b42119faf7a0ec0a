#!/usr/bin/env python3
"""A GEMM timed back to back against the same GEMM after a 64 MiB copy kernel, ours
(libfc_gemm_bench.so from kernels/bench/build_gemm.sh) and cuBLAS (torch.matmul): per-launch
CUDA events, 3 rounds, medians. Prints one line per shape.

  gemm_sequence.py <dir>/libfc_gemm_bench.so

Why: what runs just before a GEMM changes its time by several % on an H200 (kernels/bench/
NOTES.md, 2026-11-24), so one-GPU A/Bs must give both sides the same sequence.
"""
import ctypes
import statistics
import sys

import torch

SHAPES = [(16384, 28672, 8192), (8192, 14336, 4096), (8192, 8192, 8192), (4096, 4096, 7168)]


def main():
    lib = ctypes.CDLL(sys.argv[1])
    lib.fc_gemm_bf16.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int] * 5 + [ctypes.c_void_p]
    stream = torch.cuda.current_stream()

    def ours(a, b, c):
        err = lib.fc_gemm_bf16(a.data_ptr(), b.data_ptr(), c.data_ptr(), a.shape[0], b.shape[0],
                               a.shape[1], 0, 0, ctypes.c_void_p(stream.cuda_stream))
        assert err == 0, f"fc_gemm_bf16 returned {err}"

    def cublas(a, b, c):
        torch.matmul(a, b.t(), out=c)

    src = torch.empty(32 << 20, device="cuda", dtype=torch.float16)  # 64 MiB
    dst = torch.empty_like(src)

    def median_ms(fn, a, b, c, after_copy, n=30):
        """Median per-launch time of fn over n launches, each after a copy if after_copy."""
        ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(n)]
        for _ in range(3):
            fn(a, b, c)
        torch.cuda.synchronize()
        for e0, e1 in ev:
            if after_copy:
                dst.copy_(src)
            e0.record()
            fn(a, b, c)
            e1.record()
        torch.cuda.synchronize()
        return statistics.median(e0.elapsed_time(e1) for e0, e1 in ev)

    gen = torch.Generator(device="cuda").manual_seed(1)
    for M, N, K in SHAPES:
        a = (torch.rand(M, K, device="cuda", generator=gen) * 2 - 1).to(torch.bfloat16)
        b = (torch.rand(N, K, device="cuda", generator=gen) * 2 - 1).to(torch.bfloat16)
        c = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
        runs = {}
        for _ in range(3):
            for name, fn in (("ours", ours), ("cublas", cublas)):
                for after_copy in (False, True):
                    runs.setdefault((name, after_copy), []).append(
                        median_ms(fn, a, b, c, after_copy))
        m = {k: statistics.median(v) for k, v in runs.items()}
        line = f"{M}x{N}x{K}:"
        for name in ("ours", "cublas"):
            b2b, after = m[(name, False)], m[(name, True)]
            line += f" {name} back-to-back {b2b:.4f} ms, after a copy {after:.4f} ({after / b2b:.3f});"
        print(line, flush=True)


if __name__ == "__main__":
    main()
