#!/usr/bin/env bash
# The memory-model review's fences (twentieth session), one device call on one GPU:
# correctness of the new build (gemm_test: the sink's system-scope atomics; gpu_fused_test with
# every rank on the GPU, W = 1-4: the pusher's __syncwarp and proxy fences), then the phantom
# peer (rank 0 of W = 2, pushes and pulls into its own memory) old against new, the order
# rotated each round, TP-2 shapes, bf16 partials.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/mmf_out}; mkdir -p "$OUT"
[ -d build/mmf ] || tar xJf build/mmf.tar.xz -C build
B=build/mmf
timeout 150 $B/gemm-new/gemm_test > "$OUT/gemm_test.log" 2>&1; echo "gemm_test rc=$?"; tail -3 "$OUT/gemm_test.log"
OUT=$OUT executor-native/tests/device/shared_gpu_run.sh $B/fused-new 4 fused | tail -2
orders=("ph-old ph-new" "ph-new ph-old" "ph-old ph-new" "ph-new ph-old")
for r in 1 2 3 4; do
  [ $SECONDS -lt 430 ] || { echo "stopping before round $r at $SECONDS s"; break; }
  for side in ${orders[$((r-1))]}; do
    timeout 150 $B/$side/fused_bench --world 1 --tp 2 --phantom-world 2 --ops ag,rs --rs-partials bf16 \
      --batches 5 --out "$OUT/fb_${side}_$r.jsonl" > "$OUT/fb_${side}_$r.log" 2>&1 || echo "fused_bench $side rc=$?"
  done
  echo "round $r done at $SECONDS s"
done
python3 - "$OUT" <<'PY'
import json, glob, statistics, sys, collections
out = sys.argv[1]
t = collections.defaultdict(list)
for f in sorted(glob.glob(f"{out}/fb_*.jsonl")):
    side = f.split("fb_")[1].rsplit("_", 1)[0]
    for l in open(f):
        if l.startswith("{"):
            r = json.loads(l)
            if r["impl"] in ("ours_fused", "ours_gemm"):
                t[(r["op"], r["shape"], r["impl"], side)].append(r["ms_median"] * 1000)
print("phantom W=2, TP-2 shapes, bf16 partials; median over rounds (us); new/old")
ratios = collections.defaultdict(list)
for (op, lab, impl, side) in sorted(k for k in t if k[3] == "ph-old"):
    o, n = statistics.median(t[(op, lab, impl, "ph-old")]), statistics.median(t.get((op, lab, impl, "ph-new"), [float("nan")]))
    ratios[(op, impl)].append(n / o)
    print(f"{op[:17]:17} {lab[:24]:24} {impl:11} old {o:9.1f} new {n:9.1f}  {n/o:6.3f}  (rounds {len(t[(op, lab, impl, 'ph-old')])})")
for k, v in sorted(ratios.items()):
    g = statistics.geometric_mean(v) if all(x == x for x in v) else float("nan")
    print(f"geomean new/old {k[0]} {k[1]}: {g:.3f} (min {min(v):.3f}, max {max(v):.3f}, {len(v)} shapes)")
PY
cd "$OUT" && tar cJf mmf_logs.tar.xz *.log *.jsonl && rm -f fb_*.log fb_*.jsonl; ls "$OUT"
