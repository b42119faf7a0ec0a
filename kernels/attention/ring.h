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
inline constexpr uint32_t kRingStepBlock = 20;  // CommErrorRecord::step: a neighbour's flag
// A wait may span one attention launch of a neighbour (its copy waits for its own previous
// step's attention): the configured timeout times this.
inline constexpr uint32_t kRingTimeoutScale = 2;

struct RingSyncArgs {
  uint64_t sig_size = 0;  // comm_sig_hash of the rank-uniform sizes (signature's size field)
  uint32_t publish = 0;   // 0: none, else publish tag(publish) into pred's and succ's regions
  uint32_t wait = 0;      // 0: none, else wait for tag(wait) from pred (unless `finish`) and succ
  bool begin = false;     // the launch's first sync kernel: publishes the launch signature
  bool finish = false;    // the last: waits on succ only, then CommControl::epoch = e
};

// Enqueues one sync kernel on `stream` (world >= 2). cudaErrorInvalidValue for world < 2.
cudaError_t launch_ring_sync(const CommDevice& dev, const RingSyncArgs& args, cudaStream_t stream);

}  // namespace fusedcomm::kernels
