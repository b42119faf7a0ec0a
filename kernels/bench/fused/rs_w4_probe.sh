#!/usr/bin/env bash
# Where the fused gemmReduceScatter's time over our GEMM alone goes at W = 4 (1.05-1.16 x at the
# shapes over 1 ms in run 18; fused/NOTES.md "Run 18"), in ONE device call of ~4 minutes on a
# 4-GPU host:
#   build (CPU machine): kernels/bench/fused/rs_w4_probe.sh build  -> build/rs4.tar.xz (carry it)
#   run   (GPU host):    kernels/bench/fused/rs_w4_probe.sh run    -> $OUT/rs4/*
# Builds in the archive: the push pacing's spread over 25 (the default), 12, 50 and 100 % of the
# next tile's estimated main loop (fused.cu rs_push_pace_ns; at W = 2 12-50 % tie 25 % and 100 %
# loses: results/run18_h200x2/), and trace (-DFUSEDCOMM_RS_TRACE: where the kernel waits).
# Run steps:
#   1. the four spreads, two rounds interleaved round by round (local_run.sh), bf16 partials,
#      sustained, at the W = 4 shapes over or near 1 ms and the target misses;
#   2. the trace build at the same shapes: waits for the peers' partials, handoffs and the end
#      barrier, summed per CTA (never run at W = 4 before).
# Shape filters hold no space: local_run.sh splits FC_BENCH_ARGS into words.
set -uo pipefail
cd "$(dirname "$0")/../../.."
here=kernels/bench/fused
out=build/rs4
shapes="M=16384|M=8192|S=8192|S=16384"
. $here/builds_lib.sh
if [ "${1:-run}" = build ]; then
  fused_variants $out rs4 "" sp25= sp12=-DFUSEDCOMM_RS_PUSH_SPREAD_PCT=12 \
    sp50=-DFUSEDCOMM_RS_PUSH_SPREAD_PCT=50 sp100=-DFUSEDCOMM_RS_PUSH_SPREAD_PCT=100 \
    trace=-DFUSEDCOMM_RS_TRACE || exit 1
  pack_builds $out; exit
fi
unpack_builds $out || exit 1
OUT=${OUT:-/tmp/rs4_out}; o=$OUT/rs4; mkdir -p "$o"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
w=$(nvidia-smi -L | wc -l); [ "$w" -gt 4 ] && w=4
s=$o/summary.txt
{ nvidia-smi --query-gpu=name,uuid,driver_version,power.limit --format=csv,noheader
  echo "commit $(cat $out/commit.txt), world $w"; } | tee "$s"
bins=$(grep -vx trace $out/order.txt | sed "s|^|$out/|" | tr '\n' ' ')
OUT=$o FC_DEADLINE_S=300 FC_BENCH_ARGS="--sustain-ms 500 --shape $shapes" \
  $here/local_run.sh "$bins" 2 rs bf16 full "$w" > "$o/local_report.md"
tee -a "$s" < "$o/local_report.md"  # local_report.py's table: fused / GEMM, each build / the first
timeout 150 $out/trace/fused_bench --world "$w" --ops rs --rs-partials bf16 --batches 2 \
  --shape "$shapes" --out "$o/trace_rows.jsonl" > "$o/trace.log" 2>&1
echo "trace rc=$?" | tee -a "$s"
grep '^rs_trace' "$o/trace.log" | sed 's/(per launch[^)]*)//' | tee -a "$s"
