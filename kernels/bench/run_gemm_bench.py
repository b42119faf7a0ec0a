#!/usr/bin/env python3
"""Times cuBLAS (torch.matmul, bf16) on the shapes of gemm_shapes.txt, merges the results with
gemm_bench's JSON lines (ours, same run), and writes JSON + a markdown table + a PNG plot.

  run_gemm_bench.py --shapes gemm_shapes.txt --ours ours.jsonl --out-dir DIR [--commit SHA]

Protocol (DESIGN.md §7): same shapes, uniform random bf16 in [-1, 1), warm-up, then one CUDA
event pair per launch and the median over the timed launches, for both implementations.
"""
import argparse
import datetime
import json
import math
import os
import statistics

import torch


def time_cublas(M, N, K, layout, warmup, iters):
    g = torch.Generator(device="cuda").manual_seed(1234)
    a = (torch.rand(M, K, device="cuda", generator=g) * 2 - 1).to(torch.bfloat16)
    if layout == "nk":
        w = (torch.rand(N, K, device="cuda", generator=g) * 2 - 1).to(torch.bfloat16)
        fn = lambda: torch.matmul(a, w.t())  # noqa: E731  (cuBLAS TN, like nn.Linear)
    else:
        b = (torch.rand(K, N, device="cuda", generator=g) * 2 - 1).to(torch.bfloat16)
        fn = lambda: torch.matmul(a, b)  # noqa: E731
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        e0 = torch.cuda.Event(enable_timing=True)
        e1 = torch.cuda.Event(enable_timing=True)
        e0.record()
        fn()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1))
    times.sort()
    return times[len(times) // 2], times[0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", required=True)
    ap.add_argument("--ours", required=True)
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--commit", default=os.environ.get("FC_COMMIT", "uncommitted"))
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--iters", type=int, default=100)
    args = ap.parse_args()

    device = torch.cuda.get_device_name(0)
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    ours = {}
    with open(args.ours) as f:
        for line in f:
            line = line.strip()
            if line.startswith("{"):
                r = json.loads(line)
                ours[(r["op"], r["M"], r["N"], r["K"], r["layout"])] = r

    records, rows = [], []
    with open(args.shapes) as f:
        for line in f:
            if not line.strip() or line.startswith("#"):
                continue
            op, M, N, K, layout = line.split()[:5]
            M, N, K = int(M), int(N), int(K)
            ms, ms_min = time_cublas(M, N, K, layout, args.warmup, args.iters)
            flops = 2.0 * M * N * K
            base = dict(op=op, shape=dict(M=M, N=N, K=K, layout=layout), dtype="bf16",
                        device=device, commit=args.commit, date=date)
            cub = dict(base, impl="cublas", ms_median=ms, ms_min=ms_min,
                       tflops=flops / (ms * 1e-3) / 1e12)
            records.append(cub)
            o = ours.get((op, M, N, K, layout))
            if o is None:
                continue
            our = dict(base, impl="fusedcomm", ms_median=o["ms_median"], ms_min=o["ms_min"],
                       tflops=o["tflops"], tile_n=o["tile_n"])
            records.append(our)
            rows.append((op, M, N, K, layout, o["tile_n"], our["tflops"], cub["tflops"],
                         our["tflops"] / cub["tflops"]))

    os.makedirs(args.out_dir, exist_ok=True)
    with open(os.path.join(args.out_dir, "gemm_results.json"), "w") as f:
        json.dump(records, f, indent=1)

    llama = [r for r in rows if r[0].startswith("llama70b")]
    geo = math.exp(statistics.fmean(math.log(r[8]) for r in llama)) if llama else float("nan")
    lines = [f"# fusedcomm GEMM vs cuBLAS — {device}, {date}, commit {args.commit}", "",
             "Median of per-launch CUDA-event times after warm-up; TFLOP/s = 2MNK / time.", "",
             "| op | M | N | K | B | tile_n | ours TFLOP/s | cuBLAS TFLOP/s | ratio |",
             "|---|---:|---:|---:|---|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]} | {r[4]} | {r[5]} | {r[6]:.1f} | "
                     f"{r[7]:.1f} | {r[8]:.3f} |")
    lines += ["", f"Geometric mean ratio over the {len(llama)} Llama-3-70B shapes: {geo:.3f}"]
    with open(os.path.join(args.out_dir, "gemm_results.md"), "w") as f:
        f.write("\n".join(lines) + "\n")

    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(11, 4.5))
        labels = [f"{r[0].replace('llama70b_', '')}\nM={r[1]}" for r in rows]
        x = range(len(rows))
        ax.bar([i - 0.2 for i in x], [r[6] for r in rows], 0.4, label="fusedcomm")
        ax.bar([i + 0.2 for i in x], [r[7] for r in rows], 0.4, label="cuBLAS (torch.matmul)")
        ax.set_xticks(list(x))
        ax.set_xticklabels(labels, rotation=90, fontsize=5)
        ax.set_ylabel("TFLOP/s (bf16)")
        ax.set_title(f"GEMM on {device}: geomean ratio over Llama-3-70B shapes {geo:.3f}")
        ax.legend()
        fig.tight_layout()
        fig.savefig(os.path.join(args.out_dir, "gemm_results.png"), dpi=150)
    except Exception as e:  # the table and JSON are the record; the plot is a convenience
        print("plot failed:", e)

    print("\n".join(lines[4:]))


if __name__ == "__main__":
    main()
