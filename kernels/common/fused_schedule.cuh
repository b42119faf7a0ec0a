// What the fused kernels' GEMM roles share (gemm_sm90.cuh's schedule concept): single CTAs that
// claim sweep positions one at a time from this rank's FusedFlags::tile_claim, and a sweep in
// two parts (this rank's M-blocks and the others), each a grouped raster of its own.
#pragma once

#include <cstdint>

#include "kernels/common/fused_protocol.cuh"
#include "kernels/gemm/detail/gemm_sm90.cuh"

namespace fusedcomm::kernels::detail {

// Sweep position -> tile for a sweep in two parts: this rank's M-blocks [b0, b0 + nb), and the
// others from b0 + nb on (cyclically), each part a grouped raster of its own; `own_first`
// says which part comes first (allGatherGemm: the own rows, ready at the launch;
// gemmReduceScatter: the others, whose partials the owners wait for).
__device__ __forceinline__ TileCoord two_part_raster(const GemmProblem& prob, int t, int b0, int nb,
                                                     bool own_first) {
  const int mb = prob.m_blocks;
  const int own_tiles = nb * prob.n_blocks, rest_tiles = (mb - nb) * prob.n_blocks;
  const int own_t = own_first ? t : t - rest_tiles;
  if (own_t >= 0 && own_t < own_tiles) {
    TileCoord tc = grouped_raster(own_t, nb, prob.group_m, prob.n_blocks);
    tc.m += b0;
    return tc;
  }
  TileCoord tc = grouped_raster(own_first ? t - own_tiles : t, mb - nb, prob.group_m, prob.n_blocks);
  tc.m = (b0 + nb + tc.m) % mb;
  return tc;
}

// The schedule base of the fused kernels: dynamic claims (Params: the kernel's parameter struct,
// with the CommDevice `dev`).
template <class Params>
struct FusedClaims {
  static constexpr int kCluster = 1;
  static constexpr bool kDynamic = true;
  static constexpr bool kStoresA = false;
  const Params* p;  // the kernel's parameter (grid constant)
  uint64_t epoch;

  __device__ __forceinline__ int cta() const { return 0; }
  __device__ __forceinline__ int num_ctas() const { return 1; }
  __device__ __forceinline__ bool stores_a(TileCoord) const { return false; }
  __device__ __forceinline__ int a_store_stride(const GemmProblem&) const { return 1; }
  __device__ __forceinline__ int claim() const {
    return static_cast<int>(atomicAdd(&fused_flags(p->dev, p->dev.rank)->tile_claim, 1u));
  }
  // A from the plan's tensor map (AgSchedule reads some blocks from A_r instead).
  __device__ __forceinline__ const CUtensorMap* a_source(const CUtensorMap* tm_a, TileCoord tc,
                                                         int& row) const {
    row = tc.m * kTileM;
    return tm_a;
  }
};

}  // namespace fusedcomm::kernels::detail
