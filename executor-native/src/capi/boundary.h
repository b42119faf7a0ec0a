// The C API's one error boundary and its argument conversions (not a public header). Every
// fc_* function is `return guarded([&] { ... });`: C++ errors become an fc_status_t and the
// thread's last error message, and nothing escapes into the C caller.
#pragma once

#include <exception>
#include <new>
#include <string>
#include <vector>

#include "fusedcomm/comm/comm.h"
#include "fusedcomm/fusedcomm.h"
#include "fusedcomm/host/host_ops.h"
#include "fusedcomm/rdma/errors.h"
#include "fusedcomm/runtime/errors.h"
#include "fusedcomm/runtime/memory.h"
#include "fusedcomm/runtime/runtime.h"

// The opaque handles of fusedcomm.h.
struct fc_runtime {
  std::unique_ptr<fusedcomm::Runtime> runtime;
};
struct fc_comm {
  std::unique_ptr<fusedcomm::Comm> comm;
};
struct fc_moe_dispatch {
  std::unique_ptr<fusedcomm::host::MoeDispatchResult> result;
};

namespace fusedcomm::capi {

// Records `message` as this thread's last error and returns `status`.
fc_status_t failed(fc_status_t status, const char* message) noexcept;

inline fc_status_t status_of(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kInvalidArgument: return FC_STATUS_INVALID_ARGUMENT;
    case ErrorKind::kState: return FC_STATUS_STATE;
    case ErrorKind::kCommunicator: return FC_STATUS_COMMUNICATOR;
    case ErrorKind::kTimeout: return FC_STATUS_TIMEOUT;
    case ErrorKind::kTransport: return FC_STATUS_TRANSPORT;
    case ErrorKind::kFatalGpu: return FC_STATUS_FATAL_GPU;
    case ErrorKind::kUnavailable: return FC_STATUS_UNAVAILABLE;
  }
  return FC_STATUS_INTERNAL;
}

template <typename F>
fc_status_t guarded(F&& body) noexcept {
  try {
    body();
    return FC_STATUS_SUCCESS;
  } catch (const Error& e) {
    return failed(status_of(e.kind()), e.what());
  } catch (const rdma::ConnectTimeout& e) {
    return failed(FC_STATUS_TIMEOUT, e.what());
  } catch (const rdma::TransportError& e) {
    return failed(FC_STATUS_TRANSPORT, e.what());
  } catch (const std::bad_alloc&) {
    return failed(FC_STATUS_OUT_OF_MEMORY, "native allocation failed");
  } catch (const std::exception& e) { return failed(FC_STATUS_INTERNAL, e.what()); } catch (...) {
    return failed(FC_STATUS_INTERNAL, "unknown native error");
  }
}

// Results handed out as `const char**` / `const uint8_t**`: this thread's buffers, valid until
// its next fusedcomm call that returns one.
const char* result_string(std::string s);
const uint8_t* result_bytes(std::vector<uint8_t> bytes);

template <typename T>
T& require_out(T* out) {
  FC_REQUIRE(out != nullptr, "null output pointer");
  return *out;
}

inline Runtime& runtime_of(fc_runtime_t rt) {
  if (rt == nullptr || rt->runtime == nullptr) fail(ErrorKind::kState, "the runtime is closed");
  return *rt->runtime;
}
inline Comm& comm_of(fc_comm_t c) {
  if (c == nullptr || c->comm == nullptr) fail(ErrorKind::kState, "the communicator is closed");
  return *c->comm;
}
inline host::MoeDispatchResult& dispatch_of(fc_moe_dispatch_t d) {
  if (d == nullptr || d->result == nullptr) fail(ErrorKind::kState, "the MoE dispatch is closed");
  return *d->result;
}

// The dtypes ops compute in.
inline DType floating(fc_dtype_t t) {
  FC_REQUIRE(t == FC_DTYPE_F32 || t == FC_DTYPE_BF16,
             "unsupported dtype " + std::to_string(static_cast<int>(t)) + " (f32 or bf16)");
  return static_cast<DType>(t);
}
inline WeightLayout weight_layout(fc_weight_layout_t l) {
  FC_REQUIRE(l == FC_LAYOUT_NK || l == FC_LAYOUT_KN,
             "unknown weight layout " + std::to_string(static_cast<int>(l)));
  return static_cast<WeightLayout>(l);
}
inline PartialPrecision partial_precision(fc_partials_t p) {
  FC_REQUIRE(p == FC_PARTIALS_F32 || p == FC_PARTIALS_BF16 || p == FC_PARTIALS_F32_ANY_ORDER,
             "unknown partial precision " + std::to_string(static_cast<int>(p)));
  return static_cast<PartialPrecision>(p);
}
inline SeqLayout seq_layout(const char* op, int32_t l) {
  FC_REQUIRE(l == FC_SEQ_CONTIGUOUS || l == FC_SEQ_ZIGZAG,
             std::string(op) + ": unknown sequence layout " + std::to_string(l));
  return static_cast<SeqLayout>(l);
}
inline Backend backend(fc_backend_t b) {
  FC_REQUIRE(b == FC_BACKEND_AUTO || b == FC_BACKEND_CUDA || b == FC_BACKEND_HOST,
             "unknown backend " + std::to_string(static_cast<int>(b)));
  return static_cast<Backend>(b);
}
// The tensor `name` of `op`, `dims` elements of `elem_bytes` bytes, has a size that fits the
// runtime's size arithmetic (memory.h: checked_bytes). Called for every tensor an op entry
// receives, before the op derives a size from it.
inline void require_size(const char* op, const char* name, int64_t elem_bytes,
                         std::initializer_list<int64_t> dims) {
  checked_bytes(dims, elem_bytes, std::string(op) + ": " + name);
}
inline void require_size(const char* op, const char* name, fc_dtype_t dtype,
                         std::initializer_list<int64_t> dims) {
  require_size(op, name, dtype == FC_DTYPE_BF16 ? 2 : 4, dims);
}

// The three matrices of a GEMM-shaped op (a: m x k, w: n x k or k x n, c: m x n).
inline void require_gemm_sizes(const char* op, fc_dtype_t dtype, int64_t m, int64_t n, int64_t k) {
  require_size(op, "a", dtype, {m, k});
  require_size(op, "w", dtype, {n, k});
  require_size(op, "c", dtype, {m, n});
}

// An attention op's shape, checked: not null, its tensors' sizes within the size arithmetic
// (q, k and lse; o, dq, dk, dv and d_o are shaped as q or k). For the ring, sizes of the whole
// sequence bound every rank's tensors under either layout.
inline host::AttentionLocalShape attention_local_shape(const char* op, fc_dtype_t dtype,
                                                       const fc_attention_local_t* shape) {
  FC_REQUIRE(shape != nullptr, std::string(op) + ": null shape");
  require_size(op, "q", dtype, {shape->batch, shape->q_len, shape->q_heads, shape->head_dim});
  require_size(op, "k", dtype, {shape->batch, shape->kv_len, shape->kv_heads, shape->head_dim});
  require_size(op, "lse", 4, {shape->batch, shape->q_heads, shape->q_len});
  host::AttentionLocalShape s;
  s.batch = shape->batch;
  s.q_len = shape->q_len;
  s.kv_len = shape->kv_len;
  s.q_heads = shape->q_heads;
  s.kv_heads = shape->kv_heads;
  s.head_dim = shape->head_dim;
  s.causal = shape->causal != 0;
  s.scale = shape->scale;
  return s;
}
inline host::AttentionShape ring_attention_shape(const char* op, fc_dtype_t dtype,
                                                 const fc_attention_shape_t* shape) {
  FC_REQUIRE(shape != nullptr, std::string(op) + ": null shape");
  const SeqLayout layout = seq_layout(op, shape->layout);
  require_size(op, "q", dtype, {shape->batch, shape->seq, shape->q_heads, shape->head_dim});
  require_size(op, "k", dtype, {shape->batch, shape->seq, shape->kv_heads, shape->head_dim});
  require_size(op, "lse", 4, {shape->batch, shape->q_heads, shape->seq});
  host::AttentionShape s;
  s.batch = shape->batch;
  s.seq = shape->seq;
  s.q_heads = shape->q_heads;
  s.kv_heads = shape->kv_heads;
  s.head_dim = shape->head_dim;
  s.causal = shape->causal != 0;
  s.scale = shape->scale;
  s.layout = layout;
  return s;
}

inline OpDesc op_desc(const fc_op_desc_t* d) {
  if (d == nullptr) return {};
  return OpDesc{d->description != nullptr ? d->description : "", d->fingerprint};
}

}  // namespace fusedcomm::capi
