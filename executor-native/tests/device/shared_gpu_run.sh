#!/usr/bin/env bash
# The multi-process GPU tests on a 1-GPU host, every rank on GPU 0 (FC_TEST_SHARED_GPU, see
# tests/gpu_test_support.h): protocol and numerics only, no timings. Usage (repo root, GPU host,
# $OUT set), with binaries built on the CPU machine and carried in <bin>:
#   executor-native/tests/device/shared_gpu_run.sh <bin> [max_world=2] [coll|fused|all]
# <bin> holds gpu_collectives_test and gpu_fused_test (cmake --build <dir> --target ...).
# Logs: $OUT/shared_coll_w<max>.log, $OUT/shared_fused_w<max>.log; a summary is printed last.
set -uo pipefail
bin=${1:?binary folder}; world=${2:-2}; what=${3:-all}
OUT=${OUT:-/tmp/shared_out}; mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export FC_TEST_SHARED_GPU=$world
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
summary=()
run() {  # name binary timeout
  local log="$OUT/shared_$1_w$world.log" t0=$SECONDS rc
  timeout "$3" "$bin/$2" > "$log" 2>&1; rc=$?
  summary+=("$2 (FC_TEST_SHARED_GPU=$world): rc=$rc in $((SECONDS - t0)) s; $(grep -E '^== world [0-9]+.*: (PASS|FAIL)' "$log" | tr '\n' ';')")
  grep -E "FAIL|mismatch|passed|timed out|expected" "$log" | head -40
}
# Time grows with the world (the ranks time-slice one GPU): on an H200 about 8 s per rank for
# each world of gpu_collectives_test (worlds 2..max: ~2 min at max 4, ~5 min at 8) and 2-3 s
# per rank for gpu_fused_test.
[ "$what" != fused ] && run coll gpu_collectives_test $((world < 4 ? 280 : 70 * world))
[ "$what" != coll ] && run fused gpu_fused_test $((world < 7 ? 280 : 40 * world))
printf '%s\n' "${summary[@]}"
