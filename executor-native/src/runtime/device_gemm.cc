#include "fusedcomm/runtime/device_gemm.h"

#include <cuda_runtime_api.h>

#include <string>

#include "fusedcomm/kernels/gemm.h"
#include "fusedcomm/runtime/errors.h"

namespace fusedcomm {

kernels::GemmArgs dense_gemm_args(const void* a, const void* w, void* c, int64_t m, int64_t n, int64_t k,
                                  int layout, kernels::GemmOutType c_type) {
  kernels::GemmArgs g;
  g.A = static_cast<const __nv_bfloat16*>(a);
  g.B = static_cast<const __nv_bfloat16*>(w);
  g.C = c;
  g.M = static_cast<int>(m);
  g.N = static_cast<int>(n);
  g.K = static_cast<int>(k);
  g.lda = k;
  g.ldb = layout == 0 ? k : n;
  g.ldc = n;
  g.b_layout = layout == 0 ? kernels::GemmLayoutB::kNK : kernels::GemmLayoutB::kKN;
  g.c_type = c_type;
  return g;
}

void device_gemm_bf16(const void* a, const void* w, void* c, int64_t m, int64_t n, int64_t k,
                      int layout) {
  const std::string shape = std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k);
  FC_REQUIRE(m >= 0 && n >= 0 && k >= 0, "gemm: negative dimension in " + shape);
  if (m == 0 || n == 0) return;
  FC_REQUIRE(n % 8 == 0 && k % 8 == 0 && k > 0,
             "gemm on the GPU needs N and K to be positive multiples of 8, got MxNxK = " + shape);
  FC_REQUIRE(m < (int64_t{1} << 31) && n < (int64_t{1} << 31) && k < (int64_t{1} << 31),
             "gemm: dimension too large in " + shape);
  for (const void* p : {a, w, static_cast<const void*>(c)}) {
    FC_REQUIRE(reinterpret_cast<uintptr_t>(p) % 16 == 0, "gemm: device pointers must be 16-byte aligned");
  }
  const kernels::GemmArgs args = dense_gemm_args(a, w, c, m, n, k, layout, kernels::GemmOutType::kBF16);
  cudaError_t e = kernels::launch_gemm(args, nullptr);
  if (e == cudaErrorInvalidValue) fail(ErrorKind::kInvalidArgument, "gemm: the GEMM engine rejected " + shape);
  if (e == cudaSuccess) e = cudaStreamSynchronize(nullptr);
  if (e != cudaSuccess) {
    fail(ErrorKind::kFatalGpu, "gemm " + shape + " failed on the GPU: " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
  }
}

}  // namespace fusedcomm
