#!/usr/bin/env python3
"""Variants of our fused ops timed in the same call, against one of them.

Rows: fused_bench's JSON lines, each tagged with "variant" and "round" (builds_lib.sh
variant_rounds). Prints, per (op, shape), the base variant's fused time on its slowest rank
(median over rounds), every other variant's fused time over it, and the base's fused time over
its GEMM alone (ours_gemm, the same reading).
Usage: variant_ratios.py ROWS.jsonl BASE
"""
import collections
import json
import statistics
import sys


def main():
    rows, base = sys.argv[1], sys.argv[2]
    times = collections.defaultdict(list)
    variants = [base]
    for line in open(rows):
        r = json.loads(line)
        if r["variant"] not in variants:
            variants.append(r["variant"])
        times[(r["op"], r["shape"], r["impl"], r["variant"])].append(max(r["ms_ranks"]))
    med = {k: statistics.median(v) for k, v in times.items()}
    others = variants[1:]
    print(f"fused ms of {base} (slowest rank, median of rounds); each variant's fused time / "
          f"{base}'s; {base}'s fused / GEMM")
    print(f"{'op':15} {'shape':22} {base + ' ms':>10}" + "".join(f"{v:>9}" for v in others)
          + f"{'f/GEMM':>9}")
    for op, shape in dict.fromkeys((k[0], k[1]) for k in med):
        b = med.get((op, shape, "ours_fused", base))
        if not b:
            continue
        g = med.get((op, shape, "ours_gemm", base))
        cells = "".join(f"{med[(op, shape, 'ours_fused', v)] / b:9.3f}"
                        if (op, shape, "ours_fused", v) in med else f"{'-':>9}" for v in others)
        print(f"{op:15} {shape:22} {b:10.4f}{cells}{b / g if g else float('nan'):9.3f}")


if __name__ == "__main__":
    main()
