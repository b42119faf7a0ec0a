#!/usr/bin/env bash
# One device call for the fused ops (issue 5): GPU facts, gpu_fused_test, then ours
# (fused_bench) and the PyTorch baselines (torch_baselines.py) at the world sizes of FC_WORLDS
# (default "2 4 8") that the GPU count allows, then the report. Everything lands in $OUT (at most 8 files: gpu.txt,
# test.log, bench.log, ptxas.txt, fused_results.{json,md,png}). Binaries from build.sh
# (carried, or rebuilt here if they cannot run). Usage (repo root, GPU host):
#   kernels/bench/fused/device_run.sh [bin=build/fused-bin] [all|test|bench] [full|quick] [commit]
# FC_RS_PARTIALS=bf16: gemmReduceScatter with bf16 partials (fused_bench --rs-partials), the
# baselines' numerics; f32any: fp32 partials summed in any order (the accumulating slot at W >= 3).
# FC_OPS: the ops to time (fused_bench / torch_baselines --ops; default ag,rs; ar: gemmAllReduce).
# FC_BENCH_ROUNDS: rounds per world, in alternating order (default 1; see below); FC_ROUND_FROM=k
# starts at round k (another call's rounds, merged by report.py with this one's rows).
# FC_SUSTAIN_MS: both benches' --sustain-ms (default 500: every impl runs back to back that long,
# then its batches; 0: ours round robin, the baselines impl by impl, as before run 14).
# Time: the test ~1-2 min; the bench ~2-3 min per world size in full mode, ~1 min quick (on
# an 8-GPU host, FC_WORLDS=8 with `bench` keeps one call within the 10-minute limit).
set -uo pipefail
bin=${1:-build/fused-bin}; what=${2:-all}; mode=${3:-full}; commit=${4:-unknown}
OUT=${OUT:-/tmp/fused_out}; mkdir -p "$OUT"
# NVLink multicast stays off on shared hosts (NCCL, PyTorch symmetric memory, NVSHMEM).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
here=kernels/bench/fused
if ! [ -x "$bin/fused_bench" ] || ! [ -x "$bin/gpu_fused_test" ] || ! ldd "$bin/fused_bench" > /dev/null 2>&1; then
  echo "rebuilding on the device"; $here/build.sh /tmp/fused-bin > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
  bin=/tmp/fused-bin
fi
[ -f "$bin/ptxas.txt" ] && cp "$bin/ptxas.txt" "$OUT/ptxas.txt"
ngpu=$(nvidia-smi -L | wc -l)
device="$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) x$ngpu"
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.limit --format=csv; nvidia-smi topo -m
  python3 -c 'import torch; print("torch", torch.__version__, "nccl", torch.cuda.nccl.version())'; } > "$OUT/gpu.txt" 2>&1
head -4 "$OUT/gpu.txt"
rc=0
if [ "$what" != bench ]; then
  timeout 300 "$bin/gpu_fused_test" > "$OUT/test.log" 2>&1; rc=$?
  grep -E "^==|FAIL|PASS|SKIP|timed out|passed|^  [a-z-]" "$OUT/test.log" | head -60; echo "gpu_fused_test rc=$rc"
fi
if [ "$what" != test ]; then
  q=""; [ "$mode" = quick ] && q="--quick"
  # The rows go straight to $OUT: a call cut at the device's limit still returns them (the
  # report, which joins them into fused_results.json, comes last).
  rows=$OUT/rows; rm -rf "$rows"; mkdir -p "$rows"
  # FC_BENCH_ROUNDS=N: N rounds per world in alternating order (ours, torch, torch, ours, ...);
  # the report takes each impl's median over the rounds (a GPU warms through a run, and power
  # caps its clock: whoever runs first would otherwise always get the cooler GPU).
  ours() {
    echo "== world $w, round $k: ours" | tee -a "$OUT/bench.log"
    timeout 280 "$bin/fused_bench" --world $w --out "$rows/fused_w${w}_r$k.jsonl" $q --ops "${FC_OPS:-ag,rs}" --rs-partials "${FC_RS_PARTIALS:-f32}" --sustain-ms "${FC_SUSTAIN_MS:-500}" >> "$OUT/bench.log" 2>&1 || echo "fused_bench w=$w rc=$?" | tee -a "$OUT/bench.log"
  }
  theirs() {
    echo "== world $w, round $k: torch" | tee -a "$OUT/bench.log"
    timeout 280 torchrun --nproc-per-node $w $here/torch_baselines.py --out "$rows/torch_w${w}_r$k.jsonl" $q --ops "${FC_OPS:-ag,rs}" --sustain-ms "${FC_SUSTAIN_MS:-500}" >> "$OUT/bench.log" 2>&1 || echo "torch_baselines w=$w rc=$?" | tee -a "$OUT/bench.log"
  }
  for w in ${FC_WORLDS:-2 4 8}; do
    [ $w -le "$ngpu" ] || continue
    for k in $(seq "${FC_ROUND_FROM:-1}" "${FC_BENCH_ROUNDS:-1}"); do
      if [ $((k % 2)) = 1 ]; then ours; theirs; else theirs; ours; fi
    done
  done
  python3 $here/report.py --out-dir "$OUT" --device "$device" --commit "$commit" --prefix fused_results \
    "$rows"/*.jsonl | tail -60
  [ -s "$OUT/fused_results.json" ] && rm -rf "$rows"  # every row is in fused_results.json now
fi
exit $rc
