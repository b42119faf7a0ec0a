#!/usr/bin/env bash
# The fused kernels' local overhead on a one-GPU host: fused_bench at world 1 with the local
# shapes of TP 2 and 4 (--tp), so that ours_fused runs the whole fused kernel (GEMM role with
# its epilogue, flags and tile claims; pulling / reducing CTAs over the own rows) without
# NVLink. ours_fused / ours_gemm is then what the fusion costs before any communication.
# Several builds are interleaved round by round (A/B on one machine, one run). Usage (repo
# root, GPU host, $OUT set):
#   kernels/bench/fused/local_run.sh "<bin> [<bin> ...]" [rounds=2] [ops=ag,rs] [partials="f32 bf16"] [quick|full] [world=1]
# world > 1 (a host with that many GPUs): the same A/B at that world size over NVLink, TP = world.
# FC_BENCH_ARGS: extra fused_bench arguments (e.g. "--ag-gathered 0 --shape 70b").
# FC_TPS: the TP sizes at world 1 (default "2 4"). FC_PHANTOM=1: phantom-peer builds run their
# fused launches at W = TP (--phantom-world; other builds ignore it).
# FC_DEADLINE_S: no new fused_bench run starts this many seconds after the script started.
# Appends every row, with "build" and "round" added, to $OUT/local.jsonl (logs: $OUT/local.log)
# and prints a table last (local_report.py).
set -uo pipefail
bins=${1:?bin folders}; rounds=${2:-2}; ops=${3:-ag,rs}; partials=${4:-f32 bf16}; mode=${5:-full}
world=${6:-1}
tps=${FC_TPS:-2 4}; [ "$world" -gt 1 ] && tps=$world
OUT=${OUT:-/tmp/local_out}; mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
q=""; [ "$mode" = quick ] && q="--quick"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.limit --format=csv,noheader
for r in $(seq 1 "$rounds"); do
  for tp in $tps; do
    for part in $partials; do
      for b in $bins; do
        name=$(basename "$b")
        if [ -n "${FC_DEADLINE_S:-}" ] && [ "$SECONDS" -ge "$FC_DEADLINE_S" ]; then
          echo "local_run: deadline of $FC_DEADLINE_S s reached, $name tp=$tp $part round $r not run"; continue
        fi
        rm -f /tmp/local_rows.jsonl  # a failed run must not re-append the previous rows
        ph=""; [ "${FC_PHANTOM:-0}" = 1 ] && ph="--phantom-world $tp"
        timeout 200 "$b/fused_bench" --world "$world" --tp $tp --ops "$ops" --rs-partials "$part" $q $ph \
          --batches 5 ${FC_BENCH_ARGS:-} --out /tmp/local_rows.jsonl >> "$OUT/local.log" 2>&1 || echo "fused_bench $name tp=$tp $part rc=$?"
        sed "s/}\$/, \"build\": \"$name\", \"round\": $r}/" /tmp/local_rows.jsonl >> "$OUT/local.jsonl" 2> /dev/null
      done
    done
  done
done
python3 "$(dirname "$0")/local_report.py" "$OUT"
