#!/usr/bin/env python3
"""Joins a family's result rows into its table: OUT_DIR/<family>.json (every row, stamped with
device, gpus, commit and date), OUT_DIR/<family>.md (one table per op and world size, with the
ratio of ours to the best baseline and, where the family has one, to the floor) and
OUT_DIR/<family>.png (one plot; skipped with a message where matplotlib is missing).

  report.py --family fused --out-dir DIR [--device NAME] [--gpus N] [--commit SHA] ROWS...

ROWS: JSON-lines files of rows (the drivers' --out) or JSON arrays (an earlier <family>.json);
a missing file is skipped. Rows measured more than once (same op, impl, world, shape) become one,
with the median time. Ratios are time ratios, ours / the other: below 1, ours is faster.
The row schema is bench/README.md's.
"""
import argparse
import datetime
import json
import math
import os
import statistics
import sys

# Per family: the title, the protocol sentence, the shape columns, the rate shown and plotted,
# the complete-op baselines, and the parts whose times give the floor (fused only).
FAMILIES = {
    "gemm": dict(
        title="GEMM: fusedcomm vs cuBLAS",
        protocol="bf16 in, fp32 accumulation, bf16 out, one GPU. Ours (through ctypes) and cuBLAS "
                 "(torch.matmul) interleaved in one process on the same random tensors: alternating "
                 "rounds of back-to-back launches, one CUDA event pair per launch; medians. Every "
                 "output checked element by element against an fp32 reference before timing. "
                 "Tensors dense at the shape as given, nothing padded: ours copies rows that its "
                 "loads cannot read well inside its timed call. Each shape set has its own table: "
                 "the headline list, explicit shapes, and seeded random sets (`random-<seed>`: M, "
                 "N, K uniform in [1, 16384], both layouts; `-align8`: N and K rounded up to "
                 "multiples of 8). cuBLAS as torch runs it by default; its check allows for "
                 "split-K partial sums rounded to bf16.",
        columns=("label", "m", "n", "k", "layout"), rate="tflops", rate_name="TFLOP/s",
        baselines=("cublas",), parts=None, xlog=False),
    "attention": dict(
        title="Attention forward and backward: fusedcomm vs torch SDPA",
        protocol="bf16 q, k, v, o, fp32 softmax, one GPU, (B, S, H, D) tensors. Ours (through ctypes) "
                 "and torch's scaled_dot_product_attention with its cuDNN and flash backends "
                 "interleaved in one process on the same random tensors: alternating rounds of "
                 "back-to-back launches, one CUDA event pair per launch; medians. Forward: TFLOP/s = "
                 "4·B·Hq·S²·D / t, halved when causal; every output checked against an fp32 "
                 "reference (sampled query rows of every batch and head) before timing. Backward "
                 "(attentionBackward): one call is dq, dk, dv from q, k, v, o, lse and dO (torch: one "
                 "autograd backward of the SDPA output); TFLOP/s = 2.5·4·B·Hq·S²·D / t, halved when "
                 "causal; K/V head 0's gradients (batch 0) checked against an fp32 reference first. "
                 "Ring (ringAttention, ringAttentionBackward; W processes, one per GPU; s the whole "
                 "sequence, zigzag layout when causal, else contiguous): ours (ring_bench; the forward "
                 "in both of its forms, `fusedcomm` the automatic choice) against a torch ring built as "
                 "ring-flash-attention builds it (torch_ring.py: per step torch's flash or cuDNN SDPA "
                 "kernel with its log-sum-exp, merged by it; K/V by batch_isend_irecv overlapped with "
                 "the step; the backward's fp32 dK/dV travelling back to their owners; `torch_ring` "
                 "the faster of the two kernels); TFLOP/s per GPU, the ring's FLOPs over W. "
                 "`fusedcomm_1gpu`: our 1-GPU backward at the same per-GPU work (batch B·W at seq "
                 "S/W), `vs fusedcomm_1gpu` the ring's time over it. Each side checked first against "
                 "a 1-GPU attention over the whole sequence (ours: our 1-GPU kernels; torch: SDPA).",
        columns=("label", "batch", "s", "q_heads", "kv_heads", "d", "causal"), rate="tflops",
        rate_name="TFLOP/s", baselines=("torch_sdpa_cudnn", "torch_sdpa_flash", "torch_ring"), parts=None,
        xlog=False, also=("fusedcomm_1gpu",),
        op_columns={op: ("label", "batch", "s", "q_heads", "kv_heads", "d", "causal", "layout")
                    for op in ("ringAttention", "ringAttentionBackward")}),
    "collectives": dict(
        title="Collectives: fusedcomm vs NCCL",
        protocol="bf16, one process per GPU. Medians of 10 batches of back-to-back calls (CUDA "
                 "events, rank 0) after 5 warm-up calls; every (op, size) checked once first. NCCL "
                 "through torch.distributed with NCCL_NVLS_ENABLE=0; allReduce in place on both "
                 "sides. Sizes and busbw as nccl-tests counts them.",
        columns=("bytes",), rate="gbps", rate_name="busbw GB/s",
        baselines=("nccl",), parts=None, xlog=True),
    "fused": dict(
        title="Fused GEMM + communication: fusedcomm vs baselines",
        protocol="bf16 in, fp32 accumulation. One process per GPU; each impl run back to back for a "
                 "while (its sustained clock), then batches of back-to-back launches between CUDA "
                 "events on rank 0; medians. Shapes: Llama-3 MLP layers under tensor parallelism "
                 "TP = world (allGatherGemm: gate+up projection, N split; gemmReduceScatter and "
                 "gemmAllReduce: down projection, K split); m, n, k are a rank's. TFLOP/s per GPU. "
                 "Baselines: cuBLAS + NCCL on one stream (torch serial) and PyTorch symmetric "
                 "memory's fused ops (multicast off); gemmAllReduce also cuBLAS + NCCL and cuBLAS + "
                 "symmetric memory's one-shot / two-shot allReduce captured in a CUDA graph. Floor: max(GEMM alone, exchange alone), each "
                 "the faster of ours and cuBLAS / NCCL. Every op path checked against an fp32 "
                 "reference before timing. Across hosts (gpu_hosts_fused_test: 2 virtual hosts × "
                 "1 GPU, the transport in the label, TCP on the loopback): ours as the op runs it "
                 "(allGatherGemm and gemmReduceScatter one kernel; gemmAllReduce, from a 4 MiB "
                 "product, gemmReduceScatter's kernel then the hierarchical allGather) against our "
                 "decomposed path (the hierarchical collective and our GEMM), both forms checked "
                 "against each other first; shapes as the op takes them, TFLOP/s per GPU.",
        columns=("label", "m", "n", "k"), rate="tflops", rate_name="TFLOP/s",
        baselines=("torch_serial", "torch_symm_mem", "torch_serial_graph", "torch_symm_one_shot_graph",
                   "torch_symm_two_shot_graph"),
        parts=(("fusedcomm_gemm_only", "cublas_gemm_only"), ("fusedcomm_comm_only", "nccl_comm_only")),
        xlog=False,
        # Across hosts the baseline is our own decomposed path (no torch form runs there).
        op_baselines={op + " across hosts": ("fusedcomm_decomposed",)
                      for op in ("allGatherGemm", "gemmReduceScatter", "gemmAllReduce")},
        # Our forced paths: the summary gives the automatic choice's worst ratio to the fastest.
        own_paths=("fusedcomm_fused", "fusedcomm_decomposed", "fusedcomm_oneshot")),
    "moe": dict(
        title="MoE grouped GEMM: fusedcomm vs torch._grouped_mm and dense cuBLAS",
        protocol="groupedGemm: bf16 in, fp32 accumulation, bf16 out, one GPU. The experts' rows contiguous in one "
                 "A (rows × K), the experts' weights one after the other (experts × N × K, `nk`, or "
                 "experts × K × N, `kn`), the segments' offsets on the device. Ours (through ctypes), "
                 "torch._grouped_mm (offsets form) and dense cuBLAS (torch.mm of all the rows with one "
                 "expert's weight: the same FLOPs, the dense ceiling) interleaved in one process on "
                 "the same random tensors: alternating rounds of back-to-back launches, one CUDA event "
                 "pair per launch; medians. TFLOP/s = 2 · rows · N · K / t. Experts: those one rank "
                 "holds at W = 1, 2, 4 (the label's w). Routing: balanced, or skewed-<seed> (seeded "
                 "log-normal segment sizes, one expert in eight empty). Every output checked element "
                 "by element against an fp32 reference (per expert) before timing. moeDispatchGemm and "
                 "moeCombine (W >= 2, one process per GPU, tokens per rank): ours (dispatch with the "
                 "grouped GEMM, and its parts alone) against torch's counts exchange and "
                 "all_to_all_single with _grouped_mm (and back for the combine, the weighted sum in "
                 "fp32), the same routing on both sides, timed as the fused family; TFLOP/s of the "
                 "rank's received rows, GB/s of the rows it sends; every output checked first.",
        columns=("label", "experts", "rows_per_expert", "n", "k", "routing", "layout"), rate="tflops",
        rate_name="TFLOP/s", baselines=("torch_grouped_mm", "torch_a2a_grouped_mm", "torch_a2a"), parts=None,
        xlog=False, also=("cublas_dense",),
        # The layer's ops at W >= 2 (moe_bench.cu, torch_moe_dist.py): their own shape columns.
        op_columns={op: ("label", "tokens", "hidden", "ffn", "experts", "topk", "routing")
                    for op in ("moeDispatchGemm", "moeCombine")}),
    "transport": dict(
        title="Transports: fusedcomm's socket and libfabric backends vs plain TCP (loopback)",
        protocol="Two ranks of one host over 127.0.0.1. Ours: one-sided writes with a signal per "
                 "message through the socket transport (the runtime's default receiver threads and "
                 "busy-poll window), and where measured through the libfabric transport "
                 "(`fusedcomm_libfabric_<provider>`, its default endpoints); tcp: the same bytes "
                 "through one pair of blocking sockets. Median of 5 batches of at least 256 MiB per "
                 "direction; GB/s per direction.",
        columns=("bytes",), rate="gbps", rate_name="GB/s",
        baselines=("tcp",), parts=None, xlog=True, world_name="ranks"),
}
OURS = "fusedcomm"


def human_bytes(b):
    for unit, s in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= s and b % s == 0:
            return f"{b // s} {unit}"
    return f"{b} B"


def read_rows(paths):
    rows = []
    for p in paths:
        if not os.path.exists(p):
            print(f"report: {p} missing, skipped", file=sys.stderr)
            continue
        text = open(p).read().strip()
        if not text:
            continue
        if text.startswith("["):
            rows += json.loads(text)
        else:
            rows += [json.loads(line) for line in text.splitlines() if line.strip()]
    return rows


def ok(r):
    return r is not None and isinstance(r.get("ms_median"), (int, float)) and math.isfinite(r["ms_median"])


def shape_key(r):
    return json.dumps(r.get("shape", {}), sort_keys=True), r.get("label", "")


def merge(rows):
    """Rows of one (op, impl, world, shape, partials) measured more than once: one row with the
    median time (rates rescaled to it) and every time in ms_repeats. First-seen order."""
    groups, order = {}, []
    for r in rows:
        k = (r.get("op"), r.get("impl"), r.get("world"), shape_key(r), r.get("partials"), r.get("set"))
        if k not in groups:
            groups[k] = []
            order.append(k)
        groups[k].append(r)
    out = []
    for k in order:
        g = [r for r in groups[k] if ok(r)] or groups[k]
        m = dict(g[0])
        if len(g) > 1:
            times = [r["ms_median"] for r in g]
            m["ms_median"] = statistics.median(times)
            m["ms_repeats"] = times
            for rate in ("tflops", "gbps"):
                if isinstance(g[0].get(rate), (int, float)):
                    m[rate] = g[0][rate] * g[0]["ms_median"] / m["ms_median"]
        out.append(m)
    return out


def fmt(x, d=3):
    return "-" if x is None else f"{x:.{d}f}"


def geomean(xs):
    return math.exp(statistics.fmean(math.log(x) for x in xs)) if xs else None


def tables(family, rows):
    """The per-(op, world, set) groups: [(name, world, [(shape_key, {impl: row})])], first-seen
    order; name is the op, followed by the rows' shape set in parentheses where they name one
    (`set`: e.g. gemm's seeded random set, tabulated apart from the headline shapes)."""
    groups, order = {}, []
    for r in rows:
        k = (r["op"] + (f" ({r['set']})" if r.get("set") else ""), r["world"])
        if k not in groups:
            groups[k] = {}
            order.append(k)
        groups[k].setdefault(shape_key(r), {})[r["impl"]] = r
    return [(op, w, list(groups[(op, w)].items())) for op, w in order]


def impl_order(family, present):
    """Ours, our forced paths, the baselines, then anything else (the floor's parts excluded)."""
    f = FAMILIES[family]
    parts = [p for pair in f["parts"] or () for p in pair]
    ours = [OURS] if OURS in present else []
    first = [OURS + "_fused", OURS + "_decomposed", OURS + "_oneshot"]  # forced paths, in this order
    forced = [i for i in first if i in present]
    also = tuple(f.get("also", ()))
    forced += sorted(i for i in present if i.startswith(OURS + "_") and i not in parts + first + list(also))
    base = [b for b in f["baselines"] + also if b in present]
    rest = sorted(i for i in present if i not in parts and i not in ours + forced + base)
    return ours + forced + base + rest


def ms(g, impl):
    r = g.get(impl)
    return r["ms_median"] if ok(r) else None


def best(*xs):
    xs = [x for x in xs if x is not None]
    return min(xs) if xs else None


def floor_ms(family, g):
    parts = FAMILIES[family]["parts"]
    if not parts:
        return None
    t = [best(*(ms(g, i) for i in pair)) for pair in parts]
    return max(t) if all(x is not None for x in t) else None


def baselines(family, op):
    f = FAMILIES[family]
    return f.get("op_baselines", {}).get(op, f["baselines"])


def columns(family, op):
    f = FAMILIES[family]
    return f.get("op_columns", {}).get(op, f["columns"])


def shape_cells(family, r):
    s = r.get("shape", {})
    cells = []
    for c in columns(family, r.get("op")):
        if c == "label":
            cells.append(str(r.get("label", "")))
        elif c == "bytes":
            cells.append(human_bytes(s.get("bytes", 0)))
        else:
            cells.append(str(s.get(c, "")))
    return cells


PARTIALS = {"f32": "fp32 partial products (rounded once)", "bf16": "bf16 partial products",
            "f32any": "fp32 partial products summed in any order"}


def notes(rows):
    """What the rows say about how they were measured: the rounds, ours' partial precision."""
    out = []
    rounds = max((len(r.get("ms_repeats") or []) for r in rows), default=0)
    if rounds > 1:
        out.append(f"Each time is the median of {rounds} rounds, run in alternating order.")
    used = sorted({r["partials"] for r in rows if r.get("partials") and r["impl"].startswith(OURS)})
    if used:
        out.append("gemmReduceScatter and gemmAllReduce: ours reduces "
                   + "; ".join(PARTIALS.get(p, p) for p in used) + ", the baselines bf16 ones.")
    return out


# The small and medium allReduce set (coll_bench --graph, torch_allreduce.py): ours and each
# baseline both eager and captured in a CUDA graph. A collectives table whose rows include a
# graph-captured impl gets this layout instead of the NCCL one.
EAGER_GRAPH = dict(ours=(OURS, OURS + "_graph"),
                   eager=("nccl", "torch_symm_one_shot", "torch_symm_two_shot"),
                   graph=("nccl_graph", "torch_symm_one_shot_graph", "torch_symm_two_shot_graph"))
TIE = 1.03  # within 3 % of the best counts as level with it (hosts differ by more)
EAGER_GRAPH_NOTE = ("allReduce small and medium (the small-medium set): ours eager and captured in a CUDA "
                    "graph (a replay per call), against NCCL and PyTorch symmetric memory's "
                    "one_shot_all_reduce (out of place) and two_shot_all_reduce_ (in place, both with "
                    "TORCH_SYMM_MEM_DISABLE_MULTICAST=1), each eager and graph-captured the same way; ours "
                    "eager against the best eager baseline, ours in a graph against the best graph-captured "
                    f"one, and the faster of ours against the fastest of all (at most {TIE:.2f}: level).")


def is_eager_graph(family, shapes):
    return family == "collectives" and any(i.endswith("_graph") for _, g in shapes for i in g)


def verdict(ratio):
    """The target "ours <= 1.0x the best, a 3 % tie counts" for one ratio."""
    if ratio is None:
        return "-"
    return "yes" if ratio <= 1.0 else f"tie (<= {TIE:.2f})" if ratio <= TIE else "no"


def eager_graph_table(op, world, shapes):
    """The markdown of one small/medium allReduce table and its summary entry: (lines, (op,
    world, sizes, eager ratios, graph ratios, best-of ratios))."""
    f = FAMILIES["collectives"]
    present = {i for _, g in shapes for i in g}
    known = EAGER_GRAPH["ours"] + EAGER_GRAPH["eager"] + EAGER_GRAPH["graph"]
    impls = [i for i in known if i in present] + sorted(present - set(known))
    head = ["bytes"] + [f"{i} ms" for i in impls] + [
        "eager: ours / best eager", "graph: ours / best graph", "best ours / best of all", "best baseline",
        f"<= 1.0x (tie <= {TIE:.2f})", "ours ran"]
    md = [f"## {op}, {world} GPUs: eager and CUDA graph", "", "| " + " | ".join(head) + " |",
          "|---|" + "---:|" * (len(impls) + 3) + "---|---|---|"]
    r_eager, r_graph, r_best = [], [], []
    for _, g in sorted(shapes, key=lambda sg: next(iter(sg[1].values()))["shape"].get("bytes", 0)):
        t = {i: ms(g, i) for i in impls}
        ours_e, ours_g = t.get(OURS), t.get(OURS + "_graph")
        base_e = best(*(t.get(i) for i in EAGER_GRAPH["eager"]))
        base_g = best(*(t.get(i) for i in EAGER_GRAPH["graph"]))
        ours_b, base_b = best(ours_e, ours_g), best(base_e, base_g)
        ratios = []
        for num, den, acc in ((ours_e, base_e, r_eager), (ours_g, base_g, r_graph), (ours_b, base_b, r_best)):
            x = num / den if num and den else None
            ratios.append(x)
            if x:
                acc.append(x)
        fastest = min((i for i in EAGER_GRAPH["eager"] + EAGER_GRAPH["graph"] if t.get(i)), key=lambda i: t[i],
                      default="-")
        any_row = next(iter(g.values()))
        cells = [human_bytes(any_row["shape"].get("bytes", 0))] + [fmt(t[i], 4) for i in impls]
        cells += [fmt(x) for x in ratios] + [fastest, verdict(ratios[2]), (g.get(OURS) or {}).get("algo", "")]
        md.append("| " + " | ".join(cells) + " |")
    md.append("")
    return md, (op, world, len(shapes), r_eager, r_graph, r_best)


def eager_graph_summary(entries):
    md = ["", "### allReduce small and medium: ours against the best of NCCL and symmetric memory, eager and "
          "CUDA graph", "", f"Geometric means and worst ratios over each table's sizes; a size meets the target "
          f"when the faster of ours is at most {TIE:.2f}x the fastest baseline, eager or graph.", "",
          "| op | GPUs | sizes | eager vs best eager | worst | graph vs best graph | worst | best ours vs best "
          "of all | worst | sizes at the target |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for op, world, n, re, rg, rb in entries:
        met = sum(1 for x in rb if x <= TIE)
        md.append(f"| {op} | {world} | {n} | {fmt(geomean(re))} | {fmt(max(re) if re else None)} | "
                  f"{fmt(geomean(rg))} | {fmt(max(rg) if rg else None)} | {fmt(geomean(rb))} | "
                  f"{fmt(max(rb) if rb else None)} | {met} of {n} |")
    return md


def provenance(rows):
    """'commit C; DATE', or, for a table whose rows come from several runs (a part re-measured
    and merged with the rows published before), each commit with its date and number of rows."""
    runs = {}
    for r in rows:
        k = (r["commit"], r["date"])
        runs[k] = runs.get(k, 0) + 1
    if len(runs) == 1:
        (commit, date), = runs
        return f"commit {commit}; {date}"
    return "rows from several runs: " + ", ".join(
        f"commit {c} ({d}, {n} rows)" for (c, d), n in runs.items())


def markdown(family, rows, device):
    f = FAMILIES[family]
    groups = tables(family, rows)
    extra = [EAGER_GRAPH_NOTE] if any(is_eager_graph(family, shapes) for _, _, shapes in groups) else []
    md = [f"# {f['title']}", "", f"{device}; {provenance(rows)}.", "",
          " ".join([f["protocol"], *extra, *notes(rows), "Ratios are time ratios, ours / the other: below 1, "
                    "ours is faster."]), ""]
    summary, eager_graph = [], []
    for op, world, shapes in groups:
        if is_eager_graph(family, shapes):
            lines, entry = eager_graph_table(op, world, shapes)
            md += lines
            eager_graph.append(entry)
            continue
        present = {i for _, g in shapes for i in g}
        impls = impl_order(family, present)
        has_floor = f["parts"] is not None
        cols = columns(family, op.split(" (")[0])
        head = [c if c != "label" else "shape" for c in cols]
        head += [f"{i} ms" for i in impls]
        if has_floor:
            head.append("floor ms")
        head += [f"ours {f['rate_name']}", "vs best baseline"]
        if has_floor:
            head.append("vs floor")
        also = [i for i in f.get("also", ()) if i in present]
        head += [f"vs {i}" for i in also]
        show_ran = any((g.get(OURS) or {}).get("algo") for _, g in shapes)
        if show_ran:
            head.append("ours ran")
        gpus = "1 GPU" if world == 1 else f"{world} {f.get('world_name', 'GPUs')}"
        aligns = ["---"] * len(cols) + ["---:"] * (len(head) - len(cols) - show_ran)
        aligns += ["---"] * show_ran
        md += [f"## {op}, {gpus}", "", "| " + " | ".join(head) + " |", "|" + "|".join(aligns) + "|"]
        vs_best, vs_floor, vs_own = [], [], []
        for _, g in shapes:
            any_row = next(iter(g.values()))
            cells = shape_cells(family, any_row)
            cells += [fmt(ms(g, i), 4) for i in impls]
            t_ours, t_base = ms(g, OURS), best(*(ms(g, b) for b in baselines(family, op)))
            t_floor = floor_ms(family, g)
            if has_floor:
                cells.append(fmt(t_floor, 4))
            ours = g.get(OURS)
            rate = ours.get(f["rate"]) if ok(ours) else None
            cells.append(fmt(rate, 1))
            rb = t_ours / t_base if t_ours and t_base else None
            cells.append(fmt(rb))
            if rb:
                vs_best.append(rb)
            if has_floor:
                rf = t_ours / t_floor if t_ours and t_floor else None
                cells.append(fmt(rf))
                if rf:
                    vs_floor.append(rf)
            for i in also:
                t_also = ms(g, i)
                cells.append(fmt(t_ours / t_also if t_ours and t_also else None))
            own_ms = [t for t in (ms(g, i) for i in f.get("own_paths", ())) if t]
            if t_ours and len(own_ms) >= 2:
                vs_own.append(t_ours / min(own_ms))
            ran = (ours or {}).get("algo", "")
            tf, td = ms(g, "fusedcomm_fused"), ms(g, "fusedcomm_decomposed")
            if ran in ("fused", "decomposed") and tf and td:
                faster = "fused" if tf <= td else "decomposed"
                ran += "" if faster == ran else f" (faster: {faster})"
            if show_ran:
                cells.append(ran)
            md.append("| " + " | ".join(cells) + " |")
        md.append("")
        summary.append((op, world, len(shapes), geomean(vs_best), vs_best, geomean(vs_floor), vs_own))
    md += ["## Summary"]
    own = "own_paths" in f
    if summary or not eager_graph:
        md += ["", "Geometric means over each table's shapes, ours (the automatic choice) "
               "against the best baseline" + (" and the floor" if f["parts"] else "")
               + ("; and the automatic choice's worst ratio to the fastest of our forced paths "
                  "(" + ", ".join(f["own_paths"]) + ") over the shapes timed with two or more of them."
                  if own else "."), "",
               f"| op | {f.get('world_name', 'GPUs')} | shapes | vs best baseline | best | worst |"
               + (" vs floor |" if f["parts"] else "") + (" vs our fastest path, worst |" if own else ""),
               "|---|---:|---:|---:|---:|---:|" + ("---:|" if f["parts"] else "") + ("---:|" if own else "")]
    for op, world, n, gm, v, gf, vo in summary:
        line = f"| {op} | {world} | {n} | {fmt(gm)} | {fmt(min(v) if v else None)} | {fmt(max(v) if v else None)} |"
        line += f" {fmt(gf)} |" if f["parts"] else ""
        md.append(line + (f" {fmt(max(vo) if vo else None)} |" if own else ""))
    if eager_graph:
        md += eager_graph_summary(eager_graph)
    errors = [r for r in rows if r.get("error")]
    if errors:
        md += ["", "## Errors", ""] + [f"- {r['op']} {r['impl']} W={r['world']} {r.get('label', '')} "
                                       f"{r.get('shape')}: {r['error']}" for r in errors]
    return md


def plot(family, rows, path, device):
    """One figure: a panel per (op, world), the rate per shape, a line per impl."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        print(f"report: no plot ({e})", file=sys.stderr)
        return False
    f = FAMILIES[family]
    panels = tables(family, rows)
    cols = min(len(panels), 4)
    nrows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(nrows, cols, figsize=(4.6 * cols, 3.8 * nrows), squeeze=False)
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    for ax, (op, world, shapes) in zip(axes.flat, panels):
        present = {i for _, g in shapes for i in g}
        for impl in impl_order(family, present):
            style = "o-" if impl == OURS else "o--" if impl.startswith(OURS) else "s:"
            if f["xlog"]:
                pts = sorted((g[impl]["shape"]["bytes"], g[impl].get(f["rate"])) for _, g in shapes
                             if ok(g.get(impl)) and g[impl].get(f["rate"]) is not None)
                xs, ys = [p[0] for p in pts], [p[1] for p in pts]
            else:
                xs = list(range(len(shapes)))
                ys = [g[impl].get(f["rate"]) if ok(g.get(impl)) else None for _, g in shapes]
                ys = [math.nan if y is None else y for y in ys]
            if xs:
                ax.plot(xs, ys, style, label=impl, ms=3)
        if f["xlog"]:
            ax.set_xscale("log", base=2)
            ax.set_xlabel("bytes")
        else:
            labels = [" ".join(shape_cells(family, next(iter(g.values())))[:2]) for _, g in shapes]
            ax.set_xticks(range(len(shapes)))
            ax.set_xticklabels(labels, rotation=60, ha="right", fontsize=6)
        ax.set_title(f"{op}, W={world}", fontsize=9)
        ax.set_ylabel(f["rate_name"])
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    fig.suptitle(f"{f['title']} ({device})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return True


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", required=True, choices=sorted(FAMILIES))
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--device", default="unknown device")
    ap.add_argument("--gpus", type=int, default=0, help="GPUs of the host")
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--date", default=None, help="default: now (UTC)")
    ap.add_argument("rows", nargs="+")
    a = ap.parse_args(argv)
    date = a.date or datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    rows = [r for r in read_rows(a.rows) if r.get("family", a.family) == a.family]
    for r in rows:
        r.setdefault("family", a.family)
        r.setdefault("device", a.device)
        r.setdefault("gpus", a.gpus)
        r.setdefault("commit", a.commit)
        r.setdefault("date", date)
    rows = merge(rows)
    if not rows:
        print(f"report: no {a.family} rows", file=sys.stderr)
        return 1
    os.makedirs(a.out_dir, exist_ok=True)
    base = os.path.join(a.out_dir, a.family)
    with open(base + ".json", "w") as f:
        json.dump(rows, f, indent=1)
        f.write("\n")
    device = rows[0]["device"]
    md = markdown(a.family, rows, device)
    with open(base + ".md", "w") as f:
        f.write("\n".join(md) + "\n")
    plot(a.family, rows, base + ".png", device)
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
