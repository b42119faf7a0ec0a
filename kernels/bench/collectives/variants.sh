#!/usr/bin/env bash
# Tuning sweep of compile-time variants of collectives.cu (FC_* macros), ours only, large sizes.
#   build (CPU machine): variants.sh build [root=build/coll-var]   (after build.sh build/coll-bin)
#   run   (GPU host):    variants.sh run   [root=build/coll-var]   -> table, best variant name
# A variant "orig" is built from /tmp/orig_collectives.cu when present (copy the baseline there).
set -uo pipefail
cd "$(dirname "$0")/../../.."
mode=${1:-run}; root=${2:-build/coll-var}
# name|nvcc defines
variants=(
  "C|-DFC_RED_UNROLL=2 -DFC_COPY_UNROLL=8"
  "F|-DFC_RED_UNROLL=1 -DFC_COPY_UNROLL=8"
)
inc="-Ikernels/include -Iexecutor-native/include -Iexecutor-native/tests -Irdma/include"
flags="-O2 -std=c++17 -arch=sm_90a --expt-relaxed-constexpr -cudart static"
if [ "$mode" = build ]; then
  objs=build/coll-bin
  build_one() {  # name src defs
    local d=$root/$1; mkdir -p "$d"
    nvcc $flags $3 $inc -c "$2" -o "$d/collectives.o" -Xptxas=-warn-spills || return 1
    nvcc $flags "$objs/coll_bench.o" "$d/collectives.o" "$objs/symmetric_memory.o" -o "$d/coll_bench"
    nvcc $flags "$objs/gpu_collectives_test.o" "$d/collectives.o" "$objs/symmetric_memory.o" -o "$d/gpu_collectives_test"
    rm -f "$d/collectives.o"; echo "$3" > "$d/defs.txt"
  }
  [ -f /tmp/orig_collectives.cu ] && build_one orig /tmp/orig_collectives.cu ""
  for v in "${variants[@]}"; do build_one "${v%%|*}" kernels/src/collectives.cu "${v#*|}"; done  # one nvcc at a time
  ls -la "$root"/*; exit 0
fi
OUT=${OUT:-/tmp/coll_out}; mkdir -p "$OUT/variants"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
ngpu=$(nvidia-smi -L | wc -l)
# Runs: label:variant-dir from $RUNS, or every variant. A pull-CTA sweep is a set of variants
# built with -DFC_PULL_CTAS_W2=N / -DFC_PULL_CTAS_W4=N.
runs=${RUNS:-$(for d in "$root"/*/; do echo "$(basename $d):$(basename $d)"; done)}
for run in $runs; do
  IFS=: read -r n v <<< "$run"
  for w in 4 2; do
    [ $w -le $ngpu ] || continue
    timeout 90 "$root/$v/coll_bench" --world $w --ops ${OPS:-ag,rs,ar} --min-bytes 67108864 --out "$OUT/variants/$n.w$w.jsonl" > /dev/null 2>&1 || echo "$n w=$w rc=$?"
  done
done
python3 - "$OUT/variants" <<'PY'
import json, glob, math, os, sys, collections
rows = collections.defaultdict(dict)
for f in sorted(glob.glob(sys.argv[1] + "/*.jsonl")):
    n = os.path.basename(f).split(".w")[0]
    for l in open(f):
        j = json.loads(l); rows[n][({"allGather":"ag","reduceScatter":"rs","allReduce":"ar","allToAll":"a2a"}[j["op"]] + str(j["world"]), j["bytes"] >> 20)] = j["busbw"]
keys = sorted({k for r in rows.values() for k in r})
print("variant " + " ".join(f"{o}/{m}M".rjust(7) for o, m in keys) + "  geomean")
best, bestg = None, 0
for n, r in rows.items():
    vals = [r.get(k, 0) for k in keys]
    full = all(v > 0 for v in vals)
    g = math.exp(sum(math.log(v) for v in vals) / len(vals)) if full else 0
    print(f"{n:8s}" + " ".join(f"{v:7.0f}" for v in vals) + f"  {g:6.1f}")
    if full and not n.startswith(("orig", "Cctas")) and g > bestg: best, bestg = n, g
open(sys.argv[1] + "/best.txt", "w").write(best or "")
print("best:", best)
PY
