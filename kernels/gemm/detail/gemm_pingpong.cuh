// The plain GEMM with consumers that take turns ("ping-pong"; gemm.h, GemmArgs::pingpong).
//
// Why: in the engine of gemm_sm90.cuh both consumer warpgroups work on one 128×BN tile and
// stage its C together, so the tensor cores idle while they do (~0.8 µs per 128-wide bf16
// tile, ~2 µs per 256-wide one, measured on H200). Here each consumer warpgroup computes whole
// 128×128 tiles of its own: the CTA's tiles (round robin over the sweep, as PlainSchedule)
// alternate between warpgroup 0 (even local index) and warpgroup 1 (odd), so one warpgroup's
// epilogue runs under the other's main loop. The price is the tile: 128×128 reads 1/3 more A+B bytes from L2 per FLOP than
// 128×256.
//
// Same CTA shape, shared-memory layout and producer as the engine at BN = 128
// (GemmTileConfig<128, 1>: 6 stages of A 128×64 + B 128×64, one 16 KiB staging buffer per
// consumer warpgroup), except that each stage is read by one warpgroup, so its empty barrier
// expects 4 arrivals (that warpgroup's warps), not 8.
//
// The turn (named barriers 4 and 5): warpgroup w starts a tile only after the other one has
// passed the full barrier of the previous tile's last K slice (bar.arrive on 4 + w; w waits
// with bar.sync). That is what makes a parity wait correct here: a warpgroup skips the other's
// stages, and mbarrier.try_wait.parity cannot tell phase n from phase n - 2, so before it
// waits for a stage's use n, use n - 1 (kStages slices earlier) must have completed; the
// other warpgroup saw every slice before this tile complete, in order, before it arrived.
// It also keeps the two main loops from sharing the tensor cores for more than the
// hand-over, which is the point of taking turns.
//
// Only for launches without hooks 1-2, CTA pairs or stream-K, with C through TMA (gemm.cu
// gemm_plan decides); no error paths (no waits).
#pragma once

#include "kernels/gemm/detail/gemm_sm90.cuh"

namespace fusedcomm::kernels::detail {

// Warpgroup's 4 wgmma pairs (k16; rows 0-63 into lo, 64-127 into hi) of the K slice in
// `stage`, one wgmma group left in flight (as mma_stage).
template <bool kBKN, class Cfg>
__device__ __forceinline__ void mma_stage_128(float (&lo)[64], float (&hi)[64], uint32_t a_base,
                                              uint32_t b_base, int stage, bool accumulate) {
  const uint64_t da = smem_desc_sw128(a_base + stage * Cfg::kABytes, 16, 1024);
  const uint64_t db = kBKN ? smem_desc_sw128(b_base + stage * Cfg::kBBytes, 8192, 1024)
                           : smem_desc_sw128(b_base + stage * Cfg::kBBytes, 16, 1024);
  // Rows 64-127 of A: 64 rows of 128 B further (a multiple of the 1024-B swizzle atom).
  constexpr uint64_t kHiRows = (64 * 128) >> 4;
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kTileK / 16; ++kk) {
    const uint64_t dbk = db + (kBKN ? (kk * 2048) >> 4 : (kk * 32) >> 4);
    const uint64_t dak = da + ((kk * 32) >> 4);
    wgmma_m64n128k16<kBKN ? 1 : 0>(lo, dak, dbk, accumulate || kk != 0);
    wgmma_m64n128k16<kBKN ? 1 : 0>(hi, dak + kHiRows, dbk, accumulate || kk != 0);
  }
  wgmma_commit();
  wgmma_wait<1>();
}

// The next slot of the kStages-deep operand ring: a slot's barrier parity flips each time the
// ring wraps around. (The engine in gemm_sm90.cuh spells this out in each of its loops; folding
// it into this helper there changed the fused kernels' register allocation, whose timings were
// taken over NVLink, so it stays as it is.)
template <int kStages>
__device__ __forceinline__ void ring_next(int& stage, uint32_t& phase) {
  if (++stage == kStages) {
    stage = 0;
    phase ^= 1;
  }
}

__device__ __forceinline__ void named_barrier_arrive(uint32_t id, uint32_t threads) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

template <bool kBKN>
__global__ void __launch_bounds__(kGemmThreads, 1)
    gemm_pingpong_kernel(const __grid_constant__ CUtensorMap tm_a, const __grid_constant__ CUtensorMap tm_b,
                         const __grid_constant__ CUtensorMap tm_c, const __grid_constant__ GemmProblem prob) {
  // Launched early (early_launch.h): the stream's previous kernel is complete after this. (No
  // readiness waits here, so releasing the next kernel early holds no SM another needs.)
  pdl_wait();
  pdl_release_dependents();
  using Cfg = GemmTileConfig<128, 1>;
  constexpr int kStages = Cfg::kStages;
  // The engine's layout at BN = 128 (gemm_sm90.cuh): A ring, B ring, staging, aux, barriers.
  uint8_t* aux = gemm_aux_smem<128, 1>();
  uint8_t* staging = aux - 2 * Cfg::kStagingBytes;
  uint8_t* smem_a = staging - kStages * Cfg::kStageBytes;
  uint8_t* smem_b = smem_a + kStages * Cfg::kABytes;
  uint64_t* full = reinterpret_cast<uint64_t*>(aux + Cfg::kAuxBytes);
  uint64_t* empty = full + kStages;

  const int wg = threadIdx.x / 128;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], 4);
    }
    mbar_init_fence();
  } else if (threadIdx.x == 32) {
    tma_prefetch_desc(&tm_a);
    tma_prefetch_desc(&tm_b);
    tma_prefetch_desc(&tm_c);
  }
  __syncthreads();
  const int cta = static_cast<int>(blockIdx.x), ctas = static_cast<int>(gridDim.x);

  if (wg == 0) {
    // ---------------- producer: the engine's, one stage after another ----------------
    setmaxnreg_dec<40>();
    if (threadIdx.x != 0) return;
    int stage = 0;
    uint32_t phase = 0;
    for (int t = cta; t < prob.sweep; t += ctas) {
      const TileCoord tc = tile_coord(prob, t);
      for (int kb = 0; kb < prob.k_blocks; ++kb) {
        mbar_wait(&empty[stage], phase ^ 1);
        load_stage<128, kBKN, 1, Cfg>(smem_a, smem_b, full, stage, &tm_a, tm_b, kb, tc.m * kTileM, tc.n);
        ring_next<kStages>(stage, phase);
      }
    }
    return;
  }
  // ---------------- consumers: warpgroup cw takes the CTA's tiles cw, cw + 2, ... ----------
  setmaxnreg_inc<232>();
  const int cw = wg - 1;
  const int lane = threadIdx.x % 32;
  const int tiles = (prob.sweep - cta + ctas - 1) / ctas;  // the grid is at most the sweep
  uint8_t* my_staging = staging + cw * Cfg::kStagingBytes;
  const uint32_t a_base = smem_u32(smem_a), b_base = smem_u32(smem_b);
  const bool f32 = prob.c_tma == kCTmaF32;
  float lo[64], hi[64];
  for (int i = cw; i < tiles; i += 2) {
    const TileCoord tc = tile_coord(prob, cta + i * ctas);
    if (i > 0) named_barrier_sync(4 + cw, 256);  // the other warpgroup saw its last slice
    // Slices are numbered across the CTA's tiles: this tile's first is i * k_blocks.
    const int64_t first = static_cast<int64_t>(i) * prob.k_blocks;
    int stage = static_cast<int>(first % kStages);
    uint32_t phase = static_cast<uint32_t>(first / kStages) & 1;
    int prev = 0;
    for (int kb = 0; kb < prob.k_blocks; ++kb) {
      mbar_wait(&full[stage], phase);
      if (kb == prob.k_blocks - 1 && i + 1 < tiles) named_barrier_arrive(4 + (cw ^ 1), 256);
      mma_stage_128<kBKN, Cfg>(lo, hi, a_base, b_base, stage, kb != 0);
      if (kb > 0 && lane == 0) mbar_arrive(&empty[prev]);
      prev = stage;
      ring_next<kStages>(stage, phase);
    }
    wgmma_wait<0>();
    reg_fence(lo);
    reg_fence(hi);
    if (lane == 0) mbar_arrive(&empty[prev]);
    // C: the two 64-row halves through this warpgroup's staging buffer (each store round waits
    // for the previous one's TMA read of the buffer; stores clip at M and N).
    const int row = tc.m * kTileM, col = tc.n * 128;
    if (f32) {
      store_tile_tma<128, true, 64>(lo, my_staging, &tm_c, cw, row, col, row < prob.M);
      store_tile_tma<128, true, 64>(hi, my_staging, &tm_c, cw, row + 64, col, row + 64 < prob.M);
    } else {
      store_tile_tma<128, false, 64>(lo, my_staging, &tm_c, cw, row, col, row < prob.M);
      store_tile_tma<128, false, 64>(hi, my_staging, &tm_c, cw, row + 64, col, row + 64 < prob.M);
    }
  }
  // Shared memory must outlive the stores' reads.
  if (threadIdx.x % 128 == 0) bulk_wait_all();
}

}  // namespace fusedcomm::kernels::detail
