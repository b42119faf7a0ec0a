// What the launcher (collectives.cu) takes from the algorithm selection (select.cu): sizes of a
// launch and the chunk-pipelined variants' plan. Host code.
#pragma once

#include <cstdint>

#include "kernels/collectives/collectives.h"

namespace fusedcomm::kernels::detail {

// The collective kernels' vector width (16-byte loads and stores).
inline constexpr int64_t kVecBytes = 16;
// The chunk-pipelined kernels: threads of the control warp (flag waits and releases) in every
// CTA; the other warps move data.
inline constexpr int kCtl = 32;

int64_t elem_size(CommDtype t);
// True when the allReduce's output is its input's place in this rank's data area.
bool in_place(const CommDevice& d, const CollectiveArgs& a);
// Bytes that one staging slot must hold for a one-shot launch.
int64_t one_shot_payload(const CollectiveArgs& a, int world);
// Bytes of NVLink traffic per rank of the two-phase algorithm (for the grid / chunk choice).
int64_t two_phase_bytes(const CollectiveArgs& a, int world, int rank);
// CTAs that pull from peers in the two-phase kernels (tuning.h).
int two_phase_pull_ctas(int world);

// The two-shot allReduce's grid, from rank-uniform values only (count, dtype, world, num_ctas):
// CTA c of every rank meets CTA c of every peer, so every rank must launch the same grid.
int two_shot_ctas(const CommDevice& d, const CollectiveArgs& a);

// The chunk-pipelined kernels' plan (kTwoPhasePush, kPipelined, kDirect), from (op, dtype,
// count, world, num_ctas, chunk_bytes) only: identical on every rank.
struct PipePlan {
  int64_t chunk;        // elements per work item (a multiple of the vector width)
  int producers;        // CTAs [0, producers)
  int consumers;        // CTAs [producers, producers + consumers)
  int64_t slot_stride;  // push reduceScatter / allToAll / direct: elements between scratch slots
};
// False if the scratch cannot hold what the peers push.
bool pipe_plan(const CommDevice& d, const CollectiveArgs& a, CommAlgo algo, PipePlan* plan);

}  // namespace fusedcomm::kernels::detail
