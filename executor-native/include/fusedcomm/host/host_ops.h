// The host backend: a C++ reference implementation of every op of docs/ops.md, written
// against the Exchanger primitive. It is the oracle for the GPU kernels and the backend for
// hosts without a GPU. Arithmetic: inputs converted to fp32, fp32 accumulation, one rounding
// at the output (bf16: round to nearest even). Reductions over ranks add in rank order, so
// results are bitwise reproducible for a given world size.
//
// Row-major everywhere. W = ex.world(), r = ex.rank(). Uneven splits follow split.h.
// All pointers are host memory; no argument is checked twice: callers (the Java API) validate
// shapes, these functions FC_REQUIRE only what they cannot work without.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fusedcomm/runtime/exchange.h"
#include "fusedcomm/types.h"

namespace fusedcomm {
class MoeDeviceResult;  // comm/comm.h
}  // namespace fusedcomm

namespace fusedcomm::host {

using fusedcomm::DType;  // fusedcomm/types.h; the ops take kF32 and kBF16
using fusedcomm::SeqLayout;
inline int dtype_size(DType t) { return t == DType::kBF16 ? 2 : 4; }

uint16_t f32_to_bf16(float x);  // round to nearest even; NaN stays NaN (quiet)
float bf16_to_f32(uint16_t x);

// ---- collectives; `count` is the element count of the whole (unsplit) tensor --------------
// in: split_count(count, W, r) elements; out: count elements, rank blocks in rank order.
void all_gather(Exchanger& ex, DType t, const void* in, void* out, int64_t count);
// in: count elements; out: block r, split_count(count, W, r) elements, summed over ranks.
void reduce_scatter(Exchanger& ex, DType t, const void* in, void* out, int64_t count);
// in, out: count elements (may alias); out = sum over ranks.
void all_reduce(Exchanger& ex, DType t, const void* in, void* out, int64_t count);
// in: count elements as W blocks, block p = split_count(count, W, p) elements, sent to rank p.
// out: W blocks of split_count(count, W, r) elements, block s from rank s.
void all_to_all(Exchanger& ex, DType t, const void* in, void* out, int64_t count);

// ---- GEMM ---------------------------------------------------------------------------------
using fusedcomm::WeightLayout;  // fusedcomm/types.h
// fusedcomm/types.h. kF32AnyOrder allows any order of the sum; this backend keeps rank order
// (kF32's result).
using fusedcomm::PartialPrecision;
// c (m×n) = a (m×k) · op(w); accumulate: c += instead of c = (c read in dtype t).
void gemm(DType t, const void* a, const void* w, void* c, int64_t m, int64_t n, int64_t k,
          WeightLayout layout, bool accumulate = false);

// a_local: split_count(m, W, r) × k; w: n_local × k (kNK) or k × n_local (kKN);
// c: m × n_local = allGather(a) · op(w); gathered_a: m × k or nullptr.
void all_gather_gemm(Exchanger& ex, DType t, const void* a_local, const void* w, void* c, void* gathered_a,
                     int64_t m, int64_t n_local, int64_t k, WeightLayout layout);
// a: m × k_local; w: n × k_local (kNK) or k_local × n (kKN);
// c: rows block r (split_count(m, W, r) × n) of sum_s a_s · op(w_s).
void gemm_reduce_scatter(Exchanger& ex, DType t, const void* a, const void* w, void* c, int64_t m, int64_t n,
                         int64_t k_local, WeightLayout layout,
                         PartialPrecision partials = PartialPrecision::kF32);
// as above, c: m × n, the whole sum on every rank (the same bits on every rank).
void gemm_all_reduce(Exchanger& ex, DType t, const void* a, const void* w, void* c, int64_t m, int64_t n,
                     int64_t k_local, WeightLayout layout,
                     PartialPrecision partials = PartialPrecision::kF32);

// ---- MoE ----------------------------------------------------------------------------------
// Experts are split over ranks by split.h: rank r owns experts
// [split_offset(E, W, r), + split_count(E, W, r)). Each token's topk (expert id, weight) pairs
// make one routed row each. At the expert's rank, rows are expert-major; within an expert
// ordered by (source rank, source token, slot).
struct MoeLayout {
  int world = 1, rank = 0, topk = 0;
  int64_t num_experts = 0, first_local_expert = 0, local_experts = 0;
  int64_t tokens = 0;                                  // this rank's T
  std::vector<int64_t> expert_offsets;                 // local_experts + 1 row offsets into the received rows
  std::vector<int32_t> src_rank, src_token, src_slot;  // per received row
  std::vector<float> weight;                           // per received row
  // For combine: this rank's (token, slot) pairs in the order they were sent, per destination.
  std::vector<std::vector<int64_t>> sent_pairs;  // [dest rank] -> token * topk + slot
  int64_t rows() const { return expert_offsets.empty() ? 0 : expert_offsets.back(); }
};

struct MoeDispatchResult {
  MoeLayout layout;
  std::vector<uint8_t> routed_x;  // rows × hidden, dtype t (the tokens as received)
  std::vector<uint8_t> out;       // rows × ffn, dtype t: routed_x[e rows] · W1_eᵀ
  // The cuda backend keeps routed_x and out on the GPU (comm.h's MoeDeviceResult; the vectors
  // above stay empty) and fills `layout` from the device when the op returns (sent_pairs
  // empty). Null on the host backend.
  std::shared_ptr<MoeDeviceResult> device;
  // The cuda backend's path, for logs: "fused (G GEMM + P dispatch CTAs)" or "decomposed"
  // (kernels/moe/moe.h); empty on the host backend.
  std::string path;
};

// moe_dispatch_gemm's options (docs/ops.md "moeDispatchGemm"), the same on every rank.
struct MoeDispatchOptions {
  // > 0: the most routed rows any rank may receive; a rank that would receive more fails the op
  // on every rank (Error(kInvalidArgument) naming that rank, its rows and the bound) before any
  // row moves. The cuda backend sizes its outputs and receive area by it. 0: no bound (the cuda
  // backend: what its symmetric data area holds).
  int64_t max_recv_rows = 0;
};

// x: tokens × hidden; topk_ids, topk_weights: tokens × topk (ids in [0, num_experts));
// w1_local: local_experts × ffn × hidden (each W1_e in kNK layout).
MoeDispatchResult moe_dispatch_gemm(Exchanger& ex, DType t, const void* x, int64_t tokens, int64_t hidden,
                                    const int32_t* topk_ids, const float* topk_weights, int topk,
                                    int64_t num_experts, const void* w1_local, int64_t ffn,
                                    const MoeDispatchOptions& options = {});
// expert_out: layout.rows() × width (rows in the layout's order); out: layout.tokens × width,
// out[t] = sum over slots k of weight(t, k) · expert_out[row of (t, k)], fp32, slot order.
void moe_combine(Exchanger& ex, DType t, const MoeLayout& layout, const void* expert_out, int64_t width,
                 void* out);

// ---- grouped GEMM (local, no communication) ------------------------------------------------
// Group g owns rows [offsets[g], offsets[g+1]) of a (rows × k) and of c (rows × n): those rows
// of c = the same rows of a · op(w_g), with w holding the groups' weights one after the other,
// groups × n × k (kNK) or groups × k × n (kKN); fp32 accumulation, one rounding. offsets: groups
// + 1 values in host memory with 0 <= offsets[0] <= … <= offsets[groups] <= rows (a group may be
// empty); rows outside every group are not written.
void grouped_gemm(DType t, const void* a, const void* w, void* c, const int64_t* offsets, int64_t groups,
                  int64_t rows, int64_t n, int64_t k, WeightLayout layout);
// The rule for `offsets` above (and groups >= 0, rows >= 0); Error(kInvalidArgument) naming
// `op` and the first offset that breaks it. Both backends' grouped GEMMs check with it.
void require_group_offsets(const char* op, const int64_t* offsets, int64_t groups, int64_t rows);

// ---- attention ----------------------------------------------------------------------------
// Softmax attention forward (docs/ops.md "attention", "ringAttention"): query head h reads K/V
// head h / (Hq / Hkv); scores scale · q·k (scale 0: 1 / sqrt(head_dim)); an online softmax (a
// running max and sum) in fp32; o rounded once; lse = log Σ exp(score) over the visible keys,
// natural log, fp32 (-inf and o = 0 for a query that sees no key).

// The single-rank op: q, o: (B, q_len, Hq, D); k, v: (B, kv_len, Hkv, D); lse: (B, Hq, q_len)
// or nullptr. Causal: query i sees keys j <= i (top-left aligned).
struct AttentionLocalShape {
  int64_t batch = 1, q_len = 0, kv_len = 0;
  int64_t q_heads = 1, kv_heads = 1;  // q_heads % kv_heads == 0 (grouped-query)
  int64_t head_dim = 0;
  bool causal = false;
  float scale = 0.f;  // 0: 1 / sqrt(head_dim)
};
void attention(DType t, const AttentionLocalShape& shape, const void* q, const void* k, const void* v,
               void* o, float* lse);

// Its backward (docs/ops.md "attentionBackward"): from the forward's q, k, v, o, lse (required)
// and d_o (as o) writes dq (as q), dk, dv (as k, v; summed over the query heads sharing a K/V
// head). fp32 accumulation, one rounding.
void attention_backward(DType t, const AttentionLocalShape& shape, const void* q, const void* k,
                        const void* v, const void* o, const float* lse, const void* d_o, void* dq, void* dk,
                        void* dv);

// Ring attention: rank r holds the positions seq_runs(seq, W, r, layout) (runtime/split.h), S_r
// of them, in that order.
struct AttentionShape {
  int64_t batch = 1, seq = 0;         // seq: the whole sequence
  int64_t q_heads = 1, kv_heads = 1;  // q_heads % kv_heads == 0 (grouped-query)
  int64_t head_dim = 0;
  bool causal = false;  // by global position: query i sees keys j <= i
  float scale = 0.f;    // 0: 1 / sqrt(head_dim)
  SeqLayout layout = SeqLayout::kContiguous;
};
// q, o: (B, S_r, Hq, D); k, v: (B, S_r, Hkv, D); lse: (B, Hq, S_r) fp32 or nullptr, natural log of
// the softmax denominator over the whole (visible) sequence. K/V blocks travel around the ring
// (rank r sends to r+1), W-1 steps.
void ring_attention(Exchanger& ex, DType t, const AttentionShape& shape, const void* q, const void* k,
                    const void* v, void* o, float* lse);

// Its backward (docs/ops.md "ringAttentionBackward"), rank-local shapes as the forward: lse
// (required) and d_o from the forward, dq (as q), dk, dv (as k, v) of this rank's positions.
// K/V blocks travel around the ring as in the forward, with their fp32 dK/dV partials; after
// W - 1 steps one more hop takes each block's partials home to its owner.
void ring_attention_backward(Exchanger& ex, DType t, const AttentionShape& shape, const void* q,
                             const void* k, const void* v, const void* o, const float* lse, const void* d_o,
                             void* dq, void* dk, void* dv);

}  // namespace fusedcomm::host
