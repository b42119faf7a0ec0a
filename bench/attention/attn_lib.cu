// libfc_attn_bench.so: our attention forward and backward behind C entry points, so that
// torch_attention.py can time ours and torch's SDPA backends in one process, interleaved, on the
// same tensors (ctypes).
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include "bench/attention/dense_args.h"
#include "kernels/attention/attention.h"
#include "kernels/attention/attention_bwd.h"

namespace k = fusedcomm::kernels;

// o = attention(q, k, v), dense (B, S, H, D) bf16; lse (B, Hq, Sq) fp32 or null; on `stream`.
// Returns the launch's cudaError_t (0: enqueued).
extern "C" __attribute__((visibility("default"))) int fc_attention_bf16(const void* q, const void* kk,
                                                                        const void* v, void* o, float* lse,
                                                                        int B, int Sq, int Sk, int Hq,
                                                                        int Hkv, int D, int causal,
                                                                        void* stream) {
  const k::AttentionArgs a =
      fusedcomm::bench::attn_dense_fwd(q, kk, v, o, lse, B, Sq, Sk, Hq, Hkv, D, causal != 0);
  return static_cast<int>(k::launch_attention(a, static_cast<cudaStream_t>(stream)));
}

// dq, dk, dv = the backward of o = attention(q, k, v) from o, lse and d_o (attention_bwd.h),
// dense bf16 gradients; delta (B, Hq, Sq) and dq_acc (B, Sq, Hq, D) fp32 workspaces; dq_path as
// AttentionBwdArgs (0: the tuned choice). Returns the launch's cudaError_t.
extern "C" __attribute__((visibility("default"))) int fc_attention_backward_bf16(
    const void* q, const void* kk, const void* v, const void* o, const float* lse, const void* d_o, void* dq,
    void* dk, void* dv, float* delta, float* dq_acc, int dq_path, int B, int Sq, int Sk, int Hq, int Hkv,
    int D, int causal, void* stream) {
  k::AttentionBwdArgs a = fusedcomm::bench::attn_dense_bwd(q, kk, v, o, lse, d_o, dq, dk, dv, delta, B, Sq,
                                                           Sk, Hq, Hkv, D, causal != 0);
  a.dq_acc = dq_acc;
  a.dq_path = dq_path;
  return static_cast<int>(k::launch_attention_bwd(a, static_cast<cudaStream_t>(stream)));
}
