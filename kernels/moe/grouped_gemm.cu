// launch_grouped_gemm (moe.h): the block table kernel, then the Hopper engine
// (kernels/gemm/detail/gemm_sm90.cuh) with a schedule that claims tiles of the table and an
// epilogue that stores only the rows of each tile's group.
#include <cub/block/block_scan.cuh>

#include <algorithm>
#include <atomic>
#include <climits>

#include "kernels/gemm/detail/gemm_sm90.cuh"
#include "kernels/moe/detail/moe_grouped.cuh"
#include "kernels/moe/moe.h"

namespace fusedcomm::kernels {
namespace detail {
namespace {

constexpr int kTableThreads = 1024;
static_assert(kMoeMaxExperts <= kTableThreads, "one thread per group");

// The raster's height (GemmArgs::group_m) where the caller leaves it and the groups hold at most
// one 128-row block on average (rows_capacity <= 128 · groups): one block at a time, swept along
// N. No block then shares its group's B with another, so the engine's taller rasters (16
// blocks, sized for A and B panels shared in L2) gain nothing. On 1 × H200 at 128 rows per
// expert it took 0.87-0.94 × the time of the 16-block raster at 11 of 13 (shape, experts)
// points and 0.98-1.00 × at the two with 4 or fewer groups; with more rows per group, where a
// group's blocks share its B, the taller raster stays (one block at a time took up to 1.2 ×
// there).
constexpr int kSmallGroupsRasterM = 1;

// One CTA: group g's rows [offsets[g], offsets[g+1]) become ceil(len / 128) blocks, numbered
// in group order; block b's entry holds its first row, its group's end, the group and the
// group's first row (the fused dispatch's waits: the group's row count). Also
// resets the tile counter for the engine launch that follows on the stream.
__global__ void __launch_bounds__(kTableThreads)
    grouped_table_kernel(const int64_t* offsets, int groups, GroupedHeader* header, int4* table) {
  using Scan = cub::BlockScan<int, kTableThreads>;
  __shared__ typename Scan::TempStorage scan;
  const int g = static_cast<int>(threadIdx.x);
  int64_t begin = 0, end = 0;
  int blocks = 0;
  if (g < groups) {
    begin = offsets[g];
    end = offsets[g + 1];
    blocks = end > begin ? static_cast<int>((end - begin + kTileM - 1) / kTileM) : 0;
  }
  int first = 0, total = 0;
  Scan(scan).ExclusiveSum(blocks, first, total);
  for (int j = 0; j < blocks; ++j) {
    table[first + j] =
        make_int4(static_cast<int>(begin) + j * kTileM, static_cast<int>(end), g, static_cast<int>(begin));
  }
  if (g == 0) {
    header->vblocks = total;
    header->claim = 0;
  }
}

template <int BN, bool kBKN>
__global__ void __launch_bounds__(kGemmThreads, 1)
    grouped_gemm_kernel(const __grid_constant__ CUtensorMap tm_a, const __grid_constant__ CUtensorMap tm_b,
                        const __grid_constant__ CUtensorMap tm_c, const __grid_constant__ GemmProblem prob,
                        const __grid_constant__ GroupedEpilogue epi,
                        const __grid_constant__ GroupedSchedule sched) {
  gemm_sm90_body<BN, kBKN>(tm_a, tm_b, tm_c, prob, epi, sched);
}

template <int BN, bool kBKN>
cudaError_t launch_engine(const GemmPlan& p, const GroupedEpilogue& epi, const GroupedSchedule& sched,
                          cudaStream_t stream) {
  auto kernel = grouped_gemm_kernel<BN, kBKN>;
  constexpr size_t smem = GemmTileConfig<BN, GroupedEpilogue::kStagingRounds>::kSmemBytes;
  static std::atomic<uint64_t> opted_in{0};
  if (cudaError_t e = gemm_opt_in_smem(reinterpret_cast<const void*>(kernel), smem, opted_in);
      e != cudaSuccess) {
    return e;
  }
  kernel<<<p.grid, kGemmThreads, smem, stream>>>(p.ta, p.tb, p.tc, p.prob, epi, sched);
  return cudaGetLastError();
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

}  // namespace
}  // namespace detail

size_t grouped_gemm_workspace_bytes(int64_t rows_capacity, int groups) {
  const int64_t blocks = (rows_capacity + detail::kTileM - 1) / detail::kTileM + std::max(groups, 0);
  return sizeof(detail::GroupedHeader) + static_cast<size_t>(std::max<int64_t>(blocks, 1)) * sizeof(int4);
}

namespace detail {

cudaError_t grouped_gemm_prepare(const GroupedGemmArgs& a, GroupedLaunch* out, bool* empty,
                                 cudaStream_t stream) {
  *empty = false;
  if (a.groups < 0 || a.groups > kMoeMaxExperts || a.rows_capacity < 0 || a.rows_capacity >= (1ll << 31)) {
    return cudaErrorInvalidValue;
  }
  if (a.groups == 0 || a.rows_capacity == 0) {  // nothing to compute
    *empty = true;
    return cudaSuccess;
  }
  if (a.N < 8 || a.K < 8 || a.N % 8 != 0 || a.K % 8 != 0) return cudaErrorInvalidValue;
  if (a.A == nullptr || a.B == nullptr || a.C == nullptr || a.offsets == nullptr)
    return cudaErrorInvalidValue;
  if (!aligned16(a.A) || !aligned16(a.B) || !aligned16(a.C)) return cudaErrorInvalidValue;
  const size_t need = grouped_gemm_workspace_bytes(a.rows_capacity, a.groups);
  if (a.workspace == nullptr || a.workspace_bytes < need ||
      (reinterpret_cast<uintptr_t>(a.workspace) & 255)) {
    return cudaErrorInvalidValue;
  }
  const bool kn = a.b_layout == GemmLayoutB::kKN;
  const int64_t vb_max = (a.rows_capacity + kTileM - 1) / kTileM + a.groups;
  if (vb_max * kTileM >= (1ll << 31) || static_cast<int64_t>(a.groups) * (kn ? a.K : a.N) >= (1ll << 31)) {
    return cudaErrorInvalidValue;
  }
  auto* header = static_cast<GroupedHeader*>(a.workspace);
  auto* table = reinterpret_cast<int4*>(static_cast<uint8_t*>(a.workspace) + sizeof(GroupedHeader));

  // The engine's plan for the largest table (M = every block the table can hold), then the
  // maps of the real operands: A's rows_capacity rows, and every group's weight in one B map.
  GemmArgs g;
  g.A = a.A;
  g.B = a.B;
  g.C = a.C;
  g.M = static_cast<int>(vb_max * kTileM);
  g.N = a.N;
  g.K = a.K;
  g.lda = a.K;
  g.ldb = kn ? a.N : a.K;
  g.ldc = a.N;
  g.b_layout = a.b_layout;
  g.num_ctas = a.num_ctas;
  g.tile_n = a.tile_n;
  g.group_m = a.group_m > 0                                   ? a.group_m
              : a.rows_capacity <= int64_t{kTileM} * a.groups ? kSmallGroupsRasterM
                                                              : 0;
  g.cluster = 1;
  g.stream_k = 1;
  g.pingpong = 1;
  GemmPlan& plan = out->plan;
  if (cudaError_t e = gemm_plan(g, &plan); e != cudaSuccess) return e;
  if (!encode_a_map(&plan.ta, a.A, static_cast<int>(a.rows_capacity), a.K, a.K)) return cudaErrorInvalidValue;
  const int64_t b_rows = static_cast<int64_t>(a.groups) * (kn ? a.K : a.N);
  if (!encode_b_map(&plan.tb, a.B, b_rows, kn ? a.N : a.K, g.ldb, kn, plan.tile_n))
    return cudaErrorInvalidValue;
  plan.prob.c_tma = 0;  // the epilogue stores each row of a tile's group only

  GroupedEpilogue& epi = out->epi;
  if (!encode_store_map(&epi.tm_c, a.C, static_cast<int>(a.rows_capacity), a.N, a.N, false))
    return cudaErrorInvalidValue;
  epi.c = a.C;
  epi.ldc = a.N;
  epi.table = table;
  epi.tma_store = a.tma_store != 1;
  GroupedSchedule& sched = out->sched;
  sched.header = header;
  sched.table = table;
  sched.b_stride = kn ? a.K : a.N;
  sched.n_blocks_ = plan.prob.n_blocks;

  grouped_table_kernel<<<1, kTableThreads, 0, stream>>>(a.offsets, a.groups, header, table);
  return cudaGetLastError();
}

}  // namespace detail

cudaError_t launch_grouped_gemm(const GroupedGemmArgs& a, cudaStream_t stream) {
  using namespace detail;
  GroupedLaunch l;
  bool empty = false;
  if (cudaError_t e = grouped_gemm_prepare(a, &l, &empty, stream); e != cudaSuccess || empty) return e;
  const GemmPlan& plan = l.plan;
  if (plan.tile_n == 256) {
    return plan.kn ? launch_engine<256, true>(plan, l.epi, l.sched, stream)
                   : launch_engine<256, false>(plan, l.epi, l.sched, stream);
  }
  return plan.kn ? launch_engine<128, true>(plan, l.epi, l.sched, stream)
                 : launch_engine<128, false>(plan, l.epi, l.sched, stream);
}

}  // namespace fusedcomm::kernels
