#!/usr/bin/env bash
# The benchmark suite on a GPU host, in one command, from any folder:
#   bench/run.sh <out-dir> [family ...]        families: gemm attention moe collectives fused transport (all)
# Builds the drivers (CMake, no JDK needed) unless FC_BENCH_BIN names a folder of prebuilt ones,
# writes the GPU facts, then per family checks and times ours and the baselines on the same GPUs
# and writes <out-dir>/<family>.{json,md,png} (bench/report.py), the drivers' rows in
# <out-dir>/rows/ and their logs in <out-dir>/logs/. gemm, attention and moe run on one GPU, the multi-GPU
# families at each world size of FC_BENCH_WORLDS (default: 2 and 4, where the GPUs allow), and so
# do attention's ring (ring_bench, torch_ring.py) and moe's layer ops.
#
# Environment (all optional):
#   FC_BENCH_BIN     prebuilt drivers (the CMake target bench_drivers puts them in
#                    <build>/bench/bin); else built into FC_BENCH_BUILD
#   FC_BENCH_BUILD   build folder (default ${TMPDIR:-/tmp}/fusedcomm-bench-build)
#   FC_BENCH_WORLDS  world sizes, e.g. "2" or "2 4 8"
#   FC_GEMM_RANDOM   gemm's first random set: shapes (default 25, each in both layouts), N and K
#                    rounded up to multiples of FC_GEMM_ALIGN (default 8; 1: anywhere);
#                    FC_GEMM_SEED its seed (default: chosen at run time and printed);
#                    FC_GEMM_RANDOM2 / FC_GEMM_SEED2 the second set's (default 25, chosen)
#   FC_COLL_RANDOM   collectives: seeded random element counts per op, 1 MiB to 1 GiB (default
#                    20; 0: none); FC_COLL_SEED their seed (default: chosen at run time, printed)
#   FC_FUSED_RANDOM  fused: a seeded random set of shapes per op beside the LLM list (default 24;
#                    0: none; random_shapes.py: M in [1, 16384], N and K in [256, 16384], each
#                    rank's share a multiple of 8 at W = 2, 3 and 4); FC_FUSED_SEED its seed
#                    (default: chosen at run time, printed)
#   FC_COLL_PARTS    the collectives family's parts (default "nccl small"): nccl, the ops of
#                    shapes/collectives.txt and the random counts against NCCL; small, allReduce
#                    from 4 KiB to 32 MiB (shapes/allreduce_small.txt), ours and the baselines each
#                    eager and captured in a CUDA graph, against NCCL and PyTorch symmetric memory
#   FC_MOE_VARIANTS  moe: ours also with the launch's choices forced (torch_moe.py --variants,
#                    e.g. t128,g1), rows fusedcomm_<variant>
#   FC_BENCH_TRANSPORTS  the transport family's backends (transport_bench --transports), default
#                    socket; e.g. socket,libfabric-tcp (or libfabric-efa, libfabric-verbs)
#   FC_BENCH_ROUNDS  rounds of the multi-GPU families (default 1), in alternating order (ours,
#                    the baselines, the baselines, ours, ...): a GPU warms through a run and its
#                    power cap lowers its clock, so whoever runs first gets the cooler GPU; the
#                    report takes the median over the rounds
#   FC_RS_PARTIALS   partial products of ours' gemmReduceScatter / gemmAllReduce: bf16 (default,
#                    the baselines' precision, so that the tables compare like with like), f32
#                    (the API's default) or f32any
#   FC_HOST_KIND     the host kind named in the rows' device field (e.g. nvidia-h200-x2)
#   FC_COMMIT        the commit measured (default: the checkout's HEAD, else "unknown")
# Exit status 0 when every step ran and passed its checks; 1 otherwise (the tables then hold
# what passed, and the logs say what did not).
set -uo pipefail

usage() { sed -n '2,3p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
[ $# -ge 1 ] || usage
case "$1" in -h|--help) usage ;; esac
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(dirname "$here")
mkdir -p "$1" || exit 2
out=$(cd "$1" && pwd)
shift
families=("$@")
[ ${#families[@]} -gt 0 ] || families=(gemm attention moe collectives fused transport)
for f in "${families[@]}"; do
  case "$f" in gemm|attention|moe|collectives|fused|transport) ;; *) echo "unknown family: $f" >&2; usage ;; esac
done

# NVLink multicast stays off (NCCL, PyTorch symmetric memory, NVSHMEM): on a shared host a
# program that uses it can take every GPU out of service.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
mkdir -p "$out/rows" "$out/logs"
rc=0
fail() { echo "FAILED: $*"; rc=1; }
# step NAME TIMEOUT CMD...: runs CMD with its output in logs/NAME.log and on stdout.
step() {
  local name=$1 limit=$2; shift 2
  echo "== $name"
  timeout "$limit" "$@" 2>&1 | tee "$out/logs/$name.log"
  local s=${PIPESTATUS[0]}
  [ "$s" = 0 ] || fail "$name (exit $s$([ "$s" = 124 ] && echo ", timed out after ${limit}s"))"
}

# ---- facts ------------------------------------------------------------------------------------
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
device="${gpu_name:-no GPU} (${FC_HOST_KIND:-$ngpu GPUs})"
commit=${FC_COMMIT:-$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)}
{
  echo "device: $device; commit: $commit; date: $(date -u '+%Y-%m-%d %H:%M UTC')"
  nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu \
    --format=csv 2>&1
  nvidia-smi topo -m 2>&1
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl",
    ".".join(map(str, torch.cuda.nccl.version())), "GPUs", torch.cuda.device_count())' 2>&1
  nvcc --version 2>&1 | tail -1
} > "$out/gpu.txt"
cat "$out/gpu.txt"
worlds=()
for w in ${FC_BENCH_WORLDS:-2 4}; do [ "$w" -le "$ngpu" ] && worlds+=("$w"); done

# ---- build ------------------------------------------------------------------------------------
bin=
if [ -n "${FC_BENCH_BIN:-}" ]; then
  bin=$(cd "$FC_BENCH_BIN" && pwd) || exit 1
  # Drivers built on another machine may not run here (a newer C library there): build then.
  # (A folder of some drivers only, e.g. libfc_gemm_bench.so for the gemm family, is taken as is.)
  if [ -e "$bin/transport_bench" ] && ! "$bin/transport_bench" --help > /dev/null 2>&1; then
    echo "prebuilt drivers in $bin cannot run here"
    bin=
  fi
fi
if [ -z "$bin" ]; then
  build=${FC_BENCH_BUILD:-${TMPDIR:-/tmp}/fusedcomm-bench-build}
  bin=$build/bench/bin
  step build 1200 bash -c "cmake -S '$root' -B '$build' -DCMAKE_BUILD_TYPE=Release -DFUSEDCOMM_BENCH=ON \
    -DFUSEDCOMM_JNI=OFF > /dev/null && cmake --build '$build' -j$(nproc) --target bench_drivers > '$out/logs/build-full.log' 2>&1 \
    || { tail -40 '$out/logs/build-full.log'; exit 1; }"
  [ $rc = 0 ] || exit 1
fi
echo "drivers: $bin"
shapes=$here/shapes
torchrun=(python3 -m torch.distributed.run --standalone)

# ---- families ---------------------------------------------------------------------------------
run_gemm() {
  if python3 -c 'import torch' 2>/dev/null; then  # ours and cuBLAS interleaved in one process
    # The headline shapes, the issue's off-grid shapes, and two seeded random sets (each seed
    # chosen here unless FC_GEMM_SEED / FC_GEMM_SEED2 names one; printed and kept in the rows).
    # N and K on multiples of 8 by default: off them cuBLAS leaves its fast path, and the
    # comparison would show its tails rather than ours.
    step gemm 900 python3 "$here/gemm/torch_gemm.py" --shapes "$shapes/gemm.txt" \
      --m 1000,1 --n 4104,8192 --k 2056,8192 --random "${FC_GEMM_RANDOM:-25}" --align "${FC_GEMM_ALIGN:-8}" \
      ${FC_GEMM_SEED:+--seed "$FC_GEMM_SEED"} --lib "$bin/libfc_gemm_bench.so" --out "$out/rows/gemm.jsonl"
    step gemm-random2 600 python3 "$here/gemm/torch_gemm.py" --random "${FC_GEMM_RANDOM2:-25}" \
      --align "${FC_GEMM_ALIGN:-8}" ${FC_GEMM_SEED2:+--seed "$FC_GEMM_SEED2"} \
      --lib "$bin/libfc_gemm_bench.so" --out "$out/rows/gemm-random2.jsonl"
  else
    echo "(no torch: ours alone, no cuBLAS baseline)"
    step gemm 600 "$bin/gemm_bench" --shapes "$shapes/gemm.txt" --out "$out/rows/gemm.jsonl"
  fi
}
# rounds OURS THEIRS: per world size and round, the two functions (argument: the world size;
# $tag names the round's files), in alternating order.
rounds() {
  local ours=$1 theirs=$2 w k
  for w in "${worlds[@]}"; do
    for k in $(seq 1 "${FC_BENCH_ROUNDS:-1}"); do
      tag=w$w-r$k
      if [ $((k % 2)) = 1 ]; then "$ours" "$w"; "$theirs" "$w"; else "$theirs" "$w"; "$ours" "$w"; fi
    done
  done
}
# The collectives' list, and FC_COLL_RANDOM (default 20) seeded random element counts per op
# from 1 MiB to 1 GiB, the same for ours and NCCL (seed FC_COLL_SEED, else chosen here, printed).
coll_seed=${FC_COLL_SEED:-$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')}
coll_random=(--random "${FC_COLL_RANDOM:-20}" --seed "$coll_seed")
[ "${FC_COLL_RANDOM:-20}" -gt 0 ] || coll_random=()
coll_ours() {
  step "collectives-$tag-fusedcomm" 600 "$bin/coll_bench" --world "$1" --shapes "$shapes/collectives.txt" \
    "${coll_random[@]}" --out "$out/rows/collectives-fusedcomm-$tag.jsonl"
}
coll_nccl() {
  step "collectives-$tag-nccl" 600 "${torchrun[@]}" --nproc-per-node "$1" "$here/collectives/nccl_bench.py" \
    --shapes "$shapes/collectives.txt" "${coll_random[@]}" --out "$out/rows/collectives-nccl-$tag.jsonl"
}
fused_ours() {
  step "fused-$tag-fusedcomm" 500 "$bin/fused_bench" --world "$1" --shapes "$shapes/fused.txt" \
    --rs-partials "${FC_RS_PARTIALS:-bf16}" --out "$out/rows/fused-fusedcomm-$tag.jsonl"
  [ -z "$fused_random" ] || step "fused-random-$tag-fusedcomm" 900 "$bin/fused_bench" --world "$1" \
    --shapes "$fused_random" --rs-partials "${FC_RS_PARTIALS:-bf16}" --out "$out/rows/fused-random-fusedcomm-$tag.jsonl"
}
fused_torch() {
  step "fused-$tag-torch" 500 "${torchrun[@]}" --nproc-per-node "$1" "$here/fused/torch_fused.py" \
    --shapes "$shapes/fused.txt" --out "$out/rows/fused-torch-$tag.jsonl"
  [ -z "$fused_random" ] || step "fused-random-$tag-torch" 900 "${torchrun[@]}" --nproc-per-node "$1" \
    "$here/fused/torch_fused.py" --shapes "$fused_random" --out "$out/rows/fused-random-torch-$tag.jsonl"
}
# The fused family's seeded random set (FC_FUSED_RANDOM shapes per op; seed FC_FUSED_SEED, else
# chosen and printed by random_shapes.py), the same file for ours and torch.
fused_random_set() {
  fused_random=""
  [ "${FC_FUSED_RANDOM:-24}" -gt 0 ] || return 0
  fused_random=$out/fused-random-shapes.txt
  python3 "$here/fused/random_shapes.py" --count "${FC_FUSED_RANDOM:-24}" ${FC_FUSED_SEED:+--seed "$FC_FUSED_SEED"} \
    --out "$fused_random" || { fail "fused: random_shapes.py failed"; fused_random=""; }
}
# allReduce small and medium: ours (coll_bench --graph) against NCCL and torch's symmetric-memory
# one-shot / two-shot allReduce (torch_allreduce.py), each eager and graph-captured.
coll_small_ours() {
  step "collectives-small-$tag-fusedcomm" 600 "$bin/coll_bench" --world "$1" --shapes "$shapes/allreduce_small.txt" \
    --graph --set small-medium --out "$out/rows/collectives-small-fusedcomm-$tag.jsonl"
}
coll_small_torch() {
  step "collectives-small-$tag-torch" 600 "${torchrun[@]}" --nproc-per-node "$1" "$here/collectives/torch_allreduce.py" \
    --shapes "$shapes/allreduce_small.txt" --set small-medium --out "$out/rows/collectives-small-torch-$tag.jsonl"
}
run_collectives() {
  local part
  for part in ${FC_COLL_PARTS:-nccl small}; do
    case "$part" in
      nccl) rounds coll_ours coll_nccl ;;
      small) rounds coll_small_ours coll_small_torch ;;
      *) fail "collectives: unknown part '$part' in FC_COLL_PARTS (nccl, small)" ;;
    esac
  done
}
run_fused() { fused_random_set; rounds fused_ours fused_torch; }
run_attention() {  # ours and torch SDPA (cuDNN, flash) interleaved in one process
  if python3 -c 'import torch' 2>/dev/null; then
    step attention 900 python3 "$here/attention/torch_attention.py" --shapes "$shapes/attention.txt" \
      --lib "$bin/libfc_attn_bench.so" --out "$out/rows/attention.jsonl"
    step attention-backward 900 python3 "$here/attention/torch_attention.py" --backward \
      --shapes "$shapes/attention_bwd.txt" --lib "$bin/libfc_attn_bench.so" --out "$out/rows/attention-bwd.jsonl"
  else
    fail "attention: needs torch (the driver is torch_attention.py)"
  fi
  # Ring attention forward and backward at each world size (ours, with our 1-GPU backward at the
  # same per-GPU work, and the torch ring baseline), where the GPUs allow.
  [ ${#worlds[@]} -gt 0 ] && rounds ring_ours ring_torch
}
ring_ours() {
  step "attention-ring-$tag-fusedcomm" 900 "$bin/ring_bench" --worlds "$1" --shapes "$shapes/ring.txt" \
    --out "$out/rows/attention-ring-fusedcomm-$tag.jsonl"
}
ring_torch() {
  step "attention-ring-$tag-torch" 900 "${torchrun[@]}" --nproc-per-node "$1" "$here/attention/torch_ring.py" \
    --shapes "$shapes/ring.txt" --out "$out/rows/attention-ring-torch-$tag.jsonl"
}
run_moe() {  # ours, torch._grouped_mm and dense cuBLAS interleaved in one process
  if python3 -c 'import torch' 2>/dev/null; then
    step moe 900 python3 "$here/moe/torch_moe.py" --shapes "$shapes/moe.txt" \
      ${FC_MOE_VARIANTS:+--variants "$FC_MOE_VARIANTS"} --lib "$bin/libfc_moe_bench.so" --out "$out/rows/moe.jsonl"
  else
    fail "moe: needs torch (the driver is torch_moe.py)"
  fi
  # The layer's ops at each world size (moeDispatchGemm, moeCombine; ours and torch's
  # all_to_all_single + _grouped_mm), where the GPUs allow.
  [ ${#worlds[@]} -gt 0 ] && rounds moe_ours moe_torch
}
moe_ours() {
  step "moe-$tag-fusedcomm" 900 "$bin/moe_bench" --world "$1" --shapes "$shapes/moe_layer.txt" \
    --out "$out/rows/moe-fusedcomm-$tag.jsonl"
}
moe_torch() {
  step "moe-$tag-torch" 900 "${torchrun[@]}" --nproc-per-node "$1" "$here/moe/torch_moe_dist.py" \
    --shapes "$shapes/moe_layer.txt" --out "$out/rows/moe-torch-$tag.jsonl"
}

run_transport() {
  step transport 600 "$bin/transport_bench" --shapes "$shapes/transport.txt" --out "$out/rows/transport.jsonl" \
    --transports "${FC_BENCH_TRANSPORTS:-socket}"
}

for f in "${families[@]}"; do
  t0=$SECONDS
  if [ "$f" != transport ] && [ "$ngpu" -eq 0 ]; then
    fail "$f: no GPU visible"
    continue
  fi
  if { [ "$f" = collectives ] || [ "$f" = fused ]; } && [ ${#worlds[@]} -eq 0 ]; then
    fail "$f: needs 2 or more GPUs ($ngpu visible, FC_BENCH_WORLDS=${FC_BENCH_WORLDS:-2 4})"
    continue
  fi
  rm -f "$out/rows/$f"*.jsonl "$out/$f".{json,md,png}
  "run_$f"
  # The table of whatever passed, even after a failure.
  python3 "$here/report.py" --family "$f" --out-dir "$out" --device "$device" --gpus "$ngpu" \
    --commit "$commit" "$out/rows/$f"*.jsonl > "$out/logs/report-$f.log" 2>&1 || fail "report $f"
  echo "== $f: $((SECONDS - t0)) s; $out/$f.md"
done
for f in "${families[@]}"; do
  [ -f "$out/$f.md" ] && sed -n '/^## Summary/,$p' "$out/$f.md"
done
echo "bench/run.sh: $([ $rc = 0 ] && echo "all passed" || echo "some steps FAILED (see above)"); results in $out"
exit $rc
