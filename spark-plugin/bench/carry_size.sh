#!/usr/bin/env bash
# What a device call would carry, before making it: the tracked and untracked-not-ignored files
# plus the paths named (the device tool's `carry`), in disk blocks as du counts them, against
# the tool's 64 MiB limit. A call over the limit is refused (run 17: the tracked tree had grown
# to ~36 MB, so a 30 MiB staging part no longer fit). Exit 1 when over.
#   spark-plugin/bench/carry_size.sh [PATH...]      e.g. .sparkbundle/p1   or   .fcbundle build/x.tar.xz
set -euo pipefail
cd "$(dirname "$0")/../.."
limit_kib=$((64 * 1024))
tree_kib=$( { git ls-files -z; git ls-files -z --others --exclude-standard; } |
  xargs -0 -r du -ck 2> /dev/null | awk '$2 == "total" { s += $1 } END { print s + 0 }')
carry_kib=0
for p in "$@"; do
  [ -e "$p" ] || { echo "carry_size: $p does not exist" >&2; exit 2; }
  carry_kib=$((carry_kib + $(du -sk "$p" | cut -f1)))
done
total=$((tree_kib + carry_kib))
printf 'working tree %d KiB + carried %d KiB = %d KiB of %d KiB (%s)\n' \
  "$tree_kib" "$carry_kib" "$total" "$limit_kib" "$([ "$total" -le "$limit_kib" ] && echo fits || echo OVER)"
[ "$total" -le "$limit_kib" ]
