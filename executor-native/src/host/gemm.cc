// Host GEMM: c = a · op(w) in fp32, cache-blocked, one rounding at the output.
#include <algorithm>
#include <cstring>

#include "detail.h"

namespace fusedcomm::host {
namespace detail {

void gemm_f32(const float* a, const float* w_nk, float* c, int64_t m, int64_t n, int64_t k) {
  // Blocks keep a tile of A rows and W rows in cache; k blocks are visited in order and each
  // element is summed sequentially within them, so the k order is the naive one.
  constexpr int64_t kBlockM = 32, kBlockN = 64, kBlockK = 256;
  std::fill(c, c + m * n, 0.f);
  for (int64_t k0 = 0; k0 < k; k0 += kBlockK) {
    const int64_t kl = std::min(kBlockK, k - k0);
    for (int64_t i0 = 0; i0 < m; i0 += kBlockM) {
      const int64_t i1 = std::min(m, i0 + kBlockM);
      for (int64_t j0 = 0; j0 < n; j0 += kBlockN) {
        const int64_t j1 = std::min(n, j0 + kBlockN);
        for (int64_t i = i0; i < i1; ++i) {
          const float* ar = a + i * k + k0;
          float* cr = c + i * n;
          int64_t j = j0;
          for (; j + 4 <= j1; j += 4) {  // four output columns share each load of ar[kk]
            const float* w0 = w_nk + j * k + k0;
            const float* w1 = w0 + k;
            const float* w2 = w1 + k;
            const float* w3 = w2 + k;
            float s0 = cr[j], s1 = cr[j + 1], s2 = cr[j + 2], s3 = cr[j + 3];
            for (int64_t kk = 0; kk < kl; ++kk) {
              const float av = ar[kk];
              s0 += av * w0[kk];
              s1 += av * w1[kk];
              s2 += av * w2[kk];
              s3 += av * w3[kk];
            }
            cr[j] = s0, cr[j + 1] = s1, cr[j + 2] = s2, cr[j + 3] = s3;
          }
          for (; j < j1; ++j) {
            const float* wr = w_nk + j * k + k0;
            float s = cr[j];
            for (int64_t kk = 0; kk < kl; ++kk) s += ar[kk] * wr[kk];
            cr[j] = s;
          }
        }
      }
    }
  }
}

std::vector<float> weight_as_nk(DType t, const void* w, int64_t n, int64_t k, WeightLayout layout) {
  if (layout == WeightLayout::kNK) return to_f32(t, w, n * k);
  std::vector<float> kn = to_f32(t, w, k * n);  // transpose K×N into N×K
  std::vector<float> nk(static_cast<size_t>(n * k));
  for (int64_t kk = 0; kk < k; ++kk)
    for (int64_t j = 0; j < n; ++j) nk[j * k + kk] = kn[kk * n + j];
  return nk;
}

void require_gemm_shape(DType t, int64_t m, int64_t n, int64_t k, WeightLayout layout, const char* op,
                        const char* n_name, const char* k_name) {
  require_dtype(t, op);
  require_nonneg(m, op, "m");
  require_nonneg(n, op, n_name);
  require_nonneg(k, op, k_name);
  FC_REQUIRE(layout == WeightLayout::kNK || layout == WeightLayout::kKN,
             std::string(op) + ": unknown weight layout " + std::to_string(static_cast<int>(layout)));
}

}  // namespace detail

void gemm(DType t, const void* a, const void* w, void* c, int64_t m, int64_t n, int64_t k,
          WeightLayout layout, bool accumulate) {
  constexpr const char* kOp = "gemm";
  detail::require_gemm_shape(t, m, n, k, layout, kOp);
  detail::require_data(a, m * k, kOp, "a");
  detail::require_data(w, n * k, kOp, "w");
  detail::require_data(c, m * n, kOp, "c");
  if (m == 0 || n == 0) return;

  const std::vector<float> af = detail::to_f32(t, a, m * k);
  const std::vector<float> wf = detail::weight_as_nk(t, w, n, k, layout);
  std::vector<float> cf(static_cast<size_t>(m * n));
  detail::gemm_f32(af.data(), wf.data(), cf.data(), m, n, k);
  if (accumulate) {
    const std::vector<float> old = detail::to_f32(t, c, m * n);
    for (int64_t i = 0; i < m * n; ++i) cf[i] = old[i] + cf[i];
  }
  detail::from_f32(t, cf.data(), m * n, c);
}

}  // namespace fusedcomm::host
