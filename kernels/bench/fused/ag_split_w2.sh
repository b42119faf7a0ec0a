#!/usr/bin/env bash
# One device call on 2 x H200 (~2 min): the fused allGatherGemm at W = 2 at the shapes that
# missed target 1 in run 31, with kAuto's split (d), 8 or 4 pulling CTAs (--ctas) and the
# copy-engine exchange (ce), two rounds, the order rotated; carries build/fbr.tar.xz (a build of
# HEAD, docs/gpu-runs-owed.md). Rows: $OUT/agsplit.jsonl; prints variant_ratios.py's table.
set -uo pipefail
cd "$(dirname "$0")/../../.."
here=kernels/bench/fused
. $here/builds_lib.sh
unpack_builds build/fbr || exit 1
OUT=${OUT:-/tmp/agsplit_out}; mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
shapes="8b M=16384|70b M=4096|70b M=8192|70b M=16384|S=16384"
run_variant() {
  local x=()
  case $1 in c8) x=(--ctas 8) ;; c4) x=(--ctas 4) ;; ce) x=(--ag-exchange ce) ;; esac
  timeout 150 build/fbr/fused_bench --world 2 --ops ag --sustain-ms 500 --batches 5 \
    --ag-gathered 1 --shape "$shapes" "${x[@]}" --out "$2" > /dev/null 2>&1
}
rm -f "$OUT/agsplit.jsonl"
variant_rounds "$OUT/agsplit.jsonl" 2 0 d c8 c4 ce
python3 $here/variant_ratios.py "$OUT/agsplit.jsonl" d
