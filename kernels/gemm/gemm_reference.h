// The obviously-correct reference GEMM for tests and benchmark spot checks (not for production):
// one thread per output element, fp32 sum over k in order. For i < M, j < N:
//   ref[i*N + j]    (+)= Σ_k A[i*lda + k] · B(k, j)      (B(k,j) = B[j*ldb + k] for kNK,
//   absdot[i*N + j] (+)= Σ_k |A[i*lda + k] · B(k, j)|     B[k*ldb + j] for kKN)
// accumulating into the existing values when `accumulate`, else overwriting; absdot may be
// null. For gemmReduceScatter's reference call it once per source rank with accumulate.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/gemm/gemm.h"

namespace fusedcomm::kernels {

cudaError_t launch_reference_gemm(const __nv_bfloat16* A, int64_t lda, const __nv_bfloat16* B, int64_t ldb,
                                  GemmLayoutB b_layout, int M, int N, int K, float* ref, float* absdot,
                                  bool accumulate, cudaStream_t stream);

}  // namespace fusedcomm::kernels
