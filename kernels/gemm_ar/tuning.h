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
// mma.sync tile width: the widest of 128, 64 and 32 columns that still gives this many tiles (so that
// nearly every SM streams its own columns of W_r; narrower tiles cost nothing at decode sizes,
// where W_r is read once whatever the width, and split-K would add a pass through memory).
inline constexpr int kArFillTiles = 112;
// wgmma tile width: 128 columns where that gives this many tiles, else 64 (more tiles, less
// split K, A read twice as often per W_r byte).
inline constexpr int kArWgWideMinTiles = 64;
// Split-K, where the tiles are too few (32-column mma.sync tiles, or wgmma ones): at most kArMaxSplits splits of a tile, as
// many as fill the SMs with tiles · splits units, each split at least kArMinSplitK long along K (shorter ones pay the split's store and
// sum more than they gain). The workspace is sized for the largest split
// any rank may pick: min(kArMaxSplits, kArSplitUnits / tiles) (rank-uniform).
inline constexpr int kArMaxSplits = 8;
inline constexpr int kArSplitUnits = 256;
inline constexpr int kArMinSplitK = 512;

}  // namespace fusedcomm::kernels::tuning
