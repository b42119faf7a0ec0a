#include "fusedcomm/comm/host_comm.h"

#include <cstdint>
#include <vector>

#include "fusedcomm/runtime/errors.h"

namespace fusedcomm {

HostComm::HostComm(Runtime& runtime, int world) : ex_(runtime, world) {}

HostComm::~HostComm() = default;  // the exchanger aborts and frees itself if still open

std::string HostComm::endpoint() const { return ex_.endpoint(); }

void HostComm::connect(const Bootstrap& peers) {
  ex_.connect(peers.endpoints, peers.rank, peers.comm_id, peers.auth_shares);
}

Exchanger& HostComm::start(const OpDesc& desc, cudaStream_t stream) {
  FC_REQUIRE(stream == nullptr, "a stream was given, but the host backend runs ops synchronously");
  ex_.begin_op(desc.description, desc.fingerprint);
  return ex_;
}

void HostComm::all_gather(const OpDesc& desc, DType dtype, const void* in, void* out, int64_t count,
                          cudaStream_t stream) {
  host::all_gather(start(desc, stream), dtype, in, out, count);
}

void HostComm::reduce_scatter(const OpDesc& desc, DType dtype, const void* in, void* out, int64_t count,
                              cudaStream_t stream) {
  host::reduce_scatter(start(desc, stream), dtype, in, out, count);
}

void HostComm::all_reduce(const OpDesc& desc, DType dtype, const void* in, void* out, int64_t count,
                          cudaStream_t stream) {
  host::all_reduce(start(desc, stream), dtype, in, out, count);
}

void HostComm::all_to_all(const OpDesc& desc, DType dtype, const void* in, void* out, int64_t count,
                          cudaStream_t stream) {
  host::all_to_all(start(desc, stream), dtype, in, out, count);
}

int64_t HostComm::time_collective(Op, DType, const void*, void*, int64_t, int) {
  fail(ErrorKind::kState, "timing collectives needs the cuda backend");
}

void HostComm::all_gather_gemm(const OpDesc& desc, DType dtype, const void* a_local, const void* w, void* c,
                               void* gathered, int64_t m, int64_t n_local, int64_t k, WeightLayout layout,
                               cudaStream_t stream) {
  host::all_gather_gemm(start(desc, stream), dtype, a_local, w, c, gathered, m, n_local, k, layout);
}

void HostComm::gemm_reduce_scatter(const OpDesc& desc, DType dtype, const void* a, const void* w, void* c,
                                   int64_t m, int64_t n, int64_t k_local, WeightLayout layout,
                                   PartialPrecision partials, cudaStream_t stream) {
  host::gemm_reduce_scatter(start(desc, stream), dtype, a, w, c, m, n, k_local, layout, partials);
}

void HostComm::gemm_all_reduce(const OpDesc& desc, DType dtype, const void* a, const void* w, void* c,
                               int64_t m, int64_t n, int64_t k_local, WeightLayout layout,
                               PartialPrecision partials, cudaStream_t stream) {
  host::gemm_all_reduce(start(desc, stream), dtype, a, w, c, m, n, k_local, layout, partials);
}

// The host backend has one path per fused op.
std::string HostComm::describe_fused(Op op, int64_t, int64_t, int64_t, PartialPrecision) const {
  switch (op) {
    case Op::kAllGatherGemm:
      return "host backend: allGather over the executors' transport, then the GEMM on the CPU";
    case Op::kGemmReduceScatter:
      return "host backend: the GEMM on the CPU, then reduceScatter over the executors' transport";
    case Op::kGemmAllReduce:
      return "host backend: the GEMM on the CPU, then reduceScatter and allGather over the executors' "
             "transport";
    default: fail(ErrorKind::kInvalidArgument, "unknown fused op " + std::to_string(static_cast<int>(op)));
  }
}

std::unique_ptr<host::MoeDispatchResult> HostComm::moe_dispatch_gemm(
    const OpDesc& desc, DType dtype, const void* x, int64_t tokens, int64_t hidden, const int32_t* topk_ids,
    const float* topk_weights, int topk, int64_t num_experts, const void* w1_local, int64_t ffn,
    const host::MoeDispatchOptions& options) {
  return std::make_unique<host::MoeDispatchResult>(
      host::moe_dispatch_gemm(start(desc, nullptr), dtype, x, tokens, hidden, topk_ids, topk_weights, topk,
                              num_experts, w1_local, ffn, options));
}

void HostComm::moe_combine(const OpDesc& desc, DType dtype, const host::MoeDispatchResult& dispatch,
                           const void* expert_out, int64_t width, void* out) {
  FC_REQUIRE(dispatch.device == nullptr,
             "moeCombine: the dispatch ran on the cuda backend, not on this host one");
  host::moe_combine(start(desc, nullptr), dtype, dispatch.layout, expert_out, width, out);
}

void HostComm::moe_gemm_combine(const OpDesc& desc, DType dtype, const host::MoeDispatchResult& dispatch,
                                const void* h, int64_t k, const void* w2_local, WeightLayout layout,
                                int64_t width, void* out) {
  FC_REQUIRE(dispatch.device == nullptr,
             "moeGemmCombine: the dispatch ran on the cuda backend, not on this host one");
  // The contract's definition, in these steps: the grouped GEMM into the expert rows, then the
  // combine of them.
  const host::MoeLayout& l = dispatch.layout;
  std::vector<uint8_t> rows(static_cast<size_t>(l.rows() * width) * host::dtype_size(dtype));
  host::grouped_gemm(dtype, h, w2_local, rows.data(), l.expert_offsets.data(), l.local_experts, l.rows(),
                     width, k, layout);
  host::moe_combine(start(desc, nullptr), dtype, l, rows.data(), width, out);
}

void HostComm::ring_attention(const OpDesc& desc, DType dtype, const host::AttentionShape& shape,
                              const void* q, const void* k, const void* v, void* o, float* lse,
                              cudaStream_t stream) {
  host::ring_attention(start(desc, stream), dtype, shape, q, k, v, o, lse);
}

void HostComm::ring_attention_backward(const OpDesc& desc, DType dtype, const host::AttentionShape& shape,
                                       const void* q, const void* k, const void* v, const void* o,
                                       const float* lse, const void* d_o, void* dq, void* dk, void* dv,
                                       cudaStream_t stream) {
  host::ring_attention_backward(start(desc, stream), dtype, shape, q, k, v, o, lse, d_o, dq, dk, dv);
}

void HostComm::finish() { ex_.finish(); }
void HostComm::abort() noexcept { ex_.abort(); }
void HostComm::close() { ex_.close(); }

}  // namespace fusedcomm
