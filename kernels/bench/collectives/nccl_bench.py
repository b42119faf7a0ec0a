"""NCCL side of the collectives benchmark (torch.distributed, one process per GPU, bf16).

Same sizes, warm-up, batches and timing as coll_bench.cc: for each size, 5 warm-up calls, then
10 batches of `iters` back-to-back calls timed with CUDA events on rank 0; the median of the
per-call batch means is reported. Sizes are the collective's bytes as nccl-tests counts them
(allGather: output; reduceScatter: input; allReduce; allToAll: input per rank).
Run: torchrun --nproc-per-node W nccl_bench.py --out nccl.jsonl [--max-bytes N] [--min-bytes N]
     [--ops ag,rs,ar,a2a]
NCCL_NVLS_ENABLE=0 must be set (NVLink multicast stays off on shared hosts).
"""
import argparse, json, os, sys
import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import bench_common


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="nccl.jsonl")
    ap.add_argument("--max-bytes", type=int, default=1 << 30)
    ap.add_argument("--min-bytes", type=int, default=0)
    ap.add_argument("--ops", default="ag,rs,ar,a2a")
    args = ap.parse_args()
    rank, world, dev = bench_common.init_nccl()
    big_in = torch.zeros(args.max_bytes // 2, dtype=torch.bfloat16, device=dev)
    big_out = torch.zeros(args.max_bytes // 2, dtype=torch.bfloat16, device=dev)
    ops = []
    if "ag" in args.ops: ops.append("allGather")
    if "rs" in args.ops: ops.append("reduceScatter")
    if "ar" in args.ops: ops.append("allReduce")
    if "a2a" in args.ops: ops.append("allToAll")
    f = open(args.out, "w") if rank == 0 else None
    for op in ops:
        b = 1024
        while b <= args.max_bytes:
            if b < args.min_bytes:
                b *= 4
                continue
            n = b // 2
            n_w = (n // world) * world
            if op == "allGather":
                inp, out = big_in[: n_w // world], big_out[:n_w]
                call = lambda: dist.all_gather_into_tensor(out, inp)
            elif op == "reduceScatter":
                inp, out = big_in[:n_w], big_out[: n_w // world]
                call = lambda: dist.reduce_scatter_tensor(out, inp)
            elif op == "allReduce":
                t = big_in[:n]
                call = lambda: dist.all_reduce(t)
            else:
                inp, out = big_in[:n_w], big_out[:n_w]
                call = lambda: dist.all_to_all_single(out, inp)
            iters = 200 if b <= (1 << 20) else 20 if b <= (64 << 20) else 5
            for _ in range(5):
                call()
            torch.cuda.synchronize()
            per = []
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            for _ in range(10):
                dist.barrier()
                torch.cuda.synchronize()
                s.record()
                for _ in range(iters):
                    call()
                e.record()
                e.synchronize()
                per.append(s.elapsed_time(e) / iters)
            per.sort()
            med = per[len(per) // 2]
            algbw = b / (med * 1e-3) / 1e9
            factor = 2 * (world - 1) / world if op == "allReduce" else (world - 1) / world
            if f:
                row = dict(op=op, impl="nccl", world=world, bytes=b, dtype="bf16", ms_median=med,
                           algbw=algbw, busbw=algbw * factor, iters=iters, batches=10,
                           nccl=".".join(map(str, torch.cuda.nccl.version())))
                f.write(json.dumps(row) + "\n"); f.flush()
                print(f"{op:14s} W={world} {b:11d} B  {med:9.4f} ms  busbw {algbw*factor:7.1f} GB/s", flush=True)
            b *= 4
    bench_common.finish_nccl(f)


if __name__ == "__main__":
    main()
