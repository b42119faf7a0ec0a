"""Joins ours (coll_bench) and NCCL (nccl_bench.py) JSON lines into the committed results:
collectives_results.json (rows: op, impl, world, bytes, dtype, ms_median, algbw, busbw, device,
commit, date), collectives_results.md (table with ratios and the issue's targets) and
collectives_results.png. Usage: report.py --out-dir DIR --device NAME --commit SHA IN.jsonl...
"""
import argparse, datetime, json, os
from collections import defaultdict


def human(b):
    for unit, s in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= s:
            return f"{b // s} {unit}"
    return f"{b} B"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--device", default="?")
    ap.add_argument("--commit", default="?")
    ap.add_argument("--prefix", default="collectives_results")
    ap.add_argument("inputs", nargs="+")
    a = ap.parse_args()
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%MZ")
    rows = []
    for p in a.inputs:
        if not os.path.exists(p):
            continue
        for line in open(p):
            if line.strip():
                r = json.loads(line)
                r.update(device=a.device, commit=a.commit, date=date)
                rows.append(r)
    os.makedirs(a.out_dir, exist_ok=True)
    with open(os.path.join(a.out_dir, a.prefix + ".json"), "w") as f:
        json.dump(rows, f, indent=1)
    by = {(r["op"], r["world"], r["bytes"], r["impl"]): r for r in rows}
    keys = sorted({(r["op"], r["world"]) for r in rows})
    md = [f"# Collectives: fusedcomm vs NCCL ({a.device}, commit {a.commit}, {date})", "",
          "bf16; medians of 10 batches of back-to-back calls (CUDA events, rank 0) after 5 warm-up "
          "calls; NCCL through torch.distributed with NCCL_NVLS_ENABLE=0. Ours: input in symmetric "
          "memory, output in ordinary device memory. busbw as nccl-tests. Targets (issue 3): busbw "
          "ratio >= 1.0 at >= 64 MiB, latency ratio (ours/NCCL) <= 0.7 at <= 256 KiB.", ""]
    verdicts = []
    for op, w in keys:
        md += [f"## {op}, {w} GPUs", "",
               "| bytes | ours ms | NCCL ms | ours busbw GB/s | NCCL busbw GB/s | latency ratio | busbw ratio | algo |",
               "|---:|---:|---:|---:|---:|---:|---:|---|"]
        sizes = sorted({r["bytes"] for r in rows if r["op"] == op and r["world"] == w})
        lat_ok, bw_ok = [], []
        for b in sizes:
            o, n = by.get((op, w, b, "fusedcomm")), by.get((op, w, b, "nccl"))
            if not o or not n:
                continue
            lr = o["ms_median"] / n["ms_median"]
            br = o["busbw"] / n["busbw"] if n["busbw"] > 0 else float("nan")
            if b <= 256 << 10:
                lat_ok.append(lr <= 0.7)
            if b >= 64 << 20:
                bw_ok.append(br >= 1.0)
            md.append(f"| {human(b)} | {o['ms_median']:.4f} | {n['ms_median']:.4f} | {o['busbw']:.1f} | "
                      f"{n['busbw']:.1f} | {lr:.2f} | {br:.2f} | {o.get('algo', '')} |")
        verdicts.append((op, w, sum(lat_ok), len(lat_ok), sum(bw_ok), len(bw_ok)))
        md.append("")
    md += ["## Targets", "", "| op | GPUs | sizes <= 256 KiB with latency ratio <= 0.7 | sizes >= 64 MiB with busbw ratio >= 1.0 |",
           "|---|---:|---:|---:|"]
    for op, w, lo, ln, bo, bn in verdicts:
        md.append(f"| {op} | {w} | {lo}/{ln} | {bo}/{bn} |")
    with open(os.path.join(a.out_dir, a.prefix + ".md"), "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, axes = plt.subplots(1, len(keys), figsize=(4.2 * len(keys), 3.6), squeeze=False)
        for ax, (op, w) in zip(axes[0], keys):
            for impl, style in (("fusedcomm", "o-"), ("nccl", "s--")):
                pts = sorted((r["bytes"], r["busbw"]) for r in rows
                             if r["op"] == op and r["world"] == w and r["impl"] == impl)
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=impl, ms=3)
            ax.set_xscale("log", base=2); ax.set_title(f"{op} W={w}"); ax.set_xlabel("bytes")
            ax.set_ylabel("busbw GB/s"); ax.grid(alpha=.3); ax.legend()
        fig.tight_layout()
        fig.savefig(os.path.join(a.out_dir, a.prefix + ".png"), dpi=90)
    except Exception as e:  # plots are optional; the table is the record
        print("no plot:", e)


if __name__ == "__main__":
    main()
