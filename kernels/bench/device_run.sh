#!/usr/bin/env bash
# One device call: (re)build if needed, correctness (gemm_test), SASS/ptxas facts, then ours vs
# cuBLAS on gemm_shapes.txt. Logs and results under $OUT. Usage (repo root, on the GPU host):
#   kernels/bench/device_run.sh [bin_dir=.devbin] [test|bench|all]
# FC_GEMM_SHAPES (default kernels/bench/gemm_shapes.txt) and FC_GEMM_ARGS (more
# run_gemm_bench.py arguments, e.g. "--sustain-ms 500 --cluster 2": run 14's sustained protocol,
# CTA pairs) for the bench.
set -uo pipefail
bin=${1:-.devbin}; what=${2:-all}
OUT=${OUT:-/tmp/gemm_out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
# Binaries built on the CPU machine are carried in $bin; rebuild here if they cannot run.
if ! [ -x "$bin/gemm_test" ] || ! ldd "$bin/gemm_test" > /dev/null 2>&1; then
  echo "rebuilding on the device"; kernels/bench/build_gemm.sh /tmp/gemm_build; bin=/tmp/gemm_build
fi
if command -v cuobjdump > /dev/null && [ -f "$bin/gemm.o" ]; then
  cuobjdump --dump-sass "$bin/gemm.o" > /tmp/gemm.sass
  echo "HGMMA instructions in gemm.o: $(grep -c HGMMA /tmp/gemm.sass)  local-memory ops (LDL/STL): $(grep -cE 'LDL|STL' /tmp/gemm.sass)" | tee "$OUT/sass.txt"
  grep -oE "HGMMA\.[0-9x]+\.F32\.BF16" /tmp/gemm.sass | sort | uniq -c | tee -a "$OUT/sass.txt"
  [ -f "$bin/ptxas_summary.txt" ] && sort "$bin/ptxas_summary.txt" | uniq -c | tee -a "$OUT/sass.txt"
fi
rc=0
if [ "$what" != bench ]; then
  timeout 150 "$bin/gemm_test" 2>&1 | tee "$OUT/gemm_test.log" | grep -vE "^\s*$" | tail -40
  rc=${PIPESTATUS[0]}; echo "gemm_test rc=$rc"
fi
if [ "$what" != test ] && [ $rc -ne 124 ]; then
  # shellcheck disable=SC2086  # FC_GEMM_ARGS: words on purpose
  timeout 300 python3 kernels/bench/run_gemm_bench.py --shapes "${FC_GEMM_SHAPES:-kernels/bench/gemm_shapes.txt}" \
    --lib "$bin/libfc_gemm_bench.so" --out-dir "$OUT" ${FC_GEMM_ARGS:-} > "$OUT/bench.log" 2>&1
  echo "bench rc=$?"
  [ -f "$OUT/sass.txt" ] && { printf '\n## Build facts\n\n```\n'; cat "$OUT/sass.txt"; printf '```\n'; } >> "$OUT/gemm_results.md"
  grep -vE "^[a-z_0-9]+ [0-9]+ [0-9]+ [0-9]+ (nk|kn):" "$OUT/bench.log"
fi
exit $rc
