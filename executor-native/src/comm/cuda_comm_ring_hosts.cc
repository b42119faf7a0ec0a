// CudaComm's ring attention, forward and backward, when the ranks are on several hosts: the
// decomposed form (docs/ops.md "Across hosts"). Every rank's K/V block travels to every rank
// through the hierarchical allGather (NVLink inside a host, the GPU-driven proxy and transport
// between hosts, cross_host_paths.h); each rank then runs the ring's own per-step launches
// (enqueue_ring_step / enqueue_ring_bwd_step) over the gathered blocks in ring order, so that
// the merge order, and with it o and lse, is the one-host ring's. The backward adds this rank's
// dK/dV contributions to every block's fp32 partial and a hierarchical reduceScatter brings each
// owner the sum of its block's partials, rounded once.
// Memory per rank: every rank's K/V block (W slots of the largest block) and, for the backward,
// W fp32 partials, all in the communicator's workspace; the collectives' staging in the data
// area. Stream-ordered on the op's stream, every wait the collectives' bounded ones.
#include <algorithm>
#include <cstdint>
#include <string>

#include "cross_host_paths.h"
#include "fusedcomm/comm/cuda_comm.h"
#include "fusedcomm/runtime/device_attention.h"
#include "fusedcomm/runtime/errors.h"
#include "kernels/attention/attention_bwd.h"

namespace fusedcomm {
namespace {

namespace k = kernels;

uint64_t round256(uint64_t bytes) { return (bytes + 255) / 256 * 256; }

// Where one rank's K/V block sits in the gathered buffer: slot p, K of its rows, then V.
struct GatheredBlocks {
  const RingAttentionShape& shape;
  int world;
  int64_t slot;  // elements per slot (ring_kv_slot_elems)

  int64_t k_elems(int p) const {
    return shape.batch * ring_block_rows(shape, world, p) * shape.kv_heads * shape.head_dim;
  }
};

}  // namespace

void CudaComm::ring_attention_hosts(const RingAttentionShape& shape, const void* q, const void* k,
                                    const void* v, void* o, float* lse, cudaStream_t stream) {
  constexpr const char* kOp = "ringAttention";
  const int world = layout_.world(), rank = layout_.rank();
  const GatheredBlocks g{shape, world, ring_kv_slot_elems(shape, world)};
  const int64_t s_r = ring_block_rows(shape, world, rank);
  const int64_t count = g.slot * world;
  const CrossHostPaths::Needs need = hosts_->collective_needs(k::CommOp::kAllGather, 2, count);
  require_fits(kOp, need.data_bytes);
  const uint64_t coll = round256(need.work_bytes), own = round256(static_cast<uint64_t>(g.slot) * 2),
                 gathered_bytes = round256(static_cast<uint64_t>(count) * 2),
                 acc =
                     round256(static_cast<uint64_t>(shape.batch * s_r * shape.q_heads * shape.head_dim) * 4),
                 lse_bytes = round256(static_cast<uint64_t>(shape.batch * shape.q_heads * s_r) * 4);
  cudaStream_t s = begin(stream);
  // Workspace: [collective][own packed block][gathered blocks][o_acc fp32][lse stand-in fp32].
  char* work = static_cast<char*>(workspace(coll + own + gathered_bytes + acc + lse_bytes));
  char* packed = work + coll;
  char* gathered = packed + own;
  float* o_acc = reinterpret_cast<float*>(gathered + gathered_bytes);
  float* lse_tmp = reinterpret_cast<float*>(gathered + gathered_bytes + acc);
  if (count > 0) {
    enqueue_ring_pack(shape, world, rank, k, v, packed, s);
    hosts_->enqueue_collective(k::CommOp::kAllGather, k::CommDtype::kBF16, packed,
                               static_cast<uint64_t>(g.k_elems(rank)) * 4, gathered, count, work, s);
  }
  for (int step = 0; step < world; ++step) {
    const int owner = (rank - step + world) % world;
    const char* kb = gathered + static_cast<uint64_t>(owner) * g.slot * 2;
    enqueue_ring_step(shape, world, rank, step, q, kb, kb + g.k_elems(owner) * 2, o, lse, o_acc, lse_tmp, s);
  }
  end(s, stream == nullptr);
}

void CudaComm::ring_attention_backward_hosts(const RingAttentionShape& shape, const void* q, const void* k,
                                             const void* v, const void* o, const float* lse, const void* d_o,
                                             void* dq, void* dk, void* dv, cudaStream_t stream) {
  constexpr const char* kOp = "ringAttentionBackward";
  const int world = layout_.world(), rank = layout_.rank();
  const GatheredBlocks g{shape, world, ring_kv_slot_elems(shape, world)};
  const int64_t B = shape.batch, Hq = shape.q_heads, Hkv = shape.kv_heads, D = shape.head_dim;
  const int64_t s_r = ring_block_rows(shape, world, rank);
  const int64_t count = g.slot * world;
  const CrossHostPaths::Needs gather = hosts_->collective_needs(k::CommOp::kAllGather, 2, count);
  const CrossHostPaths::Needs scatter = hosts_->collective_needs(k::CommOp::kReduceScatter, 4, count);
  require_fits(kOp, std::max(gather.data_bytes, scatter.data_bytes));
  const uint64_t coll = round256(std::max(gather.work_bytes, scatter.work_bytes)),
                 own = round256(static_cast<uint64_t>(g.slot) * 2),
                 gathered_bytes = round256(static_cast<uint64_t>(count) * 2),
                 partials = round256(static_cast<uint64_t>(count) * 4),
                 summed = round256(static_cast<uint64_t>(g.slot) * 4),
                 dq_bytes = round256(static_cast<uint64_t>(B * s_r * Hq * D) * 4),
                 delta_bytes = round256(static_cast<uint64_t>(B * Hq * s_r) * 4);
  cudaStream_t s = begin(stream);
  // Workspace: [collective][own packed block][gathered blocks][every block's fp32 dK/dV partial]
  // [this rank's summed partial][dQ fp32][δ].
  char* work =
      static_cast<char*>(workspace(coll + own + gathered_bytes + partials + summed + dq_bytes + delta_bytes));
  char* packed = work + coll;
  char* gathered = packed + own;
  float* part = reinterpret_cast<float*>(gathered + gathered_bytes);
  float* mine = reinterpret_cast<float*>(reinterpret_cast<char*>(part) + partials);
  float* dq_acc = reinterpret_cast<float*>(reinterpret_cast<char*>(mine) + summed);
  float* delta = reinterpret_cast<float*>(reinterpret_cast<char*>(dq_acc) + dq_bytes);
  auto launch_failed = [&](cudaError_t e, const char* what) {
    if (e != cudaSuccess) check_cuda(e, std::string(kOp) + ": " + what);
  };
  if (count == 0) {  // no batch on any rank: nothing to compute or move
    end(s, stream == nullptr);
    return;
  }
  enqueue_ring_pack(shape, world, rank, k, v, packed, s);
  hosts_->enqueue_collective(k::CommOp::kAllGather, k::CommDtype::kBF16, packed,
                             static_cast<uint64_t>(g.k_elems(rank)) * 4, gathered, count, work, s);
  launch_failed(cudaMemsetAsync(part, 0, static_cast<size_t>(count) * 4, s), "zeroing the dK/dV partials");
  if (s_r > 0) {
    launch_failed(cudaMemsetAsync(dq_acc, 0, static_cast<size_t>(B * s_r * Hq * D) * 4, s), "zeroing dQ");
    launch_failed(k::launch_attention_bwd_delta(k::attn_dense(o, s_r, Hq, D), k::attn_dense(d_o, s_r, Hq, D),
                                                delta, 0, 0, B, s_r, Hq, D, s),
                  "computing delta");
  }
  for (int step = 0; step < world; ++step) {
    const int owner = (rank - step + world) % world;
    const int64_t n = g.k_elems(owner);
    const char* kb = gathered + static_cast<uint64_t>(owner) * g.slot * 2;
    float* gp = part + static_cast<uint64_t>(owner) * g.slot;
    enqueue_ring_bwd_step(shape, world, rank, step, q, kb, kb + n * 2, lse, delta, d_o, dq_acc, gp, gp + n,
                          s);
  }
  // Slot p of `part` holds this rank's contribution to block p's dK/dV: the sum of slot `rank`
  // over every rank is this rank's gradient.
  hosts_->enqueue_collective(k::CommOp::kReduceScatter, k::CommDtype::kF32, part, UINT64_MAX, mine, count,
                             work, s);
  if (s_r > 0) {
    launch_failed(k::launch_attention_grad_convert(dq_acc, 0, 0, 0, static_cast<__nv_bfloat16*>(dq), 0, 0, 0,
                                                   B, s_r, Hq, D, s),
                  "rounding dQ");
    enqueue_dkdv_round(mine, dk, dv, B, s_r, Hkv, D, kOp, s);
  }
  end(s, stream == nullptr);
}

}  // namespace fusedcomm
