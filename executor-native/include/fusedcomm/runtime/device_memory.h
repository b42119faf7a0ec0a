// Device memory and streams that anyone allocated (cuDF/RMM, PyTorch, JCuda, the runtime's own
// allocator), as the C API's tensor entries see them: what the CUDA driver knows of an address
// and of a stream, and the runtime's plain allocator and copy for callers without a CUDA
// binding of their own. Everything goes through the statically linked CUDA runtime, which shares
// each GPU's primary context with every other CUDA runtime in the process, so pointers and
// streams move freely between them.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "fusedcomm/types.h"

namespace fusedcomm {

struct PointerInfo {
  MemoryType type = MemoryType::kUnregistered;
  int device = -1;           // the GPU the memory lives on, -1 for none
  uint64_t range_base = 0;   // the allocation that holds the address; 0: unknown
  uint64_t range_bytes = 0;  // its size from range_base; 0: unknown
};

// What the driver knows of `ptr`. Error(kUnavailable) without a usable GPU, naming why.
// The range comes from cuMemGetAddressRange where the driver answers for the address (device
// and managed memory), else stays unknown.
PointerInfo pointer_info(const void* ptr);

// The GPU `stream` belongs to (cudaStreamGetDevice). The handle must be a live stream (or one of
// CUDA's special handles, which mean the calling thread's current GPU): a freed or made-up
// handle is undefined behaviour in CUDA itself, not something the driver can detect. -1 while
// the stream is capturing a CUDA graph (CUDA refuses the query then).
int stream_device(cudaStream_t stream);

// cudaMalloc of max(bytes, 1) on the calling thread's current GPU; Error(kUnavailable) without
// a GPU, Error(kFatalGpu) when it fails (out of device memory included, with the size).
void* device_alloc(size_t bytes);
void device_free(void* ptr);  // null: a no-op
// cudaMemcpy with cudaMemcpyDefault: host or device memory on either side; synchronous.
void device_copy(void* dst, const void* src, size_t bytes);
// cudaMemcpy2D with cudaMemcpyDefault: `height` rows of `width` bytes, the rows `src_pitch`
// bytes apart in the source and `dst_pitch` in the destination; synchronous. On device memory
// the GPU does it (e.g. interleaving columns into a row-major matrix without a host trip).
void device_copy_2d(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width, size_t height);
// The calling thread's current GPU's memory (cudaMemGetInfo): {free, total} bytes.
void device_memory(uint64_t* free_bytes, uint64_t* total_bytes);

}  // namespace fusedcomm
