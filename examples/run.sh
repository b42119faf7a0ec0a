#!/usr/bin/env bash
# Runs one of fusedcomm's numbered examples with spark-submit and prints the exact command.
#
#   examples/run.sh <01_collectives|02_tensor_parallel_mlp|03_moe_layer|04_context_parallel_attention|05_rapids_etl_to_training> [example args...]
#
# Builds what is missing first (the plugin jar, the examples jar, the Spark classpath file) in one
# Maven run, never anything that exists. Then:
#   - with SPARK_HOME set: $SPARK_HOME/bin/spark-submit;
#   - without: Spark's own org.apache.spark.deploy.SparkSubmit from the Maven classpath
#     (examples/target/classpath.txt) on an embedded local-cluster, in Spark's testing mode
#     (spark.testing: local-cluster executors inherit the driver's classpath).
# Either way the plugin jar arrives with --jars and is enabled with spark.plugins.
#
# Environment:
#   MASTER             Spark master (default local-cluster[<world>,1,1024], world = the first
#                      example argument, or 2)
#   FUSEDCOMM_BACKEND  spark.fusedcomm.backend (default host)
#   EXTRA_SUBMIT_ARGS  more spark-submit arguments, split on blanks (e.g. --conf k=v ...)
#   SPARK_HOME         a Spark 4.1 (Scala 2.13) installation to submit with (optional)
#   RAPIDS_JAR         the RAPIDS Accelerator's jar (com.nvidia:rapids-4-spark_2.13, classifier
#                      cuda13): runs the application with both plugins, the Accelerator first, and
#                      fusedcomm-rapids beside fusedcomm (example 05's GPU form); see README
#
# First use builds without tests and prints Maven's progress; it installs nothing into the
# local Maven repository (it downloads Spark there, once).
#   JAVA_HOME          Java 17 (default: the java on PATH)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

usage() {
  echo "usage: examples/run.sh <01_collectives|02_tensor_parallel_mlp|03_moe_layer|04_context_parallel_attention|05_rapids_etl_to_training> [args...]" >&2
  echo "  01_collectives [world=2] [seed]" >&2
  echo "  02_tensor_parallel_mlp [world=2] [M=125] [H=64] [F=256] [dtype=bf16|f32] [seed|fresh] [mode=train|infer]" >&2
  echo "    with FUSEDCOMM_BACKEND=cuda: dtype bf16, and H and every rank's share of F" >&2
  echo "    (Split.count(F, world, r)) positive multiples of 8, e.g. F divisible by 8*world" >&2
  echo "  03_moe_layer [world=2] [M=120] [H=64] [F=96] [E=6] [topk=2] [dtype=bf16|f32] [seed|fresh]" >&2
  echo "    with FUSEDCOMM_BACKEND=cuda: dtype bf16, H and F positive multiples of 8, E <= 1024" >&2
  echo "  04_context_parallel_attention [world=2] [S=1027] [Hq=8] [Hkv=2] [D=64] [dtype=bf16|f32] [seed|fresh] [layout=zigzag|contiguous] [mode=check|train] [steps=4] [lr=0.05]" >&2
  echo "    with FUSEDCOMM_BACKEND=cuda: dtype bf16, D 64 or 128" >&2
}

if [[ $# -lt 1 ]]; then
  usage
  exit 2
fi
case "$1" in
  01_collectives) MAIN=io.fusedcomm.examples.CollectivesExample ;;
  02_tensor_parallel_mlp) MAIN=io.fusedcomm.examples.TensorParallelMlpExample ;;
  03_moe_layer) MAIN=io.fusedcomm.examples.MoeLayerExample ;;
  04_context_parallel_attention) MAIN=io.fusedcomm.examples.ContextParallelAttentionExample ;;
  05_rapids_etl_to_training) MAIN=io.fusedcomm.examples.RapidsEtlTrainingExample ;;
  -h | --help) usage; exit 0 ;;
  *) echo "unknown example '$1'" >&2; usage; exit 2 ;;
esac
shift

# The project version: the first top-level <version> of the parent pom; the Scala version of the
# default build (the plugin's artifact is fusedcomm_<scala>).
VERSION="$(sed -n 's:^  <version>\(.*\)</version>.*:\1:p' pom.xml | head -n 1)"
SCALA="$(sed -n 's:^    <scala.binary.version>\(.*\)</scala.binary.version>.*:\1:p' pom.xml | head -n 1)"
PLUGIN_JAR="$ROOT/spark-plugin/target/fusedcomm_$SCALA-$VERSION.jar"
RAPIDS_MODULE_JAR="$ROOT/rapids/target/fusedcomm-rapids_$SCALA-$VERSION.jar"
EXAMPLES_JAR="$ROOT/examples/target/fusedcomm-examples-$VERSION.jar"
CLASSPATH_FILE="$ROOT/examples/target/classpath.txt"
LOG4J_CONF="$ROOT/conf/log4j2.properties"

run_mvn() {
  echo "+ mvn $*" >&2
  mvn "$@"
}

if [[ ! -f "$PLUGIN_JAR" || ! -f "$RAPIDS_MODULE_JAR" || ! -f "$EXAMPLES_JAR" || ! -f "$CLASSPATH_FILE" ]]; then
  # One reactor build of what the examples need, with Maven's progress shown. It installs
  # nothing: the jars stay under */target. Maven does download, once, into its local repository
  # (~/.m2/repository): Spark and its dependencies and Maven's plugins, about 240 MB.
  cat >&2 <<EOM
fusedcomm: building the native library (CMake + nvcc, a few minutes on first use), the plugin jar
  $PLUGIN_JAR
  and the examples jar, without tests. First use downloads Spark $(sed -n 's:^    <spark.version>\(.*\)</spark.version>.*:\1:p' pom.xml | head -n 1) and Maven's plugins (about 240 MB)
  into ~/.m2/repository; nothing is installed there of fusedcomm's.
EOM
  run_mvn -B -DskipTests -pl examples -am package
fi

WORLD=2
if [[ $# -ge 1 && "$1" =~ ^[1-9][0-9]*$ ]]; then
  WORLD="$1"
fi
MASTER="${MASTER:-local-cluster[$WORLD,1,1024]}"
BACKEND="${FUSEDCOMM_BACKEND:-host}"
# shellcheck disable=SC2206 # split on blanks on purpose
EXTRA=(${EXTRA_SUBMIT_ARGS:-})
JARS="$PLUGIN_JAR"
PLUGINS=io.fusedcomm.FusedCommPlugin
if [[ -n "${RAPIDS_JAR:-}" ]]; then
  [[ -f "$RAPIDS_JAR" ]] || { echo "RAPIDS_JAR=$RAPIDS_JAR is not a file" >&2; exit 2; }
  # The Accelerator's RMM pool takes the GPU's free memory but spark.rapids.memory.gpu.reserve;
  # fusedcomm's 2 x spark.fusedcomm.cuda.symmetricBytes (128m) + 64m must fit beside it (see
  # README, "With the RAPIDS Accelerator"): 640m (the default reserve) + 320m.
  JARS="$RAPIDS_JAR,$PLUGIN_JAR,$RAPIDS_MODULE_JAR"
  PLUGINS=com.nvidia.spark.SQLPlugin,io.fusedcomm.FusedCommPlugin
  EXTRA=(--conf spark.rapids.memory.gpu.reserve=960m "${EXTRA[@]}")
fi

if [[ -n "${SPARK_HOME:-}" ]]; then
  CMD=("$SPARK_HOME/bin/spark-submit"
    --master "$MASTER"
    --jars "$JARS"
    --conf "spark.plugins=$PLUGINS"
    --conf "spark.fusedcomm.backend=$BACKEND"
    --driver-java-options "-Dlog4j.configurationFile=file:$LOG4J_CONF"
    "${EXTRA[@]}"
    --class "$MAIN" "$EXAMPLES_JAR" "$@")
  echo "+ $(printf '%q ' "${CMD[@]}")"
  exec "${CMD[@]}"
fi

# No Spark installation: Spark from the Maven repository (examples/target/classpath.txt).
if [[ -z "${JAVA_HOME:-}" ]]; then
  # Workers start executors with $JAVA_HOME/bin/java.
  JAVA_HOME="$(dirname "$(dirname "$(readlink -f "$(command -v java)")")")"
fi
export JAVA_HOME
# The --add-opens flags Spark needs on Java 17, from the parent pom (one place to change them).
JVM_FLAGS="$(sed -n 's:.*<spark.test.jvm.flags>\(.*\)</spark.test.jvm.flags>.*:\1:p' pom.xml)"
if [[ -z "$JVM_FLAGS" ]]; then
  echo "could not read spark.test.jvm.flags from $ROOT/pom.xml" >&2
  exit 1
fi
# spark.test.home must name a folder; the embedded workers keep their work/ (executor logs) there.
TEST_HOME="$ROOT/examples/target/spark-test-home"
mkdir -p "$TEST_HOME"

# shellcheck disable=SC2206 # the flags are blank-separated, none contains a blank
FLAGS=($JVM_FLAGS)
HEAD=("$JAVA_HOME/bin/java" "${FLAGS[@]}"
  -Dspark.testing=1 "-Dspark.test.home=$TEST_HOME" "-Dlog4j.configurationFile=file:$LOG4J_CONF"
  -cp)
TAIL=(org.apache.spark.deploy.SparkSubmit
  --master "$MASTER"
  --jars "$JARS"
  --conf "spark.plugins=$PLUGINS"
  --conf "spark.fusedcomm.backend=$BACKEND"
  --conf "spark.executorEnv.SPARK_SCALA_VERSION=$SCALA"
  --conf "spark.executor.extraJavaOptions=$JVM_FLAGS -Dlog4j.configurationFile=file:$LOG4J_CONF"
  "${EXTRA[@]}"
  --class "$MAIN" "$EXAMPLES_JAR" "$@")
# The classpath is ~150 jars: print it as the file it comes from.
echo "+ $(printf '%q ' "${HEAD[@]}")\"\$(cat $(printf '%q' "$CLASSPATH_FILE"))\" $(printf '%q ' "${TAIL[@]}")"
exec "${HEAD[@]}" "$(cat "$CLASSPATH_FILE")" "${TAIL[@]}"
