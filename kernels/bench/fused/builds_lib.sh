# Sourced by the fused benches' one-call scripts (pace_ab.sh, engine_trace_run.sh,
# rs_w2_probe.sh, pusher_ab.sh, coll_power_ab.sh, sustain_ab.sh, split_sweep.sh, w4_owed.sh,
# ag_split_w2.sh; from the repository root): build
# variants here, carry one archive to the GPU host, unpack it there.

# fused_variants DIR PREFIX EXTRA_FLAGS name=FLAGS...: each variant's fused_bench, built by
# build.sh with EXTRA_FLAGS and FLAGS into build/PREFIX-name, copied to DIR/name; DIR/order.txt
# lists the names in the order given (the run order: the first is the A/B's reference). FLAGS
# with several nvcc words joins them by commas (ce32=-DA,-DB=32), since spaces separate variants.
fused_variants() {
  local dir=$1 prefix=$2 extra=$3 b name flags
  shift 3
  rm -rf "$dir" && mkdir -p "$dir" || return 1
  for b in "$@"; do
    name=${b%%=*}
    flags=${b#*=}
    FC_NVCC_FLAGS="$extra ${flags//,/ }" kernels/bench/fused/build.sh "build/$prefix-$name" | tail -1 || return 1
    mkdir -p "$dir/$name" && cp "build/$prefix-$name/fused_bench" "$dir/$name/" || return 1
    echo "$name" >> "$dir/order.txt"
  done
}

# variant_tests DIR PREFIX: after fused_variants DIR PREFIX ..., each variant's gpu_fused_test
# (built beside its fused_bench) into DIR/name too, for scripts that test a build before timing it.
variant_tests() {
  local v
  while read -r v; do cp "build/$2-$v/gpu_fused_test" "$1/$v/" || return 1; done < "$1/order.txt"
}

# pack_builds DIR: strips DIR's executables (host symbols only), records the commit in
# DIR/commit.txt and writes DIR.tar.xz beside DIR (the binaries share most of their code: the
# archive is about a tenth of the folder).
pack_builds() {
  local dir=$1
  find "$dir" -type f -perm -u+x -exec strip --strip-unneeded {} + || return 1
  git rev-parse --short HEAD > "$dir/commit.txt"
  tar cJf "$dir.tar.xz" -C "$(dirname "$dir")" "$(basename "$dir")" && du -sh "$dir" "$dir.tar.xz"
}

# unpack_builds DIR: on the GPU host, DIR from the carried DIR.tar.xz (pack_builds' archive),
# unless DIR is there already.
unpack_builds() {
  [ -d "$1" ] || tar xJf "$1.tar.xz" -C "$(dirname "$1")" || { echo "no $1 and no $1.tar.xz: build first"; return 1; }
}

# fused_test BIN LOG LABEL [TIMEOUT=240]: on the GPU host, a build's gpu_fused_test (every
# world from 1 to the GPU count) into LOG, then one line: LABEL, the exit code and each world's
# verdict. Returns the test's exit code.
fused_test() {
  local rc
  timeout "${4:-240}" "$1" > "$2" 2>&1; rc=$?
  echo "gpu_fused_test ($3) rc=$rc: $(grep -E '^== world [0-9]+.*: (PASS|FAIL)' "$2" | tr '\n' ' ')"
  return $rc
}

# variant_rounds ROWS ROUNDS DEADLINE_S V...: ROUNDS rounds over the variants V, the order rotated
# by one each round, each a call of the caller's `run_variant V FILE` (it writes fused_bench's
# rows to FILE); every row is appended to ROWS with "variant" and "round". No run starts after
# DEADLINE_S seconds of the script (0: no deadline). Tables: variant_ratios.py ROWS V1.
variant_rounds() {
  local rows=$1 rounds=$2 deadline=$3 r i v n
  shift 3
  local variants=("$@") tmp=/tmp/variant_rows.jsonl
  n=${#variants[@]}
  for r in $(seq 1 "$rounds"); do
    for i in $(seq 0 $((n - 1))); do
      v=${variants[$(((i + r - 1) % n))]}
      if [ "$deadline" -gt 0 ] && [ "$SECONDS" -ge "$deadline" ]; then
        echo "deadline: round $r from $v on not run"; return 0
      fi
      rm -f "$tmp"  # a failed run must not re-append the previous rows
      run_variant "$v" "$tmp" || echo "variant $v round $r: rc=$?"
      [ -f "$tmp" ] && sed "s/}\$/, \"variant\": \"$v\", \"round\": $r}/" "$tmp" >> "$rows"
    done
  done
}
