#!/usr/bin/env bash
# The native calls of docs/gpu-runs-owed.md's runbook, one per device call, so that each is
# sent as one short command (repo root of the GPU host, carrying build/pab.tar.xz):
#   kernels/bench/gpu_runbook.sh x2 1|2|3|4      x4 1|2|3|5|6      x8 1|2a|2b|3      x1 w8
# (x1 w8: the 8-GPU list's correctness items as a dry run on one GPU, every rank sharing it:
# worlds 5 and 8 of both suites, then 2 virtual hosts x 4 ranks; protocol and numerics only.)
# Each item fits the 600 s limit and leaves at most ~8 files in $OUT (the rest archived). The
# Java items stay spark-plugin/bench/gpu_java_run.sh's (stage 1..5, then run).
# Never give the benches a world of 3, 5 or 6: their Llama shapes at TP = W need W | 8 (the
# test suites run every world 1..GPUs).
set -uo pipefail
kind=${1:?x2|x4|x8}; item=${2:?item}
[ -d build/pab ] || tar xJf build/pab.tar.xz -C build || { echo "no build/pab.tar.xz carried"; exit 1; }
sha=$(cat build/pab/commit.txt)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/runbook_out}; mkdir -p "$OUT"
O=$OUT
echo "gpu_runbook $kind $item, binaries at $sha, $(nvidia-smi -L | wc -l) GPU(s)"

# Both test suites on separate GPUs, every world 1..GPUs, the fused one first (its fp32
# any-order cases at W >= 3 are the first to watch), each binary under one timeout (an outer
# timeout around a script would not stop the script's own timed children).
tests() {
  nvidia-smi topo -m > "$O/topo.txt" 2>&1
  timeout "$1" build/pab/pusher/gpu_fused_test > "$O/fused_test.log" 2>&1
  echo "gpu_fused_test rc=$?"; grep -E '^== world|FAIL' "$O/fused_test.log" | head -40
  timeout "$2" build/pab/coll/gpu_collectives_test > "$O/coll_test.log" 2>&1
  echo "gpu_collectives_test rc=$?"; grep -E '^== world|FAIL' "$O/coll_test.log" | head -40
}
# The fused bench of ops $1 and partials $2 at world $3 into $O/<ops>_<partials>, then archived
# there (several in one call would overwrite each other's fused_results.*).
fused_bench_into() {
  OUT=$O/$1_$2 FC_OPS=$1 FC_WORLDS=$3 FC_RS_PARTIALS=$2 kernels/bench/fused/device_run.sh build/pab/pusher bench full "$sha"
  tar cJf "$O/$1_$2.tar.xz" -C "$O" "$1_$2" && rm -rf "${O:?}/$1_$2"
}

case "$kind:$item" in
  x2:1) FC_OPS=ag,rs FC_WORLDS=2 FC_RS_PARTIALS=bf16 kernels/bench/fused/device_run.sh build/pab/pusher all full "$sha" ;;
  x2:2) kernels/bench/collectives/device_run.sh build/pab/coll all "$sha" ;;
  x2:3) kernels/bench/fused/pusher_ab.sh run 2 ;;
  x2:4) for c in "rs f32" "ar bf16" "ar f32"; do set -- $c; fused_bench_into "$1" "$2" 2; done ;;
  x4:1) tests 200 370 ;;
  x4:2) FC_WORLDS=4 kernels/bench/collectives/device_run.sh build/pab/coll bench "$sha" ;;
  x4:3) FC_WORLDS=4 FC_RS_PARTIALS=bf16 kernels/bench/fused/device_run.sh build/pab/pusher bench full "$sha" ;;
  x4:5) kernels/bench/fused/pusher_ab.sh run 4 ;;
  x4:6)
    timeout 200 build/pab/trace/fused_bench --world 4 --ops rs --rs-partials bf16 --batches 2 \
      --out /tmp/trace_rows.jsonl > "$O/trace.log" 2>&1; echo "trace rc=$?"
    grep '^rs_trace' "$O/trace.log" | grep 'rank 0'
    for p in f32 f32any; do fused_bench_into rs "$p" 4; done ;;
  x8:1) tests 200 370 ;;
  x8:2a) FC_WORLDS=8 kernels/bench/collectives/device_run.sh build/pab/coll bench "$sha" ;;
  x8:2b) FC_WORLDS=8 FC_RS_PARTIALS=bf16 kernels/bench/fused/device_run.sh build/pab/pusher bench full "$sha" ;;
  x8:3)
    # 2 virtual hosts x 4 GPUs: the hierarchical allReduce (NVLink inside, the proxy and socket
    # transport between), 1, 2 and 4 streams, one JSON file each (the rows carry no stream count).
    for s in 1 2 4; do
      FC_TEST_LOCAL=4 FC_TEST_STREAMS=$s FC_TEST_JSON=$O/hier_s$s.jsonl timeout 100 build/pab/gpu_hier_test \
        > "$O/hier_s$s.log" 2>&1; echo "gpu_hier_test streams=$s rc=$?"; grep -E 'proxy step|PASS|FAIL' "$O/hier_s$s.log"
    done
    timeout 60 build/pab/gpu_proxy_test > "$O/proxy.log" 2>&1; echo "gpu_proxy_test rc=$?"
    grep -E 'round trip|one way|allReduce across|PASS|FAIL' "$O/proxy.log"
    timeout 200 build/pab/gpu_runtime_hosts_test > "$O/hosts_2x4.log" 2>&1; echo "gpu_runtime_hosts_test (2 x 4) rc=$?"
    grep -E '^FAIL|missing host|== ' "$O/hosts_2x4.log" | head ;;
  x1:w8)
    export FC_TEST_SHARED_GPU=8 FC_TEST_WORLDS=${FC_TEST_WORLDS:-5,8}
    mkdir -p build/pab/tst && cp build/pab/pusher/gpu_fused_test build/pab/coll/gpu_collectives_test build/pab/tst/
    OUT=$O executor-native/tests/device/shared_gpu_run.sh build/pab/tst 8 all | tail -2
    unset FC_TEST_WORLDS
    for t in gpu_hier_test gpu_runtime_hosts_test; do
      FC_TEST_HOSTS=2 FC_TEST_LOCAL=4 timeout 200 build/pab/$t > "$O/${t}_2x4_shared.log" 2>&1
      echo "$t (2 x 4, one GPU) rc=$?: $(grep -E '^== gpu_|^FAIL' "$O/${t}_2x4_shared.log" | head -3 | tr '\n' ' ')"
    done ;;
  *) echo "no item $kind $item (see the usage at the top)"; exit 2 ;;
esac
rc=$?
kernels/bench/pack_out.sh "$O" runbook_logs.tar.xz '*.tar.xz' '*results*' 'topo.txt' '*test.log' 'hier_s*.jsonl' 'shared_*.log' '*_shared.log'
ls -la "$O"
exit $rc
