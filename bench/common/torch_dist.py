"""What the torch.distributed baselines share (nccl_bench.py, torch_allreduce.py,
torch_fused.py): the start and end of one process per GPU under torchrun (NCCL, NVLink multicast
off), CUDA graph capture and the batched timing. torch is imported here, not by the scripts'
module level, so that --help works without it."""
import os


def init():
    """torch.distributed on NCCL for this torchrun process, GPU = local rank. Returns (rank,
    world, device). NCCL_NVLS_ENABLE=0 must be set: NVLink multicast stays off on shared hosts."""
    import torch
    import torch.distributed as dist
    if os.environ.get("NCCL_NVLS_ENABLE") != "0":
        raise SystemExit("export NCCL_NVLS_ENABLE=0 (NVLink multicast stays off)")
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    dev = torch.device("cuda", torch.cuda.current_device())
    dist.init_process_group("nccl", device_id=dev)
    return rank, world, dev


def finish(out):
    """Closes rank 0's output file (None elsewhere), waits for every rank, ends the group."""
    import torch.distributed as dist
    if out:
        out.close()
    dist.barrier()
    dist.destroy_process_group()


def graphed(fn, keep):
    """fn captured in a CUDA graph after two warm-up calls on the capture's side stream: the graph
    and fn's return value (static across replays). The graph is appended to `keep`, which the
    caller holds for as long as it replays it."""
    import torch
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        ret = fn()
    torch.cuda.synchronize()
    keep.append(g)
    return g, ret


def batch_median_ms(call, iters, batches):
    """`batches` batches of `iters` back-to-back calls between CUDA events, each after a device
    sync and a barrier: the median over batches of the per-call ms."""
    import torch
    import torch.distributed as dist
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    per = []
    for _ in range(batches):
        torch.cuda.synchronize()
        dist.barrier()
        start.record()
        for _ in range(iters):
            call()
        end.record()
        end.synchronize()
        per.append(start.elapsed_time(end) / iters)
    per.sort()
    return per[len(per) // 2]


def median_ms(call, iters, warmup=5, batches=10):
    """`warmup` calls, then batch_median_ms (the collectives' method, as coll_bench times ours)."""
    import torch
    for _ in range(warmup):
        call()
    torch.cuda.synchronize()
    return batch_median_ms(call, iters, batches)


def sized_median_ms(call, dev, batch_ms, sustain_ms, batches):
    """The fused and MoE families' method: two warm-up calls, one timed call (rank 0's time, for
    every rank) sizing the batches to about batch_ms (1-200 calls) and, with sustain_ms > 0,
    that long of back-to-back calls first (the GPU at its sustained clock), then
    batch_median_ms. Returns (ms, calls per batch)."""
    import torch
    import torch.distributed as dist
    for _ in range(2):
        call()
    torch.cuda.synchronize()
    dist.barrier()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    call()
    end.record()
    end.synchronize()
    est = torch.tensor([start.elapsed_time(end)], device=dev)
    dist.broadcast(est, 0)
    one = max(est.item(), 1e-3)
    iters = int(min(200, max(1, batch_ms / one)))
    if sustain_ms > 0:
        torch.cuda.synchronize()
        dist.barrier()
        for _ in range(int(sustain_ms / one) + 1):
            call()
    return batch_median_ms(call, iters, batches), iters
