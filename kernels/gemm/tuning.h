// The plain GEMM's tuned choices (gemm.cu): tile width, stream-K, raster group. Chosen on H200
// (one GPU, 132 SMs); docs/performance.md has the measurements.
#pragma once

namespace fusedcomm::kernels::tuning {

// A 128-wide tile's time in units of a 256-wide tile's: 128-wide tiles run ~10 % slower per FLOP
// (more L2 traffic per FLOP, wgmma n128 against n256), so they win only when they fill the grid
// noticeably better ("waves × tile time").
inline constexpr double kTileTime128 = 0.55;
// The same where a row stride of A or B is off the multiple of 64 elements and the launch is
// plain (the rows left in place, kPairOffLine* below): a 128-wide tile then loads a third more
// rows per FLOP than a 256-wide one, and the loads bound the time. On 1 × H200 over 107 such
// (shape, layout) cases of three seeded random sets, 128-wide tiles took 0.65 × a 256-wide
// tile's time per tile in geomean (aligned rows: 0.50 ×).
inline constexpr double kTileTime128OffLine = 0.65;

// Stream-K for the last wave (GemmArgs::stream_k = 0, chosen), only with at least this many
// 64-deep K slices (K >= 8192): at K = 4096 the fix-up costs what the spread gains.
inline constexpr int kStreamKMinKBlocks = 128;
// Case 1, few rows: M <= kStreamKSmallM with tiles keeping at most kStreamKSmallMBusyNum /
// kStreamKSmallMBusyDen of the CTAs busy: the time is B's bytes over the CTAs that stream them,
// and stream-K streams with every CTA (0.52-0.95 × the time). 256-wide tiles unless that splits
// a tile over more than ~kStreamKMaxCtasPerTile CTAs (each segment's partial is read back by the
// tile's last one).
inline constexpr int kStreamKSmallM = 64;
inline constexpr int kStreamKSmallMBusyNum = 3;
inline constexpr int kStreamKSmallMBusyDen = 4;
inline constexpr int kStreamKMaxCtasPerTile = 9;
// Case 2, a short last wave after whole ones (at most 1 / kStreamKLastWaveDen of the CTAs),
// where the wave model puts stream-K at <= kStreamKBar × the plain plan's time (0.80-0.99 × at
// every such shape measured; with longer last waves, or none before them, the fix-up ate the
// gain). The model charges the fix-up (the partials through L2, the segments' ends, the CTAs'
// skew; ~20-30 us) as kStreamKFixupSlices K slices of a tile.
inline constexpr int kStreamKLastWaveDen = 4;
inline constexpr double kStreamKBar = 0.985;
inline constexpr double kStreamKFixupSlices = 48;

// The raster group's height where the caller leaves it (GemmArgs::group_m = 0). A wave of C
// CTAs on 128×BN tiles covers about g M-blocks by C/g N-blocks and reads g·128 rows of A and
// (C/g)·BN columns of B per K slice: least at g ≈ √(C·BN/128), 16 for BN = 256 on 132 SMs.
// Under the power cap that traffic is energy, so clock: 16 took 0.986-0.994 × the time of 8 at
// 256-wide shapes (a higher sustained clock, the same cycles); 12 and 24 were within 0.6 %, 4
// and 32 up to 2.6 % slower. 128-wide tiles keep 8 (not measured).
inline constexpr int kGroupM256 = 16;
inline constexpr int kGroupM128 = 8;

// CTA pairs chosen (GemmArgs::cluster = 0) where the plan takes 128-wide tiles, at most
// kPairMaxWaves waves of them, at least two M-blocks and at least kPairMinKBlocks 64-deep K
// slices: there 128-wide tiles are bound by the L2 reads of A and B (few tiles, every CTA
// streaming), and a pair's multicast of B halves those of B. Against single CTAs (the
// ping-pong) on 1 × H200, pairs took 0.75-0.98 × the time at 9 of 10 (shape, layout) cases
// (1000 × 4104 × 2056, 220 × 7976 × 12576, 913 × 1368 × 4344, 8401 × 80 × 4536 and
// 153 × 1736 × 7920, both layouts) and 1.03 × at 153 × 1736 × 7920 NK; on more waves the
// choice is as before (pairs no faster).
inline constexpr int kPairMaxWaves = 2;
inline constexpr int kPairMinKBlocks = 32;
// CTA pairs also where a row stride of A or B is off the multiple of 64 elements (rows off the
// 128-byte lines: each 128-byte row of a TMA box is two partial-line reads, and the loads bound
// the time) and the plan takes 256-wide tiles, at least kPairOffLineMinTiles of them over at
// least two M-blocks, with no more waves of pairs than of single CTAs. On 1 × H200 over 97
// such (shape, layout) cases of three seeded random sets (N, K multiples of 8), pairs took
// 0.85 × the time of the plan without them in geomean (0.59-1.28 ×); under 100 tiles, where a
// pair's idle member or a second wave weighs more, they were slower as often as faster.
inline constexpr int kPairOffLineMinTiles = 100;

// The staged launch (gemm.h, launch_gemm_staged) also copies an operand whose rows TMA can
// read but whose row stride is off the multiple of 64 elements (128 bytes): then every 128-byte
// row of a box straddles two lines, and large GEMMs at such strides ran at ~0.55-0.65 × cuBLAS's
// throughput on 1 × H200 (e.g. 9794 × 10792 × 16120: 7.7 ms against 4.9 ms) where strides on
// the lines ran at ~1.0 ×. The copy is taken where its modelled time (rows × cols × 4 bytes at
// kStageModelGBps, plus kStageModelLaunchUs) is at most kStageAlignMaxCost of the GEMM's
// (2·M·N·K at kStageModelTflops): a fraction of the ~1.5 × it saves. Where the copies of every
// such operand together cost more than that and the plan in place takes CTA pairs
// (kPairOffLine*), nothing is copied: the pairs recover much of the loss without the copies'
// traffic, which at short K or few tiles is a large part of the time.
inline constexpr double kStageModelTflops = 700;
inline constexpr double kStageModelGBps = 3000;
inline constexpr double kStageModelLaunchUs = 3;
inline constexpr double kStageAlignMaxCost = 0.2;

}  // namespace fusedcomm::kernels::tuning
