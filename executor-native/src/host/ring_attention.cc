// Ring attention on the host: each rank keeps its query rows and passes K/V blocks around the
// ring (rank r sends to r+1, receives from r-1), W-1 steps, merging each block into its online
// softmax (attention.cc) with causal masking by global position.
//
// Wire format of one ring step, the K/V block of the positions rank `o` holds
// (seq_runs(seq, W, o, layout), n_o positions, its runs in order):
// [K: B × n_o × Hkv × D][V: B × n_o × Hkv × D], dtype t.
#include <cstring>

#include "detail.h"
#include "fusedcomm/runtime/split.h"

namespace fusedcomm::host {

void ring_attention(Exchanger& ex, DType t, const AttentionShape& shape, const void* q, const void* k,
                    const void* v, void* o, float* lse) {
  constexpr const char* kOp = "ringAttention";
  const int world = ex.world(), r = ex.rank();
  detail::require_attention(kOp, t, shape.batch, shape.q_heads, shape.kv_heads, shape.head_dim, shape.scale);
  detail::require_nonneg(shape.seq, kOp, "seq");
  FC_REQUIRE(
      shape.layout == SeqLayout::kContiguous || shape.layout == SeqLayout::kZigzag,
      std::string(kOp) + ": unknown sequence layout " + std::to_string(static_cast<int>(shape.layout)));

  const int64_t b = shape.batch, hq = shape.q_heads, hkv = shape.kv_heads, d = shape.head_dim;
  const auto rows_of = [&](int rank) { return seq_runs(shape.seq, world, rank, shape.layout).total(); };
  const int64_t q_rows = rows_of(r);
  detail::require_data(q, b * q_rows * hq * d, kOp, "q");
  detail::require_data(k, b * q_rows * hkv * d, kOp, "k");
  detail::require_data(v, b * q_rows * hkv * d, kOp, "v");
  detail::require_data(o, b * q_rows * hq * d, kOp, "o");
  const int64_t esize = dtype_size(t);
  const auto kv_elems = [&](int owner) { return b * rows_of(owner) * hkv * d; };

  detail::OnlineSoftmax st(b, hq, hkv, d, shape.causal, shape.scale,
                           detail::to_f32(t, q, b * q_rows * hq * d), q_rows,
                           detail::seq_spans(shape.seq, world, r, shape.layout));

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
    const int64_t elems = kv_elems(owner);
    if (elems > 0 && q_rows > 0) {
      kf.resize(elems);
      vf.resize(elems);
      detail::to_f32(t, held.data(), elems, kf.data());
      detail::to_f32(t, held.data() + elems * esize, elems, vf.data());
      st.attend(kf.data(), vf.data(), rows_of(owner),
                detail::seq_spans(shape.seq, world, owner, shape.layout));
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
  st.finish(t, o, lse);
}

}  // namespace fusedcomm::host
