#include "fusedcomm/runtime/mapped_host.h"

#include <cuda_runtime_api.h>

#include <cstring>
#include <string>

#include "fusedcomm/runtime/errors.h"

namespace fusedcomm {

MappedHostMemory::MappedHostMemory(size_t bytes) {
  cudaError_t e = cudaHostAlloc(&host, bytes, cudaHostAllocMapped | cudaHostAllocPortable);
  if (e == cudaSuccess) {
    std::memset(host, 0, bytes);
    e = cudaHostGetDevicePointer(&dev, host, 0);
    if (e != cudaSuccess) cudaFreeHost(host);
  }
  if (e != cudaSuccess) {
    cudaGetLastError();
    fail(ErrorKind::kFatalGpu, "mapped host memory of " + std::to_string(bytes) +
                                   " bytes: " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
  }
}

MappedHostMemory::~MappedHostMemory() { cudaFreeHost(host); }

}  // namespace fusedcomm
