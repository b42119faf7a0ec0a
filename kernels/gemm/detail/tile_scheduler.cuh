// The engine's tile schedules (see gemm_sm90.cuh): the grouped raster and its rotation, CTA
// pairs' sweep, the schedule concept that gemm_sm90_body calls, and the plain GEMM's schedule.
// The fused kernels' schedules (kernels/common/fused_schedule.cuh, AgSchedule, RsSchedule)
// implement the same concept.
#pragma once

#include <cstdint>
#include <type_traits>
#include <utility>

#include "kernels/common/sm90_primitives.cuh"
#include "kernels/gemm/detail/gemm_config.cuh"
#include "kernels/gemm/detail/readiness_wait.cuh"

namespace fusedcomm::kernels::detail {

// Grouped raster over `rows` row units: group g covers units [g*group, +group), swept column
// by column, so the CTAs running at once share a few A panels and a few B panels in L2.
// (Host too: the host-side sweeps that the geometry tests check.)
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

//   int b_offset(TileCoord) const;  (optional, 0 when absent)
//     producer thread, once per tile: rows of B's tensor map before the tile's weight, along N
//     (kNK) or K (kKN); a grouped GEMM (kernels/moe/) keeps every group's weight in one map.
template <class S, class = void>
struct schedule_has_b_offset : std::false_type {};
template <class S>
struct schedule_has_b_offset<S, std::void_t<decltype(std::declval<const S&>().b_offset(TileCoord{}))>>
    : std::true_type {};
template <class S>
__device__ __forceinline__ int schedule_b_offset(const S& s, TileCoord tc) {
  if constexpr (schedule_has_b_offset<S>::value) {
    return s.b_offset(tc);
  } else {
    return 0;
  }
}

template <class S, class = void>
struct schedule_stream_k : std::false_type {};
template <class S>
struct schedule_stream_k<S, std::void_t<decltype(S::kStreamK)>> : std::integral_constant<bool, S::kStreamK> {
};

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

}  // namespace fusedcomm::kernels::detail
