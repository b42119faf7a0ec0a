// The checks of the single-GPU kernel tests (gemm_test, attention_test, attention_bwd_test):
// CHECK_CUDA ends the test at a failed CUDA call (nothing after it could be trusted); EXPECT
// counts a failed expectation in g_failures, prints it and goes on, so that one run lists every
// mismatch. Each test is one translation unit and returns non-zero when g_failures is.
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

namespace fusedcomm::kernels::testing {
inline int g_failures = 0;
}  // namespace fusedcomm::kernels::testing

#define CHECK_CUDA(x)                                                                            \
  do {                                                                                           \
    cudaError_t e_ = (x);                                                                        \
    if (e_ != cudaSuccess) {                                                                     \
      std::fprintf(stderr, "%s:%d: %s -> %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                              \
    }                                                                                            \
  } while (0)

#define EXPECT(cond, ...)                          \
  do {                                             \
    if (!(cond)) {                                 \
      ++::fusedcomm::kernels::testing::g_failures; \
      std::printf("  FAIL %s: ", #cond);           \
      std::printf(__VA_ARGS__);                    \
      std::printf("\n");                           \
    }                                              \
  } while (0)
