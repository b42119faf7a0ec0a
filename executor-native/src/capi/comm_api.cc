// The C API's communicators and ops: argument conversion, then one call of the Comm interface
// (fusedcomm/comm/comm.h), which picks nothing: the communicator is the backend's.
#include <cstring>
#include <utility>

#include "boundary.h"

using namespace fusedcomm;
using capi::comm_of;
using capi::floating;
using capi::guarded;
using capi::op_desc;
using capi::require_out;

extern "C" {

fc_status_t fc_comm_create(fc_runtime_t rt, int32_t rank, int32_t world, fc_comm_t* out) {
  return guarded([&] {
    fc_comm_t& result = require_out(out);
    auto handle = std::make_unique<fc_comm>();
    handle->comm = Comm::create(capi::runtime_of(rt), rank, world);
    result = handle.release();
  });
}

fc_status_t fc_comm_endpoint(fc_comm_t comm, const char** out) {
  return guarded([&] { require_out(out) = capi::result_string(comm_of(comm).endpoint()); });
}

fc_status_t fc_comm_device_handle(fc_comm_t comm, const uint8_t** data, size_t* bytes) {
  return guarded([&] {
    std::vector<uint8_t> blob = comm_of(comm).device_handle();
    require_out(bytes) = blob.size();
    require_out(data) = capi::result_bytes(std::move(blob));
  });
}

fc_status_t fc_comm_symmetric_bytes(fc_comm_t comm, uint64_t* out) {
  return guarded([&] { require_out(out) = comm_of(comm).symmetric_bytes(); });
}

fc_status_t fc_comm_connect(fc_comm_t comm, int32_t rank, uint64_t comm_id, int32_t ranks,
                            const char* const* endpoints, const uint8_t* const* auth_shares,
                            const uint8_t* const* device_handles, const size_t* device_handle_bytes,
                            const int32_t* host_ids) {
  return guarded([&] {
    Comm& c = comm_of(comm);
    FC_REQUIRE(ranks >= 0, "connect: negative rank count " + std::to_string(ranks));
    FC_REQUIRE(ranks == 0 || endpoints != nullptr, "connect: null endpoints");
    FC_REQUIRE(
        ranks <= 1 || auth_shares != nullptr,
        "connect: null auth shares (every rank's FC_AUTH_SHARE_BYTES random bytes from the bootstrap)");
    static_assert(FC_AUTH_SHARE_BYTES == rdma::auth::kShareBytes);
    Bootstrap b;
    b.rank = rank;
    b.comm_id = comm_id;
    for (int32_t r = 0; r < ranks; ++r) {
      FC_REQUIRE(endpoints[r] != nullptr, "connect: null endpoint of rank " + std::to_string(r));
      b.endpoints.emplace_back(endpoints[r]);
      if (auth_shares != nullptr) {
        FC_REQUIRE(auth_shares[r] != nullptr, "connect: null auth share of rank " + std::to_string(r));
        rdma::auth::Share& share = b.auth_shares.emplace_back();
        std::memcpy(share.data(), auth_shares[r], share.size());
      }
      const size_t n =
          device_handles != nullptr && device_handle_bytes != nullptr ? device_handle_bytes[r] : 0;
      const uint8_t* blob = n > 0 ? device_handles[r] : nullptr;
      FC_REQUIRE(n == 0 || blob != nullptr, "connect: null device handle of rank " + std::to_string(r));
      b.device_handles.emplace_back(blob, blob + n);
      b.host_ids.push_back(host_ids != nullptr ? host_ids[r] : 0);
    }
    c.connect(b);
  });
}

fc_status_t fc_comm_synchronize(fc_comm_t comm) {
  return guarded([&] { comm_of(comm).synchronize(); });
}

fc_status_t fc_comm_finish(fc_comm_t comm) {
  return guarded([&] { comm_of(comm).finish(); });
}

fc_status_t fc_comm_abort(fc_comm_t comm) {
  return guarded([&] { comm_of(comm).abort(); });
}

// Frees the handle whatever close() throws.
fc_status_t fc_comm_close(fc_comm_t comm) {
  return guarded([&] {
    std::unique_ptr<fc_comm> owned(comm);
    if (owned != nullptr && owned->comm != nullptr) owned->comm->close();
  });
}

fc_status_t fc_all_gather(fc_comm_t comm, const fc_op_desc_t* desc, fc_dtype_t dtype, const void* in,
                          void* out, int64_t count, fc_stream_t stream) {
  return guarded([&] {
    capi::require_size("allGather", "out", dtype, {count});
    comm_of(comm).all_gather(op_desc(desc), floating(dtype), in, out, count, stream);
  });
}

fc_status_t fc_reduce_scatter(fc_comm_t comm, const fc_op_desc_t* desc, fc_dtype_t dtype, const void* in,
                              void* out, int64_t count, fc_stream_t stream) {
  return guarded([&] {
    capi::require_size("reduceScatter", "in", dtype, {count});
    comm_of(comm).reduce_scatter(op_desc(desc), floating(dtype), in, out, count, stream);
  });
}

fc_status_t fc_all_reduce(fc_comm_t comm, const fc_op_desc_t* desc, fc_dtype_t dtype, const void* in,
                          void* out, int64_t count, fc_stream_t stream) {
  return guarded([&] {
    capi::require_size("allReduce", "in", dtype, {count});
    comm_of(comm).all_reduce(op_desc(desc), floating(dtype), in, out, count, stream);
  });
}

fc_status_t fc_all_to_all(fc_comm_t comm, const fc_op_desc_t* desc, fc_dtype_t dtype, const void* in,
                          void* out, int64_t count, fc_stream_t stream) {
  return guarded([&] {
    capi::require_size("allToAll", "in", dtype, {count});
    comm_of(comm).all_to_all(op_desc(desc), floating(dtype), in, out, count, stream);
  });
}

fc_status_t fc_comm_time_collective(fc_comm_t comm, fc_op_t op, fc_dtype_t dtype, const void* in, void* out,
                                    int64_t count, int32_t iters, int64_t* nanos) {
  return guarded([&] {
    int64_t& result = require_out(nanos);
    capi::require_size("timeCollective", "in", dtype, {count});
    result = comm_of(comm).time_collective(static_cast<Op>(op), floating(dtype), in, out, count, iters);
  });
}

fc_status_t fc_all_gather_gemm(fc_comm_t comm, const fc_op_desc_t* desc, fc_dtype_t dtype,
                               const void* a_local, const void* w, void* c, void* gathered, int64_t m,
                               int64_t n_local, int64_t k, fc_weight_layout_t layout, fc_stream_t stream) {
  return guarded([&] {
    capi::require_size("allGatherGemm", "gathered A", dtype, {m, k});
    capi::require_size("allGatherGemm", "w", dtype, {n_local, k});
    capi::require_size("allGatherGemm", "c", dtype, {m, n_local});
    comm_of(comm).all_gather_gemm(op_desc(desc), floating(dtype), a_local, w, c, gathered, m, n_local, k,
                                  capi::weight_layout(layout), stream);
  });
}

fc_status_t fc_gemm_reduce_scatter(fc_comm_t comm, const fc_op_desc_t* desc, fc_dtype_t dtype, const void* a,
                                   const void* w, void* c, int64_t m, int64_t n, int64_t k_local,
                                   fc_weight_layout_t layout, fc_partials_t partials, fc_stream_t stream) {
  return guarded([&] {
    capi::require_gemm_sizes("gemmReduceScatter", dtype, m, n, k_local);
    comm_of(comm).gemm_reduce_scatter(op_desc(desc), floating(dtype), a, w, c, m, n, k_local,
                                      capi::weight_layout(layout), capi::partial_precision(partials), stream);
  });
}

fc_status_t fc_gemm_all_reduce(fc_comm_t comm, const fc_op_desc_t* desc, fc_dtype_t dtype, const void* a,
                               const void* w, void* c, int64_t m, int64_t n, int64_t k_local,
                               fc_weight_layout_t layout, fc_partials_t partials, fc_stream_t stream) {
  return guarded([&] {
    capi::require_gemm_sizes("gemmAllReduce", dtype, m, n, k_local);
    comm_of(comm).gemm_all_reduce(op_desc(desc), floating(dtype), a, w, c, m, n, k_local,
                                  capi::weight_layout(layout), capi::partial_precision(partials), stream);
  });
}

fc_status_t fc_comm_describe_fused(fc_comm_t comm, fc_op_t op, int64_t m, int64_t n, int64_t k,
                                   fc_partials_t partials, const char** out) {
  return guarded([&] {
    const char*& result = require_out(out);
    Comm& c = comm_of(comm);
    result = capi::result_string(
        c.describe_fused(static_cast<Op>(op), m, n, k, capi::partial_precision(partials)));
  });
}

fc_status_t fc_moe_dispatch_gemm_ex(fc_comm_t comm, const fc_op_desc_t* desc, fc_dtype_t dtype, const void* x,
                                    int64_t tokens, int64_t hidden, const int32_t* topk_ids,
                                    const float* topk_weights, int32_t topk, int64_t num_experts,
                                    const void* w1_local, int64_t ffn, const fc_moe_options_t* options,
                                    fc_moe_dispatch_t* out) {
  return guarded([&] {
    fc_moe_dispatch_t& result = require_out(out);
    capi::require_size("moeDispatchGemm", "x", dtype, {tokens, hidden});
    capi::require_size("moeDispatchGemm", "topk ids", 4, {tokens, topk});
    capi::require_size("moeDispatchGemm", "w1", dtype, {num_experts, ffn, hidden});
    host::MoeDispatchOptions o;
    if (options != nullptr) o.max_recv_rows = options->max_recv_rows;
    auto handle = std::make_unique<fc_moe_dispatch>();
    handle->result =
        comm_of(comm).moe_dispatch_gemm(op_desc(desc), floating(dtype), x, tokens, hidden, topk_ids,
                                        topk_weights, topk, num_experts, w1_local, ffn, o);
    result = handle.release();
  });
}

fc_status_t fc_moe_dispatch_gemm(fc_comm_t comm, const fc_op_desc_t* desc, fc_dtype_t dtype, const void* x,
                                 int64_t tokens, int64_t hidden, const int32_t* topk_ids,
                                 const float* topk_weights, int32_t topk, int64_t num_experts,
                                 const void* w1_local, int64_t ffn, fc_moe_dispatch_t* out) {
  return fc_moe_dispatch_gemm_ex(comm, desc, dtype, x, tokens, hidden, topk_ids, topk_weights, topk,
                                 num_experts, w1_local, ffn, nullptr, out);
}

fc_status_t fc_moe_dispatch_layout(fc_moe_dispatch_t dispatch, fc_moe_layout_t* out) {
  return guarded([&] {
    fc_moe_layout_t& o = require_out(out);
    const host::MoeLayout& l = capi::dispatch_of(dispatch).layout;
    o.rows = l.rows();
    o.first_local_expert = l.first_local_expert;
    o.local_experts = l.local_experts;
    o.tokens = l.tokens;
    o.topk = l.topk;
    o.expert_offsets = l.expert_offsets.data();
    o.src_rank = l.src_rank.data();
    o.src_token = l.src_token.data();
    o.src_slot = l.src_slot.data();
    o.weight = l.weight.data();
  });
}

fc_status_t fc_moe_dispatch_copy(fc_moe_dispatch_t dispatch, void* expert_out, void* routed_x) {
  return guarded([&] {
    const host::MoeDispatchResult& r = capi::dispatch_of(dispatch);
    if (r.device != nullptr) {
      r.device->copy(expert_out, routed_x);
      return;
    }
    if (expert_out != nullptr && !r.out.empty()) std::memcpy(expert_out, r.out.data(), r.out.size());
    if (routed_x != nullptr && !r.routed_x.empty())
      std::memcpy(routed_x, r.routed_x.data(), r.routed_x.size());
  });
}

fc_status_t fc_moe_dispatch_device_rows(fc_moe_dispatch_t dispatch, void** expert_out, void** routed_x) {
  return guarded([&] {
    const host::MoeDispatchResult& r = capi::dispatch_of(dispatch);
    if (r.device == nullptr) {
      fail(ErrorKind::kState,
           "fc_moe_dispatch_device_rows: the host backend's dispatch holds its rows in host memory; "
           "copy them with fc_moe_dispatch_copy");
    }
    if (expert_out != nullptr) *expert_out = r.device->expert_out();
    if (routed_x != nullptr) *routed_x = r.device->routed_x();
  });
}

fc_status_t fc_moe_combine(fc_comm_t comm, const fc_op_desc_t* desc, fc_dtype_t dtype,
                           fc_moe_dispatch_t dispatch, const void* expert_out, int64_t width, void* out) {
  return guarded([&] {
    const host::MoeDispatchResult& d = capi::dispatch_of(dispatch);
    const host::MoeLayout& l = d.layout;
    capi::require_size("moeCombine", "expertOut", dtype, {l.rows(), width});
    capi::require_size("moeCombine", "out", dtype, {l.tokens, width});
    comm_of(comm).moe_combine(op_desc(desc), floating(dtype), d, expert_out, width, out);
  });
}

fc_status_t fc_moe_gemm_combine(fc_comm_t comm, const fc_op_desc_t* desc, fc_dtype_t dtype,
                                fc_moe_dispatch_t dispatch, const void* h, int64_t k, const void* w2_local,
                                fc_weight_layout_t layout, int64_t width, void* out) {
  return guarded([&] {
    const host::MoeDispatchResult& d = capi::dispatch_of(dispatch);
    const host::MoeLayout& l = d.layout;
    FC_REQUIRE(k >= 0 && width >= 0, "moeGemmCombine: k and width must be >= 0 (got " + std::to_string(k) +
                                         ", " + std::to_string(width) + ")");
    capi::require_size("moeGemmCombine", "h", dtype, {l.rows(), k});
    capi::require_size("moeGemmCombine", "w2", dtype, {l.local_experts, width, k});
    capi::require_size("moeGemmCombine", "out", dtype, {l.tokens, width});
    comm_of(comm).moe_gemm_combine(op_desc(desc), floating(dtype), d, h, k, w2_local,
                                   capi::weight_layout(layout), width, out);
  });
}

fc_status_t fc_moe_dispatch_free(fc_moe_dispatch_t dispatch) {
  return guarded([&] { delete dispatch; });
}

fc_status_t fc_ring_attention(fc_comm_t comm, const fc_op_desc_t* desc, fc_dtype_t dtype,
                              const fc_attention_shape_t* shape, const void* q, const void* k, const void* v,
                              void* o, float* lse, fc_stream_t stream) {
  return guarded([&] {
    const host::AttentionShape s = capi::ring_attention_shape("ringAttention", dtype, shape);
    comm_of(comm).ring_attention(op_desc(desc), floating(dtype), s, q, k, v, o, lse, stream);
  });
}

fc_status_t fc_ring_attention_backward(fc_comm_t comm, const fc_op_desc_t* desc, fc_dtype_t dtype,
                                       const fc_attention_shape_t* shape, const void* q, const void* k,
                                       const void* v, const void* o, const float* lse, const void* d_o,
                                       void* dq, void* dk, void* dv, fc_stream_t stream) {
  return guarded([&] {
    const host::AttentionShape s = capi::ring_attention_shape("ringAttentionBackward", dtype, shape);
    comm_of(comm).ring_attention_backward(op_desc(desc), floating(dtype), s, q, k, v, o, lse, d_o, dq, dk, dv,
                                          stream);
  });
}

}  // extern "C"
