#!/usr/bin/env bash
# Builds gemm_test and gemm_bench with nvcc alone (no CMake), the same flags as the CMake build:
#   kernels/bench/build_gemm.sh <out_dir> [extra nvcc flags...]
# Also writes <out_dir>/ptxas.txt (registers, spills) and, where cuobjdump exists, gemm.sass.
set -euo pipefail
out=${1:?out dir}; shift || true
root=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$out"
flags=(-std=c++20 -O3 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -lineinfo
       -Xcompiler -fPIC -I"$root/kernels/include" "$@")
# Two compiles at a time (the shared CPU machines have 2 cores).
nvcc "${flags[@]}" -Xptxas=-v,-warn-spills -c "$root/kernels/src/gemm.cu" -o "$out/gemm.o" \
  2> "$out/ptxas.txt" &
lib_pid=$!
nvcc "${flags[@]}" -c "$root/kernels/tests/gemm_test.cu" -o "$out/gemm_test.o"
nvcc "${flags[@]}" -c "$root/kernels/src/selftest.cu" -o "$out/selftest.o"
nvcc "${flags[@]}" -c "$root/kernels/bench/gemm_bench.cu" -o "$out/gemm_bench.o"
wait $lib_pid || { cat "$out/ptxas.txt"; exit 1; }
nvcc -gencode=arch=compute_90a,code=sm_90a -o "$out/gemm_test" "$out/gemm_test.o" "$out/gemm.o" \
  "$out/selftest.o"
nvcc -gencode=arch=compute_90a,code=sm_90a -o "$out/gemm_bench" "$out/gemm_bench.o" "$out/gemm.o"
nvcc -gencode=arch=compute_90a,code=sm_90a -shared -o "$out/libfc_gemm_bench.so" \
  "$out/gemm_bench.o" "$out/gemm.o"
grep -E "registers|spill" "$out/ptxas.txt" | grep -B1 -E "Used" | grep -v "^--" > "$out/ptxas_summary.txt" || true
if command -v cuobjdump > /dev/null; then cuobjdump --dump-sass "$out/gemm.o" > "$out/gemm.sass"; fi
