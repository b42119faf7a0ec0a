#!/usr/bin/env bash
# A session's final check on a one-GPU host, in one device call, with what the multi-GPU runbook
# carries (docs/gpu-runs-owed.md): build/pab.tar.xz and .fcbundle (the Java bundle's five parts
# staged first, spark-plugin/bench/gpu_java_run.sh stage N). Runs Java/Spark at world 1 and
# between two virtual hosts (gpu_java_run.sh run 1), gpu_collectives_test and gpu_fused_test with
# every rank on the GPU (W = 1..max_world, default 3), and gpu_runtime_hosts_test as 2 hosts x 1
# rank sharing it. Logs: $OUT/verify_logs.tar.xz; a summary is printed.
#   kernels/bench/verify_one_gpu.sh [max_world=3]
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/verify_out}; mkdir -p "$OUT"
world=${1:-3}
t0=$SECONDS
OUT=$OUT/java timeout 300 spark-plugin/bench/gpu_java_run.sh run 1 > "$OUT/java_run.log" 2>&1
echo "java run 1 rc=$? ($((SECONDS-t0)) s)"; grep -E "tests (successful|failed)|overhead|check passed|rc=" "$OUT/java_run.log" | head -20
[ -d build/pab ] || tar xJf build/pab.tar.xz -C build
echo "pab commit $(cat build/pab/commit.txt)"
mkdir -p build/pab/tst && cp build/pab/pusher/gpu_fused_test build/pab/coll/gpu_collectives_test build/pab/tst/
OUT=$OUT executor-native/tests/device/shared_gpu_run.sh build/pab/tst "$world" all 2>&1 | tail -2
t1=$SECONDS; FC_TEST_SHARED_GPU=2 FC_TEST_HOSTS=2 FC_TEST_LOCAL=1 timeout 200 build/pab/gpu_runtime_hosts_test > "$OUT/hosts_test_2x1.log" 2>&1
echo "gpu_runtime_hosts_test 2x1 shared rc=$? ($((SECONDS-t1)) s)"; grep -E "FAIL|PASS" "$OUT/hosts_test_2x1.log" | tail -2
tar cJf /tmp/verify_logs.tar.xz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/verify_logs.tar.xz "$OUT"/ && ls "$OUT"
