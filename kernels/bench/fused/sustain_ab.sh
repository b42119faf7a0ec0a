#!/usr/bin/env bash
# Is the comparison with torch a matter of the timing protocol on a power-capped GPU?
# (kernels/bench/fused/NOTES.md, "Run 14") fused_bench times its impls' batches round robin;
# torch_baselines.py times each impl's batches one after another, its first impl (torch serial)
# right after the shape's setup, when the GPU has been nearly idle. Here both benches run both
# ways: as they are, and with --sustain-ms (every impl runs back to back for that long, then
# its batches), with NVML clocks (--clocks), per world and round in alternating order.
# One device call (~4 min at W = 2 and 4, one round, the default shapes):
#   build (CPU machine): kernels/bench/fused/build.sh build/sab-bin, then
#                        kernels/bench/fused/sustain_ab.sh build -> build/sab.tar.xz (carry it)
#   run   (GPU host):    kernels/bench/fused/sustain_ab.sh run [rounds=1] -> $OUT/sab/*
# FC_SA_SHAPES (--shape of both benches, default "M=1024|M=2048|square S=8192"), FC_SA_WORLDS
# (default "2 4"), FC_SA_SUSTAIN_MS (default 500). A power probe (NVML's power reading is a
# ~1 s average; both benches sample the sustained run's second half):
# FC_SA_ONLY_SUSTAINED=1 FC_SA_SUSTAIN_MS=3000, few shapes.
set -uo pipefail
cd "$(dirname "$0")/../../.."
here=kernels/bench/fused
out=build/sab
. $here/builds_lib.sh
if [ "${1:-run}" = build ]; then
  rm -rf $out && mkdir -p $out && cp build/sab-bin/fused_bench $out/ || exit 1
  pack_builds $out; exit
fi
unpack_builds $out || exit 1
OUT=${OUT:-/tmp/sab_out}; o=$OUT/sab; mkdir -p "$o/logs"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
trap 'kernels/bench/pack_out.sh "$OUT" sab_logs.tar.xz "sab/table.txt" "sab/rows.jsonl"' EXIT
echo "commit $(cat $out/commit.txt)"
ngpu=$(nvidia-smi -L | wc -l)
shapes=${FC_SA_SHAPES:-M=1024|M=2048|square S=8192}
sus=${FC_SA_SUSTAIN_MS:-500}
ours() {  # name, extra args
  timeout 240 $out/fused_bench --world $w --ops ag,rs --rs-partials bf16 --clocks --shape "$shapes" $2 \
    --out /tmp/sab_rows.jsonl > "$o/logs/$1_w${w}_r$k.log" 2>&1 || echo "fused_bench $1 w=$w rc=$?"
  sed "s/}\$/, \"build\": \"$1\", \"round\": $k}/" /tmp/sab_rows.jsonl >> "$o/rows.jsonl"
}
theirs() {
  timeout 300 torchrun --nproc-per-node $w $here/torch_baselines.py --ops ag,rs --clocks --shape "$shapes" $2 \
    --out /tmp/sab_torch.jsonl > "$o/logs/$1_w${w}_r$k.log" 2>&1 || echo "torch $1 w=$w rc=$?"
  sed "s/}\$/, \"build\": \"$1\", \"round\": $k}/" /tmp/sab_torch.jsonl >> "$o/rows.jsonl"
}
for w in ${FC_SA_WORLDS:-2 4}; do
  [ $w -le "$ngpu" ] || continue
  for k in $(seq 1 "${2:-1}"); do
    if [ "${FC_SA_ONLY_SUSTAINED:-0}" = 1 ]; then
      if [ $((k % 2)) = 1 ]; then ours ours-sus "--sustain-ms $sus"; theirs torch-sus "--sustain-ms $sus"
      else theirs torch-sus "--sustain-ms $sus"; ours ours-sus "--sustain-ms $sus"; fi
    elif [ $((k % 2)) = 1 ]; then
      ours ours-rr ""; theirs torch "" ; ours ours-sus "--sustain-ms $sus"; theirs torch-sus "--sustain-ms $sus"
    else
      theirs torch-sus "--sustain-ms $sus"; ours ours-sus "--sustain-ms $sus"; theirs torch ""; ours ours-rr ""
    fi
    echo "world $w round $k done [$SECONDS s]"
  done
done
python3 $here/coll_power_report.py "$o" | tee "$o/table.txt"
