#!/usr/bin/env bash
# World 1's decomposed path without its collective (twenty-first session), one device call on
# one GPU, binaries built on the CPU machine (build/w1.tar.xz): gpu_fused_test with every rank
# on the GPU (W = 1-3; world 1 runs the whole sweep, back-to-back and graph replay through the
# new path), then fused_bench at world 1 with the TP-2 and TP-4 local shapes, bf16 partials:
# ours_decomposed (now launch_gemm alone, plus the gathered copy for allGatherGemm) against
# ours_gemm and ours_fused, per shape.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/w1_out}; mkdir -p "$OUT"
[ -d build/w1 ] || tar xJf build/w1.tar.xz -C build
OUT=$OUT executor-native/tests/device/shared_gpu_run.sh build/w1 3 fused | tail -2
for tp in 2 4; do
  timeout 200 build/w1/fused_bench --world 1 --tp $tp --ops ag,rs --rs-partials bf16 --batches 5 \
    --out "$OUT/w1_tp$tp.jsonl" > "$OUT/w1_tp$tp.log" 2>&1; echo "fused_bench tp=$tp rc=$?"
done
python3 - "$OUT" <<'PY'
import json, sys, glob, collections, statistics
t = collections.defaultdict(dict)
for f in sorted(glob.glob(f"{sys.argv[1]}/w1_tp*.jsonl")):
    for l in open(f):
        r = json.loads(l)
        t[(r["tp"], r["op"], r["shape"])][r["impl"]] = r["ms_median"] * 1000
print("world 1, bf16 partials (us): decomposed/gemm, fused/gemm")
rd, rf = collections.defaultdict(list), collections.defaultdict(list)
for (tp, op, shape), v in t.items():
    g = v["ours_gemm"]
    rd[op].append(v["ours_decomposed"] / g); rf[op].append(v["ours_fused"] / g)
    print(f"tp{tp} {op[:17]:17} {shape[:20]:20} gemm {g:8.1f} decomposed {v['ours_decomposed']:8.1f} "
          f"({v['ours_decomposed']/g:.3f}) fused {v['ours_fused']:8.1f} ({v['ours_fused']/g:.3f})")
for op in rd:
    print(f"{op}: decomposed/gemm geomean {statistics.geometric_mean(rd[op]):.3f} "
          f"({min(rd[op]):.3f}-{max(rd[op]):.3f}); fused/gemm {statistics.geometric_mean(rf[op]):.3f} "
          f"({min(rf[op]):.3f}-{max(rf[op]):.3f})")
PY
