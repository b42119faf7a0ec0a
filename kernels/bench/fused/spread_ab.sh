#!/usr/bin/env bash
# A/B of the gathered-A store spread (-DFUSEDCOMM_AG_SPREAD_STORES) for the fused allGatherGemm,
# in one device call. Build here, run there:
#   kernels/bench/fused/spread_ab.sh build            -> build/fbs.tar.xz (base = HEAD, spread)
#   kernels/bench/fused/spread_ab.sh run [world=1] [rounds=2]   (GPU host, $OUT set)
# world 1 runs every rank's work on one GPU with no peer (fused_bench --tp 2, gathered A asked):
# what is left is the own rows' stores. world >= 2 needs that many GPUs. The spread build's
# gpu_fused_test runs first (every world up to the GPU count when there are 2 or more, then
# W = 1-4 on one GPU); a
# failure stops the timing. Prints each shape's spread / base fused time and fused / GEMM.
set -uo pipefail
cd "$(dirname "$0")/../../.."
here=kernels/bench/fused
dir=build/fbs
. $here/builds_lib.sh
if [ "${1:-run}" = build ]; then
  rm -rf "$dir"; mkdir -p "$dir"
  for b in base= spread=-DFUSEDCOMM_AG_SPREAD_STORES; do
    n=${b%%=*}
    FC_NVCC_FLAGS="${b#*=}" $here/build.sh "build/fbs-full/$n" | tail -1 || exit 1
    mkdir -p "$dir/$n" && cp "build/fbs-full/$n/fused_bench" "build/fbs-full/$n/gpu_fused_test" "$dir/$n/" || exit 1
  done
  pack_builds "$dir"; exit
fi
unpack_builds "$dir" || exit 1
world=${2:-1}; rounds=${3:-2}
OUT=${OUT:-/tmp/spread_out}; mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
echo "commit $(cat $dir/commit.txt), world $world, rounds $rounds"
gpus=$(nvidia-smi -L | grep -c '^GPU')
if [ "$gpus" -ge 2 ]; then
  fused_test "$dir/spread/gpu_fused_test" "$OUT/spread_test.log" "spread, separate GPUs" || exit 1
fi
FC_TEST_SHARED_GPU=4 fused_test "$dir/spread/gpu_fused_test" "$OUT/spread_test_shared4.log" "spread, W = 1-4 on one GPU" || exit 1
shapes=${FC_SPREAD_SHAPES:-70b M=16384|S=16384|70b M=8192|S=8192}
rows=$OUT/spread_ab.jsonl; rm -f "$rows"
args=(--world "$world" --ops ag --sustain-ms 500 --batches 5 --ag-gathered 1 --shape "$shapes")
[ "$world" = 1 ] && args+=(--tp 2)
for r in $(seq 1 "$rounds"); do
  order="base spread"; [ $((r % 2)) = 0 ] && order="spread base"
  for b in $order; do
    rm -f /tmp/spread_rows.jsonl  # a failed run must not re-append the previous rows
    timeout 240 "$dir/$b/fused_bench" "${args[@]}" --out /tmp/spread_rows.jsonl >> "$OUT/spread_ab.log" 2>&1 \
      || echo "rc=$? $b round $r"
    [ -f /tmp/spread_rows.jsonl ] && sed "s/}\$/, \"build\": \"$b\", \"round\": $r}/" /tmp/spread_rows.jsonl >> "$rows"
  done
done
python3 - "$rows" <<'PY'
import collections, json, statistics, sys
d = collections.defaultdict(list)
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r.get("rank", 0) == 0:
        d[(r["shape"], r["impl"], r["build"])].append(r["ms_median"])
med = {k: statistics.median(v) for k, v in d.items()}
print("| shape | base fused ms | spread fused ms | spread / base | base fused/GEMM | spread fused/GEMM |")
print("|---|---:|---:|---:|---:|---:|")
for s in dict.fromkeys(k[0] for k in med):
    b, n = med.get((s, "ours_fused", "base")), med.get((s, "ours_fused", "spread"))
    gb, gn = med.get((s, "ours_gemm", "base")), med.get((s, "ours_gemm", "spread"))
    if b and n:
        print(f"| {s} | {b:.4f} | {n:.4f} | {n / b:.3f} | "
              f"{b / gb if gb else float('nan'):.3f} | {n / gn if gn else float('nan'):.3f} |")
PY
