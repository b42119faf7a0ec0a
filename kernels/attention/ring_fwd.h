// The ring attention forward in one persistent kernel per rank (executor-native's
// CudaComm::ring_attention_gpu among the GPUs of one host).
//
// One launch per ring call and rank: a cooperative grid (one CTA per SM, at most one per work
// item) takes work items from a counter in a fixed order, step-major:
//   for s = 0 .. W-1:  [pull(s + 1): the block of step s + 1 from pred's buffer, in chunks]
//                      [tiles(s): every (pair, query tile, head, batch) of step s's pairs]
// A pull chunk is copied by one CTA's consumer threads (16-byte loads from the peer's memory,
// stores into this rank's buffer); a tile is the flash-attention forward of one query tile
// against one pair's key chunk (detail/flash_fwd.cuh's producer and consumer parts, the K/V
// ring carried from tile to tile), its (o, lse) folded into the running fp32 (o_acc, lse) as
// attention.h's accumulation modes do.
// Waits (each bounded, comm_protocol.cuh's; the one thread of a CTA that takes the next item):
//   pull(s):    pred >= tag(s) and succ >= tag(s) (ring.h's flags and tags: pred's buffer holds
//               the block, succ has pulled what it needed from the buffer about to be
//               overwritten), (s >= 2) every tile of step s - 2 done on this rank (they read
//               that buffer), and this rank's tag(s) published (tags go out in order: a reader
//               of tag(s + 1) takes every earlier pull as done). The chunk that completes
//               pull(s) publishes tag(s + 1) to pred and succ. Every step has at least one
//               chunk (an empty block still publishes).
//   tiles(s):   (s >= 1) every chunk of pull(s) done.
//   merge:      a tile whose pair is not its query chunk's first in ring order waits, before its
//               epilogue, until the tile of the previous pair has merged (a counter per query
//               tile): merges happen in ring order, so the result is the same bits on every run.
// An item waits only for items before it in the order (on this rank or, through the flags, on
// its neighbours, whose orders are the same), and every CTA is resident, so the waits end.
// Start: CTA 0 publishes the launch signature and tag(1) to every peer (buffer 0 holds this
// rank's block: packed by the caller, stream-ordered before the launch). End: the last CTA to
// finish waits for succ >= tag(W) (its last pull from this rank is done) and sets
// CommControl::epoch (epoch-tagged flags: back-to-back launches need no reset). The item
// counter and the per-step and per-tile counters live in `counters`, which the launcher zeroes
// (stream-ordered) before each launch. After a failure (the error record claimed) nothing more
// is published and every CTA stops at its next item.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/attention/attention.h"
#include "kernels/collectives/collectives.h"

namespace fusedcomm::kernels {

// A zigzag rank has two query chunks and sees at most 2W key chunks, and a query chunk with no
// visible key anywhere is one pair of its own.
inline constexpr int kRingFwdMaxPairs = 4 * kCommMaxRanks + 2;

// One (query chunk, key chunk) pair: the plan of enqueue_ring_step, as data.
struct RingFwdPair {
  int step = 0;         // the ring step whose K/V block it reads
  int64_t q_row0 = 0;   // first row of the query chunk in this rank's q
  int64_t q_count = 0;  // its rows
  int64_t q_pos = 0;    // its first row's global position
  int64_t k_row0 = 0;   // first row of the key chunk in the step's block
  int64_t k_count = 0;  // 0: no visible key anywhere (o = 0, lse = -inf)
  int64_t k_pos = 0;
  int merge = 0;          // index among its query chunk's pairs in ring order (0: stores)
  bool writes_o = false;  // the query chunk's last pair: rounds o to bf16
};

struct RingFwdStep {
  const void* k = nullptr;  // the step's K block (B, rows, Hkv, D), 16-byte aligned
  const void* v = nullptr;
  int64_t rows = 0;
  // step >= 1: the pull that brings the block (K then V, contiguous) from pred's buffer.
  const void* pull_src = nullptr;
  void* pull_dst = nullptr;
  uint64_t pull_bytes = 0;  // a multiple of 16
};

struct RingFwdArgs {
  const __nv_bfloat16* q = nullptr;  // (B, S_r, Hq, D) dense
  __nv_bfloat16* o = nullptr;        // (B, S_r, Hq, D) dense
  float* lse = nullptr;              // (B, Hq, S_r), required
  float* o_acc = nullptr;            // (B, S_r, Hq, D) fp32
  uint64_t* counters = nullptr;      // ring_fwd_counter_words() words, zeroed by the launcher
  int64_t batch = 0, rows = 0, q_heads = 0, kv_heads = 0, head_dim = 0;  // rows = S_r
  bool causal = false;
  float scale = 0.0f;
  uint64_t sig_size = 0;  // the signature's size field, as the step pipeline's sync kernels
  RingFwdStep steps[kCommMaxRanks];
  RingFwdPair pairs[kRingFwdMaxPairs];
  int n_pairs = 0;  // in ring order per query chunk (enqueue_ring_step's order, step-major)
};

// The forward ring's form among the GPUs of one host, chosen here only: the persistent kernel
// above, or the step pipeline (ring.h: a stream-ordered attention launch per block pair, the
// copy engine pulling the next block on a side stream between one-thread sync kernels). Across
// hosts neither: the decomposed form (cuda_comm_ring_hosts.cc). kAuto takes the step pipeline:
// on one GPU (W = 1, and W = 2 ranks sharing it) the persistent kernel was not faster
// (docs/performance.md); W >= 2 on separate GPUs, where it could be, is not measured yet. The
// choice must be the same on every rank (a forced one too).
enum class RingFwdPath : int { kAuto = 0, kPersistent = 1, kSteps = 2 };
inline RingFwdPath choose_ring_fwd_path(RingFwdPath forced) {
  return forced == RingFwdPath::kAuto ? RingFwdPath::kSteps : forced;
}
inline const char* ring_fwd_path_name(RingFwdPath p) {
  return p == RingFwdPath::kPersistent ? "persistent kernel"
         : p == RingFwdPath::kSteps    ? "step pipeline"
                                       : "auto";
}

// Words of `counters` the launch needs.
uint64_t ring_fwd_counter_words(const RingFwdArgs& a);

// The grid the launch takes on this device (the SMs, at most one CTA per item).
int ring_fwd_grid(const CommDevice& dev, const RingFwdArgs& a);

// Zeroes the counters and enqueues the kernel on `stream`. cudaErrorInvalidValue on arguments
// the kernel does not take (head dim, alignment, more pairs than kRingFwdMaxPairs).
cudaError_t launch_ring_fwd(const CommDevice& dev, const RingFwdArgs& a, cudaStream_t stream);

}  // namespace fusedcomm::kernels
