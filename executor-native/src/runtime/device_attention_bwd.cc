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
  const std::string shape = "(B=" + std::to_string(s.batch) + ", q_len=" + std::to_string(s.q_len) +
                            ", kv_len=" + std::to_string(s.kv_len) + ", Hq=" + std::to_string(s.q_heads) +
                            ", Hkv=" + std::to_string(s.kv_heads) + ", D=" + std::to_string(s.head_dim) + ")";
  FC_REQUIRE(dtype == DType::kBF16, "attentionBackward on the cuda backend takes bf16 tensors");
  FC_REQUIRE(s.batch >= 0 && s.q_len >= 0 && s.kv_len >= 0, "attentionBackward: negative extent in " + shape);
  FC_REQUIRE(s.head_dim == 64 || s.head_dim == 128,
             "attentionBackward on the cuda backend needs head_dim 64 or 128, got " + shape);
  FC_REQUIRE(s.q_heads > 0 && s.kv_heads > 0 && s.q_heads % s.kv_heads == 0,
             "attentionBackward: q_heads must be a positive multiple of kv_heads, got " + shape);
  FC_REQUIRE(std::isfinite(s.scale) && s.scale >= 0.0f,
             "attentionBackward: scale must be finite and >= 0 (0: 1/sqrt(D))");
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

}  // namespace fusedcomm
