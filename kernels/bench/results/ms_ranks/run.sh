#!/usr/bin/env bash
# The fused bench's per-rank medians (twenty-first session), one device call on one GPU, with
# build/pab.tar.xz: fused_bench at W = 2 with both ranks on the GPU (--shared-gpu: the bench's
# mechanics, timings meaningless), fused_bench and torch_baselines.py at world 1, report.py on
# the world-1 rows. Prints each row's ms_ranks, then the report's gemmReduceScatter table.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/msr_out}; mkdir -p "$OUT"
[ -d build/pab ] || tar xJf build/pab.tar.xz -C build
B=build/pab/pusher; echo "pab commit $(cat build/pab/commit.txt)"
timeout 200 $B/fused_bench --world 2 --shared-gpu --quick --ops ag,rs --rs-partials bf16 --batches 3 \
  --out "$OUT/ours_w2_shared.jsonl" > "$OUT/ours_w2_shared.log" 2>&1; echo "fused_bench W=2 shared rc=$?"
timeout 150 $B/fused_bench --world 1 --quick --ops ag,rs --rs-partials bf16 --batches 3 \
  --out "$OUT/ours_w1.jsonl" > "$OUT/ours_w1.log" 2>&1; echo "fused_bench W=1 rc=$?"
timeout 200 torchrun --nproc-per-node 1 kernels/bench/fused/torch_baselines.py --quick --ops ag,rs --batches 3 \
  --out "$OUT/torch_w1.jsonl" > "$OUT/torch_w1.log" 2>&1; echo "torch_baselines W=1 rc=$?"
python3 - "$OUT" <<'PY'
import json, sys
for name in ("ours_w2_shared", "ours_w1", "torch_w1"):
    for l in open(f"{sys.argv[1]}/{name}.jsonl"):
        r = json.loads(l)
        print(f"{name:15} {r['op'][:17]:17} {r['shape'][:20]:20} {r['impl']:16} ms_median {r['ms_median']:.4f} ms_ranks {r.get('ms_ranks')}")
PY
python3 kernels/bench/fused/report.py --out-dir "$OUT/report" --device "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) x1" \
  --commit "$(cat build/pab/commit.txt)" "$OUT/ours_w1.jsonl" "$OUT/torch_w1.jsonl" > /dev/null; echo "report rc=$?"
grep -A8 "## gemmReduceScatter" "$OUT/report/fused_results.md"
