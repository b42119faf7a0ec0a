#!/usr/bin/env bash
# Where the fused kernels' time over our GEMM alone goes, tile by tile (fused_bench built with
# -DFC_GEMM_TRACE: engine_trace), on a host with 2+ GPUs, in one device call (~1-2 min at W = 2):
#   build (CPU machine): kernels/bench/fused/engine_trace_run.sh build -> build/etr.tar.xz (carry it)
#   run   (GPU host):    kernels/bench/fused/engine_trace_run.sh run [world=2] -> $OUT/etr/*
# Builds (each with -DFC_GEMM_TRACE): `build name=FLAGS ...` (default: def, the default kernels);
# FC_ETR_TEST=name carries that build's gpu_fused_test too (run first). Run 13's diagnostic
# switches (FUSEDCOMM_RS_DIAG, FUSEDCOMM_RS_L2HINT; fused/NOTES.md "Run 13") stand at ab11138.
# Prints per build, shape and impl rank 0's two traces of gemmReduceScatter (bf16 partials): the
# launch, the SM clock (cycles over ns), the main loop and the epilogue per tile; then the
# main-loop cycles per tile of ours_fused over ours_gemm.
set -uo pipefail
cd "$(dirname "$0")/../../.."
here=kernels/bench/fused
out=build/etr
. $here/builds_lib.sh
if [ "${1:-run}" = build ]; then
  shift
  # Builds as name=FLAGS (each also gets -DFC_GEMM_TRACE).
  builds=("$@"); [ ${#builds[@]} -gt 0 ] || builds=(def=)
  fused_variants $out etr -DFC_GEMM_TRACE "${builds[@]}" || exit 1
  [ -n "${FC_ETR_TEST:-}" ] && cp build/etr-$FC_ETR_TEST/gpu_fused_test $out/$FC_ETR_TEST/
  pack_builds $out; exit
fi
unpack_builds $out || exit 1
world=${2:-2}
OUT=${OUT:-/tmp/etr_out}; o=$OUT/etr; mkdir -p "$o"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# At most ~8 files come back: all but the trace logs go into one archive.
trap 'kernels/bench/pack_out.sh "$OUT" etr_rest.tar.xz "etr/trace_*.log"' EXIT
echo "commit $(cat $out/commit.txt)"
for b in $(cat $out/order.txt); do
  [ -x $out/$b/gpu_fused_test ] && fused_test $out/$b/gpu_fused_test "$o/test_$b.log" "$b" 150
  # FC_ETR_ARGS: more fused_bench arguments, e.g. "--ops ag,rs --shape M=1024 --split-decomposed"
  # (then ours_gemm is traced after a collective too, as the decomposed path runs it).
  timeout 120 $out/$b/fused_bench --world "$world" --ops rs --rs-partials bf16 --batches 2 \
    ${FC_ETR_ARGS:-} --out "$o/rows_$b.jsonl" > "$o/trace_$b.log" 2>&1; echo "$b rc=$?"
done
python3 - "$o" <<'PY'
import re, sys, glob, os
pat = re.compile(r"engine_trace (\S+) (.+?) (ours_\w+(?: after collective)?) rank 0: launch ([\d.]+) us.*?SM clock p50 (\d+) MHz.*?"
                 r"epilogue ([\d.]+), first-stage wait ([\d.]+)\), main loop ([\d.]+) us")
print(f"{'build':5} {'op':18} {'shape':20} {'impl':26} {'launch us':>19} {'MHz':>11} {'main loop us':>15} {'epilogue us':>13}")
all_rows = {}
for log in sorted(glob.glob(os.path.join(sys.argv[1], "trace_*.log"))):
    b = os.path.basename(log)[6:-4]
    rows = {}
    for line in open(log):
        m = pat.search(line)
        if m:
            op, shape, impl, launch, mhz, epi, wait, main = m.groups()
            rows.setdefault((op, shape, impl), []).append((float(launch), int(mhz), float(main), float(epi)))
    for (op, shape, impl), v in rows.items():
        f = lambda i, fmt: "/".join(fmt.format(x[i]) for x in v)
        print(f"{b:5} {op:18} {shape:20} {impl:26} {f(0, '{:.0f}'):>19} {f(1, '{}'):>11} {f(2, '{:.2f}'):>15} {f(3, '{:.2f}'):>13}")
    all_rows[b] = rows
# Main-loop cycles per tile (MHz x us, both traces), fused over GEMM alone, per build and shape.
builds = sorted(all_rows)
shapes = sorted({(op, sh) for r in all_rows.values() for (op, sh, _) in r})
print("main-loop cycles per tile, ours_fused / ours_gemm:")
print(f"{'op':18} {'shape':20}" + "".join(f"{b:>8}" for b in builds))
for op, sh in shapes:
    line = f"{op:18} {sh:20}"
    for b in builds:
        f, g = all_rows[b].get((op, sh, "ours_fused")), all_rows[b].get((op, sh, "ours_gemm"))
        cyc = lambda v: sum(x[1] * x[2] for x in v) / len(v)
        line += f"{cyc(f) / cyc(g):8.3f}" if f and g and cyc(g) > 0 else f"{'-':>8}"
    print(line)
PY
