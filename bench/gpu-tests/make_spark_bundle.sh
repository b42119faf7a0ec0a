#!/usr/bin/env bash
# Packs the stable half of the GPU-host Java run into .sparkbundle/pN (ignored; see java.sh):
# a jlink'ed Java 17 runtime with spark-plugin's test classpath (Spark, JCuda, JUnit) and the
# JUnit console launcher, as one tar.xz split into parts. Run from anywhere on a machine with the
# JDK and Maven, after `mvn -B -DskipTests install`:
#   bench/gpu-tests/make_spark_bundle.sh [PART_MiB]      (default 20)
# The classpath changes only when the pom's dependencies do, so one bundle serves many runs;
# what changes with the code goes in .fcbundle (make_fc_bundle.sh).
#
# Small parts, because each part is one transfer to the GPU host when transfers are size-limited:
# the runtime image is left uncompressed (jlink --compress=0) with libjvm.so stripped, and the
# jars are rewritten with stored (uncompressed) entries, so that xz sees the class files
# themselves rather than deflate streams (about half the size of compressing them as they are).
# Layout: bundle/jre, bundle/jars, bundle/classes, bundle/env.sh.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
part_mib=${1:-20}
junit=1.11.4
jdk=${JDK_HOME:-/usr/lib/jvm/java-17-openjdk-amd64}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp_file=$work/cp.txt
mvn -B -q -pl spark-plugin dependency:build-classpath -Dmdep.includeScope=test \
  -Dmdep.outputFile="$cp_file"
mvn -B -q dependency:get -Dartifact=org.junit.platform:junit-platform-console-standalone:$junit
launcher=~/.m2/repository/org/junit/platform/junit-platform-console-standalone/$junit/junit-platform-console-standalone-$junit.jar
[ -f "$launcher" ] || { echo "missing $launcher" >&2; exit 1; }
printf ':%s' "$launcher" >> "$cp_file"

b=$work/bundle
mkdir -p "$b/jars"
# Spark's launcher passes --add-modules=jdk.incubator.vector and Hadoop needs jdk.security.auth.
"$jdk/bin/jlink" --add-modules java.se,jdk.unsupported,jdk.management,jdk.crypto.ec,jdk.zipfs,jdk.security.auth,jdk.security.jgss,jdk.naming.dns,jdk.localedata,jdk.incubator.vector \
  --strip-debug --no-man-pages --no-header-files --compress=0 --output "$b/jre"
strip --strip-unneeded "$b/jre/lib/server/libjvm.so"
# Other platforms' natives and jars the tests never load (rocksdb: Spark's optional KV store).
tr ':' '\n' < "$cp_file" | sed '/^$/d' | grep -v -E 'rocksdbjni|osx-|aarch_64|windows|icu4j' | while read -r e; do
  if [ -d "$e" ]; then mkdir -p "$b/classes"; cp -r "$e"/. "$b/classes/"; else cp "$e" "$b/jars/"; fi
done
# Same entries, same bytes, stored instead of deflated (signatures cover contents, not the
# compression, so signed jars stay valid).
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
BUNDLE_CP=$here/classes; for j in "$here"/jars/*.jar; do BUNDLE_CP=$BUNDLE_CP:$j; done; export BUNDLE_CP
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
ENV
rm -rf .sparkbundle
mkdir -p "$work/parts"
tar -cf - -C "$work" bundle | xz -T0 -9 | split -b "${part_mib}M" -d - "$work/parts/bundle.part."
i=1
for f in "$work"/parts/bundle.part.*; do mkdir -p ".sparkbundle/p$i"; mv "$f" ".sparkbundle/p$i/"; i=$((i + 1)); done
du -sh .sparkbundle/p*
