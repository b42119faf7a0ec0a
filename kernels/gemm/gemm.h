// Persistent, warp-specialised bf16 GEMM for Hopper (sm_90a): the GEMM engine of the fused
// kernels, and a plain op on its own.
//
//   C = A · Wᵀ   (b_layout = kNK)   A: M×K row-major, W: N×K row-major (a linear layer's weight)
//   C = A · B    (b_layout = kKN)   A: M×K row-major, B: K×N row-major
//
// bf16 operands, fp32 accumulation, C in bf16 (default) or fp32, row-major.
//
// Contract
// - Shapes: M, N, K >= 1, any values (M = 1 included). Tails are handled: tiles that overhang
//   M, N or K are loaded with zero fill by the tensor memory accelerator (TMA) and stores are
//   guarded, so nothing outside M×N is written. With a tile sink or tile flags (hook 2), N must
//   be a multiple of 8 (that path stores column pairs).
// - Layouts and alignment: every pointer 16-byte aligned; leading dimensions in elements:
//   lda >= K, ldb >= K (kNK) or ldb >= N (kKN), ldc >= N; lda and ldb multiples of 8 (TMA
//   loads need 16-byte row strides; dense operands whose rows are not a multiple of 8 elements
//   go through launch_gemm_staged()); ldc any: C goes through TMA stores where ldc and N are
//   multiples of 8, else bf16 C through shared memory and coalesced element stores, fp32 C from
//   registers element by element (no ping-pong then). M, N, K, lda, ldb, ldc < 2^31. Operands
//   must not alias C.
// - Engine: a grid of `num_ctas` persistent CTAs (default: one per SM) walks 128×BN output
//   tiles (BN = 256 or 128, chosen from the shape unless forced; plain launches on single CTAs
//   also 192, e.g. at N = 376, two 192-wide N-blocks) in a grouped order: groups of
//   `group_m` M-blocks, each group swept along N, so concurrently running CTAs share A and B
//   panels in L2. One producer warp per CTA loads 64-deep K slices of A and B with TMA into a
//   multi-stage shared-memory ring guarded by mbarriers; two consumer warpgroups run wgmma and
//   store their 64×BN halves of the tile: C (bf16 or fp32) through shared memory and TMA
//   stores, or from registers when tile flags must order the stores (hook 2) and for the sink.
//   (On 128-wide tiles a plain launch lets the two warpgroups take turns on whole tiles
//   instead: "Consumers that take turns" below.)
// - The launch is asynchronous on `stream`; the return value reports argument errors
//   (cudaErrorInvalidValue) and launch errors only. Hook failures are reported in the error
//   record (below), which the caller reads after synchronising the stream.
//
// Hooks for the fused kernels (all off when left zero):
// 1. Readiness waits (GemmWaitConfig). Before the producer loads the first K slice of a tile it
//    waits until every readiness flag covering the tile's rows of A (M) and of B (N) holds a
//    value >= `epoch`. Flags are uint64 in global memory (device, peer or host-mapped), read
//    with ld.acquire.sys, so the data that the writer published before its release store of
//    the flag (st.release.sys / red.release.sys, or a fence.sc.sys / __threadfence_system()
//    then a plain store) is visible to the loads that follow; a fence.proxy.async.global
//    orders the acquire before the TMA reads (async proxy). Flags are never reset by this
//    kernel: a fresh, larger epoch per launch makes back-to-back launches and graph replay
//    correct. Every wait is bounded: spin with exponential backoff (32 ns .. 1 µs); every 16
//    polls re-read `abort_word` (if set) and the error record; give up after `timeout_ns`
//    of %globaltimer (0: kDefaultWaitTimeoutNs). The first CTA to give up records the code
//    and the location (operand, chunk, tile, CTA, observed value) in `*error` and stops;
//    other CTAs that are waiting see the record and stop too (without overwriting it). A CTA
//    that stops finishes no further tiles; C is then incomplete. No hang, no trap.
//    The flag writers must be able to run while this kernel occupies its CTAs: leave them SMs
//    (hook 3), and make sure their code is loaded before the GEMM starts (CUDA loads modules
//    lazily, and a first launch can wait for the running kernel: launch them once before, or
//    run with CUDA_MODULE_LOADING=EAGER). gemm_test shows the failure mode: a timeout.
// 2. Tile sink (GemmTileSink). When a consumer finishes a tile it stores it to C (if C is
//    non-null) and/or hands it to the sink: stores (bf16/fp32) or system-scope atomic adds (fp32/bf16x2)
//    into up to kGemmMaxSinkDests destination buffers, rows routed by row / rows_per_dest
//    (e.g. one peer buffer per rank for a reduce-scatter). If `tile_flags` is set, after all
//    256 consumer threads of the CTA have issued the tile's stores (named barrier) one thread
//    writes `epoch` to tile_flags[m_block * n_blocks + n_block] with st.release.sys: by
//    cumulativity of the release, every store or atomic of the tile (ordered before it by the
//    barrier) is visible to whoever reads the flag with an acquire at system scope.
//    Use gemm_tile_grid() to size the flag array and to map rows to tiles.
// 3. Grid size: `num_ctas` CTAs compute (0: all SMs; never more than there are tiles); the
//    other SMs stay free for communication kernels running beside this one.
// 4. Tile order: `m_block_start` rotates the M-blocks so the sweep starts at that block
//    (e.g. the rank's own shard of A in an all-gather GEMM) and wraps around.
// 5. CTA pairs (`cluster`): clusters of two CTAs compute M-blocks 2p and 2p + 1 of one N-block
//    together, each loading half of the B tile into both CTAs' shared memory (TMA multicast),
//    which halves the L2 reads of B. 0 lets the launch choose (today: single CTAs, as pairs
//    measured no faster, except on grids of 128-wide tiles of at most two waves with K >= 2048,
//    where pairs took 0.75-0.98 × the time of single CTAs at 9 of 10 cases on 1 × H200, and on
//    grids of at least 100 256-wide tiles whose A or B rows are off the 128-byte lines (a row
//    stride off the multiple of 64 elements), 0.85 × in geomean; never where pairs would take
//    more waves than single CTAs);
//    2 asks for pairs and needs hooks 1-2 off and num_ctas >= 2 (else
//    cudaErrorInvalidValue); the grid is then even and at most the clusters that fit at once.
//
// Stream-K (plain launches): with a workspace (`workspace`, gemm_workspace_bytes()), a launch
// whose last wave of tiles would leave SMs idle computes the whole waves tile by tile as above
// and spreads the remaining tiles' K slices evenly over the CTAs: each takes a contiguous run
// of (tile, 64-deep K slice) pairs, touching at most two tiles; every segment writes its fp32
// partial to the workspace, and the segment that arrives last at a tile's counter adds the
// tile's partials in K order (so the sums do not depend on arrival order and repeat bit for
// bit) and stores C. No CTA waits for another, so nothing depends on which CTAs are resident.
// Only launches without hooks 1-2 and CTA pairs, with C set, num_ctas <= 1024. `stream_k`:
// 0 lets the launch choose (today: with K >= 8192, M <= 64 with tiles keeping at most 3/4 of
// the CTAs busy, 0.52-0.95 × the time on 1 × H200; with K >= 4096, a last wave of at most half
// the CTAs after whole ones where a wave model expects a gain of at least 1.5 %, 0.80-0.99 ×
// and 0.85-0.91 × at 6-10 waves; elsewhere the fix-up ate the gain), 1 off, 2 wherever a wave
// is partial (tests, A/B runs).
// The workspace's counters must be zero before its first launch; every launch leaves them
// zero. Launches that share a workspace must be stream-ordered (never concurrent).
//
// Consumers that take turns ("ping-pong", plain launches): each consumer warpgroup computes
// whole 128×128 tiles of its own, the CTA's tiles alternating between the two, so that one
// stores C while the other's wgmma run (detail/gemm_pingpong.cuh). Only launches without hooks
// 1-2, CTA pairs or stream-K, with C set, on 128-wide tiles. `pingpong`: 0 lets the launch
// choose (today: wherever the plan takes 128-wide tiles and no CTA pairs (hook 5), 0.93-0.99 × the time of both
// warpgroups on one tile at 14 of 16 such shapes on 1 × H200; 128-wide turns in place of
// 256-wide tiles measured 1.00-1.07 × at most shapes, so the tile width is chosen as before),
// 1 off, 2 wherever allowed (tests, A/B runs).
//
// Custom epilogues for fused kernels live in detail/gemm_sm90.cuh (template parameter).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace fusedcomm::kernels {

enum class GemmLayoutB : uint32_t {
  kNK = 0,  // B is N×K row-major: C = A · Bᵀ (both operands K-major)
  kKN = 1,  // B is K×N row-major: C = A · B (B is N-major)
};

enum class GemmOutType : uint32_t { kBF16 = 0, kF32 = 1 };

inline constexpr uint64_t kDefaultWaitTimeoutNs = 10ull * 1000 * 1000 * 1000;  // 10 s
inline constexpr int kGemmMaxSinkDests = 8;

// Codes of GemmErrorRecord::code.
enum GemmErrorCode : uint32_t {
  kGemmOk = 0,
  kGemmWaitTimeout = 1,  // a readiness flag stayed below epoch for timeout_ns
  kGemmAborted = 2,      // abort_word became non-zero while waiting
};

// Host-visible error record (device memory or host-mapped pinned memory). The caller zeroes it
// before the launch; the first CTA that gives up fills it. Read it after stream sync.
struct alignas(16) GemmErrorRecord {
  uint32_t code;        // GemmErrorCode; written last-claimed first (atomicCAS from 0)
  uint32_t operand;     // 0 = A (flag covers M rows), 1 = B (flag covers N rows)
  uint32_t chunk;       // index of the flag that was waited on
  uint32_t cta;         // blockIdx.x of the CTA that gave up
  uint32_t tile_m;      // M-block of the tile it was about to load
  uint32_t tile_n;      // N-block of that tile
  uint64_t observed;    // last value read from the flag
  uint64_t elapsed_ns;  // %globaltimer time spent waiting
};
static_assert(sizeof(GemmErrorRecord) == 40 + 8, "GemmErrorRecord layout is shared with hosts");

// Per-chunk readiness flags for one operand. flags[c] covers rows [c*chunk_rows,
// (c+1)*chunk_rows) of A (M rows) or of B's N dimension (N rows of W / N columns of B).
struct GemmReadyFlags {
  const uint64_t* flags;  // null: this operand is always ready
  uint32_t chunk_rows;    // > 0 when flags is set
  uint32_t num_chunks;    // entries in flags; rows past the last chunk use the last flag
};
static_assert(sizeof(GemmReadyFlags) == 16, "device-handle layout");

// Hook 1: readiness waits. Trivially copyable; passed by value to the kernel.
struct GemmWaitConfig {
  GemmReadyFlags a;                     // flags over A's rows
  GemmReadyFlags b;                     // flags over B's N rows
  uint64_t epoch;                       // ready when flag >= epoch
  uint64_t timeout_ns;                  // 0: kDefaultWaitTimeoutNs
  const volatile uint32_t* abort_word;  // optional (host-mapped): non-zero stops the waits
  GemmErrorRecord* error;               // required when a.flags or b.flags is set
};
static_assert(sizeof(GemmWaitConfig) == 64, "device-handle layout");

enum class GemmSinkMode : uint32_t {
  kNone = 0,
  kStoreBF16 = 1,      // dest[r][c] = bf16(acc)
  kStoreF32 = 2,       // dest[r][c] = acc
  kAtomicAddF32 = 3,   // dest[r][c] += acc (fp32 red)
  kAtomicAddBF16 = 4,  // dest[r][c] += bf16(acc) (bf16x2 red; pairs of columns)
};

// Hook 2: where finished tiles go besides (or instead of) C. Trivially copyable.
// Row r of C goes to dest[r / rows_per_dest] at row r % rows_per_dest (rows_per_dest = 0:
// all rows to dest[0] at row r), column c at column c; ld is the destinations' row stride in
// elements (a multiple of 8). Destinations may be peer memory (CUDA IPC / P2P).
struct GemmTileSink {
  GemmSinkMode mode;
  uint32_t num_dests;  // 1..kGemmMaxSinkDests when mode != kNone
  uint32_t rows_per_dest;
  uint32_t reserved;
  int64_t ld;
  void* dest[kGemmMaxSinkDests];
  uint64_t* tile_flags;  // optional: one per tile (gemm_tile_grid), set to epoch (release.sys)
  uint64_t epoch;
};
static_assert(sizeof(GemmTileSink) == 24 + 8 * kGemmMaxSinkDests + 16, "device-handle layout");

struct GemmArgs {
  const __nv_bfloat16* A = nullptr;  // M×K, row stride lda
  const __nv_bfloat16* B = nullptr;  // N×K (kNK) or K×N (kKN), row stride ldb
  void* C = nullptr;                 // M×N, row stride ldc; may be null if the sink is set
  int64_t lda = 0, ldb = 0, ldc = 0;
  int M = 0, N = 0, K = 0;
  GemmLayoutB b_layout = GemmLayoutB::kNK;
  GemmOutType c_type = GemmOutType::kBF16;
  // Scheduling (hooks 3 and 4).
  int num_ctas = 0;       // CTAs that compute; 0: one per SM
  int tile_n = 0;         // 0: chosen from the shape; or 128 / 256, or 192 (plain launches on
                          // single CTAs only: no hooks 1-2, no CTA pairs)
  int group_m = 0;        // M-blocks per raster group; 0: 16 on 256-wide tiles, 8 on 128-wide
  int m_block_start = 0;  // first M-block of the sweep (taken modulo the M-block count)
  int cluster = 0;        // CTA pairs (hook 5): 0 chosen (mostly single CTAs), 1 off, 2 on
  GemmWaitConfig wait{};  // hook 1
  GemmTileSink sink{};    // hook 2
  // Stream-K (above): device memory of at least gemm_workspace_bytes(num_ctas) bytes, 256-byte
  // aligned (as cudaMalloc's), zeroed once before its first use; null, too small or misaligned:
  // no stream-K.
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  int stream_k = 0;  // 0 chosen, 1 off, 2 wherever the last wave is partial
  // Consumers that take turns (above): 0 chosen, 1 off, 2 wherever allowed: 128-wide tiles
  // unless tile_n = 256 is forced; never with hooks 1-2, CTA pairs or a launch that runs
  // stream-K (which then takes precedence).
  int pingpong = 0;
};

// Bytes of a stream-K workspace for launches with up to `num_ctas` computing CTAs (0: one per
// SM of the current device): 8 KiB of counters, then 256 KiB per CTA (two fp32 half-tile
// partials per consumer warpgroup); ~33 MiB on a 132-SM GPU. One workspace serves launches of
// any CTA count up to that (stream-K needs num_ctas <= 1024).
size_t gemm_workspace_bytes(int num_ctas);
// A stream-K workspace as one value (GemmArgs::workspace / workspace_bytes; null: none), for the
// ops that launch GEMMs of their own (ag_gemm.h, gemm_rs.h, gemm_ar.h).
struct GemmWorkspace {
  void* ptr = nullptr;
  size_t bytes = 0;
};
inline void use_workspace(GemmArgs& a, const GemmWorkspace& w) {
  a.workspace = w.ptr;
  a.workspace_bytes = w.bytes;
}

// Tile grid for a shape under the tile width a launch will use (tile_n as in GemmArgs).
struct GemmTileGrid {
  int tile_m;    // 128
  int tile_n;    // 128 or 256 (192 only where asked for: plain launches)
  int m_blocks;  // ceil(M / tile_m)
  int n_blocks;  // ceil(N / tile_n)
};
GemmTileGrid gemm_tile_grid(int M, int N, int tile_n, int num_ctas);

// What launch_gemm(a) would run: its tile grid, computing CTAs, and the tiles it computes by
// stream-K (0: none). cudaErrorInvalidValue where launch_gemm would refuse `a`.
struct GemmLaunchPlan {
  GemmTileGrid grid;
  int ctas;
  int stream_k_tiles;
  bool pingpong;  // consumers that take turns, on 128×128 tiles
  bool pairs;     // CTA pairs (hook 5), asked for or chosen
};
cudaError_t gemm_launch_plan(const GemmArgs& a, GemmLaunchPlan* plan);

// Enqueues C = A·Bᵀ or A·B on `stream` (see the contract above). Launched early
// (detail/early_launch.h; not on the legacy default stream): the kernel may be scheduled while
// the stream's previous kernel runs, but touches memory only once that kernel has completed, so
// stream order is as for any launch. It lets the stream's next kernel be scheduled early too,
// unless it has readiness waits (hook 1).
cudaError_t launch_gemm(const GemmArgs& args, cudaStream_t stream);

// Staged launch: launch_gemm for A or B whose leading dimension is not a multiple of 8 (dense
// operands with K or N off the multiple of 8). Each such operand is first copied, on `stream`,
// into `staging` with its rows padded to a multiple of 64 elements (the pad is never read: TMA
// zero-fills past K and N); C needs no copy (any ldc, above). An operand whose stride is a
// multiple of 8 but not of 64 (rows off the 128-byte lines) is copied too where a cost model
// puts the copies plus the GEMM on the copied rows below the GEMM on the rows in place
// (tuning.h, kStage* and kOffLine*: rows off the lines cost single CTAs up to ~1.5-1.8 × the
// time, CTA pairs on 256-wide tiles (hook 5) about nothing, the copies 5-10 % of a large GEMM).
// The copies are part of the op and of its time: (M·K or N·K) · 4 bytes of memory traffic
// each, against 2·M·N·K FLOP. gemm_staging_bytes(a): the bytes of `staging` that `a` needs
// (0: none, the launch is launch_gemm's). Refused (cudaErrorInvalidValue) with hooks 1-2 or
// CTA pairs asked for, where the staging is too small or misaligned (256 bytes, as
// cudaMalloc's), and where launch_gemm would refuse the padded arguments. Launches sharing a
// staging buffer must be stream-ordered.
size_t gemm_staging_bytes(const GemmArgs& a);
cudaError_t launch_gemm_staged(const GemmArgs& a, void* staging, size_t staging_bytes, cudaStream_t stream);

}  // namespace fusedcomm::kernels
