#!/usr/bin/env bash
# The native GPU tests (the gpu tier: gemm_test and every gpu_*_test) on a GPU host, from any
# folder, each binary under its own timeout, logs in <out-dir>:
#   bench/gpu-tests/native.sh <out-dir> [--shared N] [test ...]      (default: every test)
# Without --shared each rank of the multi-process tests runs on its own GPU, and every test runs
# all its world sizes that the GPUs allow (1..GPUs; the tests choose). --shared N: up to N ranks
# share GPU 0 (FC_TEST_SHARED_GPU=N; correctness only, timings meaningless): how a one-GPU host
# checks the multi-rank protocols; N <= 4 keeps each test within a few minutes.
# FC_TEST_BIN: a folder holding prebuilt test binaries (searched below it); else they are built
# with CMake (FUSEDCOMM_JNI=OFF, no JDK needed) into FC_TEST_BUILD (default
# ${TMPDIR:-/tmp}/fusedcomm-test-build). Other FC_TEST_* variables (FC_TEST_SEED, FC_TEST_WORLDS,
# FC_TEST_HOSTS, FC_TEST_LOCAL, ...) pass through to the tests. Exit 0 when every test passed or
# skipped itself (exit 77).
set -uo pipefail
usage() { sed -n '2,5p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
[ $# -ge 1 ] || usage
case "$1" in -h|--help) usage ;; esac
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
mkdir -p "$1" || exit 2
out=$(cd "$1" && pwd)
shift
shared=0
if [ "${1:-}" = --shared ]; then
  shared=${2:?--shared takes the largest world}; shift 2
fi
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
[ "$shared" -ge 2 ] && export FC_TEST_SHARED_GPU=$shared

if [ -n "${FC_TEST_BIN:-}" ]; then
  bin=$FC_TEST_BIN
else
  bin=${FC_TEST_BUILD:-${TMPDIR:-/tmp}/fusedcomm-test-build}
  echo "== building the tests into $bin"
  { cmake -S "$root" -B "$bin" -DCMAKE_BUILD_TYPE=Release -DFUSEDCOMM_JNI=OFF &&
    cmake --build "$bin" -j"$(nproc)"; } > "$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }
fi
# Per test: its timeout in seconds (the multi-GPU suites run every world size; shared mode
# time-slices one GPU).
limit() {
  case "$1" in
    gpu_collectives_test | gpu_fused_test | gpu_*gemm*_test) echo 500 ;;
    gemm_test) echo 300 ;;
    *) echo 240 ;;
  esac
}
tests=("$@")
if [ ${#tests[@]} -eq 0 ]; then
  mapfile -t tests < <(find "$bin" -type f -perm -u+x \( -name 'gpu_*_test' -o -name gemm_test \) -printf '%f\n' | sort -u)
fi
[ ${#tests[@]} -gt 0 ] || { echo "no GPU test binaries under $bin" >&2; exit 1; }
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader 2>&1 | tee "$out/gpus.txt"
suffix=$([ "$shared" -ge 2 ] && echo "-shared$shared")
rc=0
summary=()
for t in "${tests[@]}"; do
  exe=$(find "$bin" -type f -perm -u+x -name "$t" | head -1)
  [ -n "$exe" ] || { summary+=("$t: not built"); rc=1; continue; }
  log=$out/$t$suffix.log
  t0=$SECONDS
  timeout "$(limit "$t")" "$exe" > "$log" 2>&1
  s=$?
  verdict=$([ $s = 0 ] && echo passed || { [ $s = 77 ] && echo skipped; } || echo "FAILED (exit $s)")
  [ $s = 0 ] || [ $s = 77 ] || rc=1
  summary+=("$t${FC_TEST_SHARED_GPU:+ (FC_TEST_SHARED_GPU=$FC_TEST_SHARED_GPU)}: $verdict in $((SECONDS - t0)) s")
  grep -E "FAIL|SKIP|mismatch|timed out|passed" "$log" | head -20
done
printf '%s\n' "${summary[@]}" | tee "$out/summary$suffix.txt"
exit $rc
