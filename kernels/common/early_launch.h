// Host side of programmatic dependent launch (PDL) for the plain GEMM and the collectives: a
// kernel launched through launch_early may be scheduled while the stream's previous kernel still
// runs, so its launch latency (and its CTAs' placement) overlaps that kernel's tail.
//
// Contract for every kernel launched here: its first instruction that touches global memory
// comes after detail::pdl_wait() (sm90_primitives.cuh), which waits for the previous kernel's
// completion and memory flush. Until then the kernel only exists: stream order, as its callers
// and the collectives' protocol (comm_protocol.cuh) rely on it, holds unchanged. The kernels
// here also call pdl_release_dependents() at their start (all but a GEMM with readiness waits,
// below), so that the next one may be scheduled on the SMs they leave free (a CTA that does not
// fit waits for an SM, as without PDL). The fused kernels do neither; a kernel launched early
// after one of them starts at its completion.
//
// A CTA waiting in pdl_wait holds its SM. So a kernel that releases its dependents early must
// not depend on a kernel of another stream (or of another process sharing the GPU under MPS)
// that would need those SMs to run. The collectives depend only on their peers' kernels, on
// other GPUs (ranks sharing one GPU, a testing mode, are separate contexts, which time-slice
// it); a plain GEMM with readiness waits (gemm.h hook 1) waits for other streams' kernels, so it
// does not release early.
#pragma once

#include <cuda_runtime.h>

namespace fusedcomm::kernels::detail {

// cudaLaunchKernelEx with programmatic stream serialization added to `attrs` (n of them, at most
// 3; e.g. a cluster dimension).
template <class... Params, class... Args>
cudaError_t launch_early_with(const cudaLaunchAttribute* attrs, int n, void (*kernel)(Params...), dim3 grid,
                              dim3 block, size_t smem, cudaStream_t stream, Args&&... args) {
  cudaLaunchAttribute all[4];
  for (int i = 0; i < n; ++i) all[i] = attrs[i];
  // Not on the legacy default stream, whose order with every other stream is implicit.
  if (stream != nullptr && stream != cudaStreamLegacy) {
    all[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    all[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = all;
  cfg.numAttrs = static_cast<unsigned>(n);
  if (cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, static_cast<Args&&>(args)...); e != cudaSuccess) {
    return e;
  }
  return cudaGetLastError();
}
template <class... Params, class... Args>
cudaError_t launch_early(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                         Args&&... args) {
  return launch_early_with(nullptr, 0, kernel, grid, block, smem, stream, static_cast<Args&&>(args)...);
}

}  // namespace fusedcomm::kernels::detail
