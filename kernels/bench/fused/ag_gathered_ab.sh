#!/usr/bin/env bash
# allGatherGemm's fused kernel at world 1 (fused_bench --tp, as local_run.sh), with and without
# the gathered-A output (--ag-gathered 1|0), builds interleaved round by round; the first build
# is the base. Usage (repo root, GPU host, $OUT set):
#   kernels/bench/fused/ag_gathered_ab.sh "<base bin> <new bin>" [rounds=2]
# Rows (with "build" and "round") to $OUT/ag_ab.jsonl, logs to $OUT/ag_ab.log; prints a table.
set -uo pipefail
bins=${1:?bin folders}; rounds=${2:-2}
OUT=${OUT:-/tmp/ag_out}; mkdir -p "$OUT"; rows=$OUT/ag_ab.jsonl; rm -f "$rows"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
read -r base new <<< "$bins"
for r in $(seq 1 "$rounds"); do for tp in 2 4; do for g in 0 1; do for b in $bins; do
  rm -f /tmp/ag_rows.jsonl  # a failed run must not re-append the previous rows
  timeout 200 "$b/fused_bench" --world 1 --tp $tp --ops ag --ag-gathered $g --batches 5 \
    --out /tmp/ag_rows.jsonl >> "$OUT/ag_ab.log" 2>&1 || echo "rc=$? $b tp=$tp gathered=$g"
  sed "s/}\$/, \"build\": \"$(basename "$b")\", \"round\": $r}/" /tmp/ag_rows.jsonl >> "$rows"
done; done; done; done
python3 - "$rows" "$(basename "$base")" "$(basename "$new")" <<'PY'
import collections, json, math, statistics, sys
rows, base, new = sys.argv[1:4]
d = collections.defaultdict(list)
for line in open(rows):
    r = json.loads(line)
    d[(r["tp"], r["shape"], r["impl"], r["build"], r["ag_gathered"])].append(r["ms_median"])
med = {k: statistics.median(v) for k, v in d.items()}
print(f"| tp | shape | GEMM ms | {base} fused ms (no gathered) | {new}/{base} (no gathered) | "
      f"{new}/{base} (gathered) | {new} fused/GEMM (no gathered) |")
print("|---|---|---|---|---|---|---|")
ratios = collections.defaultdict(list)
for tp, s in sorted({(k[0], k[1]) for k in med}):
    gemm = med[(tp, s, "ours_gemm", base, False)]
    b0, n0 = med[(tp, s, "ours_fused", base, False)], med[(tp, s, "ours_fused", new, False)]
    b1, n1 = med[(tp, s, "ours_fused", base, True)], med[(tp, s, "ours_fused", new, True)]
    ratios[(tp, False)].append(n0 / b0)
    ratios[(tp, True)].append(n1 / b1)
    print(f"| {tp} | {s} | {gemm:.4f} | {b0:.4f} | {n0/b0:.3f} | {n1/b1:.3f} | {n0/gemm:.3f} |")
gm = lambda x: math.exp(sum(map(math.log, x)) / len(x))
for tp in sorted({k[0] for k in ratios}):
    print(f"TP {tp}: geomean {new}/{base} fused time: no gathered {gm(ratios[(tp, False)]):.3f}, "
          f"gathered {gm(ratios[(tp, True)]):.3f}")
PY
