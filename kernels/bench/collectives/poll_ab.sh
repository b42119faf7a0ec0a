#!/usr/bin/env bash
# Do the collectives' flag polls slow their own NVLink transfers, as the fused allGatherGemm's
# chunk polls did (kernels/bench/fused/NOTES.md, "Run 11")? One device call: coll_bench at
# W = the host's GPU count (at most 4), 64 MiB-1 GiB, allReduce (two-phase, push), allGather and
# reduceScatter (two-phase), for three builds of the polls' sleep (comm_protocol.cuh:
# FC_COMM_POLL_SLEEP_NS / _LATE_NS): default 128 / 1024 ns, 1024 / 1024 and 4096 / 4096; then
# NCCL and variants_report.py's table (busbw, ratio to NCCL).
#   build (CPU machine): poll_ab.sh build  -> build/pollab.tar.xz (carry it)
#   run   (GPU host):    poll_ab.sh run    -> $OUT: table.txt, logs.tar.xz
set -uo pipefail
cd "$(dirname "$0")/../../.."
here=kernels/bench/collectives
if [ "${1:-run}" = build ]; then
  set -e
  $here/build.sh build/coll-bin > /dev/null
  COLL_NVCC_DEFS="-DFC_COMM_POLL_SLEEP_NS=1024u" $here/build.sh build/coll-p1k > /dev/null
  COLL_NVCC_DEFS="-DFC_COMM_POLL_SLEEP_NS=4096u -DFC_COMM_POLL_SLEEP_LATE_NS=4096u" $here/build.sh build/coll-p4k > /dev/null
  rm -rf build/pollab && mkdir -p build/pollab
  cp build/coll-bin/coll_bench build/pollab/coll_bench_def
  cp build/coll-p1k/coll_bench build/pollab/coll_bench_p1k
  cp build/coll-p4k/coll_bench build/pollab/coll_bench_p4k
  strip --strip-unneeded build/pollab/*
  git rev-parse --short HEAD > build/pollab/commit.txt
  tar cJf build/pollab.tar.xz -C build pollab; du -sh build/pollab.tar.xz; exit 0
fi
[ -d build/pollab ] || tar xJf build/pollab.tar.xz -C build || { echo "no build/pollab.tar.xz"; exit 1; }
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/pollab_out}; o=$OUT/logs; mkdir -p "$o"
b=build/pollab; t0=$SECONDS
w=$(nvidia-smi -L | wc -l); [ "$w" -gt 4 ] && w=4
echo "commit $(cat $b/commit.txt), world $w"
min=67108864; max=1073741824
for v in def p1k p4k; do
  timeout 100 $b/coll_bench_$v --world $w --min-bytes $min --max-bytes $max --label $v --ops ar \
    --algos 2,3 --out "$o/ours_${v}_ar_w$w.jsonl" >> "$o/bench.log" 2>&1 || echo "$v ar rc=$?"
  timeout 100 $b/coll_bench_$v --world $w --min-bytes $min --max-bytes $max --label $v --ops ag,rs \
    --algos 2 --out "$o/ours_${v}_agrs_w$w.jsonl" >> "$o/bench.log" 2>&1 || echo "$v ag,rs rc=$?"
  echo "$v done [$((SECONDS - t0)) s]"
done
timeout 120 torchrun --nproc-per-node $w $here/nccl_bench.py --ops ar,ag,rs --min-bytes $min \
  --max-bytes $max --out "$o/nccl_w$w.jsonl" >> "$o/nccl.log" 2>&1 || echo "nccl rc=$?"
echo "nccl done [$((SECONDS - t0)) s]"
python3 $here/variants_report.py "$o"/ours_*.jsonl "$o"/nccl_w$w.jsonl | tee "$OUT/table.txt"
tar cJf "$OUT/logs.tar.xz" -C "$OUT" logs && rm -rf "$o"
