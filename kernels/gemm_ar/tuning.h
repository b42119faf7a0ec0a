// gemmAllReduce's tuned values. Its composed paths run gemmReduceScatter's fused kernel
// (gemm_rs/tuning.h) and the collectives (collectives/tuning.h); the choice among its paths is
// in kernels/common/fused_choice.h with the other fused ops'. The one-shot kernel's values
// below were chosen on H200 (2 GPUs, NVLink); docs/performance.md has the measurements.
#pragma once

namespace fusedcomm::kernels::tuning {

// One-shot kernel (gemm_ar/detail/ar_oneshot_kernel.cuh): tile height from M: 16 or 32 rows
// with mma.sync (a decode batch of one row still runs a whole m16 fragment, the cheapest for a
// product bound by reading W_r), then 64 or 128 rows with wgmma (ar_oneshot_wgmma.cuh: one or
// two consumer warpgroups sharing each W_r slice, so that W_r is read once up to 128 rows).
inline constexpr int kArTileM16MaxM = 16;
inline constexpr int kArTileM32MaxM = 32;
inline constexpr int kArTileM64MaxM = 64;
// Tile width: for mma.sync tiles the widest of 128, 64 and 32 columns that still gives this many
// tiles (so that nearly every SM streams its own columns of W_r; narrower tiles cost nothing at
// decode sizes, where W_r is read once whatever the width, and split-K would add a pass through
// memory); for wgmma tiles 128 columns where those alone give this many tiles, else 64 (on the
// four Llama row-parallel shapes at W = 2, M = 33-128, 64-wide tiles with half the split of
// 128-wide ones took 0.81-1.05 x their time, geomean 0.92; the losses, 1.03-1.05 x, at M = 33
// and at N = 8192, K_r = 14336, M = 128).
inline constexpr int kArFillTiles = 112;
// Split-K, where the tiles are too few (32-column mma.sync tiles, or wgmma ones): at most
// kArMaxSplits splits of a tile, as many as fill the SMs with tiles · splits units, each split at
// least kArMinSplitK long along K (shorter ones pay the split's store and sum more than they
// gain). The workspace is sized for the largest split any rank may pick: min(kArMaxSplits,
// kArSplitUnits / tiles) (rank-uniform).
inline constexpr int kArMaxSplits = 8;
inline constexpr int kArSplitUnits = 256;
inline constexpr int kArMinSplitK = 512;

}  // namespace fusedcomm::kernels::tuning
