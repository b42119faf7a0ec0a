#!/usr/bin/env bash
# Where the fused gemmReduceScatter's time over our GEMM alone goes at W = 2, over NVLink
# (issue 5's target 2 misses at square 8192 and 70B M = 4096; fused/NOTES.md "Run 13"), in ONE
# device call of ~1-2 minutes on a 2-GPU host:
#   build (CPU machine): kernels/bench/fused/rs_w2_probe.sh build  -> build/r13.tar.xz (carry it)
#   run   (GPU host):    kernels/bench/fused/rs_w2_probe.sh run    -> $OUT/r13/*
# Builds in the archive: def (the default fused_bench) and trace (-DFUSEDCOMM_RS_TRACE: where
# the kernel waits). Run 13 also A/B-tested the interleaved sweep here (-DFUSEDCOMM_RS_INTERLEAVE,
# removed after it lost; the script as run stands at 75be861).
# Run steps:
#   1. clocks: the default build with --clocks (NVML SM clock and power during every batch) at
#      square 8192 (allGatherGemm and gemmReduceScatter) and 70B M = 4096 (gemmReduceScatter),
#      bf16 partials, 100 ms batches: does the GPU clock lower while the fused kernels move data?
#   2. the trace build: per TP-2 shape, where the fused kernel waits.
set -uo pipefail
cd "$(dirname "$0")/../../.."
here=kernels/bench/fused
out=build/r13
. $here/builds_lib.sh
if [ "${1:-run}" = build ]; then
  fused_variants $out w2 "" def= trace=-DFUSEDCOMM_RS_TRACE || exit 1
  pack_builds $out; exit
fi
unpack_builds $out || exit 1
OUT=${OUT:-/tmp/r13_out}; o=$OUT/r13; mkdir -p "$o"
trap 'kernels/bench/pack_out.sh "$OUT" r13_logs.tar.xz r13/summary.txt' EXIT
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
s=$o/summary.txt
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv,noheader
  echo "commit $(cat $out/commit.txt)"; } | tee "$s"
for sh in "S=8192" "70b M=4096"; do
  ops=rs; [ "$sh" = "S=8192" ] && ops=ag,rs
  timeout 120 $out/def/fused_bench --world 2 --ops $ops --rs-partials bf16 --shape "$sh" --clocks \
    --batch-ms 100 --batches 5 --out "$o/clocks_rows.jsonl" >> "$o/clocks.log" 2>&1
  echo "clocks $sh rc=$?" | tee -a "$s"
done
grep -E "^clocks|W=2" "$o/clocks.log" | sed 's/(ours_fused,ours_decomposed,ours_gemm,ours_collective)//' | tee -a "$s"
timeout 150 $out/trace/fused_bench --world 2 --ops rs --rs-partials bf16 --batches 2 \
  --out "$o/trace_rows.jsonl" > "$o/trace.log" 2>&1; echo "trace rc=$?" | tee -a "$s"
grep '^rs_trace' "$o/trace.log" | sed 's/(per launch[^)]*)//' >> "$s"
grep -E 'ours_(fused|gemm) ' "$o/trace.log" >> "$s"
grep '^rs_trace' "$s" | grep -E 'S=8192|70b M=4096' | grep 'rank 0'
