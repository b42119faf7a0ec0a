#!/usr/bin/env bash
# Where does the direct allReduce lose to the one-process probe's direct schedule
# (bench/probes/ar_store_probe.cu)? One device call at W = the host's GPU count (at most 4),
# 64 MiB - 1 GiB, in place:
#   build (CPU machine): direct_tune.sh build -> build/dtune (carry it)
#   run   (GPU host):    direct_tune.sh run   -> $OUT: table.txt, probe.txt, logs.tar.xz
# Runs: ar_store_probe (calibration); the default build over chunks 32-256 KiB and 64 / 96 / 128
# producers (as many reducers); builds with 16 vectors in flight per copy thread (u16) and 16
# loads per reduction thread (rl16); the diagnostics FC_DIRECT_DIAG=1 (producers move no
# data: the reducers' half alone) and 2 (reducers store only locally: the producers' half);
# NCCL; the ratio table (variants_report.py).
set -uo pipefail
cd "$(dirname "$0")/../../.."
. kernels/bench/collectives/ab_lib.sh
if [ "${1:-run}" = build ]; then
  ab_build build/dtune "u16 -DFC_PIPE_COPY_UNROLL=16" "rl16 -DFC_PIPE_RED_LOADS=16" \
    "diag1 -DFC_DIRECT_DIAG=1" "diag2 -DFC_DIRECT_DIAG=2" || exit 1
  nvcc -O3 -std=c++17 -arch=sm_90a -o build/dtune/ar_store_probe kernels/bench/probes/ar_store_probe.cu
  exit 0
fi
ab_setup build/dtune
timeout 110 $b/ar_store_probe --gpus $w > "$OUT/probe.txt" 2>&1; echo "probe rc=$? [$((SECONDS - t0)) s]"
range="--ops ar --inplace 1 --algos 5 --min-bytes 67108864 --max-bytes 1073741824"
for p in 64 96 128; do ab_bench def$p $b/coll_bench_def $range --ctas $p --chunks-kib 32,64,128,256; done
for v in u16 rl16; do for p in 64 96; do ab_bench $v$p $b/coll_bench_$v $range --ctas $p --chunks-kib 64,128; done; done
for v in diag1 diag2; do ab_bench $v $b/coll_bench_$v $range --ctas 64 --chunks-kib 128; done
ab_nccl ar 67108864 1073741824
python3 $ab_here/variants_report.py "$o"/ours_*.jsonl "$o"/nccl_w$w.jsonl > "$OUT/table.txt"
tar cJf "$OUT/logs.tar.xz" -C "$OUT" logs && rm -rf "$o"
tail -4 "$OUT/probe.txt"; cat "$OUT/table.txt"
