#!/usr/bin/env bash
# gemmReduceScatter's forwarding CTAs (bench switch -DFUSEDCOMM_RS_FORWARD, detail/fused_gemm.cuh
# "Forwarding CTAs") against the default kernel, and the GEMM power probe, in one device call
# (~6 min on 4 x H200):
#   build (CPU machine): kernels/bench/fused/rs_fwd_probe.sh build   -> build/pace.tar.xz
#     (builds base, fwd8 and fwd16 with their gpu_fused_test; the power probe's library is
#     kernels/bench/build_gemm.sh's libfc_gemm_bench.so, copied into build/pwr by hand)
#   run   (GPU host):    kernels/bench/fused/rs_fwd_probe.sh run     -> $OUT
# Runs each forwarding build's gpu_fused_test at W = 1 to the GPU count (a build that fails is
# dropped from the A/B), then pace_ab.sh's A/B at W = 4 and at W = 2 (two rounds, bf16 partials,
# the shapes over 1 ms and square 8192), then gemm_power_probe.py on GPU 0 if build/pwr holds
# the library. $OUT: gpus.txt, tests.tar.xz (the tests' and benches' logs), w4/ and w2/
# (local.jsonl, local_report.md), gemm_power.jsonl.
set -uo pipefail
cd "$(dirname "$0")/../../.."
here=kernels/bench/fused
. $here/builds_lib.sh
if [ "${1:-run}" = build ]; then
  fused_variants build/pace pace "" base= fwd8=-DFUSEDCOMM_RS_FORWARD \
    fwd16=-DFUSEDCOMM_RS_FORWARD,-DFUSEDCOMM_RS_FWD_CTAS=16 || exit 1
  for b in fwd8 fwd16; do cp build/pace-$b/gpu_fused_test build/pace/$b/ || exit 1; done
  pack_builds build/pace; exit
fi
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/fwd_out}; mkdir -p "$OUT/logs"
nvidia-smi -L > "$OUT/gpus.txt"; cat "$OUT/gpus.txt"
gpus=$(nvidia-smi -L | wc -l)
rm -rf build/pace && tar xJf build/pace.tar.xz -C build || exit 1
keep=()
for b in $(cat build/pace/order.txt); do
  if [ -x "build/pace/$b/gpu_fused_test" ] &&
     ! fused_test "build/pace/$b/gpu_fused_test" "$OUT/logs/gpu_fused_test_$b.log" "$b"; then
    tail -25 "$OUT/logs/gpu_fused_test_$b.log"; continue
  fi
  keep+=("$b")
done
printf '%s\n' "${keep[@]}" > build/pace/order.txt
shapes="M=16384|M=8192|S=8192|S=16384"
for w in 4 2; do
  [ "$gpus" -ge $w ] || continue
  echo "== W = $w: ${keep[*]}"
  OUT=$OUT/w$w FC_PACE_PARTIALS=bf16 FC_BENCH_ARGS="--sustain-ms 500 --shape $shapes" \
    $here/pace_ab.sh run 2 $w
  mv "$OUT/w$w/pace/local.jsonl" "$OUT/w$w/pace/local_report.md" "$OUT/w$w/" &&
    mv "$OUT/w$w/pace/local.log" "$OUT/logs/local_w$w.log" && rmdir "$OUT/w$w/pace"
done
if [ -f build/pwr/libfc_gemm_bench.so ]; then
  echo "== GEMM power probe, GPU 0 (library of $(cat build/pwr/commit.txt 2>/dev/null))"
  CUDA_VISIBLE_DEVICES=0 timeout 180 python3 kernels/bench/gemm_power_probe.py \
    --lib build/pwr/libfc_gemm_bench.so --shapes kernels/bench/gemm_shapes_power.txt \
    --out "$OUT/gemm_power.jsonl"
fi
tar cJf "$OUT/tests.tar.xz" -C "$OUT" logs && rm -rf "$OUT/logs"
