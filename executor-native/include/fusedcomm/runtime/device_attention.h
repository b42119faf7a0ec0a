// Attention on the GPU through the kernels library's flash-attention forward
// (kernels/attention/attention.h): the single-GPU op (fc_attention's cuda backend, docs/ops.md
// "attention") with the caller's argument checks, and the pieces of CudaComm's ring attention.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <vector>

#include "fusedcomm/fusedcomm.h"
#include "fusedcomm/runtime/split.h"
#include "fusedcomm/types.h"
#include "kernels/attention/ring_fwd.h"

namespace fusedcomm {

// o = attention(q, k, v) on the calling thread's current GPU, enqueued on `stream` (nullptr: the
// legacy stream, and the call returns after the kernel finished). Dense tensors as
// fc_attention_local_t says: q, o (B, q_len, Hq, D), k, v (B, kv_len, Hkv, D), bf16; lse
// (B, Hq, q_len) fp32 natural-log, or null. Causal: top-left aligned (query i sees keys j <= i).
// Error(kInvalidArgument) for a shape, dtype or pointer the kernel does not take (bf16 only,
// head_dim 64 or 128, Hq a multiple of Hkv, 16-byte aligned device pointers); Error(kFatalGpu)
// when the launch (or, synchronous, the kernel) fails.
void cuda_attention_local(const fc_attention_local_t& shape, DType dtype, const void* q, const void* k,
                          const void* v, void* o, float* lse, cudaStream_t stream);

// The checks both single-GPU entries make of their shape and dtype (bf16, extents >= 0, head_dim
// 64 or 128, Hq a positive multiple of Hkv, a finite scale >= 0), with `op` naming the op in the
// message; returns the shape as messages print it.
std::string require_cuda_attention_shape(const char* op, const fc_attention_local_t& shape, DType dtype);

// dq, dk, dv = the backward of o = attention(q, k, v) (fc_attention_backward's cuda backend,
// docs/ops.md "attentionBackward"), on the calling thread's current GPU, enqueued on `stream`
// (nullptr: the legacy stream, and the call returns after the kernels finished). Dense tensors
// as cuda_attention_local, plus o and d_o (as q), lse (the forward's, required) and dq (as q),
// dk, dv (as k, v; summed over the query heads sharing a K/V head); bf16, fp32 accumulation,
// rounded once. The workspace (δ and an fp32 dQ accumulator) is stream-ordered from a per-device
// pool.
// Errors as cuda_attention_local.
void cuda_attention_backward_local(const fc_attention_local_t& shape, DType dtype, const void* q,
                                   const void* k, const void* v, const void* o, const float* lse,
                                   const void* d_o, void* dq, void* dk, void* dv, cudaStream_t stream);

}  // namespace fusedcomm

namespace fusedcomm {

namespace host {
struct AttentionShape;
}

// ---- ring attention on the GPU (CudaComm::ring_attention) ------------------------------------
// Which positions of the sequence a rank holds: the host backend's rule (split.h: seq_runs), one
// run (contiguous) or two (zigzag), in the rank's row order.
SeqRuns attention_seq_chunks(int64_t seq, int world, int rank, bool zigzag);

// The shape of one ring: the whole sequence as fc_attention_shape_t gives it, and the layout.
struct RingAttentionShape {
  int64_t batch = 0, seq = 0, q_heads = 0, kv_heads = 0, head_dim = 0;
  bool causal = false;
  float scale = 0.0f;
  bool zigzag = false;
};

// The ring's shape from the Comm interface's (host_ops.h), its layout included.
RingAttentionShape ring_attention_shape(const host::AttentionShape& s);

// Throws Error(kInvalidArgument) for what the GPU ring does not take (the op name in the
// message); what cuda_attention_local checks, over the ring's shape.
void require_ring_attention_shape(const RingAttentionShape& s);

// Rows of rank p's block (the sum of its chunks' rows).
int64_t ring_block_rows(const RingAttentionShape& s, int world, int p);

// Elements (bf16) of one K/V buffer of the ring: [K; V] of the largest rank's rows.
int64_t ring_kv_slot_elems(const RingAttentionShape& s, int world);

// Packs this rank's k and v (B, S_r, Hkv, D each) into `slot` ([K; V], ring_kv_slot_elems long),
// on `stream`.
void enqueue_ring_pack(const RingAttentionShape& s, int world, int rank, const void* k, const void* v,
                       void* slot, cudaStream_t stream);

// One attention launch of the ring: this rank's query chunk (rows [q_row0, q_row0 + q.count) of
// its block, at global position q.pos) against a key chunk of rank (rank - step) mod W (rows
// [k_row0, k_row0 + key.count) of that rank's k_block_rows-row block; key.count 0: a query chunk
// that sees no key anywhere, o = 0, lse = -inf). acc: 0 none, 1 store, 2 merge
// (kernels::AttnAccum); merge: the pair's index among its query chunk's visible pairs in ring
// order (0 stores); writes_o: the query chunk's last launch, which writes o.
struct RingLaunch {
  int step = 0;
  SeqRun q, key;
  int64_t q_row0 = 0, k_row0 = 0, k_block_rows = 0;
  int acc = 0;
  int merge = 0;
  bool writes_o = false;
};
// The launches of ring step `step` on this rank, in enqueue order (enqueue_ring_step).
std::vector<RingLaunch> ring_step_plan(const RingAttentionShape& s, int world, int rank, int step);

// The attention launches of ring step `step` on this rank: its query chunks against the key
// chunks of rank owner = (rank - step) mod W, whose K and V (B, S_owner, Hkv, D each, dense)
// are at k and v. Each (query chunk, key chunk) pair with a visible key is folded into o_acc
// (B · S_r · Hq · D fp32) and lse by its log-sum-exp (kernels/attention/attention.h
// "Accumulation"): the pair that comes first in ring order (steps 0, 1, ..., W - 1) stores,
// the others merge, and the last one writes o. A query chunk that sees no key at all gets
// o = 0, lse = -inf at step 0. lse_tmp (B · Hq · S_r fp32) stands in for a null lse. Steps must
// be enqueued in order on one stream (or ordered by events).
void enqueue_ring_step(const RingAttentionShape& s, int world, int rank, int step, const void* q,
                       const void* k, const void* v, void* o, float* lse, float* o_acc, float* lse_tmp,
                       cudaStream_t stream);

// The persistent ring kernel's plan (kernels/attention/ring_fwd.h RingFwdArgs): the shape and
// every step's pairs of ring_step_plan, in its order. The caller fills the pointers and steps.
void ring_fwd_plan(const RingAttentionShape& s, int world, int rank, kernels::RingFwdArgs& a);

// ---- ring attention backward on the GPU (CudaComm::ring_attention_backward_gpu) --------------
// The backward launches of ring step `step` on this rank: for every visible (query chunk, key
// chunk) pair of ring_step_plan (a pair without a visible key contributes nothing), one
// kernels::launch_attention_bwd in mode kAdd at the chunks' global positions, with δ ready
// (`delta`, (B, Hq, S_r) fp32, launch_attention_bwd_delta over the rank's rows). q, d_o
// (B, S_r, Hq, D bf16) and lse (B, Hq, S_r) are this rank's; k, v (B, S_owner, Hkv, D bf16
// each) the block of owner = (rank - step) mod W; dq_acc (B, S_r, Hq, D fp32) this rank's dQ
// accumulator; dk_acc, dv_acc (B, S_owner, Hkv, D fp32 each) the owner's dK/dV partial. Steps
// in order on one stream.
void enqueue_ring_bwd_step(const RingAttentionShape& s, int world, int rank, int step, const void* q,
                           const void* k, const void* v, const float* lse, const float* delta,
                           const void* d_o, float* dq_acc, float* dk_acc, float* dv_acc, cudaStream_t stream);

// Rounds a block's finished fp32 dK/dV partial ([dK; dV], rows × Hkv × D each per batch) into
// dk and dv (bf16), on `stream`. Throws Error(kFatalGpu) naming `op` if a launch fails.
void enqueue_dkdv_round(const float* partial, void* dk, void* dv, int64_t batch, int64_t rows,
                        int64_t kv_heads, int64_t head_dim, const char* op, cudaStream_t stream);

}  // namespace fusedcomm
