// Fused GEMM + communication among the processes of one host over NVLink: allGatherGemm and
// gemmReduceScatter, each ONE launch of a persistent kernel (and gemmAllReduce, built from
// gemmReduceScatter, below) in which some CTAs run the GEMM
// engine (gemm.h) and the others move data between ranks' symmetric regions (collectives.h's
// CommDevice, built by executor-native's SymmetricMemory), tile by tile, overlapped.
//
//   allGatherGemm      rank r holds A_r: split_count(M,W,r)×K and W_r; gets
//                      C_r = [A_0; …; A_{W-1}] · op(W_r) : M×N_r  (and optionally the gathered A)
//   gemmReduceScatter  rank r holds A_r: M×K_r and W_r; gets rows block r of
//                      Σ_s A_s · op(W_s) : split_count(M,W,r)×N
//
// op(W) = Wᵀ for W: N×K (GemmLayoutB::kNK, a linear layer's weight: C = A·Wᵀ) or W for W: K×N
// (kKN: C = A·B). bf16 in and out, fp32 accumulation. W = world, r = rank; the row split is
// split.h's rule (rank p gets n/W + (p < n%W) rows starting at p*(n/W) + min(p, n%W)), so M
// need not divide by W nor be a multiple of 128.
//
// Contract (both ops)
// - All ranks launch the same sequence of ops on the CommDevice (collectives and fused ops
//   interleave freely: they share the launch epoch), one stream per rank, with the same M, the
//   same K (allGatherGemm) or N (gemmReduceScatter), and the same `algo` after kAuto is
//   resolved. kAuto decides from values every rank shares (M, K or N, world), so it agrees.
//   N_r (allGatherGemm) and K_r (gemmReduceScatter) may differ by rank; so may the CTA split.
// - Shapes: M >= 1; N, K >= 8 and multiples of 8 (the GEMM contract); dense row-major
//   operands (leading dimension = columns); every pointer and every offset 16-byte aligned.
// - Sizes: the data area and the scratch area (each SymmetricConfig::data_bytes long) must hold
//   what *_workspace() below reports; the launch checks and returns cudaErrorInvalidValue.
// - Input lifetime: when the launch completes in stream order, every peer has finished reading
//   this rank's symmetric memory for it (end barrier): the caller may overwrite its input and
//   workspace right away, and back-to-back launches need no host synchronisation.
// - Numerics: allGatherGemm is exactly launch_gemm on the gathered A (the gathered A is a bit
//   copy). gemmReduceScatter sums the W partial products in fp32 and rounds once to bf16; the
//   partials are kept (and cross NVLink) in fp32 by default (the host backend's rule: the sum
//   is rounded once), or in bf16 with RsPartials::kBF16 (half the bytes in the workspace and
//   over NVLink; each partial is rounded once more, as in cuBLAS + NCCL and PyTorch's
//   symmetric-memory op). The sum is in rank order 0..W-1, so the result is the same on every
//   run and for both algorithms, unless the caller allows any order (RsPartials::kF32AnyOrder):
//   then the fused kernel at W >= 3 lets the peers add their partials into the owner's memory
//   as they arrive (TMA reduce-add), so the fp32 sum's order, and rarely the bf16 result's
//   last bit, can change from run to run.
// - Algorithms (FusedAlgo):
//   kFused: one persistent kernel (detail/fused_gemm.cuh):
//     allGatherGemm: the GEMM reads the M-blocks made only of the rank's own rows from A_r
//       itself; its other own rows (blocks shared with a neighbour's rows, and all of them
//       when the caller asks for the gathered A) go into the gathered buffer by a
//       stream-ordered copy (copy engine) just before the kernel. CTAs [0, G) run the GEMM;
//       CTAs [G, G+P) PULL
//       the peers' rows chunk by chunk (16-byte loads from the peers' data areas, in the order
//       in which the GEMM consumes the rows: its own rows first, which need no pull, then rank
//       r+1's, ...) into the gathered buffer and set a per-chunk flag; the GEMM's producer
//       waits for a tile's chunk flag before loading it.
//       Once a pulling CTA has finished its chunks it joins the GEMM (tiles are claimed from a
//       shared counter), so the SMs lent to communication are not lost for the rest of the op.
//       Or (AgExchange::kCopyEngines, which kAuto takes at W = 2 for N_r <= 4096 or a gathered A of
//       64 MiB or more, when the caller passes side streams) the copy engines pull the peers' rows,
//       one side stream per peer forked from `stream` and joined back into it after the kernel,
//       chunk by chunk in the GEMM's order; a single CTA turns their progress into the chunk flags,
//       and every other SM runs the GEMM (a pulling SM moves ~16 GB/s beside the GEMM, so where the
//       exchange is large against the GEMM the pulls cost it SM time that the copy engines do not).
//     gemmReduceScatter: every CTA runs the GEMM (one per SM). A 64-row half-tile of rows
//       that another rank o owns is PUSHED as soon as it is computed: staged in shared memory
//       and stored over NVLink into o's receive slot for this rank (o's data area at
//       ws_offset) by the warpgroup's pusher warp (a bench build, -DFUSEDCOMM_RS_TMA_PUSH,
//       TMA-stores it instead), then flagged in o's region once the stores are complete. A half-tile of the
//       rank's own rows is reduced in the epilogue: it waits for the W-1 peers' flags of that
//       half-tile, adds their partials (local loads) and its accumulator in rank order and
//       stores the bf16 sums once. Each rank sweeps the tiles of other ranks' rows first
//       (starting with rank r+1's), its own last, so its peers pushed those long before. No
//       partial product is stored where it is computed, and no reduction pass follows the GEMM.
//   kDecomposed: launch_gemm and launch_collective, stream-ordered (allGather then GEMM; GEMM
//     in fp32 to the data area then a reduceScatter of the fp32 partials that writes the
//     bf16-rounded sums: CollectiveArgs::out_bf16; with bf16 partials, GEMM in bf16 then a bf16
//     reduceScatter, which sums in fp32 too). When W does not divide M the collective
//     moves W equal blocks of ceil(M/W) rows (its element split would cut rows), plus one copy
//     to pack or unpack the padded layout. At W = 1 there is nothing to exchange: launch_gemm
//     alone, reading A_r in place (allGatherGemm; the gathered A, when asked for, is a copy of
//     it) or writing the bf16 output itself (gemmReduceScatter; either partial precision reads
//     the same there: fp32 accumulators rounded once).
//   kAuto: the same choice on every rank, from rank-uniform sizes only (fused.cu, choose_*):
//     allGatherGemm fused when the gathered A (M*K*2 bytes) is at least 16 MiB at W = 2, or
//     8 MiB at W = 4, else decomposed (W = 3 and W >= 5: decomposed, not measured);
//     gemmReduceScatter fused at W = 2-4 when M*N >= 2^24 (any partial precision), else
//     decomposed (W >= 5: decomposed). Thresholds from the benchmark (bench/fused/NOTES.md,
//     runs 8 to 11).
// - Protocol (DESIGN.md §3, as collectives.h): the launch's epoch is CommControl::epoch + 1,
//   read on the device by every CTA and bumped by the last CTA to finish, so CUDA-graph replay
//   needs no host work. Flags hold epochs, are compared `>= epoch` and never reset. Start
//   barrier (a peer's A_r is read, or a peer's receive slot written, only after its arrive flag
//   for this epoch) and end barrier (done flags) reuse CommFlags::arrive / done; the fused ops' own flags
//   live in FusedFlags (below). Every fused launch ends by waiting for a flag that each peer
//   writes in its own launch of the same epoch (done), so a rank never runs more than one
//   launch ahead of any peer: the collectives' one-shot slot-reuse argument (collectives.h,
//   CommFlags::ready) holds across interleaved fused ops. Every wait is bounded
//   (comm_protocol.cuh's policy, detail/fused_protocol.cuh): on a timeout or an
//   abort the first waiting CTA fills CommErrorRecord with rank, peer, op (kFusedOp*), step
//   (kCommStepArrive / kCommStepDone or kFusedStep*) and epoch; the kernel then exits normally
//   with incomplete outputs, and the host must discard the SymmetricMemory (raise_if_failed;
//   its message names ops and steps with collectives.h's names, so it prints "?" for the codes
//   below: fused_op_name / fused_step_name on SymmetricMemory::error() give the full names).
// - The fused kernel needs every CTA resident at once (CTAs wait for each other): it is
//   launched cooperatively with at most one CTA per SM, so a launch that cannot be co-resident
//   fails with an error instead of hanging. It takes every SM; work on other streams of the
//   device waits or slows it.
// - The launch is asynchronous; the return value reports argument and launch errors only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "kernels/collectives/collectives.h"
#include "kernels/gemm/gemm.h"

namespace fusedcomm::kernels {

// CommErrorRecord::op and ::step values of the fused ops. From 16 up, so that they never
// collide with collectives.h's CommOp / CommStep (which the fused ops also use for the start
// and end barriers: kCommStepArrive, kCommStepDone).
inline constexpr uint32_t kFusedOpAllGatherGemm = 16;
inline constexpr uint32_t kFusedOpGemmReduceScatter = 17;
inline constexpr uint32_t kFusedStepChunk = 16;    // allGatherGemm: a GEMM CTA waited for a
                                                   // gathered chunk (peer = its rows' owner)
inline constexpr uint32_t kFusedStepPartial = 17;  // gemmReduceScatter: an owner waited for a
                                                   // peer's partial half-tile

enum class FusedAlgo : uint32_t { kAuto = 0, kFused = 1, kDecomposed = 2 };

// gemmReduceScatter's partial products: their precision in the workspace and over NVLink. The
// sum is fp32 either way. kBF16 adds at most 2^-9 · Σ_s |partial_s| per output element to the
// error (one rounding per partial), and halves the exchanged bytes. kF32AnyOrder: fp32 partials
// whose sum may be taken in any order (the fused kernel at W >= 3 lets the peers add into the
// owner's memory as they arrive: one slot to read instead of W-1); the result may then differ
// in the last bits from run to run. Elsewhere it is kF32.
enum class RsPartials : uint32_t { kF32 = 0, kBF16 = 1, kF32AnyOrder = 2 };

// ---- the fused ops' flags in the symmetric region -------------------------------------------
// collectives.h's region layout leaves [kCommControlOffset + sizeof(CommControl),
// kCommStagingOffset) unused; the fused ops keep their flags there, at kFusedFlagsOffset
// (zeroed with the rest of the first kCommStagingOffset bytes when the region is allocated).
// The static_asserts below fail the build if collectives.h's layout grows into it.
inline constexpr uint64_t kFusedFlagsOffset = 32 << 10;
inline constexpr int kFusedMaxChunks = 512;     // allGatherGemm: chunks of one launch
// gemmReduceScatter: flags per owner, (W-1) source slots × half-tile rows × tile columns.
inline constexpr int kFusedRsTileFlags = 112 << 10;
// gemmReduceScatter, fused: each receive slot starts with this many rows of padding, so that a
// half-tile that begins before the owner's first row is still one TMA box at a row coordinate
// >= 0 (its rows of the previous owner land in the padding, which nobody reads).
inline constexpr int kFusedRsSlotPadRows = 64;

struct alignas(64) FusedFlags {
  // rs_tile[(slot * halves + h - off_r / 64) * n_blocks + n] = e (in owner r's region): source
  // s (slot = s < r ? s : s - 1) has stored launch e's partial of 64-row half h (rows
  // [64h, 64h + 64) ∩ r's rows) × tile column n into r's receive slot for s (RsParams). Written
  // by the pusher warp of s's warpgroup that computed it: every lane's stores (st.global, or
  // red.add into an accumulating slot), then per lane fence.proxy.async.global and
  // fence.sc.sys, __syncwarp, and lane 0's st.release.sys. (The TMA-push bench build: the
  // issuing thread's cp.async.bulk.wait_group, fence.proxy.async, fence.sc.sys, release.) Read
  // by r's warpgroup that reduces the half-tile: ld.acquire.sys by one thread, then a named
  // barrier and the warpgroup's loads, or that thread's fence.proxy.async.global and the TMA
  // load of the early fetch. A flag is only ever raised to a larger epoch;
  // slots a launch does not use keep older ones.
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
  // Arrival counters of the chunks above (slices of an allGatherGemm chunk). Local; the
  // arrival that completes a chunk resets its counter to 0, so every counter is 0 between
  // launches (after a failed launch the region is discarded).
  uint32_t chunk_count[kFusedMaxChunks];
  uint32_t tile_claim;  // the GEMM's dynamic tile counter; reset by the launch's last CTA
  uint32_t role_exit;   // CTAs that finished reading peers' memory; reset by the last of them
  // The copy-engine exchange of allGatherGemm (AgExchange::kCopyEngines; fused_gemm.cuh
  // ag_ce_role; unused by the SM pulls), one slot per peer: slot i is peer (rank + 1 + i)
  // % W. Local: the side stream of that peer writes n once the copy holding its last rows of
  // the n-th chunk with rows of that peer is complete, then the end mark; the pulling CTA
  // resets every slot to 0 before its kernel ends (after a failed launch the region is
  // discarded).
  uint64_t ce_progress[kCommMaxRanks - 1];
};
static_assert(sizeof(FusedFlags) == 8 * (kFusedRsTileFlags + kFusedMaxChunks) +
                                        4 * kFusedMaxChunks + 64,
              "FusedFlags layout is shared between ranks");
static_assert(kCommControlOffset + sizeof(CommControl) <= kFusedFlagsOffset,
              "FusedFlags overlaps collectives.h's control block");
static_assert(kFusedFlagsOffset + sizeof(FusedFlags) <= kCommStagingOffset,
              "FusedFlags overlaps collectives.h's staging slots");

// ---- arguments ------------------------------------------------------------------------------
// allGatherGemm's exchange in the fused kernel (contract above, "kFused").
//   kSmPulls      pulling CTAs move the peers' rows, then join the GEMM;
//   kCopyEngines  the copy engines move them on side streams (AgGemmArgs::side, required);
//   kAuto         kCopyEngines at W = 2 where N_r <= 4096 or M·K·2 >= 64 MiB and side streams were
//                 given, else kSmPulls (run 17, 2 x H200: 0.926 x the SM pulls' time at square
//                 8192, N_r = 4096; run 33: 0.982-0.998 x at the wider shapes from 64 MiB of
//                 gathered A, run 20: 1.004-1.011 x at 32 MiB; at W = 4 one stream per peer lost up
//                 to 1.46 x, run 18). A rank-local choice: ranks that differ interoperate (both
//                 start with the same barrier and end with the same done flags), so kAuto also
//                 falls back to SM pulls where the side streams cannot be made (the launch makes
//                 them first; a forced kCopyEngines returns that error instead). The fallback
//                 sticks to that FusedSideStreams (FusedSideStreams::usable), so that
//                 all_gather_gemm_info reports it for every later launch.
enum class AgExchange : uint32_t { kAuto = 0, kSmPulls = 1, kCopyEngines = 2 };

// The side streams of allGatherGemm's copy-engine exchange: one per peer slot, a join event per
// stream and a fork event, made on the current device at the first launch that uses them and kept
// until destruction. Pass them only where every peer's memory is on another GPU: a copy within
// one GPU may run as a kernel, which the fused kernel's cooperative grid (every SM) starves until
// the chunk waits time out (seen with every rank on one H200, run 20). A communicator owns one (executor-native's DeviceComm) and passes it to
// every allGatherGemm; one launching thread at a time, always the same device. Destroying it with
// copies still queued is safe (CUDA releases a stream once its work is done), but the
// communicator's stream must not be waited on through a destroyed object.
class FusedSideStreams {
 public:
  FusedSideStreams() = default;
  ~FusedSideStreams();
  FusedSideStreams(const FusedSideStreams&) = delete;
  FusedSideStreams& operator=(const FusedSideStreams&) = delete;

  // fused.cu: the streams and events for `world - 1` peers on the current device, created on
  // first use; cudaErrorInvalidDevice if it was made on another device. A failure marks the
  // object unusable: kAuto then takes the SM pulls without asking again (a rank-local choice,
  // so a rank may differ from its peers); only a forced kCopyEngines asks again, and its
  // success makes the object usable again.
  cudaError_t prepare(int world);
  // False after a failed prepare: kAuto's launches and all_gather_gemm_info take SM pulls.
  bool usable() const { return !failed_; }
  cudaStream_t stream(int slot) const { return streams_[slot]; }
  cudaEvent_t join(int slot) const { return joins_[slot]; }
  cudaEvent_t fork() const { return fork_; }
  void* write_value() const { return write_value_; }  // cuStreamWriteValue64, from the driver

 private:
  int device_ = -1;
  cudaStream_t streams_[kCommMaxRanks - 1] = {};  // slot i pulls peer (rank + 1 + i) % W
  cudaEvent_t joins_[kCommMaxRanks - 1] = {};
  cudaEvent_t fork_ = nullptr;
  void* write_value_ = nullptr;
  bool failed_ = false;

  cudaError_t make(int world);  // prepare's work
};

struct AgGemmArgs {
  int M = 0;  // rows of the gathered A and of C (same on every rank)
  int N = 0;  // N_r: columns of this rank's C (rows of W_r in kNK)
  int K = 0;  // same on every rank
  // A_r (split_count(M,W,r) × K bf16, dense) sits at this byte offset of the data area, the
  // same offset on every rank. The data area must extend ceil(M/W) rows past it (the
  // decomposed path's collective moves equal blocks).
  uint64_t in_offset = 0;
  const __nv_bfloat16* B = nullptr;  // W_r: N×K (kNK) or K×N (kKN), this process's memory
  GemmLayoutB b_layout = GemmLayoutB::kNK;
  __nv_bfloat16* C = nullptr;        // M×N, this process's memory
  // Optional output M×K: the gathered A. Null: the gathered A is built in this rank's scratch
  // area (from its offset 0), which the op then overwrites.
  __nv_bfloat16* gathered = nullptr;
  FusedAlgo algo = FusedAlgo::kAuto;
  int comm_ctas = 0;  // kFused SM pulls: CTAs that pull A (0: the table in fused.cu; clamped to
                      // 1..SMs/2). The copy-engine exchange takes one.
  // kFused: how the peers' rows move (AgExchange); kCopyEngines needs `side`.
  AgExchange exchange = AgExchange::kAuto;
  FusedSideStreams* side = nullptr;  // the copy-engine exchange's streams; null: SM pulls
  // kFused, benches and tests: the GEMM and the pulls take the peers' M-blocks in turn (1) or
  // peer after peer (0); -1: in turn with the copy engines (their streams pull every peer at
  // once), else peer after peer. Honoured at W >= 3 where a flag chunk is one M-block
  // (M <= 128 * kFusedMaxChunks).
  int interleave_peers = -1;
  // kDecomposed: a stream-K workspace for its GEMM (gemm.h; this process's memory, launches
  // that share it stream-ordered); the fused kernel has no use for one.
  GemmWorkspace gemm_ws{};
};

struct GemmRsArgs {
  int M = 0;  // rows of every partial product (same on every rank)
  int N = 0;  // columns of the partial products and of the output (same on every rank)
  int K = 0;  // K_r: this rank's inner dimension (may differ by rank)
  const __nv_bfloat16* A = nullptr;  // M×K, this process's memory
  const __nv_bfloat16* B = nullptr;  // W_r: N×K (kNK) or K×N (kKN), this process's memory
  GemmLayoutB b_layout = GemmLayoutB::kNK;
  // Workspace at this byte offset of the data area, the same offset on every rank (size:
  // gemm_reduce_scatter_workspace). Decomposed: this rank's partial product (M×N; W*ceil(M/W) ×
  // N when W does not divide M), which peers read. Fused: W-1 receive slots of
  // kFusedRsSlotPadRows + ceil(M/W) rows, where peers write their partials of this rank's rows
  // (W >= 3 with kF32AnyOrder: one such slot, which they add into).
  uint64_t ws_offset = 0;
  __nv_bfloat16* out = nullptr;  // split_count(M,W,r) × N, this process's memory
  FusedAlgo algo = FusedAlgo::kAuto;
  RsPartials partials = RsPartials::kF32;  // same on every rank (part of the launch signature)
  GemmWorkspace gemm_ws{};  // kDecomposed's GEMM, as AgGemmArgs::gemm_ws
};

// How far into the data area and the scratch area (bytes from their starts) an op reaches,
// for either algorithm (kAuto may pick either). SymmetricConfig::data_bytes must be at least
// the larger of the two (both areas are data_bytes long).
struct FusedWorkspace {
  uint64_t data_bytes;
  uint64_t scratch_bytes;
};
FusedWorkspace all_gather_gemm_workspace(const AgGemmArgs& args, int world);
FusedWorkspace gemm_reduce_scatter_workspace(const GemmRsArgs& args, int world);

// What a launch with these arguments would do (benchmarks and logs).
struct FusedLaunchInfo {
  FusedAlgo algo;  // kFused or kDecomposed (kAuto resolved)
  int gemm_ctas;   // kFused: CTAs that start on the GEMM
  int comm_ctas;   // kFused: CTAs that pull first (allGatherGemm; gemmReduceScatter: 0)
  int tile_n;      // GEMM tile width
  int chunks;      // kFused: flag chunks (gemmReduceScatter: half-tile flags per owner)
  // kFused gemmReduceScatter: the pusher warps' sleep after every 2 KiB they store, in ns
  // (0: not paced; fused.cu, rs_push_pace_ns).
  uint32_t push_pace_ns;
  int copy_engines;  // kFused allGatherGemm: 1 if the copy engines move the peers' rows
  // kFused allGatherGemm with the gathered A asked for: 1 if every tile of an own M-block stores
  // a share of its rows into it (W <= 2, M·K·2 >= 256 MiB; fused.cu ag_store_own), 0 if the
  // tile in column 0 stores them all.
  int spread_stores;
};
FusedLaunchInfo all_gather_gemm_info(const CommDevice& dev, const AgGemmArgs& args);
FusedLaunchInfo gemm_reduce_scatter_info(const CommDevice& dev, const GemmRsArgs& args);

// allGatherGemm's sweep, for these arguments: the flag chunks in the order the GEMM takes
// their M-blocks and the pulls move them (fused_gemm.cuh ag_sweep_chunk); with the peers
// interleaved (AgGemmArgs::interleave_peers) a chunk is one M-block. Empty for bad arguments.
std::vector<int> all_gather_gemm_sweep(const CommDevice& dev, const AgGemmArgs& args);

// gemmReduceScatter's spread sweep, a bench build (FUSEDCOMM_RS_SPREAD; fused_gemm.cuh
// rs_spread_coord): the (M-block, tile column) at each sweep position of rank `rank` of
// `world`, whose rows are M-blocks [rank * blocks_per_rank, +blocks_per_rank), with `n_blocks`
// columns and raster groups of `group` M-blocks. The same function in every build, so that
// fused_geometry_test checks it on the CPU. Empty for bad arguments.
std::vector<std::pair<int, int>> gemm_reduce_scatter_spread_sweep(int world, int rank,
                                                                  int blocks_per_rank,
                                                                  int n_blocks, int group);

// allGatherGemm's exchange on the copy engines (AgExchange::kCopyEngines; fused.cu ag_ce_steps,
// fused_gemm.cuh ag_ce_role): the steps of the side stream that pulls peer
// `from`'s rows, for these arguments, in order, copies merged up to `copy_bytes`. Its
// positions are the chunks that hold rows of `from`, in the GEMM's order. peer >= 0 (always
// `from`): copy rows [row0, row1) of the gathered A from that peer's input; peer < 0: write
// that peer's ce_progress slot = progress (its rows of every chunk at a position <= progress
// are then complete; the last step, the end mark, is the position count + 1). position_rows,
// if not null, gets the rows [r0, r1) of each position's chunk. Empty for from == rank or
// out of range. The same function in every build, so that fused_geometry_test checks it on
// the CPU.
struct AgCeStep {
  int peer;
  int64_t row0, row1;
  uint64_t progress;
};
std::vector<AgCeStep> all_gather_gemm_ce_plan(
    const CommDevice& dev, const AgGemmArgs& args, int from, int64_t copy_bytes,
    std::vector<std::pair<int64_t, int64_t>>* position_rows = nullptr);

// Enqueue one op on `stream` (contract above). cudaErrorInvalidValue for bad arguments.
cudaError_t launch_all_gather_gemm(const CommDevice& dev, const AgGemmArgs& args,
                                   cudaStream_t stream);
cudaError_t launch_gemm_reduce_scatter(const CommDevice& dev, const GemmRsArgs& args,
                                       cudaStream_t stream);

// Names for CommErrorRecord::op / ::step, the collectives' codes included.
inline const char* fused_op_name(uint32_t op) {
  switch (op) {
    case kFusedOpAllGatherGemm: return "allGatherGemm";
    case kFusedOpGemmReduceScatter: return "gemmReduceScatter";
    default: return comm_op_name(op);
  }
}
inline const char* fused_step_name(uint32_t step) {
  switch (step) {
    case kFusedStepChunk: return "chunk (gathered rows of A)";
    case kFusedStepPartial: return "partial (a peer's partial product)";
    default: return comm_step_name(step);
  }
}

// ---- gemmAllReduce ---------------------------------------------------------------------------
// Rank r holds A_r: M×K_r and W_r (as gemmReduceScatter); every rank gets the whole
// Σ_s A_s · op(W_s) : M×N, the same bits on every rank. No kernel of its own: two or three
// launches on the stream, chosen by kAuto from rank-uniform values (M, N, W, the partials):
//   kFused: gemmReduceScatter's fused kernel (above) writes this rank's row block of the sum
//     into its data area right after the reduce-scatter workspace (gemm_all_reduce_workspace),
//     then an allGather of those blocks fills C. The GEMM overlaps the reduce-scatter half of
//     an allReduce's traffic; only the gather's half is left after it. Needs W to divide M
//     (the allGather splits elements) and the fused reduce-scatter to fit; kAuto takes it
//     where gemmReduceScatter's kAuto would take its fused kernel at W = 2 (large M·N),
//     and at W = 4 with bf16 partials from M·N = 2^25.
//   kDecomposed: launch_gemm writes the partial product into the data area at ws_offset
//     (bf16, or fp32), then an allReduce of it: into C (bf16 partials: fp32 sums rounded once
//     more), or into `sums` (fp32) and one pass rounds them into C.
// Numerics as gemmReduceScatter (the fused kernel keeps the owner's own bf16-partials term in
// fp32), sums in rank order. Input lifetime and the protocol: those of the two ops it runs.
struct GemmArArgs {
  int M = 0;  // rows of A_r and of C (same on every rank)
  int N = 0;  // columns of C (same on every rank)
  int K = 0;  // K_r: this rank's inner dimension (may differ by rank)
  const __nv_bfloat16* A = nullptr;  // M×K, this process's memory
  const __nv_bfloat16* B = nullptr;  // W_r: N×K (kNK) or K×N (kKN), this process's memory
  GemmLayoutB b_layout = GemmLayoutB::kNK;
  uint64_t ws_offset = 0;           // the workspace's byte offset in the data area (same on every rank)
  __nv_bfloat16* C = nullptr;       // M×N, this process's memory
  float* sums = nullptr;            // M×N fp32, this process's memory: kDecomposed with fp32 partials
  FusedAlgo algo = FusedAlgo::kAuto;
  RsPartials partials = RsPartials::kF32;  // kF32AnyOrder: as kF32 (fused: W = 2, or W = 4 with kBF16)
  GemmWorkspace gemm_ws{};  // the GEMM of kDecomposed and of W = 1, as AgGemmArgs::gemm_ws
};
// The data and scratch bytes of `args.algo` (kAuto: the larger of the two paths).
FusedWorkspace gemm_all_reduce_workspace(const GemmArArgs& args, int world);
FusedLaunchInfo gemm_all_reduce_info(const CommDevice& dev, const GemmArArgs& args);
cudaError_t launch_gemm_all_reduce(const CommDevice& dev, const GemmArArgs& args, cudaStream_t stream);

// ---- test support -----------------------------------------------------------------------------
// The obviously-correct reference for tests and benchmark spot checks (not for production):
// one thread per output element, fp32 sum over k in order. For i < M, j < N:
//   ref[i*N + j]    (+)= Σ_k A[i*lda + k] · B(k, j)      (B(k,j) = B[j*ldb + k] for kNK,
//   absdot[i*N + j] (+)= Σ_k |A[i*lda + k] · B(k, j)|     B[k*ldb + j] for kKN)
// accumulating into the existing values when `accumulate`, else overwriting; absdot may be
// null. For gemmReduceScatter's reference call it once per source rank with accumulate.
cudaError_t launch_reference_gemm(const __nv_bfloat16* A, int64_t lda, const __nv_bfloat16* B,
                                  int64_t ldb, GemmLayoutB b_layout, int M, int N, int K,
                                  float* ref, float* absdot, bool accumulate,
                                  cudaStream_t stream);

}  // namespace fusedcomm::kernels
