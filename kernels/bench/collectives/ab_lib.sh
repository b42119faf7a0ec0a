# Shared by the collectives' one-call A/B scripts (direct_ab.sh, direct_tune.sh, poll_ab.sh);
# source it from the repo root. Build side (CPU machine): ab_build DIR "NAME DEFS" ... builds
# the default binaries (build.sh into build/coll-bin) and, per NAME, coll_bench (and
# gpu_collectives_test) of collectives.cu compiled with DEFS, then copies them into DIR as
# coll_bench_NAME (gpu_collectives_test_NAME; "def" is the default build), stripped, with
# commit.txt. Run side (GPU host): ab_setup DIR sets OUT (default /tmp/<DIR's name>_out),
# o=$OUT/logs, b=DIR, t0, w = the GPU count (at most 4), exports the NVLS-off variables and
# writes $OUT/gpu.txt; ab_bench LABEL BINARY ARGS... runs coll_bench at W = w into
# $o/ours_LABEL_w$w.jsonl (its own timeout; a failure is printed, not fatal).
ab_here=kernels/bench/collectives

ab_build() {  # dir "name defs"...
  local dir=$1 v name defs; shift
  $ab_here/build.sh build/coll-bin > /dev/null || return 1
  rm -rf "$dir" && mkdir -p "$dir"
  cp build/coll-bin/coll_bench "$dir/coll_bench_def"
  cp build/coll-bin/gpu_collectives_test "$dir/gpu_collectives_test_def"
  for v in "$@"; do
    name=${v%% *}; defs=${v#* }
    COLL_OBJS=build/coll-bin COLL_NVCC_DEFS="$defs" $ab_here/build.sh "build/coll-$name" > /dev/null || return 1
    cp "build/coll-$name/coll_bench" "$dir/coll_bench_$name"
    cp "build/coll-$name/gpu_collectives_test" "$dir/gpu_collectives_test_$name"
  done
  strip --strip-unneeded "$dir"/*
  git rev-parse --short HEAD > "$dir/commit.txt"
  du -sh "$dir"
}

ab_setup() {  # dir
  b=$1
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
  OUT=${OUT:-/tmp/$(basename "$b")_out}; o=$OUT/logs; mkdir -p "$o"
  t0=$SECONDS
  w=$(nvidia-smi -L | wc -l); [ "$w" -gt 4 ] && w=4
  echo "commit $(cat "$b/commit.txt"), world $w"
  nvidia-smi --query-gpu=name,uuid,driver_version,clocks.sm,clocks.mem --format=csv > "$OUT/gpu.txt" 2>&1
}

ab_bench() {  # label binary args...
  local label=$1 bin=$2; shift 2
  timeout 100 "$bin" --world "$w" --label "$label" --out "$o/ours_${label}_w$w.jsonl" "$@" \
    >> "$o/bench.log" 2>&1 || echo "$label rc=$?"
  echo "$label done [$((SECONDS - t0)) s]"
}

ab_nccl() {  # ops min max
  timeout 120 torchrun --nproc-per-node "$w" $ab_here/nccl_bench.py --ops "$1" --min-bytes "$2" \
    --max-bytes "$3" --out "$o/nccl_w$w.jsonl" >> "$o/nccl.log" 2>&1 || echo "nccl rc=$?"
  echo "nccl done [$((SECONDS - t0)) s]"
}
