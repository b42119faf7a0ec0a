#!/usr/bin/env python3
"""Fused-op baselines (torch.distributed, one process per GPU, bf16) on fused_bench's shape list,
timed as fused_bench.cc times ours (2 warm-up calls, one timed call that sizes the batches, each
impl run back to back for --sustain-ms, then --batches batches of back-to-back calls between CUDA
events on rank 0, a barrier and a sync before each; the median of the per-call batch means).

impls per (op, shape):
  torch_serial      cuBLAS + NCCL on one stream: all_gather_into_tensor then A @ W.t()
                    (allGatherGemm); A @ W.t() then reduce_scatter_tensor (gemmReduceScatter,
                    bf16 partials, as NCCL sums them); A @ W.t() then all_reduce (gemmAllReduce)
  torch_symm_mem    PyTorch symmetric memory's fused ops, multicast off:
                    _fused_all_gather_matmul, _fused_matmul_reduce_scatter; gemmAllReduce (no
                    fused op in torch): A @ W.t() into a symmetric buffer, then
                    torch.ops.symm_mem.two_shot_all_reduce_
  gemmAllReduce only, captured in a CUDA graph (as inference engines run decode steps):
  torch_serial_graph          torch_serial's cuBLAS + NCCL all_reduce
  torch_symm_one_shot_graph   A @ W.t() into a symmetric buffer, then one_shot_all_reduce
  torch_symm_two_shot_graph   torch_symm_mem's calls (two_shot_all_reduce_)
  cublas_gemm_only  the cuBLAS GEMM alone (this rank's local shape)
  nccl_comm_only    the NCCL collective alone (bf16)
Each op impl's output is checked against an fp32 reference before it is timed.

  torchrun --nproc-per-node W torch_fused.py --shapes bench/shapes/fused.txt --out rows.jsonl
  torchrun --nproc-per-node W torch_fused.py --m 1000 --n 4104 --k 2056 [--ops rs] --out rows.jsonl

Shapes: a shape file and/or explicit shapes (--m/--n/--k, comma lists, the i-th M with the i-th
N and K, a single value for all, run for every op of --ops, label "explicit"), as fused_bench.
M need not divide by W: allGatherGemm's and gemmReduceScatter's collectives take equal blocks,
so where W does not divide M each rank's block of A's rows is padded with zero rows up to
ceil(M / W) (rank r holds M // W rows, one more for r < M % W, as ours splits them), and the
baselines compute and move those rows too, inside their timed calls; the rows' FLOP count stays
2·M·N·K. A split N or K off a multiple of 8 per rank is refused, as fused_bench refuses it.

NCCL_NVLS_ENABLE=0 and TORCH_SYMM_MEM_DISABLE_MULTICAST=1 must be set (run.sh does).
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
import torch_dist  # noqa: E402

OPS = {"ag": "allGatherGemm", "rs": "gemmReduceScatter", "ar": "gemmAllReduce"}


def read_shapes(path, world, ops, explicit=()):
    """(op, label, M, N, K, set) with N (allGatherGemm) or K (the others) split over the world:
    the file's lines ("<op> <label> <M> <N> <K> [<set>]"; path may be None; set "" where the line
    names none), then each explicit (M, N, K) for every op of `ops`. A split off a multiple of 8
    per rank is refused (SystemExit naming every such shape)."""
    lines = []
    for line in open(path) if path else []:
        w = line.split("#")[0].split()
        if not w:
            continue
        if len(w) not in (5, 6) or w[0] not in OPS.values():
            raise SystemExit(f"{path}: expected '<op> <label> <M> <N> <K> [<set>]', got {line!r}")
        lines.append((w[0], w[1], int(w[2]), int(w[3]), int(w[4]), w[5] if len(w) == 6 else ""))
    for m, n, k in explicit:
        lines += [(op, "explicit", m, n, k, "") for op in OPS.values() if op in ops]
    out, refused = [], []
    for op, label, m, n, k, sname in lines:
        if op not in ops:
            continue
        split = n if op == "allGatherGemm" else k
        if min(m, n, k) < 1 or split % (8 * world):
            refused.append(f"{op} {label} {m} x {n} x {k}")
            continue
        if op == "allGatherGemm":
            n //= world
        else:
            k //= world
        out.append((op, label, m, n, k, sname))
    if refused:
        raise SystemExit(f"shapes refused (N or K must split into multiples of 8 over {world} ranks; nothing is "
                         "padded): " + "; ".join(refused))
    return out


def row_split(m, world, rank):
    """Rank `rank`'s rows of M (count, offset) as ours splits them, and the padded block
    height ceil(M / W) of the baselines' equal-block collectives."""
    count = m // world + (1 if rank < m % world else 0)
    offset = rank * (m // world) + min(rank, m % world)
    return count, offset, -(-m // world)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", help="shape file")
    ap.add_argument("--m", help="explicit shapes' M: a comma list")
    ap.add_argument("--n", help="explicit shapes' N (whole, before the split)")
    ap.add_argument("--k", help="explicit shapes' K (whole, before the split)")
    ap.add_argument("--out", required=True, help="rows as JSON lines (rank 0)")
    ap.add_argument("--ops", default="ag,rs,ar", help="any of ag, rs, ar")
    ap.add_argument("--batch-ms", type=float, default=25.0)
    ap.add_argument("--batches", type=int, default=7)
    ap.add_argument("--sustain-ms", type=float, default=500.0,
                    help="each impl back to back this long before its batches (0: none)")
    args = ap.parse_args()
    ops = {OPS[x] for x in args.ops.split(",") if x in OPS}
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "gemm"))
    from torch_gemm import explicit_shapes  # noqa: E402
    explicit = explicit_shapes(*([v] if v else None for v in (args.m, args.n, args.k)))
    if not args.shapes and not explicit:
        raise SystemExit("give --shapes FILE or --m/--n/--k")

    import torch
    import torch.distributed as dist
    torch.backends.cuda.matmul.allow_tf32 = False  # the references are fp32
    rank, world, dev = torch_dist.init()
    shapes = read_shapes(args.shapes, world, ops, explicit)
    group_name = dist.group.WORLD.group_name
    try:
        import torch.distributed._symmetric_memory as symm
        if hasattr(symm, "enable_symm_mem_for_group"):
            symm.enable_symm_mem_for_group(group_name)
    except Exception as e:  # the rows then lack torch_symm_mem; the log says why
        print(f"rank {rank}: symmetric memory unavailable: {e!r}", file=sys.stderr)
        symm = None
    f = open(args.out, "w") if rank == 0 else None
    gen = torch.Generator(device=dev)
    gen.manual_seed(1234 + rank)

    def rand(*shape):
        return torch.rand(*shape, generator=gen, device=dev, dtype=torch.float32).mul_(2).sub_(1).to(torch.bfloat16)

    def time_call(call):
        return torch_dist.sized_median_ms(call, dev, args.batch_ms, args.sustain_ms, args.batches)

    graphs = []  # kept alive until the shape's calls are dropped

    def setup(op, label, M, N, K, checking):
        """The calls of one shape and its checks; with `checking`, the fp32 reference too."""
        ref = absdot = None
        is_ag, is_ar = op == "allGatherGemm", op == "gemmAllReduce"
        flops = 2.0 * M * N * K
        wire = (2 if is_ar else 1) * (world - 1) / world * M * (K if is_ag else N) * 2.0  # bf16 on the wire
        w = rand(N, K)  # a linear layer's weight: C = A @ w.t()
        # calls: impl -> the call; checks: op impl -> (its output buffer, poisoned before the
        # check, or None; the output from the call's return value).
        calls, checks = {}, {}
        rows_r, _, block = row_split(M, world, rank)  # block: the padded rows per rank
        if is_ag:
            a_shard = rand(block, K)
            a_shard[rows_r:].zero_()  # padding rows where W does not divide M
            a_full = torch.empty(block * world, K, device=dev, dtype=torch.bfloat16)
            c = torch.empty(block * world, N, device=dev, dtype=torch.bfloat16)

            def serial():
                dist.all_gather_into_tensor(a_full, a_shard)
                torch.matmul(a_full, w.t(), out=c)

            calls["torch_serial"], checks["torch_serial"] = serial, (c, lambda _: c)
            if symm is not None:
                calls["torch_symm_mem"] = lambda: symm._fused_all_gather_matmul(a_shard, [w.t()], 0, group_name)
                checks["torch_symm_mem"] = (None, lambda res: res[1][0])
            calls["cublas_gemm_only"] = lambda: torch.matmul(a_full, w.t(), out=c)
            calls["nccl_comm_only"] = lambda: dist.all_gather_into_tensor(a_full, a_shard)
            dist.all_gather_into_tensor(a_full, a_shard)  # the reference's gathered A (a bit copy)
            if checking:
                ref, absdot = a_full.float() @ w.float().t(), a_full.float().abs() @ w.float().abs().t()
            partial_rel = 0.0
        else:
            # gemmAllReduce: A as given; gemmReduceScatter: rank r's rows of C in block r, each
            # block padded with zero rows of A to ceil(M / W) rows.
            if is_ar:
                a = rand(M, K)
            else:
                a = rand(block * world, K)
                for r in range(world):
                    a[r * block + row_split(M, world, r)[0]:(r + 1) * block].zero_()
            p = torch.empty(a.shape[0], N, device=dev, dtype=torch.bfloat16)
            if checking:
                ref, absdot = a.float() @ w.float().t(), a.float().abs() @ w.float().abs().t()
                dist.all_reduce(ref)
                dist.all_reduce(absdot)
            # NCCL sums bf16 partials in bf16 steps: up to one rounding per rank.
            partial_rel = world / 512
            if is_ar:
                def serial():
                    torch.matmul(a, w.t(), out=p)
                    dist.all_reduce(p)

                calls["torch_serial"], checks["torch_serial"] = serial, (p, lambda _: p)
                if symm is not None:
                    try:
                        p_symm = symm.empty(M, N, device=dev, dtype=torch.bfloat16)
                        symm.rendezvous(p_symm, group_name)

                        def symm_ar():
                            torch.matmul(a, w.t(), out=p_symm)
                            torch.ops.symm_mem.two_shot_all_reduce_(p_symm, "sum", group_name)

                        calls["torch_symm_mem"], checks["torch_symm_mem"] = symm_ar, (p_symm, lambda _: p_symm)
                    except Exception as e:  # e.g. an older torch: the serial baseline remains
                        print(f"rank {rank}: no symm_mem allReduce for {label}: {e!r}", file=sys.stderr)
                    # What inference engines run at decode sizes: the GEMM and the allReduce
                    # captured in a CUDA graph (one_shot_all_reduce: out of place, every rank
                    # reads every peer's buffer; two_shot_all_reduce_: in place). Up to 2^24
                    # elements (32 MiB): past that no engine runs these.
                    try:
                        if M * N > 1 << 24:
                            raise ValueError("not timed above 2^24 elements")
                        g_one, out_one = torch_dist.graphed(lambda: (
                            torch.matmul(a, w.t(), out=p_symm),
                            torch.ops.symm_mem.one_shot_all_reduce(p_symm, "sum", group_name))[1], graphs)
                        calls["torch_symm_one_shot_graph"] = g_one.replay
                        checks["torch_symm_one_shot_graph"] = (out_one, lambda _, o=out_one: o)
                        g_two, _ = torch_dist.graphed(symm_ar, graphs)
                        calls["torch_symm_two_shot_graph"] = g_two.replay
                        checks["torch_symm_two_shot_graph"] = (p_symm, lambda _: p_symm)
                    except Exception as e:
                        print(f"rank {rank}: no graph-captured symm_mem allReduce for {label}: {e!r}",
                              file=sys.stderr)
                g_serial, _ = torch_dist.graphed(serial, graphs)
                calls["torch_serial_graph"] = g_serial.replay
                checks["torch_serial_graph"] = (p, lambda _: p)
                calls["cublas_gemm_only"] = lambda: torch.matmul(a, w.t(), out=p)
                calls["nccl_comm_only"] = lambda: dist.all_reduce(p)
            else:
                out = torch.empty(block, N, device=dev, dtype=torch.bfloat16)
                rows = slice(rank * block, (rank + 1) * block)
                if checking:
                    ref, absdot = ref[rows].contiguous(), absdot[rows].contiguous()

                def serial():
                    torch.matmul(a, w.t(), out=p)
                    dist.reduce_scatter_tensor(out, p)

                calls["torch_serial"], checks["torch_serial"] = serial, (out, lambda _: out)
                if symm is not None:
                    calls["torch_symm_mem"] = lambda: symm._fused_matmul_reduce_scatter(a, w.t(), "sum", 0, group_name)
                    checks["torch_symm_mem"] = (None, lambda res: res)
                calls["cublas_gemm_only"] = lambda: torch.matmul(a, w.t(), out=p)
                calls["nccl_comm_only"] = lambda: dist.reduce_scatter_tensor(out, p)
        return calls, checks, ref, absdot, partial_rel, flops, wire

    # Two passes, as fused_bench: every shape is checked first (each op impl once, output poisoned
    # first, every rank), then every shape is timed, so that no timing follows the fp32 reference.
    failed = 0
    bad = {}
    for op, label, M, N, K, sname in shapes:
        calls, checks, ref, absdot, partial_rel, flops, wire = setup(op, label, M, N, K, True)
        bad_impls = []
        for impl, (buf, output) in checks.items():
            try:
                if buf is not None:
                    buf.fill_(float("nan"))
                got = output(calls[impl]())
                torch.cuda.synchronize()
                wrong = int((~((got.float() - ref).abs() <= 8e-3 * ref.abs() + (2e-5 + partial_rel) * absdot + 1e-6)).sum())
            except Exception as e:
                print(f"rank {rank}: {impl} {op} {label} failed: {e!r}", file=sys.stderr)
                wrong = -1
            t = torch.tensor([wrong != 0], device=dev, dtype=torch.int32)
            dist.all_reduce(t)
            if t.item():
                bad_impls.append(impl)
                if f:
                    print(f"{op:18s} W={world} {label:12s} M={M:<6d} {impl}: check FAILED", flush=True)
        bad[(op, label, M, sname)] = bad_impls
        failed += len(bad_impls)
        del calls, checks, ref, absdot
        graphs.clear()
        torch.cuda.empty_cache()
    for op, label, M, N, K, sname in shapes:
        calls, checks, _, _, _, flops, wire = setup(op, label, M, N, K, False)
        for impl in bad[(op, label, M, sname)]:
            del calls[impl]
        for impl, call in calls.items():
            ms, iters = time_call(call)
            mine = torch.tensor([ms], dtype=torch.float64, device=dev)
            ranks = [torch.empty_like(mine) for _ in range(world)]
            dist.all_gather(ranks, mine)
            if f:
                row = dict(family="fused", op=op, impl=impl, world=world, shape=dict(m=M, n=N, k=K),
                           dtype="bf16", ms_median=ms, tflops=flops / (ms * 1e-3) / 1e12,
                           gbps=wire / (ms * 1e-3) / 1e9, label=label, iters=iters,
                           batches=args.batches, sustain_ms=args.sustain_ms,
                           ms_ranks=[t.item() for t in ranks], torch=torch.__version__,
                           nccl=".".join(map(str, torch.cuda.nccl.version())))
                if op != "allGatherGemm" and impl in checks:
                    row["partials"] = "bf16"
                if sname:
                    row["set"] = sname
                f.write(json.dumps(row) + "\n")
                f.flush()
                print(f"{op:18s} W={world} {label:12s} M={M:<6d} {impl:21s} {ms:9.4f} ms "
                      f"{row['tflops']:7.1f} TF/s {row['gbps']:7.1f} GB/s", flush=True)
        del calls, checks
        graphs.clear()
        torch.cuda.empty_cache()
    torch_dist.finish(f)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
