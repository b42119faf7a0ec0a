#!/usr/bin/env bash
# The Java and Spark GPU suite (the gpu-spark tier) on a GPU host that has no JDK, Maven or
# network, from any folder; logs in <out-dir>:
#   bench/gpu-tests/java.sh <out-dir> stage N          copy bundle part N into the stage
#   bench/gpu-tests/java.sh <out-dir> run [worlds...]   the whole suite
#   bench/gpu-tests/java.sh <out-dir> classes C...      only the JUnit classes named
#   bench/gpu-tests/java.sh <out-dir> example CLASS W [ARGS...]   one example's main class on
#                     the cuda backend at world W (io.fusedcomm.examples.CLASS; ranks share GPU 0
#                     where W exceeds the GPUs)
#
# Two bundles travel inside the checkout as ignored folders, made on a machine with the JDK:
#   .sparkbundle/pN   the stable part: a jlink'ed Java 17 runtime with Spark, JCuda and JUnit
#                     (make_spark_bundle.sh), one tar.xz in parts of ~20 MiB, so that each part
#                     fits a transfer; `stage N` collects them on the host one at a time
#   .fcbundle         what changes with the code: the plugin's classes and test classes, the
#                     examples and libfusedcomm.so (make_fc_bundle.sh)
# `run`: CudaBackendTest, JCudaNativesRaceTest and GpuAttentionTest on one GPU;
# GpuClusterCollectivesTest at each world size (default: 2 and the GPU count; `run 1` on a one-GPU
# host); GpuClusterHostsTest (the GPUs as two virtual hosts; on one GPU two executors share it);
# then example 02 (tensor-parallel MLP, fused ops) on the cuda backend at the same world sizes, a
# small problem (EXAMPLE_ARGS: "M H F dtype seed") and one kAuto runs fused
# (EXAMPLE_FUSED_ARGS), and across two virtual hosts.
# `classes`: within 300 s, log java-classes.log; JAVA_PROPS: extra -D options (e.g.
# -Dfusedcomm.test.gpuWorld=1). The stage and the unpacked bundle live under FC_JAVA_HOME
# (default ${TMPDIR:-/tmp}/fusedcomm-java) and stay while the machine does.
set -uo pipefail
usage() { sed -n '4,6p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
[ $# -ge 2 ] || usage
# No core files: an executor that aborts would otherwise dump a process that maps GPU memory.
ulimit -c 0
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
mkdir -p "$1" || exit 2
out=$(cd "$1" && pwd)
shift
home=${FC_JAVA_HOME:-${TMPDIR:-/tmp}/fusedcomm-java}
stage=$home/stage
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
case "$1" in
  stage)
    mkdir -p "$stage" && cp "$repo/.sparkbundle/p$2"/bundle.part.* "$stage/" && ls -la "$stage" || exit 1
    # The parts are numbered (bundle.part.00, .01, ...): name any lower one missing here (a fresh
    # machine has none of the parts staged before), to be staged again before the run.
    last=$(ls "$repo/.sparkbundle/p$2"/bundle.part.* | sed 's/.*\.//' | sort | tail -1)
    missing=""
    for ((k = 0; 10#$last > k; k++)); do
      f=$(printf 'bundle.part.%02d' "$k")
      [ -f "$stage/$f" ] || missing="$missing $f"
    done
    [ -z "$missing" ] || echo "stage: missing here:$missing; stage their parts again"
    exit 0 ;;
  run) mode=run; shift ;;
  classes)
    mode=classes; shift
    [ $# -ge 1 ] || usage ;;
  example)
    mode=example; shift
    [ $# -ge 2 ] || usage ;;
  *) usage ;;
esac
mkdir -p "$stage"
[ -d "$repo/.sparkbundle" ] && cp "$repo"/.sparkbundle/p*/bundle.part.* "$stage/" 2>/dev/null
if [ ! -d "$home/bundle" ]; then
  (cd "$home" && cat stage/bundle.part.* | tar -xJf -) ||
    { rm -rf "$home/bundle"; echo "bundle incomplete: $(ls "$stage")"; exit 3; }
fi
# shellcheck disable=SC1091  # made by make_spark_bundle.sh
source "$home/bundle/env.sh"
[ -d "$repo/.fcbundle/classes" ] || { echo "no .fcbundle (make_fc_bundle.sh)"; exit 3; }
cp_fc="$repo/.fcbundle/classes:$repo/.fcbundle/test-classes:$repo/.fcbundle/native"
# The console launcher runs as the main class on the JVM's classpath (not `java -jar`): Spark's
# local-cluster executors inherit the driver JVM's java.class.path.
launcher=org.junit.platform.console.ConsoleLauncher
ngpu=$(nvidia-smi -L | grep -c '^GPU' || true)
nvidia-smi -L | tee "$out/gpus.txt"
worlds=("$@"); [ ${#worlds[@]} -gt 0 ] || worlds=(2 "$ngpu")
flags=(--add-opens=java.base/java.lang=ALL-UNNAMED --add-opens=java.base/java.lang.invoke=ALL-UNNAMED
  --add-opens=java.base/java.lang.reflect=ALL-UNNAMED --add-opens=java.base/java.io=ALL-UNNAMED
  --add-opens=java.base/java.net=ALL-UNNAMED --add-opens=java.base/java.nio=ALL-UNNAMED
  --add-opens=java.base/java.util=ALL-UNNAMED --add-opens=java.base/java.util.concurrent=ALL-UNNAMED
  --add-opens=java.base/java.util.concurrent.atomic=ALL-UNNAMED --add-opens=java.base/jdk.internal.ref=ALL-UNNAMED
  --add-opens=java.base/sun.nio.ch=ALL-UNNAMED --add-opens=java.base/sun.nio.cs=ALL-UNNAMED
  --add-opens=java.base/sun.security.action=ALL-UNNAMED --add-opens=java.base/sun.util.calendar=ALL-UNNAMED
  -Djdk.reflect.useDirectMethodHandle=false -Dio.netty.tryReflectionSetAccessible=true)
rc=0
# Spark's local-cluster (spark.testing) gives each executor a temporary folder,
# /tmp/worker-*/APP/ID, deleted when the driver JVM exits. keep_start copies every executor's
# stdout, stderr and JVM fatal-error log (hs_err_pid*.log) into $home/executors twice a second
# until keep_stop; executor_logs NAME then writes the last 150 lines of each log and the head of
# each fatal-error log to executors-NAME.log: an executor that dies says why only there.
keep_start() {
  rm -rf "$home/executors"; mkdir -p "$home/executors"
  (
    while :; do
      for d in /tmp/worker-*/*/*/; do
        [ -d "$d" ] || continue
        k=$home/executors/$(basename "$(dirname "$d")")-$(basename "$d"); mkdir -p "$k"
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
  for e in "$home"/executors/*/stderr "$home"/executors/*/stdout; do
    [ -f "$e" ] && { echo "==== $e"; tail -150 "$e"; }
  done > "$out/executors-$1.log" 2>/dev/null
  for e in "$home"/executors/*/hs_err_pid*.log; do
    [ -f "$e" ] && { echo "==== $e"; head -80 "$e"; }
  done >> "$out/executors-$1.log" 2>/dev/null
}
fresh() { rm -rf /tmp/fusedcomm-spark-home* /tmp/worker-* /tmp/fusedcomm-gpu-claims; }
# example_main CLASS WORLD LOG ARGS [extra -D settings...]: an example's main class
# (io.fusedcomm.examples.CLASS) on the cuda backend, one executor per GPU, with the example's own
# checks (as spark-submit would run it, the conf as system properties; ARGS: one word, split on
# purpose). JCuda is unpacked into /tmp by the executors (JCudaNatives' lock keeps them apart).
example_main() {
  local cls=$1 w=$2 log=$3 args=$4; shift 4
  rm -rf /tmp/fusedcomm-gpu-claims; local spark_home; spark_home=$(mktemp -d)
  # shellcheck disable=SC2086  # $args: words on purpose
  timeout 300 java "${flags[@]}" -cp "$repo/.fcbundle/examples:$cp_fc:$BUNDLE_CP" \
    -Dspark.master="local-cluster[$w,1,1024]" -Dspark.testing=1 -Dspark.test.home="$spark_home" \
    -Dspark.executorEnv.SPARK_SCALA_VERSION=2.13 -Dspark.plugins=io.fusedcomm.FusedCommPlugin \
    -Dspark.fusedcomm.backend=cuda -Dspark.driver.host=127.0.0.1 -Dspark.driver.bindAddress=127.0.0.1 \
    -Dspark.ui.enabled=false -Dspark.worker.resource.gpu.amount=1 -Dspark.executor.resource.gpu.amount=1 \
    -Dspark.task.resource.gpu.amount=1 -Dspark.worker.resource.gpu.discoveryScript="$repo/conf/gpu-discovery.sh" \
    -Dspark.executor.resource.gpu.discoveryScript="$repo/conf/gpu-discovery.sh" \
    -Dspark.executor.extraLibraryPath=/tmp "$@" \
    "io.fusedcomm.examples.$cls" "$w" $args \
    > "$out/$log" 2>&1 || rc=1
  grep -vE "^\s+at |INFO|WARN" "$out/$log" | tail -22
}
# Every executor on GPU 0 (a discovery script that reports it to each), for more ranks than GPUs.
gpu0_settings() {
  printf '#!/bin/sh\necho '"'"'{"name":"gpu","addresses":["0"]}'"'"'\n' > "$home/gpu0.sh"; chmod +x "$home/gpu0.sh"
  echo -Dspark.fusedcomm.cuda.shareGpu=true -Dspark.worker.resource.gpu.discoveryScript="$home/gpu0.sh" \
    -Dspark.executor.resource.gpu.discoveryScript="$home/gpu0.sh"
}
if [ "$mode" = example ]; then
  cls=$1 w=$2; shift 2
  fresh
  keep_start
  # shellcheck disable=SC2046  # gpu0_settings: one -D option per word
  example_main "$cls" "$w" "example-$cls-w$w.log" "$*" $([ "$w" -le "$ngpu" ] || gpu0_settings)
  executor_logs example
  exit $rc
fi
if [ "$mode" = classes ]; then
  select=(); for c in "$@"; do select+=(--select-class "$c"); done
  fresh
  keep_start
  # JAVA_PROPS is split into words on purpose: one -D option per word.
  # shellcheck disable=SC2086
  timeout 300 java "${flags[@]}" -Dfusedcomm.repo.root="$repo" ${JAVA_PROPS:-} \
    -cp "$cp_fc:$BUNDLE_CP" $launcher execute --disable-banner --details=tree "${select[@]}" \
    > "$out/java-classes.log" 2>&1 || rc=1
  executor_logs classes
  grep -E "✔|✘|↷|tests (successful|failed|skipped)|Exception" "$out/java-classes.log" | head -40
  exit $rc
fi
java "${flags[@]}" -cp "$cp_fc:$BUNDLE_CP" $launcher execute --disable-banner --details=tree \
  --select-class io.fusedcomm.gpu.CudaBackendTest --select-class io.fusedcomm.gpu.JCudaNativesRaceTest \
  --select-class io.fusedcomm.gpu.GpuAttentionTest > "$out/java-single-gpu.log" 2>&1 || rc=1
grep -E "✔|✘|↷|tests (successful|failed|skipped)|cuda runtime opened" "$out/java-single-gpu.log" | head -30
for w in "${worlds[@]}"; do
  [ "$w" -le "$ngpu" ] || continue
  fresh
  # As on a fresh host: the executors unpack JCuda's libraries themselves (JCudaNatives' lock
  # keeps them from racing), so every cluster run checks that path.
  rm -f /tmp/libJCuda*.so
  keep_start
  timeout 300 java "${flags[@]}" -Dfusedcomm.repo.root="$repo" -Dfusedcomm.test.gpuWorld="$w" \
    -cp "$cp_fc:$BUNDLE_CP" $launcher execute --disable-banner --details=tree \
    --select-class io.fusedcomm.gpu.GpuClusterCollectivesTest > "$out/spark-gpu-w$w.log" 2>&1 || rc=1
  executor_logs "w$w"
  grep -h "fusedcomm runtime started" "$home"/executors/*/stderr > "$out/executor-uuids-w$w.log" 2>/dev/null
  echo "== world $w: executors' logs"; cat "$out/executor-uuids-w$w.log"
  grep -E "^rank |overhead|stage 2|FAIL|✔|✘|↷|tests (successful|failed|skipped)|Exception" "$out/spark-gpu-w$w.log" | head -40
done
# Between hosts: every GPU of this host, split into two virtual hosts (proxy + socket path); on a
# one-GPU host two executors share it (correctness only).
if [ "$ngpu" -ge 1 ]; then
  fresh
  timeout 300 java "${flags[@]}" -Dfusedcomm.repo.root="$repo" -cp "$cp_fc:$BUNDLE_CP" $launcher execute \
    --disable-banner --details=tree --select-class io.fusedcomm.gpu.GpuClusterHostsTest \
    > "$out/spark-gpu-hosts.log" 2>&1 || rc=1
  echo "== two virtual hosts of $(( ngpu > 1 ? ngpu / 2 : 1 )) GPU(s)$([ "$ngpu" -eq 1 ] && echo ', both executors on the one GPU')"
  grep -E "^rank |FAIL|✔|✘|↷|tests (successful|failed|skipped)|Exception" "$out/spark-gpu-hosts.log" | head -20
fi
# Example 02 (tensor-parallel MLP forward + backward, fused ops) on the cuda backend, one
# executor per GPU, with the example's own main class and checks (as spark-submit would run it,
# the conf as system properties). JCuda was unpacked into /tmp by the tests above.
# The example's F at world w: F0 (default 2048) rounded up to a multiple of 8·w (on cuda every
# rank's share of F must be a multiple of 8).
example_f() { local f0=${2:-2048}; echo $(( (f0 + 8 * $1 - 1) / (8 * $1) * 8 * $1 )); }
# Two problems per world. The small one (EXAMPLE_ARGS, default M = 1000, H = 512) kAuto runs
# decomposed everywhere. The large one (EXAMPLE_FUSED_ARGS, default M = H = 4096, F = 1024) kAuto
# runs fused at W = 2 and 4: each allGatherGemm gathers 32 MiB and each gemmReduceScatter's
# partial product has 2^24 elements with M / W >= 1024 rows per owner (kernels' choose_ag and
# choose_rs). Its fp64 check on the driver takes ~45 core-seconds.
small_args() { echo "${EXAMPLE_ARGS:-1000 512 $(example_f "$1") bf16 11}"; }
fused_args() { echo "${EXAMPLE_FUSED_ARGS:-4096 4096 $(example_f "$1" 1024) bf16 12}"; }
# example02 WORLD LOG ARGS [extra -D settings...]   (ARGS: one word, "M H F dtype seed")
example02() { local w=$1 log=$2 args=$3; shift 3; example_main TensorParallelMlpExample "$w" "$log" "$args" "$@"; }
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
    echo "== example 02 on cuda, two virtual hosts, both executors on the one GPU"
    # shellcheck disable=SC2046  # gpu0_settings: one -D option per word
    example02 2 example02-hosts.log "$(small_args 2)" -Dspark.fusedcomm.cuda.virtualHosts=2 $(gpu0_settings)
  elif [ $((ngpu % 2)) -eq 0 ]; then
    echo "== example 02 on cuda, two virtual hosts of $((ngpu / 2)) GPU(s)"
    example02 "$ngpu" example02-hosts.log "$(small_args "$ngpu")" -Dspark.fusedcomm.cuda.virtualHosts=2
  fi
fi
echo "java.sh rc=$rc"
exit $rc
