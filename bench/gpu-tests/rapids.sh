#!/usr/bin/env bash
# Example 05 with the RAPIDS Accelerator on a GPU host that has no JDK, Maven or network; logs in
# <out-dir>:
#   bench/gpu-tests/rapids.sh <out-dir> stage N     copy bundle part N into the stage
#   bench/gpu-tests/rapids.sh <out-dir> run         the runs below, a table last
#
# .rapidsbundle/pN (make_rapids_bundle.sh) travel one part per transfer and collect in the stage
# (FC_RAPIDS_HOME, default /root/fusedcomm-rapids); .rapidsbundle/app holds fusedcomm's jars.
# The runs, each an application on an embedded local-cluster with one executor per GPU (world 1
# on a one-GPU host), the cuda backend, and both plugins:
#   order1     spark.plugins=com.nvidia.spark.SQLPlugin,io.fusedcomm.FusedCommPlugin, RMM's
#              default pool and spark.rapids.memory.gpu.reserve as README says (960m), the jars
#              with --jars as in README's spark-submit line; the executor's fusedcomm metrics
#              through Spark's CSV sink
#   order2     the same with the plugins the other way round and the jars on the classpath
#   tight      RMM's defaults (reserve 640m): the memory rule must refuse, naming what to set
#   large      spark.fusedcomm.cuda.symmetricBytes=4g and the reserve the rule asks for (8896m):
#              the rule's sizing holds for a larger symmetric area beside the pool
# With ONLY=share2, instead: two executors sharing GPU 0 (spark.fusedcomm.cuda.shareGpu, each RMM
# pool 0.4 of the GPU), world 2: the gather and the sums cross ranks; CSV metrics as order1.
set -uo pipefail
ulimit -c 0
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
mkdir -p "$1" || exit 2
out=$(cd "$1" && pwd)
home=${FC_RAPIDS_HOME:-/root/fusedcomm-rapids}
stage=$home/stage
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
case "${2:-}" in
  stage) mkdir -p "$stage" && cp "$repo/.rapidsbundle/p$3"/bundle.part.* "$stage/" && ls -la "$stage"; exit $? ;;
  run) ;;
  *) sed -n '2,4p' "$0" >&2; exit 2 ;;
esac
[ -d "$repo/.rapidsbundle" ] && cp "$repo"/.rapidsbundle/p*/bundle.part.* "$stage/" 2>/dev/null
if [ ! -d "$home/bundle" ]; then
  (cd "$home" && cat stage/bundle.part.* | tar -xJf -) ||
    { rm -rf "$home/bundle"; echo "bundle incomplete: $(ls "$stage")"; exit 3; }
fi
# shellcheck disable=SC1091  # made by make_rapids_bundle.sh
source "$home/bundle/env.sh"
app=$repo/.rapidsbundle/app
examples_jar=$(ls "$app"/fusedcomm-examples-*.jar)
cp_app=$examples_jar:$(ls "$app"/fusedcomm-rapids_*.jar):$(ls "$app"/fusedcomm_*.jar)
rapids_jar=$home/bundle/app/rapids-4-spark.jar
jars=$rapids_jar,$(ls "$app"/fusedcomm_*.jar),$(ls "$app"/fusedcomm-rapids_*.jar)
nvidia-smi -L
ngpu=$(nvidia-smi -L | grep -c '^GPU' || true)
flags=(--add-opens=java.base/java.lang=ALL-UNNAMED --add-opens=java.base/java.lang.invoke=ALL-UNNAMED
  --add-opens=java.base/java.lang.reflect=ALL-UNNAMED --add-opens=java.base/java.io=ALL-UNNAMED
  --add-opens=java.base/java.net=ALL-UNNAMED --add-opens=java.base/java.nio=ALL-UNNAMED
  --add-opens=java.base/java.util=ALL-UNNAMED --add-opens=java.base/java.util.concurrent=ALL-UNNAMED
  --add-opens=java.base/java.util.concurrent.atomic=ALL-UNNAMED --add-opens=java.base/jdk.internal.ref=ALL-UNNAMED
  --add-opens=java.base/sun.nio.ch=ALL-UNNAMED --add-opens=java.base/sun.nio.cs=ALL-UNNAMED
  --add-opens=java.base/sun.security.action=ALL-UNNAMED --add-opens=java.base/sun.util.calendar=ALL-UNNAMED
  -Djdk.reflect.useDirectMethodHandle=false -Dio.netty.tryReflectionSetAccessible=true)
world=${WORLD:-$ngpu}
args=${EXAMPLE_ARGS:-"$world 2048 $((32 * world)) 30 7"}
# Local-cluster executors log into /tmp/worker-*/APP/ID, deleted when the driver's JVM exits:
# keep_start copies their stdout and stderr to $home/executors twice a second until keep_stop.
keep_start() {
  rm -rf "$home/executors"; mkdir -p "$home/executors"
  (
    while :; do
      for d in /tmp/worker-*/*/*/; do
        [ -d "$d" ] || continue
        k=$home/executors/$(basename "$(dirname "$d")")-$(basename "$d"); mkdir -p "$k"
        cp "$d"stdout "$d"stderr "$k"/ 2>/dev/null
      done
      sleep 0.5
    done
  ) &
  keeper=$!
}
keep_stop() { kill "$keeper" 2>/dev/null; wait "$keeper" 2>/dev/null; }
# example05 NAME TIMEOUT jars|cp [extra -D settings...]: the example's own main class and checks,
# with the Accelerator's and fusedcomm's jars given with --jars (jars, as README's spark-submit
# line has them) or on the JVM's classpath (cp; executors inherit it), as spark-submit runs it (the conf as system properties): through SparkSubmit, whose class loader
# the Accelerator's shim loader extends (a plain java -cp main class fails there with
# ClassNotFoundException for the shim's classes). Executors inherit the classpath.
example05() {
  local name=$1 limit=$2 how=$3; shift 3
  local cp=$BUNDLE_CP submit=(--jars "$jars")
  if [ "$how" = cp ]; then cp=$cp_app:$rapids_jar:$BUNDLE_CP; submit=(); fi
  local spark_home; spark_home=$(mktemp -d)
  rm -rf /tmp/fusedcomm-gpu-claims /tmp/worker-*
  local t0=$SECONDS
  keep_start
  # shellcheck disable=SC2086  # $args: five words on purpose
  timeout "$limit" java "${flags[@]}" -cp "$cp" \
    -Dspark.master="local-cluster[$world,1,4096]" -Dspark.testing=1 -Dspark.test.home="$spark_home" \
    -Dspark.executorEnv.SPARK_SCALA_VERSION=2.13 -Dspark.fusedcomm.backend=cuda \
    -Dspark.driver.host=127.0.0.1 -Dspark.driver.bindAddress=127.0.0.1 -Dspark.ui.enabled=false \
    -Dspark.worker.resource.gpu.amount=1 -Dspark.executor.resource.gpu.amount=1 -Dspark.task.resource.gpu.amount=1 \
    -Dspark.worker.resource.gpu.discoveryScript="$repo/conf/gpu-discovery.sh" \
    -Dspark.executor.resource.gpu.discoveryScript="$repo/conf/gpu-discovery.sh" \
    -Dspark.rapids.sql.explain=NOT_ON_GPU "$@" \
    org.apache.spark.deploy.SparkSubmit --master "local-cluster[$world,1,4096]" "${submit[@]}" \
    --class io.fusedcomm.examples.RapidsEtlTrainingExample "$examples_jar" $args > "$out/$name.log" 2>&1
  local rc=$?
  keep_stop
  echo "$name $rc $((SECONDS - t0))s" >> "$out/summary.txt"
  grep -vE "^\s+at |^\s*$" "$out/$name.log" | grep -E "05_rapids|ETL:|hand-off|rank |loss|weights|FAILED|NOT_ON_GPU|cannot run on GPU|fusedcomm GPU memory|Exception" | cut -c1-400 | head -30
  # The executor's side: RMM's pool, fusedcomm's memory decision or refusal.
  cat "$home"/executors/*/stderr 2>/dev/null | grep -E "fusedcomm GPU memory|fusedcomm cannot start|RMM|pool|GPU memory|shim|Exception" |
    cut -c1-400 | head -16 > "$home/$name-executor.log"
  cat "$home/$name-executor.log"
  { echo "==== $name"; cat "$home"/executors/*/stderr 2>/dev/null | tail -300; } >> "$out/executors.log"
  return $rc
}
# The executor's fusedcomm counters and gauges (CSV sink under /tmp/fc-metrics): the largest and
# the last value each one wrote.
metrics_table() {
  for f in /tmp/fc-metrics/*FusedCommPlugin*.csv; do
    [ -f "$f" ] || continue
    n=$(basename "$f" .csv | sed 's/.*FusedCommPlugin\.//')
    echo "$n: max $(tail -n +2 "$f" | cut -d, -f2 | sort -g | tail -1), last $(tail -1 "$f" | cut -d, -f2)"
  done | sort
}
csv=(-Dspark.metrics.conf.executor.sink.csv.class=org.apache.spark.metrics.sink.CsvSink
  -Dspark.metrics.conf.executor.sink.csv.period=1 -Dspark.metrics.conf.executor.sink.csv.unit=seconds
  -Dspark.metrics.conf.executor.sink.csv.directory=/tmp/fc-metrics)
plugins_rf=com.nvidia.spark.SQLPlugin,io.fusedcomm.FusedCommPlugin
plugins_fr=io.fusedcomm.FusedCommPlugin,com.nvidia.spark.SQLPlugin
rm -f "$out/summary.txt" "$out/executors.log"
mkdir -p /tmp/fc-metrics && rm -rf /tmp/fc-metrics/*
if [ "${ONLY:-}" = share2 ]; then
  world=2; args=${EXAMPLE_ARGS:-"2 2048 64 30 7"}
  printf '#!/bin/sh\necho '"'"'{"name":"gpu","addresses":["0"]}'"'"'\n' > "$home/gpu0.sh"; chmod +x "$home/gpu0.sh"
  echo "== share2: two executors on GPU 0, world 2, $plugins_rf, allocFraction 0.4 each"
  example05 share2 150 jars -Dspark.plugins=$plugins_rf -Dspark.rapids.memory.gpu.allocFraction=0.4 \
    -Dspark.fusedcomm.cuda.shareGpu=true -Dspark.worker.resource.gpu.discoveryScript="$home/gpu0.sh" \
    -Dspark.executor.resource.gpu.discoveryScript="$home/gpu0.sh" "${csv[@]}"
  metrics_table > "$out/metrics.txt"
  grep -E "bytes|path|symmetric|communicators|ops.allGatherGemm|ops.allReduce" "$out/metrics.txt"
  grep -o "x tensor 0x[0-9a-f]* == cuDF list elements 0x[0-9a-f]*" "$out/share2.log"
  cat "$out/summary.txt"
  exit 0
fi
echo "== order1: $plugins_rf, reserve 960m, CSV metrics"
example05 order1 120 jars -Dspark.plugins=$plugins_rf -Dspark.rapids.memory.gpu.reserve=960m "${csv[@]}"
metrics_table > "$out/metrics.txt"
grep -E "bytes|path|symmetric|communicators|ops.allGatherGemm|ops.allReduce" "$out/metrics.txt" | head -30
echo "== tight: RMM's defaults (reserve 640m): the memory rule must refuse"
example05 tight 120 jars -Dspark.plugins=$plugins_rf -Dspark.task.maxFailures=1 -Dspark.stage.maxConsecutiveAttempts=1
echo "== order2: $plugins_fr, reserve 960m"
example05 order2 120 cp -Dspark.plugins=$plugins_fr -Dspark.rapids.memory.gpu.reserve=960m
echo "== large: symmetricBytes=4g, reserve 8896m"
example05 large 120 cp -Dspark.plugins=$plugins_rf -Dspark.fusedcomm.cuda.symmetricBytes=4g \
  -Dspark.rapids.memory.gpu.reserve=8896m
echo "== table"
pass() { grep -q "05_rapids_etl_to_training: check passed" "$out/$1.log" && echo yes || echo no; }
printf '%-8s %-10s %-7s %s\n' run exit passed note
while read -r name rc secs; do
  note=""
  case $name in
    tight) note=$(grep -h -o -m1 "Set spark.rapids.memory.gpu.reserve=[0-9]*m" "$out/tight.log" "$home/tight-executor.log" | head -1) ;;
    *) note=$(grep -o -m1 "x tensor 0x[0-9a-f]* == cuDF list elements 0x[0-9a-f]*" "$out/$name.log" | head -1) ;;
  esac
  printf '%-8s %-10s %-7s %s\n' "$name" "$rc $secs" "$(pass "$name")" "$note"
done < "$out/summary.txt"
