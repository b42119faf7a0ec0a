// The GEMM engine's fixed shape (see gemm_sm90.cuh): threads, tile sizes, the shared-memory
// budget per tile width, and the problem handle every kernel of the engine receives.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/gemm/gemm.h"

namespace fusedcomm::kernels::detail {

inline constexpr int kGemmThreads = 384;
inline constexpr int kTileM = 128;
inline constexpr int kTileK = 64;

// kStagingRounds: 16 KiB store rounds that each consumer warpgroup's staging buffer holds.
// Two (a whole bf16 half-tile of BN = 256) cost one stage of the operand ring; for the plain
// GEMM that is a wash (0.987 × over 52 shapes on one H200, but 1.08 × at 8192³:
// docs/performance.md), so only epilogues that need the room ask for it.
template <int BN, int kStagingRounds = 1>
struct GemmTileConfig {
  static_assert(BN == 128 || BN == 192 || BN == 256, "tile widths with a wgmma wrapper");
  static_assert(kStagingRounds == 1 || kStagingRounds == 2, "one or two store rounds");
  static constexpr uint32_t kABytes = kTileM * kTileK * 2;
  static constexpr uint32_t kBBytes = BN * kTileK * 2;
  static constexpr uint32_t kStageBytes = kABytes + kBBytes;
  static constexpr int kStages = BN == 128 ? 7 - kStagingRounds : 5 - kStagingRounds;
  // Per consumer warpgroup: kStagingRounds × 64×128 bf16 (two 64×64 TMA-store boxes each).
  static constexpr uint32_t kStagingBytes = kStagingRounds * 2 * 64 * 128;
  static constexpr uint32_t kAuxBytes = 128;
  static constexpr size_t kSmemBytes =
      1024 + size_t(kStages) * kStageBytes + 2 * kStagingBytes + kAuxBytes + kStages * 20 + 8;
  static_assert(kSmemBytes <= 227 * 1024, "fits the sm_90 opt-in shared memory");
};

// Problem and scheduling: a trivially copyable device handle, passed by value.
struct GemmProblem {
  int M, N, K;
  int m_blocks, n_blocks, k_blocks;
  int num_tiles;          // m_blocks * n_blocks
  int group_m;            // raster group height in M-blocks (>= 1)
  int m_block_start;      // rotation of the M-blocks, in [0, m_blocks)
  int c_tma;              // the engine stores C itself through smem + TMA (tm_c): kCTmaBF16 /
                          // kCTmaF32; or through smem and coalesced element stores (bf16 C that
                          // TMA cannot store: a row stride or N off the multiple of 8):
                          // kCRowsBF16, to c_rows / c_rows_ld; 0: C (if any) goes through the
                          // epilogue's register path
  int sweep;              // sweep positions of whole tiles: num_tiles, pair_sweep() for CTA pairs,
                          // or the whole waves' tiles under stream-K
  __nv_bfloat16* c_rows;  // kCRowsBF16's C, row stride c_rows_ld elements
  int64_t c_rows_ld;
  GemmWaitConfig wait;
  // Stream-K (gemm.h; schedules with kStreamK): the tiles at sweep positions [sweep, sweep +
  // sk_tiles) are computed as sk_tiles * k_blocks (tile, K slice) iterations split evenly over
  // sk_ctas() CTAs (sk_bound); 0: none. sk_tiles < the grid, so a CTA's run spans at most two
  // tiles.
  int sk_tiles;
  float4* sk_partials;    // [2 * CTA + its segment j][consumer warpgroup][kSkHalfF4]
  uint32_t* sk_counters;  // [stream-K tile][consumer warpgroup]: segments arrived, left at 0
};

inline constexpr int kCTmaBF16 = 1;
inline constexpr int kCTmaF32 = 2;
inline constexpr int kCRowsBF16 = 3;

struct TileCoord {
  int m, n;  // block indices
};

}  // namespace fusedcomm::kernels::detail
