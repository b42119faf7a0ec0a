#!/usr/bin/env bash
# The fused ops' owed 4-GPU items (docs/gpu-runs-owed.md) in ONE device call of ~7 minutes on
# `nvidia-h200-x4`, the W = 4 table left to a second call:
#   build (CPU machine): kernels/bench/fused/w4_owed.sh build   -> build/w4.tar.xz (carry it)
#   run   (GPU host):    kernels/bench/fused/w4_owed.sh run [rounds=2]   -> $OUT/w4_*
#   then, second call:   FC_WORLDS=4 FC_OPS=ag,rs FC_BENCH_ROUNDS=2 FC_RS_PARTIALS=bf16 \
#                          kernels/bench/fused/device_run.sh build/w4/base bench full <sha>
#                        (<sha> in build/w4/commit.txt; its fused_results.* replace this call's)
# Builds: base (HEAD); tall (-DFUSEDCOMM_FUSED_TALL_GROUPS: raster groups of 16 in the fused
# kernels at W >= 3 too, run 23's W = 2 gain); spread (-DFUSEDCOMM_AG_SPREAD_ANY_W: the own-row
# stores spread over the tiles at every W, run 26-32's W <= 2 rule). And base with the copy
# engines forced (`--ag-exchange ce`, bd66aa0's W = 2 rule; at W = 4 they lost in run 18 with
# one stream per peer).
# Steps, each under its own timeout:
#   1. gpu_fused_test of each build on separate GPUs (W = 1-4; every rank on one GPU ran at
#      f3181c4 in run 31). A failure skips that build's timing.
#   Time: the tests ~3-4 min, the timing ~35 s per fused_bench run; none starts after
#   FC_W4_DEADLINE_S (default 540) seconds, so the call stays inside the 10-minute limit.
#   2. fused_bench --world 4, bf16 partials, sustained, the shapes of the W = 4 misses (run 18)
#      and the two large squares, every variant per round, the order rotated between rounds.
#   3. The table: per shape and op, each variant's fused time (slowest rank) over base's.
set -uo pipefail
cd "$(dirname "$0")/../../.."
here=kernels/bench/fused
dir=build/w4
. $here/builds_lib.sh
if [ "${1:-run}" = build ]; then
  fused_variants "$dir" w4 "" base= tall=-DFUSEDCOMM_FUSED_TALL_GROUPS \
    spread=-DFUSEDCOMM_AG_SPREAD_ANY_W || exit 1
  variant_tests "$dir" w4 || exit 1
  cp build/w4-base/ptxas.txt "$dir/base/" || exit 1
  pack_builds "$dir"; exit
fi
unpack_builds "$dir" || exit 1
rounds=${2:-2}
OUT=${OUT:-/tmp/w4_out}; mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
echo "commit $(cat $dir/commit.txt), $(nvidia-smi -L | grep -c '^GPU') GPUs, rounds $rounds"
nvidia-smi -L > "$OUT/w4_gpus.txt"
ok=(base)
fused_test "$dir/base/gpu_fused_test" "$OUT/w4_test_base.log" "base, separate GPUs" 240 || ok=()
for b in tall spread; do
  fused_test "$dir/$b/gpu_fused_test" "$OUT/w4_test_$b.log" "$b, separate GPUs" 240 && ok+=("$b")
done
[ ${#ok[@]} -gt 0 ] && [ "${ok[0]}" = base ] || { echo "base failed its test: no timing"; exit 1; }
variants=("${ok[@]}" ce)  # ce: base with the copy engines forced
shapes=${FC_W4_SHAPES:-70b M=2048|70b M=8192|70b M=16384|8b M=8192|S=8192|S=16384}
rows=$OUT/w4_ab.jsonl; rm -f "$rows"
run_variant() {  # ce: base with the copy engines forced
  local b=$1 x=()
  [ "$1" = ce ] && { b=base; x=(--ag-exchange ce); }
  timeout 200 "$dir/$b/fused_bench" --world 4 --ops ag,rs --rs-partials bf16 --sustain-ms 500 \
    --batches 5 --ag-gathered 1 --shape "$shapes" "${x[@]}" --out "$2" >> "$OUT/w4_bench.log" 2>&1
}
variant_rounds "$rows" "$rounds" "${FC_W4_DEADLINE_S:-540}" "${variants[@]}"
python3 $here/variant_ratios.py "$rows" base | tee "$OUT/w4_table.txt"
