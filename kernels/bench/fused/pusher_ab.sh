#!/usr/bin/env bash
# A/B builds of the fused gemmReduceScatter on a host with 2 or more GPUs (step 2 below: the
# pusher warps, the default since run 9, against the TMA pushes; NOTES.md), with the tests on
# separate GPUs and the trace, in
# ONE device call of ~7 minutes at W = 2:
#   build (CPU machine): kernels/bench/fused/pusher_ab.sh build   -> build/pab and its archive
#                        build/pab.tar.xz (~8 MB: carry the archive, the folder is ~85 MB)
#   run   (GPU host):    kernels/bench/fused/pusher_ab.sh run [world=2]   -> $OUT/pab/*
# build/pab also holds what the next calls on the same host need, so that one carried archive
# serves them all (`tar xJf build/pab.tar.xz -C build` first where build/pab is missing):
#   build/pab/pusher  the default fused_bench and gpu_fused_test (fused/device_run.sh's bin)
#   build/pab/tma     the same with -DFUSEDCOMM_RS_TMA_PUSH (the consumers' TMA pushes)
#   build/pab/coll  coll_bench and gpu_collectives_test (collectives/device_run.sh's bin)
#   build/pab/trace fused_bench with -DFUSEDCOMM_RS_TRACE (where the fused gemmReduceScatter
#                   waits, per shape: detail/rs_trace.h)
# Run steps, each with its own timeout:
#   1. gpu_fused_test of the default build (every world 1..GPUs, on separate GPUs);
#   2. local_run.sh, 2 rounds, bf16 and fp32 partials, the 12 TP shapes at W = world: the TMA
#      pushes against the pusher warps (the interleaved sweep that W = 2 used to compare lost in
#      run 13 and was removed; it stands at 75be861);
#   3. gpu_proxy_test, gpu_hier_test and gpu_runtime_hosts_test (2 hosts x 1 GPU) on separate
#      GPUs;
#   4. the trace build: per TP shape, bf16 partials, where the fused gemmReduceScatter waits
#      (consumers on the pusher, own half-tiles on the peers' flags, the pusher on the start
#      flags and its stores, the end barrier), summed over CTAs per launch ($o/rs_trace.txt).
#      At W = 2 only, unless FC_PAB_TRACE=1 (at W = 4 steps 1-3 alone take ~8 of a call's 10
#      minutes: run it as a call of its own there).
#   5. W = 2 only (~1 min): the default build's allGatherGemm, fused against decomposed at the
#      12 TP-2 shapes (no baselines): whether the own-first sweep (95f0f3d) now wins at
#      M = 1024, where kAuto runs decomposed (choose_ag, kernels/src/fused.cu).
set -uo pipefail
cd "$(dirname "$0")/../../.."
here=kernels/bench/fused
out=build/pab
. $here/builds_lib.sh
if [ "${1:-run}" = build ]; then
  $here/build.sh build/pab-def > /dev/null || exit 1
  FC_NVCC_FLAGS=-DFUSEDCOMM_RS_TMA_PUSH $here/build.sh build/pab-tma | tail -1 || exit 1
  FC_NVCC_FLAGS=-DFUSEDCOMM_RS_TRACE $here/build.sh build/pab-trace | tail -1 || exit 1
  cmake --build executor-native/target/cmake --target gpu_proxy_test gpu_hier_test gpu_runtime_hosts_test > /dev/null || exit 1
  kernels/bench/collectives/build.sh build/coll-bin > /dev/null || exit 1
  rm -rf $out && mkdir -p $out/tma $out/pusher $out/coll $out/trace
  cp build/pab-trace/fused_bench $out/trace/
  cp build/pab-def/fused_bench build/pab-def/gpu_fused_test $out/pusher/
  cp build/coll-bin/coll_bench build/coll-bin/gpu_collectives_test $out/coll/
  cp build/pab-tma/fused_bench build/pab-tma/gpu_fused_test $out/tma/
  cp executor-native/target/cmake/executor-native/gpu_proxy_test \
     executor-native/target/cmake/executor-native/gpu_hier_test \
     executor-native/target/cmake/executor-native/gpu_runtime_hosts_test $out/
  pack_builds $out; exit
fi
unpack_builds $out || exit 1
world=${2:-2}
OUT=${OUT:-/tmp/pab_out}; o=$OUT/pab; mkdir -p "$o"
# At most ~8 files come back from $OUT: on any exit, all but the trace's summary go into one archive.
trap 'kernels/bench/pack_out.sh "$OUT" pab_logs.tar.xz pab/rs_trace.txt' EXIT
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -2
echo "commit $(cat $out/commit.txt 2>/dev/null)"
fused_test $out/pusher/gpu_fused_test "$o/fused_test_pusher.log" "default: pusher warps" 240
timeout 60 $out/gpu_proxy_test > "$o/gpu_proxy_test.log" 2>&1; echo "gpu_proxy_test rc=$?"
grep -E "round trip|stream|one way|allReduce across" "$o/gpu_proxy_test.log"
FC_TEST_JSON=$o/hier.jsonl timeout 60 $out/gpu_hier_test > "$o/gpu_hier_test.log" 2>&1; echo "gpu_hier_test rc=$?"
grep -E "proxy step" "$o/gpu_hier_test.log"
timeout 120 $out/gpu_runtime_hosts_test > "$o/gpu_runtime_hosts_test.log" 2>&1; echo "gpu_runtime_hosts_test rc=$?"
grep -E "^FAIL|missing host|== gpu_runtime" "$o/gpu_runtime_hosts_test.log" | head -8
ab="$out/tma $out/pusher"
# No outer `timeout` here: it would not reach local_run's own timed runs (each its own process
# group), which would go on beside the next steps; FC_DEADLINE_S stops it starting new ones.
OUT=$o FC_DEADLINE_S=300 $here/local_run.sh "$ab" 2 rs "bf16 f32" full "$world" | tail -30
[ "$world" = 2 ] || [ "${FC_PAB_TRACE:-0}" = 1 ] || exit 0
echo "trace build (bf16 partials, W = $world): $o/rs_trace.txt"
timeout 240 $out/trace/fused_bench --world "$world" --ops rs --rs-partials bf16 --batches 2 \
  --out "$o/trace_rows.jsonl" > "$o/trace.log" 2>&1; echo "trace rc=$?"
grep '^rs_trace' "$o/trace.log" | tee "$o/rs_trace.txt" | grep 'rank 0' | sed 's/(per launch[^)]*)//'
[ "$world" = 2 ] || exit 0
echo "allGatherGemm fused vs decomposed (default build, W = 2, gathered output): $o/ag_rows.jsonl"
timeout 150 $out/pusher/fused_bench --world 2 --ops ag --batches 3 --out "$o/ag_rows.jsonl" \
  > "$o/ag.log" 2>&1; echo "fused_bench ag rc=$?"
python3 - "$o/ag_rows.jsonl" <<'PY'
import json, sys
t = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    t.setdefault(r["shape"], {})[r["impl"]] = r["ms_median"]
print(f"{'shape':22} {'fused ms':>9} {'decomp ms':>9} {'GEMM ms':>9} {'fused/decomp':>12}")
for shape, v in t.items():
    f, d, g = v.get("ours_fused"), v.get("ours_decomposed"), v.get("ours_gemm")
    if f and d:
        print(f"{shape:22} {f:9.4f} {d:9.4f} {g or float('nan'):9.4f} {f / d:12.3f}")
PY
