// The grouped GEMM's pieces for the engine (gemm_sm90.cuh's schedule and epilogue concepts):
// a table of 128-row blocks (block b: its first row, its group's end row, its group, its
// group's first row), a
// schedule that claims the table's tiles dynamically, and an epilogue that stores only the
// rows of the tile's group. A tile of block b reads A rows [first, first + 128) whatever group
// they belong to (rows are independent in a GEMM) and its group's weight through b_offset; the
// rows past its group's end are computed and dropped.
#pragma once

#include <cuda_bf16.h>

#include <climits>
#include <cstdint>

#include "kernels/gemm/detail/gemm_sm90.cuh"
#include "kernels/moe/moe.h"

namespace fusedcomm::kernels::detail {

// The grouped GEMM's workspace header (the block table follows it).
struct alignas(256) GroupedHeader {
  uint32_t claim;   // the engine's dynamic tile counter; reset by the table kernel
  int32_t vblocks;  // blocks in the table
};

struct GroupedSchedule {
  static constexpr int kCluster = 1;
  static constexpr bool kDynamic = true;
  static constexpr bool kStoresA = false;
  GroupedHeader* header;
  const int4* table;
  int b_stride;  // rows of B's map per group (N for kNK, K for kKN)

  __device__ __forceinline__ int blocks() const {
    return *reinterpret_cast<const volatile int32_t*>(&header->vblocks);
  }
  __device__ __forceinline__ int cta() const { return 0; }
  __device__ __forceinline__ int num_ctas() const { return 1; }
  __device__ __forceinline__ bool stores_a(TileCoord) const { return false; }
  __device__ __forceinline__ int a_store_stride(const GemmProblem&) const { return 1; }
  // A sweep position past the table's tiles ends the CTA's loop (>= every prob.sweep).
  __device__ __forceinline__ int claim() const {
    const int t = static_cast<int>(atomicAdd(&header->claim, 1u));
    return t < blocks() * n_blocks_ ? t : INT_MAX;
  }
  __device__ __forceinline__ TileCoord coord(const GemmProblem& p, int t) const {
    return grouped_raster(t, blocks(), p.group_m, p.n_blocks);
  }
  __device__ __forceinline__ const CUtensorMap* a_source(const CUtensorMap* tm_a, TileCoord tc,
                                                         int& row) const {
    row = table[tc.m].x;
    return tm_a;
  }
  __device__ __forceinline__ int b_offset(TileCoord tc) const { return table[tc.m].z * b_stride; }
  __device__ __forceinline__ bool has_waits(const GemmProblem&) const { return false; }
  template <int BN>
  __device__ __forceinline__ bool wait(const GemmProblem&, TileCoord) const {
    return true;
  }
  __device__ __forceinline__ void consumers_done() const {}
  int n_blocks_;  // the problem's N-blocks (claim() has no GemmProblem)
};

// The epilogue owns the tile (gemm_sm90.cuh's kOwnsTile): a consumer warpgroup's 64 rows of a
// tile go to C at their group's rows, through the staging buffer and TMA stores (as the plain
// GEMM stores C) where all 64 lie inside the group, so that the stores run beside the next
// tile's main loop; a half-tile that crosses its group's end (the last block of a segment whose
// length is not a multiple of 64) goes from registers, row by row, only its group's rows (the
// rows after it belong to the next group, which another tile writes). Against every row from
// registers (tma_store = 0), the TMA stores took 0.71-0.97 × the time on 1 × H200 over the MoE
// bench's points (0.75-0.89 × at 512 and more rows per expert), as the plain GEMM's C store
// overlaps the next tile.
struct GroupedEpilogue {
  static constexpr bool kOwnsTile = true;
  static constexpr int kStagingRounds = 1;
  static constexpr bool kInitAux = false;
  static constexpr bool kAuxWarps = false;
  CUtensorMap tm_c;  // C: rows_capacity × N bf16, 64 × 64 boxes (encode_store_map)
  __nv_bfloat16* c;
  int64_t ldc;
  const int4* table;
  int tma_store;  // 0: registers only (A/B runs)

  template <int BN, int kFrag>
  __device__ __forceinline__ void tile(float (&acc)[kFrag], uint8_t* staging, TileCoord tc, int cw,
                                       const GemmProblem& p) const {
    const int4 b = table[tc.m];
    const int row = b.x + cw * 64;  // this warpgroup's first row in C
    if (row >= b.y) return;         // the block's second half lies past its group
    if (tma_store && row + 64 <= b.y) {
      store_tile_tma<BN, false, kFrag, false, kStagingRounds>(acc, staging, &tm_c, cw, row, tc.n * BN, true);
      return;
    }
    const int t = threadIdx.x % 128, warp = t / 32, lane = t % 32;
    const int lo_row = row + warp * 16 + lane / 4;
    const int col0 = tc.n * BN + 2 * (lane % 4);
    const bool lo_ok = lo_row < b.y, hi_ok = lo_row + 8 < b.y;
    __nv_bfloat16* lo = c + static_cast<int64_t>(lo_row) * ldc;
    __nv_bfloat16* hi = lo + 8 * ldc;
#pragma unroll
    for (int j = 0; j < kFrag / 4; ++j) {
      const int col = col0 + 8 * j;
      if (col < p.N) {
        if (lo_ok)
          *reinterpret_cast<__nv_bfloat162*>(lo + col) = __floats2bfloat162_rn(acc[4 * j], acc[4 * j + 1]);
        if (hi_ok) {
          *reinterpret_cast<__nv_bfloat162*>(hi + col) =
              __floats2bfloat162_rn(acc[4 * j + 2], acc[4 * j + 3]);
        }
      }
    }
  }
  template <int BN>
  __device__ __forceinline__ void main_loop_point(TileCoord, int) const {}
  // The TMA stores (issued by thread 0 of each consumer warpgroup) are complete before the CTA
  // ends: its shared memory outlives their reads, and C is written when the kernel ends.
  __device__ __forceinline__ void consumers_end() const {
    if (threadIdx.x % 128 == 0) bulk_wait_all();
  }
};

// launch_grouped_gemm's engine launch, prepared: the plan (its tensor maps), the epilogue and
// the schedule. grouped_gemm_prepare checks the arguments (cudaErrorInvalidValue), fills them
// and enqueues the table kernel on `stream`; the caller then launches a kernel that runs the
// engine with them (launch_grouped_gemm's own, or the fused dispatch's, moe.cu). *empty: no
// group or no row, nothing enqueued.
struct GroupedLaunch {
  GemmPlan plan;
  GroupedEpilogue epi;
  GroupedSchedule sched;
};
cudaError_t grouped_gemm_prepare(const GroupedGemmArgs& a, GroupedLaunch* out, bool* empty,
                                 cudaStream_t stream);

}  // namespace fusedcomm::kernels::detail
