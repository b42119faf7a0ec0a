#!/usr/bin/env bash
# PDL for the fused kernels (cooperative + programmatic stream serialization): correctness with
# a negative control, and A/B (off = -DFC_NO_PDL) on one GPU at world 1, TP-2 local shapes.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/fpdl_out}; mkdir -p "$OUT"
(cd build && tar xJf fpdlrun.tar.xz)
B=build/fpdlrun
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
t0=$SECONDS; timeout 200 $B/on/gpu_fused_test > "$OUT/fused_test_on_w1.log" 2>&1
echo "gpu_fused_test w1 rc=$? ($((SECONDS-t0)) s)"; grep -E "^== world|FAIL|PASS" "$OUT/fused_test_on_w1.log" | head -5
timeout 120 $B/neg/gpu_fused_test > "$OUT/fused_test_neg_w1.log" 2>&1
echo "NEG gpu_fused_test w1 rc=$?"; grep -E "FAIL|PASS" "$OUT/fused_test_neg_w1.log" | head -6
mkdir -p $B/tst; cp $B/on/gpu_fused_test $B/tst/
OUT=$OUT executor-native/tests/device/shared_gpu_run.sh $B/tst 3 fused 2>&1 | tail -3
t0=$SECONDS; FC_TEST_SHARED_GPU=2 FC_TEST_HOSTS=2 FC_TEST_LOCAL=1 timeout 200 $B/on/gpu_runtime_hosts_test > "$OUT/hosts_test_2x1.log" 2>&1
echo "gpu_runtime_hosts_test 2x1 shared rc=$? ($((SECONDS-t0)) s)"; grep -E "FAIL|PASS" "$OUT/hosts_test_2x1.log" | tail -3
echo "speed at $SECONDS s"
for r in 1 2 3; do for side in off on; do
  $B/$side/fused_bench --world 1 --tp 2 --shape llama3-8b --ops ag,rs --rs-partials bf16 --out "$OUT/fb_${side}_$r.jsonl" > "$OUT/fb_${side}_$r.log" 2>&1 || echo "fused_bench $side failed"
  $B/$side/fused_bench --world 1 --tp 2 --shape "square S=8192" --ops ag,rs --rs-partials bf16 --out "$OUT/fs_${side}_$r.jsonl" > "$OUT/fs_${side}_$r.log" 2>&1 || echo "fused_bench sq $side failed"
done; echo "round $r at $SECONDS s"; done
python3 - "$OUT" <<'PY'
import json, glob, statistics, sys, collections
out = sys.argv[1]
fb = collections.defaultdict(list)
for f in sorted(glob.glob(f"{out}/f[bs]_*.jsonl")):
    side = f.split("_")[-2]
    for l in open(f):
        if l.startswith("{"):
            r = json.loads(l); fb[(r["op"], r["shape"] if "shape" in r else r.get("label", ""), r["M"], r["impl"], side)].append(r["ms_median"] * 1000)
print("fused_bench W=1 TP2, bf16 partials: median over 3 runs, us (on = PDL); runs off | on")
for (op, lab, M, impl, side) in sorted(k for k in fb if k[4] == "off"):
    a = fb[(op, lab, M, impl, "off")]; b = fb.get((op, lab, M, impl, "on"), [float("nan")])
    ma, mb = statistics.median(a), statistics.median(b)
    print(f"{op[:6]:6} {lab[:22]:22} {impl:16} {ma:8.1f} {mb:8.1f} {mb/ma:6.3f}  {' '.join(f'{x:.1f}' for x in a)} | {' '.join(f'{x:.1f}' for x in b)}")
PY
cd "$OUT" && tar cJf fpdl_logs.tar.xz *.log *.jsonl gpu.txt && rm -f *.log *.jsonl; ls "$OUT"
