#!/usr/bin/env python3
"""Collectives baseline: NCCL through torch.distributed, one process per GPU, bf16, on the ops
and sizes of a list (bench/shapes/collectives.txt), timed as coll_bench.cc times ours: each
(op, size) checked once against the expected values (the input holds check.h's values, which sum
exactly), then 5 warm-up calls and 10 batches of `iters` back-to-back calls between CUDA events on
rank 0, a barrier before each batch; the median of the batches' per-call means. allReduce runs
in place. Bytes as nccl-tests counts them.

  torchrun --nproc-per-node W nccl_bench.py --shapes bench/shapes/collectives.txt --out rows.jsonl
  torchrun --nproc-per-node W nccl_bench.py --random 20 --seed S --out rows.jsonl

--random N: each op also at N seeded random element counts from 1 MiB to 1 GiB of bf16, the same
as coll_bench --random N --seed S draws (random_bytes), rows of set random-<seed>. NCCL's calls
take equal blocks: a count that W does not divide runs at the largest multiple of W below it.

NCCL_NVLS_ENABLE=0 must be set (run.sh does): NVLink multicast stays off on shared hosts.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
import torch_dist  # noqa: E402

CHUNK = 1 << 26  # elements per step of the value builders (bounds their temporary memory)


def read_shapes(path):
    ops = []
    for line in open(path):
        words = line.split("#")[0].split()
        if words:
            if words[0] not in ("allGather", "reduceScatter", "allReduce", "allToAll"):
                raise SystemExit(f"{path}: unknown op {words[0]}")
            ops.append((words[0], [int(x) for x in words[1:]]))
    return ops


def splitmix64(state):
    """(next state, output): coll_bench.cc's splitmix64."""
    mask = (1 << 64) - 1
    state = (state + 0x9E3779B97F4A7C15) & mask
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
    return state, z ^ (z >> 31)


def random_bytes(count, seed):
    """coll_bench.cc's random_bytes: per size an octave 2^e elements (e uniform in 19..28), a
    count uniform in [2^e, 2^(e+1)); bytes = 2 * count (bf16)."""
    out, x = [], seed
    for _ in range(count):
        x, z = splitmix64(x)
        e = 19 + z % 10
        x, z = splitmix64(x)
        out.append(2 * ((1 << e) + z % (1 << e)))
    return out


def values(torch, index, rank):
    """check.h's fill_pattern: ((7 i + 13 rank + 5) mod 31) - 15 (rank may be a tensor)."""
    return ((7 * index + 13 * rank + 5) % 31 - 15).to(torch.float32)


def fill(torch, t, first, rank):
    for s in range(0, t.numel(), CHUNK):
        i = torch.arange(first + s, first + min(t.numel(), s + CHUNK), device=t.device)
        t[s:s + i.numel()] = values(torch, i, rank).to(t.dtype)


def mismatches(torch, op, out, n, world, rank):
    """Elements of `out` that differ from what `op` must give on this rank (equal blocks of
    n / world elements; the sums are exact)."""
    per = n // world
    bad = 0
    for s in range(0, out.numel(), CHUNK):
        j = torch.arange(s, min(out.numel(), s + CHUNK), device=out.device)
        if op == "allGather":
            want = values(torch, j, j // per)
        elif op in ("reduceScatter", "allReduce"):
            i = j + rank * per if op == "reduceScatter" else j
            want = sum(values(torch, i, p) for p in range(world))
        else:  # allToAll: block p is rank p's input block `rank`
            want = values(torch, rank * per + j % per, j // per)
        bad += int((out[s:s + j.numel()].float() != want).sum())
    return bad


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes")
    ap.add_argument("--random", type=int, default=0, help="this many seeded random counts per op")
    ap.add_argument("--seed", type=int, help="the random counts' seed (default: chosen and printed)")
    ap.add_argument("--out", required=True, help="rows as JSON lines (rank 0)")
    args = ap.parse_args()
    if not args.shapes and args.random <= 0:
        raise SystemExit("--shapes or --random is required")
    ops = [(op, sizes, None) for op, sizes in read_shapes(args.shapes)] if args.shapes else []
    seed = None
    if args.random > 0:
        # Every rank must draw the same counts: without --seed, one from the run's start time
        # that torchrun gives all ranks alike is not at hand, so the seed is required there.
        if args.seed is None:
            raise SystemExit("--random needs --seed under torchrun (every rank must draw the same counts)")
        seed = args.seed
        sizes = random_bytes(args.random, seed)
        ops += [(op, sizes, f"random-{seed}") for op in ("allGather", "reduceScatter", "allReduce", "allToAll")]
    elif args.seed is not None:
        raise SystemExit("--seed goes with --random")
    import torch
    import torch.distributed as dist
    rank, world, dev = torch_dist.init()
    max_bytes = max(b for _, sizes, _ in ops for b in sizes)
    big_in = torch.empty(max_bytes // 2, dtype=torch.bfloat16, device=dev)
    big_out = torch.empty(max_bytes // 2, dtype=torch.bfloat16, device=dev)
    f = open(args.out, "w") if rank == 0 else None
    failed = 0
    if seed is not None and rank == 0:
        print(f"random set: {args.random} element counts from 1 MiB to 1 GiB of bf16 per op, seed {seed}", flush=True)
    for op, sizes, set_name in ops:
        for b in sizes:
            n = b // 2
            n_w = (n // world) * world
            if op == "allGather":
                inp, out = big_in[: n_w // world], big_out[:n_w]
                call = lambda: dist.all_gather_into_tensor(out, inp)
                fill(torch, inp, rank * (n_w // world), rank)
            elif op == "reduceScatter":
                inp, out = big_in[:n_w], big_out[: n_w // world]
                call = lambda: dist.reduce_scatter_tensor(out, inp)
                fill(torch, inp, 0, rank)
            elif op == "allReduce":
                inp = out = big_in[:n_w]
                call = lambda: dist.all_reduce(out)
                fill(torch, inp, 0, rank)
            else:
                inp, out = big_in[:n_w], big_out[:n_w]
                call = lambda: dist.all_to_all_single(out, inp)
                fill(torch, inp, 0, rank)
            if out is not inp:
                out.fill_(float("nan"))
            dist.barrier()
            call()
            torch.cuda.synchronize()
            bad = torch.tensor([mismatches(torch, op, out, n_w, world, rank)], device=dev)
            dist.all_reduce(bad)
            if bad.item():
                if f:
                    print(f"{op:14s} W={world} {b:11d} B  check FAILED: {bad.item()} mismatches", flush=True)
                failed += 1
                continue
            iters = 200 if b <= (1 << 20) else 20 if b <= (64 << 20) else 5
            med = torch_dist.median_ms(call, iters)
            algbw = b / (med * 1e-3) / 1e9
            factor = 2 * (world - 1) / world if op == "allReduce" else (world - 1) / world
            if f:
                row = dict(family="collectives", op=op, impl="nccl", world=world, shape=dict(bytes=b),
                           dtype="bf16", ms_median=med, tflops=None, gbps=algbw * factor, algbw=algbw,
                           nccl=".".join(map(str, torch.cuda.nccl.version())))
                if set_name:
                    row.update(set=set_name, seed=seed)
                f.write(json.dumps(row) + "\n")
                f.flush()
                print(f"{op:14s} W={world} {b:11d} B  check passed  {med:9.4f} ms  busbw {algbw * factor:7.1f} GB/s",
                      flush=True)
    torch_dist.finish(f)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
