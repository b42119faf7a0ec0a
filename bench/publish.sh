#!/usr/bin/env bash
# Makes a run's tables the current ones of a host kind:
#   bench/publish.sh <out-dir> <host-kind> [family ...]      (default: every family in out-dir)
# copies <out-dir>/<family>.{json,md,png} over bench/results/<host-kind>/<family>.*, so that
# bench/results holds only the current table per family and host kind (older ones stay in git's
# history). Run it on the machine with the checkout, on what came back from the GPU host.
set -euo pipefail
[ $# -ge 2 ] || { sed -n '2,3p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
out=$1 kind=$2
shift 2
case "$kind" in
  *[!A-Za-z0-9._-]* | "") echo "host kind: letters, digits, '.', '_' and '-' only (e.g. nvidia-h200-x2)" >&2; exit 2 ;;
esac
results=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/results
families=("$@")
if [ ${#families[@]} -eq 0 ]; then
  for f in gemm attention moe collectives fused transport; do [ -f "$out/$f.json" ] && families+=("$f"); done
fi
[ ${#families[@]} -gt 0 ] || { echo "no <family>.json in $out" >&2; exit 1; }
mkdir -p "$results/$kind"
for f in "${families[@]}"; do
  [ -f "$out/$f.json" ] && [ -f "$out/$f.md" ] || { echo "$out has no $f.json and $f.md" >&2; exit 1; }
  grep -q "$kind" "$out/$f.json" ||
    echo "note: $f.json's device field does not name $kind (FC_HOST_KIND was not set for the run)" >&2
  rm -f "$results/$kind/$f".{json,md,png}
  cp "$out/$f.json" "$out/$f.md" "$results/$kind/"
  [ -f "$out/$f.png" ] && cp "$out/$f.png" "$results/$kind/"
  echo "published $f -> bench/results/$kind/"
done
n=$(find "$results" -type f | wc -l)
[ "$n" -le 40 ] || echo "note: bench/results holds $n files (keep it to about 40: one table per family and host kind)" >&2
