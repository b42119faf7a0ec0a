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
# (the reducers' half alone) and 2 (the producers' half); at W >= 3 a build whose producers go
# peer by peer (pm: FC_DIRECT_PEER_MAJOR=1, its gpu_collectives_test first); NCCL; the
# ratio table (variants_report.py); then the whole gpu_collectives_test (DAB_FULL=0: not).
set -uo pipefail
cd "$(dirname "$0")/../../.."
here=kernels/bench/collectives
if [ "${1:-run}" = build ]; then
  set -e
  $here/build.sh build/coll-bin > /dev/null
  COLL_OBJS=build/coll-bin COLL_NVCC_DEFS="-DFC_DIRECT_PEER_MAJOR=1" $here/build.sh build/coll-pm > /dev/null
  COLL_OBJS=build/coll-bin COLL_NVCC_DEFS="-DFC_DIRECT_DIAG=1" $here/build.sh build/coll-diag1 > /dev/null
  COLL_OBJS=build/coll-bin COLL_NVCC_DEFS="-DFC_DIRECT_DIAG=2" $here/build.sh build/coll-diag2 > /dev/null
  rm -rf build/dab && mkdir -p build/dab
  cp build/coll-bin/coll_bench build/dab/coll_bench_def
  cp build/coll-bin/gpu_collectives_test build/dab/
  cp build/coll-diag1/coll_bench build/dab/coll_bench_diag1
  cp build/coll-diag2/coll_bench build/dab/coll_bench_diag2
  cp build/coll-pm/coll_bench build/dab/coll_bench_pm
  cp build/coll-pm/gpu_collectives_test build/dab/gpu_collectives_test_pm
  strip --strip-unneeded build/dab/*
  git rev-parse --short HEAD > build/dab/commit.txt
  tar cJf build/dab.tar.xz -C build dab; du -sh build/dab.tar.xz; exit 0
fi
[ -d build/dab ] || tar xJf build/dab.tar.xz -C build || { echo "no build/dab.tar.xz"; exit 1; }
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/dab_out}; o=$OUT/logs; mkdir -p "$o"
b=build/dab; t0=$SECONDS
w=$(nvidia-smi -L | wc -l); [ "$w" -gt 4 ] && w=4
echo "commit $(cat $b/commit.txt), world $w"
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.sm,clocks.mem --format=csv > "$OUT/gpu.txt" 2>&1
FC_TEST_NEW_ALGOS=1 timeout 150 $b/gpu_collectives_test > "$OUT/test_new_algos.log" 2>&1; rc=$?
grep -E "^==|FAIL|gpu_collectives_test:" "$OUT/test_new_algos.log" | head -30
echo "gpu_collectives_test (new algos) rc=$rc [$((SECONDS - t0)) s]"
min=67108864; max=1073741824
bench() {  # label binary extra-args...
  local label=$1 bin=$2; shift 2
  timeout 100 "$bin" --world $w --min-bytes $min --max-bytes $max --label "$label" --ops ar \
    --inplace 1 --out "$o/ours_${label}_w$w.jsonl" "$@" >> "$o/bench.log" 2>&1 || echo "$label rc=$?"
  echo "$label done [$((SECONDS - t0)) s]"
}
bench ip $b/coll_bench_def --algos 0,2,3,5 --chunks-kib 0,128,256
for p in 64 96; do bench p$p $b/coll_bench_def --algos 5 --ctas $p --chunks-kib 64,128; done
for v in diag1 diag2; do bench $v $b/coll_bench_$v --algos 5 --chunks-kib 128; done
if [ "$w" -ge 3 ]; then  # peer-major producers: the same as the default order at W = 2
  FC_TEST_NEW_ALGOS=1 timeout 120 $b/gpu_collectives_test_pm > "$OUT/test_pm.log" 2>&1
  echo "gpu_collectives_test (peer-major build, new algos) rc=$? [$((SECONDS - t0)) s]"
  bench pm $b/coll_bench_pm --algos 5 --chunks-kib 0,128,256
  bench pm96 $b/coll_bench_pm --algos 5 --ctas 96 --chunks-kib 64,128
fi
timeout 120 torchrun --nproc-per-node $w $here/nccl_bench.py --ops ar --min-bytes $min \
  --max-bytes $max --out "$o/nccl_w$w.jsonl" >> "$o/nccl.log" 2>&1 || echo "nccl rc=$?"
echo "nccl done [$((SECONDS - t0)) s]"
python3 $here/variants_report.py "$o"/ours_*.jsonl "$o"/nccl_w$w.jsonl > "$OUT/table.txt"
# Shared-GPU protocol check of the worlds this host cannot give (every rank on GPU 0).
if [ "$w" -lt 4 ]; then
  FC_TEST_SHARED_GPU=4 FC_TEST_NEW_ALGOS=1 timeout 150 $b/gpu_collectives_test > "$OUT/test_shared_gpu.log" 2>&1
  echo "gpu_collectives_test (shared GPU, worlds 2-4, new algos) rc=$? [$((SECONDS - t0)) s]"
  grep -E "^==|gpu_collectives_test:" "$OUT/test_shared_gpu.log" | head -12
fi
# The whole suite on the GPUs last (in-place kAuto cases run every algorithm kAuto picks).
[ "${DAB_FULL:-1}" = 1 ] && { timeout 240 $b/gpu_collectives_test > "$OUT/test_full.log" 2>&1
  echo "gpu_collectives_test (full) rc=$? [$((SECONDS - t0)) s]"
  grep -E "^==|FAIL|gpu_collectives_test:" "$OUT/test_full.log" | head -20; }
tar cJf "$OUT/logs.tar.xz" -C "$OUT" logs && rm -rf "$o"
cat "$OUT/table.txt"
exit $rc
