// Host grouped GEMM: one host GEMM per group over its contiguous rows.
#include <string>

#include "detail.h"

namespace fusedcomm::host {

void require_group_offsets(const char* op, const int64_t* offsets, int64_t groups, int64_t rows) {
  detail::require_nonneg(groups, op, "groups");
  detail::require_nonneg(rows, op, "rows");
  FC_REQUIRE(offsets != nullptr, std::string(op) + ": offsets must hold groups + 1 = " +
                                     std::to_string(groups + 1) + " values, got null");
  FC_REQUIRE(offsets[0] >= 0 && offsets[0] <= rows, std::string(op) +
                                                        ": offsets[0] = " + std::to_string(offsets[0]) +
                                                        " is outside [0, " + std::to_string(rows) + "]");
  for (int64_t g = 0; g < groups; ++g) {
    FC_REQUIRE(offsets[g + 1] >= offsets[g] && offsets[g + 1] <= rows,
               std::string(op) + ": offsets[" + std::to_string(g + 1) +
                   "] = " + std::to_string(offsets[g + 1]) + " must be in [offsets[" + std::to_string(g) +
                   "] = " + std::to_string(offsets[g]) + ", rows = " + std::to_string(rows) +
                   "] (offsets are non-decreasing row indices of a)");
  }
}

void grouped_gemm(DType t, const void* a, const void* w, void* c, const int64_t* offsets, int64_t groups,
                  int64_t rows, int64_t n, int64_t k, WeightLayout layout) {
  constexpr const char* kOp = "groupedGemm";
  detail::require_gemm_shape(t, rows, n, k, layout, kOp);
  require_group_offsets(kOp, offsets, groups, rows);
  detail::require_data(a, rows * k, kOp, "a");
  detail::require_data(w, groups * n * k, kOp, "w");
  detail::require_data(c, rows * n, kOp, "c");
  const int64_t esize = dtype_size(t);
  const auto* ab = static_cast<const uint8_t*>(a);
  const auto* wb = static_cast<const uint8_t*>(w);
  auto* cb = static_cast<uint8_t*>(c);
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t begin = offsets[g], len = offsets[g + 1] - begin;
    if (len == 0) continue;
    gemm(t, ab + begin * k * esize, wb + g * n * k * esize, cb + begin * n * esize, len, n, k, layout);
  }
}

}  // namespace fusedcomm::host
