#!/usr/bin/env bash
# Does our collective's power draw slow the GEMM after it? (kernels/bench/fused/NOTES.md, "Run 14")
# The decomposed pair at small shapes, ours with collective builds of fewer pulling CTAs,
# against torch serial, with NVML clock and power samples per impl (--clocks on both sides),
# at W = 2 and 4, in one device call (~5 min on 4 x H200):
#   build (CPU machine): kernels/bench/fused/coll_power_ab.sh build [name=FLAGS ...] -> build/cpab.tar.xz
#   run   (GPU host):    kernels/bench/fused/coll_power_ab.sh run [rounds=2] -> $OUT/cpab/*
# Shapes: FC_CPAB_SHAPES (default "M=1024;M=2048", fused_bench / torch_baselines --shape, each
# matching both models). Rounds alternate the build order.
set -uo pipefail
cd "$(dirname "$0")/../../.."
here=kernels/bench/fused
out=build/cpab
. $here/builds_lib.sh
if [ "${1:-run}" = build ]; then
  # Builds as name=FLAGS (the first is the reference); by default the two-phase collectives'
  # pulling CTAs (collectives.cu FC_PULL_CTAS_W2 / _W4) at their defaults, half and a quarter.
  shift; builds=("$@"); [ ${#builds[@]} -gt 0 ] || builds=(def= \
    half="-DFC_PULL_CTAS_W2=32 -DFC_PULL_CTAS_W4=24" quarter="-DFC_PULL_CTAS_W2=16 -DFC_PULL_CTAS_W4=12")
  fused_variants $out cpab "" "${builds[@]}" || exit 1
  pack_builds $out; exit
fi
unpack_builds $out || exit 1
rounds=${2:-2}
OUT=${OUT:-/tmp/cpab_out}; o=$OUT/cpab; mkdir -p "$o/logs"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
trap 'kernels/bench/pack_out.sh "$OUT" cpab_logs.tar.xz "cpab/table.txt" "cpab/rows.jsonl"' EXIT
echo "commit $(cat $out/commit.txt)"
ngpu=$(nvidia-smi -L | wc -l)
IFS=';' read -ra shapes <<< "${FC_CPAB_SHAPES:-M=1024;M=2048}"
order=$(cat $out/order.txt); rev=$(echo "$order" | tac)
for w in 2 4; do
  [ $w -le "$ngpu" ] || continue
  for k in $(seq 1 "$rounds"); do
    [ $((k % 2)) = 1 ] && bs=$order || bs=$rev
    for b in $bs; do
      for s in "${shapes[@]}"; do
        log="$o/logs/ours_w${w}_${b}_r$k.log"
        timeout 150 $out/$b/fused_bench --world $w --ops ag,rs --rs-partials bf16 --clocks --split-decomposed --batches 5 \
          --shape "$s" --out /tmp/cpab_rows.jsonl >> "$log" 2>&1 || echo "fused_bench $b w=$w '$s' rc=$?"
        sed "s/}\$/, \"build\": \"$b\", \"round\": $k}/" /tmp/cpab_rows.jsonl >> "$o/rows.jsonl"
      done
    done
    for s in "${shapes[@]}"; do
      timeout 200 torchrun --nproc-per-node $w $here/torch_baselines.py --ops ag,rs --clocks --split --shape "$s" \
        --out /tmp/cpab_torch.jsonl >> "$o/logs/torch_w${w}_r$k.log" 2>&1 || echo "torch w=$w '$s' rc=$?"
      sed "s/}\$/, \"build\": \"torch\", \"round\": $k}/" /tmp/cpab_torch.jsonl >> "$o/rows.jsonl"
    done
    echo "world $w round $k done [$SECONDS s]"
  done
done
python3 $here/coll_power_report.py "$o" | tee "$o/table.txt"
