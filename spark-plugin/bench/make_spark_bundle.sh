#!/usr/bin/env bash
# Packs the stable half of the GPU-host Java run into .sparkbundle/pN (ignored; see
# gpu_java_run.sh): a jlink'ed Java 17 runtime with spark-plugin's test classpath (Spark, JCuda,
# JUnit) and the JUnit console launcher, in parts of <= 55 MB (/work/shared/gpu-host/
# make-bundle.sh, re-split below). Run from anywhere on the CPU machine after
# `mvn -B -DskipTests install`:
#   spark-plugin/bench/make_spark_bundle.sh
# The classpath changes only when the pom's dependencies do, so one bundle serves many runs;
# what changes with the code goes in .fcbundle (make_fc_bundle.sh).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
junit=1.11.4
cp_file=$(mktemp)
trap 'rm -f "$cp_file"' EXIT
mvn -B -q -pl spark-plugin dependency:build-classpath -Dmdep.includeScope=test \
  -Dmdep.outputFile="$cp_file"
mvn -B -q dependency:get -Dartifact=org.junit.platform:junit-platform-console-standalone:$junit
launcher=~/.m2/repository/org/junit/platform/junit-platform-console-standalone/$junit/junit-platform-console-standalone-$junit.jar
[ -f "$launcher" ] || { echo "missing $launcher" >&2; exit 1; }
printf ':%s' "$launcher" >> "$cp_file"
/work/shared/gpu-host/make-bundle.sh .sparkbundle "$cp_file"
# make-bundle.sh writes 55 MB parts; the device tool carries at most 64 MiB with the working
# tree (~12 MB), so re-split into 36 MiB parts, one per .sparkbundle/pN (five or so).
parts=$(mktemp -d)
cat .sparkbundle/p*/bundle.part.* | split -b 36M -d - "$parts/bundle.part."
rm -rf .sparkbundle
i=1
for f in "$parts"/bundle.part.*; do mkdir -p ".sparkbundle/p$i"; mv "$f" ".sparkbundle/p$i/"; i=$((i + 1)); done
rmdir "$parts"
du -sh .sparkbundle/p*
