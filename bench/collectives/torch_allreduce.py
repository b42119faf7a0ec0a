#!/usr/bin/env python3
"""allReduce baselines at small and medium sizes (bench/shapes/allreduce_small.txt): NCCL and
PyTorch symmetric memory's one-shot and two-shot kernels, each eager and captured in a CUDA
graph, one process per GPU, bf16, timed as coll_bench.cc --graph times ours.

impls per size:
  nccl                        dist.all_reduce, in place
  nccl_graph                  the same call captured in a CUDA graph, a replay per call
  torch_symm_one_shot         torch.ops.symm_mem.one_shot_all_reduce: out of place, every rank
                              reads every peer's symmetric input buffer
  torch_symm_one_shot_graph   the same captured (its output static across replays)
  torch_symm_two_shot         torch.ops.symm_mem.two_shot_all_reduce_: in place on the symmetric
                              buffer (reduce-scatter then all-gather)
  torch_symm_two_shot_graph   the same captured
Each impl's output is checked on every rank before it is timed: the input holds check.h's
values (coll_bench's), which sum exactly, so the output must equal the reference sum bit for
bit. Then 5 warm-up calls and 10 batches of `iters` back-to-back calls between CUDA events on
rank 0, a barrier and a sync before each batch; the median of the batches' per-call means.
An op this torch lacks, or one that raises, is reported on stderr and gets a row with an error
and no time (report.py lists it), never a time from something else.

  torchrun --nproc-per-node W torch_allreduce.py --shapes bench/shapes/allreduce_small.txt \\
      --set small-medium --out rows.jsonl

NCCL_NVLS_ENABLE=0 and TORCH_SYMM_MEM_DISABLE_MULTICAST=1 must be set (run.sh does): NVLink
multicast stays off on shared hosts, so the symmetric-memory ops run their unicast kernels.
"""
import argparse
import gc
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
import torch_dist  # noqa: E402

IMPLS = ("nccl", "nccl_graph", "torch_symm_one_shot", "torch_symm_one_shot_graph", "torch_symm_two_shot",
         "torch_symm_two_shot_graph")
CHUNK = 1 << 24  # elements per step of the check (bounds its temporary memory)


def read_sizes(path):
    """The allReduce sizes (bytes) of a collectives list ("<op> <bytes>..."); another op, or a
    size that is not a positive even number of bytes (bf16), is refused."""
    sizes = []
    for line in open(path):
        words = line.split("#")[0].split()
        if not words:
            continue
        if words[0] != "allReduce":
            raise SystemExit(f"{path}: torch_allreduce.py times allReduce only, not {words[0]}")
        for w in words[1:]:
            if not w.isdigit() or int(w) <= 0 or int(w) % 2:
                raise SystemExit(f"{path}: '{w}' is not a size in bytes of bf16 elements")
            sizes.append(int(w))
    if not sizes:
        raise SystemExit(f"{path}: no allReduce sizes")
    return sizes


def parse_impls(text):
    """A comma list of IMPLS (in IMPLS' order); an unknown name is refused."""
    names = [x for x in text.split(",") if x]
    unknown = [x for x in names if x not in IMPLS]
    if unknown or not names:
        raise SystemExit(f"--impls: unknown {', '.join(unknown) or '(empty)'}; choose from {', '.join(IMPLS)}")
    return [x for x in IMPLS if x in names]


def iters_for(nbytes):
    """Calls per timed batch, as coll_bench.cc and nccl_bench.py choose them."""
    return 200 if nbytes <= (1 << 20) else 20 if nbytes <= (64 << 20) else 5


def value(i, rank):
    """check.h's fill_pattern at index i of rank `rank`: ((7 i + 13 rank + 5) mod 31) - 15. On
    Python ints and on integer arrays or tensors alike."""
    return (7 * i + 13 * rank + 5) % 31 - 15


def allreduce_sum(i, world):
    """The allReduce's exact result at index i: the sum of every rank's value."""
    return sum(value(i, p) for p in range(world))


def mismatches(out, world, arange, chunk=CHUNK):
    """Elements of the 1-D `out` that differ from allreduce_sum; arange(a, b) gives the indices
    a..b-1 where `out` lives (torch.arange on its device, numpy.arange in the tests). The sums
    are small integers, exact in bf16, so equality is the test (a NaN never passes)."""
    bad = 0
    for s in range(0, len(out), chunk):
        got = out[s:s + chunk]
        bad += int((got != allreduce_sum(arange(s, s + len(got)), world)).sum())
    return bad


def busbw_factor(world):
    """nccl-tests' allReduce bus bandwidth factor."""
    return 2.0 * (world - 1) / world


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", required=True, help="a collectives list; its allReduce sizes")
    ap.add_argument("--out", required=True, help="rows as JSON lines (rank 0)")
    ap.add_argument("--set", default="small-medium", help="the rows' set (report.py tabulates a set apart)")
    ap.add_argument("--impls", default=",".join(IMPLS), help="a comma list of: " + ", ".join(IMPLS))
    args = ap.parse_args(argv)
    sizes = read_sizes(args.shapes)
    impls = parse_impls(args.impls)
    if os.environ.get("TORCH_SYMM_MEM_DISABLE_MULTICAST") != "1":
        raise SystemExit("export TORCH_SYMM_MEM_DISABLE_MULTICAST=1 (NVLink multicast stays off)")

    import torch
    import torch.distributed as dist
    rank, world, dev = torch_dist.init()
    group_name = dist.group.WORLD.group_name
    symm, symm_why = None, None
    want_symm = any(i.startswith("torch_symm") for i in impls)
    if want_symm:
        try:
            import torch.distributed._symmetric_memory as symm
            if hasattr(symm, "enable_symm_mem_for_group"):
                symm.enable_symm_mem_for_group(group_name)
        except Exception as e:  # those impls then get error rows
            symm, symm_why = None, f"symmetric memory unavailable: {e!r}"
    ops = {}
    for name, op in (("one_shot", "one_shot_all_reduce"), ("two_shot", "two_shot_all_reduce_")):
        ops[name] = getattr(torch.ops.symm_mem, op, None) if symm is not None else None
    f = open(args.out, "w") if rank == 0 else None
    nccl = ".".join(map(str, torch.cuda.nccl.version()))
    keep = []  # symmetric buffers and graphs, alive until the end (peers map the buffers)

    def arange(a, b):
        return torch.arange(a, b, device=dev)

    def fill(t):
        for s in range(0, t.numel(), CHUNK):
            n = min(CHUNK, t.numel() - s)
            t[s:s + n] = value(arange(s, s + n), rank).to(t.dtype)

    def agreed(flag):
        """True when `flag` holds on every rank."""
        t = torch.tensor([0 if flag else 1], device=dev, dtype=torch.int32)
        dist.all_reduce(t)
        return t.item() == 0

    def write(impl, b, placement, iters, ms=None, error=None):
        if not f:
            return
        row = dict(family="collectives", op="allReduce", impl=impl, world=world, shape=dict(bytes=b),
                   dtype="bf16", ms_median=ms, tflops=None, gbps=None, algbw=None, placement=placement,
                   set=args.set, iters=iters, torch=torch.__version__, nccl=nccl)
        if ms is not None:
            row["algbw"] = b / (ms * 1e-3) / 1e9
            row["gbps"] = row["algbw"] * busbw_factor(world)
            print(f"allReduce      W={world} {b:11d} B  check passed  {ms:9.4f} ms  busbw {row['gbps']:7.1f} GB/s  "
                  f"({impl})", flush=True)
        else:
            row["error"] = error
            print(f"allReduce      W={world} {b:11d} B  {impl}: {error}", flush=True)
        f.write(json.dumps(row) + "\n")
        f.flush()

    failed = 0
    for b in sizes:
        n = b // 2
        iters = iters_for(b)
        plain = torch.empty(n, dtype=torch.bfloat16, device=dev)
        sbuf, sbuf_why = None, symm_why
        if want_symm and symm is not None:
            try:
                sbuf = symm.empty(n, device=dev, dtype=torch.bfloat16)
                symm.rendezvous(sbuf, group_name)
                keep.append(sbuf)
            except Exception as e:
                sbuf, sbuf_why = None, f"no symmetric buffer: {e!r}"
        if not agreed(sbuf is not None or not want_symm):
            sbuf, sbuf_why = None, sbuf_why or "no symmetric buffer on some rank"

        def nccl_call():
            dist.all_reduce(plain)

        # impl -> (eager call, buffer filled before the check, output checked or None for the
        # call's return value, placement); None where the impl cannot run here, with why.
        eager = {"nccl": (nccl_call, plain, plain, "in-place")}
        why = {}
        for name in ("one_shot", "two_shot"):
            impl = f"torch_symm_{name}"
            op = ops[name]
            if sbuf is None:
                why[impl] = sbuf_why
            elif op is None:
                why[impl] = f"torch {torch.__version__} lacks torch.ops.symm_mem." + (
                    "one_shot_all_reduce" if name == "one_shot" else "two_shot_all_reduce_")
            elif name == "one_shot":
                eager[impl] = (lambda op=op: op(sbuf, "sum", group_name), sbuf, None, "out-of-place")
            else:
                eager[impl] = (lambda op=op: op(sbuf, "sum", group_name), sbuf, sbuf, "in-place")
        for impl in impls:
            base = impl[:-len("_graph")] if impl.endswith("_graph") else impl
            placement = eager[base][3] if base in eager else None
            if base not in eager:
                if rank == 0:
                    print(f"torch_allreduce: {impl} at {b} B skipped: {why[base]}", file=sys.stderr, flush=True)
                write(impl, b, placement, iters, error=why[base])
                continue
            call, inp, out, _ = eager[base]
            # Capture (graph impls), then the check: input written, output poisoned where it is
            # not the input, every rank ready, one call, compared on every rank.
            error = None
            try:
                if impl.endswith("_graph"):
                    g, ret = torch_dist.graphed(call, keep)
                    call, static_out = g.replay, ret
                else:
                    static_out = None
                fill(inp)
                if out is None and static_out is not None:
                    static_out.fill_(float("nan"))
                torch.cuda.synchronize()
                dist.barrier()
                ret = call()
                torch.cuda.synchronize()
                got = out if out is not None else static_out if static_out is not None else ret
                bad = mismatches(got, world, arange)
            except Exception as e:
                error, bad = f"raised {e!r}", 0
            if not agreed(error is None):
                error = error or "raised on another rank"
                print(f"rank {rank}: {impl} at {b} B: {error}", file=sys.stderr, flush=True)
                write(impl, b, placement, iters, error=error)
                failed += 1
                continue
            total = torch.tensor([bad], device=dev)
            dist.all_reduce(total)
            if total.item():
                write(impl, b, placement, iters, error=f"check FAILED: {total.item()} mismatches")
                failed += 1
                continue
            write(impl, b, placement, iters, ms=torch_dist.median_ms(call, iters))
    # The graphs (which hold NCCL's and symmetric memory's work) and the symmetric buffers go
    # before the group does, every rank past its last call first: with them alive, ending the
    # process group hung at exit on 2 x H200.
    torch.cuda.synchronize()
    dist.barrier()
    keep.clear()
    gc.collect()
    torch.cuda.synchronize()
    torch_dist.finish(f)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
