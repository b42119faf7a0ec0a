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
// A 192-wide tile's (plain launches only), on rows on the lines and off them: three quarters of
// a 256-wide tile's FLOP at about its speed per FLOP (on 1 × H200, a wave of 192-wide tiles took
// 0.70-0.77 × a wave of 256-wide ones at 5862 × 4608 × 11456 and 12850 × 4136 × 12464).
// 192-wide tiles are taken only where the wave model puts them at <= kTile192Bar × the plan
// without them: N 1-192 columns past a multiple of 256 at the same tile count (N = 376: 2
// N-blocks, not 2 a quarter empty or 3 of 128), or a fuller last wave.
inline constexpr double kTileTime192 = 0.75;
inline constexpr double kTileTime192OffLine = 0.78;
inline constexpr double kTile192Bar = 0.95;

// Stream-K for the last wave (GemmArgs::stream_k = 0, chosen). Case 1 (few rows) only with at
// least kStreamKMinKBlocks 64-deep K slices (K >= 8192); case 2 (a short last wave) with at
// least kStreamKLastWaveMinKBlocks (K >= 4096).
inline constexpr int kStreamKMinKBlocks = 128;
inline constexpr int kStreamKLastWaveMinKBlocks = 64;
// Case 1, few rows: M <= kStreamKSmallM with tiles keeping at most kStreamKSmallMBusyNum /
// kStreamKSmallMBusyDen of the CTAs busy: the time is B's bytes over the CTAs that stream them,
// and stream-K streams with every CTA (0.52-0.95 × the time). 256-wide tiles unless that splits
// a tile over more than ~kStreamKMaxCtasPerTile CTAs (each segment's partial is read back by the
// tile's last one).
inline constexpr int kStreamKSmallM = 64;
inline constexpr int kStreamKSmallMBusyNum = 3;
inline constexpr int kStreamKSmallMBusyDen = 4;
inline constexpr int kStreamKMaxCtasPerTile = 9;
// Case 2, a last wave of at most 1 / kStreamKLastWaveDen of the CTAs after whole ones, where
// the wave model puts stream-K at <= kStreamKBar × the plain plan's time. On 1 × H200, against
// the plain plan in one process: 1089 × 5568 × 13584 NK (1.5 waves) 0.88 ×, 4076 × 10696 × 7424
// NK (10.2 waves, K = 7424) 0.91 ×, 5862 × 4608 × 11456 (6.3 waves; 192-wide tiles, 8.4 waves)
// 0.85-0.86 ×; at 1.6-2 waves stream-K lost (1.2-1.5 ×). The model charges the fix-up (the
// partials through L2, the segments' ends, the CTAs' skew; ~20-30 us) as kStreamKFixupSlices
// K slices of a tile.
inline constexpr int kStreamKLastWaveDen = 2;
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
// read but whose row stride is off the multiple of 64 elements (128 bytes), where a cost model
// says the copies pay: each choice of copies (none, A, B, both) is planned as launch_gemm would
// plan it and timed as its copies (rows × cols × 4 bytes at kStageModelGBps, plus
// kStageModelLaunchUs each; a B copy measured ~3.85 TB/s) plus the GEMM's waves × tile time
// (a 128 × 256 tile at kStageModelTflops over the SMs, a 128-wide one kTileTime128 of that,
// kTileTimeTurns where consumers take turns), the waves on rows left off the lines weighed by
// kOffLine* below. Against 110 (shape, layout) timings on 1 × H200 (the LLM table and two
// seeded random sets, N and K multiples of 8), that model put the GEMM on rows on the lines at
// 0.94-1.02 × the time measured (K >= 2048; short K runs slower than the model: 1.05-1.5 ×).
inline constexpr double kStageModelTflops = 700;
inline constexpr double kStageModelGBps = 3800;
inline constexpr double kStageModelLaunchUs = 3;
inline constexpr double kTileTimeTurns = 0.5;
// Rows off the lines left in place, in the model's units (time / the model's time on rows on
// the lines), from the same timings:
// - CTA pairs on 256-wide tiles (kPairOffLine*), each pair member loading half the B rows:
//   0.97-1.02 at 14 of 16 (shape, layout) cases with both operands off the lines (1.10-1.19 at
//   6656 × 1048 × 12360 and at K = 864), where the copies took 5-10 % of the time;
// - otherwise each operand adds its kOffLineSplit* where its row stride is an odd multiple of
//   8 elements (row starts off the 32-byte sectors as well as the lines), its kOffLineWhole*
//   where the stride is a multiple of 16. A so: 1.38-1.50 on 128-wide tiles taking turns
//   (strides 8 or 56 past the multiple of 64), 0.95-0.99 at 32 past it; B so: 1.04-1.11 (16 past
//   it, 128-wide turns; 48, 256-wide), 1.13 (8 past it, 256-wide). Earlier ones with both
//   operands at odd multiples of 8 on single CTAs (1172 × 11640 × 4568, 4096 × 4096 × 4104,
//   9794 × 10792 × 16120): 1.6-1.8.
inline constexpr double kOffLinePairs = 1.03;
inline constexpr double kOffLineSplitA = 0.4;
inline constexpr double kOffLineWholeA = 0.05;
inline constexpr double kOffLineSplitB = 0.13;
inline constexpr double kOffLineWholeB = 0.06;

}  // namespace fusedcomm::kernels::tuning
