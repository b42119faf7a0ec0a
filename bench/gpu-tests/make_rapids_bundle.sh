#!/usr/bin/env bash
# Packs the stable half of example 05's GPU run with the RAPIDS Accelerator into
# .rapidsbundle/pN (ignored; see rapids.sh): a jlink'ed Java 17 runtime, the examples' Spark
# classpath (spark-core, spark-sql) and the Accelerator's jar slimmed to this Spark's shim and
# sm_90 (slim_rapids_jar.py), as one tar.xz split into parts. fusedcomm's own jars travel beside
# it (rapids.sh takes them from .rapidsbundle/app). Run after `mvn -B -DskipTests package`, with
# the Accelerator's jar in the local Maven repository:
#   bench/gpu-tests/make_rapids_bundle.sh [PART_MiB]      (default 55)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
part_mib=${1:-55}
rapids_version=26.08.1
shim=spark$(sed -n 's:^    <spark.version>\(.*\)</spark.version>.*:\1:p' pom.xml | head -n 1 | tr -d .)
jdk=${JDK_HOME:-/usr/lib/jvm/java-17-openjdk-amd64}
version=$(sed -n 's:^  <version>\(.*\)</version>.*:\1:p' pom.xml | head -n 1)
rapids_jar=~/.m2/repository/com/nvidia/rapids-4-spark_2.13/$rapids_version/rapids-4-spark_2.13-$rapids_version-cuda13.jar
[ -f "$rapids_jar" ] || { echo "missing $rapids_jar (mvn dependency:get -Dartifact=com.nvidia:rapids-4-spark_2.13:$rapids_version:jar:cuda13)" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
b=$work/bundle
mkdir -p "$b/jars" "$b/app"
"$jdk/bin/jlink" --add-modules java.se,jdk.unsupported,jdk.management,jdk.crypto.ec,jdk.zipfs,jdk.security.auth,jdk.security.jgss,jdk.naming.dns,jdk.localedata,jdk.incubator.vector \
  --strip-debug --no-man-pages --no-header-files --compress=0 --output "$b/jre"
strip --strip-unneeded "$b/jre/lib/server/libjvm.so"
# spark-sql needs icu4j (collations), unlike spark-core alone.
tr ':' '\n' < examples/target/classpath.txt | sed '/^$/d' | grep -v -E 'rocksdbjni|osx-|aarch_64|windows' |
  while read -r e; do cp "$e" "$b/jars/"; done
python3 bench/gpu-tests/slim_rapids_jar.py "$rapids_jar" "$b/app/rapids-4-spark.jar" "$shim" 90
# Stored entries, so that xz sees the class files themselves.
python3 - "$b"/jars/*.jar <<'PY'
import os, sys, zipfile
for path in sys.argv[1:]:
    tmp = path + ".stored"
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED) as dst:
        for info in src.infolist():
            data = src.read(info)
            info.compress_type = zipfile.ZIP_STORED
            dst.writestr(info, data)
    os.replace(tmp, path)
PY
cat > "$b/env.sh" <<'ENV'
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export JAVA_HOME=$here/jre PATH=$here/jre/bin:$PATH
BUNDLE_CP=""; for j in "$here"/jars/*.jar; do BUNDLE_CP=$BUNDLE_CP:$j; done; export BUNDLE_CP=${BUNDLE_CP#:}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
ENV
du -sh "$b"/*
rm -rf .rapidsbundle
mkdir -p "$work/parts"
# xz -1: a few minutes on two cores; higher levels gain little on the natives.
tar -cf - -C "$work" bundle | xz -T2 -1 | split -b "${part_mib}M" -d - "$work/parts/bundle.part."
i=1
for f in "$work"/parts/bundle.part.*; do mkdir -p ".rapidsbundle/p$i"; mv "$f" ".rapidsbundle/p$i/"; i=$((i + 1)); done
mkdir -p .rapidsbundle/app
cp spark-plugin/target/fusedcomm_2.13-"$version".jar rapids/target/fusedcomm-rapids_2.13-"$version".jar \
  examples/target/fusedcomm-examples-"$version".jar .rapidsbundle/app/
du -sh .rapidsbundle/*
