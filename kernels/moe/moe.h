// Expert parallelism on the GPU among the processes of one host over NVLink: moeDispatchGemm
// (route each token's top-k rows to the ranks owning the experts, then the grouped GEMM of the
// received rows with each expert's W1) and moeCombine (send expert rows home, weighted sum per
// token), over the symmetric memory of collectives.h (CommDevice). Contracts: docs/ops.md.
//
// W = world, r = rank, E experts split over ranks by split.h's rule (rank p owns experts
// [split_offset(E, W, p), + split_count(E, W, p))), T_r tokens on rank r (may differ, may be 0),
// k = topk. Each (token, slot) pair is one routed row.
//
// Dispatch: launch_moe_dispatch enqueues, on one stream and with no host round trip:
//   1. counts (local): per chunk of pairs, per expert, the pairs' count and each pair's rank
//      among its chunk's pairs of the same expert (stable: pair order), and any expert id outside
//      [0, E) (the first one is kept);
//   2. the count exchange (one CTA, a launch of the CommDevice's epoch sequence): this rank's E
//      per-expert totals, its token count and whether it saw a bad id go into every peer's staging
//      slot [epoch & 1][r] (collectives.h), released by CommFlags::ready[r][0]; every rank then
//      holds the whole W × E count matrix and derives, identically: each owner's row count
//      (overflow if above `capacity`), each owner's expert offsets, and for this rank as a sender
//      the first row of (expert e, source r) at e's owner. Rows at an owner are ordered by
//      (local expert, source rank, token, slot) (docs/ops.md), so that first row is the owner's
//      rows of the experts before e plus the rows of e from ranks below r;
//   3. the rows (a launch of the epoch sequence): every pair's token row goes to its owner's data
//      area at its row (16-byte NVLink stores) with its identity (source rank, token, slot,
//      weight) beside it; the last CTA then tells every peer (CommFlags::done[r]) and waits until
//      every peer has told it (end barrier: all rows for this rank have arrived);
//   4. unpack (local): the received identities into MoeDeviceLayout, the rows into `routed_x`;
//   5. the grouped GEMM (launch_grouped_gemm) of the received rows, read in place in the data
//      area, with the local experts' W1 into `out`.
// Fused (MoeDispatchArgs::algo = kFused; kAuto: fused_choice.h's choose_moe_dispatch_gemm, from
// the world only, so every rank agrees; it takes the decomposed path for now, see there): steps
// 1-2 as above (the count exchange also lays out a send list: this rank's pairs by expert, the
// experts in moe_layout.h's moe_for_send_order, every owner's first local expert first), then
// ONE persistent kernel per rank (cooperative, at most one CTA per SM; MoeDispatchArgs::
// fused_ctas caps its grid) in place of steps 3 and 5:
//   - CTAs [G, G + P) store rows: work item i = send list positions [i · item_rows, (i + 1) ·
//     item_rows) (~1 MiB of rows), taken by the P CTAs in turn; the CTA's threads work out the
//     rows' places (as step 3) and store their identities, its thread 0 streams the rows
//     through shared-memory stages with bulk copies (global -> shared -> the owner's data area);
//     then for each run of one expert in the item, one red.release.sys.add of the run's length
//     to that expert's arrival counter at its owner (kMoeFlagsOffset). A CTA done with its
//     items tells the peers (the last of the P raises CommFlags::done[r] at every peer) and
//     joins the GEMM.
//   - CTAs [0, G) run the grouped GEMM (the engine over launch_grouped_gemm's block table, the
//     table built just before the kernel from the expert offsets); before loading a tile the
//     producer waits until its expert's counter reaches the expert's row count (every source's
//     rows; ld.acquire, bounded: kMoeOpFused / kMoeStepRows, peer = a source of that expert),
//     so the first experts' tiles start while the later experts' rows are still moving.
//   - The last CTA to finish waits for every peer's done (all rows for this rank stored),
//     compares the signatures, resets this rank's counters and publishes the epoch; step 4
//     (unpack) follows as its own launch. No start barrier: a peer's data area and counters are
//     free once its count exchange has raised its ready flag (seen before this kernel started).
//   The SM split: P = 32 dispatch CTAs by default (MoeDispatchArgs::dispatch_ctas), G = the
//   rest; docs/performance.md "MoE fused dispatch" has the W = 1 measurement. A rank with no
//   GEMM (no local expert, or out == null) runs the same protocol in a kernel of dispatch CTAs
//   only (register copies, one warp per row).
// Low latency (MoeDispatchArgs::mode = kLowLatency; kAuto: fused_choice.h's
// choose_moe_low_latency, for decode-sized capacities): steps 1-4 in ONE cooperative kernel
// (a launch of the epoch sequence; grid sized to the rows, capped by fused_ctas), then step 5:
//   - CTA 0 counts the pairs (each warp a contiguous chunk, __match_any_sync as step 1, the
//     chunks' counts in shared memory), runs the count exchange of step 2 (staging slots,
//     ready flags, bounded waits, signatures), derives the layout and status, writes every
//     pair's row at its owner into the workspace, and releases kMoeLlFlagsOffset's ll[0]
//     (local); the other CTAs wait for it (bounded, kMoeStepLlLayout);
//   - every CTA stores rows as step 3 (one warp per pair, 16-byte stores, identity beside it);
//   - the last CTA runs the end barrier (done flags to and from every peer, signatures) and
//     releases ll[1]; every CTA waits for it (bounded, kMoeStepLlArrived) and unpacks a share
//     of the received rows (step 4).
//   The same rows, identities and layout as the normal path (routed_x bit for bit); a bad id
//   or an overflow as there (every rank agrees, no row moves). Epochs only: back-to-back
//   launches and graph replay need no reset. The combine's low-latency kernel
//   (MoeCombineArgs::mode) is likewise one launch: start barrier, rows home, end barrier
//   (the last CTA releases ll[1]), then every CTA computes its share of the weighted sums.
// A bad expert id or an overflow is reported in MoeDeviceLayout::status on every rank (all
// ranks derive it from the same matrix) and no row moves; every rank still runs each launch's
// protocol, so nothing hangs. The host reads the status after synchronising (a clear error,
// never a silent drop).
//
// Combine: launch_moe_combine enqueues
//   1. the rows (a launch of the epoch sequence): start barrier (CommFlags::arrive: each home
//      rank's data area is free), then row i of `expert_out` goes to its home rank's data area
//      at slot (token · k + slot); end barrier (CommFlags::done);
//   2. the sum (local): out[t] = Σ_slot topk_weights[t, slot] · row(t, slot), fp32 products and
//      sums (no fused multiply-add: the host backend's arithmetic), slot order, rounded once.
//
// Protocol (collectives.h, fused.h): every launch that communicates takes the next epoch of the
// CommDevice (CommControl::epoch + 1, read on the device, bumped by its last CTA), so MoE
// launches interleave with the collectives and the fused ops; back-to-back launches and CUDA
// graph replay need no host work. Each ends by waiting for a flag that every peer writes in its
// launch of the same epoch (ready, done), so no rank runs more than one launch ahead: the
// staging slots' reuse argument holds. A peer writes this rank's data area only after a flag
// this rank raised once its earlier work on the stream had completed (the count exchange before
// the rows; arrive before the combine's rows). Every wait is bounded (comm_protocol.cuh): a
// timeout, an abort or a peer in another op fills the CommErrorRecord (op kMoeOp*, step
// kMoeStep* or kCommStepArrive / kCommStepDone); SymmetricMemory::raise_if_failed throws.
// Where every CTA of a launch waits for the same event (the combines' start barrier, the
// low-latency kernels' ll flags, the fused moeGemmCombine's start and row count), one thread
// leads with those checks and the other CTAs follow reading only this GPU's memory (moe.cu
// moe_follow_flag): the abort word is host memory, whose reads the GPU serves one at a time.
//
// Requirements (else cudaErrorInvalidValue): bf16 rows; hidden, ffn and width multiples of 8 (16-byte
// rows; hidden, ffn >= 8 for the GEMM); x, w1, routed_x, out, expert_out 16-byte aligned;
// 1 <= E <= kMoeMaxExperts; 1 <= topk <= kMoeMaxTopk; E · 4 + 64 bytes within a staging slot;
// the data area holds moe_dispatch_data_bytes(capacity, hidden) (dispatch) and
// moe_combine_data_bytes(max over ranks of T_s, topk, width) (combine; checked on the device
// against every rank's T_s, reported in the status).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/collectives/collectives.h"
#include "kernels/common/fused.h"
#include "kernels/gemm/gemm.h"

namespace fusedcomm::kernels {

inline constexpr int kMoeMaxExperts = 1024;
inline constexpr int kMoeMaxTopk = 64;

// CommErrorRecord::op of the MoE launches (after fused.h's 16, 17) and ::step of their waits.
inline constexpr uint32_t kMoeOpCounts = 19;    // dispatch: the count exchange
inline constexpr uint32_t kMoeOpRows = 20;      // dispatch: the rows
inline constexpr uint32_t kMoeOpCombine = 21;   // combine: the rows back home
inline constexpr uint32_t kMoeStepCounts = 19;  // a peer's counts never came
// (the rows' and the combine's barriers use kCommStepArrive / kCommStepDone)
inline constexpr uint32_t kMoeOpFused = 24;   // dispatch: the rows and the GEMM in one kernel
inline constexpr uint32_t kMoeStepRows = 21;  // fused: a GEMM CTA waited for an expert's rows
                                              // (peer: a source of them; epoch: the rows
                                              // awaited; observed: the rows arrived)

// The fused dispatch's arrival counters (MoeDispatchArgs::algo), in the symmetric region's
// unused bytes after FusedFlags: rows_arrived[i] (uint64) = rows of local expert i stored into
// this rank's data area so far in the current launch. Written by every source's dispatch CTAs
// (red.release.sys.add of a run's row count after its rows, over NVLink), read by this rank's
// GEMM producers (ld.acquire, then the TMA loads). The launch's last CTA resets them to 0 after
// the end barrier (every source's adds precede its done flag), so they are 0 between launches
// (zeroed with the region; after a failed launch the region is discarded).
inline constexpr uint64_t kMoeFlagsOffset = (kFusedFlagsOffset + sizeof(FusedFlags) + 255) / 256 * 256;
static_assert(kMoeFlagsOffset + kMoeMaxExperts * sizeof(uint64_t) <= kCommStagingOffset,
              "the MoE arrival counters overlap collectives.h's staging slots");

// The fused moeGemmCombine's arrival counter (MoeGemmCombineArgs::algo), after the dispatch's:
// combine_arrived (uint64) = row elements (rows × columns) of this rank's combine slots stored
// so far in the current launch, by every rank's GEMM epilogue (red.release.sys.add after each
// half-tile's stores). This rank's weighted sum waits until it reaches T · topk · width. Reset
// to 0 by the launch's last CTA after the end barrier (zero between launches).
inline constexpr uint64_t kMoeCombineFlagOffset = kMoeFlagsOffset + kMoeMaxExperts * sizeof(uint64_t);
static_assert(kMoeCombineFlagOffset + sizeof(uint64_t) <= kCommStagingOffset,
              "the MoE combine counter overlaps collectives.h's staging slots");
// The low-latency kernels' grid-local flags (MoeMode::kLowLatency), after the combine counter:
// ll[0] = e: CTA 0 of launch e has written the dispatch's layout and every pair's row (the
// other CTAs wait for it before storing rows); ll[1] = e: launch e's end barrier has passed
// (every peer's rows are here; the CTAs then unpack, or sum in the combine). Local only:
// st.release.gpu by one thread after a __threadfence, ld.acquire.gpu by each CTA's thread 0.
// Epoch-valued, so never reset (zero with the region; a launch only ever raises them).
inline constexpr uint64_t kMoeLlFlagsOffset = (kMoeCombineFlagOffset + sizeof(uint64_t) + 63) / 64 * 64;
static_assert(kMoeLlFlagsOffset + 2 * sizeof(uint64_t) <= kCommStagingOffset,
              "the MoE low-latency flags overlap collectives.h's staging slots");
inline constexpr uint32_t kMoeOpLowLatency = 26;     // the low-latency dispatch kernel
inline constexpr uint32_t kMoeOpLlCombine = 27;      // the low-latency combine kernel
inline constexpr uint32_t kMoeStepLlLayout = 26;     // a CTA waited for CTA 0's layout (ll[0])
inline constexpr uint32_t kMoeStepLlArrived = 27;    // a CTA waited for the end barrier (ll[1])
inline constexpr uint32_t kMoeOpGemmCombine = 25;    // moeGemmCombine's fused kernel
inline constexpr uint32_t kMoeStepCombineRows = 25;  // fused combine: the weighted sum waited for
                                                     // its slots (peer: a rank still storing;
                                                     // epoch: the elements awaited; observed:
                                                     // the elements arrived)

// MoeStatus::code.
enum MoeStatusCode : int32_t {
  kMoeOk = 0,
  kMoeBadExpert = 1,    // rank `rank` routed pair `a` (token · k + slot) to expert id `b`
  kMoeOverflow = 2,     // rank `rank` would receive `a` rows, more than the capacity `b`
  kMoeCombineArea = 3,  // rank `rank`'s T · k · width · 2 = `a` bytes exceed the data area `b`
  kMoeProtocol = 4,     // a wait gave up (the CommErrorRecord says where)
};
struct alignas(16) MoeStatus {
  int32_t code;
  int32_t rank;
  int64_t a, b;
  int64_t reserved;
};
static_assert(sizeof(MoeStatus) == 32, "MoeStatus is read by the host");

// A dispatch's result as the owner of the experts keeps it on the device (docs/ops.md's
// MoeLayout). capacity = MoeDispatchArgs::capacity.
struct MoeDeviceLayout {
  int64_t* expert_offsets;  // local_experts + 1 row offsets (the last is the row count)
  int32_t* src_rank;        // capacity each: per received row
  int32_t* src_token;
  int32_t* src_slot;
  float* weight;
  int32_t* counts;    // W × E: counts[s * E + e] = pairs rank s routed to expert e
  int32_t* tokens;    // W: every rank's T_s
  MoeStatus* status;  // one
};

struct MoeDispatchArgs {
  const __nv_bfloat16* x = nullptr;  // tokens × hidden
  int64_t tokens = 0;
  int hidden = 0;
  const int32_t* topk_ids = nullptr;    // tokens × topk, device
  const float* topk_weights = nullptr;  // tokens × topk, device
  int topk = 0;
  int num_experts = 0;
  // Local experts' W1: local_experts × ffn × hidden (kNK) or local_experts × hidden × ffn (kKN).
  // kKN with hidden not a multiple of 64: the last K slice of expert i also reads the first rows
  // of expert i + 1's weight, multiplied by zeros (finite weights assumed).
  const __nv_bfloat16* w1 = nullptr;
  int ffn = 0;
  GemmLayoutB w1_layout = GemmLayoutB::kNK;
  // Rows this rank can receive: the outputs' rows and the data area's receive buffer. The same
  // on every rank (part of the launch signature). A larger count is reported (kMoeOverflow).
  int64_t capacity = 0;
  __nv_bfloat16* routed_x = nullptr;  // capacity × hidden; null: not copied out
  __nv_bfloat16* out = nullptr;       // capacity × ffn; null: no GEMM (dispatch only)
  MoeDeviceLayout layout{};
  void* workspace = nullptr;  // moe_dispatch_workspace_bytes, 256-byte aligned
  size_t workspace_bytes = 0;
  int gemm_ctas = 0;  // the grouped GEMM's CTAs (0: one per SM); the fused kernel: ignored
  // kFused: the rows and the grouped GEMM in one persistent kernel (moe.h's header, "Fused");
  // kDecomposed: steps 3-5 as separate launches; kAuto: fused_choice.h's choose_moe_dispatch_gemm
  // (rank-uniform inputs only, so every rank takes the same path).
  FusedAlgo algo = FusedAlgo::kAuto;
  // kFused: CTAs that store rows before they join the GEMM (0: the rule of moe.h's header) and
  // the kernel's whole grid (0: one CTA per SM). Ranks sharing a GPU (tests) cap the grid so
  // that every rank's persistent kernel fits at once.
  int dispatch_ctas = 0;
  int fused_ctas = 0;  // also the low-latency kernel's grid cap
  // kLowLatency: the routing and the rows in one launch (moe.h's header, "Low latency"), then
  // the grouped GEMM; kNormal: `algo` above; kAuto: fused_choice.h's choose_moe_low_latency
  // (from W, capacity and topk: every rank takes the same path).
  MoeMode mode = MoeMode::kAuto;
};

// What launch_moe_dispatch would do with these arguments (benchmarks, logs).
struct MoeLaunchInfo {
  bool low_latency;   // the low-latency kernel (then `algo` is kDecomposed: a separate GEMM)
  FusedAlgo algo;     // kFused or kDecomposed (kAuto resolved)
  int gemm_ctas;      // kFused: CTAs that start on the GEMM (0 where this rank has no GEMM)
  int dispatch_ctas;  // kFused: CTAs that store rows first
  int item_rows;      // kFused: rows per dispatch work item
};
MoeLaunchInfo moe_dispatch_info(const CommDevice& dev, const MoeDispatchArgs& args);

struct MoeCombineArgs {
  const __nv_bfloat16* expert_out = nullptr;  // rows × width, the dispatch's row order
  int width = 0;
  MoeDeviceLayout layout{};  // the dispatch's (read only)
  int num_experts = 0;
  int topk = 0;
  int64_t capacity = 0;                 // the dispatch's
  int64_t tokens = 0;                   // this rank's T
  const float* topk_weights = nullptr;  // tokens × topk, this rank's (as passed to the dispatch)
  __nv_bfloat16* out = nullptr;         // tokens × width
  // kLowLatency: the rows and the weighted sums in one cooperative launch; kNormal: the rows
  // kernel then the sum kernel; kAuto: choose_moe_low_latency (W, capacity, topk).
  MoeMode mode = MoeMode::kAuto;
  int ctas = 0;  // the low-latency kernel's grid cap (0: one CTA per SM); ranks sharing a GPU cap it
};
// True where launch_moe_combine runs the low-latency kernel for these arguments.
bool moe_combine_low_latency(const CommDevice& dev, const MoeCombineArgs& args);

// moeGemmCombine on the GPU: out = moeCombine(groupedGemm(h, w2)) bit for bit (docs/ops.md).
// kDecomposed: launch_grouped_gemm into the workspace's rows, then launch_moe_combine.
// kFused: ONE persistent kernel per rank (cooperative, at most one CTA per SM):
//   - start: CTA 0 publishes the launch signature and raises CommFlags::arrive[r] at every peer
//     (this rank's data area is free: the stream's earlier work has completed); every CTA waits
//     (bounded) until every peer has arrived, and checks that every home rank's slots fit its
//     data area (the combine's rule, every rank agrees);
//   - the grouped GEMM h · W2_eᵀ over the dispatch's expert segments (the engine, as
//     launch_grouped_gemm); the epilogue stages each half-tile in shared memory and stores
//     every row of it straight into its home rank's data area at slot (token · topk + slot)
//     (8-byte stores over NVLink, 256 contiguous bytes per warp), then one thread per
//     half-tile fences and release-adds the elements it stored to each home rank's
//     combine_arrived (kMoeCombineFlagOffset; rows of a segment are ordered by source rank,
//     so one add per run);
//   - each CTA, after its last tile: thread 128 waits (bounded) until this rank's counter
//     reaches T · topk · width, then the CTA's 256 consumer threads compute their share of the
//     weighted sums (the combine's arithmetic: fp32, slot order, rounded once);
//   - the last CTA raises done at every peer, waits for every peer's done, compares the
//     signatures, resets the counter and publishes the epoch.
//   A rank whose grouped GEMM is empty (no local expert, no row) runs the same protocol in a
//   kernel without the GEMM. Outputs match the decomposed path bit for bit: the same GEMM
//   tiles (bf16 rounding of the same fp32 accumulators), the same weighted sum.
// kAuto: fused_choice.h's choose_moe_gemm_combine (rank-uniform inputs only).
struct MoeGemmCombineArgs {
  const __nv_bfloat16* h = nullptr;  // rows × k, the dispatch's row order (rows >= its row count)
  int64_t rows = 0;
  int k = 0;
  // Local experts' W2: local_experts × width × k (kNK) or local_experts × k × width (kKN).
  const __nv_bfloat16* w2 = nullptr;
  GemmLayoutB w2_layout = GemmLayoutB::kNK;
  int width = 0;
  MoeDeviceLayout layout{};  // the dispatch's (read only; status written)
  int num_experts = 0;
  int topk = 0;
  int64_t tokens = 0;                   // this rank's T
  const float* topk_weights = nullptr;  // tokens × topk, this rank's
  __nv_bfloat16* out = nullptr;         // tokens × width
  void* workspace = nullptr;            // moe_gemm_combine_workspace_bytes, 256-byte aligned
  size_t workspace_bytes = 0;
  FusedAlgo algo = FusedAlgo::kAuto;
  int fused_ctas = 0;  // kFused: the grid (0: one CTA per SM); ranks sharing a GPU cap it
  int tile_n = 0;      // the GEMM's tile width (0: chosen)
};
// The workspace of launch_moe_gemm_combine on the path `algo` (kFused or kDecomposed, as
// moe_gemm_combine_algo resolves it): the grouped GEMM's table, and for kDecomposed its rows.
size_t moe_gemm_combine_workspace_bytes(int64_t rows, int local_experts, int width, FusedAlgo algo);
// kFused or kDecomposed: what launch_moe_gemm_combine runs for these arguments.
FusedAlgo moe_gemm_combine_algo(const CommDevice& dev, const MoeGemmCombineArgs& args);
cudaError_t launch_moe_gemm_combine(const CommDevice& dev, const MoeGemmCombineArgs& args,
                                    cudaStream_t stream);

// Bytes of the data area the dispatch uses: capacity rows of hidden bf16, then one 16-byte
// identity per row.
uint64_t moe_dispatch_data_bytes(int64_t capacity, int hidden);
// The largest capacity whose rows fit `data_bytes` of data area.
int64_t moe_capacity_for(uint64_t data_bytes, int hidden);
// Bytes of the data area the combine uses at a home rank of `tokens` tokens.
uint64_t moe_combine_data_bytes(int64_t tokens, int topk, int width);
// Bytes of the dispatch's workspace (private device memory of this rank).
size_t moe_dispatch_workspace_bytes(int64_t tokens, int topk, int num_experts, int world, int rank,
                                    int64_t capacity);

cudaError_t launch_moe_dispatch(const CommDevice& dev, const MoeDispatchArgs& args, cudaStream_t stream);
cudaError_t launch_moe_combine(const CommDevice& dev, const MoeCombineArgs& args, cudaStream_t stream);

// ---- grouped GEMM ---------------------------------------------------------------------------
// C[rows of group g] = A[rows of group g] · op(B_g) for g < groups, where group g owns rows
// [offsets[g], offsets[g+1]) of A and C (offsets on the device, non-decreasing, offsets[0] >= 0,
// offsets[groups] <= rows_capacity; any length, 0 included). B holds the groups' weights one
// after the other: groups × N × K (kNK) or groups × K × N (kKN). bf16 in and out, fp32
// accumulation, each element rounded once. One launch of a small kernel that turns the offsets
// into a table of 128-row blocks, then the Hopper engine (kernels/gemm/) over that table: its
// CTAs claim tiles dynamically; a tile loads 128 rows of A from its group's start (rows past
// the group's end are computed and not stored) and the group's B through an offset, so no
// padding and no host round trip. Rows outside every group are not written.
// Requirements: N, K >= 8 and multiples of 8; A, B, C 16-byte aligned; groups <=
// kMoeMaxExperts; workspace of grouped_gemm_workspace_bytes, 256-byte aligned.
struct GroupedGemmArgs {
  const __nv_bfloat16* A = nullptr;  // rows_capacity × K
  int64_t rows_capacity = 0;
  const int64_t* offsets = nullptr;  // groups + 1, device
  int groups = 0;
  const __nv_bfloat16* B = nullptr;
  GemmLayoutB b_layout = GemmLayoutB::kNK;
  int N = 0, K = 0;
  __nv_bfloat16* C = nullptr;  // rows_capacity × N
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  int num_ctas = 0;  // 0: one per SM
  int tile_n = 0;    // 0: chosen; or 128 / 256
  int group_m = 0;   // the raster's height in table blocks (GemmArgs::group_m); 0: the engine's
  // C's half-tiles inside their group through shared memory and TMA stores: 0 or 2 on, 1 off
  // (every row from registers; A/B runs).
  int tma_store = 0;
};
size_t grouped_gemm_workspace_bytes(int64_t rows_capacity, int groups);
cudaError_t launch_grouped_gemm(const GroupedGemmArgs& args, cudaStream_t stream);

inline const char* moe_status_name(int32_t code) {
  switch (code) {
    case kMoeOk: return "ok";
    case kMoeBadExpert: return "expert id out of range";
    case kMoeOverflow: return "receive capacity exceeded";
    case kMoeCombineArea: return "combine rows exceed the data area";
    case kMoeProtocol: return "a wait gave up";
    default: return "?";
  }
}

}  // namespace fusedcomm::kernels
