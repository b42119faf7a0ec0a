#!/usr/bin/env bash
# A/B of the pusher's pacing (-DFUSEDCOMM_RS_PUSH_PACE_NS, fused_gemm.cuh) for the fused
# gemmReduceScatter at W = 2 over NVLink, in one device call (~5 min on 2 x H200):
#   build (CPU machine): kernels/bench/fused/pace_ab.sh build [name=FLAGS ...]  -> build/pace.tar.xz
#   run   (GPU host):    kernels/bench/fused/pace_ab.sh run [rounds=2] [world=2]  -> $OUT/pace/*
# Runs local_run.sh over the builds round by round (bf16 and fp32 partials, or FC_PACE_PARTIALS;
# the 12 TP-2 shapes)
# and prints per shape and partials each build's median fused time over the first build's, and
# its fused / GEMM.
set -uo pipefail
cd "$(dirname "$0")/../../.."
here=kernels/bench/fused
out=build/pace
. $here/builds_lib.sh
if [ "${1:-run}" = build ]; then
  # Builds as name=FLAGS, in the order given (the first is the reference); by default fixed paces.
  shift; builds=("$@"); [ ${#builds[@]} -gt 0 ] || builds=(p0= p300=-DFUSEDCOMM_RS_PUSH_PACE_NS=300 \
    p500=-DFUSEDCOMM_RS_PUSH_PACE_NS=500 p1000=-DFUSEDCOMM_RS_PUSH_PACE_NS=1000)
  fused_variants $out pace "" "${builds[@]}" || exit 1
  pack_builds $out; exit
fi
unpack_builds $out || exit 1
OUT=${OUT:-/tmp/pace_out}; o=$OUT/pace; mkdir -p "$o"
echo "commit $(cat $out/commit.txt)"
bins=$(sed "s|^|$out/|" $out/order.txt | tr '\n' ' ')
OUT=$o FC_DEADLINE_S=420 $here/local_run.sh "$bins" "${2:-2}" rs "${FC_PACE_PARTIALS:-bf16 f32}" full "${3:-2}" > "$o/local_report.md"
python3 - "$o/local.jsonl" <<'PY'
import json, statistics, sys
rows, builds = {}, []
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r["build"] not in builds:
        builds.append(r["build"])
    rows.setdefault((r["partials"], r["shape"], r["build"], r["impl"]), []).append(r["ms_median"])
med = {k: statistics.median(v) for k, v in rows.items()}
keys = []
for (p, s, _, _) in rows:
    if (p, s) not in keys:
        keys.append((p, s))
b0 = builds[0]
print("fused ms: first build; then each build's fused time / the first's (fused / GEMM in brackets)")
print(f"{'partials':8} {'shape':20} {b0 + ' ms':>10}" + "".join(f"{b:>16}" for b in builds))
for p, s in keys:
    f0 = med.get((p, s, b0, "ours_fused"))
    line = f"{p:8} {s:20} {f0:10.4f}"
    for b in builds:
        f, g = med.get((p, s, b, "ours_fused")), med.get((p, s, b, "ours_gemm"))
        line += f"{f / f0:9.3f} ({f / g:.2f})" if f and g and f0 else f"{'-':>16}"
    print(line)
PY
