// Flash-attention backward on Hopper (sm_90a): the gradients of attention.h's forward.
// From the forward's q, k, v, its output o and log-sum-exp lse, and dO (the gradient of o), one
// launch computes, for every batch b, query head h and its K/V head hk = h / (Hq / Hkv):
//   P_ij  = exp(scale · q_i · k_j - lse_i)   over the keys j that query i sees (attention.h)
//   δ_i   = Σ_d dO_i · o_i                    (fp32; the launch computes it, or takes it ready)
//   dS_ij = P_ij · (dO_i · v_j - δ_i)
//   dq_i  = scale · Σ_j dS_ij k_j,   dk_j = scale · Σ_{h of hk} Σ_i dS_ij q_i,   dv_j = Σ_{h of hk} Σ_i P_ij dO_i
// with fp32 accumulation. Causal by global position as the forward (q_pos0, k_pos0). A query row
// with lse = -inf (it saw no key) contributes nothing.
//
// Layouts as the forward: q, o, d_o (B, q_len, Hq, D), k, v (B, kv_len, Hkv, D) bf16 views with
// element strides; lse and delta (B, Hq, q_len) fp32 (row stride 1; batch and head strides, 0:
// dense). Gradients dq as q, dk and dv as k and v, each with its own strides:
//   mode kStore: bf16, written (rounded once from fp32);
//   mode kAdd:   fp32 accumulators the launch adds into (a ring: one launch per visible block
//                pair, then launch_attention_grad_convert once).
// dk and dv are each owned by one CTA (summed over the query heads of a K/V head inside it). dq is
// computed by a separate dQ pass that owns its rows (recomputing S and dP; bit-reproducible), or
// in the dK/dV pass and added into fp32 (kStore: into the workspace dq_acc, zeroed first, then
// rounded into dq) with per-thread vector reductions or TMA reduce-adds, atomic per element in no
// fixed order. dq_path picks; 0 leaves it to tuning.h per head dim in mode kStore and takes the
// separate pass in kAdd (the ring's sums stay reproducible). Launches into the same accumulators
// must be ordered (one stream).
//
// Requirements (cudaErrorInvalidValue otherwise): those of attention.h; delta not null (the
// launch's fp32 workspace when !delta_ready); dq_acc where attention_bwd_dq_acc_bytes says;
// gradients 16-byte aligned with strides multiples of 8 elements.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/attention/attention.h"

namespace fusedcomm::kernels {

enum class AttnGradMode : int { kStore = 0, kAdd = 1 };

struct AttnGrad {
  void* ptr = nullptr;                               // bf16 (kStore) or fp32 (kAdd)
  int64_t stride_b = 0, stride_s = 0, stride_h = 0;  // elements
};

struct AttentionBwdArgs {
  AttnTensor q, k, v, o, d_o;  // o is read only when !delta_ready
  const float* lse = nullptr;
  int64_t lse_stride_b = 0, lse_stride_h = 0;  // 0: dense (B, Hq, q_len)
  float* delta = nullptr;
  int64_t delta_stride_b = 0, delta_stride_h = 0;  // 0: dense (B, Hq, q_len)
  bool delta_ready = false;  // true: delta holds δ already (an earlier launch on the same rows)
  AttnGrad dq, dk, dv;
  AttnGradMode mode = AttnGradMode::kStore;
  float* dq_acc = nullptr;  // fp32 (B, q_len, Hq, D) dense workspace: attention_bwd_dq_acc_bytes
  int dq_path = 0;          // 0: tuning.h's (kStore) or 1 (kAdd); 1: a separate dQ pass; in the dK/dV pass
                            // with 2: vector reductions, 3: TMA reduce-adds
  int64_t batch = 0, q_len = 0, kv_len = 0, q_heads = 0, kv_heads = 0, head_dim = 0;
  bool causal = false;
  float scale = 0.0f;              // 0: 1 / sqrt(head_dim)
  int64_t q_pos0 = 0, k_pos0 = 0;  // global positions of query row 0 and key row 0 (causal)
};

// Whether the launch accepts args (nullptr) or why not (a static sentence).
const char* attention_bwd_check(const AttentionBwdArgs& args);

// Bytes of the dq_acc workspace the launch needs (0: none; kStore with dQ in the dK/dV pass).
size_t attention_bwd_dq_acc_bytes(const AttentionBwdArgs& args);

// Enqueues δ (unless delta_ready) and the backward on `stream`: a dK/dV pass (a CTA per 128 keys
// of one K/V head) and a dQ pass (a CTA per 128 query rows of one head).
cudaError_t launch_attention_bwd(const AttentionBwdArgs& args, cudaStream_t stream);

// δ_i = Σ_d dO_i · o_i only (fp32, (B, Hq, q_len) with the given batch and head strides, 0: dense).
cudaError_t launch_attention_bwd_delta(const AttnTensor& o, const AttnTensor& d_o, float* delta,
                                       int64_t delta_stride_b, int64_t delta_stride_h, int64_t batch,
                                       int64_t q_len, int64_t q_heads, int64_t head_dim, cudaStream_t stream);

// dst (bf16) = src (fp32), both (B, S, H, D) with element strides (last dimension contiguous;
// strides even). The end of a kAdd accumulation.
cudaError_t launch_attention_grad_convert(const float* src, int64_t src_sb, int64_t src_ss, int64_t src_sh,
                                          __nv_bfloat16* dst, int64_t dst_sb, int64_t dst_ss, int64_t dst_sh,
                                          int64_t batch, int64_t seq, int64_t heads, int64_t head_dim,
                                          cudaStream_t stream);

}  // namespace fusedcomm::kernels
