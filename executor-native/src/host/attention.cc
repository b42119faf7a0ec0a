// Attention on the host: the online-softmax core that both the single-rank op (here) and ring
// attention (ring_attention.cc) run, in fp32, one rounding at the output.
#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "detail.h"
#include "fusedcomm/runtime/split.h"

namespace fusedcomm::host {

namespace detail {

std::vector<SeqSpan> seq_spans(int64_t seq, int world, int rank, SeqLayout layout) {
  const SeqRuns runs = seq_runs(seq, world, rank, layout);
  std::vector<SeqSpan> out;
  int64_t row = 0;
  for (int i = 0; i < runs.n; ++i) {
    out.push_back({row, runs.run[i].pos, runs.run[i].count});
    row += runs.run[i].count;
  }
  return out;
}

void require_attention(const char* op, DType t, int64_t batch, int64_t q_heads, int64_t kv_heads,
                       int64_t head_dim, float scale) {
  require_dtype(t, op);
  require_nonneg(batch, op, "batch");
  FC_REQUIRE(head_dim >= 1, std::string(op) + ": head_dim = " + std::to_string(head_dim) + " must be >= 1");
  FC_REQUIRE(kv_heads >= 1 && q_heads >= 1 && q_heads % kv_heads == 0,
             std::string(op) + ": q_heads = " + std::to_string(q_heads) +
                 " must be a positive multiple of kv_heads = " + std::to_string(kv_heads));
  FC_REQUIRE(std::isfinite(scale),
             std::string(op) + ": scale = " + std::to_string(scale) + " must be finite");
}

OnlineSoftmax::OnlineSoftmax(int64_t batch, int64_t q_heads, int64_t kv_heads, int64_t head_dim, bool causal,
                             float scale, std::vector<float> q, int64_t q_rows, std::vector<SeqSpan> q_spans)
    : b_(batch),
      hq_(q_heads),
      hkv_(kv_heads),
      d_(head_dim),
      causal_(causal),
      scale_(scale != 0.f ? scale : 1.f / std::sqrt(static_cast<float>(head_dim))),
      q_(std::move(q)),
      q_rows_(q_rows),
      q_spans_(std::move(q_spans)) {
  max_.assign(b_ * q_rows_ * hq_, -std::numeric_limits<float>::infinity());
  sum_.assign(b_ * q_rows_ * hq_, 0.f);
  acc_.assign(b_ * q_rows_ * hq_ * d_, 0.f);
}

void OnlineSoftmax::attend(const float* k, const float* v, int64_t kv_rows,
                           const std::vector<SeqSpan>& kv_spans) {
  if (kv_rows == 0) return;
  scores_.resize(static_cast<size_t>(kv_rows));
  const int64_t group = hq_ / hkv_, d = d_;
  const auto visible = [&](const SeqSpan& span, int64_t p) { return visible_keys(causal_, span, p); };
  for (int64_t b = 0; b < b_; ++b) {
    for (const SeqSpan& qs : q_spans_) {
      for (int64_t i = 0; i < qs.count; ++i) {
        const int64_t p = qs.pos + i;
        int64_t seen = 0;
        for (const SeqSpan& ks : kv_spans) seen += visible(ks, p);
        if (seen == 0) continue;
        for (int64_t h = 0; h < hq_; ++h) {
          const int64_t row = (b * q_rows_ + qs.row + i) * hq_ + h;
          const float* qr = q_.data() + row * d;
          const int64_t kvh = h / group;
          float block_max = -std::numeric_limits<float>::infinity();
          int64_t n = 0;
          for (const SeqSpan& ks : kv_spans) {
            const int64_t vis = visible(ks, p);
            for (int64_t j = 0; j < vis; ++j, ++n) {
              const float* kr = k + ((b * kv_rows + ks.row + j) * hkv_ + kvh) * d;
              float dot = 0.f;
              for (int64_t x = 0; x < d; ++x) dot += qr[x] * kr[x];
              scores_[n] = dot * scale_;
              block_max = std::max(block_max, scores_[n]);
            }
          }
          const float old_max = max_[row];
          const float new_max = std::max(old_max, block_max);
          const float rescale = std::exp(old_max - new_max);  // 0 on the first visible block
          float* acc = acc_.data() + row * d;
          float sum = sum_[row] * rescale;
          for (int64_t x = 0; x < d; ++x) acc[x] *= rescale;
          n = 0;
          for (const SeqSpan& ks : kv_spans) {
            const int64_t vis = visible(ks, p);
            for (int64_t j = 0; j < vis; ++j, ++n) {
              const float w = std::exp(scores_[n] - new_max);
              const float* vr = v + ((b * kv_rows + ks.row + j) * hkv_ + kvh) * d;
              sum += w;
              for (int64_t x = 0; x < d; ++x) acc[x] += w * vr[x];
            }
          }
          sum_[row] = sum;
          max_[row] = new_max;
        }
      }
    }
  }
}

// O = acc / sum; LSE = max + log(sum). A query that saw no key (sum 0) gets 0 and -inf.
void OnlineSoftmax::finish(DType t, void* o, float* lse) const {
  const int64_t d = d_;
  std::vector<float> of(static_cast<size_t>(b_ * q_rows_ * hq_ * d));
  for (int64_t b = 0; b < b_; ++b) {
    for (int64_t i = 0; i < q_rows_; ++i) {
      for (int64_t h = 0; h < hq_; ++h) {
        const int64_t row = (b * q_rows_ + i) * hq_ + h;
        const float sum = sum_[row];
        for (int64_t x = 0; x < d; ++x) of[row * d + x] = sum > 0.f ? acc_[row * d + x] / sum : 0.f;
        if (lse != nullptr)
          lse[(b * hq_ + h) * q_rows_ + i] =
              sum > 0.f ? max_[row] + std::log(sum) : -std::numeric_limits<float>::infinity();
      }
    }
  }
  from_f32(t, of.data(), b_ * q_rows_ * hq_ * d, o);
}

AttentionGrad::AttentionGrad(int64_t batch, int64_t q_heads, int64_t kv_heads, int64_t head_dim, bool causal,
                             float scale, DType t, const void* q, const void* o, const float* lse,
                             const void* d_o, int64_t q_rows, std::vector<SeqSpan> q_spans)
    : b_(batch),
      hq_(q_heads),
      hkv_(kv_heads),
      d_(head_dim),
      causal_(causal),
      scale_(scale != 0.f ? scale : 1.f / std::sqrt(static_cast<float>(head_dim))),
      q_rows_(q_rows),
      q_spans_(std::move(q_spans)) {
  const int64_t rows = b_ * q_rows_ * hq_, elems = rows * d_;
  q_ = to_f32(t, q, elems);
  do_ = to_f32(t, d_o, elems);
  dq_.assign(static_cast<size_t>(elems), 0.f);
  // δ from o as the forward rounded it: the gradient of the o the caller holds.
  const std::vector<float> of = to_f32(t, o, elems);
  delta_.assign(static_cast<size_t>(rows), 0.f);
  lse_.assign(static_cast<size_t>(rows), 0.f);
  for (int64_t b = 0; b < b_; ++b) {
    for (int64_t i = 0; i < q_rows_; ++i) {
      for (int64_t h = 0; h < hq_; ++h) {
        const int64_t row = (b * q_rows_ + i) * hq_ + h;
        float dot = 0.f;
        for (int64_t x = 0; x < d_; ++x) dot += do_[row * d_ + x] * of[row * d_ + x];
        delta_[row] = dot;
        lse_[row] = lse[(b * hq_ + h) * q_rows_ + i];
      }
    }
  }
}

// For each visible (query i, key j): P = exp(scale · q·k - lse_i), dV_j += P dO_i,
// dS = P (dO_i · v_j - δ_i), dQ_i += scale dS k_j, dK_j += scale dS q_i.
void AttentionGrad::backward(const float* k, const float* v, int64_t kv_rows,
                             const std::vector<SeqSpan>& kv_spans, float* dk, float* dv) {
  if (kv_rows == 0) return;
  const int64_t group = hq_ / hkv_, d = d_;
  for (int64_t b = 0; b < b_; ++b) {
    for (const SeqSpan& qs : q_spans_) {
      for (int64_t i = 0; i < qs.count; ++i) {
        const int64_t p = qs.pos + i;
        for (int64_t h = 0; h < hq_; ++h) {
          const int64_t row = (b * q_rows_ + qs.row + i) * hq_ + h;
          const float* qr = q_.data() + row * d;
          const float* dor = do_.data() + row * d;
          float* dqr = dq_.data() + row * d;
          const float lse = lse_[row], delta = delta_[row];
          const int64_t kvh = h / group;
          for (const SeqSpan& ks : kv_spans) {
            const int64_t vis = visible_keys(causal_, ks, p);
            for (int64_t j = 0; j < vis; ++j) {
              const int64_t kv_row = ((b * kv_rows + ks.row + j) * hkv_ + kvh) * d;
              const float* kr = k + kv_row;
              const float* vr = v + kv_row;
              float s = 0.f, dp = 0.f;
              for (int64_t x = 0; x < d; ++x) {
                s += qr[x] * kr[x];
                dp += dor[x] * vr[x];
              }
              const float prob = std::exp(s * scale_ - lse);
              const float ds = prob * (dp - delta) * scale_;
              float* dkr = dk + kv_row;
              float* dvr = dv + kv_row;
              for (int64_t x = 0; x < d; ++x) {
                dqr[x] += ds * kr[x];
                dkr[x] += ds * qr[x];
                dvr[x] += prob * dor[x];
              }
            }
          }
        }
      }
    }
  }
}

void AttentionGrad::finish(DType t, void* dq) const {
  from_f32(t, dq_.data(), static_cast<int64_t>(dq_.size()), dq);
}

}  // namespace detail

void attention(DType t, const AttentionLocalShape& s, const void* q, const void* k, const void* v, void* o,
               float* lse) {
  constexpr const char* kOp = "attention";
  detail::require_attention(kOp, t, s.batch, s.q_heads, s.kv_heads, s.head_dim, s.scale);
  detail::require_nonneg(s.q_len, kOp, "q_len");
  detail::require_nonneg(s.kv_len, kOp, "kv_len");
  const int64_t q_elems = s.batch * s.q_len * s.q_heads * s.head_dim;
  const int64_t kv_elems = s.batch * s.kv_len * s.kv_heads * s.head_dim;
  detail::require_data(q, q_elems, kOp, "q");
  detail::require_data(k, kv_elems, kOp, "k");
  detail::require_data(v, kv_elems, kOp, "v");
  detail::require_data(o, q_elems, kOp, "o");
  // Top-left alignment: query i and key j sit at positions i and j.
  detail::OnlineSoftmax st(s.batch, s.q_heads, s.kv_heads, s.head_dim, s.causal, s.scale,
                           detail::to_f32(t, q, q_elems), s.q_len, {{0, 0, s.q_len}});
  st.attend(detail::to_f32(t, k, kv_elems).data(), detail::to_f32(t, v, kv_elems).data(), s.kv_len,
            {{0, 0, s.kv_len}});
  st.finish(t, o, lse);
}

void attention_backward(DType t, const AttentionLocalShape& s, const void* q, const void* k, const void* v,
                        const void* o, const float* lse, const void* d_o, void* dq, void* dk, void* dv) {
  constexpr const char* kOp = "attentionBackward";
  detail::require_attention(kOp, t, s.batch, s.q_heads, s.kv_heads, s.head_dim, s.scale);
  detail::require_nonneg(s.q_len, kOp, "q_len");
  detail::require_nonneg(s.kv_len, kOp, "kv_len");
  const int64_t q_elems = s.batch * s.q_len * s.q_heads * s.head_dim;
  const int64_t kv_elems = s.batch * s.kv_len * s.kv_heads * s.head_dim;
  detail::require_data(q, q_elems, kOp, "q");
  detail::require_data(k, kv_elems, kOp, "k");
  detail::require_data(v, kv_elems, kOp, "v");
  detail::require_data(o, q_elems, kOp, "o");
  FC_REQUIRE(lse != nullptr || s.batch * s.q_heads * s.q_len == 0,
             std::string(kOp) + ": lse (the forward's log-sum-exp, fp32) is required");
  detail::require_data(d_o, q_elems, kOp, "d_o");
  detail::require_data(dq, q_elems, kOp, "dq");
  detail::require_data(dk, kv_elems, kOp, "dk");
  detail::require_data(dv, kv_elems, kOp, "dv");
  // Top-left alignment, as the forward.
  detail::AttentionGrad g(s.batch, s.q_heads, s.kv_heads, s.head_dim, s.causal, s.scale, t, q, o, lse, d_o,
                          s.q_len, {{0, 0, s.q_len}});
  std::vector<float> dkf(static_cast<size_t>(kv_elems), 0.f), dvf(static_cast<size_t>(kv_elems), 0.f);
  g.backward(detail::to_f32(t, k, kv_elems).data(), detail::to_f32(t, v, kv_elems).data(), s.kv_len,
             {{0, 0, s.kv_len}}, dkf.data(), dvf.data());
  g.finish(t, dq);
  detail::from_f32(t, dkf.data(), kv_elems, dk);
  detail::from_f32(t, dvf.data(), kv_elems, dv);
}

}  // namespace fusedcomm::host
