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
. kernels/bench/collectives/ab_lib.sh
if [ "${1:-run}" = build ]; then
  ab_build build/pollab "p1k -DFC_COMM_POLL_SLEEP_NS=1024u" \
    "p4k -DFC_COMM_POLL_SLEEP_NS=4096u -DFC_COMM_POLL_SLEEP_LATE_NS=4096u" || exit 1
  tar cJf build/pollab.tar.xz -C build pollab; du -sh build/pollab.tar.xz; exit 0
fi
[ -d build/pollab ] || tar xJf build/pollab.tar.xz -C build || { echo "no build/pollab.tar.xz"; exit 1; }
ab_setup build/pollab
range="--min-bytes 67108864 --max-bytes 1073741824"
for v in def p1k p4k; do
  ab_bench ${v}_ar $b/coll_bench_$v $range --ops ar --algos 2,3
  ab_bench ${v}_agrs $b/coll_bench_$v $range --ops ag,rs --algos 2
done
ab_nccl ar,ag,rs 67108864 1073741824
python3 $ab_here/variants_report.py "$o"/ours_*.jsonl "$o"/nccl_w$w.jsonl | tee "$OUT/table.txt"
tar cJf "$OUT/logs.tar.xz" -C "$OUT" logs && rm -rf "$o"
