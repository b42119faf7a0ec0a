// The GEMM engine's kernel template (see ../gemm.h for the contract). The engine is a device
// function, gemm_sm90_body, parameterised by the epilogue (where finished tiles go) and the tile
// schedule (this CTA's index among the computing CTAs and their number, which tiles it computes
// in what order, and what it waits for before loading one). gemm_sm90_kernel is the plain
// GEMM: every CTA computes, round robin over the tiles, hook-1 waits from GemmWaitConfig;
// launch_gemm() uses it with DefaultEpilogue. The fused kernels (detail/fused_*.cuh) call the
// same body from CTAs they give the GEMM role, with their own epilogue and schedule.
//
// CTA = 3 warpgroups (384 threads), one CTA per SM:
//   warpgroup 0: producer. setmaxnreg down to 40 (56 with aux warps: RegisterSplit);
//                thread 0 walks the CTA's tiles, waits on the readiness flags (hook 1), then
//                issues TMA loads of 64-deep K slices of A (128×64) and B (BN×64, or 64×BN
//                for kKN) into a kStages-deep ring.
//   warpgroups 1, 2: consumers. setmaxnreg up to 232 (224 with aux warps); each owns 64 rows
//                of the 128×BN tile, runs 4 wgmma (k16) per slice with one wgmma group in
//                flight, releases slices back to the producer, then hands its fragment to the
//                epilogue.
//
// Shared memory (dynamic, base rounded up to 1024 B for the 128-byte swizzle):
//   [A ring]  kStages × 128×64 bf16 (16 KiB each; rows of 128 B, TMA SWIZZLE_128B)
//   [B ring]  kStages × BN×64 bf16; kNK: BN rows of 128 B (K-major, like A);
//             kKN: BN/64 slabs of 64 K-rows × 128 B (64 N-elements), 8 KiB each (N-major)
//   [staging] 2 × R × 16 KiB (R = the epilogue's kStagingRounds, 1 or 2): per consumer
//             warpgroup, R store rounds of 16 KiB (store_tile_tma): a round is 64 rows × 128
//             columns of bf16 as two 64×64 boxes, or 64 rows × 64 columns of fp32 as two 64×32
//             boxes (128-B swizzled rows either way)
//   [aux]     kAuxBytes: the epilogue's (kInitAux: its helper warps' mailboxes, its barriers)
//   [full]    kStages × mbarrier: 1 arrival (producer, expect_tx = stage bytes) + TMA bytes
//   [empty]   kStages × mbarrier: 8 arrivals (lane 0 of each consumer warp) per CTA that reads
//             the stage's B half from this CTA's loads: 8, or 16 in a CTA pair (below)
//   [done]    mbarrier: CTA pairs only, 8 arrivals (the partner's consumer warps, at their end)
//   [status]  kStages × u32, written by the producer before it arms a tile's first stage:
//             static schedules: 0, or 1 = the producer stopped (hook-1 failure), no data;
//             dynamic schedules: the tile index, or kStageEnd (no more tiles) / kStageStop
//             (failure), no data
//
// Ordering: mbarrier arrive/complete_tx (release) → try_wait (acquire) orders the TMA writes
// and the status word before the consumers' reads; wgmma_wait<1> before the empty arrival
// guarantees the slice is no longer read by the tensor cores when the producer reuses it.
//
// CTA pairs (Schedule::kCluster == 2, the plain GEMM only): a cluster of two CTAs computes two
// M-blocks of the same N-block (pair_tile_coord) in lockstep, and each CTA's producer loads
// its own A slice and one half of the shared B slice, multicast into the same stage of both
// CTAs; each CTA's full barrier still expects the whole stage (A + both B halves). A stage may
// be refilled only when both CTAs' consumers have released it, so every consumer warp arrives
// on the empty barrier of both CTAs (after wgmma_wait: the tensor cores' reads are complete;
// the arrival needs no cluster-scope release, see mbar_arrive_remote).
// The peer's half can land on a full barrier before the local producer's expect_tx for that
// phase: the transaction count goes negative and the phase cannot complete before the local
// arrival, so no data is missed. The consumers end with a handshake through `done`
// (leave_cluster): no CTA leaves while its partner may still write its shared memory or
// barriers.
// An M-block past the last one (odd M-block count) is computed from zero-filled A and stored
// nowhere: both CTAs must run the same stages, since each loads half of the other's B.
#pragma once

#include "kernels/common/sm90_primitives.cuh"
#include "kernels/common/wgmma_ops.cuh"
#include "kernels/gemm/gemm.h"

#include <cuda_bf16.h>

#include <atomic>
#include <type_traits>

namespace fusedcomm::kernels::detail {

inline constexpr int kGemmThreads = 384;
inline constexpr int kTileM = 128;
inline constexpr int kTileK = 64;

// kStagingRounds: 16 KiB store rounds that each consumer warpgroup's staging buffer holds.
// Two (a whole bf16 half-tile of BN = 256) cost one stage of the operand ring; for the plain
// GEMM that is a wash (0.987 × over 52 shapes on one H200, but 1.08 × at 8192³:
// kernels/bench/NOTES.md), so only epilogues that need the room ask for it.
template <int BN, int kStagingRounds = 1>
struct GemmTileConfig {
  static_assert(BN == 128 || BN == 256, "tile widths with a wgmma wrapper");
  static_assert(kStagingRounds == 1 || kStagingRounds == 2, "one or two store rounds");
  static constexpr uint32_t kABytes = kTileM * kTileK * 2;
  static constexpr uint32_t kBBytes = BN * kTileK * 2;
  static constexpr uint32_t kStageBytes = kABytes + kBBytes;
  static constexpr int kStages = BN == 256 ? 5 - kStagingRounds : 7 - kStagingRounds;
  // Per consumer warpgroup: kStagingRounds × 64×128 bf16 (two 64×64 TMA-store boxes each).
  static constexpr uint32_t kStagingBytes = kStagingRounds * 2 * 64 * 128;
  static constexpr uint32_t kAuxBytes = 128;
  static constexpr size_t kSmemBytes = 1024 + size_t(kStages) * kStageBytes +
                                       2 * kStagingBytes + kAuxBytes + kStages * 20 + 8;
  static_assert(kSmemBytes <= 227 * 1024, "fits the sm_90 opt-in shared memory");
};

// Problem and scheduling: a trivially copyable device handle, passed by value.
struct GemmProblem {
  int M, N, K;
  int m_blocks, n_blocks, k_blocks;
  int num_tiles;      // m_blocks * n_blocks
  int group_m;        // raster group height in M-blocks (>= 1)
  int m_block_start;  // rotation of the M-blocks, in [0, m_blocks)
  int c_tma;          // the engine stores C itself through smem + TMA (tm_c): kCTmaBF16 /
                      // kCTmaF32; 0: C (if any) goes through the epilogue's register path
  int sweep;          // sweep positions of whole tiles: num_tiles, pair_sweep() for CTA pairs,
                      // or the whole waves' tiles under stream-K
  GemmWaitConfig wait;
  // Stream-K (gemm.h; schedules with kStreamK): the tiles at sweep positions [sweep, sweep +
  // sk_tiles) are computed as sk_tiles * k_blocks (tile, K slice) iterations split evenly over
  // sk_ctas() CTAs (sk_bound); 0: none. sk_tiles < the grid, so a CTA's run spans at most two
  // tiles.
  int sk_tiles;
  float4* sk_partials;     // [2 * CTA + its segment j][consumer warpgroup][kSkHalfF4]
  uint32_t* sk_counters;   // [stream-K tile][consumer warpgroup]: segments arrived, left at 0
};

inline constexpr int kCTmaBF16 = 1;
inline constexpr int kCTmaF32 = 2;

struct TileCoord {
  int m, n;  // block indices
};

// Grouped raster over `rows` row units: group g covers units [g*group, +group), swept column
// by column, so the CTAs running at once share a few A panels and a few B panels in L2.
// (Host too: fused.cu's sweep checks for fused_geometry_test.)
__host__ __device__ __forceinline__ TileCoord grouped_raster(int t, int rows, int group, int n_blocks) {
  const int per_group = group * n_blocks;
  const int g = t / per_group;
  const int first = g * group;
  const int height = rows - first < group ? rows - first : group;
  const int r = t - g * per_group;
  return {first + r % height, r / height};
}

// The rotation of the M-blocks (hook 4): block m of the sweep is block m + m_block_start,
// modulo m_blocks (m < m_blocks).
__device__ __forceinline__ int rotate_m(const GemmProblem& p, int m) {
  m += p.m_block_start;
  return m >= p.m_blocks ? m - p.m_blocks : m;
}

// Sweep position -> tile: the grouped raster over M-blocks, then the rotation of M.
__device__ __forceinline__ TileCoord tile_coord(const GemmProblem& p, int t) {
  TileCoord tc = grouped_raster(t, p.m_blocks, p.group_m, p.n_blocks);
  tc.m = rotate_m(p, tc.m);
  return tc;
}

// CTA pairs: sweep position -> the tile of pair member `rank` (0/1). The raster runs over
// pairs of M-blocks (2p, 2p + 1), group_m / 2 pairs high; then in-range blocks are rotated as
// in tile_coord. Block 2p + 1 = m_blocks (odd count) stays out of range: rows_in is false.
__host__ __device__ __forceinline__ int pair_sweep(int m_blocks, int n_blocks) {
  return (m_blocks + 1) / 2 * n_blocks;
}
__device__ __forceinline__ TileCoord pair_tile_coord(const GemmProblem& p, int t, int rank) {
  TileCoord tc = grouped_raster(t, (p.m_blocks + 1) / 2, max(1, p.group_m / 2), p.n_blocks);
  tc.m = 2 * tc.m + rank;
  if (tc.m < p.m_blocks) tc.m = rotate_m(p, tc.m);
  return tc;
}

// Bench-only (gemm_bench built with -DFC_GEMM_TRACE): per CTA and consumer warpgroup, the
// globaltimer at the consumers' start (0), after the whole tiles (1), after the stream-K
// segments (2), after the barrier before the sums (3), at the end (4), the tiles summed (5),
// and over the whole tiles, the time from one tile's last wgmma to the next one's first (6),
// the number of such gaps (7), the epilogues' time (8) and the waits for a tile's first stage
// after the first tile (9); clock64 at 0 (10) and at 1 (11): cycles over nanoseconds, the SM
// clock the tiles ran at. kGemmTraceWords points per warpgroup.
#if defined(FC_GEMM_TRACE)
constexpr int kGemmTraceWords = 12;
__device__ uint64_t g_gemm_trace[1024 * 2 * kGemmTraceWords];
#define FC_GEMM_TRACE_POINT(i, v) \
  if (threadIdx.x % 128 == 0) g_gemm_trace[(blockIdx.x * 2 + cw) * kGemmTraceWords + (i)] = (v)
// Host side: copies `bytes` of a trace symbol to host, or zeroes them where host is null
// (before a traced launch). Each .cu file has its own copy of the symbols (gemm.cu: the plain
// GEMM's; fused.cu: the fused kernels'), hence internal linkage.
template <class Symbol>
static int trace_copy(const Symbol& symbol, uint64_t* host, size_t bytes) {
  if (host != nullptr) return static_cast<int>(cudaMemcpyFromSymbol(host, symbol, bytes));
  void* p = nullptr;
  const cudaError_t e = cudaGetSymbolAddress(&p, symbol);
  return static_cast<int>(e != cudaSuccess ? e : cudaMemset(p, 0, bytes));
}
#else
#define FC_GEMM_TRACE_POINT(i, v)
#endif
// ---- stream-K: iteration ranges and the fix-up of split tiles ------------------------------
// float4s of one consumer warpgroup's fragment at BN = 256 (64 × 256 fp32), the slot stride.
inline constexpr int kSkHalfF4 = 64 * 256 / 4;
// Stream-K iterations [sk_bound(c), sk_bound(c + 1)) are CTA c's, for c < G = sk_ctas(): every
// such range is non-empty, so the segments of a tile are CTAs first..last (sk_cta_of), all of
// them (counting CTAs with empty ranges once left tiles without a last segment).
__host__ __device__ __forceinline__ int sk_ctas(int total, int grid) { return min(total, grid); }
__host__ __device__ __forceinline__ int sk_bound(int total, int c, int G) {
  return static_cast<int>(static_cast<int64_t>(total) * c / G);
}
// The CTA whose range holds iteration x: the largest c with sk_bound(c) <= x.
__host__ __device__ __forceinline__ int sk_cta_of(int total, int x, int G) {
  return static_cast<int>((static_cast<int64_t>(x + 1) * G - 1) / total);
}
// Partial slot of CTA c's segment of stream-K tile ts: 2c for the segment holding the CTA's
// first iteration, 2c + 1 for the one after it (a range spans at most two tiles).
__device__ __forceinline__ int sk_slot(int total, int kb, int c, int G, int ts) {
  return 2 * c + (sk_bound(total, c, G) >= ts * kb ? 0 : 1);
}

// CTA c's run of stream-K iterations, [it, end), of G CTAs sharing them (empty for c >= G);
// the producer and the consumers walk the same run, one segment (segment()) at a time.
struct SkRun {
  int it, end, G;
};
__device__ __forceinline__ SkRun sk_run(const GemmProblem& p, int c, int grid) {
  const int total = p.sk_tiles * p.k_blocks, G = sk_ctas(total, grid);
  return c < G ? SkRun{sk_bound(total, c, G), sk_bound(total, c + 1, G), G} : SkRun{0, 0, G};
}
// The segment starting at iteration it (< end): stream-K tile ts, K slices [kb0, kb1).
struct SkSegment {
  int ts, kb0, kb1;
};
__device__ __forceinline__ SkSegment sk_segment(const GemmProblem& p, int it, int end) {
  const int kb = p.k_blocks, ts = it / kb, kb0 = it - ts * kb;
  return {ts, kb0, min(kb, kb0 + (end - it))};
}
// The CTAs whose segments make up stream-K tile ts: first..last, in K order.
__device__ __forceinline__ int sk_first_cta(const GemmProblem& p, int ts, int G) {
  return sk_cta_of(p.sk_tiles * p.k_blocks, ts * p.k_blocks, G);
}
__device__ __forceinline__ int sk_last_cta(const GemmProblem& p, int ts, int G) {
  return sk_cta_of(p.sk_tiles * p.k_blocks, ts * p.k_blocks + p.k_blocks - 1, G);
}
// Consumer thread t of warpgroup cw: its first float4 in CTA c's partial of stream-K tile ts
// (layout [float4 k][thread]: acc[4k..4k+3] of thread t at k * 128 + t, coalesced).
__device__ __forceinline__ float4* sk_partial(const GemmProblem& p, int c, int G, int ts, int cw,
                                              int t) {
  const int kb = p.k_blocks;
  return p.sk_partials +
         (static_cast<size_t>(sk_slot(p.sk_tiles * kb, kb, c, G, ts)) * 2 + cw) * kSkHalfF4 + t;
}

// Consumer warpgroup cw of CTA c (of G) has finished its segment of stream-K tile ts in acc,
// whose first `rows` rows are inside M (> 0; warps whose 16 rows are all past M move no data):
// it stores the partial (sk_partial's layout) and counts itself in the tile's counter. Returns
// true for the segment that arrives last (no CTA ever waits, so residency does not matter),
// which resets the counter and must store the tile (sk_sum). Ordering: the
// warpgroup's stores, its named barrier, then thread 0's fence.acq_rel.gpu and relaxed
// atomicAdd (release); the last arriver's atomicAdd reads every earlier one, and its fence
// (acquire) and the barrier order the warpgroup's later loads (sk_sum) after them.
template <int BN>
__device__ __forceinline__ bool sk_arrive(const float (&acc)[BN / 2], const GemmProblem& p,
                                          int ts, int c, int G, int cw, int rows, uint8_t* aux) {
  const int t = threadIdx.x % 128;
  float4* mine = sk_partial(p, c, G, ts, cw, t);
  if ((t / 32) * 16 < rows) {
#pragma unroll
    for (int k = 0; k < BN / 8; ++k) {
      __stcg(mine + k * 128, make_float4(acc[4 * k], acc[4 * k + 1], acc[4 * k + 2], acc[4 * k + 3]));
    }
  }
  const int first = sk_first_cta(p, ts, G), last = sk_last_cta(p, ts, G);
  volatile uint32_t* verdict = reinterpret_cast<volatile uint32_t*>(aux) + cw;
  named_barrier_sync(2 + cw, 128);
  if (t == 0) {
    uint32_t* counter = p.sk_counters + 2 * ts + cw;
    fence_acq_rel_gpu();
    const bool is_last = atomicAdd(counter, 1u) == static_cast<uint32_t>(last - first);
    if (is_last) {
      fence_acq_rel_gpu();
      *counter = 0;  // every segment has counted itself: the next launch starts from zero
    }
    *verdict = is_last ? 1u : 0u;
  }
  named_barrier_sync(2 + cw, 128);
  return *verdict != 0;
}

// The sum reads the partials in units of kSkUnitF4 float4s per thread (32 fp32 of the fragment,
// 16 KiB per warpgroup), copied into a ring of kDepth units per thread in the consumer
// warpgroup's half of the (idle) A/B ring, so that kDepth units per thread are in flight: the
// sum through registers (one unit in flight) was a latency-bound chain of L2 round trips
// (kernels/bench/NOTES.md, "Stream-K's sum through a copy ring": 1-7 % of the launch).
inline constexpr int kSkUnitF4 = 8;
inline constexpr uint32_t kSkUnitBytes = kSkUnitF4 * 128 * 16;  // one unit, whole warpgroup
template <class Cfg>
inline constexpr int sk_sum_depth() {
  constexpr uint32_t fit = Cfg::kStages * Cfg::kStageBytes / 2 / kSkUnitBytes;
  return static_cast<int>(fit < 8 ? fit : 8);
}

// The sum's copies: unit v (chunk v / n of segment v % n) into ring slot v % kDepth. Segment
// q > 0 is the first of CTA first + q (slot 2(first + q)); segment 0 may be the first CTA's
// second (slot0 = sk_slot of the first CTA): no division in the loop.
struct SkCopier {
  const float4* part;  // this thread's float4 in partial slot 0 of its warpgroup
  uint32_t ring0;      // this thread's first byte of the ring
  int first, slot0, n, units;
  int v = 0, q = 0, c = 0, fill = 0;  // the next unit to copy: index, segment, chunk, ring slot
  template <int kDepth>
  __device__ __forceinline__ void next() {
    if (v < units) {
      const int slot = q == 0 ? slot0 : 2 * (first + q);
      const float4* src = part + static_cast<size_t>(slot) * 2 * kSkHalfF4 + c * kSkUnitF4 * 128;
      const uint32_t dst = ring0 + fill * kSkUnitBytes;
#pragma unroll
      for (int k = 0; k < kSkUnitF4; ++k) cp_async_cg16(dst + k * 128 * 16, src + k * 128);
      if (++q == n) q = 0, ++c;
      ++v;
    }
    cp_async_commit();  // empty groups keep the count of groups behind each unit fixed
    fill = fill + 1 == kDepth ? 0 : fill + 1;
  }
};

// The last arriver's sum of stream-K tile ts into acc: the segments' partials in K order, so
// the result does not depend on which segment came last and repeats bit for bit. Called after
// the CTA's last wgmma (writing acc between wgmma stages would make ptxas serialise them), and
// after both consumer warpgroups have finished with the A/B ring: `ring` is this warpgroup's
// half of it (kDepth units). Unit v is chunk v / n of segment first + v % n (n segments): each
// thread copies its own unit slots and reads back only those, so no barrier is needed; a slot
// is refilled after the adds that consumed its registers.
template <int BN, int kDepth>
__device__ __forceinline__ void sk_sum(float (&acc)[BN / 2], const GemmProblem& p, int ts, int G,
                                       int cw, int rows, uint8_t* ring) {
  static_assert(kDepth >= 2 && (BN / 2) % (4 * kSkUnitF4) == 0, "sum ring");
  constexpr int kChunks = BN / 2 / (4 * kSkUnitF4);
  const int t = threadIdx.x % 128;
  const int first = sk_first_cta(p, ts, G);
  // Warps whose rows are all past M sum nothing (nothing of theirs is stored).
  const int n = (t / 32) * 16 < rows ? sk_last_cta(p, ts, G) - first + 1 : 0;
  const uint32_t ring0 = smem_u32(ring) + t * 16;
  const int kb = p.k_blocks;
  SkCopier cp{p.sk_partials + cw * kSkHalfF4 + t, ring0, first,
              sk_slot(p.sk_tiles * kb, kb, first, G, ts), n, kChunks * n};
#pragma unroll 1
  for (int d = 0; d < kDepth; ++d) cp.next<kDepth>();
  int take = 0;  // slot of the unit to add next
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
#pragma unroll
    for (int i = 0; i < 4 * kSkUnitF4; ++i) acc[c * 4 * kSkUnitF4 + i] = 0.f;
#pragma unroll 1
    for (int q = 0; q < n; ++q) {
      cp_async_wait_keep<kDepth - 1>();
      const uint32_t src = ring0 + take * kSkUnitBytes;
#pragma unroll
      for (int k = 0; k < kSkUnitF4; ++k) {
        const float4 v = lds_f4(src + k * 128 * 16);
        float* a = acc + c * 4 * kSkUnitF4 + 4 * k;
        a[0] += v.x, a[1] += v.y, a[2] += v.z, a[3] += v.w;
      }
      take = take + 1 == kDepth ? 0 : take + 1;
      cp.next<kDepth>();
    }
  }
  cp_async_wait_keep<0>();  // no copy may land in the ring after the sum
}

// ---- hook 1: bounded readiness wait ---------------------------------------------------------
// Out of line (the producer's 40-register region stays small) but `inline` for the linker:
// this header is included by more than one translation unit (gemm.cu, fused.cu).
inline __device__ __noinline__ void record_wait_failure(GemmErrorRecord* e, uint32_t code,
                                                        uint32_t operand, uint32_t chunk,
                                                        TileCoord tc, uint64_t observed,
                                                        uint64_t elapsed) {
  if (atomicCAS_system(&e->code, 0u, code) != 0u) return;  // someone else reported first
  volatile GemmErrorRecord* v = e;
  v->operand = operand;
  v->chunk = chunk;
  v->cta = blockIdx.x;
  v->tile_m = static_cast<uint32_t>(tc.m);
  v->tile_n = static_cast<uint32_t>(tc.n);
  v->observed = observed;
  v->elapsed_ns = elapsed;
  __threadfence_system();
}

// Returns true once flag >= epoch; false if it timed out, was aborted, or another CTA failed.
// Scalars by value: a reference into the kernel's parameter space would force a local copy.
inline __device__ __noinline__ bool wait_flag(const uint64_t* flag, uint64_t epoch,
                                              uint64_t timeout,
                                              const volatile uint32_t* abort_word,
                                              GemmErrorRecord* error, uint32_t operand,
                                              uint32_t chunk, TileCoord tc) {
  uint64_t v = ld_acquire_sys(flag);
  if (v >= epoch) return true;
  const uint64_t t0 = globaltimer_ns();
  uint32_t backoff = 32;
  for (uint32_t polls = 1;; ++polls) {
    __nanosleep(backoff);
    backoff = backoff < 1024 ? backoff * 2 : 1024;
    v = ld_acquire_sys(flag);
    if (v >= epoch) return true;
    if ((polls & 15) == 0) {
      const uint64_t elapsed = globaltimer_ns() - t0;
      uint32_t code = kGemmOk;
      if (abort_word != nullptr && *abort_word != 0) {
        code = kGemmAborted;
      } else if (ld_volatile_u32(&error->code) != 0) {
        return false;  // another CTA gave up: stop without overwriting its record
      } else if (elapsed >= timeout) {
        code = kGemmWaitTimeout;
      }
      if (code != kGemmOk) {
        record_wait_failure(error, code, operand, chunk, tc, v, elapsed);
        return false;
      }
    }
  }
}

__device__ __forceinline__ bool wait_operand(const GemmReadyFlags& f, const GemmWaitConfig& w,
                                             uint32_t operand, int row_begin, int row_end,
                                             TileCoord tc) {
  if (f.flags == nullptr) return true;
  uint32_t c0 = static_cast<uint32_t>(row_begin) / f.chunk_rows;
  uint32_t c1 = static_cast<uint32_t>(row_end - 1) / f.chunk_rows;
  if (c0 >= f.num_chunks) c0 = f.num_chunks - 1;
  if (c1 >= f.num_chunks) c1 = f.num_chunks - 1;
  for (uint32_t c = c0; c <= c1; ++c) {
    if (!wait_flag(f.flags + c, w.epoch, w.timeout_ns ? w.timeout_ns : kDefaultWaitTimeoutNs,
                   w.abort_word, w.error, operand, c, tc)) {
      return false;
    }
  }
  return true;
}

// ---- hook 2: the default epilogue -----------------------------------------------------------
// Epilogue concept (what gemm_sm90_kernel calls):
//   template <int kFrag> void store(const float (&acc)[kFrag], int row0, int col0,
//                                   const GemmProblem&) const;
//     called by every consumer thread of a warpgroup whose rows intersect M; the thread owns
//     rows row0 and row0 + 8, columns col0 + 8*j + {0, 1} for j < kFrag/4, with
//     acc[4j + 0..1] at row0 and acc[4j + 2..3] at row0 + 8. Out-of-range rows/columns must be
//     skipped by the epilogue (row < M, col < N; col + 1 < N follows from N % 8 == 0).
//   bool wants_tile_done() const;  uniform over the launch
//   void tile_done(TileCoord, const GemmProblem&) const;
//     called by one thread after all 256 consumer threads have issued the tile's stores.
//   static constexpr bool kOwnsTile;
//     true: instead of the above, every consumer thread calls
//       template <int BN, int kFrag> void tile(float (&acc)[kFrag], uint8_t* staging,
//                                              TileCoord, int cw, const GemmProblem&) const;
//     with its warpgroup's staging buffer (kStagingRounds × 16 KiB, store_tile_tma; named
//     barrier 2 + cw is the warpgroup's), whatever prob.c_tma says, and once after its last tile
//       void consumers_end() const;
//     (before the schedule's consumers_done), where bulk stores it issued must be waited for;
//     and, in every tile's main loop at k-block min(k_blocks, kStages) - 1 (a point that the
//     warpgroup reaches without the other warpgroup's progress, see there), with the tile
//     (its staging buffer: gemm_staging_smem; the previous tile's stores may still read it),
//       template <int BN> void main_loop_point(TileCoord, int cw) const;
//   static constexpr int kStagingRounds;  1 or 2 (GemmTileConfig)
//   static constexpr bool kInitAux;
//     true: thread 0 calls, before the CTA's first barrier,
//       static void init_aux(uint8_t* aux);   (the kAuxBytes region)
//   static constexpr bool kAuxWarps;  (implies kInitAux)
//     true: warps 1 and 2 of the producer warpgroup (56 registers: RegisterSplit) call,
//     instead of returning,
//       void aux_warp(int cw, uint8_t* staging, uint8_t* aux) const;
//     each a helper of consumer warpgroup cw, with that warpgroup's staging buffer. The
//     consumers' side finds the aux region with gemm_aux_smem<BN, kStagingRounds>().
// Registers per thread after setmaxnreg, per warpgroup role. The launch gives every thread 168
// (384 threads, one CTA per SM: the whole register file); what the producer warpgroup gives up,
// the consumers take, so 128 × kProducer + 256 × kConsumer must not exceed 384 × 168, or the
// consumers' setmaxnreg.inc would wait forever. The producer's one issuing thread fits in 40.
// Aux warps (the pusher warps of gemmReduceScatter) run a store loop in the producer warpgroup:
// at 40 ptxas spilled 24-48 bytes there; at 56 nothing spills, and the consumers' 224 leave their
// code unspilled too (twenty-first session, kernels/bench/fused/NOTES.md "The pusher warps'
// registers": no cost beyond the noise on one H200).
template <class Epilogue>
struct RegisterSplit {
  static constexpr int kProducer = Epilogue::kAuxWarps ? 56 : 40;
  static constexpr int kConsumer = Epilogue::kAuxWarps ? 224 : 232;
  static_assert(128 * kProducer + 256 * kConsumer <= 384 * 168, "register file over-committed");
  static_assert(kProducer % 8 == 0 && kConsumer % 8 == 0, "setmaxnreg takes multiples of 8");
};

struct DefaultEpilogue {
  static constexpr bool kOwnsTile = false;
  // Two rounds (3 stages at BN = 256) measured 0.987 × the time over 52 GEMM shapes on one
  // H200 but 1.08 × at 8192³ and 1.02-1.03 × at small M; allGatherGemm lost up to 12 %
  // (kernels/bench/NOTES.md): one.
  static constexpr int kStagingRounds = 1;
  static constexpr bool kInitAux = false;
  static constexpr bool kAuxWarps = false;
  void* c;
  int64_t ldc;
  GemmOutType c_type;
  uint32_t reserved;
  GemmTileSink sink;

  // Applies op(T* element, v0, v1) to the thread's in-range column pairs of rows row0 and
  // row0 + 8 (pointers to column 0 of those rows in the destination).
  template <class T, int kFrag, class Op>
  __device__ __forceinline__ static void apply(const float (&acc)[kFrag], T* row_lo, T* row_hi,
                                               int row0, int col0, const GemmProblem& p, Op op) {
    const bool lo_ok = row0 < p.M;
    const bool hi_ok = row0 + 8 < p.M;
#pragma unroll
    for (int j = 0; j < kFrag / 4; ++j) {
      const int col = col0 + 8 * j;
      if (col < p.N) {
        if (lo_ok) op(row_lo + col, acc[4 * j + 0], acc[4 * j + 1]);
        if (hi_ok) op(row_hi + col, acc[4 * j + 2], acc[4 * j + 3]);
      }
    }
  }

  __device__ __forceinline__ static void put_bf16(__nv_bfloat16* d, float v0, float v1) {
    *reinterpret_cast<__nv_bfloat162*>(d) = __floats2bfloat162_rn(v0, v1);
  }
  __device__ __forceinline__ static void put_f32(float* d, float v0, float v1) {
    *reinterpret_cast<float2*>(d) = make_float2(v0, v1);
  }
  // System scope: a sink's destinations may be peer memory that other GPUs add into too
  // (gemm.h), and only same-scope strong atomics are atomic with each other.
  __device__ __forceinline__ static void add_f32(float* d, float v0, float v1) {
    atomicAdd_system(d, v0);
    atomicAdd_system(d + 1, v1);
  }
  __device__ __forceinline__ static void add_bf16(__nv_bfloat16* d, float v0, float v1) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(v0, v1);
    asm volatile("red.relaxed.sys.global.add.noftz.bf16x2 [%0], %1;" ::"l"(d),
                 "r"(*reinterpret_cast<const uint32_t*>(&v))
                 : "memory");
  }

  // Destination row pointer (as bytes) of C row `row` in the sink.
  __device__ __forceinline__ char* sink_row(int row, int elem_bytes) const {
    const int rpd = static_cast<int>(sink.rows_per_dest);
    const int d = rpd ? min(row / rpd, static_cast<int>(sink.num_dests) - 1) : 0;
    const int64_t local = row - d * rpd;
    return static_cast<char*>(sink.dest[d]) + local * sink.ld * elem_bytes;
  }

  template <int kFrag>
  __device__ __forceinline__ void store(const float (&acc)[kFrag], int row0, int col0,
                                        const GemmProblem& p) const {
    if (c != nullptr) {
      if (c_type == GemmOutType::kBF16) {
        auto* base = static_cast<__nv_bfloat16*>(c);
        apply(acc, base + row0 * ldc, base + (row0 + 8) * ldc, row0, col0, p, put_bf16);
      } else {
        auto* base = static_cast<float*>(c);
        apply(acc, base + row0 * ldc, base + (row0 + 8) * ldc, row0, col0, p, put_f32);
      }
    }
    switch (sink.mode) {
      case GemmSinkMode::kStoreBF16:
        apply(acc, reinterpret_cast<__nv_bfloat16*>(sink_row(row0, 2)),
              reinterpret_cast<__nv_bfloat16*>(sink_row(row0 + 8, 2)), row0, col0, p, put_bf16);
        break;
      case GemmSinkMode::kStoreF32:
        apply(acc, reinterpret_cast<float*>(sink_row(row0, 4)),
              reinterpret_cast<float*>(sink_row(row0 + 8, 4)), row0, col0, p, put_f32);
        break;
      case GemmSinkMode::kAtomicAddF32:
        apply(acc, reinterpret_cast<float*>(sink_row(row0, 4)),
              reinterpret_cast<float*>(sink_row(row0 + 8, 4)), row0, col0, p, add_f32);
        break;
      case GemmSinkMode::kAtomicAddBF16:
        apply(acc, reinterpret_cast<__nv_bfloat16*>(sink_row(row0, 2)),
              reinterpret_cast<__nv_bfloat16*>(sink_row(row0 + 8, 2)), row0, col0, p, add_bf16);
        break;
      default:
        break;
    }
  }

  __device__ __forceinline__ bool wants_tile_done() const { return sink.tile_flags != nullptr; }

  __device__ __forceinline__ void tile_done(TileCoord tc, const GemmProblem& p) const {
    // Release at system scope; cumulative over the tile's stores ordered before it by the
    // consumers' named barrier (see gemm.h, hook 2).
    st_release_sys(sink.tile_flags + static_cast<int64_t>(tc.m) * p.n_blocks + tc.n, sink.epoch);
  }
};

// ---- C through shared memory and TMA ------------------------------------------------------
// One consumer warpgroup writes its 64×BN fragment to its 16 KiB staging buffer one round at a
// time, as two boxes of 64 rows × 128 bytes with 128-B swizzled rows (16-byte chunk c of row r
// sits at chunk c ^ (r % 8)): bf16 C 128 columns per round (two 64×64 boxes; the warp's 4-byte
// writes hit 32 distinct banks), fp32 C 64 columns per round (two 64×32 boxes; 8-byte writes,
// two wavefronts per warp instruction, the minimum for 256 bytes). One thread issues the TMA
// stores, which clip at the tensor map's bounds. Before the buffer is rewritten, the previous
// round's stores must have read it (bulk wait_group.read), published to the warpgroup by its
// named barrier. The fragment goes to rows [row, row + 64) and columns [col, col + BN) of `tm`;
// `issue` (thread 0's) false: staged but not stored. One bulk group per round is committed:
// BN / 128 (bf16) or BN / 64 (fp32) groups. kBufRounds: the rounds the buffer holds (round h
// goes to its 16 KiB part h % kBufRounds; the read wait comes before parts wrap around).
template <int BN, bool kF32>
inline constexpr int kStoreRounds = BN / (kF32 ? 64 : 128);
// Where bf16 column group j (columns 8j + 2q, +1) of staged row `row` lies, in bytes from the
// start of its boxes (64 columns per 8 KiB box, 128-B rows, 16-byte chunk c of row i at
// c ^ (i % 8)): stage_round writes there, and the fused gemmReduceScatter's early fetch
// (fused_gemm.cuh, add_fetched) reads a TMA-loaded partial from there.
__device__ __forceinline__ uint32_t staged_bf16_at(int j, int row, uint32_t q) {
  return static_cast<uint32_t>((j / 8) * 8192 + row * 128) +
         ((static_cast<uint32_t>(j % 8) ^ static_cast<uint32_t>(row % 8)) << 4) + 4 * q;
}
// Writes round h (columns [h * cols, (h + 1) * cols) of the fragment, cols = 64 fp32 or 128
// bf16) of the warpgroup's fragment into the 16 KiB at `part` in the layout above. Only the
// writes: the caller orders them (barriers, proxy fences).
template <bool kF32, int kFrag>
__device__ __forceinline__ void stage_round(const float (&acc)[kFrag], uint8_t* part, int h) {
  constexpr int kColsPerRound = kF32 ? 64 : 128;  // two boxes of 128-byte rows
  constexpr int kJPerRound = kColsPerRound / 8;   // 8-column groups j of the fragment
  constexpr int kJPerBox = kJPerRound / 2;
  const int t = threadIdx.x % 128;
  const int warp = t / 32, lane = t % 32;
  const uint32_t base = smem_u32(part);
  const int r_lo = warp * 16 + lane / 4;
  const uint32_t q = static_cast<uint32_t>(lane % 4);
#pragma unroll
  for (int jj = 0; jj < kJPerRound; ++jj) {
    const int j = h * kJPerRound + jj;
    if constexpr (kF32) {
      const uint32_t box = base + (jj / kJPerBox) * 8192;
      const uint32_t sw = static_cast<uint32_t>(r_lo % 8);  // the swizzle of rows r_lo, r_lo + 8
      // Columns 8*(jj%4) + 2q, +1 of the box: chunk 2*(jj%4) + q/2, byte 8*(q%2) in it.
      const uint32_t chunk = ((2 * (jj % kJPerBox) + q / 2) ^ sw) << 4, off = 8 * (q % 2);
      st_shared_f32x2(box + r_lo * 128 + chunk + off, acc[4 * j + 0], acc[4 * j + 1]);
      st_shared_f32x2(box + (r_lo + 8) * 128 + chunk + off, acc[4 * j + 2], acc[4 * j + 3]);
    } else {
      __nv_bfloat162 lo = __floats2bfloat162_rn(acc[4 * j + 0], acc[4 * j + 1]);
      __nv_bfloat162 hi = __floats2bfloat162_rn(acc[4 * j + 2], acc[4 * j + 3]);
      st_shared_u32(base + staged_bf16_at(jj, r_lo, q), *reinterpret_cast<uint32_t*>(&lo));
      st_shared_u32(base + staged_bf16_at(jj, r_lo + 8, q), *reinterpret_cast<uint32_t*>(&hi));
    }
  }
}
template <int BN, bool kF32, int kFrag, bool kReduce = false, int kBufRounds = 1>
__device__ __forceinline__ void store_tile_tma(const float (&acc)[kFrag], uint8_t* stage_buf,
                                               const CUtensorMap* tm, int cw, int row, int col,
                                               bool issue) {
  constexpr int kColsPerRound = kF32 ? 64 : 128;
  const int t = threadIdx.x % 128;
  const uint32_t bar_id = 2 + cw;
#pragma unroll
  for (int h = 0; h < BN / kColsPerRound; ++h) {
    uint8_t* part = stage_buf + (h % kBufRounds) * 16384;
    if (h % kBufRounds == 0) {
      if (t == 0) bulk_wait_read_all();
      named_barrier_sync(bar_id, 128);
    }
    stage_round<kF32>(acc, part, h);
    fence_proxy_async_shared();
    named_barrier_sync(bar_id, 128);
    if (t == 0 && issue) {
      const int c = col + h * kColsPerRound;
      if constexpr (kReduce) {
        tma_reduce_add_2d(tm, part, c, row);
        tma_reduce_add_2d(tm, part + 8192, c + kColsPerRound / 2, row);
      } else {
        tma_store_2d(tm, part, c, row);
        tma_store_2d(tm, part + 8192, c + kColsPerRound / 2, row);
      }
      bulk_commit();
    }
  }
}
// The engine's own C store: the warpgroup's 64 rows of tile tc.
template <int BN, bool kF32, int kBufRounds, int kFrag>
__device__ __forceinline__ void store_c_tma(const float (&acc)[kFrag], uint8_t* stage_buf,
                                            const CUtensorMap* tm_c, TileCoord tc, int cw,
                                            bool rows_in) {
  store_tile_tma<BN, kF32, kFrag, false, kBufRounds>(acc, stage_buf, tm_c, cw,
                                                     tc.m * kTileM + cw * 64, tc.n * BN, rows_in);
}

// ---- tile schedules ---------------------------------------------------------------------------
// Schedule concept (what gemm_sm90_body calls; const methods, results uniform over the CTA):
//   int cta() const; int num_ctas() const;
//     this CTA's index among the CTAs that run the engine, and their number. (Accessors, not
//     values, so that the plain kernel reads %ctaid / %nctaid where the loops use them, as it
//     always did: the same code and register allocation as before the engine became a body.)
//   static constexpr int kCluster;
//     1, or 2: CTA pairs share B (see the top of this file); static schedules only, no hooks.
//   static constexpr bool kDynamic;
//     false: CTA cta() takes sweep positions cta(), cta() + num_ctas(), ... (round robin, the
//            plain GEMM).
//     true:  the producer thread claims sweep positions one at a time (claim()) and hands each
//            to the consumers in the status word of the tile's first stage; cta()/num_ctas()
//            are unused. CTAs that join late (e.g. after communication work) balance the load.
//   int claim() const;                                  dynamic only: the next sweep position
//                                                       (>= prob.sweep: none left)
//   TileCoord coord(const GemmProblem&, int t) const;   sweep position -> tile
//   const CUtensorMap* a_source(const CUtensorMap* tm_a, TileCoord tc, int& row) const;
//     producer thread, once per tile: the tensor map to load the tile's A block from and the
//     block's first row in it (tm_a and tc.m * kTileM, except where a schedule reads some
//     blocks from another tensor of the same K, e.g. allGatherGemm's own shard)
//   bool has_waits(const GemmProblem&) const;           whether wait() must be called
//   template <int BN> bool wait(const GemmProblem&, TileCoord) const;
//     producer thread, before the tile's first load: true once the tile's operands are
//     readable, false to stop this CTA (the schedule has recorded why). After a true return
//     the body issues fence.proxy.async.global before the TMA loads.
//   static constexpr bool kStoresA; bool stores_a(TileCoord) const;
//     kStoresA: for tiles where stores_a() is true, consumer thread 128 TMA-stores each A
//     slice of the tile, as it arrives in shared memory, through tm_a at the tile's rows (a
//     copy that costs no SM time: allGatherGemm writes its own rows into the gathered output
//     this way). The stage is released only after the store has read it.
//   void consumers_done() const;
//     every consumer thread (256), once, after its last tile or a stop, before returning.
//     (Producer threads return without a call: code after setmaxnreg.dec runs in 40
//     registers, so anything heavy at the end belongs to the consumers.)
//   static constexpr bool kStreamK;  (optional, false when absent)
//     true: after its sweep positions the CTA computes its run of prob.sk_tiles' stream-K
//     iterations (static, single-CTA schedules without hooks and epilogues that do not own
//     the tile; the plain GEMM). cta() and num_ctas() place it in the split.
inline constexpr uint32_t kStageEnd = 0xFFFFFFFEu;   // dynamic: no more tiles
inline constexpr uint32_t kStageStop = 0xFFFFFFFFu;  // dynamic: the producer stopped (failure)

template <class S, class = void>
struct schedule_stream_k : std::false_type {};
template <class S>
struct schedule_stream_k<S, std::void_t<decltype(S::kStreamK)>>
    : std::integral_constant<bool, S::kStreamK> {};

// The plain GEMM's schedule: round robin, hook-1 waits from GemmProblem::wait (gemm.h), then
// the stream-K run where the plan asks for one. With kPair, each cluster of two CTAs takes the
// positions of the pair sweep round robin (no stream-K).
template <bool kPair>
struct PlainSchedule {
  static constexpr int kCluster = kPair ? 2 : 1;
  static constexpr bool kDynamic = false;
  static constexpr bool kStreamK = !kPair;
  static constexpr bool kStoresA = false;
  __device__ __forceinline__ bool stores_a(TileCoord) const { return false; }
  __device__ __forceinline__ int a_store_stride(const GemmProblem&) const { return 1; }
  __device__ __forceinline__ int cta() const { return static_cast<int>(blockIdx.x) / kCluster; }
  __device__ __forceinline__ int num_ctas() const { return static_cast<int>(gridDim.x) / kCluster; }
  __device__ __forceinline__ int claim() const { return 0; }
  __device__ __forceinline__ TileCoord coord(const GemmProblem& p, int t) const {
    // %cluster_ctarank read at each call: a member would stay live in the consumers' loop.
    if constexpr (kPair) return pair_tile_coord(p, t, static_cast<int>(cluster_ctarank()));
    return tile_coord(p, t);
  }
  __device__ __forceinline__ const CUtensorMap* a_source(const CUtensorMap* tm_a, TileCoord tc,
                                                         int& row) const {
    row = tc.m * kTileM;
    return tm_a;
  }
  __device__ __forceinline__ bool has_waits(const GemmProblem& p) const {
    return p.wait.a.flags != nullptr || p.wait.b.flags != nullptr;
  }
  template <int BN>
  __device__ __forceinline__ bool wait(const GemmProblem& p, TileCoord tc) const {
    return wait_operand(p.wait.a, p.wait, 0, tc.m * kTileM, min(p.M, (tc.m + 1) * kTileM), tc) &&
           wait_operand(p.wait.b, p.wait, 1, tc.n * BN, min(p.N, (tc.n + 1) * BN), tc);
  }
  __device__ __forceinline__ void consumers_done() const {}
};

// The dynamic shared memory's aux region (layout above) of an engine with this configuration,
// for the epilogue's consumer side (the engine's own layout below must agree).
template <int BN, int kStagingRounds>
__device__ __forceinline__ uint8_t* gemm_aux_smem() {
  using Cfg = GemmTileConfig<BN, kStagingRounds>;
  extern __shared__ __align__(128) uint8_t smem_raw[];
  const uintptr_t base = (reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023};
  return reinterpret_cast<uint8_t*>(base) + Cfg::kStages * Cfg::kStageBytes +
         2 * Cfg::kStagingBytes;
}

// Consumer warpgroup cw's staging buffer (layout above), found the same way: an address derived
// from the shared-memory base, not a register kept live through the main loop.
template <int BN, int kStagingRounds>
__device__ __forceinline__ uint8_t* gemm_staging_smem(int cw) {
  using Cfg = GemmTileConfig<BN, kStagingRounds>;
  return gemm_aux_smem<BN, kStagingRounds>() - (2 - cw) * Cfg::kStagingBytes;
}

// ---- the engine's steps, shared by its round-robin and stream-K loops ------------------------
// Producer: arms stage `stage` for one K slice and issues its TMA loads (A rows a_row.. of
// a_map; B's N-block n_block, or this CTA's half of it in a CTA pair).
template <int BN, bool kBKN, int kCluster, class Cfg>
__device__ __forceinline__ void load_stage(uint8_t* smem_a, uint8_t* smem_b, uint64_t* full,
                                           int stage, const CUtensorMap* a_map,
                                           const CUtensorMap& tm_b, int kb, int a_row,
                                           int n_block) {
  mbar_arrive_expect_tx(&full[stage], Cfg::kStageBytes);
  tma_load_2d(smem_a + stage * Cfg::kABytes, a_map, &full[stage], kb * kTileK, a_row);
  uint8_t* b_dst = smem_b + stage * Cfg::kBBytes;
  if constexpr (kCluster > 1) {
    // This CTA's half of B (rows, or 64-column slabs), into both CTAs (mask 0b11). kNK's
    // half starts at a multiple of 1024 B, so the 128-B swizzle pattern is unchanged.
    constexpr uint16_t kBoth = 3;
    const uint32_t crank = cluster_ctarank();  // read here: the producer has 40 registers
    if constexpr (!kBKN) {
      tma_load_2d_multicast(b_dst + crank * (Cfg::kBBytes / 2), &tm_b, &full[stage],
                            kb * kTileK, n_block * BN + static_cast<int>(crank) * (BN / 2),
                            kBoth);
    } else {
#pragma unroll
      for (int j = 0; j < BN / 128; ++j) {
        const int slab = static_cast<int>(crank) * (BN / 128) + j;
        tma_load_2d_multicast(b_dst + slab * 8192, &tm_b, &full[stage], n_block * BN + slab * 64,
                              kb * kTileK, kBoth);
      }
    }
  } else if constexpr (!kBKN) {
    tma_load_2d(b_dst, &tm_b, &full[stage], kb * kTileK, n_block * BN);
  } else {
#pragma unroll
    for (int j = 0; j < BN / 64; ++j) {
      tma_load_2d(b_dst + j * 8192, &tm_b, &full[stage], n_block * BN + j * 64, kb * kTileK);
    }
  }
}

// Consumer warpgroup: the 4 wgmma (k16) of the K slice in `stage` into acc (accumulate false:
// the slice starts the sum), one wgmma group left in flight.
template <int BN, bool kBKN, class Cfg>
__device__ __forceinline__ void mma_stage(float (&acc)[BN / 2], uint32_t a_base, uint32_t b_base,
                                          int stage, bool accumulate) {
  const uint64_t da = smem_desc_sw128(a_base + stage * Cfg::kABytes, 16, 1024);
  uint64_t db;
  if constexpr (!kBKN) {
    db = smem_desc_sw128(b_base + stage * Cfg::kBBytes, 16, 1024);
  } else {
    db = smem_desc_sw128(b_base + stage * Cfg::kBBytes, 8192, 1024);
  }
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kTileK / 16; ++kk) {
    // K-major: +32 B per k16 inside the swizzled 128-B row; N-major: +16 rows of 128 B.
    const uint64_t dbk = db + (kBKN ? (kk * 2048) >> 4 : (kk * 32) >> 4);
    const uint64_t dak = da + ((kk * 32) >> 4);
    if constexpr (BN == 256) {
      wgmma_m64n256k16<kBKN ? 1 : 0>(acc, dak, dbk, accumulate || kk != 0);
    } else {
      wgmma_m64n128k16<kBKN ? 1 : 0>(acc, dak, dbk, accumulate || kk != 0);
    }
  }
  wgmma_commit();
  wgmma_wait<1>();
}

// Consumer warpgroup cw: a finished tile to C (through TMA when prob.c_tma) and to the
// epilogue (register path, sink, tile flags), for epilogues that do not own the tile.
template <int BN, int kStagingRounds, class Epilogue>
__device__ __forceinline__ void finish_tile(const float (&acc)[BN / 2], uint8_t* staging,
                                            const CUtensorMap& tm_c, TileCoord tc, int cw,
                                            const GemmProblem& prob, const Epilogue& epi) {
  const int warp = (threadIdx.x / 32) % 4;
  const int lane = threadIdx.x % 32;
  const bool rows_in = tc.m * kTileM + cw * 64 < prob.M;
  if (prob.c_tma == kCTmaBF16) {
    store_c_tma<BN, false, kStagingRounds>(acc, staging, &tm_c, tc, cw, rows_in);
  } else if (prob.c_tma == kCTmaF32) {
    store_c_tma<BN, true, kStagingRounds>(acc, staging, &tm_c, tc, cw, rows_in);
  }
  if (rows_in) {
    const int row0 = tc.m * kTileM + cw * 64 + warp * 16 + lane / 4;
    const int col0 = tc.n * BN + 2 * (lane % 4);
    epi.store(acc, row0, col0, prob);
  }
  if (epi.wants_tile_done()) {
    named_barrier_sync(1, 256);
    if (threadIdx.x == 128) epi.tile_done(tc, prob);
  }
}

// ---- the engine -----------------------------------------------------------------------------
// Every thread of the CTA (384) calls this once; it returns when the CTA has no more tiles (or
// stopped). The CTA's place among the computing CTAs comes from the schedule (cta(),
// num_ctas()). It uses the whole dynamic shared memory (GemmTileConfig<BN,
// Epilogue::kStagingRounds>::kSmemBytes) and named barriers 1..3; the caller may use barrier 0
// (__syncthreads) before the call only.
template <int BN, bool kBKN, class Epilogue, class Schedule>
__device__ __forceinline__ void gemm_sm90_body(const CUtensorMap& tm_a, const CUtensorMap& tm_b,
                                               const CUtensorMap& tm_c, const GemmProblem& prob,
                                               const Epilogue& epi, const Schedule& sched) {
  using Cfg = GemmTileConfig<BN, Epilogue::kStagingRounds>;
  constexpr int kStages = Cfg::kStages;
  constexpr bool kDyn = Schedule::kDynamic;
  constexpr int kCluster = Schedule::kCluster;
  static_assert(kCluster == 1 || (kCluster == 2 && !kDyn), "CTA pairs: static schedules only");
  constexpr bool kStreamK = schedule_stream_k<Schedule>::value;
  static_assert(!kStreamK || (!kDyn && kCluster == 1 && !Schedule::kStoresA &&
                              !Epilogue::kOwnsTile && !Epilogue::kInitAux),
                "stream-K: static single-CTA schedules, epilogues that leave the tile and the "
                "aux region to the engine");
  // 128-byte aligned, as the fused allGatherGemm's pulls stage their bulk copies there (every
  // kernel of a module shares one base): each kernel of the engine sees the same base whichever
  // other kernels its translation unit holds. The ring itself starts at the next 1024 bytes
  // (the 128-byte swizzle's pattern repeats every 1024).
  extern __shared__ __align__(128) uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>(
      (reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~static_cast<uintptr_t>(1023));
  uint8_t* smem_a = smem;
  uint8_t* smem_b = smem + kStages * Cfg::kABytes;
  uint8_t* staging = smem_b + kStages * Cfg::kBBytes;
  uint8_t* aux = staging + 2 * Cfg::kStagingBytes;  // where gemm_aux_smem finds it
  uint64_t* full = reinterpret_cast<uint64_t*>(aux + Cfg::kAuxBytes);
  uint64_t* empty = full + kStages;
  uint64_t* done = empty + kStages;  // CTA pairs: the partner's 8 consumer warps are done
  volatile uint32_t* status = reinterpret_cast<volatile uint32_t*>(done + 1);

  const int wg = threadIdx.x / 128;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], 8 * kCluster);
      status[s] = 0;
    }
    mbar_init(done, 8);
    if constexpr (Epilogue::kInitAux) Epilogue::init_aux(aux);
    mbar_init_fence();
  } else if (threadIdx.x == 32) {
    tma_prefetch_desc(&tm_a);
    tma_prefetch_desc(&tm_b);
    if (prob.c_tma) tma_prefetch_desc(&tm_c);
  }
  __syncthreads();
  // The partner's multicasts and arrivals target this CTA's barriers: initialised first.
  if constexpr (kCluster > 1) cluster_sync();
  // The consumers' last act (CTA pairs): tell the partner that this CTA's consumers are done
  // (after their last release, which arrives on the partner's empty barrier), then wait until
  // the partner's are. Then nothing of the partner touches this CTA's shared memory any more:
  // its producer's last multicasts landed before this CTA's consumers saw their full barriers.
  // (A cluster barrier would need the producer threads too; one in the producer's 40-register
  // region made ptxas spill.)
  auto leave_cluster = [done] {
    if constexpr (kCluster > 1) {
      if (threadIdx.x % 32 == 0) {
        mbar_arrive_cluster(mapa_shared(smem_u32(done), cluster_ctarank() ^ 1));
        mbar_wait_cluster(done, 0);
      }
      __syncwarp();
    }
  };

  if (wg == 0) {
    // ---------------- producer ----------------
    setmaxnreg_dec<RegisterSplit<Epilogue>::kProducer>();
    if constexpr (Epilogue::kAuxWarps) {
      const int w = threadIdx.x / 32;
      if (w == 1 || w == 2) {
        epi.aux_warp(w - 1, staging + (w - 1) * Cfg::kStagingBytes, aux);
        return;
      }
    }
    if (threadIdx.x != 0) return;
    const bool waits = sched.has_waits(prob);
    int stage = 0;
    uint32_t phase = 0;
    for (int t = kDyn ? sched.claim() : sched.cta(); t < prob.sweep;
         t = kDyn ? sched.claim() : t + sched.num_ctas()) {
      const TileCoord tc = sched.coord(prob, t);
      if (waits) {
        const bool ok = sched.template wait<BN>(prob, tc);
        if (!ok) {
          // Tell the consumers to stop at this tile: a stage that carries no data.
          mbar_wait(&empty[stage], phase ^ 1);
          status[stage] = kDyn ? kStageStop : 1u;
          mbar_arrive(&full[stage]);
          return;
        }
        fence_proxy_async_global();
      }
      int a_row = 0;
      const CUtensorMap* a_map = sched.a_source(&tm_a, tc, a_row);
      for (int kb = 0; kb < prob.k_blocks; ++kb) {
        mbar_wait(&empty[stage], phase ^ 1);
        if (kDyn && kb == 0) status[stage] = static_cast<uint32_t>(t);
        load_stage<BN, kBKN, kCluster, Cfg>(smem_a, smem_b, full, stage, a_map, tm_b, kb, a_row,
                                            tc.n);
        if (++stage == kStages) {
          stage = 0;
          phase ^= 1;
        }
      }
    }
    if constexpr (kStreamK) {
      // The CTA's run of stream-K iterations: segments [kb0, kb1) of one tile each.
      const SkRun run = sk_run(prob, sched.cta(), sched.num_ctas());
      for (int it = run.it; it < run.end;) {
        const SkSegment sg = sk_segment(prob, it, run.end);
        const TileCoord tc = sched.coord(prob, prob.sweep + sg.ts);
        int a_row = 0;
        const CUtensorMap* a_map = sched.a_source(&tm_a, tc, a_row);
        for (int kb = sg.kb0; kb < sg.kb1; ++kb) {
          mbar_wait(&empty[stage], phase ^ 1);
          load_stage<BN, kBKN, 1, Cfg>(smem_a, smem_b, full, stage, a_map, tm_b, kb, a_row, tc.n);
          if (++stage == kStages) {
            stage = 0;
            phase ^= 1;
          }
        }
        it += sg.kb1 - sg.kb0;
      }
    }
    if constexpr (kDyn) {
      // The consumers cannot know the tile count: an empty stage ends their loop.
      mbar_wait(&empty[stage], phase ^ 1);
      status[stage] = kStageEnd;
      mbar_arrive(&full[stage]);
    }
  } else {
    // ---------------- consumers ----------------
    setmaxnreg_inc<RegisterSplit<Epilogue>::kConsumer>();
    const int cw = wg - 1;  // which 64-row half of the tile
    const int lane = threadIdx.x % 32;
    float acc[BN / 2];
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) acc[i] = 0.f;

    const uint32_t a_base = smem_u32(smem_a) + cw * 64 * 128;
    const uint32_t b_base = smem_u32(smem_b);
    // CTA pairs: the partner's producer refills this CTA's stages too, so its empty barrier
    // hears of the release as well. Its address is recomputed at each release (%cluster_ctarank
    // and mapa on lane 0): one more live register in this loop makes ptxas spill.
    auto release = [empty](int s) {
      mbar_arrive(&empty[s]);
      if constexpr (kCluster > 1) {
        mbar_arrive_remote(mapa_shared(smem_u32(&empty[s]), cluster_ctarank() ^ 1));
      }
    };
    int stage = 0;
    uint32_t phase = 0;
    // Schedule::kStoresA: the thread that copies the tile's A slices (see the concept above).
    constexpr bool kStoresA = Schedule::kStoresA;
    FC_GEMM_TRACE_POINT(0, globaltimer_ns());
#if defined(FC_GEMM_TRACE)
    uint64_t tr_done = 0, tr_gap = 0, tr_gaps = 0, tr_epi = 0, tr_wait = 0;
    const uint64_t tr_clock0 = clock64();
#endif
    for (int t = kDyn ? 0 : sched.cta(); kDyn || t < prob.sweep;
         t += kDyn ? 0 : sched.num_ctas()) {
      TileCoord tc;
      if constexpr (!kDyn) tc = sched.coord(prob, t);
      int prev = 0;
      // The tile's first slice is waited for here, outside the MMA loop: no wgmma is in flight
      // at this point, so the early exit costs the steady state nothing.
#if defined(FC_GEMM_TRACE)
      const uint64_t tr_w0 = globaltimer_ns();
#endif
      mbar_wait(&full[stage], phase);
#if defined(FC_GEMM_TRACE)
      if (tr_done != 0) tr_wait += globaltimer_ns() - tr_w0;
#endif
      if constexpr (kDyn) {
        const uint32_t s = status[stage];
        if (s >= kStageEnd) break;  // no more tiles, or the producer stopped: no data
        tc = sched.coord(prob, static_cast<int>(s));
      } else if (status[stage] != 0) {  // the producer stopped (hook 1)
        if (threadIdx.x % 128 == 0) bulk_wait_all();
        sched.consumers_done();
        leave_cluster();
        return;
      }
      const bool store_a = kStoresA && threadIdx.x == 128 && sched.stores_a(tc);
      // The slices this tile stores: kb ≡ a_phase (mod a_stride); a stride of 1 stores all.
      const int a_stride = store_a ? sched.a_store_stride(prob) : 1;
      const int a_phase = tc.n % a_stride;
      bool stored_prev = false;
#if defined(FC_GEMM_TRACE)
      if (tr_done != 0) tr_gap += globaltimer_ns() - tr_done, ++tr_gaps;
#endif
      for (int kb = 0; kb < prob.k_blocks; ++kb) {
        if (kb > 0) mbar_wait(&full[stage], phase);
        const bool store_slice = store_a && kb % a_stride == a_phase;
        if (store_slice) {
          // The slice landed (full barrier, async proxy); the store reads it in that proxy.
          tma_store_2d(&tm_a, smem_a + stage * Cfg::kABytes, kb * kTileK, tc.m * kTileM);
          bulk_commit();
        }
        mma_stage<BN, kBKN, Cfg>(acc, a_base, b_base, stage, kb != 0);
        if constexpr (Epilogue::kOwnsTile) {
          // Stage kb <= kStages - 1 of a tile is loaded as soon as both warpgroups finished
          // the previous tile's main loop, whatever the other warpgroup does next.
          if (kb == min(prob.k_blocks, kStages) - 1) epi.template main_loop_point<BN>(tc, cw);
        }
        // The previous slice's store has read its stage before the stage is released (all
        // but the store just issued, if any).
        if (stored_prev) {
          if (store_slice) {
            bulk_wait_read_keep<1>();
          } else {
            bulk_wait_read_all();
          }
        }
        stored_prev = store_slice;
        if (kb > 0 && lane == 0) release(prev);
        prev = stage;
        if (++stage == kStages) {
          stage = 0;
          phase ^= 1;
        }
      }
      wgmma_wait<0>();
      reg_fence(acc);
#if defined(FC_GEMM_TRACE)
      tr_done = globaltimer_ns();
#endif
      if (store_a) bulk_wait_read_all();
      if (lane == 0) release(prev);

      if constexpr (Epilogue::kOwnsTile) {
        epi.template tile<BN>(acc, staging + cw * Cfg::kStagingBytes, tc, cw, prob);
      } else {
        finish_tile<BN, Epilogue::kStagingRounds>(acc, staging + cw * Cfg::kStagingBytes, tm_c,
                                                  tc, cw, prob, epi);
      }
#if defined(FC_GEMM_TRACE)
      tr_epi += globaltimer_ns() - tr_done;
#endif
    }
    FC_GEMM_TRACE_POINT(1, globaltimer_ns());
    FC_GEMM_TRACE_POINT(10, tr_clock0);
    FC_GEMM_TRACE_POINT(11, clock64());
    FC_GEMM_TRACE_POINT(8, tr_epi);
    FC_GEMM_TRACE_POINT(9, tr_wait);
    FC_GEMM_TRACE_POINT(6, tr_gap);
    FC_GEMM_TRACE_POINT(7, tr_gaps);
    if constexpr (kStreamK) {
      // The same run as the producer's. Each segment's partial goes to the workspace
      // (sk_arrive); the tiles whose last segment this warpgroup computed are summed and
      // stored after its last wgmma (sk_sum).
      const int c = sched.cta();
      const SkRun run = sk_run(prob, c, sched.num_ctas());
      int store0 = -1, store1 = -1;  // tiles whose last segment this warpgroup computed
      for (int it = run.it; it < run.end;) {
        const SkSegment sg = sk_segment(prob, it, run.end);
        const int ts = sg.ts, kb0 = sg.kb0, kb1 = sg.kb1;
        // A fragment per segment, dead after sk_arrive: one that lived on through the next
        // segment's wgmma made ptxas serialise every wgmma of the kernel (C7515).
        float seg[BN / 2];
#pragma unroll
        for (int i = 0; i < BN / 2; ++i) seg[i] = 0.f;
        int prev = 0;
        for (int kb = kb0; kb < kb1; ++kb) {
          mbar_wait(&full[stage], phase);
          mma_stage<BN, kBKN, Cfg>(seg, a_base, b_base, stage, kb != kb0);
          if (kb > kb0 && lane == 0) release(prev);
          prev = stage;
          if (++stage == kStages) {
            stage = 0;
            phase ^= 1;
          }
        }
        wgmma_wait<0>();
        reg_fence(seg);
        if (lane == 0) release(prev);
        // A warpgroup whose rows are all past M has nothing to add or store.
        const int rows = prob.M - (sched.coord(prob, prob.sweep + ts).m * kTileM + cw * 64);
        if (rows > 0 && sk_arrive<BN>(seg, prob, ts, c, run.G, cw, rows, aux)) {
          (store0 < 0 ? store0 : store1) = ts;
        }
        it += kb1 - kb0;
      }
      // The sums copy partials into the A/B ring: both warpgroups' wgmma have finished reading
      // it (each waited for its last), and the producer has no load outstanding (every stage
      // it filled in this run was consumed). Both warpgroups walk the same run, so both reach
      // this barrier, summing or not.
      FC_GEMM_TRACE_POINT(2, globaltimer_ns());
      if (run.it < run.end) named_barrier_sync(1, 256);
      FC_GEMM_TRACE_POINT(3, globaltimer_ns());
      FC_GEMM_TRACE_POINT(5, (store0 >= 0) + (store1 >= 0));
#pragma unroll 1
      for (int i = 0; i < 2; ++i) {
        const int ts = i == 0 ? store0 : store1;
        if (ts < 0) break;
        const TileCoord tc = sched.coord(prob, prob.sweep + ts);
        sk_sum<BN, sk_sum_depth<Cfg>()>(acc, prob, ts, run.G, cw,
                                        prob.M - (tc.m * kTileM + cw * 64),
                                        smem + (cw == 0 ? 0 : kStages * Cfg::kStageBytes / 2));
        finish_tile<BN, Epilogue::kStagingRounds>(acc, staging + cw * Cfg::kStagingBytes, tm_c, tc,
                                                  cw, prob, epi);
      }
    }
    // Smem must outlive the stores' reads, and the A stores must be complete.
    if ((prob.c_tma || kStoresA) && threadIdx.x % 128 == 0) bulk_wait_all();
    FC_GEMM_TRACE_POINT(4, globaltimer_ns());
    if constexpr (Epilogue::kOwnsTile) epi.consumers_end();
    sched.consumers_done();
    leave_cluster();
  }
}

// ---- the plain GEMM kernel --------------------------------------------------------------------
// kPair: launched in clusters of 2 (cudaLaunchAttributeClusterDimension), grid even. Launched
// early (early_launch.h): the stream's previous kernel is complete before the body starts. A
// launch with readiness waits (hook 1) does not release its dependents early: their CTAs would
// hold SMs that the kernels it waits for, on other streams, may need.
template <int BN, bool kBKN, bool kPair, class Epilogue>
__global__ void __launch_bounds__(kGemmThreads, 1)
    gemm_sm90_kernel(const __grid_constant__ CUtensorMap tm_a,
                     const __grid_constant__ CUtensorMap tm_b,
                     const __grid_constant__ CUtensorMap tm_c,
                     const __grid_constant__ GemmProblem prob,
                     const __grid_constant__ Epilogue epi) {
  pdl_wait();
  if (prob.wait.a.flags == nullptr && prob.wait.b.flags == nullptr) pdl_release_dependents();
  gemm_sm90_body<BN, kBKN>(tm_a, tm_b, tm_c, prob, epi, PlainSchedule<kPair>{});
}

// ---- host side: what a launch of the engine needs ----------------------------------------------
// gemm.cu's launch_gemm and the fused launchers share the argument checks and the set-up.
struct GemmPlan {
  CUtensorMap ta, tb, tc;  // A, B, and C (C only when prob.c_tma)
  GemmProblem prob;
  DefaultEpilogue epi;     // C (when not through TMA) and the tile sink of the arguments
  int grid;                // CTAs of a plain launch: min(computing CTAs, tiles), or 2 × the
                           // pairs (min(computing CTAs / 2, pair sweep)); the launcher may
                           // lower it to the clusters that fit at once
  int tile_n;              // 128 or 256
  int cluster;             // 1, or 2: CTA pairs share B (plain launches only)
  bool kn;                 // B is K×N
  bool pingpong;           // plain launches: consumers take turns (gemm_pingpong.cuh)
};

// The tensor map of an A operand as gemm_plan encodes it (rows × K bf16, row stride lda
// elements, 128 × 64 boxes): for schedules that read some A blocks from another tensor.
bool encode_a_map(CUtensorMap* map, const __nv_bfloat16* A, int rows, int K, int64_t lda);
// A tensor map that store_tile_tma writes: rows × cols, row stride ld elements, bf16 or fp32
// (the 64-row boxes of the engine's C store).
bool encode_store_map(CUtensorMap* map, void* base, int rows, int cols, int64_t ld, bool f32);

// Checks `a` against the gemm.h contract and fills `plan` for `a.num_ctas` computing CTAs
// (0: one per SM of the current device). cudaErrorInvalidValue for a contract violation.
cudaError_t gemm_plan(const GemmArgs& a, GemmPlan* plan);

// Raises `kernel`'s dynamic shared-memory limit to `bytes` on the current device, once per
// device (the attribute is per device; `opted` remembers which of the first 64 have it).
inline cudaError_t gemm_opt_in_smem(const void* kernel, size_t bytes,
                                    std::atomic<uint64_t>& opted) {
  int dev = 0;
  if (cudaError_t e = cudaGetDevice(&dev); e != cudaSuccess) return e;
  const uint64_t bit = 1ull << (dev & 63);
  if ((opted.load(std::memory_order_relaxed) & bit) != 0) return cudaSuccess;
  if (cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(bytes));
      e != cudaSuccess) {
    return e;
  }
  opted.fetch_or(bit, std::memory_order_relaxed);
  return cudaSuccess;
}

}  // namespace fusedcomm::kernels::detail
