#!/usr/bin/env bash
# One device call (2- or 4-GPU host): allGatherGemm's SM split (the pulling CTAs of kAgSplit in
# kernels/src/fused.cu) under the sustained protocol of run 14 (--sustain-ms: every impl runs
# back to back before its batches, so each is timed at the clock its own power draw sustains).
# kAgSplit was tuned in runs 10-11 with the round-robin protocol, which favoured the fused
# kernel; this sweep asks again, ours only: the fused time per count of pulling CTAs, each
# against our GEMM alone from the same process, for each build variant (FC_SPLIT_BUILDS: name=nvcc
# flags words, default "base=": the default build alone; run 16 compared the register-load and
# bulk-copy pulls this way, before the bulk copies became the only path).
#   build (CPU machine): kernels/bench/fused/split_sweep.sh build  -> build/split.tar.xz (carry it)
#   run   (GPU host):    kernels/bench/fused/split_sweep.sh run    -> $OUT/split_table.txt,
#                        $OUT/split_rows.jsonl, $OUT/split_logs.tar.xz
# FC_SPLIT_W2 / FC_SPLIT_W4: the pulling-CTA counts per world (0: the table's own); worlds the
# GPU count allows. FC_SPLIT_SHAPES_W2 / FC_SPLIT_SHAPES_W4: fused_bench --shape filters
# (default: run 14's target misses and their neighbours). FC_SPLIT_ROUNDS=2 runs the counts
# again in reverse order (a drift in the GPUs' state then shows as a disagreement).
# FC_SPLIT_WORLDS: default "2 4". FC_SPLIT_SUSTAIN_MS: default 500.
set -uo pipefail
cd "$(dirname "$0")/../../.."
source kernels/bench/fused/builds_lib.sh
if [ "${1:-run}" = build ]; then
  # One build per variant (name=nvcc flags; the first is the reference), each with its own
  # gpu_fused_test, which the run calls first for every variant but the first.
  # shellcheck disable=SC2086  # FC_SPLIT_BUILDS: words on purpose
  fused_variants build/split split "" ${FC_SPLIT_BUILDS:-base=} || exit 1
  variant_tests build/split split || exit 1
  pack_builds build/split; exit $?
fi
unpack_builds build/split || exit 1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/split_out}; logs=$OUT/split_logs; mkdir -p "$logs"
ngpu=$(nvidia-smi -L | wc -l)
sus=${FC_SPLIT_SUSTAIN_MS:-500}
echo "commit $(cat build/split/commit.txt), $ngpu GPUs, sustain $sus ms"
counts() { if [ "$1" = 2 ]; then echo "${FC_SPLIT_W2:-0 8 12 16 24 32}"; else echo "${FC_SPLIT_W4:-0 16 24 32 48 64}"; fi; }
shapes() {
  if [ "$1" = 2 ]; then echo "${FC_SPLIT_SHAPES_W2:-S=8192|S=16384|8b M=16384|70b M=2048}"
  else echo "${FC_SPLIT_SHAPES_W4:-S=8192|S=16384|8b M=16384|70b M=2048|70b M=4096}"; fi
}
variants=$(cat build/split/order.txt)
# Every variant but the reference passes gpu_fused_test (W = 1 to the GPU count) before it is timed.
for v in $(echo "$variants" | tail -n +2); do
  fused_test "build/split/$v/gpu_fused_test" "$logs/test_$v.log" "$v" 300 ||
    variants=$(echo "$variants" | grep -vx "$v")
done
one() {  # variant world ctas round
  local v=$1 w=$2 c=$3 k=$4 extra=()
  [ "$c" != 0 ] && extra=(--ctas "$c")
  timeout 240 "build/split/$v/fused_bench" --world "$w" --ops ag --batches 3 --sustain-ms "$sus" \
    --shape "$(shapes "$w")" "${extra[@]}" --out "$logs/w${w}_${v}_c${c}_r$k.jsonl" \
    > "$logs/w${w}_${v}_c${c}_r$k.log" 2>&1
  echo "W=$w $v ctas=$c round $k rc=$? ($(date +%T))"
}
for w in ${FC_SPLIT_WORLDS:-2 4}; do
  [ "$w" -le "$ngpu" ] || continue
  for c in $(counts "$w"); do for v in $variants; do one "$v" "$w" "$c" 1; done; done
  if [ "${FC_SPLIT_ROUNDS:-1}" -ge 2 ]; then
    for c in $(counts "$w" | tr ' ' '\n' | tac); do for v in $(echo "$variants" | tac); do one "$v" "$w" "$c" 2; done; done
  fi
done
cat "$logs"/*.jsonl > "$OUT/split_rows.jsonl" 2>/dev/null
python3 - "$logs" > "$OUT/split_table.txt" <<'PY'
import collections, glob, json, re, statistics, sys
# (world, shape) -> ctas label -> [(fused ms, gemm ms, pulling CTAs)] over rounds
cell = collections.defaultdict(lambda: collections.defaultdict(list))
for f in glob.glob(sys.argv[1] + "/*.jsonl"):
    m = re.search(r"w(\d+)_([A-Za-z0-9-]+)_c(\d+)_r(\d+)\.jsonl$", f)
    rows = collections.defaultdict(dict)
    for line in open(f):
        r = json.loads(line)
        rows[r["shape"]][r["impl"]] = r
    for shape, v in rows.items():
        if "ours_fused" in v and "ours_gemm" in v:
            fu = v["ours_fused"]
            label = (m.group(2), "table" if m.group(3) == "0" else m.group(3))
            cell[(int(m.group(1)), shape)][label].append((fu["ms_median"], v["ours_gemm"]["ms_median"], fu["comm_ctas"]))
print("allGatherGemm fused time / our GEMM alone (same process), sustained; per build variant and")
print("pulling-CTA count (table = kAgSplit's own count, in brackets); fused ms in parentheses;")
print("median over rounds")
for key in sorted(cell):
    w, shape = key
    parts = []
    def order(l): return (l[0], -1 if l[1] == "table" else int(l[1]))
    best = None
    for label in sorted(cell[key], key=order):
        xs = cell[key][label]
        ratio = statistics.median(f / g for f, g, _ in xs)
        fused = statistics.median(f for f, _, _ in xs)
        name = label[0] + ":" + (f"table[{xs[0][2]}]" if label[1] == "table" else label[1])
        parts.append(f"{name} {ratio:.3f} ({fused:.4f})")
        if best is None or ratio < best[1]:
            best = (name, ratio)
    print(f"W={w} {shape:<20} " + "  ".join(parts) + f"   best: {best[0]}")
PY
tar cJf "$OUT/split_logs.tar.xz" -C "$OUT" split_logs && rm -rf "$logs"
cat "$OUT/split_table.txt"
