// Internals shared by the host backend's source files (not a public header): dtype <-> fp32
// conversion of whole arrays, the fp32 GEMM core, row-block collectives and argument checks.
// Everything here works in fp32; the public ops round once, at their output.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fusedcomm/host/host_ops.h"
#include "fusedcomm/runtime/errors.h"
#include "fusedcomm/runtime/exchange.h"

namespace fusedcomm::host::detail {

// ---- argument checks (messages name the op and the offending value) ------------------------
void require_dtype(DType t, const char* op);
void require_nonneg(int64_t value, const char* op, const char* name);
// ptr may be null only when the buffer it points to is empty.
void require_data(const void* ptr, int64_t elems, const char* op, const char* name);
// The checks a GEMM-shaped op (c = a · op(w), m×n×k) makes first, in this order: dtype; m, n, k
// >= 0; weight layout. n_name and k_name are the op's own names for n and k ("n_local",
// "k_local"), which the messages quote.
void require_gemm_shape(DType t, int64_t m, int64_t n, int64_t k, WeightLayout layout, const char* op,
                        const char* n_name = "n", const char* k_name = "k");

// ---- dtype <-> fp32 -------------------------------------------------------------------------
std::vector<float> to_f32(DType t, const void* src, int64_t n);
void to_f32(DType t, const void* src, int64_t n, float* dst);
void from_f32(DType t, const float* src, int64_t n, void* dst);  // one rounding (bf16: RNE)

// ---- GEMM core ------------------------------------------------------------------------------
// c (m×n, fp32, overwritten) = a (m×k) · w_nkᵀ (w_nk: n×k). Each element is summed over k in
// increasing order, so the result equals a naive fp32 loop bit for bit.
void gemm_f32(const float* a, const float* w_nk, float* c, int64_t m, int64_t n, int64_t k);
// The weight of either layout as an fp32 n×k matrix.
std::vector<float> weight_as_nk(DType t, const void* w, int64_t n, int64_t k, WeightLayout layout);

// ---- row-block collectives ------------------------------------------------------------------
// A tensor of `rows` rows is split over ranks by split.h, whole rows per rank.
// in: split_count(rows, W, r) rows of row_bytes; out: all rows, rank blocks in rank order.
void all_gather_rows(Exchanger& ex, const void* in, void* out, int64_t rows, int64_t row_bytes,
                     const char* step);
// in: rows × row_elems in dtype `wire`; out (fp32): block r, split_count(rows, W, r) rows, the
// sum over ranks added in rank order in fp32.
void reduce_scatter_rows(Exchanger& ex, DType wire, const void* in, float* out, int64_t rows,
                         int64_t row_elems, const char* step);

// ---- attention core (attention.cc) ---------------------------------------------------------
// Consecutive rows [row, row + count) of a (B, rows, heads, D) tensor holding the sequence
// positions [pos, pos + count).
struct SeqSpan {
  int64_t row = 0, pos = 0, count = 0;
};
// The rows of a rank's tensors under a ring layout: its runs (split.h: seq_runs), one after
// the other.
std::vector<SeqSpan> seq_spans(int64_t seq, int world, int rank, SeqLayout layout);

// How many keys of `span` a query at global position `pos` sees: causal, those at positions
// <= pos (a prefix of the span); otherwise all of them.
inline int64_t visible_keys(bool causal, const SeqSpan& span, int64_t pos) {
  if (!causal) return span.count;
  const int64_t n = pos - span.pos + 1;
  return n < 0 ? 0 : (n > span.count ? span.count : n);
}

// The checks both attention ops make first, in this order: dtype; batch >= 0; head_dim >= 1;
// q_heads a positive multiple of kv_heads; a finite scale. Messages name `op`.
void require_attention(const char* op, DType t, int64_t batch, int64_t q_heads, int64_t kv_heads,
                       int64_t head_dim, float scale);

// The online softmax of a block of query rows, in fp32: for each (batch, query row, head) a
// running max, the sum of exp(score - max) and the sum of exp(score - max) · v. Key blocks are
// merged one at a time, in any grouping of the keys (the result changes only by fp32
// rounding); causal masking compares global positions.
class OnlineSoftmax {
 public:
  // q: (B, q_rows, Hq, D) fp32, its rows at the positions `q_spans`; scale 0: 1 / sqrt(head_dim).
  OnlineSoftmax(int64_t batch, int64_t q_heads, int64_t kv_heads, int64_t head_dim, bool causal, float scale,
                std::vector<float> q, int64_t q_rows, std::vector<SeqSpan> q_spans);
  // Merges the keys and values k, v: (B, kv_rows, Hkv, D) fp32, their rows at `kv_spans`.
  void attend(const float* k, const float* v, int64_t kv_rows, const std::vector<SeqSpan>& kv_spans);
  // o: (B, q_rows, Hq, D) in dtype t, rounded once; lse: (B, Hq, q_rows), or nullptr.
  void finish(DType t, void* o, float* lse) const;

 private:
  int64_t b_, hq_, hkv_, d_;
  bool causal_;
  float scale_;
  std::vector<float> q_;
  int64_t q_rows_;
  std::vector<SeqSpan> q_spans_;
  std::vector<float> max_, sum_;  // (B, q_rows, Hq)
  std::vector<float> acc_;        // (B, q_rows, Hq, D)
  std::vector<float> scores_;
};

// The backward of attention for a block of query rows, in fp32 (docs/ops.md
// "ringAttentionBackward"): holds q, dO, lse and δ = Σ_d dO·o of its rows and accumulates dQ
// over key blocks merged one at a time, in any grouping of the keys; each block's dK/dV are
// added into the caller's fp32 buffers (grouped-query heads summed). Causal masking compares
// global positions, as OnlineSoftmax.
class AttentionGrad {
 public:
  // q, o, d_o: (B, q_rows, Hq, D) in dtype t; lse: (B, Hq, q_rows) fp32; rows at `q_spans`.
  AttentionGrad(int64_t batch, int64_t q_heads, int64_t kv_heads, int64_t head_dim, bool causal, float scale,
                DType t, const void* q, const void* o, const float* lse, const void* d_o, int64_t q_rows,
                std::vector<SeqSpan> q_spans);
  // k, v: (B, kv_rows, Hkv, D) fp32, their rows at `kv_spans`; dk, dv: the same shape, fp32,
  // added to.
  void backward(const float* k, const float* v, int64_t kv_rows, const std::vector<SeqSpan>& kv_spans,
                float* dk, float* dv);
  // dq: (B, q_rows, Hq, D) in dtype t, rounded once.
  void finish(DType t, void* dq) const;

 private:
  int64_t b_, hq_, hkv_, d_;
  bool causal_;
  float scale_;
  int64_t q_rows_;
  std::vector<SeqSpan> q_spans_;
  std::vector<float> q_, do_, dq_;  // (B, q_rows, Hq, D)
  std::vector<float> lse_, delta_;  // (B, q_rows, Hq)
};

}  // namespace fusedcomm::host::detail
