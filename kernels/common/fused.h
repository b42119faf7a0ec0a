// What the fused GEMM + communication ops share: allGatherGemm (kernels/ag_gemm/ag_gemm.h),
// gemmReduceScatter (kernels/gemm_rs/gemm_rs.h) and gemmAllReduce (kernels/gemm_ar/gemm_ar.h),
// among the processes of one host over NVLink. Each is ONE launch of a persistent kernel (or,
// decomposed, our GEMM and our collective on the stream) in which some CTAs run the GEMM engine
// (kernels/gemm/gemm.h) and others move data between the ranks' symmetric regions
// (collectives.h's CommDevice, built by executor-native's SymmetricMemory), tile by tile.
//
// W = world, r = rank. The row split is split.h's rule (rank p gets n/W + (p < n%W) rows starting
// at p*(n/W) + min(p, n%W)), so M need not divide by W nor be a multiple of 128. bf16 in and out,
// fp32 accumulation; op(W) = Wᵀ for W: N×K (GemmLayoutB::kNK, a linear layer's weight) or W for
// W: K×N (kKN).
//
// Contract (every fused op)
// - All ranks launch the same sequence of ops on the CommDevice (collectives and fused ops
//   interleave freely: they share the launch epoch), one stream per rank, with the same
//   rank-uniform sizes (each op's header says which) and the same algorithm after kAuto is
//   resolved. kAuto decides from values every rank shares (fused_choice.h), so it agrees.
// - Shapes: M >= 1; N, K >= 8 and multiples of 8 (the GEMM contract); dense row-major operands
//   (leading dimension = columns); every pointer and every offset 16-byte aligned.
// - Sizes: the data area and the scratch area (each SymmetricConfig::data_bytes long) must hold
//   what the op's *_workspace() reports; the launch checks and returns cudaErrorInvalidValue.
// - Input lifetime: when the launch completes in stream order, every peer has finished reading
//   this rank's symmetric memory for it (end barrier): the caller may overwrite its input and
//   workspace right away, and back-to-back launches need no host synchronisation.
// - Protocol (docs/architecture.md, as collectives.h): the launch's epoch is CommControl::epoch
//   + 1, read on the device by every CTA and bumped by the last CTA to finish, so CUDA-graph
//   replay needs no host work. Flags hold epochs, are compared `>= epoch` and never reset. Start
//   barrier (a peer's input is read, or a peer's receive slot written, only after its arrive flag
//   for this epoch) and end barrier (done flags) reuse CommFlags::arrive / done; the fused ops'
//   own flags live in FusedFlags (below). Every fused launch ends by waiting for a flag that each
//   peer writes in its own launch of the same epoch (done), so a rank never runs more than one
//   launch ahead of any peer: the collectives' one-shot slot-reuse argument (collectives.h,
//   CommFlags::ready) holds across interleaved fused ops. Every wait is bounded
//   (comm_protocol.cuh's policy, fused_protocol.cuh): on a timeout or an abort the first waiting
//   CTA fills CommErrorRecord with rank, peer, op (kFusedOp*), step (kCommStepArrive /
//   kCommStepDone or kFusedStep*) and epoch; the kernel then exits normally with incomplete
//   outputs, and the host must discard the SymmetricMemory (raise_if_failed; its message names
//   ops and steps with collectives.h's names, so it prints "?" for the codes below:
//   fused_op_name / fused_step_name on SymmetricMemory::error() give the full names).
// - The fused kernel needs every CTA resident at once (CTAs wait for each other): it is
//   launched cooperatively with at most one CTA per SM, so a launch that cannot be co-resident
//   fails with an error instead of hanging. It takes every SM; work on other streams of the
//   device waits or slows it.
// - The launch is asynchronous; the return value reports argument and launch errors only.
#pragma once

#include <cstdint>

#include "kernels/collectives/collectives.h"

namespace fusedcomm::kernels {

// CommErrorRecord::op and ::step values of the fused ops. From 16 up, so that they never
// collide with collectives.h's CommOp / CommStep (which the fused ops also use for the start
// and end barriers: kCommStepArrive, kCommStepDone).
inline constexpr uint32_t kFusedOpAllGatherGemm = 16;
inline constexpr uint32_t kFusedOpGemmReduceScatter = 17;
inline constexpr uint32_t kFusedOpGemmAllReduce = 18;  // its one-shot kernel (its other paths
                                                       // run the ops they compose)
inline constexpr uint32_t kFusedStepChunk = 16;    // allGatherGemm: a GEMM CTA waited for a
                                                   // gathered chunk (peer = its rows' owner)
inline constexpr uint32_t kFusedStepPartial = 17;  // gemmReduceScatter: an owner waited for a
                                                   // peer's partial half-tile
inline constexpr uint32_t kFusedStepTile = 18;     // gemmAllReduce one-shot: a CTA waited for a
                                                   // rank's partial tile (peer = that rank)

// kFused: the one persistent kernel; kDecomposed: launch_gemm and launch_collective,
// stream-ordered; kOneShot (gemmAllReduce only): its small-M persistent kernel, each tile
// pushed to every rank (gemm_ar.h); kAuto: the choice of fused_choice.h, the same on every rank.
enum class FusedAlgo : uint32_t { kAuto = 0, kFused = 1, kDecomposed = 2, kOneShot = 3 };

// The MoE dispatch's and combine's mode (kernels/moe/moe.h): kLowLatency, one launch for the
// routing and the rows (and one for the combine) for decode-sized batches; kNormal, the launches
// of the normal path (FusedAlgo picks fused or decomposed there); kAuto: fused_choice.h's
// choose_moe_low_latency, the same on every rank.
enum class MoeMode : uint32_t { kAuto = 0, kNormal = 1, kLowLatency = 2 };

// ---- the fused ops' flags in the symmetric region -------------------------------------------
// collectives.h's region layout leaves [kCommControlOffset + sizeof(CommControl),
// kCommStagingOffset) unused; the fused ops keep their flags there, at kFusedFlagsOffset
// (zeroed with the rest of the first kCommStagingOffset bytes when the region is allocated).
// The static_asserts below fail the build if collectives.h's layout grows into it.
inline constexpr uint64_t kFusedFlagsOffset = 32 << 10;
inline constexpr int kFusedMaxChunks = 512;  // allGatherGemm: chunks of one launch
// gemmReduceScatter: flags per owner, (W-1) source slots × half-tile rows × tile columns.
inline constexpr int kFusedRsTileFlags = 112 << 10;

struct alignas(64) FusedFlags {
  // rs_tile[(slot * halves + h - off_r / 64) * n_blocks + n] = e (in owner r's region): source
  // s (slot = s < r ? s : s - 1) has stored launch e's partial of 64-row half h (rows
  // [64h, 64h + 64) ∩ r's rows) × tile column n into r's receive slot for s (RsParams). Written
  // by the pusher warp of s's warpgroup that computed it: every lane's stores (st.global, or
  // red.add into an accumulating slot), then per lane fence.proxy.async.global and
  // fence.sc.sys, __syncwarp, and lane 0's st.release.sys. Read by r's warpgroup that reduces
  // the half-tile: ld.acquire.sys by one thread, then a named barrier and the warpgroup's loads,
  // or that thread's fence.proxy.async.global and the TMA load of the early fetch. A flag is
  // only ever raised to a larger epoch; slots a launch does not use keep older ones.
  // gemmAllReduce's one-shot kernel uses the same array for its tile flags: rs_tile[t * W + s]
  // = e (in rank q's region): rank s has stored launch e's partial of tile t into q's receive
  // slot for s (gemm_ar/detail/ar_oneshot_kernel.cuh). Launches of the two ops never overlap
  // (end barrier), and every flag is compared against its own launch's epoch.
  uint64_t rs_tile[kFusedRsTileFlags];
  // ag_chunk[c] = e: rows [c*chunk_rows, (c+1)*chunk_rows) of this rank's gathered A hold
  // launch e's data. Local only: written by this rank's pulling CTAs, read by its GEMM
  // producers (ld.acquire.gpu, then fence.proxy.async.global before the TMA loads: gemm.h hook
  // 1). Ordering: each slice's stores -> bar.sync -> thread 0 fence.acq_rel.gpu -> atomicAdd
  // on chunk_count[c]; the last of the chunk's slices fences (acquire) and releases the flag
  // (st.release.gpu). The own rows, copied before the launch or read from A_r, are ordered
  // by the stream. A chunk made only of M-blocks read from A_r gets no arrivals and no flag
  // (no tile waits for it); its slot keeps an older epoch.
  uint64_t ag_chunk[kFusedMaxChunks];
  // Arrival counters of the chunks above (slices of an allGatherGemm chunk), and of the K
  // splits of gemmAllReduce's one-shot tiles (chunk_count[t]). Local; the
  // arrival that completes a chunk resets its counter to 0, so every counter is 0 between
  // launches (after a failed launch the region is discarded).
  uint32_t chunk_count[kFusedMaxChunks];
  uint32_t tile_claim;  // the GEMM's dynamic tile counter; reset by the launch's last CTA
  uint32_t role_exit;   // CTAs that finished reading peers' memory; reset by the last of them
  // The copy-engine exchange of allGatherGemm (AgExchange::kCopyEngines; ag_gemm_kernel.cuh
  // ag_ce_role; unused by the SM pulls), one slot per peer: slot i is peer (rank + 1 + i)
  // % W. Local: the side stream of that peer writes n once the copy holding its last rows of
  // the n-th chunk with rows of that peer is complete, then the end mark; the pulling CTA
  // resets every slot to 0 before its kernel ends (after a failed launch the region is
  // discarded).
  uint64_t ce_progress[kCommMaxRanks - 1];
};
static_assert(sizeof(FusedFlags) == 8 * (kFusedRsTileFlags + kFusedMaxChunks) + 4 * kFusedMaxChunks + 64,
              "FusedFlags layout is shared between ranks");
static_assert(kCommControlOffset + sizeof(CommControl) <= kFusedFlagsOffset,
              "FusedFlags overlaps collectives.h's control block");
static_assert(kFusedFlagsOffset + sizeof(FusedFlags) <= kCommStagingOffset,
              "FusedFlags overlaps collectives.h's staging slots");

// How far into the data area and the scratch area (bytes from their starts) an op reaches,
// for either algorithm (kAuto may pick either). SymmetricConfig::data_bytes must be at least
// the larger of the two (both areas are data_bytes long).
struct FusedWorkspace {
  uint64_t data_bytes;
  uint64_t scratch_bytes;
};

// The ranks of a fused op across hosts that runs as one kernel (allGatherGemm,
// gemmReduceScatter; executor-native's CrossHostPaths): one rank per host, the rows split over
// the ranks as everywhere (split_count), the exchange through the proxy's lanes inside the
// kernel, whose blocks are numbered by host.
struct FusedHosts {
  int world, rank;                  // the op's
  int host;                         // this rank's host: the proxy's rank
  int rank_of_host[kCommMaxRanks];  // the rank on each host
};

// What a launch with given arguments would do (benchmarks and logs): *_info() of each op.
struct FusedLaunchInfo {
  FusedAlgo algo;  // kFused, kDecomposed or kOneShot (kAuto resolved)
  int gemm_ctas;   // kFused: CTAs that start on the GEMM
  int comm_ctas;   // kFused: CTAs that pull first (allGatherGemm; gemmReduceScatter: 0)
  int tile_n;      // GEMM tile width
  int chunks;      // kFused: flag chunks (gemmReduceScatter: half-tile flags per owner)
  // kFused gemmReduceScatter: the pusher warps' sleep after every 2 KiB they store, in ns
  // (0: not paced; gemm_rs.cu, rs_push_pace_ns).
  uint32_t push_pace_ns;
  int copy_engines;  // kFused allGatherGemm: 1 if the copy engines move the peers' rows
  // kFused allGatherGemm with the gathered A asked for: 1 if every tile of an own M-block stores
  // a share of its rows into it (ag_gemm/tuning.h: W <= 2 and a large gathered A; ag_gemm.cu
  // ag_store_own), 0 if the tile in column 0 stores them all.
  int spread_stores;
  // kOneShot gemmAllReduce: this rank's K splits per tile (its chunks: tiles; tile_n: the tile
  // width; gemm_ctas: the grid).
  int k_splits;
};

// Names for CommErrorRecord::op / ::step, the collectives' codes included.
inline const char* fused_op_name(uint32_t op) {
  switch (op) {
    case kFusedOpAllGatherGemm: return "allGatherGemm";
    case kFusedOpGemmReduceScatter: return "gemmReduceScatter";
    case kFusedOpGemmAllReduce: return "gemmAllReduce";
    case 19: return "moeDispatchGemm (counts)";  // kernels/moe/moe.h kMoeOp*
    case 20: return "moeDispatchGemm (rows)";
    case 21: return "moeCombine";
    case 22: return "ringAttention";  // kernels/attention/ring.h kRingOp
    case 23: return "ringAttentionBackward";
    case 24: return "moeDispatchGemm (fused)";  // kernels/moe/moe.h kMoeOpFused
    case 25: return "moeGemmCombine (fused)";   // kernels/moe/moe.h kMoeOpGemmCombine
    case 26: return "moeDispatchGemm (low latency)";  // kMoeOpLowLatency
    case 27: return "moeCombine (low latency)";       // kMoeOpLlCombine
    default: return comm_op_name(op);
  }
}
inline const char* fused_step_name(uint32_t step) {
  switch (step) {
    case kFusedStepChunk: return "chunk (gathered rows of A)";
    case kFusedStepPartial: return "partial (a peer's partial product)";
    case kFusedStepTile: return "tile (a rank's partial tile)";
    case 19: return "counts (a peer's per-expert counts)";  // kernels/moe/moe.h kMoeStepCounts
    case 20: return "block (a ring neighbour's K/V block or its read of ours)";  // kRingStepBlock
    case 21: return "rows (an expert's routed rows)";  // kernels/moe/moe.h kMoeStepRows
    case 25: return "combine rows (this rank's combine slots)";  // kMoeStepCombineRows
    case 26: return "layout (this rank's CTA 0 routing the pairs)";  // kMoeStepLlLayout
    case 27: return "arrived (this rank's end barrier)";  // kMoeStepLlArrived
    default: return comm_step_name(step);
  }
}

}  // namespace fusedcomm::kernels
