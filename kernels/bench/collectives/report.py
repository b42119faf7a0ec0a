"""Joins ours (coll_bench) and NCCL (nccl_bench.py) JSON lines into the committed results:
collectives_results.json (rows: op, impl, world, bytes, dtype, ms_median, algbw, busbw, device,
commit, date), collectives_results.md (table with ratios and the issue's targets) and
collectives_results.png. Usage: report.py --out-dir DIR --device NAME --commit SHA IN.jsonl...
"""
import os, sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import bench_common


def human(b):
    for unit, s in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= s:
            return f"{b // s} {unit}"
    return f"{b} B"


def main():
    a = bench_common.report_args("collectives_results")
    rows, date = bench_common.join_rows(a)
    by = {(r["op"], r["world"], r["bytes"], r["impl"]): r for r in rows}
    keys = sorted({(r["op"], r["world"]) for r in rows})
    md = [f"# Collectives: fusedcomm vs NCCL ({a.device}, commit {a.commit}, {date})", "",
          "bf16; medians of 10 batches of back-to-back calls (CUDA events, rank 0) after 5 warm-up "
          "calls; NCCL through torch.distributed with NCCL_NVLS_ENABLE=0 (its allReduce in place). "
          "Ours: input in symmetric memory; allReduce in place there when its algo says so "
          "(/inplace: output = input, as NCCL's), other outputs in ordinary device memory. busbw as nccl-tests. Targets (issue 3): busbw "
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
    bench_common.write_markdown(a, md)

    def draw(plt):  # busbw vs bytes for each (op, world), ours and NCCL
        fig, axes = plt.subplots(1, len(keys), figsize=(4.2 * len(keys), 3.6), squeeze=False)
        for ax, (op, w) in zip(axes[0], keys):
            for impl, style in (("fusedcomm", "o-"), ("nccl", "s--")):
                pts = sorted((r["bytes"], r["busbw"]) for r in rows
                             if r["op"] == op and r["world"] == w and r["impl"] == impl)
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=impl, ms=3)
            ax.set_xscale("log", base=2); ax.set_title(f"{op} W={w}"); ax.set_xlabel("bytes")
            ax.set_ylabel("busbw GB/s"); ax.grid(alpha=.3); ax.legend()
        return fig

    bench_common.save_plot(a, draw)


if __name__ == "__main__":
    main()
