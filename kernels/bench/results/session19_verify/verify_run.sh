#!/usr/bin/env bash
# Session 19 verification on one GPU, after the 5 staging calls: Java/Spark at world 1 with
# this session's JNI and DeviceComm; the pab build's tests with ranks sharing the GPU; the
# end-barrier refactor's A/B (coll_bench old = 487dd5c, new = pab); the PyTorch scripts through
# bench_common at world 1.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/verify_out}; mkdir -p "$OUT"
t0=$SECONDS
OUT=$OUT/java timeout 300 spark-plugin/bench/gpu_java_run.sh run 1 > "$OUT/java_run.log" 2>&1
echo "java run 1 rc=$? ($((SECONDS-t0)) s)"; grep -E "tests (successful|failed)|PASSED|FAILED|overhead|GPU-|rc=" "$OUT/java_run.log" | head -20
[ -d build/pab ] || tar xJf build/pab.tar.xz -C build
echo "pab commit $(cat build/pab/commit.txt)"
mkdir -p build/pab/tst && cp build/pab/pusher/gpu_fused_test build/pab/coll/gpu_collectives_test build/pab/tst/
OUT=$OUT executor-native/tests/device/shared_gpu_run.sh build/pab/tst 3 all 2>&1 | tail -2
t1=$SECONDS; FC_TEST_SHARED_GPU=2 FC_TEST_HOSTS=2 FC_TEST_LOCAL=1 timeout 200 build/pab/gpu_runtime_hosts_test > "$OUT/hosts_test_2x1.log" 2>&1
echo "gpu_runtime_hosts_test 2x1 shared rc=$? ($((SECONDS-t1)) s)"; grep -E "copies|FAIL|PASS" "$OUT/hosts_test_2x1.log" | tail -4
echo "A/B at $SECONDS s"
orders=("old new" "new old" "old new")
for r in 1 2 3; do for side in ${orders[$((r-1))]}; do
  b=build/collold/coll_bench; [ $side = new ] && b=build/pab/coll/coll_bench
  timeout 100 $b --world 1 --min-bytes 1048576 --max-bytes 268435456 --ops ag,rs,ar --algos 2,4 --label $side --out "$OUT/cb_${side}_$r.jsonl" > "$OUT/cb_${side}_$r.log" 2>&1 || echo "coll_bench $side rc=$?"
done; done
python3 - "$OUT" <<'PY'
import json, glob, statistics, sys, collections
out = sys.argv[1]; t = collections.defaultdict(list)
for f in sorted(glob.glob(f"{out}/cb_*.jsonl")):
    side = f.split("_")[-2]
    for l in open(f):
        if l.startswith("{"):
            r = json.loads(l); t[(r["op"], r.get("algo", "?"), r["bytes"], side)].append(r["ms_median"] * 1000)
print("coll_bench W=1 forced algos, us, median of 3: old (487dd5c) | new | new/old")
for (op, al, b, s) in sorted(k for k in t if k[3] == "old"):
    a, c = statistics.median(t[(op, al, b, "old")]), statistics.median(t.get((op, al, b, "new"), [float("nan")]))
    print(f"{op:14} {str(al):10} {b:10} {a:9.2f} {c:9.2f} {c/a:6.3f}")
PY
echo "torch at $SECONDS s"
timeout 120 torchrun --nproc-per-node 1 kernels/bench/collectives/nccl_bench.py --out "$OUT/nccl_w1.jsonl" --max-bytes 1048576 --ops ar > "$OUT/nccl_w1.log" 2>&1; echo "nccl_bench w1 rc=$? rows $(wc -l < $OUT/nccl_w1.jsonl)"
python3 kernels/bench/collectives/report.py --out-dir "$OUT/rep" --prefix nccl_only "$OUT/nccl_w1.jsonl" > "$OUT/report.log" 2>&1; echo "report.py rc=$?"; ls "$OUT/rep"
timeout 150 torchrun --nproc-per-node 1 kernels/bench/fused/torch_baselines.py --out "$OUT/torch_w1.jsonl" --quick --ops ag > "$OUT/torch_w1.log" 2>&1; echo "torch_baselines w1 rc=$? rows $(wc -l < $OUT/torch_w1.jsonl 2>/dev/null)"; tail -3 "$OUT/torch_w1.log"
echo "end at $SECONDS s"
tar cJf /tmp/verify_logs.tar.xz -C "$OUT" . && rm -rf "$OUT"/* && mv /tmp/verify_logs.tar.xz "$OUT"/ && ls "$OUT"
