#!/usr/bin/env bash
# Nsight Compute on one launch of our GEMM and of cuBLAS (torch.matmul) per shape, same metrics,
# to compare where the time goes (issue: ours is 0.96-0.97 of cuBLAS on the up/gate shapes,
# 1.04 on square 8192^3). Clocks are left alone (--clock-control none).
#   kernels/bench/profile_gemm.sh <gemm_bench dir> "M N K" ["M N K" ...]
# Writes $OUT/ncu_<impl>_<M>x<N>x<K>.txt and prints a short comparison table.
set -uo pipefail
bin=${1:?gemm_bench dir}; shift
OUT=${OUT:-/tmp/prof_out}; mkdir -p "$OUT"
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ -n "$ncu" ] || { echo "no ncu"; exit 1; }
sections="--section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section WarpStateStats --section LaunchStats"
for shape in "$@"; do
  read -r M N K <<< "$shape"; tag=${M}x${N}x${K}
  echo "p $M $N $K nk" > /tmp/shape_$tag.txt
  "$ncu" --clock-control none -k regex:gemm_sm90 --launch-skip 2 --launch-count 1 $sections \
    "$bin/gemm_bench" /tmp/shape_$tag.txt 2 1 > "$OUT/ncu_ours_$tag.txt" 2>&1
  "$ncu" --clock-control none -k regex:'gemm|xmma|cutlass|nvjet' --launch-skip 2 --launch-count 1 $sections \
    python3 -c "
import torch
a = torch.randn($M, $K, device='cuda', dtype=torch.bfloat16)
b = torch.randn($N, $K, device='cuda', dtype=torch.bfloat16)
for _ in range(4): c = a @ b.t()
torch.cuda.synchronize()" > "$OUT/ncu_cublas_$tag.txt" 2>&1
done
python3 "$(dirname "$0")/ncu_summary.py" "$OUT"
