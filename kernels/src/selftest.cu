#include "fusedcomm/kernels/selftest.h"

namespace fusedcomm::kernels {
namespace {
__global__ void selftest_kernel(uint32_t* out, uint32_t n) {
  for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    out[i] = i * 3u + 1u;
  }
}
}  // namespace

cudaError_t launch_selftest(uint32_t* out, uint32_t n, cudaStream_t stream) {
  selftest_kernel<<<(n + 255) / 256, 256, 0, stream>>>(out, n);
  return cudaGetLastError();
}

}  // namespace fusedcomm::kernels
