// Device helpers of the fused ops (kernels/common/fused.h) on top of the collectives' flag
// protocol (comm_protocol.cuh): the FusedFlags block, a bounded wait with a longer timeout for
// waits that only follow other waits, arrival counters, and the end-of-launch sequence.
//
// Scopes (PTX memory model). Flags that cross GPUs (CommFlags::arrive/done, rs_tile) are
// written with st.release.sys and read with ld.acquire.sys, as in comm_protocol.cuh. Counters
// and flags that stay on this GPU are ordered with gpu-scope fences (fence.acq_rel.gpu, which
// release/acquire chains need, or __threadfence() = fence.sc.gpu), much cheaper than
// fence.sc.sys; where such a chain ends in a system-scope release, causality order is
// transitive across scopes as long as each synchronising pair is morally strong (both threads
// inside the fence's scope), so a reader on another GPU that acquires the flag observes every
// store ordered before it on this GPU.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/collectives/collectives.h"
#include "kernels/common/comm_protocol.cuh"
#include "kernels/common/fused.h"
#include "kernels/common/split.h"
#include "kernels/common/tuning.h"

namespace fusedcomm::kernels::detail {

__device__ __forceinline__ FusedFlags* fused_flags(const CommDevice& d, int rank) {
  return reinterpret_cast<FusedFlags*>(d.base[rank] + kFusedFlagsOffset);
}

// Bounded wait (one thread), as comm_wait_flag but giving up only after timeout_scale times
// the configured timeout. Waits that can only fail because an earlier wait (of another CTA of
// this rank) is stuck get a longer timeout, so that the CTA that waits for the root cause
// gives up first and its record names the peer and step that failed; the others see the
// error claim within 16 polls and stop without overwriting it.
//
// Inline on purpose. In a kernel that contains the GEMM engine (setmaxnreg: 40 registers for
// the producer, 232 for the consumers), ptxas failed to allocate the consumers' registers
// ("Register allocation failed with register count of 232") when one __noinline__ function
// was called both from the producer's region and from code before the engine. Rule for the
// fused kernels: a __noinline__ function is called from one register region only. The
// producer calls fused_wait_flag (below); role code runs in __noinline__ role functions that
// use this inline version; comm_protocol.cuh's comm_wait_flag is not used.
// The polls back off to tuning.h's kFusedPollSleepCapNs (the collectives' waits stay at their
// shorter sleeps, latency first).
__device__ __forceinline__ bool fused_wait(const CommDevice& d, const uint64_t* flag, uint64_t epoch,
                                           uint32_t op, uint32_t step, int peer, uint32_t timeout_scale,
                                           bool local = false) {
  return comm_wait_flag_inline(d, flag, epoch, op, step, peer, timeout_scale, local,
                               tuning::kFusedPollSleepCapNs);
}

// The GEMM producer's out-of-line wait (its 40-register region stays small), for flags this
// GPU writes (allGatherGemm's chunk flags): gpu-scope polls, backing off to tuning.h's
// kFusedProducerPollSleepCapNs between polls (it says why so long).
inline __device__ __noinline__ bool fused_wait_flag(const CommDevice& d, const uint64_t* flag, uint64_t epoch,
                                                    uint32_t op, uint32_t step, int peer,
                                                    uint32_t timeout_scale) {
  return comm_wait_flag_inline(d, flag, epoch, op, step, peer, timeout_scale, true,
                               tuning::kFusedProducerPollSleepCapNs);
}

// One thread, after its own release fence: true for the arrival that brings *counter to n,
// which then resets it to 0 (no other arrival of this launch comes after it). The acquire
// fence after the atomic makes every earlier arrival's released accesses precede what the
// caller does next (release and acquire patterns through the counter, gpu scope).
__device__ __forceinline__ bool fused_last_of(uint32_t* counter, uint32_t n) {
  const uint32_t old = atomicAdd(counter, 1u);
  if (old + 1 != n) return false;
  fence_acq_rel_gpu();
  *reinterpret_cast<volatile uint32_t*>(counter) = 0;
  return true;
}

// One thread per CTA that read peers' memory or its receive slots (pulling CTAs; every CTA of
// the fused gemmReduceScatter), after a bar.sync that follows the CTA's last such load (and,
// gemmReduceScatter, its last push's completion): the last of the role's `n` CTAs tells every
// peer that this rank has finished reading its memory for `epoch` (CommFlags::done; ordering
// as in comm_protocol.cuh: the loads fed stores or values that are complete before the fences,
// and the counter chains the CTAs' fence.sc.sys to the last one's release).
__device__ __forceinline__ void fused_role_done(const CommDevice& d, uint64_t epoch, uint32_t n) {
  __threadfence_system();
  if (fused_last_of(&fused_flags(d, d.rank)->role_exit, n)) {
    __threadfence_system();
    comm_signal_peers(
        d, [&](CommFlags* f) { return &f->done[d.rank]; }, epoch);
  }
}

// The end barrier's wait (the last CTA's one thread): every peer's done flag of this launch,
// each wait bounded and named, then the peers' launch signatures (each peer's done release
// follows its signature). Every fused kernel's end runs it before its own resets.
inline __device__ void fused_await_done(const CommDevice& d, uint64_t epoch, uint32_t op) {
  CommFlags* mine = comm_flags(d, d.rank);
  bool ok = true;
  for (int i = 1; i < d.world && ok; ++i) {
    const int p = (d.rank + i) % d.world;
    ok = fused_wait(d, &mine->done[p], epoch, op, kCommStepDone, p, 1);
  }
  if (ok) comm_check_signatures(d, epoch, op, kCommStepDone);
}

// One consumer thread per CTA, once, when the CTA is completely done (every CTA of the grid
// calls it; out of line, and only from the engine's consumer region, where inlined it made
// ptxas spill):
// the last CTA waits until every peer has finished reading this rank's memory (end barrier),
// compares the peers' launch signatures (each peer's done release follows its signature: see
// ag_pull_role / rs_start), resets the tile counter (every claim of this launch precedes every
// CTA's arrival here: a CTA's consumers arrive only after its producer made its last claim) and
// publishes the epoch for the next launch (read by its CTAs after the kernel boundary).
// fused_finish_inline: the same, inlined, for CTAs that never enter the engine (the exchange
// lanes of gemmReduceScatter across hosts).
__device__ __forceinline__ void fused_finish_inline(const CommDevice& d, uint64_t epoch, uint32_t op) {
  __threadfence();
  if (!comm_last_cta(&comm_control(d)->exit_count)) return;
  fused_await_done(d, epoch, op);
  *reinterpret_cast<volatile uint32_t*>(&fused_flags(d, d.rank)->tile_claim) = 0;
  *reinterpret_cast<volatile uint64_t*>(&comm_control(d)->epoch) = epoch;
}
inline __device__ __noinline__ void fused_finish(const CommDevice& d, uint64_t epoch, uint32_t op) {
  fused_finish_inline(d, epoch, op);
}

}  // namespace fusedcomm::kernels::detail
