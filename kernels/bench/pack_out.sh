#!/usr/bin/env bash
# The device tool returns at most about eight files from $OUT. When DIR holds more (counted
# recursively), every file not matching one of the KEEP globs (matched against the path
# relative to DIR) goes into DIR/ARCHIVE (tar.xz) and is removed; the kept ones stay as they are.
#   kernels/bench/pack_out.sh DIR ARCHIVE [KEEP_GLOB...]
set -uo pipefail
dir=${1:?dir}; archive=${2:?archive name}; shift 2
[ -d "$dir" ] || exit 0
cd "$dir" || exit 1
mapfile -t files < <(find . -type f ! -name "$archive" | sed 's|^\./||' | sort)
[ "${#files[@]}" -gt 8 ] || exit 0
pack=()
for f in "${files[@]}"; do
  keep=0
  for g in "$@"; do
    # shellcheck disable=SC2053
    [[ $f == $g ]] && { keep=1; break; }
  done
  [ $keep = 1 ] || pack+=("$f")
done
[ "${#pack[@]}" -gt 0 ] || exit 0
tar cJf "$archive" "${pack[@]}" && rm -f "${pack[@]}" && find . -mindepth 1 -type d -empty -delete
echo "pack_out: ${#pack[@]} of ${#files[@]} files of $dir into $archive"
