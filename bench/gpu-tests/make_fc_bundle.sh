#!/usr/bin/env bash
# Packs what changes between GPU-host runs into .fcbundle/ (ignored; it travels with the
# checkout): the plugin's classes and test classes, the examples' classes, and libfusedcomm.so as
# a classpath resource (native/linux/amd64/). Run after `mvn -B -DskipTests install`; see java.sh.
#   make_fc_bundle.sh [path/to/libfusedcomm.so]   (default: the one in executor-native's jar)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
out="$root/.fcbundle"
rm -rf "$out"; mkdir -p "$out/native/linux/amd64"
cp -r "$root/spark-plugin/target/classes" "$out/classes"
cp -r "$root/spark-plugin/target/test-classes" "$out/test-classes"
if [ $# -ge 1 ]; then
  cp "$1" "$out/native/linux/amd64/"
else
  unzip -q -o "$root"/executor-native/target/fusedcomm-native-*.jar 'linux/amd64/*' -d "$out/native"
fi
cp -r "$root/examples/target/classes" "$out/examples"
du -sh "$out"
