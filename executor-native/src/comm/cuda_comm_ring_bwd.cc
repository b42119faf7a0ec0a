// CudaComm's ring attention backward on the GPU (one host): the forward's ring
// (CudaComm::ring_attention_gpu) run backwards over the same K/V blocks, with each block's fp32
// dK/dV partial travelling with it. kernels/attention/ring.h has the protocol and its ordering.
#include <cstdint>
#include <string>

#include "fusedcomm/comm/cuda_comm.h"
#include "fusedcomm/runtime/device_attention.h"
#include "fusedcomm/runtime/errors.h"
#include "kernels/attention/attention_bwd.h"
#include "kernels/attention/ring.h"
#include "local_collectives.h"

namespace fusedcomm {
namespace {

namespace k = kernels;

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

uint64_t round256(uint64_t bytes) { return (bytes + 255) / 256 * 256; }

}  // namespace

// A stream-ordered pipeline, not one persistent kernel: per step, the backward launches of the
// visible chunk pairs (kAdd into fp32 accumulators) on the op's stream, and on the ring's side
// stream the copy-engine pulls of the next K/V block and of its dK/dV partial, gated by the
// ring's one-thread sync kernels (bounded waits naming the neighbour) and by events. No host
// round trip between steps.
// Memory: symmetric, per rank, kv[0], kv[1] (bf16 [K; V] of the largest block) and g[0], g[1]
// (fp32 [dK; dV] of it); the communicator's workspace: dQ's fp32 accumulator and δ.
// dQ stays on its rank (added up over the W steps, rounded once at the end). A block's dK/dV
// partial starts zeroed at its owner, gathers every rank's contribution on its way around and,
// after the last rank's step W - 1, sits in the owner's predecessor's g[(W - 1) & 1], from which
// the owner rounds it into dk, dv directly (peer memory: one read, no extra copy).
void CudaComm::ring_attention_backward_gpu(const OpDesc&, DType dtype, const RingAttentionShape& shape,
                                           const void* q, const void* k, const void* v, const void* o,
                                           const float* lse, const void* d_o, void* dq, void* dk, void* dv,
                                           cudaStream_t stream) {
  constexpr const char* kOp = "ringAttentionBackward";
  FC_REQUIRE(dtype == DType::kBF16, std::string(kOp) + " on the cuda backend takes bf16 tensors");
  require_ring_attention_shape(shape);
  const int world = sm_->world(), rank = sm_->rank();
  const int64_t B = shape.batch, Hq = shape.q_heads, Hkv = shape.kv_heads, D = shape.head_dim;
  const int64_t s_r = ring_block_rows(shape, world, rank);
  if (B > 0 && s_r > 0) {
    for (const void* p : {q, o, d_o, static_cast<const void*>(dq), static_cast<const void*>(dk),
                          static_cast<const void*>(dv), k, v}) {
      FC_REQUIRE(p != nullptr, std::string(kOp) + ": q, k, v, o, d_o, dq, dk and dv must not be null");
    }
    for (const void* p : {q, o, d_o, static_cast<const void*>(dq), static_cast<const void*>(dk),
                          static_cast<const void*>(dv)}) {
      FC_REQUIRE(aligned16(p), std::string(kOp) + ": q, o, d_o, dq, dk and dv must be 16-byte aligned");
    }
    FC_REQUIRE(lse != nullptr && reinterpret_cast<uintptr_t>(lse) % 4 == 0,
               std::string(kOp) + ": lse (the forward's, fp32) is required and must be 4-byte aligned");
  }
  if (hosts_ != nullptr) {
    ring_attention_backward_hosts(shape, q, k, v, o, lse, d_o, dq, dk, dv, stream);
    return;
  }
  // Symmetric memory: [kv[0]][kv[1]][g[0]][g[1]], at the same offsets on every rank.
  const int64_t kv_elems = ring_kv_slot_elems(shape, world);  // 2 · B · max rows · Hkv · D
  const uint64_t kv_slot = round256(static_cast<uint64_t>(kv_elems) * 2);
  const uint64_t g_slot = round256(static_cast<uint64_t>(kv_elems) * 4);
  require_fits(kOp, 2 * kv_slot + 2 * g_slot);
  const uint64_t dq_bytes = round256(static_cast<uint64_t>(B * s_r * Hq * D) * 4);
  const uint64_t delta_bytes = round256(static_cast<uint64_t>(B * Hq * s_r) * 4);
  cudaStream_t s = begin(stream);
  char* work = static_cast<char*>(workspace(dq_bytes + delta_bytes + 256));
  float* dq_acc = reinterpret_cast<float*>(work);
  float* delta = reinterpret_cast<float*>(work + dq_bytes);
  const k::CommDevice& dev = sm_->device();
  const int pred = (rank + world - 1) % world;
  auto kv_buf = [&](int owner, int i) {
    return static_cast<char*>(static_cast<void*>(dev.base[owner])) + dev.data_offset + i * kv_slot;
  };
  auto g_buf = [&](int owner, int i) { return kv_buf(owner, 0) + 2 * kv_slot + i * g_slot; };
  // Elements of block p's K (its V follows), in the K/V and in the partials' buffers.
  auto block_elems = [&](int p) { return B * ring_block_rows(shape, world, p) * Hkv * D; };
  auto launch_failed = [&](cudaError_t e, const char* what) {
    if (e != cudaSuccess) check_cuda(e, std::string(kOp) + ": " + what);
  };
  auto dkdv_out = [&](const float* src, cudaStream_t st) {  // owner's finished partial -> dk, dv
    enqueue_dkdv_round(src, dk, dv, B, s_r, Hkv, D, kOp, st);
  };
  auto step_on = [&](int step, const char* kv, float* g, cudaStream_t st) {
    const int owner = (rank - step + world) % world;
    const int64_t n = block_elems(owner);
    enqueue_ring_bwd_step(shape, world, rank, step, q, kv, kv + n * 2, lse, delta, d_o, dq_acc, g, g + n, st);
  };
  // δ once over this rank's rows; dQ's accumulator zeroed.
  if (B > 0 && s_r > 0) {
    launch_failed(cudaMemsetAsync(dq_acc, 0, static_cast<size_t>(B * s_r * Hq * D) * 4, s), "zeroing dQ");
    launch_failed(k::launch_attention_bwd_delta(k::attn_dense(o, s_r, Hq, D), k::attn_dense(d_o, s_r, Hq, D),
                                                delta, 0, 0, B, s_r, Hq, D, s),
                  "computing delta");
  }
  auto dq_out = [&] {
    launch_failed(k::launch_attention_grad_convert(dq_acc, 0, 0, 0, static_cast<__nv_bfloat16*>(dq), 0, 0, 0,
                                                   B, s_r, Hq, D, s),
                  "rounding dQ");
  };
  const size_t own_bytes = static_cast<size_t>(block_elems(rank)) * 2;
  if (world == 1) {
    if (own_bytes > 0) {
      enqueue_ring_pack(shape, world, rank, k, v, kv_buf(rank, 0), s);
      launch_failed(cudaMemsetAsync(g_buf(rank, 0), 0, own_bytes * 4, s), "zeroing dK/dV");
    }
    step_on(0, kv_buf(rank, 0), reinterpret_cast<float*>(g_buf(rank, 0)), s);
    dkdv_out(reinterpret_cast<const float*>(g_buf(rank, 0)), s);
    dq_out();
    end(s, stream == nullptr);
    return;
  }
  make_ring_streams();
  k::RingSyncArgs sync;
  sync.op = k::kRingBwdOp;
  sync.sig_size = k::comm_sig_hash(static_cast<uint64_t>(B), static_cast<uint64_t>(shape.seq),
                                   (static_cast<uint64_t>(Hq) << 32) | (static_cast<uint64_t>(Hkv) << 12) |
                                       (static_cast<uint64_t>(D) << 2) | (shape.causal ? 2u : 0u) |
                                       (shape.zigzag ? 1u : 0u));
  auto enqueue_sync = [&](uint32_t publish, uint32_t wait_pred, uint32_t wait_succ, bool first, bool last) {
    k::RingSyncArgs a = sync;
    a.publish = publish;
    a.wait_pred = wait_pred;
    a.wait_succ = wait_succ;
    a.begin = first;
    a.finish = last;
    launch_failed(k::launch_ring_sync(dev, a, ring_side_), "launching the ring's sync kernel");
  };
  // Tags (ring.h): K(0) = 1, K(s) = 2s, G(s) = 2s + 3, F = 2W + 2.
  auto tag_k = [](int st) { return static_cast<uint32_t>(st == 0 ? 1 : 2 * st); };
  auto tag_g = [](int st) { return static_cast<uint32_t>(2 * st + 3); };
  const uint32_t tag_f = static_cast<uint32_t>(2 * world + 2);
  launch_failed(cudaEventRecord(ring_fork_, s), "cudaEventRecord");
  launch_failed(cudaStreamWaitEvent(ring_side_, ring_fork_, 0), "cudaStreamWaitEvent");
  enqueue_ring_pack(shape, world, rank, k, v, kv_buf(rank, 0), ring_side_);
  if (own_bytes > 0) {
    launch_failed(cudaMemsetAsync(g_buf(rank, 0), 0, own_bytes * 4, ring_side_), "zeroing dK/dV");
  }
  launch_failed(cudaEventRecord(ring_packed_, ring_side_), "cudaEventRecord");
  launch_failed(cudaStreamWaitEvent(s, ring_packed_, 0), "cudaStreamWaitEvent");
  enqueue_sync(tag_k(0), 0, 0, true, false);
  for (int step = 0; step < world; ++step) {
    const int owner = (rank - step + world) % world;
    if (step > 0)
      launch_failed(cudaStreamWaitEvent(s, ring_grads_pulled_[step - 1], 0), "cudaStreamWaitEvent");
    step_on(step, kv_buf(rank, step & 1), reinterpret_cast<float*>(g_buf(rank, step & 1)), s);
    launch_failed(cudaEventRecord(ring_computed_[step], s), "cudaEventRecord");
    if (step + 1 == world) break;
    // Side stream, for step + 1: pred's block of its step `step` (owner - 1) and its partial.
    const size_t bytes = static_cast<size_t>(block_elems((owner - 1 + world) % world)) * 2;
    enqueue_sync(0, tag_k(step), step >= 1 ? tag_k(step) : 0, false, false);
    if (step > 0) {
      launch_failed(cudaStreamWaitEvent(ring_side_, ring_computed_[step - 1], 0), "cudaStreamWaitEvent");
    }
    if (bytes > 0) {
      launch_failed(cudaMemcpyAsync(kv_buf(rank, (step + 1) & 1), kv_buf(pred, step & 1), 2 * bytes,
                                    cudaMemcpyDeviceToDevice, ring_side_),
                    "copying a K/V block from the predecessor");
    }
    enqueue_sync(tag_k(step + 1), 0, 0, false, false);
    launch_failed(cudaStreamWaitEvent(ring_side_, ring_computed_[step], 0), "cudaStreamWaitEvent");
    enqueue_sync(tag_g(step), tag_g(step), tag_g(step), false, false);
    if (bytes > 0) {
      launch_failed(cudaMemcpyAsync(g_buf(rank, (step + 1) & 1), g_buf(pred, step & 1), 4 * bytes,
                                    cudaMemcpyDeviceToDevice, ring_side_),
                    "copying a dK/dV partial from the predecessor");
    }
    launch_failed(cudaEventRecord(ring_grads_pulled_[step], ring_side_), "cudaEventRecord");
  }
  dq_out();
  // This rank's finished partial, in pred's g[(W - 1) & 1] after pred's last step.
  launch_failed(cudaStreamWaitEvent(ring_side_, ring_computed_[world - 1], 0), "cudaStreamWaitEvent");
  enqueue_sync(tag_g(world - 1), tag_g(world - 1), 0, false, false);
  dkdv_out(reinterpret_cast<const float*>(g_buf(pred, (world - 1) & 1)), ring_side_);
  enqueue_sync(tag_f, 0, tag_f, false, true);
  launch_failed(cudaEventRecord(ring_join_, ring_side_), "cudaEventRecord");
  launch_failed(cudaStreamWaitEvent(s, ring_join_, 0), "cudaStreamWaitEvent");
  end(s, stream == nullptr);
}

}  // namespace fusedcomm
