// Pinned host memory mapped into the device's address space (cudaHostAllocMapped), zeroed:
// what the GPU-posted proxy path stages payloads, signal words and its ring in. Host threads
// (the proxy, the transport) use `host`; kernels use `dev`. Allocated for the calling thread's
// current device; freed once, by the destructor.
#pragma once

#include <cstddef>

namespace fusedcomm {

struct MappedHostMemory {
  void* host = nullptr;
  void* dev = nullptr;
  // Throws Error(kFatalGpu) if CUDA cannot allocate or map it.
  explicit MappedHostMemory(size_t bytes);
  ~MappedHostMemory();
  MappedHostMemory(const MappedHostMemory&) = delete;
  MappedHostMemory& operator=(const MappedHostMemory&) = delete;
};

}  // namespace fusedcomm
