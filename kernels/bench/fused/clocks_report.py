#!/usr/bin/env python3
"""Power or cycles? Per shape, the fused kernel's time, mean SM clock and cycles against our GEMM
alone's, from one local_run.sh run with `--clocks` in FC_BENCH_ARGS:
  clocks_report.py LOCAL_LOG LOCAL_JSONL [--op gemmReduceScatter] [--build NAME]
LOCAL_LOG holds fused_bench's --clocks lines (bench_common.clock_sample); LOCAL_JSONL its rows
(ms_median per impl).
The clock is the mean over the ranks; cycles = time × clock. A fused / GEMM cycle ratio near
the time ratio says the excess is cycles; a clock ratio below 1 says power (the cap leaves the
fused kernel a lower clock). Used for results/run19_h200x4 (README, section 4).
"""
import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import bench_common  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("log")
    ap.add_argument("jsonl")
    ap.add_argument("--op", default="gemmReduceScatter")
    ap.add_argument("--build", default=None, help="rows of this build only (local_run.sh's field)")
    a = ap.parse_args()
    mhz = {}  # (shape, impl name) -> [MHz per rank]
    for text in open(a.log):
        x = bench_common.clock_sample(text)
        if x and x[0] == a.op:
            mhz.setdefault((x[1], x[2]), []).append(x[4])
    ms = {}
    for text in open(a.jsonl):
        r = json.loads(text)
        if r.get("op") != a.op or (a.build and r.get("build") != a.build):
            continue
        ms.setdefault((r["shape"], r["impl"]), []).append(r["ms_median"])
    print(f"{'shape':22} {'fused MHz':>9} {'GEMM MHz':>9} {'time f/g':>9} {'clock f/g':>10} {'cycles f/g':>11}")
    for shape in dict.fromkeys(s for s, _ in mhz):
        f_mhz, g_mhz = mhz.get((shape, "ours_fused")), mhz.get((shape, "ours_gemm"))
        f_ms, g_ms = ms.get((shape, "ours_fused")), ms.get((shape, "ours_gemm"))
        if not (f_mhz and g_mhz and f_ms and g_ms):
            continue
        fc, gc = statistics.mean(f_mhz), statistics.mean(g_mhz)
        ft, gt = statistics.median(f_ms), statistics.median(g_ms)
        print(f"{shape:22} {fc:9.0f} {gc:9.0f} {ft / gt:9.3f} {fc / gc:10.3f} {ft * fc / (gt * gc):11.3f}")


if __name__ == "__main__":
    main()
