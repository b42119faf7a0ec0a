#!/usr/bin/env bash
# The 4-GPU allReduce made only of NVLink stores (collectives.cu, FC_PUSH_AR_STORES; NOTES.md
# "NVLink ceilings per pattern") against two-phase, the default push variant and NCCL, in ONE
# device call on a 4-GPU host (~4 minutes):
#   build (CPU machine): ar_stores.sh build  -> build/arst.tar.xz (carry it)
#   run   (GPU host):    ar_stores.sh run    -> $OUT: probe.txt, test.log, table.txt, logs.tar.xz
# Steps, each under its own timeout:
#   1. probes/ar_store_probe.cu: pull / direct / ring schedules, one process, every GPU
#   2. gpu_collectives_test of the stores build with FC_TEST_NEW_ALGOS=1 (push and pipelined
#      variants only, worlds 1..GPUs): the store-only allReduce's correctness
#   3. coll_bench allReduce at W = 4, 64 MiB-1 GiB: default build algos 2 (two-phase) and 3
#      (push, pulling its reduce-scatter); stores build algo 3 with its default 48 producers
#      (+24 consumers) and with 64 and 96
#   4. NCCL allReduce at W = 4, same sizes; variants_report.py: busbw and the ratio to NCCL
set -uo pipefail
cd "$(dirname "$0")/../../.."
here=kernels/bench/collectives
if [ "${1:-run}" = build ]; then
  set -e
  $here/build.sh build/coll-bin > /dev/null
  COLL_NVCC_DEFS=-DFC_PUSH_AR_STORES=1 $here/build.sh build/coll-arst > /dev/null
  rm -rf build/arst && mkdir -p build/arst/def build/arst/st
  cp build/coll-bin/coll_bench build/arst/def/
  cp build/coll-arst/coll_bench build/coll-arst/gpu_collectives_test build/arst/st/
  nvcc -O3 -std=c++17 -arch=sm_90a -o build/arst/ar_store_probe kernels/bench/probes/ar_store_probe.cu
  strip --strip-unneeded build/arst/*/* build/arst/ar_store_probe
  git rev-parse --short HEAD > build/arst/commit.txt
  tar cJf build/arst.tar.xz -C build arst; du -sh build/arst.tar.xz; exit 0
fi
[ -d build/arst ] || tar xJf build/arst.tar.xz -C build || { echo "no build/arst.tar.xz"; exit 1; }
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/arst_out}; o=$OUT/logs; mkdir -p "$o"
b=build/arst; t0=$SECONDS
echo "commit $(cat $b/commit.txt), $(nvidia-smi -L | wc -l) GPUs"
timeout 110 $b/ar_store_probe > "$OUT/probe.txt" 2>&1; echo "probe rc=$? [$((SECONDS - t0)) s]"
tail -5 "$OUT/probe.txt"
FC_TEST_NEW_ALGOS=1 timeout 150 $b/st/gpu_collectives_test > "$OUT/test.log" 2>&1; trc=$?
grep -E "^== world|FAIL|gpu_collectives_test:" "$OUT/test.log" | head -20
echo "gpu_collectives_test (stores build, new algos) rc=$trc [$((SECONDS - t0)) s]"
min=67108864; max=1073741824
bench() {  # label binary extra-args...
  local label=$1 bin=$2; shift 2
  timeout 100 "$bin" --world 4 --min-bytes $min --max-bytes $max --label "$label" --ops ar \
    --out "$o/ours_${label}_w4.jsonl" "$@" >> "$o/bench.log" 2>&1 || echo "coll_bench $label rc=$?"
  echo "coll_bench $label done [$((SECONDS - t0)) s]"
}
bench base $b/def/coll_bench --algos 2,3
bench stores $b/st/coll_bench --algos 3
bench stores64 $b/st/coll_bench --algos 3 --ctas 64
bench stores96 $b/st/coll_bench --algos 3 --ctas 96
timeout 120 torchrun --nproc-per-node 4 $here/nccl_bench.py --ops ar --min-bytes $min \
  --max-bytes $max --out "$o/nccl_w4.jsonl" >> "$o/nccl.log" 2>&1 || echo "nccl rc=$?"
echo "nccl done [$((SECONDS - t0)) s]"
python3 $here/variants_report.py "$o"/ours_*.jsonl "$o"/nccl_w4.jsonl | tee "$OUT/table.txt"
tar cJf "$OUT/logs.tar.xz" -C "$OUT" logs && rm -rf "$o"
exit $trc
