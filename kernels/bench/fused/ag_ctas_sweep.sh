#!/usr/bin/env bash
# One device call (4-GPU host): allGatherGemm fused against decomposed (ours only) at W = 4 and
# W = 2, over the longest sleep between the GEMM's chunk-flag polls (build switch
# FUSEDCOMM_CHUNK_POLL_CAP_NS, one binary per cap in FC_CAPS) and the number of pulling CTAs,
# to set them and the fused bar in kernels/src/fused.cu (fused/NOTES.md "Run 11"). Carries
# build/agsweep.tar.xz (`kernels/bench/fused/ag_ctas_sweep.sh build` here). $OUT: sweep.txt
# (the table), logs.tar.xz.
set -uo pipefail
cd "$(dirname "$0")/../../.."
if [ "${1:-run}" = build ]; then
  set -e
  rm -rf build/agsweep && mkdir -p build/agsweep
  for cap in ${FC_CAPS:-1024 4096 8192 16384}; do
    FC_NVCC_FLAGS=-DFUSEDCOMM_CHUNK_POLL_CAP_NS=$cap kernels/bench/fused/build.sh build/agcap$cap > /dev/null
    cp build/agcap$cap/fused_bench build/agsweep/fused_bench_cap$cap
  done
  # every fused wait backing off to 8 us (gemmReduceScatter's waits for the peers' flags too)
  FC_NVCC_FLAGS="-DFUSEDCOMM_CHUNK_POLL_CAP_NS=8192 -DFUSEDCOMM_POLL_CAP_NS=8192" kernels/bench/fused/build.sh build/agall8192 > /dev/null
  cp build/agall8192/fused_bench build/agsweep/fused_bench_all8192
  strip --strip-unneeded build/agsweep/*
  git rev-parse --short HEAD > build/agsweep/commit.txt
  tar cJf build/agsweep.tar.xz -C build agsweep; du -sh build/agsweep.tar.xz; exit 0
fi
[ -d build/agsweep ] || tar xJf build/agsweep.tar.xz -C build || { echo "no build/agsweep.tar.xz"; exit 1; }
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/agsweep_out}; mkdir -p "$OUT/logs"
b=build/agsweep
echo "commit $(cat $b/commit.txt), $(nvidia-smi -L | wc -l) GPUs"
run() {  # name world binary [extra args]
  local name=$1 w=$2 bin=$3; shift 3
  timeout 100 $b/$bin --world $w --ops ${OPS:-ag} --rs-partials bf16 --batches 5 --print-batches --out "$OUT/logs/$name.jsonl" "$@" \
    > "$OUT/logs/$name.log" 2>&1; echo "$name rc=$?"
}
# Run 11's first sweep (commit 8892e8a; results/run11_h200x4/ag_ctas_poll_sweep.txt): pulling
# CTAs 24-64 at cap 1024, and cap 8192 at 24 and 48. This one: the cap at the split table's CTAs.
for cap in 4096 8192 16384; do run w4_cap$cap 4 fused_bench_cap$cap; done
run w4_cap8192_c48 4 fused_bench_cap8192 --ctas 48 --shape S=
for cap in 1024 4096 8192; do run w2_cap$cap 2 fused_bench_cap$cap; done
for w in 4 2; do  # gemmReduceScatter, bf16 partials: every fused wait at 1 us against 8 us
  OPS=rs run rs_w${w}_cap1024 $w fused_bench_cap1024; OPS=rs run rs_w${w}_all8192 $w fused_bench_all8192
done
python3 - "$OUT/logs" > "$OUT/sweep.txt" <<'PY'
import json, sys, glob, collections
rows = collections.defaultdict(dict)   # shape -> config -> (fused, decomp)
cfgs = []
for f in sorted(glob.glob(sys.argv[1] + "/*.jsonl")):
    name = f.split("/")[-1][:-6]; cfgs.append(name)
    d = collections.defaultdict(dict)
    for line in open(f):
        r = json.loads(line); d[r["shape"]][r["impl"]] = r
    for s, v in d.items():
        if "ours_fused" in v and "ours_decomposed" in v:
            rows[(v["ours_fused"]["op"][:5], v["ours_fused"]["world"], s)][name] = (v["ours_fused"]["ms_median"], v["ours_decomposed"]["ms_median"], v["ours_fused"]["comm_ctas"])
print("fused / decomposed (rank 0 medians of 5 batches); [P] = pulling CTAs; fused ms")
for (op, w, s) in sorted(rows):
    line = f"{op} W={w} {s:<20}"
    for c in cfgs:
        if c in rows[(op, w, s)]:
            fu, de, p = rows[(op, w, s)][c]
            line += f"  {c}[{p}] {fu/de:.3f} ({fu:.3f})"
    print(line)
PY
cat "$OUT/sweep.txt"
tar cJf "$OUT/logs.tar.xz" -C "$OUT" logs && rm -rf "$OUT/logs"
