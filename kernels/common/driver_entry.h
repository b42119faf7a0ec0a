// A driver API function through the runtime's driver entry points, so that nothing links
// against libcuda (the static cudart finds the driver at run time): null where the driver does
// not have `name` at `cuda_version` (e.g. 12000 for CUDA 12.0's signature). Host code only.
#pragma once

#include <cuda_runtime.h>

namespace fusedcomm::kernels::detail {

template <typename Fn>
Fn driver_entry(const char* name, int cuda_version) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult q{};
  if (cudaGetDriverEntryPointByVersion(name, &p, cuda_version, cudaEnableDefault, &q) != cudaSuccess ||
      q != cudaDriverEntryPointSuccess) {
    return nullptr;
  }
  return reinterpret_cast<Fn>(p);
}

}  // namespace fusedcomm::kernels::detail
