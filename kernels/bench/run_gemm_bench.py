#!/usr/bin/env python3
"""Times our GEMM (libfc_gemm_bench.so, through ctypes) and cuBLAS (torch.matmul, bf16) on the
shapes of gemm_shapes.txt, interleaved in one process on the same tensors, and writes JSON + a
markdown table + a PNG plot.

  run_gemm_bench.py --shapes gemm_shapes.txt --lib libfc_gemm_bench.so --out-dir DIR [--cluster C]
                    [--stream-k S]
  run_gemm_bench.py --summarize RESULTS.json RESULTS.md   (no GPU: rewrites the md's summary
                    lines from the JSON, after checking that its table rows match the JSON)

--cluster: GemmArgs::cluster for our launches (0 chosen by the launch, 1 single CTAs, 2 CTA pairs).
--stream-k: GemmArgs::stream_k with a stream-K workspace (0 chosen, 1 off, 2 forced); -1 (default)
no workspace.

Protocol (DESIGN.md §7): uniform random bf16 in [-1, 1) (never zeros), warm-up, then rounds of
`iters` launches per implementation, alternating (ours, cuBLAS, ours, cuBLAS, ...), one CUDA
event pair per launch with no synchronisation in between (host launch latency stays out), the
median over all timed launches. Our output is checked against cuBLAS's (relative Frobenius
error) for every shape.
"""
import argparse
import ctypes
import datetime
import json
import math
import os
import statistics
import sys

torch = None  # imported by main() when it times; --summarize runs without it


def time_launches(fn, iters):
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
          for _ in range(iters)]
    for e0, e1 in ev:
        e0.record()
        fn()
        e1.record()
    torch.cuda.synchronize()
    return [e0.elapsed_time(e1) for e0, e1 in ev]


def bench_shape(lib, M, N, K, layout, warmup, iters, rounds, sustain_ms=0.0, ours_first=True):
    g = torch.Generator(device="cuda").manual_seed(1234)
    a = (torch.rand(M, K, device="cuda", generator=g) * 2 - 1).to(torch.bfloat16)
    kn = layout == "kn"
    b = (torch.rand((K, N) if kn else (N, K), device="cuda", generator=g) * 2 - 1)
    b = b.to(torch.bfloat16)
    c = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    stream = torch.cuda.current_stream().cuda_stream

    def ours():
        rc = lib.fc_gemm_bf16(a.data_ptr(), b.data_ptr(), c.data_ptr(), M, N, K, int(kn), 0,
                              ctypes.c_void_p(stream))
        if rc != 0:
            raise RuntimeError(f"fc_gemm_bf16 returned {rc}")

    cublas = (lambda: torch.matmul(a, b)) if kn else (lambda: torch.matmul(a, b.t()))
    for _ in range(warmup):
        ours()
        cublas()
    ref = cublas()
    ours()
    torch.cuda.synchronize()
    err = ((c.float() - ref.float()).norm() / ref.float().norm()).item()
    t_ours, t_cub = [], []
    if sustain_ms > 0:
        # Sustained (fused/NOTES.md "Run 14"): each impl back to back for sustain_ms, then its
        # rounds, so that each runs at the clock its own power draw sustains on a power-capped
        # GPU instead of the clock the alternation shares. Which goes first alternates by shape.
        order = ((ours, t_ours), (cublas, t_cub))
        for fn, t in order if ours_first else order[::-1]:
            one = statistics.median(time_launches(fn, 5))
            for _ in range(int(sustain_ms / max(one, 1e-3)) + 1):
                fn()
            for _ in range(rounds):
                t += time_launches(fn, iters)
    else:
        for _ in range(rounds):
            t_ours += time_launches(ours, iters)
            t_cub += time_launches(cublas, iters)
    return statistics.median(t_ours), statistics.median(t_cub), min(t_ours), min(t_cub), err


TABLE_HEAD = ["| op | M | N | K | B | tile_n | ours TFLOP/s | cuBLAS TFLOP/s | ratio | rel. err |",
              "|---|---:|---:|---:|---|---:|---:|---:|---:|---:|"]


def table_line(r):
    return (f"| {r[0]} | {r[1]} | {r[2]} | {r[3]} | {r[4]} | {r[5]} | {r[6]:.1f} | "
            f"{r[7]:.1f} | {r[8]:.3f} | {r[9]:.1e} |")


def geomean(xs):
    return math.exp(statistics.fmean(math.log(x) for x in xs))


def summary_lines(rows):
    """The md's closing lines and the plot's title: the geomean throughput ratio (ours /
    cuBLAS) over the Llama-3-70B rows when the list has them, else over every row, and the
    headline shapes' ratios when present."""
    llama = [r[8] for r in rows if r[0].startswith("llama70b")]
    which = (f"the {len(llama)} Llama-3-70B shapes" if llama
             else f"all {len(rows)} shapes (ours / cuBLAS throughput)")
    geo = geomean(llama or [r[8] for r in rows])
    lines = [f"Geometric mean ratio over {which}: {geo:.3f}"]
    heads = [(r[0], r[4], r[8]) for r in rows if r[0] in ("square", "wide_k")]
    if heads:
        lines.append("Headline ratios: " + ", ".join(f"{op} {b}: {v:.3f}" for op, b, v in heads))
    return lines, f"geomean ratio over {which} {geo:.3f}"


def rows_from_records(records):
    """The table rows of a results JSON (records in pairs: ours, then cuBLAS, per shape)."""
    rows = []
    for our, cub in zip(records[0::2], records[1::2]):
        sh = our["shape"]
        if our["impl"] != "fusedcomm" or cub["impl"] != "cublas" or cub["shape"] != sh:
            raise SystemExit(f"unexpected record pair: {our['op']} {sh}")
        rows.append((our["op"], sh["M"], sh["N"], sh["K"], sh["layout"], our["tile_n"],
                     our["tflops"], cub["tflops"], our["tflops"] / cub["tflops"],
                     our["rel_err_vs_cublas"]))
    return rows


def summarize(json_path, md_path):
    """Rewrites the summary lines of a committed md from its JSON (same table rows required)."""
    with open(json_path) as f:
        rows = rows_from_records(json.load(f))
    with open(md_path) as f:
        md = f.read().rstrip("\n").split("\n")
    table = [line for line in md if line.startswith("| ") and not line.startswith("| op ")]
    if table != [table_line(r) for r in rows]:
        raise SystemExit(f"{md_path}: its table rows differ from {json_path}'s")
    # Only the summary lines change; notes added below them stay.
    old = [i for i, line in enumerate(md)
           if line.startswith(("Geometric mean ratio over", "Headline ratios:"))]
    if not old:
        raise SystemExit(f"{md_path}: no summary lines")
    md[old[0]:old[-1] + 1] = summary_lines(rows)[0]
    with open(md_path, "w") as f:
        f.write("\n".join(md) + "\n")


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "--summarize":
        summarize(sys.argv[2], sys.argv[3])
        return
    global torch
    import torch
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", required=True)
    ap.add_argument("--lib", required=True)
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--commit", default=os.environ.get("FC_COMMIT", "uncommitted"))
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cluster", type=int, default=0)
    ap.add_argument("--sustain-ms", type=float, default=0.0,
                    help="each impl back to back this long, then its rounds (not alternating)")
    ap.add_argument("--stream-k", type=int, default=-1,
                    help="GemmArgs::stream_k with a workspace (0 chosen, 1 off, 2 forced); -1: none")
    args = ap.parse_args()

    device = torch.cuda.get_device_name(0)
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lib = ctypes.CDLL(os.path.abspath(args.lib))
    lib.fc_gemm_bf16.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int] * 5 + [ctypes.c_void_p]
    lib.fc_gemm_bf16.restype = ctypes.c_int
    lib.fc_gemm_tile_n.argtypes = [ctypes.c_int] * 3
    lib.fc_gemm_tile_n.restype = ctypes.c_int
    lib.fc_gemm_set_cluster.argtypes = [ctypes.c_int]
    lib.fc_gemm_set_cluster(args.cluster)
    lib.fc_gemm_set_stream_k.argtypes = [ctypes.c_int]
    lib.fc_gemm_set_stream_k(args.stream_k)

    records = []
    n_shapes = 0
    with open(args.shapes) as f:
        for line in f:
            if not line.strip() or line.startswith("#"):
                continue
            op, M, N, K, layout = line.split()[:5]
            M, N, K = int(M), int(N), int(K)
            ms_o, ms_c, min_o, min_c, err = bench_shape(lib, M, N, K, layout, args.warmup,
                                                        args.iters, args.rounds, args.sustain_ms,
                                                        ours_first=n_shapes % 2 == 0)
            n_shapes += 1
            flops = 2.0 * M * N * K
            tile_n = lib.fc_gemm_tile_n(M, N, 0)
            base = dict(op=op, shape=dict(M=M, N=N, K=K, layout=layout), dtype="bf16",
                        device=device, commit=args.commit, date=date, cluster_arg=args.cluster,
                        stream_k_arg=args.stream_k, sustain_ms=args.sustain_ms)
            cub = dict(base, impl="cublas", ms_median=ms_c, ms_min=min_c,
                       tflops=flops / (ms_c * 1e-3) / 1e12)
            our = dict(base, impl="fusedcomm", ms_median=ms_o, ms_min=min_o,
                       tflops=flops / (ms_o * 1e-3) / 1e12, tile_n=tile_n, rel_err_vs_cublas=err)
            records += [our, cub]
            print(f"{op} {M} {N} {K} {layout}: ours {our['tflops']:.1f} cuBLAS "
                  f"{cub['tflops']:.1f} ratio {our['tflops'] / cub['tflops']:.3f} err {err:.2e}",
                  flush=True)
            if not err < 1e-2:
                raise SystemExit(f"our output disagrees with cuBLAS: rel err {err}")

    os.makedirs(args.out_dir, exist_ok=True)
    with open(os.path.join(args.out_dir, "gemm_results.json"), "w") as f:
        json.dump(records, f, indent=1)
    rows = rows_from_records(records)

    how = (f"each implementation sustained for {args.sustain_ms:g} ms, then {args.rounds} rounds of"
           if args.sustain_ms > 0 else f"{args.rounds} alternating rounds of")
    lines = [f"# fusedcomm GEMM vs cuBLAS — {device}, {date}, commit {args.commit}", "",
             f"Median of per-launch CUDA-event times ({how} "
             f"{args.iters} launches per implementation after {args.warmup} warm-ups, no sync "
             "between launches); TFLOP/s = 2MNK / time; rel. err = ||ours - cuBLAS||_F / "
             "||cuBLAS||_F.", "", *TABLE_HEAD]
    lines += [table_line(r) for r in rows]
    summary, geo_title = summary_lines(rows)
    lines += ["", *summary]
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
        ax.set_title(f"GEMM on {device}: {geo_title}")
        ax.legend()
        fig.tight_layout()
        fig.savefig(os.path.join(args.out_dir, "gemm_results.png"), dpi=150)
    except Exception as e:  # the table and JSON are the record; the plot is a convenience
        print("plot failed:", e)

    print("\n".join(lines[4:]))


if __name__ == "__main__":
    main()
