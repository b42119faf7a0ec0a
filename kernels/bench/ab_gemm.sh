#!/usr/bin/env bash
# A/B timing of two gemm_bench builds (say, before and after an engine change) on one shapes
# file, in the same device call, alternating rounds so that clock and temperature drift hit
# both builds alike:
#   kernels/bench/ab_gemm.sh <dirA>[@cluster[:stream_k[:pingpong]]] <dirB>[@...] <shapes.txt> [rounds=3] [iters=50]
# <dir> holds a gemm_bench (kernels/bench/build_gemm.sh <dir>); @cluster passes GemmArgs::cluster
# (0 chosen, 1 single CTAs, 2 CTA pairs) to it, and :stream_k GemmArgs::stream_k with a
# workspace (0 chosen, 1 off, 2 forced; none without it or with -1), and :pingpong
# GemmArgs::pingpong (0 chosen, 1 off, 2 wherever allowed), so one build can be both sides. Writes $OUT/ab_gemm.jsonl (every
# round's line, tagged "build": "A"/"B", "round") and prints per shape the median over rounds
# of each build's median time and B/A (< 1: B faster).
set -uo pipefail
a=${1:?dirA}; b=${2:?dirB}; shapes=${3:?shapes}; rounds=${4:-3}; iters=${5:-50}
OUT=${OUT:-/tmp/ab_out}; mkdir -p "$OUT"
log="$OUT/ab_gemm.jsonl"; : > "$log"
for r in $(seq 1 "$rounds"); do
  for side in A B; do
    spec=$a; [ $side = B ] && spec=$b
    dir=${spec%@*}; opts=0; [ "$dir" != "$spec" ] && opts=${spec##*@}
    IFS=: read -r cluster sk pp <<< "$opts"
    "$dir/gemm_bench" "$shapes" 10 "$iters" "${cluster:-0}" "${sk:--1}" "${pp:-0}" | sed "s/^{/{\"build\": \"$side\", \"round\": $r, /" >> "$log" \
      || { echo "gemm_bench ($side) failed"; exit 1; }
  done
done
python3 - "$log" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
key = lambda r: (r["op"], r["M"], r["N"], r["K"], r["layout"], r.get("c_dtype", "bf16"))
shapes = list(dict.fromkeys(key(r) for r in rows))
print(f"{'shape':44} {'C':4} {'A ms':>9} {'B ms':>9} {'B/A':>6} {'A TF/s':>7} {'B TF/s':>7} {'A spread':>8} {'B spread':>8} {'A tile/sk':>9} {'B tile/sk':>9}")
plan = lambda k, s: next((f"{r.get('tile_n', 0)}/{r.get('stream_k_tiles', 0)}" + ("p" if r.get("pingpong") else "") for r in rows
                          if key(r) == k and r["build"] == s), "-")
for k in shapes:
    t = {s: [r["ms_median"] for r in rows if key(r) == k and r["build"] == s] for s in "AB"}
    if not t["A"] or not t["B"]:
        continue
    ma, mb = statistics.median(t["A"]), statistics.median(t["B"])
    fl = 2.0 * k[1] * k[2] * k[3]
    spread = lambda v, m: (max(v) - min(v)) / m
    print(f"{k[0]+' '+str(k[1])+'x'+str(k[2])+'x'+str(k[3])+' '+k[4]:44} {k[5]:4} {ma:9.4f} {mb:9.4f} "
          f"{mb/ma:6.3f} {fl/ma/1e9:7.1f} {fl/mb/1e9:7.1f} {spread(t['A'], ma):8.3f} {spread(t['B'], mb):8.3f} "
          f"{plan(k, 'A'):>9} {plan(k, 'B'):>9}")
PY
