// Device helpers of the fused ops (fused.h) on top of the collectives' flag protocol
// (comm_protocol.cuh): the row-split rule, the FusedFlags block, a bounded wait with a longer
// timeout for waits that only follow other waits, arrival counters, the end-of-launch sequence,
// and the CTA-wide copy loop of the pulling CTAs.
//
// Scopes (PTX memory model). Flags that cross GPUs (CommFlags::arrive/done, rs_tile) are
// written with st.release.sys and read with ld.acquire.sys, as in comm_protocol.cuh. Counters
// and flags that stay on this GPU are ordered with gpu-scope fences (fence.acq_rel.gpu, which
// release/acquire chains need, or __threadfence() = fence.sc.gpu), much cheaper than
// fence.sc.sys; where such a chain ends in a
// system-scope release, causality order is transitive across scopes as long as each
// synchronising pair is morally strong (both threads inside the fence's scope), so a reader on
// another GPU that acquires the flag observes every store ordered before it on this GPU.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/collectives/collectives.h"
#include "kernels/fused/fused.h"

#include "kernels/common/comm_protocol.cuh"

namespace fusedcomm::kernels::detail {

// ---- the row split (executor-native/include/fusedcomm/runtime/split.h) ----------------------
__host__ __device__ __forceinline__ int64_t split_count(int64_t n, int w, int r) {
  return n / w + (r < n % w ? 1 : 0);
}
__host__ __device__ __forceinline__ int64_t split_offset(int64_t n, int w, int r) {
  const int64_t rem = n % w;
  return static_cast<int64_t>(r) * (n / w) + (r < rem ? r : rem);
}
// The rank whose block holds item i (0 <= i < n).
__host__ __device__ __forceinline__ int split_owner(int64_t n, int w, int64_t i) {
  const int64_t q = n / w, rem = n % w;
  if (i < rem * (q + 1)) return static_cast<int>(i / (q + 1));
  return static_cast<int>(rem + (i - rem * (q + 1)) / q);  // q > 0 here: i < n
}

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
// Chunk and start flags of the fused ops come every few to tens of microseconds, and tens of
// CTAs may wait at once while the GEMM runs on the other SMs: their polls back off to this
// sleep (the collectives' waits stay at 128 ns, latency first). Bench switch:
// -DFUSEDCOMM_POLL_CAP_NS=N (fused/ag_ctas_sweep.sh).
#ifndef FUSEDCOMM_POLL_CAP_NS
#define FUSEDCOMM_POLL_CAP_NS 1024
#endif
inline constexpr uint32_t kFusedPollSleepCapNs = FUSEDCOMM_POLL_CAP_NS;
__device__ __forceinline__ bool fused_wait(const CommDevice& d, const uint64_t* flag,
                                           uint64_t epoch, uint32_t op, uint32_t step, int peer,
                                           uint32_t timeout_scale, bool local = false) {
  return comm_wait_flag_inline(d, flag, epoch, op, step, peer, timeout_scale, local,
                               kFusedPollSleepCapNs);
}

// The GEMM producer's out-of-line wait (its 40-register region stays small), for flags this
// GPU writes (allGatherGemm's chunk flags): gpu-scope polls, backing off to 8 us between polls.
// Why so long: up to ~110 producers wait at once when the GEMM catches up with the pulls, and
// their polls slowed the same GPU's NVLink pulls several-fold (4 x H200, run 11: a pull of 4 MiB
// under waiting producers took ~160 us instead of ~15; the GEMM then waited longer still, so
// launches fell into a slow mode, 1.3-2.8x the decomposed time below 128 MiB at W = 4). With
// an 8 us cap every one of the 12 TP-4 shapes ran fused faster than decomposed (0.80-0.96x, two
// runs; 4 us and 16 us were close); at W = 2 the cap changed nothing beyond noise. The wake-up
// it may add (< 8 us per waiting tile) is far below the wait it removes. Bench switch:
// -DFUSEDCOMM_CHUNK_POLL_CAP_NS=N (fused/ag_ctas_sweep.sh).
#ifndef FUSEDCOMM_CHUNK_POLL_CAP_NS
#define FUSEDCOMM_CHUNK_POLL_CAP_NS 8192
#endif
inline __device__ __noinline__ bool fused_wait_flag(const CommDevice& d, const uint64_t* flag,
                                                    uint64_t epoch, uint32_t op, uint32_t step,
                                                    int peer, uint32_t timeout_scale) {
  return comm_wait_flag_inline(d, flag, epoch, op, step, peer, timeout_scale, true,
                               FUSEDCOMM_CHUNK_POLL_CAP_NS);
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
    comm_signal_peers(d, [&](CommFlags* f) { return &f->done[d.rank]; }, epoch);
  }
}

// One consumer thread per CTA, once, when the CTA is completely done (every CTA of the grid
// calls it; out of line, and only from the engine's consumer region, where inlined it made
// ptxas spill):
// the last CTA waits until every peer has finished reading this rank's memory (end barrier),
// compares the peers' launch signatures (each peer's done release follows its signature: see
// ag_pull_role / rs_start), resets the tile counter (every claim of this launch precedes every
// CTA's arrival here: a CTA's consumers arrive only after its producer made its last claim) and
// publishes the epoch for the next launch (read by its CTAs after the kernel boundary).
inline __device__ __noinline__ void fused_finish(const CommDevice& d, uint64_t epoch, uint32_t op) {
  __threadfence();
  if (!comm_last_cta(&comm_control(d)->exit_count)) return;
#ifndef FUSEDCOMM_PHANTOM_PEER  // bench build: no peer process (fused_gemm.cuh)
  CommFlags* mine = comm_flags(d, d.rank);
  bool ok = true;
  for (int i = 1; i < d.world && ok; ++i) {
    const int p = (d.rank + i) % d.world;
    ok = fused_wait(d, &mine->done[p], epoch, op, kCommStepDone, p, 1);
  }
  if (ok) comm_check_signatures(d, epoch, op, kCommStepDone);
#endif
  *reinterpret_cast<volatile uint32_t*>(&fused_flags(d, d.rank)->tile_claim) = 0;
  *reinterpret_cast<volatile uint64_t*>(&comm_control(d)->epoch) = epoch;
}

// allGatherGemm's pulls (ag_pull_role): one thread of a pulling CTA moves each slice with bulk
// copies (cp.async.bulk: the peer's memory -> this CTA's shared memory -> this rank's gathered
// A), kStages pieces of kPiece bytes in flight (128 KiB per CTA). Until run 16 the pulls were
// 384 threads' 16-byte register loads, 48 KiB in flight per CTA: beside the GEMM those were
// latency-bound (run 15: at W = 4 square 8192 needed 48 pulling CTAs where the NVLink probe
// reaches 331 GB/s with 16). With bulk copies 8-24 CTAs do it, and the fused time fell 1-5 % at
// W = 4 (4 x H200, bench/fused/NOTES.md "Run 16"; kAgSplit in fused.cu).
// The staging area is the CTA's dynamic shared memory, which its GEMM role only takes after
// the pull role ends (release() first invalidates the mbarriers). The waits below are on this
// CTA's own copies, not on a peer's progress: the bytes are in the peer's mapped memory (CUDA
// IPC, open until this process closes the communicator) once its arrive flag was seen, so they
// need no timeout, as the register loads they replaced needed none.
struct FusedBulkCopier {
  static constexpr int kStages = 4;
  static constexpr uint32_t kPiece = 32u << 10;
  static constexpr size_t kSmemBytes = size_t(kStages) * kPiece + kStages * sizeof(uint64_t);
  uint8_t* buf;    // kStages pieces
  uint64_t* bar;   // one mbarrier per stage, after them
  uint32_t phase;  // bit s: the parity the next wait on stage s expects

  // All three below: the CTA's thread 0 only.
  __device__ __forceinline__ void init(uint8_t* smem) {
    buf = smem;
    bar = reinterpret_cast<uint64_t*>(smem + size_t(kStages) * kPiece);
    phase = 0;
    for (int s = 0; s < kStages; ++s) mbar_init(&bar[s], 1);
    mbar_init_fence();
  }
  // Copies `bytes` (a multiple of 16; both pointers 16-byte aligned) from src to dst and returns
  // once the stores are complete (the caller then publishes them).
  __device__ __forceinline__ void copy(void* dst, const void* src, int64_t bytes) {
    const int64_t n = (bytes + kPiece - 1) / kPiece;
    auto piece_bytes = [&](int64_t q) {
      return static_cast<uint32_t>(min(static_cast<int64_t>(kPiece), bytes - q * kPiece));
    };
    int64_t issued = 0;
    for (int64_t q = 0; q < n; ++q) {
      while (issued < n && issued - q < kStages) {
        const int st = static_cast<int>(issued % kStages);
        // The stage's last store has read it (all stores: the oldest pending one is that one).
        if (issued >= kStages) bulk_wait_read_all();
        const uint32_t b = piece_bytes(issued);
        mbar_arrive_expect_tx(&bar[st], b);
        asm volatile(
            "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
                "r"(smem_u32(buf + size_t(st) * kPiece)),
            "l"(static_cast<const uint8_t*>(src) + issued * kPiece), "r"(b), "r"(smem_u32(&bar[st]))
            : "memory");
        ++issued;
      }
      const int st = static_cast<int>(q % kStages);
      mbar_wait(&bar[st], (phase >> st) & 1u);
      phase ^= 1u << st;
      asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(
                       static_cast<uint8_t*>(dst) + q * kPiece),
                   "r"(smem_u32(buf + size_t(st) * kPiece)), "r"(piece_bytes(q))
                   : "memory");
      bulk_commit();
    }
    bulk_wait_all();
  }
  // Before the CTA's shared memory changes hands (the GEMM role initialises its own barriers).
  __device__ __forceinline__ void release() {
    bulk_wait_all();
    for (int s = 0; s < kStages; ++s) {
      asm volatile("mbarrier.inval.shared::cta.b64 [%0];" ::"r"(smem_u32(&bar[s])) : "memory");
    }
  }
};

}  // namespace fusedcomm::kernels::detail
