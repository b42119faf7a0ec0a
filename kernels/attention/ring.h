// The synchronisation of the GPU ring attention (executor-native's CudaComm::ring_attention_gpu):
// a one-thread kernel per ring step on the ring's side stream that publishes this rank's ring
// flag and waits, bounded, for its neighbours' (collectives.h CommFlags::ring). The K/V blocks
// themselves move with the copy engines (cudaMemcpyAsync from the predecessor's symmetric
// buffer), the attention launches run on the op's stream; events order the three.
//
// Protocol, for one launch (epoch e) at world W >= 2, rank r, predecessor r - 1, successor
// r + 1 (mod W); every rank holds two K/V buffers in its data area, buf[0] and buf[1]; tag(j) =
// (e << kCommPipeRoundBits) | j:
//   start:    pack this rank's K, V into buf[0]; publish tag(1) (buf[0] holds the block of step 0)
//             to every peer (the others' flags go to the two neighbours only), so that a wait
//             that times out names a rank that never started the launch, if there is one.
//   step s (0 <= s < W - 1): wait until pred >= tag(s + 1) (its buf[s & 1] holds the block of
//             its step s, which is ours for step s + 1) and succ >= tag(s + 1) (it has pulled
//             from our buf[(s + 1) & 1] what it needed: its step s block, pulled at its step
//             s - 1; at s = 0 the end barrier of the previous launch already ensured it), and
//             for our own step s - 1 attention on that buffer (event); copy pred's buf[s & 1]
//             into our buf[(s + 1) & 1]; publish tag(s + 2).
//   end:      wait until succ >= tag(W) (its last pull from us is done), then CommControl::epoch
//             = e; the op's stream joins the side stream here.
// A rank overwrites a buffer only after the rank that reads it (its successor) has published
// that it finished, and reads its predecessor's buffer only after the predecessor published
// that the block is there; the predecessor overwrites it only after this rank's next publish.
// Every wait is comm_wait_flag_inline's (timeout, abort word, launch signatures), and after a
// failure (this rank's error record claimed) no further flag is published, so the neighbours
// time out too instead of consuming a block that never came.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/collectives/collectives.h"

namespace fusedcomm::kernels {

inline constexpr uint32_t kRingOp = 22;         // CommErrorRecord::op, signature op field
inline constexpr uint32_t kRingBwdOp = 23;      // the same for the ring backward (below)
inline constexpr uint32_t kRingStepBlock = 20;  // CommErrorRecord::step: a neighbour's flag
// A wait may span one attention launch of a neighbour (its copy waits for its own previous
// step's attention): the configured timeout times this.
inline constexpr uint32_t kRingTimeoutScale = 2;

struct RingSyncArgs {
  uint64_t sig_size = 0;  // comm_sig_hash of the rank-uniform sizes (signature's size field)
  uint32_t op = kRingOp;  // kRingOp or kRingBwdOp: the signature's and the error record's op
  uint32_t publish = 0;   // 0: none, else publish tag(publish) into pred's and succ's regions
  uint32_t wait = 0;      // 0: none, else wait for tag(wait) from pred (unless `finish`) and succ
  // Where the two neighbours' tags differ (the backward): 0 takes `wait`'s.
  uint32_t wait_pred = 0, wait_succ = 0;
  bool begin = false;   // the launch's first sync kernel: publishes the launch signature
  bool finish = false;  // the last: waits on succ only, then CommControl::epoch = e
};

// The ring backward (CudaComm::ring_attention_backward_gpu) runs the same kernel (op kRingBwdOp)
// over the same flags, with four buffers per rank: K/V kv[0], kv[1] (bf16, as the forward) and
// the fp32 dK/dV partials of the block they hold, g[0], g[1]. At step s rank r holds the block of
// rank (r - s) mod W in kv[s & 1] and its partial in g[s & 1], adds its contribution to the
// partial, and its successor pulls both. Tags in publication order:
//   K(0) = 1:          start: own block packed into kv[0], g[0] zeroed (to every peer);
//   K(s) = 2s:         (1 <= s < W) kv[s & 1] holds the block of step s (pulled from pred);
//   G(s) = 2s + 3:     (0 <= s < W) this rank's contribution of step s is in g[s & 1];
//   F    = 2W + 2:     this rank has read its own finished partial out of pred's g[(W - 1) & 1].
// K(s + 1) < G(s) < K(s + 2): a rank publishes each after the one before.
//   pull K/V for step s + 1: wait pred >= K(s) and (s >= 1) succ >= K(s) (succ has pulled our
//             kv[(s + 1) & 1] of step s - 1), and our own step s - 1 attention (event); copy.
//   pull partial for step s + 1: after our step s attention (event), publish G(s), wait pred >= G(s)
//             (pred's partial of step s is complete) and succ >= G(s) (succ has read our
//             g[(s + 1) & 1] of step s - 1 before its step s attention); copy.
//   end:      publish G(W - 1), wait pred >= G(W - 1): pred's g[(W - 1) & 1] holds this rank's
//             finished dK/dV (the block went around the ring and came back one hop later), which
//             is converted to bf16 straight out of pred's memory; publish F, wait succ >= F (it
//             has read ours), then CommControl::epoch = e.
// The dK/dV partial is on the critical path (a rank's step s + 1 needs pred's step s); the K/V
// pull overlaps the attention as in the forward.
// Enqueues one sync kernel on `stream` (world >= 2). cudaErrorInvalidValue for world < 2.
cudaError_t launch_ring_sync(const CommDevice& dev, const RingSyncArgs& args, cudaStream_t stream);

}  // namespace fusedcomm::kernels
