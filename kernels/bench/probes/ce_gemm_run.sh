#!/usr/bin/env bash
# One device call (2- or 4-GPU host, ~1 min): ce_gemm_probe.cu, the floor of an allGatherGemm
# whose exchange runs on the copy engines (our GEMM and the peers' shards copied side by side),
# with the copies in one piece per peer and in 4 MiB pieces (what per-chunk flags would need), and
# (FC_CE_MODES) pulled or pushed, on one copy stream or one per peer.
#   build (CPU machine): kernels/bench/probes/ce_gemm_run.sh build  -> build/ce_gemm_probe (carry it)
#   run   (GPU host):    kernels/bench/probes/ce_gemm_run.sh run    -> $OUT/ce_gemm.txt, $OUT/ce_gemm.jsonl
# Compare both/g with the fused allGatherGemm's fused time / our GEMM alone at the same shapes
# (kernels/bench/results/run16_h200x4/ag_split_bulk_w4.txt: 1.10-1.27 at its best counts).
set -uo pipefail
cd "$(dirname "$0")/../../.."
if [ "${1:-run}" = build ]; then
  set -e
  [ -f build/fused-bin/gemm.o ] || kernels/bench/fused/build.sh build/fused-bin > /dev/null
  nvcc -O3 -std=c++20 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -Ikernels/include \
    -o build/ce_gemm_probe kernels/bench/probes/ce_gemm_probe.cu build/fused-bin/gemm.o
  strip --strip-unneeded build/ce_gemm_probe
  git rev-parse --short HEAD > build/ce_gemm_probe.commit
  ls -la build/ce_gemm_probe; exit 0
fi
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/ce_gemm_out}; mkdir -p "$OUT"
{ echo "commit $(cat build/ce_gemm_probe.commit 2>/dev/null || echo unknown), $(date -u +%FT%TZ)"; nvidia-smi -L; } > "$OUT/ce_gemm.txt"
rc=0
# FC_CE_MODES: chunk MiB:pull|push:one|per-peer, one probe run each.
for mode in ${FC_CE_MODES:-0:pull:one 0:pull:per-peer 0:push:one 4:pull:per-peer}; do
  IFS=: read -r chunk issue streams <<< "$mode"
  timeout 180 build/ce_gemm_probe --chunk-mib "$chunk" --issue "$issue" --streams "$streams" \
    > /tmp/ce_gemm_run.txt 2>&1 || rc=1
  grep -v '^{' /tmp/ce_gemm_run.txt >> "$OUT/ce_gemm.txt"
  grep '^{' /tmp/ce_gemm_run.txt >> "$OUT/ce_gemm.jsonl"
done
cat "$OUT/ce_gemm.txt"
exit $rc
