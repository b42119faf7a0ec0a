#!/usr/bin/env bash
# One device call: GPU facts, gpu_collectives_test, then ours vs NCCL at the world sizes of
# FC_WORLDS (default "2 4 8") that the GPU count allows, then the report. Binaries from build.sh
# (carried, or rebuilt here if they cannot run). Usage (repo root, GPU host):
#   kernels/bench/collectives/device_run.sh [bin=build/coll-bin] [test|bench|all] [commit]
# On an 8-GPU host, FC_WORLDS=8 keeps one call within the 10-minute limit.
set -uo pipefail
bin=${1:-build/coll-bin}; what=${2:-all}; commit=${3:-unknown}
OUT=${OUT:-/tmp/coll_out}; mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
here=kernels/bench/collectives
if ! [ -x "$bin/coll_bench" ]; then $here/build.sh /tmp/coll-bin; bin=/tmp/coll-bin; fi
ngpu=$(nvidia-smi -L | wc -l)
device="$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) x$ngpu"
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv; nvidia-smi topo -m; } > "$OUT/gpu.txt" 2>&1
head -3 "$OUT/gpu.txt"
rc=0
if [ "$what" != bench ]; then
  timeout 400 "$bin/gpu_collectives_test" > "$OUT/test.log" 2>&1; rc=$?
  grep -E "^==|FAIL|PASS|expected|passed" "$OUT/test.log" | head -60; echo "gpu_collectives_test rc=$rc"
fi
if [ "$what" != test ]; then
  max=${MAX_BYTES:-1073741824}
  # The rows go straight to $OUT: a call cut at the device's limit still returns them (the
  # report, which joins them into collectives_results_*.json, comes last).
  rows=$OUT/rows; rm -rf "$rows"; mkdir -p "$rows"
  for w in ${FC_WORLDS:-2 4 8}; do
    [ $w -le $ngpu ] || continue
    # allReduce in place, as NCCL's (nccl_bench.py: dist.all_reduce(t)); kAuto may pick direct.
    timeout 200 "$bin/coll_bench" --world $w --out "$rows/ours_w$w.jsonl" --max-bytes $max --inplace 1 >> "$OUT/bench.log" 2>&1 || echo "coll_bench w=$w rc=$?"
    timeout 200 torchrun --nproc-per-node $w $here/nccl_bench.py --out "$rows/nccl_w$w.jsonl" --max-bytes $max >> "$OUT/nccl.log" 2>&1 || echo "nccl w=$w rc=$?"
  done
  cat "$rows"/ours_w*.jsonl "$rows"/nccl_w*.jsonl > /tmp/coll_all.jsonl 2>/dev/null
  # kAuto's large allReduce against each algorithm forced, in the same call: two-phase, and push
  # with 128 KiB chunks (what kAuto runs at W = 2 from 256 MiB), out of place; direct (in place
  # only) with 128 KiB chunks; table printed before the report.
  for w in ${FC_WORLDS:-2 4 8}; do
    [ $w -le $ngpu ] && [ $max -ge 67108864 ] || continue
    timeout 120 "$bin/coll_bench" --world $w --ops ar --algos 2,3 --chunks-kib 128 --min-bytes 67108864 \
      --max-bytes $max --label forced --out "$OUT/ours_ar_forced_w$w.jsonl" >> "$OUT/bench.log" 2>&1 ||
      echo "coll_bench forced w=$w rc=$?"
    timeout 120 "$bin/coll_bench" --world $w --ops ar --algos 5 --chunks-kib 128 --min-bytes 67108864 \
      --max-bytes $max --label forced --inplace 1 --out "$OUT/ours_ar_direct_w$w.jsonl" >> "$OUT/bench.log" 2>&1 ||
      echo "coll_bench direct w=$w rc=$?"
  done
  python3 $here/variants_report.py --min-bytes 67108864 --ops allReduce "$rows"/ours_w*.jsonl \
    "$rows"/nccl_w*.jsonl "$OUT"/ours_ar_forced_w*.jsonl "$OUT"/ours_ar_direct_w*.jsonl | tee "$OUT/allreduce_algos.txt"
  python3 $here/report.py --out-dir "$OUT" --device "$device" --commit "$commit" --prefix "collectives_results_w$ngpu" /tmp/coll_all.jsonl | tail -40
  ls "$OUT"/collectives_results_w*.json > /dev/null 2>&1 && rm -rf "$rows"  # all in the report's JSON now
fi
kernels/bench/pack_out.sh "$OUT" logs.tar.xz 'collectives_results_*' test.log allreduce_algos.txt gpu.txt
exit $rc
