#!/usr/bin/env bash
# One device call: (re)build if needed, correctness (gemm_test), SASS/ptxas facts, then ours vs
# cuBLAS on gemm_shapes.txt. Logs and results under $OUT. Usage (repo root, on the GPU host):
#   kernels/bench/device_run.sh [bin_dir=.devbin] [test|bench|all]
set -uo pipefail
bin=${1:-.devbin}; what=${2:-all}
OUT=${OUT:-/tmp/gemm_out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
if ! "$bin/gemm_test" --version > /dev/null 2>&1 && [ $? -ne 1 ]; then :; fi
if ! ldd "$bin/gemm_test" > /dev/null 2>&1 || ! [ -x "$bin/gemm_test" ]; then
  echo "rebuilding on the device"; kernels/bench/build_gemm.sh /tmp/gemm_build; bin=/tmp/gemm_build
fi
if command -v cuobjdump > /dev/null && [ -f "$bin/gemm.o" ]; then
  cuobjdump --dump-sass "$bin/gemm.o" > /tmp/gemm.sass
  echo "HGMMA instructions in gemm.o: $(grep -c HGMMA /tmp/gemm.sass)  local-memory ops (LDL/STL): $(grep -cE 'LDL|STL' /tmp/gemm.sass)" | tee "$OUT/sass.txt"
  grep -m3 HGMMA /tmp/gemm.sass | tee -a "$OUT/sass.txt"
fi
rc=0
if [ "$what" != bench ]; then
  timeout 300 "$bin/gemm_test" 2>&1 | tee "$OUT/gemm_test.log" | grep -vE "^\s*$" | tail -40
  rc=${PIPESTATUS[0]}; echo "gemm_test rc=$rc"
fi
if [ "$what" != test ]; then
  timeout 240 "$bin/gemm_bench" kernels/bench/gemm_shapes.txt 20 100 > "$OUT/ours.jsonl" 2> "$OUT/bench_err.txt"
  echo "gemm_bench rc=$?"; tail -3 "$OUT/bench_err.txt"
  timeout 240 python3 kernels/bench/run_gemm_bench.py --shapes kernels/bench/gemm_shapes.txt \
    --ours "$OUT/ours.jsonl" --out-dir "$OUT" > "$OUT/table.txt" 2>&1
  echo "compare rc=$?"; cat "$OUT/table.txt"
fi
exit $rc
