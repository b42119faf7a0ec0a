#!/usr/bin/env bash
# The chunk-pipelined collective variants (CommAlgo kTwoPhasePush = 3, kPipelined = 4) against
# two-phase (2) and NCCL, in ONE device call on a 4-GPU host (about 3-4 minutes):
#   build (CPU machine): variants_ar.sh build   -> build/coll-bin (build.sh) + build/coll-var/ldnc
#   run   (GPU host):    variants_ar.sh run     -> $OUT/var_ar/*, ratio table printed last
# Carry build/coll-bin and build/coll-var to the GPU host.
# Run steps (each with its own timeout, so one failure does not stop the rest):
#   1. gpu_collectives_test with FC_TEST_NEW_ALGOS=1 (new variants only, worlds 1-4)
#   2. coll_bench, default binary, W = 4 and 2: allReduce, allGather, reduceScatter at 64 MiB,
#      256 MiB, 1 GiB; algos 2, 3, 4 (4 = two-phase for allGather / reduceScatter: a repeat),
#      chunk 64 KiB (default, 60 KiB after rounding) and 128 KiB (120 KiB) for 3 and 4
#   3. the same binary, push with 32 producers (--ctas 32), W = 4, allReduce + allGather
#   4. binary ldnc (-DFC_PULL_LD=1: data-area pulls with ld.global.nc.L1::no_allocate.L2::256B),
#      W = 4, algos 2, 3, 4 (variant (c) of the brief)
#   5. NCCL (torch.distributed, NCCL_NVLS_ENABLE=0), same ops and sizes, W = 4 and 2
#   6. variants_report.py: busbw per (op, world, variant) and the ratio to NCCL
set -uo pipefail
cd "$(dirname "$0")/../../.."
mode=${1:-run}
here=kernels/bench/collectives
bin=build/coll-bin; var=build/coll-var
inc="-Ikernels/include -Iexecutor-native/include -Iexecutor-native/tests -Irdma/include"
flags="-O2 -std=c++17 -arch=sm_90a --expt-relaxed-constexpr -cudart static"
if [ "$mode" = build ]; then
  $here/build.sh "$bin" || exit 1
  d=$var/ldnc; mkdir -p "$d"
  nvcc $flags -DFC_PULL_LD=1 $inc -c kernels/src/collectives.cu -o "$d/collectives.o" -Xptxas=-warn-spills || exit 1
  nvcc $flags "$bin/coll_bench.o" "$d/collectives.o" "$bin/symmetric_memory.o" -o "$d/coll_bench" || exit 1
  rm -f "$d/collectives.o"; echo "-DFC_PULL_LD=1" > "$d/defs.txt"
  ls -la "$bin" "$d"; exit 0
fi
OUT=${OUT:-/tmp/coll_out}; o=$OUT/var_ar; mkdir -p "$o"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
ngpu=$(nvidia-smi -L | wc -l)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$o/gpu.txt" 2>&1
head -2 "$o/gpu.txt"
min=67108864; max=1073741824
t0=$SECONDS
# 1. correctness of the new variants
FC_TEST_NEW_ALGOS=1 timeout 150 "$bin/gpu_collectives_test" > "$o/test.log" 2>&1; trc=$?
grep -E "^==|FAIL|passed|gpu_collectives_test:" "$o/test.log" | head -40
echo "gpu_collectives_test (new variants) rc=$trc  [$((SECONDS - t0)) s]"
bench() {  # label binary world extra-args...
  local label=$1 b=$2 w=$3; shift 3
  [ "$w" -le "$ngpu" ] || return 0
  timeout 120 "$b" --world "$w" --min-bytes $min --max-bytes $max --label "$label" \
    --out "$o/ours_${label}_w$w.jsonl" "$@" >> "$o/bench.log" 2>&1 || echo "coll_bench $label w=$w rc=$?"
  echo "coll_bench $label w=$w done [$((SECONDS - t0)) s]"
}
# 2-4. ours
for w in 4 2; do bench base "$bin/coll_bench" $w --ops ar,ag,rs --algos 2,3,4 --chunks-kib 0,128; done
bench c32 "$bin/coll_bench" 4 --ops ar,ag --algos 3 --ctas 32
[ -x "$var/ldnc/coll_bench" ] && bench ldnc "$var/ldnc/coll_bench" 4 --ops ar,ag,rs --algos 2,3,4
# 5. NCCL
for w in 4 2; do
  [ $w -le $ngpu ] || continue
  timeout 120 torchrun --nproc-per-node $w $here/nccl_bench.py --ops ar,ag,rs --min-bytes $min \
    --max-bytes $max --out "$o/nccl_w$w.jsonl" >> "$o/nccl.log" 2>&1 || echo "nccl w=$w rc=$?"
  echo "nccl w=$w done [$((SECONDS - t0)) s]"
done
# 6. the table
python3 $here/variants_report.py "$o"/ours_*.jsonl "$o"/nccl_w*.jsonl | tee "$o/table.txt"
exit $trc
