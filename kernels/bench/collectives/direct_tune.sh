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
here=kernels/bench/collectives
if [ "${1:-run}" = build ]; then
  set -e
  $here/build.sh build/coll-bin > /dev/null
  rm -rf build/dtune && mkdir -p build/dtune
  cp build/coll-bin/coll_bench build/dtune/coll_bench_def
  for v in "u16 -DFC_PIPE_COPY_UNROLL=16" "rl16 -DFC_PIPE_RED_LOADS=16" "diag1 -DFC_DIRECT_DIAG=1" "diag2 -DFC_DIRECT_DIAG=2"; do
    set -- $v
    COLL_OBJS=build/coll-bin COLL_NVCC_DEFS="$2" $here/build.sh build/coll-$1 > /dev/null
    cp build/coll-$1/coll_bench build/dtune/coll_bench_$1
  done
  nvcc -O3 -std=c++17 -arch=sm_90a -o build/dtune/ar_store_probe kernels/bench/probes/ar_store_probe.cu
  strip --strip-unneeded build/dtune/*
  git rev-parse --short HEAD > build/dtune/commit.txt
  du -sh build/dtune; exit 0
fi
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/dtune_out}; o=$OUT/logs; mkdir -p "$o"
b=build/dtune; t0=$SECONDS
w=$(nvidia-smi -L | wc -l); [ "$w" -gt 4 ] && w=4
echo "commit $(cat $b/commit.txt), world $w"
nvidia-smi --query-gpu=name,uuid,driver_version --format=csv > "$OUT/gpu.txt" 2>&1
timeout 110 $b/ar_store_probe --gpus $w > "$OUT/probe.txt" 2>&1; echo "probe rc=$? [$((SECONDS - t0)) s]"
min=67108864; max=1073741824
bench() {  # label binary extra-args...
  local label=$1 bin=$2; shift 2
  timeout 100 "$bin" --world $w --min-bytes $min --max-bytes $max --label "$label" --ops ar \
    --inplace 1 --algos 5 --out "$o/ours_${label}_w$w.jsonl" "$@" >> "$o/bench.log" 2>&1 || echo "$label rc=$?"
}
for p in 64 96 128; do bench def$p $b/coll_bench_def --ctas $p --chunks-kib 32,64,128,256; done
echo "default sweep done [$((SECONDS - t0)) s]"
for v in u16 rl16; do for p in 64 96; do bench $v$p $b/coll_bench_$v --ctas $p --chunks-kib 64,128; done; done
for v in diag1 diag2; do bench $v $b/coll_bench_$v --ctas 64 --chunks-kib 128; done
echo "variants done [$((SECONDS - t0)) s]"
timeout 120 torchrun --nproc-per-node $w $here/nccl_bench.py --ops ar --min-bytes $min \
  --max-bytes $max --out "$o/nccl_w$w.jsonl" >> "$o/nccl.log" 2>&1 || echo "nccl rc=$?"
python3 $here/variants_report.py "$o"/ours_*.jsonl "$o"/nccl_w$w.jsonl > "$OUT/table.txt"
tar cJf "$OUT/logs.tar.xz" -C "$OUT" logs && rm -rf "$o"
tail -4 "$OUT/probe.txt"; cat "$OUT/table.txt"
