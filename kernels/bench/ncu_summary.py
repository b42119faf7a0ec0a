#!/usr/bin/env python3
"""Short comparison of Nsight Compute text reports: for every DIR/ncu_*.txt, the kernel's name
(the first line matching NAME_REGEX), a few Speed-of-Light, memory and launch figures, and the
largest stall reasons when the report has the smsp__average_warps_issue_stalled_* metrics.
Used by profile_gemm.sh and fused/profile_fused.sh.

  ncu_summary.py DIR [NAME_REGEX]
"""
import glob
import os
import re
import sys

KEYS = ["Duration", "Compute (SM) Throughput", "Memory Throughput", "DRAM Throughput",
        "L2 Hit Rate", "L1/TEX Hit Rate", "Executed Ipc Active", "Issue Slots Busy",
        "Registers Per Thread", "Block Size", "Grid Size", "Dynamic Shared Memory Per Block",
        "Cluster Size", "Warp Cycles Per Issued Instruction", "SM Frequency"]
STALL = re.compile(r"smsp__average_warps_issue_stalled_(\w+)_per_issue_active\.ratio\s+\S+\s+([\d.]+)")


def main():
    folder = sys.argv[1]
    name_re = sys.argv[2] if len(sys.argv) > 2 else r"gemm|xmma|cutlass|nvjet"
    for path in sorted(glob.glob(os.path.join(folder, "ncu_*.txt"))):
        text = open(path).read()
        # The kernel line: "  <name> (grid)x(block), Context ..." (names may hold spaces).
        names = re.findall(r"^\s+(\S.*?(?:" + name_re + r").*?) \(\d+, \d+, \d+\)x", text, re.M)
        print(f"== {os.path.basename(path)}: {names[0][:140] if names else '(no kernel profiled)'}")
        for key in KEYS:
            m = re.search(r"^\s+" + re.escape(key) + r"\s+(\S+)\s+(\S+)\s*$", text, re.M)
            if m:
                print(f"   {key:40} {m.group(2):>12} {m.group(1)}")
        stalls = sorted(((float(v), k) for k, v in STALL.findall(text)), reverse=True)[:6]
        if stalls:
            print("   stalls (cycles per issued instruction): " +
                  ", ".join(f"{k} {v:.2f}" for v, k in stalls))


if __name__ == "__main__":
    main()
