// Device side of the collectives' flag protocol (collectives.h): region addressing, the launch
// epoch, bounded flag waits with the error record, flag publication, and the grid-level
// "last CTA" counter. Built on the system-scope flag accessors of sm90_primitives.cuh.
//
// Ordering, in one place (PTX ISA memory model, scopes .sys because readers are other GPUs):
// - Publish: data stores (to peer or own memory) by all threads -> bar.sync -> thread 0
//   fence.sc.sys -> thread 0 st.release.sys of the flag. The barrier orders every thread's
//   stores before thread 0's fence (causality order is transitive) and the release is
//   cumulative, so a reader that observes the flag with ld.acquire.sys observes the data.
// - Observe: one thread ld.acquire.sys until flag >= epoch -> bar.sync -> every thread reads
//   the data. Remote data is read with ld.global.cg (no L1), local staging likewise.
// - Grid-level: each CTA's thread 0, after the CTA's publish fence, does atomicAdd on a local counter; the
//   CTA that sees count == grid-1 is last: its fence.sc.sys after the atomic makes every other
//   CTA's fenced stores precede its own flag release (fence-fence synchronisation through the
//   counter's modification order). The last CTA resets the counter (no other CTA of this launch
//   touches it again; the next launch is stream-ordered after this one).
// - Launch signatures (CommFlags::launch): the publishing thread stores its signature into every
//   peer's slot before its first fence.sc.sys + release of the launch; a thread that has
//   acquired a flag released after that (>= epoch) compares the slot (comm_check_signatures).
//   The bounded wait compares the awaited peer's slot at each slow check without ordering
//   (st/ld.relaxed.sys: single-copy atomic), so it can only see this launch's value or an older
//   one, whose epoch byte differs and gives no verdict.
// - Launch order: the collective kernels are launched early (early_launch.h) but touch no
//   memory before pdl_wait, which returns once the stream's previous kernel has completed and
//   its memory is visible; so "stream-ordered after" above and in collectives.h holds as at a
//   kernel boundary.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/collectives/collectives.h"
#include "kernels/common/sm90_primitives.cuh"
#include "kernels/common/tuning.h"

namespace fusedcomm::kernels::detail {

__device__ __forceinline__ CommFlags* comm_flags(const CommDevice& d, int rank) {
  return reinterpret_cast<CommFlags*>(d.base[rank]);
}
__device__ __forceinline__ CommControl* comm_control(const CommDevice& d) {
  return reinterpret_cast<CommControl*>(d.base[d.rank] + kCommControlOffset);
}
// Staging slot [parity][src] of rank `owner`'s region.
__device__ __forceinline__ uint8_t* comm_slot(const CommDevice& d, int owner, uint64_t parity, int src) {
  return d.base[owner] + kCommStagingOffset + (parity * d.world + src) * d.slot_bytes;
}

// The launch's epoch in this CTA's shared memory (one slot per CTA: a function-scope __shared__
// variable is a single per-block object however often the function is inlined). Written once
// by comm_launch_epoch; read by the bounded waits for the signature check.
__device__ __forceinline__ uint64_t& comm_epoch_slot() {
  __shared__ uint64_t s_epoch;
  return s_epoch;
}

// Every CTA calls this first (all threads): the launch's epoch, broadcast through shared memory.
// CommControl::epoch was last written by the previous launch's last CTA, complete and visible
// once the kernel has passed pdl_wait (as at a kernel boundary; collectives.cu enter_collective).
__device__ __forceinline__ uint64_t comm_launch_epoch(const CommDevice& d) {
  if (threadIdx.x == 0) {
    comm_epoch_slot() = *reinterpret_cast<volatile uint64_t*>(&comm_control(d)->epoch) + 1;
  }
  __syncthreads();
  return comm_epoch_slot();
}

// One thread: this launch's signature into every peer's CommFlags::launch slot (see the ordering
// there: call it before the thread's first fence.sc.sys + release of the launch).
__device__ __forceinline__ void comm_publish_signature(const CommDevice& d, uint64_t epoch) {
  const uint64_t sig = comm_signature_at(d.launch_sig, epoch);
  for (int i = 1; i < d.world; ++i) {
    const int p = (d.rank + i) % d.world;
    st_relaxed_sys(&reinterpret_cast<CommFlags*>(d.base[p])->launch[d.rank][epoch & 1], sig);
  }
}

// Rank `peer`'s signature for the launch `epoch` as far as this rank can see it (local load).
__device__ __forceinline__ uint64_t comm_peer_signature(const CommDevice& d, int peer, uint64_t epoch) {
  return ld_relaxed_sys(&reinterpret_cast<const CommFlags*>(d.base[d.rank])->launch[peer][epoch & 1]);
}

// One thread: claims the error record (first failure of this rank only) and fills it.
__device__ __forceinline__ void comm_record_failure(const CommDevice& d, uint32_t code, uint64_t epoch,
                                                    uint64_t observed, uint64_t elapsed, uint32_t op,
                                                    uint32_t step, int peer) {
  if (atomicCAS(&comm_control(d)->error_claim, 0u, code) != 0u) return;
  volatile CommErrorRecord* e = d.error;
  e->rank = static_cast<uint32_t>(d.rank);
  e->peer = static_cast<uint32_t>(peer);
  e->op = op;
  e->step = step;
  e->cta = blockIdx.x;
  e->epoch = epoch;
  e->observed = observed;
  e->elapsed_ns = elapsed;
  e->launch_sig = comm_signature_at(d.launch_sig, comm_epoch_slot());
  __threadfence_system();
  e->code = code;
  __threadfence_system();
}

// True if `peer`'s slot proves that its launch `epoch` differs from this one (slot of this
// epoch, other signature); false if it matches or holds an older launch (no verdict yet).
__device__ __forceinline__ bool comm_signature_differs(const CommDevice& d, int peer, uint64_t epoch) {
  const uint64_t seen = comm_peer_signature(d, peer, epoch);
  return comm_sig_epoch8(seen) == (epoch & 0xFF) && seen != comm_signature_at(d.launch_sig, epoch);
}

// The first peer (in rank order) whose slot proves a different launch at `epoch`, or -1. A
// wait for one peer must notice a mismatch anywhere: the peer it waits for may itself have
// stopped at a third rank's different launch (its own signature matching), and would then
// never raise the flag.
__device__ __forceinline__ int comm_mismatched_peer(const CommDevice& d, uint64_t epoch) {
  for (int p = 0; p < d.world; ++p) {
    if (p != d.rank && comm_signature_differs(d, p, epoch)) return p;
  }
  return -1;
}

// One thread, after it acquired a flag that each peer released after publishing its signature
// for `epoch`: false (and the error record filled) if some peer launched something else.
__device__ __forceinline__ bool comm_check_signatures(const CommDevice& d, uint64_t epoch, uint32_t op,
                                                      uint32_t step) {
  const uint64_t mine = comm_signature_at(d.launch_sig, epoch);
  for (int i = 1; i < d.world; ++i) {
    const int p = (d.rank + i) % d.world;
    // An ordered read: the slot holds p's launch `epoch`, epoch byte included, so anything but
    // this launch's exact signature is a mismatch.
    const uint64_t seen = comm_peer_signature(d, p, epoch);
    if (seen != mine) {
      comm_record_failure(d, kCommLaunchMismatch, epoch, seen, 0, op, step, p);
      return false;
    }
  }
  return true;
}

__device__ __forceinline__ bool comm_failed(const CommDevice& d) {
  return *reinterpret_cast<volatile uint32_t*>(&comm_control(d)->error_claim) != 0;
}

// Rank `peer`'s error claim (its CommControl, read from its region): 0, or the code with which
// it gave up. Unordered: a claim, once made, stays until the region is dropped.
__device__ __forceinline__ uint32_t comm_peer_claim(const CommDevice& d, int peer) {
  return ld_volatile_u32(
      &reinterpret_cast<const CommControl*>(d.base[peer] + kCommControlOffset)->error_claim);
}

// Bounded wait (one thread): true once *flag >= epoch; false after timeout_ns, an abort, or
// another CTA's failure. The first to give up fills the error record. The local error claim is
// re-read every 16 polls; the clock, the peers' signatures and claims every kCommSlowCheckNs
// of waiting; the host-mapped abort word every tuning::kAbortCheckPolls polls (its reads over
// PCIe are served one at a time: see there).
// comm_wait_flag_inline is the same wait, inlined: for waits inside a kernel's main loop,
// where a call would make the caller save every live register around it (spills).
inline constexpr uint64_t kCommSlowCheckNs = 20000;
// timeout_scale: the wait gives up after timeout_scale × the CommDevice's timeout (waits that
// legitimately span a whole GEMM, e.g. the fused ops' chunk flags, use more than 1).
// local: the flag is written by this GPU (gpu-scope acquire suffices and polls are cheaper).
// sleep_cap_ns: the longest sleep between polls (0: tuning.h's kCommPollSleepNs, then
// kCommPollSleepLateNs after kCommPollLatePolls polls).
// peer_check: at each slow check, also read the awaited peer's error claim (one load from its
// region): a peer that gave up first (kCommPeerFailed) publishes nothing more, and is named
// now rather than at the timeout. The collectives' waits (comm_wait_flag) make it; the waits
// inside the fused kernels' main loops do not (registers).
__device__ __forceinline__ bool comm_wait_flag_inline(const CommDevice& d, const uint64_t* flag,
                                                      uint64_t epoch, uint32_t op, uint32_t step, int peer,
                                                      uint32_t timeout_scale = 1, bool local = false,
                                                      uint32_t sleep_cap_ns = 0, bool peer_check = false) {
  auto load = [&] { return local ? ld_acquire_gpu(flag) : ld_acquire_sys(flag); };
  uint64_t v = load();
  if (v >= epoch) return true;
  const uint64_t timeout =
      (d.timeout_ns ? d.timeout_ns : kDefaultWaitTimeoutNs) * static_cast<uint64_t>(timeout_scale);
  const uint64_t t0 = globaltimer_ns();
  uint64_t next_check = t0 + kCommSlowCheckNs;
  uint32_t sleep_ns = 16;
  for (uint32_t polls = 1;; ++polls) {
    v = load();
    if (v >= epoch) return true;
    if ((polls & 15) == 0) {
      if (comm_failed(d)) return false;  // someone else recorded it
      const uint64_t now = globaltimer_ns();
      const bool abort_check = (polls & (tuning::kAbortCheckPolls - 1)) == 0;
      if (now >= next_check || abort_check) {
        next_check = now + kCommSlowCheckNs;
        uint32_t code = 0, peer_claim = 0;
        const uint64_t elapsed = now - t0;
        const uint64_t launch_epoch = comm_epoch_slot();
        int who = -1;
        if (abort_check && d.abort_word != nullptr && ld_volatile_u32(d.abort_word) != 0) {
          code = kGemmAborted;
        } else if (!local && (who = comm_mismatched_peer(d, launch_epoch)) >= 0) {
          // A peer is in a different op (or size) at this epoch: say so now, not at the
          // timeout (the flag may never come). Not for local flags: a CTA of this GPU raises
          // them, and the CTA that waits for the peer behind them makes the check (this also
          // keeps the check out of the GEMM producer's 40-register wait).
          code = kCommLaunchMismatch;
        } else if (peer_check && peer >= 0 && peer < d.world && peer != d.rank &&
                   (peer_claim = comm_peer_claim(d, peer)) != 0) {
          // After the mismatch check: a mismatch is this rank's own finding to report.
          code = kCommPeerFailed;
        } else if (elapsed > timeout) {
          code = kGemmWaitTimeout;
        }
        if (code != 0) {
          const bool mismatch = code == kCommLaunchMismatch;
          const uint64_t observed = mismatch                  ? comm_peer_signature(d, who, launch_epoch)
                                    : code == kCommPeerFailed ? peer_claim
                                                              : v;
          comm_record_failure(d, code, mismatch ? launch_epoch : epoch, observed, elapsed, op, step,
                              mismatch ? who : peer);
          return false;
        }
      }
    }
    // Short sleeps while a peer is merely a few microseconds behind; longer once it is late.
    __nanosleep(sleep_ns);
    const uint32_t cap = sleep_cap_ns                         ? sleep_cap_ns
                         : polls < tuning::kCommPollLatePolls ? tuning::kCommPollSleepNs
                                                              : tuning::kCommPollSleepLateNs;
    sleep_ns = sleep_ns * 2 < cap ? sleep_ns * 2 : cap;
  }
}
inline __device__ __noinline__ bool comm_wait_flag(const CommDevice& d, const uint64_t* flag, uint64_t epoch,
                                                   uint32_t op, uint32_t step, int peer) {
  return comm_wait_flag_inline(d, flag, epoch, op, step, peer, 1, false, 0, true);
}

// All threads of a CTA: thread 0 waits for flags[p] >= epoch for every peer p != rank (flags
// indexed by source rank with `stride` uint64 between sources); returns false (to every
// thread) if a wait gave up. check_signatures: the flags are each peer's first release of the
// launch, after its signature (CommFlags::launch): compare them too.
__device__ __forceinline__ bool comm_wait_peers(const CommDevice& d, const uint64_t* flags, int stride,
                                                uint64_t epoch, CommOp op, uint32_t step,
                                                bool check_signatures = false) {
  __shared__ int s_ok;
  if (threadIdx.x == 0) {
    int ok = 1;
    for (int i = 1; i < d.world && ok; ++i) {
      const int p = (d.rank + i) % d.world;
      ok = comm_wait_flag(d, flags + static_cast<int64_t>(p) * stride, epoch, static_cast<uint32_t>(op), step,
                          p);
    }
    if (ok && check_signatures) ok = comm_check_signatures(d, epoch, static_cast<uint32_t>(op), step);
    s_ok = ok;
  }
  __syncthreads();
  return s_ok != 0;
}

// All threads: orders this CTA's prior accesses (all threads) before what thread 0 does next.
// bar.sync puts every thread's stores before thread 0's fence.sc.sys in causality order; the
// fence and thread 0's later flag store form a release pattern, which is cumulative. (One
// fence per CTA: a fence.sc.sys in every thread cost ~10 us per launch on the H200.)
__device__ __forceinline__ void comm_publish_fence() {
  __syncthreads();
  if (threadIdx.x == 0) __threadfence_system();
}

// Thread 0: true if this CTA is the last of the grid to arrive at `counter`, which it then
// resets (no other CTA of this launch touches it again; the next launch reads it after this one
// has completed). No fence: enough where what follows is read only by this rank's next
// launches (collectives.cu finish_launch).
__device__ __forceinline__ bool comm_arrive_last(uint32_t* counter) {
  if (atomicAdd(counter, 1u) + 1 != gridDim.x) return false;
  *reinterpret_cast<volatile uint32_t*>(counter) = 0;
  return true;
}

// Thread 0 only, after comm_publish_fence: comm_arrive_last, then the system fence that makes
// every other CTA's fenced stores precede the flag this CTA releases next. See the grid-level
// ordering argument above.
__device__ __forceinline__ bool comm_last_cta(uint32_t* counter) {
  if (!comm_arrive_last(counter)) return false;
  __threadfence_system();
  return true;
}

// Thread 0: flag[rank] := epoch in every peer's flags (`field` picks the array).
template <typename Field>
__device__ __forceinline__ void comm_signal_peers(const CommDevice& d, Field field, uint64_t epoch) {
  for (int i = 1; i < d.world; ++i) {
    const int p = (d.rank + i) % d.world;
    st_release_sys(field(comm_flags(d, p)), epoch);
  }
}

}  // namespace fusedcomm::kernels::detail
