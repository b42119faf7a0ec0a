#!/usr/bin/env bash
# A flaky GPU-host Java test, run until it fails: `gpu_java_run.sh classes CLASS` up to N times
# (bundle staged as for gpu_java_run.sh), stopping at the first failure, whose driver log and
# executors' logs are kept as $OUT/fail-driver.log and $OUT/fail-executors.log (the last pass's
# as $OUT/java-classes.log and $OUT/executors-classes.log). JAVA_PROPS as for gpu_java_run.sh; a
# fresh seed each run unless JAVA_PROPS names one. Prints one line per run, then the failing
# executor's last progress lines and any abort or fatal-error lines. Before each run JCuda's
# unpacked native libraries are removed from /tmp, so that every run is a host's first (run 15:
# executors racing to unpack them lost one executor on a fresh host; JCudaNatives' lock fixed it);
# FC_KEEP_JCUDA=1 keeps them.
#   spark-plugin/bench/gpu_java_repeat.sh N CLASS
set -uo pipefail
n=${1:?runs}; class=${2:?JUnit class}
OUT=${OUT:-/tmp/java_out}; export OUT
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
for i in $(seq 1 "$n"); do
  [ "${FC_KEEP_JCUDA:-0}" = 1 ] || rm -f /tmp/libJCuda*.so
  start=$(date +%s)
  "$here/gpu_java_run.sh" classes "$class" > /dev/null 2>&1
  took=$(( $(date +%s) - start ))
  seed=$(grep -h -o -m1 "seed [0-9]*" "$OUT/java-classes.log")
  if grep -q -E "\[ +0 tests failed" "$OUT/java-classes.log" &&
     grep -q -E "\[ +[1-9][0-9]* tests successful" "$OUT/java-classes.log"; then
    echo "run $i: passed ($seed, ${took}s)"
    continue
  fi
  echo "run $i: FAILED ($seed, ${took}s)"
  mv "$OUT/java-classes.log" "$OUT/fail-driver.log"
  mv "$OUT/executors-classes.log" "$OUT/fail-executors.log"
  grep -E "exited|Reason:" "$OUT/fail-driver.log" | head -3
  grep -h "starts:" "$OUT/fail-executors.log" | tail -4
  grep -h -i -E "terminate|abort|what\(\)|fatal|SIGSEGV|SIGABRT|Problematic|corrupt|double free|^# |^C  \[|^j  |Exception|timed out" \
    "$OUT/fail-executors.log" | grep -v "Spark Executor Command" | head -40
  exit 1
done
