// launch_reference_gemm (gemm_reference.h): one thread per output element.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/gemm/gemm_reference.h"

namespace fusedcomm::kernels {
namespace {
__global__ void reference_gemm_kernel(const __nv_bfloat16* A, int64_t lda, const __nv_bfloat16* B,
                                      int64_t ldb, bool kn, int M, int N, int K, float* ref, float* absdot,
                                      bool accumulate) {
  const int n = blockIdx.x * blockDim.x + threadIdx.x;
  if (n >= N) return;
  for (int m = blockIdx.y; m < M; m += gridDim.y) {
    float s = 0.f, sa = 0.f;
    for (int k = 0; k < K; ++k) {
      const float a = __bfloat162float(A[m * lda + k]);
      const float b = __bfloat162float(kn ? B[int64_t(k) * ldb + n] : B[int64_t(n) * ldb + k]);
      s = fmaf(a, b, s);
      sa += fabsf(a * b);
    }
    const int64_t i = int64_t(m) * N + n;
    ref[i] = accumulate ? ref[i] + s : s;
    if (absdot != nullptr) absdot[i] = accumulate ? absdot[i] + sa : sa;
  }
}
}  // namespace

cudaError_t launch_reference_gemm(const __nv_bfloat16* A, int64_t lda, const __nv_bfloat16* B, int64_t ldb,
                                  GemmLayoutB b_layout, int M, int N, int K, float* ref, float* absdot,
                                  bool accumulate, cudaStream_t stream) {
  if (M < 0 || N < 0 || K < 0) return cudaErrorInvalidValue;
  if (M > 0 && N > 0 && (A == nullptr || B == nullptr || ref == nullptr)) { return cudaErrorInvalidValue; }
  if (M == 0 || N == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>((N + 127) / 128), static_cast<unsigned>(std::min(M, 65535)));
  reference_gemm_kernel<<<grid, 128, 0, stream>>>(A, lda, B, ldb, b_layout == GemmLayoutB::kKN, M, N, K, ref,
                                                  absdot, accumulate);
  return cudaGetLastError();
}

}  // namespace fusedcomm::kernels
