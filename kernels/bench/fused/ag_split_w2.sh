#!/usr/bin/env bash
# One device call on 2 x H200 (~1.5 min): the fused allGatherGemm at W = 2 at the shapes that
# missed target 1 in run 31, with kAuto's split (d), 8 or 4 pulling CTAs (--ctas) and the
# copy-engine exchange (ce), two rounds in alternating order; carries build/fbr.tar.xz (a build
# of HEAD, docs/gpu-runs-owed.md). Rows: $OUT/agsplit.jsonl; prints the table.
tar xJf build/fbr.tar.xz -C build 2>/dev/null
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
S="8b M=16384|70b M=4096|70b M=8192|70b M=16384|S=16384"
for r in 1 2; do
  vs="d c8 c4 ce"; [ $r = 2 ] && vs="ce c4 c8 d"
  for v in $vs; do
    case $v in d) x="";; c8) x="--ctas 8";; c4) x="--ctas 4";; ce) x="--ag-exchange ce";; esac
    rm -f /tmp/x.jsonl
    timeout 150 build/fbr/fused_bench --world 2 --ops ag --sustain-ms 500 --batches 5 --ag-gathered 1 --shape "$S" $x --out /tmp/x.jsonl > /dev/null 2>&1 || echo "rc=$? $v"
    sed "s|}\$|, \"variant\": \"$v\", \"round\": $r}|" /tmp/x.jsonl >> $OUT/agsplit.jsonl
  done
done
python3 - $OUT/agsplit.jsonl <<'PY'
import json, sys, collections, statistics
d = collections.defaultdict(list)
for l in open(sys.argv[1]):
    r = json.loads(l)
    if r['impl'] in ('ours_fused', 'ours_gemm'):
        d[(r['shape'], r['impl'], r['variant'])].append(max(r['ms_ranks']))
vs = ['d', 'c8', 'c4', 'ce']
print('fused ms (slowest rank, median of rounds); ratio to default; default fused/GEMM')
for s in dict.fromkeys(k[0] for k in d):
    b = statistics.median(d[(s, 'ours_fused', 'd')]); g = statistics.median(d[(s, 'ours_gemm', 'd')])
    print(f"{s:22} d {b:.4f} f/g {b/g:.3f} " + " ".join(f"{v} {statistics.median(d[(s,'ours_fused',v)])/b:.3f} {['%.4f'%x for x in d[(s,'ours_fused',v)]]}" for v in vs[1:] if (s,'ours_fused',v) in d))
PY
