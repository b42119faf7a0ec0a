#!/usr/bin/env bash
# Builds the collectives benchmark and test binaries into $1 (default build/coll-bin) with nvcc
# alone (no JDK needed), so they can be carried to the GPU host. Usage: build.sh [dir]
# Env (tuning experiments only): COLL_NVCC_DEFS extra -D flags for collectives.cu (see the FC_*
# macros there); COLL_OBJS a directory whose symmetric_memory.o / coll_bench.o /
# gpu_collectives_test.o are reused instead of recompiled.
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=${1:-build/coll-bin}; mkdir -p "$out"
inc="-Ikernels/include -Iexecutor-native/include -Iexecutor-native/tests -Irdma/include"
flags="-O2 -std=c++17 -arch=sm_90a --expt-relaxed-constexpr -cudart static"
defs=${COLL_NVCC_DEFS:-}
# collectives.o is reused only when nothing it is built from (the .cu, every kernels header) is newer.
[ -z "$defs" ] && [ -f "$out/collectives.o" ] &&
  [ -z "$(find kernels/src/collectives.cu kernels/include -newer "$out/collectives.o" -print -quit)" ] ||
  nvcc $flags $defs $inc -c kernels/src/collectives.cu -o "$out/collectives.o" -Xptxas=-warn-spills
if [ -n "${COLL_OBJS:-}" ]; then
  cp "$COLL_OBJS/symmetric_memory.o" "$COLL_OBJS/coll_bench.o" "$COLL_OBJS/gpu_collectives_test.o" "$out/"
else
  nvcc $flags $inc -x cu -c executor-native/src/runtime/symmetric_memory.cc -o "$out/symmetric_memory.o"
  nvcc $flags $inc -x cu -c kernels/bench/collectives/coll_bench.cc -o "$out/coll_bench.o"
  nvcc $flags $inc -x cu -c executor-native/tests/gpu_collectives_test.cc -o "$out/gpu_collectives_test.o"
fi
nvcc $flags $inc -c kernels/src/selftest.cu -o "$out/selftest.o"
nvcc $flags "$out/coll_bench.o" "$out/collectives.o" "$out/symmetric_memory.o" -o "$out/coll_bench"
nvcc $flags "$out/gpu_collectives_test.o" "$out/collectives.o" "$out/symmetric_memory.o" "$out/selftest.o" \
  -o "$out/gpu_collectives_test"
echo "built $out/coll_bench $out/gpu_collectives_test"
