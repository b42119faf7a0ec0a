// Ring attention on the host: each rank keeps its query rows and passes K/V blocks around the
// ring (rank r sends to r+1, receives from r-1), W-1 steps, merging each block into its online
// softmax (attention.cc) with causal masking by global position.
//
// Wire format of one ring step, the K/V block of the positions rank `o` holds
// (seq_runs(seq, W, o, layout), n_o positions, its runs in order):
// [K: B × n_o × Hkv × D][V: B × n_o × Hkv × D], dtype t. The backward's block adds the fp32
// partials [dK][dV] of the same shape after them.
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

// The backward: the block in hand is [K][V] in dtype t, then its fp32 partials [dK][dV]
// (B × n_o × Hkv × D each); after step s it is rank (r - s)'s. Each step adds this rank's
// queries' share to the partials and passes the whole block on; after the last step the block
// in hand is rank (r + 1)'s, and one more hop sends only its partials to it, so every rank gets
// its own block's complete dK/dV from its predecessor.
void ring_attention_backward(Exchanger& ex, DType t, const AttentionShape& shape, const void* q,
                             const void* k, const void* v, const void* o, const float* lse, const void* d_o,
                             void* dq, void* dk, void* dv) {
  constexpr const char* kOp = "ringAttentionBackward";
  const int world = ex.world(), r = ex.rank();
  detail::require_attention(kOp, t, shape.batch, shape.q_heads, shape.kv_heads, shape.head_dim, shape.scale);
  detail::require_nonneg(shape.seq, kOp, "seq");
  FC_REQUIRE(
      shape.layout == SeqLayout::kContiguous || shape.layout == SeqLayout::kZigzag,
      std::string(kOp) + ": unknown sequence layout " + std::to_string(static_cast<int>(shape.layout)));

  const int64_t b = shape.batch, hq = shape.q_heads, hkv = shape.kv_heads, d = shape.head_dim;
  const auto rows_of = [&](int rank) { return seq_runs(shape.seq, world, rank, shape.layout).total(); };
  const int64_t q_rows = rows_of(r);
  const int64_t q_elems = b * q_rows * hq * d, own = b * q_rows * hkv * d;
  detail::require_data(q, q_elems, kOp, "q");
  detail::require_data(k, own, kOp, "k");
  detail::require_data(v, own, kOp, "v");
  detail::require_data(o, q_elems, kOp, "o");
  FC_REQUIRE(lse != nullptr || b * hq * q_rows == 0,
             std::string(kOp) + ": lse (the forward's log-sum-exp, fp32) is required");
  detail::require_data(d_o, q_elems, kOp, "d_o");
  detail::require_data(dq, q_elems, kOp, "dq");
  detail::require_data(dk, own, kOp, "dk");
  detail::require_data(dv, own, kOp, "dv");
  const int64_t esize = dtype_size(t), fsize = sizeof(float);
  const auto kv_elems = [&](int owner) { return b * rows_of(owner) * hkv * d; };
  const auto block_bytes = [&](int owner) {
    return static_cast<size_t>(2 * kv_elems(owner) * (esize + fsize));
  };

  detail::AttentionGrad g(b, hq, hkv, d, shape.causal, shape.scale, t, q, o, lse, d_o, q_rows,
                          detail::seq_spans(shape.seq, world, r, shape.layout));

  std::vector<uint8_t> held(block_bytes(r), 0), incoming;
  if (own) {
    std::memcpy(held.data(), k, own * esize);
    std::memcpy(held.data() + own * esize, v, own * esize);
  }
  const int next = (r + 1) % world, prev = (r - 1 + world) % world;
  std::vector<float> kf, vf, dkf, dvf;
  for (int step = 0; step < world; ++step) {
    const int owner = (r - step + world) % world;
    const int64_t elems = kv_elems(owner);
    if (elems > 0 && q_rows > 0) {
      kf.resize(elems);
      vf.resize(elems);
      dkf.resize(elems);
      dvf.resize(elems);
      uint8_t* grads = held.data() + 2 * elems * esize;
      detail::to_f32(t, held.data(), elems, kf.data());
      detail::to_f32(t, held.data() + elems * esize, elems, vf.data());
      std::memcpy(dkf.data(), grads, elems * fsize);
      std::memcpy(dvf.data(), grads + elems * fsize, elems * fsize);
      g.backward(kf.data(), vf.data(), rows_of(owner),
                 detail::seq_spans(shape.seq, world, owner, shape.layout), dkf.data(), dvf.data());
      std::memcpy(grads, dkf.data(), elems * fsize);
      std::memcpy(grads + elems * fsize, dvf.data(), elems * fsize);
    }
    if (world == 1) break;
    std::vector<SendBlock> send(world);
    std::vector<RecvBlock> recv(world);
    if (step < world - 1) {
      incoming.resize(block_bytes((owner - 1 + world) % world));
      send[next] = {held.data(), held.size()};
      recv[prev] = {incoming.data(), incoming.size()};
      ex.exchange(send, recv, "ringAttentionBackward/kv-step");
    } else {
      // The partials of rank next's block go home; this rank's own arrive from prev.
      const size_t kv_bytes = static_cast<size_t>(2 * elems * esize);
      incoming.resize(static_cast<size_t>(2 * own * fsize));
      send[next] = {held.data() + kv_bytes, held.size() - kv_bytes};
      recv[prev] = {incoming.data(), incoming.size()};
      ex.exchange(send, recv, "ringAttentionBackward/dkv-home");
      held.swap(incoming);
      break;
    }
    held.swap(incoming);
  }
  // held: this rank's own dK/dV (fp32), complete over every rank's queries.
  const uint8_t* grads = world == 1 ? held.data() + 2 * own * esize : held.data();
  dkf.resize(own);
  dvf.resize(own);
  if (own) {
    std::memcpy(dkf.data(), grads, own * fsize);
    std::memcpy(dvf.data(), grads + own * fsize, own * fsize);
  }
  g.finish(t, dq);
  detail::from_f32(t, dkf.data(), own, dk);
  detail::from_f32(t, dvf.data(), own, dv);
}

}  // namespace fusedcomm::host
