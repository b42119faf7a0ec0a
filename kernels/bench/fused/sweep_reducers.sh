#!/usr/bin/env bash
# gemmReduceScatter's reducing-CTA count swept at world 1 (the local proxy of local_run.sh):
# fused_bench --world 1 --tp T --ctas R for T in {2, 4}, fp32 and bf16 partials, R in the list.
# Rows (with "ctas_req" added) go to $OUT/sweep.jsonl. Usage (repo root, GPU host):
#   kernels/bench/fused/sweep_reducers.sh <bin> ["8 12 16 24 32 40"]
# About 100 s on 1 x H200 for the default list (12 shapes per T, 4 impls each).
set -uo pipefail
bin=${1:?bin folder}; list=${2:-8 12 16 24 32 40}
OUT=${OUT:-/tmp/sweep_out}; mkdir -p "$OUT"
for tp in 2 4; do for part in f32 bf16; do for c in $list; do
  rm -f /tmp/sweep_rows.jsonl  # a failed run must not re-append the previous rows
  "$bin/fused_bench" --world 1 --tp $tp --ops rs --ctas $c --batches 3 --rs-partials $part \
    --out /tmp/sweep_rows.jsonl > /dev/null 2>&1 || echo "rc=$? tp=$tp $part ctas=$c"
  sed "s/}\$/, \"ctas_req\": $c}/" /tmp/sweep_rows.jsonl >> "$OUT/sweep.jsonl" 2> /dev/null
done; done; done
wc -l "$OUT/sweep.jsonl"
