#!/usr/bin/env python3
"""Power probe: our GEMM (libfc_gemm_bench.so) against cuBLAS (torch.matmul) on one GPU, each
run back to back for seconds, with the SM clock and board power sampled through NVML while it
runs (fused/torch_baselines.py's Clocks).
  gemm_power_probe.py --lib DIR/libfc_gemm_bench.so --shapes FILE [--seconds 4] [--out F.jsonl]
Why: on power-capped H200s the sustained speed is work per joule (fused/NOTES.md, run 14), and
our GEMM takes 1.04-1.13 x cuBLAS's time at gemmReduceScatter's short-K GEMMs in run 18's W = 4
table. Equal clocks with more time per launch say the kernel does more cycles per tile; a
lower clock at the cap says it spends more energy per FLOP. NVML's power reading averages over
about a second, so each impl runs alone for `seconds` (the first half unmeasured) instead of
alternating with the other. Per shape and impl: ms per launch, TFLOP/s, mean SM MHz, mean W,
kilocycles per launch at that clock, and TFLOP per kJ (GFLOP/J).
Shapes file: gemm_shapes.txt's format (op M N K layout ...; bf16 C only here).
"""
import argparse
import ctypes
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "fused"))
from torch_baselines import Clocks  # noqa: E402  (NVML sampling, shared with the fused bench)


def shapes_of(path):
    for line in open(path):
        w = line.split("#")[0].split()
        if len(w) >= 5 and "f32" not in w[5:]:
            yield w[0], int(w[1]), int(w[2]), int(w[3]), w[4]


def run_for(fn, seconds):
    """Launches fn back to back for about `seconds`; returns (launches, elapsed ms by events)."""
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    n, t_end = 0, time.monotonic() + seconds
    e0.record()
    while time.monotonic() < t_end:
        for _ in range(20):
            fn()
        n += 20
        if n % 400 == 0:  # a bounded backlog: the window ends with the GPU's work, not long after
            torch.cuda.current_stream().synchronize()
    e1.record()
    torch.cuda.synchronize()
    return n, e0.elapsed_time(e1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--shapes", required=True)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--out", default="gemm_power.jsonl")
    ap.add_argument("--clusters", default="",
                    help="comma list of GemmArgs::cluster values (0 chosen, 1 single CTAs, 2 CTA "
                         "pairs): ours once per value (impl ours_cN), else once as chosen")
    ap.add_argument("--group-ms", default="",
                    help="comma list of GemmArgs::group_m values (M-blocks per raster group; 0 the "
                         "launch's default, gemm.h): ours once per value (impl ours_gN), single CTAs; DRAM and "
                         "L2 traffic, and so energy per FLOP, depend on it")
    args = ap.parse_args()
    lib = ctypes.CDLL(args.lib)
    lib.fc_gemm_bf16.restype = ctypes.c_int
    lib.fc_gemm_bf16.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int] * 5 + [ctypes.c_void_p]
    lib.fc_gemm_set_cluster.argtypes = [ctypes.c_int]
    lib.fc_gemm_set_group_m.argtypes = [ctypes.c_int]
    lib.fc_gemm_tile_n.argtypes = [ctypes.c_int] * 3
    clocks = Clocks(torch.cuda.current_device())
    if clocks.nvml is None:
        raise SystemExit("NVML not available: no power samples, nothing to report")
    gpu = torch.cuda.get_device_name()
    clusters = [int(v) for v in args.clusters.split(",") if v != ""]
    group_ms = [int(v) for v in args.group_ms.split(",") if v != ""]
    if clusters and group_ms:
        raise SystemExit("--clusters and --group-ms: one at a time")
    out = open(args.out, "w")
    print(f"{'shape':28} {'impl':8} {'ms':>8} {'TF/s':>7} {'MHz':>6} {'W':>5} {'kcyc':>8} {'GF/J':>6}")
    for i, (op, M, N, K, layout) in enumerate(shapes_of(args.shapes)):
        g = torch.Generator(device="cuda").manual_seed(1234)
        a = (torch.rand(M, K, device="cuda", generator=g) * 2 - 1).to(torch.bfloat16)
        kn = layout == "kn"
        b = ((torch.rand((K, N) if kn else (N, K), device="cuda", generator=g) * 2 - 1)
             .to(torch.bfloat16))
        c = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
        stream = torch.cuda.current_stream().cuda_stream

        def ours():
            if lib.fc_gemm_bf16(a.data_ptr(), b.data_ptr(), c.data_ptr(), M, N, K, int(kn), 0,
                                ctypes.c_void_p(stream)) != 0:
                raise RuntimeError("fc_gemm_bf16 failed")

        cublas = (lambda: torch.matmul(a, b)) if kn else (lambda: torch.matmul(a, b.t()))
        # (name, fn, cluster, group_m); None: cuBLAS, nothing to set
        impls = ([(f"ours_c{v}", ours, v, 0) for v in clusters] +
                 [(f"ours_g{v}", ours, 0, v) for v in group_ms]) or [("ours", ours, 0, 0)]
        impls.append(("cublas", cublas, None, None))
        for name, fn, cluster, group_m in impls if i % 2 == 0 else impls[::-1]:  # who goes first alternates
            if cluster is not None:
                lib.fc_gemm_set_cluster(cluster)
                lib.fc_gemm_set_group_m(group_m)
            run_for(fn, args.seconds / 2)  # reach the clock this impl's draw sustains
            key = (op, M, N, K, name)
            with clocks.sampling(key):
                n, ms_total = run_for(fn, args.seconds / 2)
            cnt, mhz_sum, mw_sum = clocks.stats[key]
            ms = ms_total / n
            mhz, watts = mhz_sum / cnt, mw_sum / cnt / 1000
            tflops = 2.0 * M * N * K / (ms * 1e9)
            row = {"op": op, "M": M, "N": N, "K": K, "layout": layout, "impl": name, "ms": ms,
                   "tflops": tflops, "sm_mhz": mhz, "watts": watts, "kcycles": ms * mhz,
                   "gflop_per_j": tflops * 1000 / watts, "samples": cnt, "launches": n,
                   "cluster": cluster, "group_m": group_m,
                   "tile_n": lib.fc_gemm_tile_n(M, N, 0) if cluster is not None else None,
                   "gpu": gpu}
            out.write(json.dumps(row) + "\n")
            print(f"{op + f' {M}x{N}x{K}':28} {name:8} {ms:8.4f} {tflops:7.1f} {mhz:6.0f} "
                  f"{watts:5.0f} {ms * mhz:8.1f} {row['gflop_per_j']:6.2f}", flush=True)
    out.close()


if __name__ == "__main__":
    main()
