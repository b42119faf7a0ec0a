#!/usr/bin/env bash
# Builds the fused-op benchmark and test binaries into $1 (default build/fused-bin) with nvcc
# alone (no CMake, no JDK), so they can be carried to the GPU host or rebuilt there:
#   kernels/bench/fused/build.sh [out_dir]
# Also writes out_dir/ptxas.txt (registers and spills of every kernel of gemm.cu and fused.cu).
# FC_NVCC_FLAGS: extra nvcc flags (e.g. -D switches for a debug build).
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=${1:-build/fused-bin}; mkdir -p "$out"
inc="-Ikernels/include -Iexecutor-native/include -Iexecutor-native/tests -Irdma/include"
flags="-O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -lineinfo -cudart static ${FC_NVCC_FLAGS:-}"
# Two compiles at a time (the shared CPU machines have 2 cores); any failure stops the build.
pids=()
bg() { "$@" & pids+=($!); }
wait_all() { local p; for p in "${pids[@]}"; do wait "$p"; done; pids=(); }
bg sh -c "nvcc $flags $inc -Xptxas=-v,-warn-spills -c kernels/src/fused.cu -o $out/fused.o 2> $out/ptxas_fused.txt || { cat $out/ptxas_fused.txt; exit 1; }"
bg sh -c "nvcc $flags $inc -Xptxas=-v,-warn-spills -c kernels/src/gemm.cu -o $out/gemm.o 2> $out/ptxas_gemm.txt || { cat $out/ptxas_gemm.txt; exit 1; }"
wait_all
bg nvcc $flags $inc -c kernels/src/collectives.cu -o "$out/collectives.o"
bg nvcc $flags $inc -c kernels/src/copy_segments.cu -o "$out/copy_segments.o"
wait_all
bg nvcc $flags $inc -c kernels/src/selftest.cu -o "$out/selftest.o"
bg nvcc $flags $inc -x cu -c executor-native/src/runtime/symmetric_memory.cc -o "$out/symmetric_memory.o"
wait_all
bg nvcc $flags $inc -x cu -c kernels/bench/fused/fused_bench.cc -o "$out/fused_bench.o"
bg nvcc $flags $inc -x cu -c executor-native/tests/gpu_fused_test.cc -o "$out/gpu_fused_test.o"
wait_all
libs=("$out/fused.o" "$out/gemm.o" "$out/collectives.o" "$out/copy_segments.o" "$out/selftest.o"
      "$out/symmetric_memory.o")
nvcc $flags "$out/fused_bench.o" "${libs[@]}" -o "$out/fused_bench"
nvcc $flags "$out/gpu_fused_test.o" "${libs[@]}" -o "$out/gpu_fused_test"
cat "$out/ptxas_gemm.txt" "$out/ptxas_fused.txt" > "$out/ptxas.txt"
spilled=$(grep -E 'bytes spill' "$out/ptxas.txt" | grep -vc ' 0 bytes spill stores, 0 bytes spill loads' || true)
echo "ptxas: $(grep -c 'Used [0-9]* registers' "$out/ptxas.txt") kernels, $(grep -o 'Used [0-9]* registers' "$out/ptxas.txt" | sort | uniq -c | tr '\n' ' '), functions with spills: $spilled"
echo "built $out/fused_bench $out/gpu_fused_test"
