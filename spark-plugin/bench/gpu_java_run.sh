#!/usr/bin/env bash
# Java and Spark on the GPU host, in device calls (no JDK, Maven or network there).
#
# Two bundles travel as ignored folders of the checkout (the device tool's `carry`):
#   .sparkbundle/pN   the stable part: a jlink'ed Java 17 runtime + Spark, JCuda and JUnit jars
#                     (make_spark_bundle.sh; ~95 MB as 20 MiB parts, one per call; carry_size.sh says what a call would carry)
#   .fcbundle         what changes: the plugin's classes and test classes and libfusedcomm.so
#                     (spark-plugin/bench/make_fc_bundle.sh)
#
#   gpu_java_run.sh stage N          copy part N into /root/stage (stays while the machine is warm)
#   gpu_java_run.sh run [worlds...]  unpack, then the GPU JUnit classes: CudaBackendTest and
#                                    JCudaNativesRaceTest, and
#                                    GpuClusterCollectivesTest once per world size (default: 2
#                                    and the GPU count; `run 1` on a one-GPU host: one
#                                    executor), GpuClusterHostsTest (all GPUs as two virtual
#                                    hosts; one GPU: two executors share it), then example 02
#                                    on the cuda backend (and across two virtual hosts)
#                                    at the same world sizes, a small problem (EXAMPLE_ARGS:
#                                    M H F dtype seed) and one kAuto runs fused
#                                    (EXAMPLE_FUSED_ARGS); logs under $OUT
#   gpu_java_run.sh classes C...     after a `run` on the same warm machine (or with the bundle
#                                    staged): only the JUnit classes named (e.g.
#                                    io.fusedcomm.gpu.GpuGemmTest), within 300 s, log
#                                    $OUT/java-classes.log; JAVA_PROPS: extra -D options (e.g.
#                                    -Dfusedcomm.test.gpuWorld=1)
set -uo pipefail
# No core files: an executor that aborts would otherwise dump a process that maps GPU memory.
ulimit -c 0
OUT=${OUT:-/tmp/java_out}; mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
repo=$(pwd)
case "${1:-}" in
  stage)
    mkdir -p /root/stage && cp .sparkbundle/p"$2"/bundle.part.* /root/stage/ && ls -la /root/stage || exit 1
    # Parts of earlier calls are gone when a call lands on a fresh machine (run 16: the device
    # reply's "warm": false). The parts are numbered files (bundle.part.00, .01, ...): name any
    # lower-numbered one missing here, to be staged again before the run.
    last=$(ls .sparkbundle/p"$2"/bundle.part.* | sed 's/.*\.//' | sort | tail -1)
    missing=""
    for ((k = 0; 10#$last > k; k++)); do
      f=$(printf 'bundle.part.%02d' "$k")
      [ -f "/root/stage/$f" ] || missing="$missing $f"
    done
    [ -z "$missing" ] || echo "stage: missing here (a fresh machine?):$missing; stage their parts again"
    exit 0 ;;
  run) mode=run; shift ;;
  classes)
    mode=classes; shift
    [ $# -ge 1 ] || { echo "usage: $0 classes <fully qualified JUnit class>..." >&2; exit 2; } ;;
  *) echo "usage: $0 stage N | run [worlds...] | classes C..." >&2; exit 2 ;;
esac
mkdir -p /root/stage; [ -d .sparkbundle ] && cp .sparkbundle/p*/bundle.part.* /root/stage/ 2>/dev/null
if [ ! -d /root/bundle ]; then
  (cd /root && cat stage/bundle.part.* | tar -xJf -) || { echo "bundle incomplete: $(ls /root/stage)"; exit 3; }
fi
source /root/bundle/env.sh
cp_fc="$repo/.fcbundle/classes:$repo/.fcbundle/test-classes:$repo/.fcbundle/native"
# The console launcher runs as the main class on the JVM's classpath (not `java -jar`): Spark's
# local-cluster executors inherit the driver JVM's java.class.path.
launcher=org.junit.platform.console.ConsoleLauncher
ngpu=$(nvidia-smi -L | wc -l)
nvidia-smi -L | tee "$OUT/gpus.txt"
worlds=("$@"); [ ${#worlds[@]} -gt 0 ] || worlds=(2 $ngpu)
flags=(--add-opens=java.base/java.lang=ALL-UNNAMED --add-opens=java.base/java.lang.invoke=ALL-UNNAMED
  --add-opens=java.base/java.lang.reflect=ALL-UNNAMED --add-opens=java.base/java.io=ALL-UNNAMED
  --add-opens=java.base/java.net=ALL-UNNAMED --add-opens=java.base/java.nio=ALL-UNNAMED
  --add-opens=java.base/java.util=ALL-UNNAMED --add-opens=java.base/java.util.concurrent=ALL-UNNAMED
  --add-opens=java.base/java.util.concurrent.atomic=ALL-UNNAMED --add-opens=java.base/jdk.internal.ref=ALL-UNNAMED
  --add-opens=java.base/sun.nio.ch=ALL-UNNAMED --add-opens=java.base/sun.nio.cs=ALL-UNNAMED
  --add-opens=java.base/sun.security.action=ALL-UNNAMED --add-opens=java.base/sun.util.calendar=ALL-UNNAMED
  -Djdk.reflect.useDirectMethodHandle=false -Dio.netty.tryReflectionSetAccessible=true)
rc=0
# Spark's local-cluster (spark.testing) gives each worker a temporary folder, /tmp/worker-*/APP/ID
# per executor, that is deleted when the driver JVM exits (run 15 found this: the logs the
# script looked for were gone). keep_start copies every executor's stdout, stderr and any JVM
# fatal-error log (hs_err_pid*.log, written to the executor's folder) into /tmp/fc-executors
# twice a second until keep_stop; executor_logs NAME then writes the last 150 lines of each log
# and the head of each fatal-error log to $OUT/executors-NAME.log: an executor that dies (run 14:
# exit code 134, a SIGABRT) says why only there.
keep_start() {
  rm -rf /tmp/fc-executors; mkdir -p /tmp/fc-executors
  (
    while :; do
      for d in /tmp/worker-*/*/*/; do
        [ -d "$d" ] || continue
        k=/tmp/fc-executors/$(basename "$(dirname "$d")")-$(basename "$d"); mkdir -p "$k"
        cp "$d"stdout "$d"stderr "$d"hs_err_pid*.log "$k"/ 2>/dev/null
      done
      sleep 0.5
    done
  ) &
  keeper=$!
}
keep_stop() { kill "$keeper" 2>/dev/null; wait "$keeper" 2>/dev/null; }
executor_logs() {
  keep_stop
  for e in /tmp/fc-executors/*/stderr /tmp/fc-executors/*/stdout; do
    [ -f "$e" ] && { echo "==== $e"; tail -150 "$e"; }
  done > "$OUT/executors-$1.log" 2>/dev/null
  for e in /tmp/fc-executors/*/hs_err_pid*.log; do
    [ -f "$e" ] && { echo "==== $e"; head -80 "$e"; }
  done >> "$OUT/executors-$1.log" 2>/dev/null
}
if [ "$mode" = classes ]; then
  select=(); for c in "$@"; do select+=(--select-class "$c"); done
  rm -rf /tmp/fusedcomm-spark-home* /tmp/worker-* /tmp/fusedcomm-gpu-claims
  keep_start
  # JAVA_PROPS is split into words on purpose: one -D option per word.
  # shellcheck disable=SC2086
  timeout 300 java "${flags[@]}" -Dfusedcomm.repo.root="$repo" ${JAVA_PROPS:-} \
    -cp "$cp_fc:$BUNDLE_CP" $launcher execute --disable-banner --details=tree "${select[@]}" \
    > "$OUT/java-classes.log" 2>&1 || rc=1
  executor_logs classes
  grep -E "✔|✘|↷|tests (successful|failed|skipped)|Exception" "$OUT/java-classes.log" | head -40
  exit $rc
fi
java "${flags[@]}" -cp "$cp_fc:$BUNDLE_CP" $launcher execute --disable-banner --details=tree \
  --select-class io.fusedcomm.gpu.CudaBackendTest --select-class io.fusedcomm.gpu.JCudaNativesRaceTest \
  > "$OUT/java-single-gpu.log" 2>&1 || rc=1
grep -E "✔|✘|↷|tests (successful|failed|skipped)|cuda runtime opened" "$OUT/java-single-gpu.log" | head -30
for w in "${worlds[@]}"; do
  [ "$w" -le "$ngpu" ] || continue
  rm -rf /tmp/fusedcomm-spark-home* /tmp/worker-* /tmp/fusedcomm-gpu-claims
  # As on a fresh host: the executors unpack JCuda's libraries themselves (run 15: they raced
  # there until JCudaNatives' lock), so every cluster run here checks that the race stays fixed.
  rm -f /tmp/libJCuda*.so
  keep_start
  timeout 300 java "${flags[@]}" -Dfusedcomm.repo.root="$repo" -Dfusedcomm.test.gpuWorld="$w" \
    -cp "$cp_fc:$BUNDLE_CP" $launcher execute --disable-banner --details=tree \
    --select-class io.fusedcomm.gpu.GpuClusterCollectivesTest > "$OUT/spark-gpu-w$w.log" 2>&1 || rc=1
  executor_logs "w$w"
  grep -h "fusedcomm runtime started" /tmp/fc-executors/*/stderr > "$OUT/executor-uuids-w$w.log" 2>/dev/null
  echo "== world $w: executors' logs"; cat "$OUT/executor-uuids-w$w.log"
  grep -E "^rank |overhead|stage 2|FAIL|✔|✘|↷|tests (successful|failed|skipped)|Exception" "$OUT/spark-gpu-w$w.log" | head -40
done
# Between hosts: every GPU of this host, split into two virtual hosts (proxy + socket path); on a
# one-GPU host two executors share it (correctness only).
if [ "$ngpu" -ge 1 ]; then
  rm -rf /tmp/fusedcomm-spark-home* /tmp/worker-* /tmp/fusedcomm-gpu-claims
  timeout 300 java "${flags[@]}" -Dfusedcomm.repo.root="$repo" -cp "$cp_fc:$BUNDLE_CP" $launcher execute \
    --disable-banner --details=tree --select-class io.fusedcomm.gpu.GpuClusterHostsTest \
    > "$OUT/spark-gpu-hosts.log" 2>&1 || rc=1
  echo "== two virtual hosts of $(( ngpu > 1 ? ngpu / 2 : 1 )) GPU(s)$([ "$ngpu" -eq 1 ] && echo ', both executors on the one GPU')"
  grep -E "^rank |FAIL|✔|✘|↷|tests (successful|failed|skipped)|Exception" "$OUT/spark-gpu-hosts.log" | head -20
fi
# Example 02 (TP MLP forward + backward, fused ops) on the cuda backend, one executor per GPU,
# the example's own main class and checks (as spark-submit would run it, with the conf as
# system properties). JCuda was unpacked into /tmp by the test above; executors load it there.
# The example's F at world w: F0 (default 2048) rounded up to a multiple of 8·w (on cuda every
# rank's share of F must be a multiple of 8: 2048 itself at w = 1, 2, 4, 8; 2064 at 3, 2080 at 5).
example_f() { local f0=${2:-2048}; echo $(( (f0 + 8 * $1 - 1) / (8 * $1) * 8 * $1 )); }
# Two problems per world. The small one (EXAMPLE_ARGS: M H F dtype seed; default M = 1000,
# H = 512) is one kAuto runs decomposed everywhere. The large one (EXAMPLE_FUSED_ARGS; default
# M = H = 4096, F = 1024) is one kAuto runs fused at W = 2 and 4 (kernels/src/fused.cu): each
# allGatherGemm gathers 32 MiB (choose_ag: from 16 MiB) and each gemmReduceScatter's partial
# product has 2^24 elements with M / W >= 1024 rows per owner (choose_rs). Its fp64 check on the
# driver takes ~45 core-seconds (2 cores: ~40 s; parallel over rows).
small_args() { echo "${EXAMPLE_ARGS:-1000 512 $(example_f "$1") bf16 11}"; }
fused_args() { echo "${EXAMPLE_FUSED_ARGS:-4096 4096 $(example_f "$1" 1024) bf16 12}"; }
# example02 WORLD LOG ARGS [extra -D settings...]   (ARGS: one word, "M H F dtype seed")
example02() {
  local w=$1 log=$2 args=$3; shift 3
  rm -rf /tmp/fusedcomm-gpu-claims; local home; home=$(mktemp -d)
  timeout 300 java "${flags[@]}" -cp "$repo/.fcbundle/examples:$cp_fc:$BUNDLE_CP" \
    -Dspark.master="local-cluster[$w,1,1024]" -Dspark.testing=1 -Dspark.test.home="$home" \
    -Dspark.executorEnv.SPARK_SCALA_VERSION=2.13 -Dspark.plugins=io.fusedcomm.FusedCommPlugin \
    -Dspark.fusedcomm.backend=cuda -Dspark.driver.host=127.0.0.1 -Dspark.driver.bindAddress=127.0.0.1 \
    -Dspark.ui.enabled=false -Dspark.worker.resource.gpu.amount=1 -Dspark.executor.resource.gpu.amount=1 \
    -Dspark.task.resource.gpu.amount=1 -Dspark.worker.resource.gpu.discoveryScript="$repo/conf/gpu-discovery.sh" \
    -Dspark.executor.resource.gpu.discoveryScript="$repo/conf/gpu-discovery.sh" \
    -Dspark.executor.extraLibraryPath=/tmp "$@" \
    io.fusedcomm.examples.TensorParallelMlpExample "$w" $args \
    > "$OUT/$log" 2>&1 || rc=1
  grep -vE "^\s+at |INFO|WARN" "$OUT/$log" | tail -22
}
if [ -d "$repo/.fcbundle/examples" ]; then
  for w in "${worlds[@]}"; do
    [ "$w" -le "$ngpu" ] || continue
    echo "== example 02 on cuda, world $w"
    example02 "$w" "example02-w$w.log" "$(small_args "$w")"
    echo "== example 02 on cuda, world $w, a problem kAuto runs fused"
    example02 "$w" "example02-fused-w$w.log" "$(fused_args "$w")"
  done
  # Between two virtual hosts: the fused ops' decomposed path across hosts. On one GPU both
  # executors share it (a discovery script that reports GPU 0 to each).
  if [ "$ngpu" -eq 1 ]; then
    printf '#!/bin/sh\necho '"'"'{"name":"gpu","addresses":["0"]}'"'"'\n' > /tmp/gpu0.sh; chmod +x /tmp/gpu0.sh
    echo "== example 02 on cuda, two virtual hosts, both executors on the one GPU"
    example02 2 example02-hosts.log "$(small_args 2)" -Dspark.fusedcomm.cuda.virtualHosts=2 -Dspark.fusedcomm.cuda.shareGpu=true \
      -Dspark.worker.resource.gpu.discoveryScript=/tmp/gpu0.sh -Dspark.executor.resource.gpu.discoveryScript=/tmp/gpu0.sh
  elif [ $((ngpu % 2)) -eq 0 ]; then
    echo "== example 02 on cuda, two virtual hosts of $((ngpu / 2)) GPU(s)"
    example02 "$ngpu" example02-hosts.log "$(small_args "$ngpu")" -Dspark.fusedcomm.cuda.virtualHosts=2
  fi
fi
echo "gpu_java_run rc=$rc"
# At most ~8 files come back from $OUT (two world sizes make 10): the rest go into one archive.
"$repo/kernels/bench/pack_out.sh" "$OUT" java_logs.tar.xz gpus.txt 'spark-gpu-w*.log' 'example02-*w*.log'
exit $rc
