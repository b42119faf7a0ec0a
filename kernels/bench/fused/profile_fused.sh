#!/usr/bin/env bash
# Nsight Compute on one launch of a fused kernel and one of the plain GEMM of the same local
# shape (fused_bench at world 1, --tp T), same metrics, to see where the fused kernel's local
# overhead goes. Clocks are left alone (--clock-control none).
#   kernels/bench/fused/profile_fused.sh <fused_bench dir> <ag|rs> <tp> "<shape label part>" [...]
# Writes $OUT/ncu_<op>_tp<T>_<shape>_{fused,gemm}.txt and prints a short comparison table.
set -uo pipefail
bin=${1:?fused_bench dir}; op=${2:?ag or rs}; tp=${3:?tp}; shift 3
OUT=${OUT:-/tmp/prof_out}; mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ -n "$ncu" ] || { echo "no ncu"; exit 1; }
sections="--section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section WarpStateStats --section LaunchStats --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio"
fused_kernel=$([ "$op" = ag ] && echo ag_gemm_kernel || echo rs_gemm_kernel)
for shape in "$@"; do
  tag=$(echo "${op}_tp${tp}_$shape" | tr -c 'A-Za-z0-9_\n' '_')
  for k in "$fused_kernel:fused" "gemm_sm90_kernel:gemm"; do
    # The bench's warm-up launches come first: skip two of each kernel.
    "$ncu" --clock-control none --target-processes all -k "regex:${k%%:*}" --launch-skip 2 \
      --launch-count 1 $sections "$bin/fused_bench" --world 1 --tp "$tp" --ops "$op" \
      --shape "$shape" --batches 1 --batch-ms 5 --out /tmp/prof_rows.jsonl \
      > "$OUT/ncu_${tag}_${k##*:}.txt" 2>&1
  done
done
python3 "$(dirname "$0")/../ncu_summary.py" "$OUT" 'gemm_kernel|gemm_sm90'
