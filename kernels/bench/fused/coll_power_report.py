"""The table of coll_power_ab.sh and sustain_ab.sh: per world, op and shape, the decomposed
pair (ours_decomposed / torch_serial), the fused op (ours_fused / torch_symm_mem) and the parts
alone (ms, medians over rounds), each with the power and SM clock that NVML sampled while its
batches ran (means over ranks and rounds), for every build or protocol ("build": names
starting with "torch" are torch_baselines.py rows).
Usage: python3 coll_power_report.py DIR  (DIR/rows.jsonl; DIR/logs/<build>_w<W>_r<round>.log
for the clocks; coll_power_ab.sh's ours_w<W>_<build>_r<round>.log too)"""
import glob
import json
import os
import re
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import bench_common  # noqa: E402

d = sys.argv[1]
ms = {}  # (world, op, shape, build, impl) -> [ms per round]
builds = []
for line in open(os.path.join(d, "rows.jsonl")):
    r = json.loads(line)
    if r["build"] not in builds:
        builds.append(r["build"])
    ms.setdefault((r["world"], r["op"], r["shape"], r["build"], r["impl"]), []).append(r["ms_median"])

power = {}  # (world, op, shape, build, impl) -> [(MHz, W)]
for log in glob.glob(os.path.join(d, "logs", "*.log")):
    name = os.path.basename(log)[:-4]
    if (m := re.match(r"ours_w(\d+)_(.+)_r\d+$", name)):  # coll_power_ab.sh's names
        w, build = int(m.group(1)), m.group(2)
    elif (m := re.match(r"(.+)_w(\d+)_r\d+$", name)):
        w, build = int(m.group(2)), m.group(1)
    else:
        continue
    for line in open(log):
        if (x := bench_common.clock_sample(line)):
            op, shape, impl, _, mhz, watts = x
            power.setdefault((w, op, shape, build, impl), []).append((mhz, watts))


def cell(key):
    v = ms.get(key)
    if not v:
        return "-"
    p = power.get(key)
    s = f"{statistics.median(v):.4f}"
    if p:
        s += f" ({statistics.mean(x[1] for x in p):.0f} W, {statistics.mean(x[0] for x in p):.0f} MHz)"
    return s


parts = {"ours": ["ours_decomposed", "ours_fused", "ours_collective", "ours_gemm"],
         "torch": ["torch_serial", "torch_symm_mem", "torch_collective", "torch_gemm"]}
keys = sorted({k[:3] for k in ms})
print("ms (median over rounds), with power and SM clock (NVML means over ranks and rounds)")
for w, op, shape in keys:
    print(f"\n## W = {w}, {op}, {shape}")
    print(f"{'build':12} {'decomposed / serial':>30} {'fused / symm_mem':>30} {'collective alone':>30} "
          f"{'GEMM alone':>30}")
    for b in builds:
        names = parts["torch" if b.startswith("torch") else "ours"]
        print(f"{b:12} " + " ".join(f"{cell((w, op, shape, b, n)):>30}" for n in names))
