#!/usr/bin/env bash
# One device call (4-GPU host): allGatherGemm fused against decomposed (ours only) over the
# number of pulling CTAs at W = 4 and W = 2, and with the GEMM's chunk polls backing off to
# 8 us instead of 1 us (build switch FUSEDCOMM_CHUNK_POLL_CAP_NS), to set kAgSplit and the
# fused bar in kernels/src/fused.cu (NOTES.md "Run 11"). Carries build/agsweep.tar.xz
# (`kernels/bench/fused/ag_ctas_sweep.sh build` here). $OUT: sweep.txt (the table), logs.tar.xz.
set -uo pipefail
cd "$(dirname "$0")/../../.."
if [ "${1:-run}" = build ]; then
  set -e
  kernels/bench/fused/build.sh build/pab-def > /dev/null
  FC_NVCC_FLAGS=-DFUSEDCOMM_CHUNK_POLL_CAP_NS=8192 kernels/bench/fused/build.sh build/agpoll > /dev/null
  rm -rf build/agsweep && mkdir -p build/agsweep
  cp build/pab-def/fused_bench build/agsweep/fused_bench
  cp build/agpoll/fused_bench build/agsweep/fused_bench_poll8k
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
  timeout 100 $b/$bin --world $w --ops ag --batches 5 --print-batches --out "$OUT/logs/$name.jsonl" "$@" \
    > "$OUT/logs/$name.log" 2>&1; echo "$name rc=$?"
}
for c in 32 48 64; do run w4_c$c 4 fused_bench --ctas $c; done
run w4_default 4 fused_bench
for c in 24 48; do run w4_poll8k_c$c 4 fused_bench_poll8k --ctas $c; done
for c in 32 48; do run w2_c$c 2 fused_bench --ctas $c; done
run w2_default 2 fused_bench
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
            rows[(v["ours_fused"]["world"], s)][name] = (v["ours_fused"]["ms_median"], v["ours_decomposed"]["ms_median"], v["ours_fused"]["comm_ctas"])
print("fused / decomposed (rank 0 medians of 5 batches); [P] = pulling CTAs; fused ms")
for (w, s) in sorted(rows):
    line = f"W={w} {s:<20}"
    for c in cfgs:
        if c in rows[(w, s)]:
            fu, de, p = rows[(w, s)][c]
            line += f"  {c}[{p}] {fu/de:.3f} ({fu:.3f})"
    print(line)
PY
cat "$OUT/sweep.txt"
tar cJf "$OUT/logs.tar.xz" -C "$OUT" logs && rm -rf "$OUT/logs"
