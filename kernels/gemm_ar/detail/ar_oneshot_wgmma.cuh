// gemmAllReduce's one-shot kernel with wgmma tiles (BM = 64 or 128 rows): the same launch, work
// units, partials, pushes, flags, sums and end as ar_oneshot_kernel.cuh (whose header is the
// protocol's description; ar_publish_unit and ar_sum_tiles are shared), with the GEMM part of a
// unit run as the Hopper GEMM engine runs its tiles (gemm/detail/main_loop.cuh):
//
// - Tile BM × BN (BN = 64 or 128); BM / 64 consumer warpgroups (warps 0..), each running wgmma
//   m64nBNk16 on its 64 rows of every K slice, so that at BM = 128 both share each W_r slice
//   (W_r read once at M <= 128); one producer warp after them, whose lane 0 loads each K slice
//   of 64 (A: BM rows, W_r: BN columns) by TMA into a 128-byte-swizzled ring stage (full / empty
//   mbarriers, as the engine's); its other lanes and the consumers run the publish code
//   together. Rows past M, columns past N and K past K_r are TMA's zero fill.
// - The unit's accumulators (fp32) go to shared memory as one BM × BN tile, rows of
//   ar_cs_stride(BN), which reuses the ring: the consumers meet at a named barrier first (all
//   wgmma have read the ring; all of the unit's loads have landed, since the consumers waited
//   for each, and the producer issues no more before the CTA barrier after ar_publish_unit,
//   where each thread's accesses to the tile are ordered before the async proxy's next writes
//   by a proxy fence).
// - Every thread of the CTA (producer warp included) then runs ar_publish_unit, and after
//   the last unit ar_sum_tiles: the bits of a tile's partial are those of the fp32 sum of its
//   K slices as wgmma accumulates them, pushed, flagged and summed in rank order as before.
//
// The start barrier's signal: CTA 0's producer thread after the first unit's first ring pass of
// loads is issued (as the mma.sync kernel, after its first unit's prologue).
#pragma once

#include <cuda.h>  // CUtensorMap (type only)

#include <cstdint>

#include "kernels/common/sm90_primitives.cuh"
#include "kernels/common/wgmma_ops.cuh"
#include "kernels/gemm_ar/detail/ar_oneshot_kernel.cuh"

namespace fusedcomm::kernels::detail {

inline constexpr int kArWgBK = 64;  // K slice per stage: one 128-byte swizzle row
// Threads: one consumer warpgroup per 64 rows, then the producer warp.
__host__ __device__ constexpr int ar_wg_consumers(int bm) { return 128 * (bm / 64); }
__host__ __device__ constexpr int ar_wg_threads(int bm) { return ar_wg_consumers(bm) + 32; }
__host__ __device__ constexpr int ar_wg_stage_bytes(int bm, int bn) { return (bm + bn) * kArWgBK * 2; }
// ~192 KiB of ring: stages of 16 KiB (64 × 64), 24 (64 × 128 and 128 × 64), 32 (128 × 128).
__host__ __device__ constexpr int ar_wg_stages(int bm, int bn) { return (192 << 10) / ar_wg_stage_bytes(bm, bn); }
// Dynamic shared memory: the ring, 1024-byte aligned (the swizzle's period) from its base.
__host__ __device__ constexpr int ar_wg_smem_bytes(int bm, int bn) {
  return 1024 + ar_wg_stages(bm, bn) * ar_wg_stage_bytes(bm, bn);
}
__host__ __device__ constexpr bool ar_wg_instance_fits(int bm, int bn) {
  return ar_wg_stages(bm, bn) >= 3 && ar_wg_smem_bytes(bm, bn) <= 220 * 1024 &&
         bm * ar_cs_stride(bn) * 4 <= ar_wg_stages(bm, bn) * ar_wg_stage_bytes(bm, bn);
}
static_assert(ar_wg_instance_fits(64, 64) && ar_wg_instance_fits(64, 128) && ar_wg_instance_fits(128, 64) &&
                  ar_wg_instance_fits(128, 128),
              "the ring and the unit's fp32 tile fit a CTA's shared memory");

template <int BM, int BN, bool kKN>
__global__ void __launch_bounds__(ar_wg_threads(BM), 1)
    ar_oneshot_wgmma_kernel(const __grid_constant__ ArParams p, const __grid_constant__ CUtensorMap tm_a,
                            const __grid_constant__ CUtensorMap tm_b) {
  static_assert(BM == 64 || BM == 128, "one or two consumer warpgroups");
  static_assert(BN == 64 || BN == 128, "tile widths with a wgmma wrapper");
  constexpr int kThreads = ar_wg_threads(BM), kStages = ar_wg_stages(BM, BN);
  constexpr int kProducer = ar_wg_consumers(BM);  // the producer warp's lane 0
  constexpr uint32_t kABytes = BM * kArWgBK * 2, kStageBytes = ar_wg_stage_bytes(BM, BN);
  constexpr int kCs = ar_cs_stride(BN);
  extern __shared__ __align__(128) uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) &
                                             ~static_cast<uintptr_t>(1023));
  __shared__ __align__(8) uint64_t full[kStages];
  __shared__ __align__(8) uint64_t empty[kStages];
  __shared__ ArVerdicts sh;

  const CommDevice& d = p.dev;
  const int W = d.world;
  const int tid = threadIdx.x, lane = tid % 32, wg = tid / 128;  // wg < BM / 64: a consumer
  const uint64_t epoch = comm_launch_epoch(d);
  bool started = W == 1;  // this CTA has observed every peer's arrive flag
  bool failed = false;    // a wait of this CTA gave up (recorded): no more pushes

  if (tid == kProducer) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], 4 * (BM / 64));  // one arrival per consumer warp
    }
    mbar_init_fence();
  } else if (tid == kProducer + 1) {
    tma_prefetch_desc(&tm_a);
    tma_prefetch_desc(&tm_b);
  }
  __syncthreads();

  // ---- GEMM units and pushes ---------------------------------------------------------------
  const int units = p.tiles * p.splits;
  const int per_split = (p.k_tiles + p.splits - 1) / p.splits;
  int it0 = 0;  // K slices of this CTA's earlier units: the ring position (stage, phase)
  for (int u = blockIdx.x; u < units; u += gridDim.x) {
    const int t = u % p.tiles, s = u / p.tiles;
    const int m0 = (t / p.tiles_n) * BM, n0 = (t % p.tiles_n) * BN;
    const int kt0 = s * per_split, kt1 = min(p.k_tiles, kt0 + per_split);
    const int nk = max(0, kt1 - kt0);
    float* cs = reinterpret_cast<float*>(smem);  // the unit's fp32 tile, after its last slice

    if (tid == kProducer) {
      // ---- producer ----
      for (int kt = 0; kt < nk; ++kt) {
        const int it = it0 + kt, st = it % kStages;
        mbar_wait(&empty[st], ((it / kStages) & 1) ^ 1);
        mbar_arrive_expect_tx(&full[st], kStageBytes);
        uint8_t* a_dst = smem + st * kStageBytes;
        uint8_t* b_dst = a_dst + kABytes;
        const int k0 = (kt0 + kt) * kArWgBK;
        tma_load_2d(a_dst, &tm_a, &full[st], k0, m0);
        if constexpr (!kKN) {
          tma_load_2d(b_dst, &tm_b, &full[st], k0, n0);
        } else {
#pragma unroll
          for (int j = 0; j < BN / 64; ++j) tma_load_2d(b_dst + j * 8192, &tm_b, &full[st], n0 + j * 64, k0);
        }
        // The start barrier's signal once the ring's first pass is in flight (CTA 0's first
        // unit is u = 0: the grid never exceeds the units).
        if (u == 0 && W > 1 && kt == min(nk, kStages) - 1) ar_start(d, epoch);
      }
      if (u == 0 && W > 1 && nk == 0) ar_start(d, epoch);
    } else if (tid < kProducer) {
      // ---- consumers: rows wg · 64 .. + 63 of the tile ----
      float acc[BN / 2];
#pragma unroll
      for (int i = 0; i < BN / 2; ++i) acc[i] = 0.f;
      const uint32_t ring = smem_u32(smem) + wg * 64 * 128;  // this warpgroup's A rows
      for (int kt = 0; kt < nk; ++kt) {
        const int it = it0 + kt, st = it % kStages;
        mbar_wait(&full[st], (it / kStages) & 1);
        const uint32_t a_base = ring + st * kStageBytes;
        const uint32_t b_base = smem_u32(smem) + st * kStageBytes + kABytes;
        const uint64_t da = smem_desc_sw128(a_base, 16, 1024);
        const uint64_t db = smem_desc_sw128(b_base, kKN ? 8192 : 16, 1024);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kArWgBK / 16; ++kk) {
          // K-major: +32 B per k16 inside the swizzled 128-B row; N-major: +16 rows of 128 B.
          const uint64_t dak = da + ((kk * 32) >> 4), dbk = db + (kKN ? (kk * 2048) >> 4 : (kk * 32) >> 4);
          if constexpr (BN == 128) {
            wgmma_m64n128k16<kKN ? 1 : 0>(acc, dak, dbk, 1);
          } else {
            wgmma_m64n64k16<kKN ? 1 : 0>(acc, dak, dbk, 1);
          }
        }
        wgmma_commit();
        wgmma_wait<1>();
        if (kt > 0 && lane == 0) mbar_arrive(&empty[(it - 1) % kStages]);
      }
      wgmma_wait<0>();
      reg_fence(acc);
      if (nk > 0 && lane == 0) mbar_arrive(&empty[(it0 + nk - 1) % kStages]);
      // Every consumer warpgroup has read the ring, and every load of the unit has landed (the
      // consumers waited for each): the tile may overwrite the ring.
      named_barrier_sync(1, kProducer);
      // The partial (wgmma's accumulator layout: rows warp · 16 + lane / 4 and + 8, columns
      // 8j + 2 (lane % 4) + 0..1) into the tile. The addresses come from one register opaque to
      // the compiler, which otherwise hoists every store's address out of the unit loop into
      // registers that the accumulators need.
      uint32_t at = smem_u32(cs) + ((wg * 64 + ((tid / 32) % 4) * 16 + lane / 4) * kCs + 2 * (lane % 4)) * 4;
      asm volatile("" : "+r"(at));
#pragma unroll
      for (int j = 0; j < BN / 8; ++j) {
        st_shared_f32x2(at + j * 32, acc[4 * j + 0], acc[4 * j + 1]);
        st_shared_f32x2(at + 8 * kCs * 4 + j * 32, acc[4 * j + 2], acc[4 * j + 3]);
      }
    }
    it0 += nk;
    __syncthreads();
    ar_publish_unit<BM, BN, kThreads>(p, epoch, cs, t, s, m0, started, failed, sh);
    fence_proxy_async_shared();  // this thread's accesses to the tile before the next unit's TMA writes
    __syncthreads();             // the tile in shared memory is read: the next unit's loads may overwrite it
  }

  ar_sum_tiles<BM, BN, kThreads>(p, epoch, started, failed, sh);
}

}  // namespace fusedcomm::kernels::detail
