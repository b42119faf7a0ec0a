"""Ratio table of variants_ar.sh: busbw (GB/s) of every (op, world, variant/algo) at each size
and its ratio to NCCL's busbw measured in the same device call; the best variant per
(op, world) by geometric-mean ratio last. Usage: variants_report.py [--min-bytes N] [--ops a,b]
FILE.jsonl... (coll_bench rows carry "variant" and "algo"; nccl_bench.py rows have impl "nccl";
--min-bytes and --ops keep only those rows).
"""
import collections, json, math, os, sys

SHORT = {"allReduce": "AR", "allGather": "AG", "reduceScatter": "RS", "allToAll": "A2A"}


def human(b):
    return f"{b >> 30}G" if b >= 1 << 30 else f"{b >> 20}M"


def main():
    args, min_bytes, ops_only = sys.argv[1:], 0, None
    while args and args[0].startswith("--"):
        if args[0] == "--min-bytes":
            min_bytes = int(args[1])
        elif args[0] == "--ops":
            ops_only = set(args[1].split(","))
        args = args[2:]
    rows = []
    for p in args:
        if os.path.exists(p):
            rows += [json.loads(l) for l in open(p) if l.strip()]
    rows = [r for r in rows if r["bytes"] >= min_bytes and (ops_only is None or r["op"] in ops_only)]
    nccl = {(r["op"], r["world"], r["bytes"]): r["busbw"] for r in rows if r["impl"] == "nccl"}
    ours = collections.defaultdict(dict)
    for r in rows:
        if r["impl"] != "nccl":
            ours[(r["op"], r["world"], f'{r.get("variant", "?")}:{r.get("algo", "?")}')][r["bytes"]] = r["busbw"]
    sizes = sorted({r["bytes"] for r in rows})
    ops = sorted({(k[0], k[1]) for k in ours} | {(k[0], k[1]) for k in nccl},
                 key=lambda t: (t[0] != "allReduce", t[0], -t[1]))
    print("busbw GB/s (ratio to NCCL in the same run)")
    print(f"{'op':4s}{'W':>2s}  {'variant:algo':26s}" + "".join(f"{human(b):>15s}" for b in sizes) + "  geomean")
    best = []
    for op, w in ops:
        n = [nccl.get((op, w, b)) for b in sizes]
        print(f"{SHORT.get(op, op):4s}{w:2d}  {'nccl':26s}" + "".join(f"{x:15.1f}" if x else f"{'-':>15s}" for x in n))
        cands = []
        for key in sorted(k for k in ours if k[0] == op and k[1] == w):
            cells, logs = [], []
            for b, nb in zip(sizes, n):
                v = ours[key].get(b)
                if v and nb:
                    cells.append(f"{v:7.1f} ({v / nb:4.2f})")
                    logs.append(math.log(v / nb))
                else:
                    cells.append(f"{v:15.1f}" if v else f"{'-':>15s}")
            g = math.exp(sum(logs) / len(logs)) if logs else float("nan")
            cands.append((g, key[2]))
            print(f"{'':6s}{key[2]:26s}" + "".join(f"{c:>15s}" for c in cells) + f"  {g:6.3f}")
        valid = [c for c in cands if not math.isnan(c[0])]
        if valid:
            g, name = max(valid)
            best.append(f"{SHORT.get(op, op)} W={w}: best {name} (geomean ratio {g:.3f})")
    print()
    print("\n".join(best))


if __name__ == "__main__":
    main()
