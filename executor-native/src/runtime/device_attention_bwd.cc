// The single-GPU attention backward (fc_attention_backward's cuda backend) through the kernels
// library's flash-attention backward (kernels/attention/attention_bwd.h).
#include <cmath>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "fusedcomm/runtime/device_attention.h"
#include "fusedcomm/runtime/errors.h"
#include "kernels/attention/attention_bwd.h"

namespace fusedcomm {

namespace {

// The δ workspace comes from a memory pool per device that keeps what it has (release threshold:
// never), allocated and freed in the order of the op's stream: concurrent calls on different
// streams never share a buffer, and after the first call of a size no device allocation is made.
cudaMemPool_t bwd_pool(int device) {
  static std::mutex mu;
  static auto* pools = new std::map<int, cudaMemPool_t>();  // never destroyed: outlives static teardown
  std::lock_guard<std::mutex> lock(mu);
  auto it = pools->find(device);
  if (it != pools->end()) return it->second;
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = device;
  cudaMemPool_t pool = nullptr;
  if (cudaMemPoolCreate(&pool, &props) != cudaSuccess) {
    cudaGetLastError();
    pool = nullptr;  // the device's default pool then
  } else {
    uint64_t keep = UINT64_MAX;
    cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep);
  }
  (*pools)[device] = pool;
  return pool;
}

}  // namespace

void cuda_attention_backward_local(const fc_attention_local_t& s, DType dtype, const void* q, const void* k,
                                   const void* v, const void* o, const float* lse, const void* d_o, void* dq,
                                   void* dk, void* dv, cudaStream_t stream) {
  const std::string shape = require_cuda_attention_shape("attentionBackward", s, dtype);
  if (s.batch == 0 || (s.q_len == 0 && s.kv_len == 0)) return;
  for (const void* p : {q, k, v, o, d_o, static_cast<const void*>(dq), static_cast<const void*>(dk),
                        static_cast<const void*>(dv)}) {
    FC_REQUIRE(p != nullptr, "attentionBackward: q, k, v, o, d_o, dq, dk and dv must not be null");
    FC_REQUIRE(reinterpret_cast<uintptr_t>(p) % 16 == 0,
               "attentionBackward: device pointers must be 16-byte aligned");
  }
  FC_REQUIRE(lse != nullptr && reinterpret_cast<uintptr_t>(lse) % 4 == 0,
             "attentionBackward: lse (the forward's, fp32) is required and must be 4-byte aligned");
  kernels::AttentionBwdArgs a;
  a.q = kernels::attn_dense(q, s.q_len, s.q_heads, s.head_dim);
  a.k = kernels::attn_dense(k, s.kv_len, s.kv_heads, s.head_dim);
  a.v = kernels::attn_dense(v, s.kv_len, s.kv_heads, s.head_dim);
  a.o = kernels::attn_dense(o, s.q_len, s.q_heads, s.head_dim);
  a.d_o = kernels::attn_dense(d_o, s.q_len, s.q_heads, s.head_dim);
  a.lse = lse;
  a.dq.ptr = dq;
  a.dk.ptr = dk;
  a.dv.ptr = dv;
  a.batch = s.batch;
  a.q_len = s.q_len;
  a.kv_len = s.kv_len;
  a.q_heads = s.q_heads;
  a.kv_heads = s.kv_heads;
  a.head_dim = s.head_dim;
  a.causal = s.causal != 0;
  a.scale = s.scale;
  a.dq_path = s.deterministic != 0 ? 1 : 0;  // 1: dQ in its own pass; 0: the tuned (fastest) path
  auto gpu_fail = [&](cudaError_t e, const char* what) {
    fail(ErrorKind::kFatalGpu, "attentionBackward " + shape + ": " + what + ": " + cudaGetErrorName(e) +
                                   ": " + cudaGetErrorString(e));
  };
  // The workspace: δ ((B, Hq, q_len) fp32) and, where the launch adds dQ up in fp32, its
  // accumulator, stream-ordered. A stream being captured into a graph takes a graph-owned
  // allocation (the graph's own pool).
  const size_t delta_bytes =
      (static_cast<size_t>(s.batch) * s.q_heads * s.q_len * sizeof(float) + 255) / 256 * 256;
  const size_t acc_bytes = kernels::attention_bwd_dq_acc_bytes(a);
  const size_t ws_bytes = delta_bytes + acc_bytes;
  uint8_t* ws = nullptr;
  if (ws_bytes > 0) {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    cudaError_t e = cudaStreamIsCapturing(stream, &capture);
    if (e != cudaSuccess) gpu_fail(e, "stream query failed");
    int device = 0;
    if ((e = cudaGetDevice(&device)) != cudaSuccess) gpu_fail(e, "no current device");
    const cudaMemPool_t pool = capture == cudaStreamCaptureStatusNone ? bwd_pool(device) : nullptr;
    void* p = nullptr;
    e = pool != nullptr ? cudaMallocFromPoolAsync(&p, ws_bytes, pool, stream)
                        : cudaMallocAsync(&p, ws_bytes, stream);
    if (e != cudaSuccess) gpu_fail(e, "workspace allocation failed");
    ws = static_cast<uint8_t*>(p);
    a.delta = reinterpret_cast<float*>(ws);
    a.dq_acc = acc_bytes > 0 ? reinterpret_cast<float*>(ws + delta_bytes) : nullptr;
  } else {
    a.delta = static_cast<float*>(dq);  // never read or written: no query rows
  }
  if (const char* why = kernels::attention_bwd_check(a)) {
    if (ws != nullptr) cudaFreeAsync(ws, stream);
    fail(ErrorKind::kInvalidArgument, std::string("attentionBackward ") + shape + ": " + why);
  }
  cudaError_t e = kernels::launch_attention_bwd(a, stream);
  if (ws != nullptr) {
    const cudaError_t f = cudaFreeAsync(ws, stream);
    if (e == cudaSuccess) e = f;
  }
  if (e == cudaSuccess && stream == nullptr) e = cudaStreamSynchronize(nullptr);
  if (e != cudaSuccess) gpu_fail(e, "failed on the GPU");
}

void enqueue_ring_bwd_step(const RingAttentionShape& s, int world, int rank, int step, const void* q,
                           const void* k, const void* v, const float* lse, const float* delta,
                           const void* d_o, float* dq_acc, float* dk_acc, float* dv_acc,
                           cudaStream_t stream) {
  const int64_t B = s.batch, Hq = s.q_heads, Hkv = s.kv_heads, D = s.head_dim;
  const int64_t s_r = ring_block_rows(s, world, rank);
  if (B == 0 || s_r == 0) return;
  const auto* gq = static_cast<const __nv_bfloat16*>(q);
  const auto* gdo = static_cast<const __nv_bfloat16*>(d_o);
  for (const RingLaunch& l : ring_step_plan(s, world, rank, step)) {
    if (l.key.count == 0) continue;  // sees no key anywhere: no gradient
    kernels::AttentionBwdArgs a;
    a.batch = B;
    a.q_len = l.q.count;
    a.kv_len = l.key.count;
    a.q_heads = Hq;
    a.kv_heads = Hkv;
    a.head_dim = D;
    a.causal = s.causal;
    a.scale = s.scale;
    a.q_pos0 = l.q.pos;
    a.k_pos0 = l.key.pos;
    for (int t = 0; t < 2; ++t) {  // q and d_o: this rank's rows of the query chunk
      kernels::AttnTensor& x = t == 0 ? a.q : a.d_o;
      x.ptr = (t == 0 ? gq : gdo) + l.q_row0 * Hq * D;
      x.stride_h = D;
      x.stride_s = Hq * D;
      x.stride_b = s_r * Hq * D;
    }
    a.o = a.d_o;                   // not read: δ is ready
    for (int t = 0; t < 2; ++t) {  // k and v: the owner's rows of the key chunk
      kernels::AttnTensor& x = t == 0 ? a.k : a.v;
      x.ptr = static_cast<const __nv_bfloat16*>(t == 0 ? k : v) + l.k_row0 * Hkv * D;
      x.stride_h = D;
      x.stride_s = Hkv * D;
      x.stride_b = l.k_block_rows * Hkv * D;
    }
    a.lse = lse + l.q_row0;
    a.lse_stride_h = s_r;
    a.lse_stride_b = Hq * s_r;
    a.delta = const_cast<float*>(delta) + l.q_row0;  // read only (delta_ready)
    a.delta_stride_h = s_r;
    a.delta_stride_b = Hq * s_r;
    a.delta_ready = true;
    a.mode = kernels::AttnGradMode::kAdd;
    a.dq.ptr = dq_acc + l.q_row0 * Hq * D;
    a.dq.stride_h = D;
    a.dq.stride_s = Hq * D;
    a.dq.stride_b = s_r * Hq * D;
    for (int t = 0; t < 2; ++t) {
      kernels::AttnGrad& g = t == 0 ? a.dk : a.dv;
      g.ptr = (t == 0 ? dk_acc : dv_acc) + l.k_row0 * Hkv * D;
      g.stride_h = D;
      g.stride_s = Hkv * D;
      g.stride_b = l.k_block_rows * Hkv * D;
    }
    if (const char* why = kernels::attention_bwd_check(a)) {
      fail(ErrorKind::kInvalidArgument, std::string("ringAttentionBackward: ") + why);
    }
    const cudaError_t e = kernels::launch_attention_bwd(a, stream);
    if (e != cudaSuccess) {
      fail(ErrorKind::kFatalGpu, std::string("ringAttentionBackward: backward launch: ") +
                                     cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
    }
  }
}

void enqueue_dkdv_round(const float* partial, void* dk, void* dv, int64_t batch, int64_t rows,
                        int64_t kv_heads, int64_t head_dim, const char* op, cudaStream_t stream) {
  const int64_t n = batch * rows * kv_heads * head_dim;
  for (int t = 0; t < 2; ++t) {
    const cudaError_t e = kernels::launch_attention_grad_convert(
        partial + t * n, 0, 0, 0, static_cast<__nv_bfloat16*>(t == 0 ? dk : dv), 0, 0, 0, batch, rows,
        kv_heads, head_dim, stream);
    if (e != cudaSuccess) {
      fail(ErrorKind::kFatalGpu, std::string(op) + ": rounding " + (t == 0 ? "dK" : "dV") + ": " +
                                     cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
    }
  }
}

}  // namespace fusedcomm
