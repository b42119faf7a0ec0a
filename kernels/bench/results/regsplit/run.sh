#!/usr/bin/env bash
# The pusher-warp kernels' register split (twenty-first session), one device call on one GPU:
# gpu_fused_test of the new split with every rank on the GPU (W = 1-3), then the phantom peer
# (rank 0 of W = TP) old (40 / 232 registers) against new (56 / 224) for the gemmReduceScatter
# kernels that have pusher warps, order rotated each round: TP 2 fp32, TP 2 bf16, TP 4 fp32.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/regs_out}; mkdir -p "$OUT"
[ -d build/regs ] || tar xJf build/regs.tar.xz -C build
B=build/regs
OUT=$OUT executor-native/tests/device/shared_gpu_run.sh $B/test 3 fused | tail -2
orders=("old new" "new old" "old new" "new old")
for r in 1 2 3 4; do
  for cfg in "2 f32" "2 bf16" "4 f32"; do
    set -- $cfg
    for side in ${orders[$((r-1))]}; do
      [ $SECONDS -lt 500 ] || { echo "deadline: $side tp=$1 $2 round $r not run"; continue; }
      timeout 120 $B/$side/fused_bench --world 1 --tp $1 --phantom-world $1 --ops rs --rs-partials $2 \
        --batches 5 --out "$OUT/fb_${side}_tp$1_$2_$r.jsonl" > "$OUT/fb_${side}_tp$1_$2_$r.log" 2>&1 || echo "fused_bench $side rc=$?"
    done
  done
  echo "round $r done at $SECONDS s"
done
python3 - "$OUT" <<'PY'
import json, glob, statistics, sys, collections
out = sys.argv[1]
t = collections.defaultdict(list)
for f in sorted(glob.glob(f"{out}/fb_*.jsonl")):
    side, tp, part, _ = f.split("fb_")[1].rsplit(".", 1)[0].split("_")
    for l in open(f):
        if l.startswith("{"):
            r = json.loads(l)
            if r["impl"] in ("ours_fused", "ours_gemm"):
                t[(f"{tp} {part}", r["shape"], r["impl"], side)].append(r["ms_median"] * 1000)
print("phantom W = TP, gemmReduceScatter; median over rounds (us); new/old")
ratios = collections.defaultdict(list)
for (cfg, lab, impl, side) in sorted(k for k in t if k[3] == "old"):
    o, n = statistics.median(t[(cfg, lab, impl, "old")]), statistics.median(t.get((cfg, lab, impl, "new"), [float("nan")]))
    ratios[(cfg, impl)].append(n / o)
    print(f"{cfg:8} {lab[:26]:26} {impl:10} old {o:8.1f} new {n:8.1f}  {n/o:6.3f}  (rounds {len(t[(cfg, lab, impl, 'old')])})")
for k, v in sorted(ratios.items()):
    ok = [x for x in v if x == x]
    if ok:
        print(f"geomean new/old {k[0]} {k[1]}: {statistics.geometric_mean(ok):.3f} (min {min(ok):.3f}, max {max(ok):.3f}, {len(ok)} shapes)")
PY
cd "$OUT" && tar cJf regs_logs.tar.xz *.log *.jsonl && rm -f fb_*.log fb_*.jsonl; ls "$OUT"
