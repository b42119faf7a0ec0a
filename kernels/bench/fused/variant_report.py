"""A bench build variant's fused times against a table's, from the same machine.

A variant (a build with a bench switch, e.g. -DFUSEDCOMM_AG_CE_PULL) is timed by its own
fused_bench runs beside a device_run.sh table of the default build; this prints, per shape,
the default build's ours_fused (median over the table's rounds), the variant's (median over its
runs), their ratio, and the variant against the table's best baseline (min of torch_serial and
torch_symm_mem), as markdown.
Usage: variant_report.py --table fused_results.json --name NAME [--op allGatherGemm] ROWS.jsonl...
"""
import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import bench_common


def merged(rows, op, impls):
    """(world, shape) -> impl -> the row, its ms_median the median over its rounds (report.py's
    merge: bench_common.merge_rounds)."""
    out = {}
    rows = [r for r in rows if r["op"] == op and r["impl"] in impls]
    for r in bench_common.merge_rounds(
            rows, lambda r: (r["world"], r["shape"], r["impl"], r.get("partials"))):
        out.setdefault((r["world"], r["shape"]), {})[r["impl"]] = r
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--table", required=True)
    ap.add_argument("--name", required=True)
    ap.add_argument("--op", default="allGatherGemm")
    ap.add_argument("rows", nargs="+")
    a = ap.parse_args()
    table = json.load(open(a.table))
    base = merged(table, a.op, {"ours_fused", "torch_serial", "torch_symm_mem"})
    var_rows = [json.loads(line) for f in a.rows for line in open(f) if line.strip()]
    var = merged(var_rows, a.op, {"ours_fused"})
    print(f"| world | shape | default fused ms | {a.name} fused ms ({a.name} runs) | "
          f"{a.name} / default | best baseline ms | {a.name} / best baseline |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    ratios = []
    order = {}  # the table's own shape order
    for r in table:
        order.setdefault(r["shape"], len(order))
    for key in sorted(var, key=lambda k: (k[0], order.get(k[1], len(order)))):
        if key not in base or "ours_fused" not in base[key]:
            continue
        b = {i: row["ms_median"] for i, row in base[key].items()}
        vrow = var[key]["ours_fused"]
        v, runs = vrow["ms_median"], len(vrow.get("ms_rounds", [vrow["ms_median"]]))
        best = min(b.get(i, float("inf")) for i in ("torch_serial", "torch_symm_mem"))
        ratios.append(v / b["ours_fused"])
        print(f"| {key[0]} | {key[1]} | {b['ours_fused']:.4f} | {v:.4f} ({runs}) | "
              f"{v / b['ours_fused']:.3f} | {best:.4f} | {v / best:.3f} |")
    if ratios:
        gm = statistics.geometric_mean(ratios)
        print(f"\n{len(ratios)} shapes: {a.name} / default geomean {gm:.3f}, "
              f"best {min(ratios):.3f}, worst {max(ratios):.3f}")


if __name__ == "__main__":
    main()
