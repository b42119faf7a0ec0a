// allGatherGemm's tuned values (the fused-vs-decomposed bar is in kernels/common/fused_choice.h).
// Chosen on H200 (2 and 4 GPUs, NVLink); docs/performance.md has the measurements.
#pragma once

#include <cstdint>

namespace fusedcomm::kernels::tuning {

// SM split of the fused kernel with SM pulls: CTAs that pull first, by world size and the
// GEMM's FLOPs per exchanged byte (N_r). The first row with world <= max_world and
// N_r >= min_dim wins (AgGemmArgs::comm_ctas overrides it). Model (~790 TFLOP/s GEMM, ~330 GB/s
// of NVLink pulls per GPU; one pulling CTA keeps 128 KiB of bulk copies in flight): the GEMM
// consumes the peers' rows at (W-1)/W · 790e12 / N_r B/s (N_r = 8192, W = 2: 48 GB/s; N_r =
// 2048, W = 4: 290 GB/s, the link's ceiling), but its first wave already needs peers' rows when
// this rank's shard is under a raster group, so the pull should run near the link's speed from
// the start. Pulling CTAs join the GEMM when their chunks are done, so a few too many cost
// little. Measured: at W = 4 the counts below were best or within 1.5 % of the best at N_r =
// 2048-14336; at W = 2 every count from 4 to 20 was within noise. The rows below N_r = 2048 and
// W = 3 follow the model, unmeasured.
struct AgSplitRow {
  int max_world;
  int min_dim;
  int ctas;
};
inline constexpr AgSplitRow kAgSplit[] = {
    {2, 8192, 16}, {2, 4096, 20}, {2, 2048, 24}, {2, 0, 32},
    {8, 8192, 8},  {8, 4096, 16}, {8, 2048, 24}, {8, 0, 32},
};

// One pull work item moves about this much (a slice of a chunk), so that many CTAs work on the
// chunks the GEMM needs next.
inline constexpr int64_t kAgSliceBytes = 128 << 10;

// kAuto's copy-engine exchange (AgExchange): at W = 2 up to this N_r (where the exchange is
// largest against its GEMM: 0.93 × the SM pulls' time at N_r = 4096; even at wider N_r) ...
inline constexpr int kAgCeMaxN = 4096;
// ... and from this much gathered A (M·K·2) at any N_r (0.98-1.00 × from 64 MiB; at 32 MiB the
// SM pulls were faster). At W = 4, one stream per peer lost to the SM pulls: not taken there.
inline constexpr int64_t kAgCeMinGatheredBytes = int64_t{64} << 20;
// The copy engines' copies merge consecutive rows of a peer up to this many bytes (ag_ce_steps):
// a 2 MiB chunk alone is a few microseconds of copy engine, about what a copy costs to start
// (32 MiB was no better).
inline constexpr int64_t kAgCeCopyBytes = int64_t{8} << 20;

// With the gathered A asked for, every tile of an own M-block stores a share of its rows into it
// (AgParams::store_own == kAgStoreSpread) from this much gathered A (M·K·2) at W <=
// kAgSpreadStoresMaxWorld (0.98-0.99 × the fused time from 256 MiB, 1.00-1.01 × at 128 MiB), else
// the tile in column 0 stores them all. W >= 3 keeps the column-0 tile (not measured there).
inline constexpr int64_t kAgSpreadStoresMinBytes = int64_t{256} << 20;
inline constexpr int kAgSpreadStoresMaxWorld = 2;

}  // namespace fusedcomm::kernels::tuning
