"""Baselines of the fused-op benchmark (torch.distributed, one process per GPU, bf16).

Same shapes (shapes() below mirrors fused_bench.cc's list), warm-up, batches and timing as
fused_bench.cc: 2 warm-up calls, one timed call to size the batches (rank 0's estimate for all
ranks), then `batches` batches of `iters` back-to-back calls between CUDA events on rank 0, a
barrier and a sync before each batch; ms_median = median over batches of the per-call mean.

impls per (op, shape):
  torch_serial     cuBLAS + NCCL, one stream: all_gather_into_tensor then A @ W.t()
                   (allGatherGemm); A @ W.t() then reduce_scatter_tensor (gemmReduceScatter,
                   bf16 partials, as NCCL sums them); A @ W.t() then all_reduce (gemmAllReduce)
  torch_symm_mem   PyTorch symmetric memory's fused ops
                   (torch.distributed._symmetric_memory._fused_all_gather_matmul /
                   _fused_matmul_reduce_scatter, torch 2.11), multicast off; gemmAllReduce (no
                   fused op in torch): A @ W.t() into a symmetric buffer, then
                   torch.ops.symm_mem.two_shot_all_reduce_ on it
  torch_gemm       cuBLAS GEMM alone (the rank's local shape)
  torch_collective NCCL collective alone (bf16)
Run: torchrun --nproc-per-node W torch_baselines.py --out torch.jsonl [--quick]
NCCL_NVLS_ENABLE=0 and TORCH_SYMM_MEM_DISABLE_MULTICAST=1 must be set (device_run.sh does).
"""
import argparse
import contextlib
import ctypes
import json
import os
import sys
import threading

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import bench_common


def shapes(tp, quick):
    """(label, op, M, N, K): see fused_bench.cc (N = N_r for allGatherGemm, K = K_r for RS)."""
    models = [("llama3-8b", 4096, 14336), ("llama3-70b", 8192, 28672)]
    ms = [2048, 8192] if quick else [1024, 2048, 4096, 8192, 16384]
    out = []
    for name, hidden, ffn in models:
        for m in ms:
            label = f"{name} M={m}"
            out.append((label, "allGatherGemm", m, 2 * ffn // tp, hidden))
            out.append((label, "gemmReduceScatter", m, hidden, ffn // tp))
            out.append((label, "gemmAllReduce", m, hidden, ffn // tp))
    for s in ([8192] if quick else [8192, 16384]):
        label = f"square S={s}"
        out.append((label, "allGatherGemm", s, s // tp, s))
        out.append((label, "gemmReduceScatter", s, s, s // tp))
        out.append((label, "gemmAllReduce", s, s, s // tp))
    return out


class Clocks:
    """--clocks: this rank's GPU's SM clock and board power, sampled through NVML by a thread
    while each timed batch runs, per impl (fused_bench --clocks does the same for ours; gpu_clocks.h).
    Why: a collective that draws more power leaves the power-capped GPU at a lower clock for
    the GEMM after it. Off (no samples) where NVML is missing."""

    def __init__(self, dev):
        self.nvml, self.handle, self.stats = None, None, {}
        self.stop = threading.Event()
        try:
            nvml = ctypes.CDLL("libnvidia-ml.so.1")
            p = torch.cuda.get_device_properties(dev)
            pci = f"{p.pci_domain_id:08X}:{p.pci_bus_id:02X}:{p.pci_device_id:02X}.0".encode()
            h = ctypes.c_void_p()
            if nvml.nvmlInit_v2() == 0 and nvml.nvmlDeviceGetHandleByPciBusId_v2(pci, ctypes.byref(h)) == 0:
                self.nvml, self.handle = nvml, h
        except (OSError, AttributeError) as e:
            print(f"--clocks: NVML not available ({e!r}), no samples", file=sys.stderr)

    def _run(self, key):
        mhz, mw = ctypes.c_uint(), ctypes.c_uint()
        s = self.stats.setdefault(key, [0, 0.0, 0.0])
        while not self.stop.is_set():
            if self.nvml.nvmlDeviceGetClockInfo(self.handle, 1, ctypes.byref(mhz)) != 0:  # NVML_CLOCK_SM
                return
            self.nvml.nvmlDeviceGetPowerUsage(self.handle, ctypes.byref(mw))
            s[0] += 1
            s[1] += mhz.value
            s[2] += mw.value

    @contextlib.contextmanager
    def sampling(self, key):
        """Samples into `key` from a thread while the body runs (nothing without NVML)."""
        if self.nvml is None:
            yield
            return
        self.stop.clear()
        thread = threading.Thread(target=self._run, args=(key,), daemon=True)
        thread.start()
        try:
            yield
        finally:
            self.stop.set()
            thread.join()

    def summary(self, key):
        n, mhz, mw = self.stats.get(key, (0, 0, 0))
        return f"sm {mhz / n:.0f} MHz, {mw / n / 1000:.0f} W, {n} samples" if n else "no samples"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="torch.jsonl")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--ops", default="ag,rs", help="any of ag, rs, ar")
    ap.add_argument("--batch-ms", type=float, default=25.0)
    ap.add_argument("--batches", type=int, default=7)
    ap.add_argument("--shape", default="", help="only the shapes whose label contains this (or any part of a|b|...)")
    ap.add_argument("--split", action="store_true",
                    help="also time torch serial's two calls in its order with events between "
                         "them (each part's median inside the sequence, every rank prints)")
    ap.add_argument("--sustain-ms", type=float, default=0.0,
                    help="each impl runs back to back this long before its batches, so that it is "
                         "timed at the clock its own power draw sustains (fused_bench --sustain-ms)")
    ap.add_argument("--clocks", action="store_true",
                    help="sample the SM clock and power through NVML during each impl's batches "
                         "(every rank prints a 'clocks torch' line per impl)")
    args = ap.parse_args()
    rank, world, dev = bench_common.init_nccl()
    clocks = Clocks(dev) if args.clocks else None
    group_name = dist.group.WORLD.group_name
    symm = None
    try:
        import torch.distributed._symmetric_memory as symm
        if hasattr(symm, "enable_symm_mem_for_group"):
            symm.enable_symm_mem_for_group(group_name)
    except Exception as e:  # the rows say why the symm_mem impl is missing
        print(f"rank {rank}: symmetric memory unavailable: {e!r}", file=sys.stderr)
        symm = None
    gpu = torch.cuda.get_device_name(dev)
    f = open(args.out, "w") if rank == 0 else None
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    gen = torch.Generator(device=dev)
    gen.manual_seed(1234 + rank)

    def rand(*shape):
        return torch.rand(*shape, generator=gen, device=dev, dtype=torch.float32).mul_(2).sub_(1).to(torch.bfloat16)

    def sample(key):  # NVML samples while a timed batch runs (--clocks)
        return clocks.sampling(key) if clocks and key else contextlib.nullcontext()

    def time_call(call, key=None):
        for _ in range(2):
            call()
        torch.cuda.synchronize()
        dist.barrier()
        start.record()
        call()
        end.record()
        end.synchronize()
        est = torch.tensor([start.elapsed_time(end)], device=dev)
        dist.broadcast(est, 0)
        iters = int(min(200, max(1, args.batch_ms / max(est.item(), 1e-3))))
        if args.sustain_ms > 0:
            torch.cuda.synchronize()
            dist.barrier()
            k = int(args.sustain_ms / max(est.item(), 1e-3)) + 1
            for _ in range(k // 2):
                call()
            start.record()
            for _ in range(k - k // 2):
                call()
            end.record()
            start.synchronize()
            with sample(key):  # the second half too (fused_bench's note on NVML power)
                end.synchronize()
        per = []
        for _ in range(args.batches):
            torch.cuda.synchronize()
            dist.barrier()
            start.record()
            for _ in range(iters):
                call()
            end.record()
            with sample(key):
                end.synchronize()
            per.append(start.elapsed_time(end) / iters)
        per.sort()
        return per[len(per) // 2], iters

    def split_serial(op, label, first, second, first_name, second_name, pairs=40):
        """torch serial's two calls back to back with events between them: each part's median
        inside the sequence (after a quarter of the pairs to warm up), as fused_bench's
        --split-decomposed does for ours."""
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(3 * pairs)]
        torch.cuda.synchronize()
        dist.barrier()
        for i in range(pairs):
            ev[3 * i].record()
            first()
            ev[3 * i + 1].record()
            second()
            ev[3 * i + 2].record()
        torch.cuda.synchronize()
        keep = range(pairs // 4, pairs - 1)
        med = lambda v: sorted(v)[len(v) // 2]
        a = med([ev[3 * i].elapsed_time(ev[3 * i + 1]) for i in keep])
        b = med([ev[3 * i + 1].elapsed_time(ev[3 * i + 2]) for i in keep])
        whole = med([ev[3 * i].elapsed_time(ev[3 * (i + 1)]) for i in keep])
        print(f"split torch {op} {label} rank {rank}: {first_name} {a:.4f} ms, then {second_name} "
              f"{b:.4f} ms; pair to pair {whole:.4f} ms", flush=True)

    for label, op, M, N, K in shapes(world, args.quick):
        is_ag, is_ar = op == "allGatherGemm", op == "gemmAllReduce"
        key = "ag" if is_ag else "ar" if is_ar else "rs"
        if key not in args.ops.split(",") or not any(p in label for p in args.shape.split("|")):
            continue
        flops = 2.0 * M * N * K
        wire = (2 if is_ar else 1) * (world - 1) / world * M * (K if is_ag else N) * 2.0  # bf16 on the wire
        w = rand(N, K)  # a linear layer's weight: C = A @ w.t()
        calls = {}
        if is_ag:
            a_shard = rand(M // world, K)
            a_full = torch.empty(M, K, device=dev, dtype=torch.bfloat16)
            c = torch.empty(M, N, device=dev, dtype=torch.bfloat16)

            def serial():
                dist.all_gather_into_tensor(a_full, a_shard)
                torch.matmul(a_full, w.t(), out=c)

            calls["torch_serial"] = serial
            if symm is not None:
                calls["torch_symm_mem"] = lambda: symm._fused_all_gather_matmul(a_shard, [w.t()], 0, group_name)
            calls["torch_gemm"] = lambda: torch.matmul(a_full, w.t(), out=c)
            calls["torch_collective"] = lambda: dist.all_gather_into_tensor(a_full, a_shard)
        elif is_ar:
            a = rand(M, K)
            p = torch.empty(M, N, device=dev, dtype=torch.bfloat16)

            def serial():
                torch.matmul(a, w.t(), out=p)
                dist.all_reduce(p)

            calls["torch_serial"] = serial
            if symm is not None:
                try:
                    p_symm = symm.empty(M, N, device=dev, dtype=torch.bfloat16)
                    symm.rendezvous(p_symm, group_name)

                    def symm_ar():
                        torch.matmul(a, w.t(), out=p_symm)
                        torch.ops.symm_mem.two_shot_all_reduce_(p_symm, "sum", group_name)

                    calls["torch_symm_mem"] = symm_ar
                except Exception as e:  # e.g. an older torch: the serial baseline remains
                    print(f"rank {rank}: no symm_mem allReduce for {label}: {e!r}", file=sys.stderr)
            calls["torch_gemm"] = lambda: torch.matmul(a, w.t(), out=p)
            calls["torch_collective"] = lambda: dist.all_reduce(p)
        else:
            a = rand(M, K)
            p = torch.empty(M, N, device=dev, dtype=torch.bfloat16)
            out = torch.empty(M // world, N, device=dev, dtype=torch.bfloat16)

            def serial():
                torch.matmul(a, w.t(), out=p)
                dist.reduce_scatter_tensor(out, p)

            calls["torch_serial"] = serial
            if symm is not None:
                calls["torch_symm_mem"] = lambda: symm._fused_matmul_reduce_scatter(a, w.t(), "sum", 0, group_name)
            calls["torch_gemm"] = lambda: torch.matmul(a, w.t(), out=p)
            calls["torch_collective"] = lambda: dist.reduce_scatter_tensor(out, p)
        if args.split and not is_ar:
            split_serial(op, label, calls["torch_collective"] if is_ag else calls["torch_gemm"],
                         calls["torch_gemm"] if is_ag else calls["torch_collective"],
                         "allGather" if is_ag else "GEMM", "GEMM" if is_ag else "reduceScatter")
        for impl, call in calls.items():
            try:
                ms, iters = time_call(call, (op, label, impl))
                err = None
            except Exception as e:  # keep going: the row records the failure
                ms, iters, err = float("nan"), 0, repr(e)[:300]
                torch.cuda.synchronize()
            # Every rank's own median (as fused_bench's ms_ranks): torch_gemm times each GPU alone.
            mine = torch.tensor([ms], dtype=torch.float64, device=dev)
            ranks = [torch.empty_like(mine) for _ in range(world)]
            dist.all_gather(ranks, mine)
            ms_ranks = [t.item() for t in ranks]
            if f:
                row = dict(op=op, impl=impl, world=world, shape=label, M=M, N=N, K=K, dtype="bf16",
                           ms_median=ms, tflops=flops / (ms * 1e-3) / 1e12 if ms == ms else None,
                           gbps=wire / (ms * 1e-3) / 1e9 if ms == ms else None, iters=iters,
                           batches=args.batches, sustain_ms=args.sustain_ms, ms_ranks=ms_ranks, gpu=gpu,
                           torch=torch.__version__,
                           nccl=".".join(map(str, torch.cuda.nccl.version())))
                if err:
                    row["error"] = err
                f.write(json.dumps(row) + "\n")
                f.flush()
                print(f"{op:18s} W={world} {label:20s} {impl:16s} {ms:9.4f} ms"
                      + (f"  ERROR {err}" if err else ""), flush=True)
            if clocks:
                print(f"clocks torch {op} {label} {impl} rank {rank}: {clocks.summary((op, label, impl))}",
                      flush=True)
        del calls
        torch.cuda.empty_cache()
    bench_common.finish_nccl(f)


if __name__ == "__main__":
    main()
