#!/usr/bin/env bash
# The direct allReduce (CommAlgo::kDirect: in place, only NVLink stores) against two-phase and
# push in place and NCCL's (in-place) allReduce, in ONE device call, at W = the host's GPU
# count (at most 4), 64 MiB - 1 GiB:
#   build (CPU machine): direct_ab.sh build -> build/dab.tar.xz (carry it)
#   run   (GPU host):    direct_ab.sh run   -> $OUT: table.txt, test logs, logs.tar.xz
# Steps (each with its own timeout): gpu_collectives_test FC_TEST_NEW_ALGOS=1 on the GPUs, then
# the same with every rank on GPU 0 at worlds 2-4 (FC_TEST_SHARED_GPU=4; hosts with < 4 GPUs); coll_bench --inplace 1
# with algos 0 (auto), 2, 3, 5, chunks 64 / 128 / 256 KiB for 3 and 5 (direct: 128 + 128 CTAs);
# direct with 64 / 96 producers (--ctas; chunks 64 / 128 KiB); the diagnostics FC_DIRECT_DIAG=1
# (the reducers' half alone) and 2 (the producers' half); at W >= 3 the NVLink probe
# (all-push against all-push-seq); NCCL; the ratio table (variants_report.py); then the whole
# gpu_collectives_test (DAB_FULL=0: not). Run 12's call at da25a02 also had a peer-major build
# (FC_DIRECT_PEER_MAJOR, removed after it measured slower; kernels/bench/NOTES.md).
set -uo pipefail
cd "$(dirname "$0")/../../.."
. kernels/bench/collectives/ab_lib.sh
if [ "${1:-run}" = build ]; then
  ab_build build/dab "diag1 -DFC_DIRECT_DIAG=1" "diag2 -DFC_DIRECT_DIAG=2" || exit 1
  rm -f build/dab/gpu_collectives_test_diag*  # benches only
  nvcc -O3 -std=c++17 -arch=sm_90a -o build/dab/nvlink_probe kernels/bench/probes/nvlink_probe.cu || exit 1
  tar cJf build/dab.tar.xz -C build dab; du -sh build/dab.tar.xz; exit 0
fi
[ -d build/dab ] || tar xJf build/dab.tar.xz -C build || { echo "no build/dab.tar.xz"; exit 1; }
ab_setup build/dab
FC_TEST_NEW_ALGOS=1 timeout 150 $b/gpu_collectives_test_def > "$OUT/test_new_algos.log" 2>&1; rc=$?
grep -E "^==|FAIL|gpu_collectives_test:" "$OUT/test_new_algos.log" | head -30
echo "gpu_collectives_test (new algos) rc=$rc [$((SECONDS - t0)) s]"
range="--ops ar --inplace 1 --min-bytes 67108864 --max-bytes 1073741824"
ab_bench ip $b/coll_bench_def $range --algos 0,2,3,5 --chunks-kib 0,128,256
for p in 64 96; do ab_bench p$p $b/coll_bench_def $range --algos 5 --ctas $p --chunks-kib 64,128; done
for v in diag1 diag2; do ab_bench $v $b/coll_bench_$v $range --algos 5 --chunks-kib 128; done
if [ "$w" -ge 3 ]; then  # all-push vs all-push-seq: one peer at a time (no difference at W = 2)
  timeout 60 $b/nvlink_probe --gpus $w > "$OUT/nvlink_probe.txt" 2>&1
  grep -A20 "best per pattern" "$OUT/nvlink_probe.txt"
fi
ab_nccl ar 67108864 1073741824
python3 $ab_here/variants_report.py "$o"/ours_*.jsonl "$o"/nccl_w$w.jsonl > "$OUT/table.txt"
# Shared-GPU protocol check of the worlds this host cannot give (every rank on GPU 0).
if [ "$w" -lt 4 ]; then
  FC_TEST_SHARED_GPU=4 FC_TEST_NEW_ALGOS=1 timeout 150 $b/gpu_collectives_test_def > "$OUT/test_shared_gpu.log" 2>&1
  echo "gpu_collectives_test (shared GPU, worlds 2-4, new algos) rc=$? [$((SECONDS - t0)) s]"
  grep -E "^==|gpu_collectives_test:" "$OUT/test_shared_gpu.log" | head -12
fi
# The whole suite on the GPUs last (in-place kAuto cases run every algorithm kAuto picks).
[ "${DAB_FULL:-1}" = 1 ] && { timeout 240 $b/gpu_collectives_test_def > "$OUT/test_full.log" 2>&1
  echo "gpu_collectives_test (full) rc=$? [$((SECONDS - t0)) s]"
  grep -E "^==|FAIL|gpu_collectives_test:" "$OUT/test_full.log" | head -20; }
tar cJf "$OUT/logs.tar.xz" -C "$OUT" logs && rm -rf "$o"
cat "$OUT/table.txt"
exit $rc
