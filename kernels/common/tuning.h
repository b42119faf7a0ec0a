// Tuned values shared by the op families: the flag waits' polling and the fused kernels' raster
// group. Chosen on H200 (2 and 4 GPUs, NVLink); docs/performance.md has the measurements.
#pragma once

#include <cstdint>

namespace fusedcomm::kernels::tuning {

// Collective waits (comm_wait_flag): the sleep between polls backs off up to kCommPollSleepNs
// for the first kCommPollLatePolls polls (latency first: a peer is usually a few microseconds
// behind), then up to kCommPollSleepLateNs.
inline constexpr uint32_t kCommPollSleepNs = 128u;
inline constexpr uint32_t kCommPollSleepLateNs = 1024u;
inline constexpr uint32_t kCommPollLatePolls = 4096;
// Every wait (comm_wait_flag, the GEMM producers' wait_flag) reads the host-mapped abort word
// only every this many polls (about 1-2 ms of waiting). The GPU serves reads of host memory one
// at a time, about 1 us each on an H200 (one read by each of 132 CTAs took ~130 us): with every
// waiting CTA reading it every 16-20 us, a wait that outlasted that queued the grid's reads for
// hundreds of microseconds, its waits ended that late, the peers' next waits grew as long, and
// the stall (~0.2-0.4 ms per launch) repeated launch after launch (docs/performance.md).
inline constexpr uint32_t kAbortCheckPolls = 1024;
static_assert((kAbortCheckPolls & (kAbortCheckPolls - 1)) == 0 && kAbortCheckPolls >= 16,
              "a power of two, a multiple of the 16-poll checks");

// Fused kernels' start and chunk waits in their communication roles (fused_wait): their flags
// come every few to tens of microseconds, and tens of CTAs may wait at once while the GEMM runs
// on the other SMs, so their polls back off further than the collectives'.
inline constexpr uint32_t kFusedPollSleepCapNs = 1024;
// The GEMM producers' waits for allGatherGemm's chunk flags (fused_wait_flag). Up to ~110
// producers wait at once when the GEMM catches up with the pulls, and shorter sleeps made their
// polls slow the same GPU's NVLink pulls several-fold (a 4 MiB pull ~10x slower under waiting
// producers at W = 4; the GEMM then waited longer still). With this cap the fused kernel beat
// the decomposed path at every TP-4 shape measured; 4 and 16 us were close, and at W = 2 the cap
// made no difference. The wake-up it may add (< 8 us per waiting tile) is far below the wait it
// removes.
inline constexpr uint32_t kFusedProducerPollSleepCapNs = 8192;

// The fused kernels' raster group height (GemmArgs::group_m): the GEMM's default (0: gemm.h) up
// to kFusedDefaultGroupMaxWorld ranks, where it was measured, and kFusedGroupM above. A taller
// group asks for more peers' rows before the first wave of the peers' part (allGatherGemm) and
// changes which owners the first waves' pushes go to (gemmReduceScatter): not taken where it
// was not measured.
inline constexpr int kFusedDefaultGroupMaxWorld = 2;
inline constexpr int kFusedGroupM = 8;

}  // namespace fusedcomm::kernels::tuning
