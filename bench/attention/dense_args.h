// Our attention's arguments for dense (B, S, H, D) bf16 tensors, as the attention benchmarks
// launch it: attn_lib.cu (torch_attention.py's library) and ring_bench.cc (the 1-GPU reference
// and the 1-GPU rows beside the ring).
#pragma once

#include <cstdint>

#include "kernels/attention/attention.h"
#include "kernels/attention/attention_bwd.h"

namespace fusedcomm::bench {

// What the forward's and the backward's arguments share: q (B, Sq, Hq, D), k and v (B, Sk, Hkv,
// D), the sizes and the mask.
template <typename Args>
void attn_dense_common(Args& a, const void* q, const void* k, const void* v, int64_t B, int64_t Sq,
                       int64_t Sk, int64_t Hq, int64_t Hkv, int64_t D, bool causal) {
  a.q = kernels::attn_dense(q, Sq, Hq, D);
  a.k = kernels::attn_dense(k, Sk, Hkv, D);
  a.v = kernels::attn_dense(v, Sk, Hkv, D);
  a.batch = B;
  a.q_len = Sq;
  a.kv_len = Sk;
  a.q_heads = Hq;
  a.kv_heads = Hkv;
  a.head_dim = D;
  a.causal = causal;
}

// o = attention(q, k, v); lse (B, Hq, Sq) fp32 or null.
inline kernels::AttentionArgs attn_dense_fwd(const void* q, const void* k, const void* v, void* o, float* lse,
                                             int64_t B, int64_t Sq, int64_t Sk, int64_t Hq, int64_t Hkv,
                                             int64_t D, bool causal) {
  kernels::AttentionArgs a;
  attn_dense_common(a, q, k, v, B, Sq, Sk, Hq, Hkv, D, causal);
  a.o = static_cast<__nv_bfloat16*>(o);
  a.o_stride_h = D;
  a.o_stride_s = Hq * D;
  a.o_stride_b = Sq * Hq * D;
  a.lse = lse;
  return a;
}

// dq, dk, dv = the backward of o = attention(q, k, v) from o, lse and d_o, dense bf16 gradients;
// delta (B, Hq, Sq) fp32 workspace. The dQ path and its accumulator are the defaults.
inline kernels::AttentionBwdArgs attn_dense_bwd(const void* q, const void* k, const void* v, const void* o,
                                                const float* lse, const void* d_o, void* dq, void* dk,
                                                void* dv, float* delta, int64_t B, int64_t Sq, int64_t Sk,
                                                int64_t Hq, int64_t Hkv, int64_t D, bool causal) {
  kernels::AttentionBwdArgs a;
  attn_dense_common(a, q, k, v, B, Sq, Sk, Hq, Hkv, D, causal);
  a.o = kernels::attn_dense(o, Sq, Hq, D);
  a.d_o = kernels::attn_dense(d_o, Sq, Hq, D);
  a.lse = lse;
  a.delta = delta;
  a.dq.ptr = dq;
  a.dk.ptr = dk;
  a.dv.ptr = dv;
  return a;
}

}  // namespace fusedcomm::bench
