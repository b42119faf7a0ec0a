// The fused GEMM + collective ops, composed from the GEMM core and the row-block collectives.
// Partial products travel in fp32 so that the result is rounded once, at the output (unless
// bf16 partials are asked for: each is rounded once more before the sum).
#include "detail.h"
#include "fusedcomm/runtime/split.h"

namespace fusedcomm::host {

namespace {

// m×n fp32 partial product a (m×k) · op(w), not rounded.
std::vector<float> partial_product(DType t, const void* a, const void* w, int64_t m, int64_t n, int64_t k,
                                   WeightLayout layout) {
  const std::vector<float> af = detail::to_f32(t, a, m * k);
  const std::vector<float> wf = detail::weight_as_nk(t, w, n, k, layout);
  std::vector<float> c(static_cast<size_t>(m * n));
  detail::gemm_f32(af.data(), wf.data(), c.data(), m, n, k);
  return c;
}

void require_gemm_collective(DType t, const void* a, const void* w, const void* c, int64_t m, int64_t n,
                             int64_t k_local, int64_t c_rows, WeightLayout layout, const char* op) {
  detail::require_gemm_shape(t, m, n, k_local, layout, op, "n", "k_local");
  detail::require_data(a, m * k_local, op, "a");
  detail::require_data(w, n * k_local, op, "w");
  detail::require_data(c, c_rows * n, op, "c");
}

}  // namespace

void all_gather_gemm(Exchanger& ex, DType t, const void* a_local, const void* w, void* c, void* gathered_a,
                     int64_t m, int64_t n_local, int64_t k, WeightLayout layout) {
  constexpr const char* kOp = "allGatherGemm";
  const int world = ex.world(), r = ex.rank();
  detail::require_gemm_shape(t, m, n_local, k, layout, kOp, "n_local");
  detail::require_data(a_local, split_count(m, world, r) * k, kOp, "a_local");
  detail::require_data(w, n_local * k, kOp, "w");
  detail::require_data(c, m * n_local, kOp, "c");

  const int64_t row_bytes = k * dtype_size(t);
  std::vector<uint8_t> scratch;
  void* full_a = gathered_a;
  if (full_a == nullptr) {
    scratch.resize(static_cast<size_t>(m * row_bytes));
    full_a = scratch.data();
  }
  detail::all_gather_rows(ex, a_local, full_a, m, row_bytes, "allGatherGemm/all-gather");
  gemm(t, full_a, w, c, m, n_local, k, layout, /*accumulate=*/false);
}

namespace {

// This rank's row block of Σ_s a_s · op(w_s), rounded once into `mine` (dtype t): the partial
// products in `partials` precision, reduce-scattered by rows with fp32 sums. `op` names the
// caller in errors.
void reduce_scatter_product(Exchanger& ex, DType t, const void* a, const void* w, void* mine, int64_t m,
                            int64_t n, int64_t k_local, WeightLayout layout, PartialPrecision partials,
                            const std::string& op) {
  FC_REQUIRE(partials == PartialPrecision::kF32 || partials == PartialPrecision::kBF16 ||
                 partials == PartialPrecision::kF32AnyOrder,
             op + ": unknown partial precision " + std::to_string(static_cast<int>(partials)));
  const std::vector<float> partial = partial_product(t, a, w, m, n, k_local, layout);
  // bf16 partials are exchanged in bf16, as on the cuda backend; the sum is fp32 either way.
  const DType wire = partials == PartialPrecision::kBF16 ? DType::kBF16 : DType::kF32;
  std::vector<uint8_t> rounded;
  const void* send = partial.data();
  if (wire == DType::kBF16) {
    rounded.resize(partial.size() * dtype_size(wire));
    detail::from_f32(wire, partial.data(), m * n, rounded.data());
    send = rounded.data();
  }
  const int64_t rows = split_count(m, ex.world(), ex.rank());
  std::vector<float> sum(static_cast<size_t>(rows * n));
  detail::reduce_scatter_rows(ex, wire, send, sum.data(), m, n, (op + "/reduce-scatter").c_str());
  detail::from_f32(t, sum.data(), rows * n, mine);
}

}  // namespace

void gemm_reduce_scatter(Exchanger& ex, DType t, const void* a, const void* w, void* c, int64_t m, int64_t n,
                         int64_t k_local, WeightLayout layout, PartialPrecision partials) {
  constexpr const char* kOp = "gemmReduceScatter";
  const int64_t mine = m < 0 ? 0 : split_count(m, ex.world(), ex.rank());
  require_gemm_collective(t, a, w, c, m, n, k_local, mine, layout, kOp);
  reduce_scatter_product(ex, t, a, w, c, m, n, k_local, layout, partials, kOp);
}

// The reduce-scatter's rounded blocks are gathered, so every rank gets the same bits.
void gemm_all_reduce(Exchanger& ex, DType t, const void* a, const void* w, void* c, int64_t m, int64_t n,
                     int64_t k_local, WeightLayout layout, PartialPrecision partials) {
  constexpr const char* kOp = "gemmAllReduce";
  require_gemm_collective(t, a, w, c, m, n, k_local, m, layout, kOp);
  const int64_t mine = split_count(m, ex.world(), ex.rank());
  std::vector<uint8_t> rounded(static_cast<size_t>(mine * n * dtype_size(t)));
  reduce_scatter_product(ex, t, a, w, rounded.data(), m, n, k_local, layout, partials, kOp);
  detail::all_gather_rows(ex, rounded.data(), c, m, n * dtype_size(t), "gemmAllReduce/all-gather");
}

}  // namespace fusedcomm::host
