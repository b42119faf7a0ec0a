#!/usr/bin/env python3
"""Table of local_run.sh's rows: per (op, tp, partials, shape) and build, the median over rounds
of ours_fused, ours_gemm and their ratio (the fused kernel's local overhead at world 1), and
for two or more builds each build's fused time relative to the first build's.
Usage: local_report.py DIR   (reads DIR/local.jsonl: fused_bench rows plus "build", "round")"""
import json
import math
import os
import statistics
import sys


_ag_seen = set()


def seen_ag(r):
    """allGatherGemm has no partials: keep one run per (build, tp, round, shape, impl)."""
    k = (r["build"], r["tp"], r["round"], r["shape"], r["impl"])
    if k in _ag_seen:
        return True
    _ag_seen.add(k)
    return False


def main():
    d = sys.argv[1]
    rows = {}  # (op, tp, partials, shape, build, impl) -> [ms]
    builds = []
    for line in open(os.path.join(d, "local.jsonl")):
        r = json.loads(line)
        build, tp = r["build"], r["tp"]
        if build not in builds:
            builds.append(build)
        p = r.get("partials") or "-"
        if r["op"] == "allGatherGemm" and seen_ag(r):
            continue
        key = (r["op"], tp, p, r["shape"], build, r["impl"])
        rows.setdefault(key, []).append(r["ms_median"])
    if not rows:
        print("no rows")
        return 1
    med = {k: statistics.median(v) for k, v in rows.items()}
    shapes = []
    for (op, tp, p, shape, _, _) in rows:
        if (op, tp, p, shape) not in shapes:
            shapes.append((op, tp, p, shape))
    head = "| op | tp | partials | shape |"
    for b in builds:
        head += f" {b} fused ms | {b} GEMM ms | {b} fused/GEMM |"
    for b in builds[1:]:
        head += f" {b}/{builds[0]} fused |"
    print(head)
    print("|" + "---|" * (4 + 3 * len(builds) + len(builds) - 1))
    for (op, tp, p, shape) in shapes:
        line = f"| {op} | {tp} | {p} | {shape} |"
        fused = {}
        for b in builds:
            f = med.get((op, tp, p, shape, b, "ours_fused"))
            g = med.get((op, tp, p, shape, b, "ours_gemm"))
            fused[b] = f
            line += f" {f:.4f} |" if f else " - |"
            line += f" {g:.4f} |" if g else " - |"
            line += f" {f / g:.3f} |" if f and g else " - |"
        for b in builds[1:]:
            f0, f1 = fused[builds[0]], fused[b]
            line += f" {f1 / f0:.3f} |" if f0 and f1 else " - |"
        print(line)
    print_geomeans(med, builds, shapes)
    return 0


def geomean(values):
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def print_geomeans(med, builds, shapes):
    """Per (op, tp, partials): each build's fused/GEMM and fused time against the first build's,
    geometric means over the shapes with both numbers (range in brackets)."""
    groups = list(dict.fromkeys((op, tp, p) for (op, tp, p, _) in shapes))
    print()
    for (op, tp, p) in groups:
        names = [s for (o, t, q, s) in shapes if (o, t, q) == (op, tp, p)]
        parts = []
        for b in builds:
            fg = [med[(op, tp, p, s, b, "ours_fused")] / med[(op, tp, p, s, b, "ours_gemm")]
                  for s in names if (op, tp, p, s, b, "ours_fused") in med
                  and (op, tp, p, s, b, "ours_gemm") in med]
            parts.append(f"{b} fused/GEMM {geomean(fg):.3f}")
        for b in builds[1:]:
            r = [med[(op, tp, p, s, b, "ours_fused")] / med[(op, tp, p, s, builds[0], "ours_fused")]
                 for s in names if (op, tp, p, s, b, "ours_fused") in med
                 and (op, tp, p, s, builds[0], "ours_fused") in med]
            if r:
                parts.append(f"{b}/{builds[0]} fused {geomean(r):.3f} ({min(r):.3f}-{max(r):.3f})")
        print(f"geomean {op} tp={tp} partials={p}: " + "; ".join(parts))


if __name__ == "__main__":
    sys.exit(main())
