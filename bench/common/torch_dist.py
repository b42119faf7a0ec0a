"""The start and end of the torch.distributed baselines (nccl_bench.py, torch_fused.py): one
process per GPU under torchrun, NCCL, NVLink multicast off. torch is imported here, not by the
scripts' module level, so that --help works without it."""
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
