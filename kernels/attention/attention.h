// Flash-attention forward on Hopper (sm_90a): bf16 q, k, v, o; fp32 online softmax; the
// log-sum-exp per query row. One launch computes, for every batch b and query head h,
//   o[b, i, h, :] = softmax_j(scale · q[b, i, h, :] · k[b, j, h / (Hq / Hkv), :]) · v[b, j, ...]
// over the keys j that query i sees: all of them, or (causal) those whose global position is at
// most the query's: k_pos0 + j <= q_pos0 + i (top-left aligned when both offsets are 0, as
// torch's scaled_dot_product_attention). The offsets let a ring of ranks run the same kernel on
// any (query block, key block) pair of a longer sequence.
//
// Layouts (element strides; the last dimension is contiguous):
//   q, o: (B, q_len, Hq, D), k, v: (B, kv_len, Hkv, D): stride_b, stride_s, stride_h per tensor,
//   so that each may be a view (e.g. a slice of a packed qkv tensor). lse: (B, Hq, q_len) fp32,
//   natural log, contiguous unless strides are given. A query row that sees no key gets o = 0 and lse = -inf.
//
// Accumulation across launches (the ring): with acc != kNone the launch folds its result into a
// running fp32 output `o_acc` ((B, q_len, Hq, D), contiguous) and the running `lse`:
//   kStore: o_acc, lse = this launch's result (the first block of a ring);
//   kMerge: o_acc, lse = the log-sum-exp weighted merge of (o_acc, lse) and this launch's result.
// In both, `o` (when not null) receives the merged o_acc rounded to bf16 (the ring's last step).
//
// Requirements (cudaErrorInvalidValue otherwise): head_dim 64 or 128; Hq a multiple of Hkv;
// pointers 16-byte aligned and strides multiples of 8 elements (TMA); every extent < 2^31.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace fusedcomm::kernels {

enum class AttnAccum : int { kNone = 0, kStore = 1, kMerge = 2 };

struct AttnTensor {
  const __nv_bfloat16* ptr = nullptr;
  int64_t stride_b = 0, stride_s = 0, stride_h = 0;  // elements
};

struct AttentionArgs {
  AttnTensor q, k, v;
  __nv_bfloat16* o = nullptr;  // may be null with acc != kNone
  int64_t o_stride_b = 0, o_stride_s = 0, o_stride_h = 0;
  float* lse = nullptr;    // (B, Hq, q_len); null: not written (required with acc != kNone)
  float* o_acc = nullptr;  // (B, q_len, Hq, D) fp32, with acc != kNone
  // Batch and head strides of lse, batch stride of o_acc (elements; 0: dense as above), so that a
  // launch can cover a slice of the query rows (the zigzag layout's chunks).
  int64_t lse_stride_b = 0, lse_stride_h = 0, acc_stride_b = 0;
  AttnAccum acc = AttnAccum::kNone;
  int64_t batch = 0, q_len = 0, kv_len = 0, q_heads = 0, kv_heads = 0, head_dim = 0;
  bool causal = false;
  float scale = 0.0f;              // 0: 1 / sqrt(head_dim)
  int64_t q_pos0 = 0, k_pos0 = 0;  // global positions of query row 0 and key row 0 (causal)
};

// Dense strides for (B, S, H, D) tensors.
inline AttnTensor attn_dense(const void* p, int64_t s, int64_t h, int64_t d) {
  AttnTensor t;
  t.ptr = static_cast<const __nv_bfloat16*>(p);
  t.stride_h = d;
  t.stride_s = h * d;
  t.stride_b = s * h * d;
  return t;
}

// Whether the launch accepts args (nullptr) or why not (a static sentence).
const char* attention_check(const AttentionArgs& args);

// Enqueues the forward on `stream`. cudaErrorInvalidValue where attention_check fails.
cudaError_t launch_attention(const AttentionArgs& args, cudaStream_t stream);

}  // namespace fusedcomm::kernels
