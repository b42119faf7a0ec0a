"""What the multi-GPU benchmarks share: the report scripts' command line, row joining and
optional plot (collectives/report.py, fused/report.py), and the torch.distributed start and end
of the PyTorch baselines (collectives/nccl_bench.py, fused/torch_baselines.py).

The scripts run by path from any folder; each puts this folder on sys.path before importing
this module. torch and matplotlib are imported only where used, so the reports run without them.
"""
import argparse
import datetime
import json
import os
import re
import statistics


def report_args(default_prefix):
    """The reports' command line: --out-dir DIR [--device NAME] [--commit SHA] [--prefix P]
    IN.jsonl... (outputs: DIR/P.json, DIR/P.md, DIR/P.png)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--device", default="?")
    ap.add_argument("--commit", default="?")
    ap.add_argument("--prefix", default=default_prefix)
    ap.add_argument("inputs", nargs="+")
    return ap.parse_args()


def join_rows(a):
    """Reads the JSON lines of a.inputs (a missing file is skipped), stamps every row with the
    device, commit and this minute (UTC), and writes them all to OUT_DIR/PREFIX.json.
    Returns (rows, date)."""
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
    return rows, date


def merge_rounds(rows, key):
    """Rows of one (op, world, shape, impl, ...) measured in several rounds (the benches run in
    alternating order, ours then the baselines and back: device_run.sh's FC_BENCH_ROUNDS) become
    one row: ms_median the median over the rounds, ms_ranks the per-rank medians, and
    ms_rounds every round's value. key(row) -> the identity tuple. First-seen order is kept."""
    groups, order = {}, []
    for r in rows:
        k = key(r)
        if k not in groups:
            groups[k] = []
            order.append(k)
        groups[k].append(r)
    out = []
    for k in order:
        g = groups[k]
        if len(g) == 1:
            out.append(g[0])
            continue
        m = dict(g[0])
        vals = [r["ms_median"] for r in g if isinstance(r.get("ms_median"), (int, float))]
        if vals:
            m["ms_median"] = statistics.median(vals)
            m["ms_rounds"] = vals
            # Rates computed from the time: rescaled to the median.
            first = g[0].get("ms_median")
            for rate in ("tflops", "gbps"):
                if isinstance(m.get(rate), (int, float)) and first and m["ms_median"] > 0:
                    m[rate] = m[rate] * first / m["ms_median"]
        per = [r.get("ms_ranks") for r in g if r.get("ms_ranks")]
        if per and all(len(v) == len(per[0]) for v in per):
            m["ms_ranks"] = [statistics.median(col) for col in zip(*per)]
        out.append(m)
    return out


# The NVML lines of the benches' --clocks (fused_bench.cc: "clocks <op> <shape> (<impl>,...)
# impl <i> rank <r>: sm <MHz> MHz (<min>-<max>), <W> W, ..."; torch_baselines.py: "clocks torch
# <op> <shape> <impl> rank <r>: sm <MHz> MHz, <W> W").
_OURS_CLOCKS = re.compile(r"^clocks (\S+) (.+?) \(([\w,]+)\) impl (\d+) rank (\d+): sm (\d+) MHz .*?, (\d+) W")
_TORCH_CLOCKS = re.compile(r"^clocks torch (\S+) (.+?) (torch_\w+) rank (\d+): sm (\d+) MHz, (\d+) W")


def clock_sample(line):
    """One --clocks line -> (op, shape, impl, rank, MHz, W), or None for any other line."""
    if (x := _OURS_CLOCKS.match(line)):
        op, shape, impls, i, rank, mhz, watts = x.groups()
        return op, shape, impls.split(",")[int(i)], int(rank), int(mhz), int(watts)
    if (x := _TORCH_CLOCKS.match(line)):
        op, shape, impl, rank, mhz, watts = x.groups()
        return op, shape, impl, int(rank), int(mhz), int(watts)
    return None


def write_markdown(a, md):
    """Writes the table lines to OUT_DIR/PREFIX.md and prints them."""
    with open(os.path.join(a.out_dir, a.prefix + ".md"), "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))


def save_plot(a, draw):
    """OUT_DIR/PREFIX.png from draw(plt), which returns the figure (None: no plot). Plots are
    optional, the table is the record: any failure, matplotlib missing included, is printed."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig = draw(plt)
        if fig is None:
            return
        fig.tight_layout()
        fig.savefig(os.path.join(a.out_dir, a.prefix + ".png"), dpi=90)
    except Exception as e:
        print("no plot:", e)


def init_nccl():
    """torch.distributed on NCCL for this torchrun process, one GPU per rank. Returns
    (rank, world, device). NCCL_NVLS_ENABLE=0 must be set: NVLink multicast stays off on
    shared hosts."""
    import torch
    import torch.distributed as dist
    assert os.environ.get("NCCL_NVLS_ENABLE") == "0", "export NCCL_NVLS_ENABLE=0"
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    dist.init_process_group("nccl", device_id=dev)
    return rank, world, dev


def finish_nccl(out):
    """Closes rank 0's output file (None on the other ranks), waits for every rank, and ends
    the process group."""
    import torch.distributed as dist
    if out:
        out.close()
    dist.barrier()
    dist.destroy_process_group()
