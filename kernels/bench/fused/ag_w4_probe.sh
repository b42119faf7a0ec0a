#!/usr/bin/env bash
# One device call on a 4-GPU host: why the fused allGatherGemm at W = 4 is slow or bimodal
# below 128 MiB (NOTES.md "Run 10"), and where SM-driven NVLink transfers top out per pattern
# (the 4-GPU allReduce's gap to NCCL: kernels/bench/NOTES.md). Carries build/w4probe.tar.xz
# (make it here: `kernels/bench/fused/ag_w4_probe.sh build`). Writes under $OUT:
#   nvlink_probe.txt  kernels/bench/probes/nvlink_probe.cu: ring / all-peer, push / pull, CTAs
#   agtrace.txt       the AG trace build: per rank, an isolated launch and one after 20
#                     back-to-back launches (pullers' start/end/SM, chunk flags, tile waits)
#   bench_p{1,2}.log  two bench processes, --ops ag, per-batch times of every rank (modes)
#   bench_ctas.log    8B and 70B M = 2048 with 12 and 48 pulling CTAs
#   rows.tar.xz       the JSON rows
set -uo pipefail
cd "$(dirname "$0")/../../.."
if [ "${1:-run}" = build ]; then
  set -e
  kernels/bench/fused/build.sh build/pab-def > /dev/null
  FC_NVCC_FLAGS=-DFUSEDCOMM_AG_TRACE kernels/bench/fused/build.sh build/agtrace > /dev/null
  nvcc -O3 -std=c++17 -arch=sm_90a -o build/nvlink_probe kernels/bench/probes/nvlink_probe.cu
  rm -rf build/w4probe && mkdir -p build/w4probe
  cp build/pab-def/fused_bench build/w4probe/fused_bench
  cp build/agtrace/fused_bench build/w4probe/fused_bench_agtrace
  cp build/nvlink_probe build/w4probe/
  strip --strip-unneeded build/w4probe/*
  git rev-parse --short HEAD > build/w4probe/commit.txt
  tar cJf build/w4probe.tar.xz -C build w4probe
  du -sh build/w4probe.tar.xz; exit 0
fi
[ -d build/w4probe ] || tar xJf build/w4probe.tar.xz -C build || { echo "no build/w4probe.tar.xz"; exit 1; }
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/w4probe_out}; mkdir -p "$OUT"
b=build/w4probe
echo "commit $(cat $b/commit.txt), $(nvidia-smi -L | wc -l) GPUs"
timeout 90 $b/nvlink_probe > "$OUT/nvlink_probe.txt" 2>&1; echo "nvlink_probe rc=$?"
tail -12 "$OUT/nvlink_probe.txt"
timeout 150 $b/fused_bench_agtrace --world 4 --ops ag --quick --batches 1 --batch-ms 5 \
  --out /tmp/agtrace_rows.jsonl > "$OUT/agtrace.txt" 2>&1; echo "agtrace rc=$?"
grep -E '^ag_trace' "$OUT/agtrace.txt" | grep 'rank 0' | cut -c1-200
for i in 1 2; do
  timeout 120 $b/fused_bench --world 4 --ops ag --batches 9 --print-batches \
    --out "$OUT/rows_p$i.jsonl" > "$OUT/bench_p$i.log" 2>&1; echo "bench p$i rc=$?"
done
for c in 12 48; do for s in "8b M=2048" "70b M=2048"; do
  timeout 60 $b/fused_bench --world 4 --ops ag --batches 5 --ctas $c --shape "$s" --print-batches \
    --out "$OUT/rows_ctas$c.jsonl" >> "$OUT/bench_ctas.log" 2>&1; echo "ctas $c $s rc=$?"
done; done
# fused / decomposed per process (rank 0's medians)
python3 - "$OUT" <<'PY'
import json, sys, glob, collections
out = sys.argv[1]
for f in sorted(glob.glob(out + "/rows_*.jsonl")):
    d = collections.defaultdict(dict)
    for line in open(f):
        r = json.loads(line)
        d[r["shape"]][r["impl"]] = r["ms_median"]
    print(f.split("/")[-1])
    for k, v in d.items():
        if "ours_fused" in v and "ours_decomposed" in v:
            print(f"  {k:<22} fused {v['ours_fused']:.4f} decomp {v['ours_decomposed']:.4f} ratio {v['ours_fused']/v['ours_decomposed']:.3f}")
PY
tar cJf "$OUT/rows.tar.xz" -C "$OUT" $(cd "$OUT" && ls rows_*.jsonl) && rm -f "$OUT"/rows_*.jsonl
ls "$OUT"
