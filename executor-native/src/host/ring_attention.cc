// Ring attention on the host: each rank keeps its query block and passes K/V blocks around the
// ring (rank r sends to r+1, receives from r-1), W-1 steps, merging each block into a running
// (max, sum, weighted V) per query row: the online softmax, in fp32.
//
// Wire format of one ring step, the K/V block of sequence positions owned by rank `o`,
// n_o = split_count(seq, W, o):  [K: B × n_o × Hkv × D][V: B × n_o × Hkv × D], dtype t.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "detail.h"
#include "fusedcomm/runtime/split.h"

namespace fusedcomm::host {

namespace {

std::string str(int64_t v) { return std::to_string(v); }

// Running online-softmax state of this rank's query rows.
struct SoftmaxState {
  std::vector<float> max;  // (B, S_r, Hq): the largest score seen
  std::vector<float> sum;  // (B, S_r, Hq): sum of exp(score - max)
  std::vector<float> acc;  // (B, S_r, Hq, D): sum of exp(score - max) · v
};

// Merges the keys [key_begin, key_begin + n_keys) (global positions) into the state.
void attend_block(const AttentionShape& s, float scale, const float* q, int64_t q_rows, int64_t q_begin,
                  const float* k, const float* v, int64_t n_keys, int64_t key_begin, SoftmaxState& st,
                  std::vector<float>& scores) {
  const int64_t hq = s.q_heads, hkv = s.kv_heads, d = s.head_dim, group = hq / hkv;
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t i = 0; i < q_rows; ++i) {
      // Causal: query at global position p sees keys at positions <= p.
      const int64_t visible = s.causal ? std::clamp<int64_t>(q_begin + i - key_begin + 1, 0, n_keys) : n_keys;
      if (visible == 0) continue;
      for (int64_t h = 0; h < hq; ++h) {
        const int64_t row = (b * q_rows + i) * hq + h;
        const float* qr = q + row * d;
        const int64_t kvh = h / group;
        float block_max = -std::numeric_limits<float>::infinity();
        for (int64_t j = 0; j < visible; ++j) {
          const float* kr = k + ((b * n_keys + j) * hkv + kvh) * d;
          float dot = 0.f;
          for (int64_t x = 0; x < d; ++x) dot += qr[x] * kr[x];
          scores[j] = dot * scale;
          block_max = std::max(block_max, scores[j]);
        }
        const float old_max = st.max[row];
        const float new_max = std::max(old_max, block_max);
        const float rescale = std::exp(old_max - new_max);  // 0 on the first visible block
        float* acc = st.acc.data() + row * d;
        float sum = st.sum[row] * rescale;
        for (int64_t x = 0; x < d; ++x) acc[x] *= rescale;
        for (int64_t j = 0; j < visible; ++j) {
          const float p = std::exp(scores[j] - new_max);
          const float* vr = v + ((b * n_keys + j) * hkv + kvh) * d;
          sum += p;
          for (int64_t x = 0; x < d; ++x) acc[x] += p * vr[x];
        }
        st.sum[row] = sum;
        st.max[row] = new_max;
      }
    }
  }
}

}  // namespace

void ring_attention(Exchanger& ex, DType t, const AttentionShape& shape, const void* q, const void* k,
                    const void* v, void* o, float* lse) {
  constexpr const char* kOp = "ringAttention";
  const int world = ex.world(), r = ex.rank();
  detail::require_dtype(t, kOp);
  detail::require_nonneg(shape.batch, kOp, "batch");
  detail::require_nonneg(shape.seq, kOp, "seq");
  FC_REQUIRE(shape.head_dim >= 1, std::string(kOp) + ": head_dim = " + str(shape.head_dim) + " must be >= 1");
  FC_REQUIRE(shape.kv_heads >= 1 && shape.q_heads >= 1 && shape.q_heads % shape.kv_heads == 0,
             std::string(kOp) + ": q_heads = " + str(shape.q_heads) +
                 " must be a positive multiple of kv_heads = " + str(shape.kv_heads));
  FC_REQUIRE(std::isfinite(shape.scale),
             std::string(kOp) + ": scale = " + std::to_string(shape.scale) + " must be finite");

  const int64_t b = shape.batch, hq = shape.q_heads, hkv = shape.kv_heads, d = shape.head_dim;
  const int64_t q_rows = split_count(shape.seq, world, r);
  const int64_t q_begin = split_offset(shape.seq, world, r);
  detail::require_data(q, b * q_rows * hq * d, kOp, "q");
  detail::require_data(k, b * q_rows * hkv * d, kOp, "k");
  detail::require_data(v, b * q_rows * hkv * d, kOp, "v");
  detail::require_data(o, b * q_rows * hq * d, kOp, "o");
  const float scale = shape.scale != 0.f ? shape.scale : 1.f / std::sqrt(static_cast<float>(d));
  const int64_t esize = dtype_size(t);
  const auto kv_elems = [&](int owner) { return b * split_count(shape.seq, world, owner) * hkv * d; };

  const std::vector<float> qf = detail::to_f32(t, q, b * q_rows * hq * d);
  SoftmaxState st;
  st.max.assign(b * q_rows * hq, -std::numeric_limits<float>::infinity());
  st.sum.assign(b * q_rows * hq, 0.f);
  st.acc.assign(b * q_rows * hq * d, 0.f);
  std::vector<float> scores(static_cast<size_t>(shape.seq));

  // The block in hand starts as this rank's own K/V; after step s it is rank (r - s)'s.
  const int64_t own = kv_elems(r);
  std::vector<uint8_t> held(static_cast<size_t>(2 * own * esize)), incoming;
  if (own) {
    std::memcpy(held.data(), k, own * esize);
    std::memcpy(held.data() + own * esize, v, own * esize);
  }
  const int next = (r + 1) % world, prev = (r - 1 + world) % world;
  std::vector<float> kf, vf;
  for (int step = 0; step < world; ++step) {
    const int owner = (r - step + world) % world;
    const int64_t n_keys = split_count(shape.seq, world, owner);
    const int64_t key_begin = split_offset(shape.seq, world, owner);
    const bool all_future = shape.causal && key_begin > q_begin + q_rows - 1;
    if (n_keys > 0 && q_rows > 0 && !all_future) {
      const int64_t elems = kv_elems(owner);
      kf.resize(elems);
      vf.resize(elems);
      detail::to_f32(t, held.data(), elems, kf.data());
      detail::to_f32(t, held.data() + elems * esize, elems, vf.data());
      attend_block(shape, scale, qf.data(), q_rows, q_begin, kf.data(), vf.data(), n_keys, key_begin, st,
                   scores);
    }
    if (step == world - 1) break;
    const int incoming_owner = (owner - 1 + world) % world;
    incoming.resize(static_cast<size_t>(2 * kv_elems(incoming_owner) * esize));
    std::vector<SendBlock> send(world);
    std::vector<RecvBlock> recv(world);
    send[next] = {held.data(), held.size()};
    recv[prev] = {incoming.data(), incoming.size()};
    ex.exchange(send, recv, "ringAttention/kv-step");
    held.swap(incoming);
  }

  // O = acc / sum; LSE = max + log(sum). Every query sees at least itself when causal.
  std::vector<float> of(static_cast<size_t>(b * q_rows * hq * d));
  for (int64_t bi = 0; bi < b; ++bi) {
    for (int64_t i = 0; i < q_rows; ++i) {
      for (int64_t h = 0; h < hq; ++h) {
        const int64_t row = (bi * q_rows + i) * hq + h;
        const float sum = st.sum[row];
        for (int64_t x = 0; x < d; ++x) of[row * d + x] = sum > 0.f ? st.acc[row * d + x] / sum : 0.f;
        if (lse != nullptr)
          lse[(bi * hq + h) * q_rows + i] =
              sum > 0.f ? st.max[row] + std::log(sum) : -std::numeric_limits<float>::infinity();
      }
    }
  }
  detail::from_f32(t, of.data(), b * q_rows * hq * d, o);
}

}  // namespace fusedcomm::host
