#!/usr/bin/env bash
# PDL for the fused kernels, second call: the negative control with a rank on the GPU
# (FC_TEST_SHARED_GPU=1), and a 3-way A/B with the order rotated each round (the first call ran
# off before on every round: a clock drift would read as a loss). head = HEAD (GEMM and
# collectives early, fused not), on = all early, off = -DFC_NO_PDL.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/fpdl_out}; mkdir -p "$OUT"
(cd build && tar xJf fpdlrun2.tar.xz)
B=build/fpdlrun2
FC_TEST_SHARED_GPU=1 timeout 120 $B/neg/gpu_fused_test > "$OUT/fused_test_neg_shared_w1.log" 2>&1
echo "NEG gpu_fused_test shared w1 rc=$?"; grep -E "FAIL|PASS" "$OUT/fused_test_neg_shared_w1.log" | head -6
orders=("off head on" "on off head" "head on off" "on head off")
for r in 1 2 3 4; do for side in ${orders[$((r-1))]}; do
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
            r = json.loads(l); fb[(r["op"], r["shape"], r["impl"], side)].append(r["ms_median"] * 1000)
print("fused_bench W=1 TP2 bf16 partials, median of 4 runs (us); on/head, head/off, on/off")
for (op, lab, impl, side) in sorted(k for k in fb if k[3] == "off"):
    m = {s: statistics.median(fb[(op, lab, impl, s)]) for s in ("off", "head", "on")}
    print(f"{op[:6]:6} {lab[:22]:22} {impl:16} off {m['off']:8.1f} head {m['head']:8.1f} on {m['on']:8.1f}  on/head {m['on']/m['head']:6.3f} head/off {m['head']/m['off']:6.3f} on/off {m['on']/m['off']:6.3f}")
PY
cd "$OUT" && tar cJf fpdl2_logs.tar.xz *.log *.jsonl && rm -f *.log *.jsonl; ls "$OUT"
