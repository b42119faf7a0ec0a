#!/usr/bin/env python3
"""A GEMM timed back to back against the same GEMM after a 64 MiB copy kernel, ours
(libfc_gemm_bench.so from kernels/bench/build_gemm.sh) and cuBLAS (torch.matmul), per-launch
CUDA events, 3 rounds, medians. Usage: gemm_sequence.py <dir>/libfc_gemm_bench.so
(kernels/bench/NOTES.md, 2026-11-24: what precedes a GEMM changes its time by several %)."""
import ctypes, torch, statistics, sys
lib = ctypes.CDLL(sys.argv[1])
lib.fc_gemm_bf16.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int] * 5 + [ctypes.c_void_p]
s = torch.cuda.current_stream()
def ours(a, b, c):
    assert lib.fc_gemm_bf16(a.data_ptr(), b.data_ptr(), c.data_ptr(), a.shape[0], b.shape[0], a.shape[1], 0, 0, ctypes.c_void_p(s.cuda_stream)) == 0
def cub(a, b, c):
    torch.matmul(a, b.t(), out=c)
def run(fn, a, b, c, src, dst, interleave, n=30):
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
    for _ in range(3): fn(a, b, c)
    torch.cuda.synchronize()
    for e0, e1 in ev:
        if interleave: dst.copy_(src)
        e0.record(); fn(a, b, c); e1.record()
    torch.cuda.synchronize()
    return statistics.median(e0.elapsed_time(e1) for e0, e1 in ev)
g = torch.Generator(device="cuda").manual_seed(1)
src = torch.empty(32 << 20, device="cuda", dtype=torch.float16); dst = torch.empty_like(src)
for M, N, K in [(16384, 28672, 8192), (8192, 14336, 4096), (8192, 8192, 8192), (4096, 4096, 7168)]:
    a = (torch.rand(M, K, device="cuda", generator=g) * 2 - 1).to(torch.bfloat16)
    b = (torch.rand(N, K, device="cuda", generator=g) * 2 - 1).to(torch.bfloat16)
    c = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    r = {}
    for rnd in range(3):
        for name, fn in (("ours", ours), ("cublas", cub)):
            for il in (False, True):
                r.setdefault((name, il), []).append(run(fn, a, b, c, src, dst, il))
    m = {k: statistics.median(v) for k, v in r.items()}
    print(f"{M}x{N}x{K}: ours b2b {m[('ours', False)]:.4f} after-copy {m[('ours', True)]:.4f} ratio {m[('ours', True)]/m[('ours', False)]:.3f} | "
          f"cuBLAS b2b {m[('cublas', False)]:.4f} after-copy {m[('cublas', True)]:.4f} ratio {m[('cublas', True)]/m[('cublas', False)]:.3f} | ours/cuBLAS b2b {m[('ours', False)]/m[('cublas', False)]:.3f} after-copy {m[('ours', True)]/m[('cublas', True)]:.3f}", flush=True)
