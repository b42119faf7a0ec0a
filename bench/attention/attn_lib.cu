// libfc_attn_bench.so: our attention forward and backward behind C entry points, so that
// torch_attention.py can time ours and torch's SDPA backends in one process, interleaved, on the
// same tensors (ctypes).
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

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
  k::AttentionArgs a;
  a.q = k::attn_dense(q, Sq, Hq, D);
  a.k = k::attn_dense(kk, Sk, Hkv, D);
  a.v = k::attn_dense(v, Sk, Hkv, D);
  a.o = static_cast<__nv_bfloat16*>(o);
  a.o_stride_h = D;
  a.o_stride_s = static_cast<int64_t>(Hq) * D;
  a.o_stride_b = static_cast<int64_t>(Sq) * Hq * D;
  a.lse = lse;
  a.batch = B;
  a.q_len = Sq;
  a.kv_len = Sk;
  a.q_heads = Hq;
  a.kv_heads = Hkv;
  a.head_dim = D;
  a.causal = causal != 0;
  return static_cast<int>(k::launch_attention(a, static_cast<cudaStream_t>(stream)));
}

// dq, dk, dv = the backward of o = attention(q, k, v) from o, lse and d_o (attention_bwd.h),
// dense bf16 gradients; delta (B, Hq, Sq) and dq_acc (B, Sq, Hq, D) fp32 workspaces; dq_path as
// AttentionBwdArgs (0: the tuned choice). Returns the launch's cudaError_t.
extern "C" __attribute__((visibility("default"))) int fc_attention_backward_bf16(
    const void* q, const void* kk, const void* v, const void* o, const float* lse, const void* d_o, void* dq,
    void* dk, void* dv, float* delta, float* dq_acc, int dq_path, int B, int Sq, int Sk, int Hq, int Hkv,
    int D, int causal, void* stream) {
  k::AttentionBwdArgs a;
  a.q = k::attn_dense(q, Sq, Hq, D);
  a.k = k::attn_dense(kk, Sk, Hkv, D);
  a.v = k::attn_dense(v, Sk, Hkv, D);
  a.o = k::attn_dense(o, Sq, Hq, D);
  a.d_o = k::attn_dense(d_o, Sq, Hq, D);
  a.lse = lse;
  a.delta = delta;
  a.dq_acc = dq_acc;
  a.dq_path = dq_path;
  a.dq.ptr = dq;
  a.dk.ptr = dk;
  a.dv.ptr = dv;
  a.batch = B;
  a.q_len = Sq;
  a.kv_len = Sk;
  a.q_heads = Hq;
  a.kv_heads = Hkv;
  a.head_dim = D;
  a.causal = causal != 0;
  return static_cast<int>(k::launch_attention_bwd(a, static_cast<cudaStream_t>(stream)));
}
