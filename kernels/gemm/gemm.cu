// launch_gemm: argument checks, tile-width and CTA-pair choice, TMA tensor maps
// (detail::gemm_plan, shared with the fused launchers), and the ten instantiations of the plain
// kernel (BN 128/256 × B layout NK/KN × single CTAs / CTA pairs, and BN 192 × NK/KN on single
// CTAs) with the default epilogue, and the two of the kernel whose consumers take turns (B
// layout NK/KN).
#include "kernels/common/driver_entry.h"
#include "kernels/common/early_launch.h"
#include "kernels/gemm/detail/gemm_pingpong.cuh"
#include "kernels/gemm/detail/gemm_sm90.cuh"
#include "kernels/gemm/gemm.h"
#include "kernels/gemm/tuning.h"

#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled

#include <algorithm>
#include <atomic>

namespace fusedcomm::kernels {
namespace {

using detail::GemmProblem;
using detail::GemmTileConfig;

// cuTensorMapEncodeTiled through the runtime's driver entry point: no link against libcuda.
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const auto fn =
      detail::driver_entry<PFN_cuTensorMapEncodeTiled_v12000>("cuTensorMapEncodeTiled", 12000);
  return fn;
}

// A row-major bf16 (or fp32) matrix of `rows` × `cols` (row stride ld elements) read or
// written in boxes of box_rows × box_cols, 128-byte swizzled (box_cols * element size == 128).
bool encode_2d(CUtensorMap* map, const void* base, uint64_t rows, uint64_t cols, int64_t ld,
               uint32_t box_rows, uint32_t box_cols, bool f32 = false) {
  auto encode = tensor_map_encoder();
  if (encode == nullptr) return false;
  const cuuint64_t dims[2] = {cols, rows};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(ld) * (f32 ? 4 : 2)};
  const cuuint32_t box[2] = {box_cols, box_rows};
  const cuuint32_t elem_strides[2] = {1, 1};
  return encode(map, f32 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2,
                const_cast<void*>(base), dims, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

int sm_count() {
  int dev = 0, n = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return 132;
  if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) return 132;
  return n;
}

int ceil_div(int a, int b) { return (a + b - 1) / b; }

// A tile's time in units of a 256-wide tile's (tuning.h): t128 is a 128-wide tile's,
// kTileTime128, or kTileTime128OffLine where operand rows are off the 128-byte lines; t192 a
// 192-wide tile's (plain launches only).
double tile_time(int bn, double t128 = tuning::kTileTime128, double t192 = tuning::kTileTime192) {
  return bn == 128 ? t128 : bn == 192 ? t192 : 1.0;
}

// Fewest "waves × tile time".
int choose_tile_n(int M, int N, int ctas, double t128 = tuning::kTileTime128) {
  const int mb = ceil_div(M, detail::kTileM);
  double best = 0;
  int best_bn = 256;
  for (int bn : {256, 128}) {
    const int tiles = mb * ceil_div(N, bn);
    const int waves = ceil_div(tiles, std::max(1, std::min(ctas, tiles)));
    const double cost = waves * tile_time(bn, t128);
    if (bn == 256 || cost < best) {
      best = cost;
      best_bn = bn;
    }
  }
  return best_bn;
}

// CTA pairs (hook 5) take no more waves than single CTAs: an odd M-block count leaves one
// member of the last pair of each N-block idle, which can add a wave of pairs.
bool pairs_fit(int m_blocks, int n_blocks, int ctas) {
  return ctas >= 2 &&
         ceil_div(detail::pair_sweep(m_blocks, n_blocks), ctas / 2) <= ceil_div(m_blocks * n_blocks, ctas);
}

// Stream-K (gemm.h). Chosen (mode 0) only where it measured faster, in two cases (tuning.h):
// few rows, or a short last wave after whole ones where the wave model below expects a gain.
// Forced (mode 2): stream-K wherever a wave is partial, at the tile width the model prefers.
struct TilePlan {
  int tile_n;
  bool stream_k;
};

// The wave model's cost of stream-K at tile width bn (tile-time units), or -1: no partial wave.
double stream_k_cost(int mb, int N, int k_blocks, int ctas, int bn, double t128, double t192) {
  const int tiles = mb * ceil_div(N, bn);
  if (tiles % ctas == 0) return -1;
  return (tiles / ctas + double(tiles % ctas) / ctas + tuning::kStreamKFixupSlices / k_blocks) *
         tile_time(bn, t128, t192);
}

// Whether a last wave of `tiles` tiles on `ctas` CTAs is short enough for the chosen stream-K
// (case 2, tuning.h): at most 1 / kStreamKLastWaveDen of the CTAs, after whole waves.
bool stream_k_wave_ok(int tiles, int ctas) {
  return tiles >= ctas && tuning::kStreamKLastWaveDen * (tiles % ctas) <= ctas;
}

// The widths a plan may take: 192 only where `wide192` (plain launches: the fused kernels are
// built for 128 and 256).
constexpr int kWidths[3] = {256, 192, 128};

TilePlan choose_tiles(int M, int N, int k_blocks, int ctas, int forced_bn, int mode, double t128,
                      bool wide192, double t192) {
  const int mb = ceil_div(M, detail::kTileM);
  const TilePlan plain{forced_bn != 0 ? forced_bn : choose_tile_n(M, N, ctas, t128), false};
  if (mode == 0) {
    if (k_blocks < tuning::kStreamKLastWaveMinKBlocks) return plain;
    if (k_blocks >= tuning::kStreamKMinKBlocks && M <= tuning::kStreamKSmallM &&
        tuning::kStreamKSmallMBusyDen * mb * ceil_div(N, plain.tile_n) <=
            tuning::kStreamKSmallMBusyNum * ctas) {
      // 256-wide tiles unless that splits a tile over too many CTAs: M = 64, N = 2560 ran
      // 0.60 × with 128-wide tiles, 0.94 × with 256-wide; M = 1, N = 8192 0.66 × with 256-wide,
      // 0.81 × with 128-wide.
      const bool wide = tuning::kStreamKMaxCtasPerTile * mb * ceil_div(N, 256) >= ctas;
      const int bn = forced_bn != 0 ? forced_bn : (wide ? 256 : 128);
      return {bn, true};
    }
    const int plain_tiles = mb * ceil_div(N, plain.tile_n);
    const double plain_cost =
        ceil_div(plain_tiles, std::max(1, std::min(ctas, plain_tiles))) * tile_time(plain.tile_n, t128, t192);
    TilePlan best = plain;
    double best_cost = tuning::kStreamKBar * plain_cost;
    for (int bn : kWidths) {
      if ((forced_bn != 0 && bn != forced_bn) || (bn == 192 && !wide192)) continue;
      const int tiles = mb * ceil_div(N, bn);
      // No whole wave, or a long last one.
      if (!stream_k_wave_ok(tiles, ctas)) continue;
      const double cost = stream_k_cost(mb, N, k_blocks, ctas, bn, t128, t192);
      if (cost >= 0 && cost <= best_cost) {
        best = {bn, true};
        best_cost = cost;
      }
    }
    return best;
  }
  TilePlan best{0, true};
  double best_cost = 0;
  for (int bn : kWidths) {
    if ((forced_bn != 0 && bn != forced_bn) || (bn == 192 && !wide192)) continue;
    const double cost = stream_k_cost(mb, N, k_blocks, ctas, bn, t128, t192);
    if (cost >= 0 && (best.tile_n == 0 || cost < best_cost)) {
      best = {bn, true};
      best_cost = cost;
    }
  }
  return best.tile_n != 0 && mode == 2 ? best : plain;
}

// Workspace layout: counters for up to kSkMaxCtas CTAs (2 per stream-K tile, fewer tiles than
// CTAs) at a fixed size, so that launches with different CTA counts can share a workspace,
// then two partial slots per CTA and consumer warpgroup.
constexpr int kSkMaxCtas = 1024;
constexpr size_t kSkCounterBytes = size_t(2 * kSkMaxCtas) * 4;
constexpr size_t kSkPartialBytes = size_t(detail::kSkHalfF4) * 16;  // one warpgroup's slot

// One plain-kernel instance. CTA pairs are a cluster launch whose grid is capped at the
// clusters that fit on the device at once (cudaOccupancyMaxActiveClusters, asked once per
// device): a persistent CTA pair that waited for another pair to finish would only add a wave.
template <int BN, bool kBKN, bool kPair>
cudaError_t launch_kernel(const detail::GemmPlan& p, cudaStream_t stream) {
  auto kernel = detail::gemm_sm90_kernel<BN, kBKN, kPair, detail::DefaultEpilogue>;
  constexpr size_t smem = GemmTileConfig<BN, detail::DefaultEpilogue::kStagingRounds>::kSmemBytes;
  static std::atomic<uint64_t> opted_in{0};
  if (cudaError_t e = detail::gemm_opt_in_smem(reinterpret_cast<const void*>(kernel), smem, opted_in);
      e != cudaSuccess) {
    return e;
  }
  if constexpr (!kPair) {
    return detail::launch_early(kernel, dim3(p.grid), dim3(detail::kGemmThreads), smem, stream, p.ta, p.tb,
                                p.tc, p.prob, p.epi);
  }
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = 2;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(p.grid);
  cfg.blockDim = dim3(detail::kGemmThreads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = 1;

  static std::atomic<int> fit[64] = {};  // clusters that fit, per device; 0: not asked yet
  int dev = 0;
  if (cudaError_t e = cudaGetDevice(&dev); e != cudaSuccess) return e;
  int clusters = fit[dev & 63].load(std::memory_order_relaxed);
  if (clusters == 0) {
    if (cudaError_t e = cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg); e != cudaSuccess) {
      return e;
    }
    if (clusters < 1) return cudaErrorInvalidConfiguration;  // a pair never fits
    fit[dev & 63].store(clusters, std::memory_order_relaxed);
  }
  return detail::launch_early_with(attr, 1, kernel, dim3(2 * std::min(p.grid / 2, clusters)), cfg.blockDim,
                                   smem, stream, p.ta, p.tb, p.tc, p.prob, p.epi);
}

// The kernel whose consumers take turns (gemm_pingpong.cuh): 128-wide tiles, single CTAs.
template <bool kBKN>
cudaError_t launch_pingpong(const detail::GemmPlan& p, cudaStream_t stream) {
  auto kernel = detail::gemm_pingpong_kernel<kBKN>;
  constexpr size_t smem = GemmTileConfig<128, 1>::kSmemBytes;
  static std::atomic<uint64_t> opted_in{0};
  if (cudaError_t e = detail::gemm_opt_in_smem(reinterpret_cast<const void*>(kernel), smem, opted_in);
      e != cudaSuccess) {
    return e;
  }
  return detail::launch_early(kernel, dim3(p.grid), dim3(detail::kGemmThreads), smem, stream, p.ta, p.tb,
                              p.tc, p.prob);
}

template <int BN, bool kBKN>
cudaError_t launch_instance(const detail::GemmPlan& p, cudaStream_t stream) {
  return p.cluster == 2 ? launch_kernel<BN, kBKN, true>(p, stream)
                        : launch_kernel<BN, kBKN, false>(p, stream);
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

bool valid_flags(const GemmReadyFlags& f) {
  return f.flags == nullptr || (f.chunk_rows > 0 && f.num_chunks > 0);
}

}  // namespace

size_t gemm_workspace_bytes(int num_ctas) {
  const int ctas = num_ctas > 0 ? num_ctas : sm_count();
  return kSkCounterBytes + size_t(2 * ctas) * 2 * kSkPartialBytes;
}

GemmTileGrid gemm_tile_grid(int M, int N, int tile_n, int num_ctas) {
  const int ctas = num_ctas > 0 ? num_ctas : sm_count();
  const int bn = (tile_n == 128 || tile_n == 192 || tile_n == 256) ? tile_n : choose_tile_n(M, N, ctas);
  return {detail::kTileM, bn, ceil_div(M, detail::kTileM), ceil_div(N, bn)};
}

namespace detail {

bool encode_a_map(CUtensorMap* map, const __nv_bfloat16* A, int rows, int K, int64_t lda) {
  return encode_2d(map, A, static_cast<uint64_t>(rows), static_cast<uint64_t>(K), lda, kTileM, kTileK);
}

bool encode_b_map(CUtensorMap* map, const __nv_bfloat16* B, int64_t rows, int cols, int64_t ldb, bool kn,
                  int tile_n) {
  return kn ? encode_2d(map, B, static_cast<uint64_t>(rows), static_cast<uint64_t>(cols), ldb, kTileK, 64)
            : encode_2d(map, B, static_cast<uint64_t>(rows), static_cast<uint64_t>(cols), ldb,
                        static_cast<uint32_t>(tile_n), kTileK);
}

bool encode_store_map(CUtensorMap* map, void* base, int rows, int cols, int64_t ld, bool f32) {
  return encode_2d(map, base, static_cast<uint64_t>(rows), static_cast<uint64_t>(cols), ld, 64, f32 ? 32 : 64,
                   f32);
}

// The raster group's height where the caller leaves it (GemmArgs::group_m = 0; tuning.h).
int default_group_m(int tile_n) { return tile_n == 256 ? tuning::kGroupM256 : tuning::kGroupM128; }

// gemm_plan, or without the tensor maps (encode = false): the checks and the schedule only,
// which need no driver; the staged launch's cost model plans its options so. `plain`: the plan
// of launch_gemm's own kernels, which may take 192-wide tiles (the fused launchers' kernels,
// through gemm_plan, are built for 128 and 256 only).
cudaError_t plan_launch(const GemmArgs& a, GemmPlan* plan, bool encode, bool plain);

cudaError_t gemm_plan(const GemmArgs& a, GemmPlan* plan) { return plan_launch(a, plan, true, false); }

cudaError_t plan_launch(const GemmArgs& a, GemmPlan* plan, bool encode, bool plain) {
  // ---- contract checks (gemm.h) ----
  if (a.M < 1 || a.N < 1 || a.K < 1) return cudaErrorInvalidValue;
  // The register path (tile sink, tile flags) stores column pairs: whole 8-column groups.
  if ((a.sink.mode != GemmSinkMode::kNone || a.sink.tile_flags != nullptr) && a.N % 8 != 0) {
    return cudaErrorInvalidValue;
  }
  if (a.A == nullptr || a.B == nullptr) return cudaErrorInvalidValue;
  if (a.C == nullptr && a.sink.mode == GemmSinkMode::kNone) return cudaErrorInvalidValue;
  const bool kn = a.b_layout == GemmLayoutB::kKN;
  if (a.lda < a.K || a.ldb < (kn ? a.N : a.K) || (a.C != nullptr && a.ldc < a.N)) {
    return cudaErrorInvalidValue;
  }
  if (a.lda % 8 || a.ldb % 8) return cudaErrorInvalidValue;  // TMA loads: 16-byte row strides
  if (!aligned16(a.A) || !aligned16(a.B) || !aligned16(a.C)) return cudaErrorInvalidValue;
  if (a.tile_n != 0 && a.tile_n != 128 && a.tile_n != 256 && a.tile_n != 192) return cudaErrorInvalidValue;
  if (a.cluster < 0 || a.cluster > 2) return cudaErrorInvalidValue;
  if (a.stream_k < 0 || a.stream_k > 2) return cudaErrorInvalidValue;
  if (a.pingpong < 0 || a.pingpong > 2) return cudaErrorInvalidValue;
  const GemmWaitConfig& w = a.wait;
  if (!valid_flags(w.a) || !valid_flags(w.b)) return cudaErrorInvalidValue;
  if ((w.a.flags != nullptr || w.b.flags != nullptr) && w.error == nullptr) { return cudaErrorInvalidValue; }
  const GemmTileSink& s = a.sink;
  if (s.mode != GemmSinkMode::kNone) {
    if (s.num_dests < 1 || s.num_dests > kGemmMaxSinkDests || s.ld < a.N || s.ld % 8) {
      return cudaErrorInvalidValue;
    }
    for (uint32_t d = 0; d < s.num_dests; ++d) {
      if (s.dest[d] == nullptr || !aligned16(s.dest[d])) return cudaErrorInvalidValue;
    }
  }

  // ---- schedule ----
  const int ctas = a.num_ctas > 0 ? a.num_ctas : sm_count();
  const int k_blocks = ceil_div(a.K, detail::kTileK);
  const bool hooks = w.a.flags != nullptr || w.b.flags != nullptr || s.tile_flags != nullptr;
  // 192-wide tiles: launch_gemm's kernels on single CTAs, without hooks 1-2.
  const bool wide192_ok = plain && !hooks && s.mode == GemmSinkMode::kNone && a.cluster != 2;
  if (a.tile_n == 192 && !wide192_ok) return cudaErrorInvalidValue;
  // Stream-K: plain launches with C and a workspace (gemm.h); k_blocks bounded so that the
  // iteration count and its products stay in range.
  const bool sk_able = a.workspace != nullptr && (reinterpret_cast<uintptr_t>(a.workspace) & 255) == 0 &&
                       a.workspace_bytes >= gemm_workspace_bytes(ctas) && !hooks &&
                       s.mode == GemmSinkMode::kNone && a.C != nullptr && a.cluster != 2 && a.stream_k != 1 &&
                       k_blocks <= 65536 && ctas <= kSkMaxCtas;
  // CTA pairs the launch may choose (cluster = 0): plain launches without hooks 1-2 or the sink.
  const bool pairs_open = a.cluster == 0 && a.tile_n == 0 && a.pingpong != 2 && !hooks &&
                          s.mode == GemmSinkMode::kNone && ctas >= 2;
  // Rows of A or B off the 128-byte lines (a row stride off the multiple of 64 elements): every
  // 128-byte row of a TMA box straddles two lines, and the loads, not the tensor cores, bound
  // the time. Where the plan takes 256-wide tiles, CTA pairs halve the B rows each CTA loads
  // (tuning.h, kPairOffLine*): stream-K is then left out.
  // There 128-wide tiles also lose more than 256-wide ones (kTileTime128OffLine): the tile width
  // of a plain launch left to choose weighs them so.
  const int mb = ceil_div(a.M, detail::kTileM);
  const bool off_lines = a.lda % 64 != 0 || a.ldb % 64 != 0;
  const double t128 = pairs_open && off_lines ? tuning::kTileTime128OffLine : tuning::kTileTime128;
  bool off_line_pairs = false;
  if (pairs_open && off_lines && a.stream_k != 2 && mb >= 2 && choose_tile_n(a.M, a.N, ctas, t128) == 256) {
    const int nb = ceil_div(a.N, 256);
    off_line_pairs = mb * nb >= tuning::kPairOffLineMinTiles && pairs_fit(mb, nb, ctas);
  }
  const double t192 = off_lines ? tuning::kTileTime192OffLine : tuning::kTileTime192;
  TilePlan tiles = sk_able && !off_line_pairs
                       ? choose_tiles(a.M, a.N, k_blocks, ctas, a.tile_n, a.stream_k, t128, wide192_ok, t192)
                       : TilePlan{0, false};
  int tile_n = off_line_pairs ? 256 : tiles.stream_k ? tiles.tile_n : a.tile_n;
  if (tile_n == 0 && pairs_open && off_lines) tile_n = choose_tile_n(a.M, a.N, ctas, t128);
  // 192-wide tiles where the launch chooses (plain launches, no CTA pairs or turns asked for):
  // where the wave model puts them, plain or by stream-K, at <= kTile192Bar × the plan above
  // (an N off the multiple of 256 by 1-192 columns, e.g. N = 376: two 192-wide N-blocks
  // instead of two 256-wide blocks a quarter empty, or three 128-wide ones; or fewer idle CTAs
  // in the last wave). CTA pairs on rows off the lines count as 256-wide tiles on the lines
  // (they ran at the aligned speed), a wave of pairs per ctas / 2 pair sweep positions; they
  // stay where a row stride is also off the 32-byte sectors (an odd multiple of 8 elements),
  // where single CTAs lose 1.4-2 × (tuning.h kOffLine*).
  const bool off_sectors = a.lda % 16 != 0 || a.ldb % 16 != 0;
  if (wide192_ok && a.tile_n == 0 && a.cluster == 0 && a.pingpong != 2 && a.stream_k != 2 &&
      !(off_line_pairs && off_sectors)) {
    const int bn0 = tile_n != 0 ? tile_n : choose_tile_n(a.M, a.N, ctas, t128);
    const int tiles0 = mb * ceil_div(a.N, bn0);
    const double cur = off_line_pairs ? ceil_div(detail::pair_sweep(mb, ceil_div(a.N, 256)), ctas / 2)
                       : tiles.stream_k
                           ? stream_k_cost(mb, a.N, k_blocks, ctas, bn0, t128, t192)
                           : ceil_div(tiles0, std::min(ctas, tiles0)) * tile_time(bn0, t128, t192);
    const int tiles192 = mb * ceil_div(a.N, 192);
    double best = ceil_div(tiles192, std::min(ctas, tiles192)) * t192;
    bool sk192 = false;
    if (sk_able && k_blocks >= tuning::kStreamKLastWaveMinKBlocks && stream_k_wave_ok(tiles192, ctas)) {
      const double c = stream_k_cost(mb, a.N, k_blocks, ctas, 192, t128, t192);
      if (c >= 0 && c <= tuning::kStreamKBar * best) best = c, sk192 = true;
    }
    if (best <= tuning::kTile192Bar * cur) {
      tile_n = 192;
      tiles = TilePlan{192, sk192};
      off_line_pairs = false;
    }
  }
  // C through TMA stores needs a 16-byte row stride, and N a multiple of 8 (TMA stores clip at
  // the tensor's bounds in whole 16 bytes); else bf16 C goes out through shared memory in
  // coalesced rows, fp32 C through the register path.
  const bool c_tma = a.C != nullptr && s.tile_flags == nullptr && a.ldc % 8 == 0 && a.N % 8 == 0;
  const bool c_rows = a.C != nullptr && s.tile_flags == nullptr && !c_tma && a.c_type == GemmOutType::kBF16;
  // Consumers that take turns: plain launches that store C through TMA, 128-wide tiles.
  const bool pp_able = a.pingpong != 1 && !tiles.stream_k && !hooks && s.mode == GemmSinkMode::kNone &&
                       c_tma && a.cluster != 2 && tile_n != 256 && tile_n != 192;
  if (pp_able && a.pingpong == 2) tile_n = 128;
  const GemmTileGrid g = gemm_tile_grid(a.M, a.N, tile_n, ctas);
  GemmProblem& prob = plan->prob;
  prob = GemmProblem{};
  prob.M = a.M;
  prob.N = a.N;
  prob.K = a.K;
  prob.m_blocks = g.m_blocks;
  prob.n_blocks = g.n_blocks;
  prob.k_blocks = k_blocks;
  prob.num_tiles = g.m_blocks * g.n_blocks;
  prob.group_m = std::max(1, a.group_m > 0 ? a.group_m : default_group_m(g.tile_n));
  prob.m_block_start = ((a.m_block_start % g.m_blocks) + g.m_blocks) % g.m_blocks;
  prob.wait = a.wait;
  plan->tile_n = g.tile_n;
  plan->kn = kn;
  plan->pingpong = pp_able && g.tile_n == 128;

  // CTA pairs: only without hooks 1-2 (a pair runs in lockstep, and its idle member's tile
  // has no flag), and for at least two CTAs.
  if (a.cluster == 2 && (hooks || ctas < 2)) return cudaErrorInvalidValue;
  // The launch's own choice (cluster = 0) is single CTAs (pairs measured even with them on
  // H200, within ±2 % per shape), except for the few 128-wide tiles of a short grid with long
  // enough K (tuning.h, kPair*), where pairs replace the ping-pong: two M-blocks share each B
  // tile, halving the L2 reads that bound 128-wide tiles; and for operand rows off the
  // 128-byte lines on 256-wide tiles (above).
  // Pairs never take more waves than single CTAs would (pairs_fit).
  const bool pairs_chosen =
      off_line_pairs || (pairs_open && !tiles.stream_k && g.tile_n == 128 && g.m_blocks >= 2 &&
                         prob.num_tiles <= tuning::kPairMaxWaves * ctas &&
                         k_blocks >= tuning::kPairMinKBlocks && pairs_fit(g.m_blocks, g.n_blocks, ctas));
  if (pairs_chosen) plan->pingpong = false;
  plan->cluster = a.cluster == 2 || pairs_chosen ? 2 : 1;
  if (plan->cluster == 2) {
    prob.sweep = detail::pair_sweep(g.m_blocks, g.n_blocks);
    plan->grid = 2 * std::min(ctas / 2, prob.sweep);
  } else if (tiles.stream_k) {
    // Whole waves round robin, then the partial wave's tiles in K segments over all CTAs.
    prob.sweep = prob.num_tiles / ctas * ctas;
    prob.sk_tiles = prob.num_tiles - prob.sweep;
    auto* ws = static_cast<uint8_t*>(a.workspace);
    prob.sk_counters = reinterpret_cast<uint32_t*>(ws);
    prob.sk_partials = reinterpret_cast<float4*>(ws + kSkCounterBytes);
    plan->grid = ctas;
  } else {
    prob.sweep = prob.num_tiles;
    plan->grid = std::min(ctas, prob.num_tiles);
  }

  // ---- tensor maps ----
  if (!encode) return cudaSuccess;
  if (!detail::encode_a_map(&plan->ta, a.A, a.M, a.K, a.lda)) { return cudaErrorInvalidValue; }
  // kNK B boxes: the tile's rows, or each pair member's half of them.
  const bool ok_b = kn ? encode_2d(&plan->tb, a.B, a.K, a.N, a.ldb, detail::kTileK, 64)
                       : encode_2d(&plan->tb, a.B, a.N, a.K, a.ldb, g.tile_n / plan->cluster, detail::kTileK);
  if (!ok_b) return cudaErrorInvalidValue;

  // C goes through shared memory and TMA stores (full-line writes, asynchronous) unless tile
  // flags must order it, in which case the register path stores it before the release, or TMA
  // cannot store it (above): then bf16 C goes through shared memory in coalesced rows
  // (store_c_rows), fp32 C through the register path element by element (DefaultEpilogue).
  plan->tc = CUtensorMap{};
  const bool f32 = a.c_type == GemmOutType::kF32;
  if (c_tma && !detail::encode_store_map(&plan->tc, a.C, a.M, a.N, a.ldc, f32)) {
    return cudaErrorInvalidValue;
  }
  prob.c_tma = c_rows ? detail::kCRowsBF16 : !c_tma ? 0 : f32 ? detail::kCTmaF32 : detail::kCTmaBF16;
  prob.c_rows = c_rows ? static_cast<__nv_bfloat16*>(a.C) : nullptr;
  prob.c_rows_ld = a.ldc;

  detail::DefaultEpilogue& epi = plan->epi;
  epi = detail::DefaultEpilogue{};
  epi.c = c_tma || c_rows ? nullptr : a.C;
  epi.ldc = a.ldc;
  epi.c_type = a.c_type;
  epi.sink = a.sink;
  return cudaSuccess;
}

}  // namespace detail

cudaError_t gemm_launch_plan(const GemmArgs& a, GemmLaunchPlan* out) {
  detail::GemmPlan p;
  if (cudaError_t e = detail::plan_launch(a, &p, true, true); e != cudaSuccess) return e;
  out->grid = {detail::kTileM, p.tile_n, p.prob.m_blocks, p.prob.n_blocks};
  out->ctas = p.grid;
  out->stream_k_tiles = p.prob.sk_tiles;
  out->pingpong = p.pingpong;
  out->pairs = p.cluster == 2;
  return cudaSuccess;
}

cudaError_t launch_gemm(const GemmArgs& a, cudaStream_t stream) {
  detail::GemmPlan p;
  if (cudaError_t e = detail::plan_launch(a, &p, true, true); e != cudaSuccess) return e;
  if (p.pingpong) return p.kn ? launch_pingpong<true>(p, stream) : launch_pingpong<false>(p, stream);
  if (p.tile_n == 256) {
    return p.kn ? launch_instance<256, true>(p, stream) : launch_instance<256, false>(p, stream);
  }
  if (p.tile_n == 192) {  // single CTAs only (plan_launch)
    return p.kn ? launch_kernel<192, true, false>(p, stream) : launch_kernel<192, false, false>(p, stream);
  }
  return p.kn ? launch_instance<128, true>(p, stream) : launch_instance<128, false>(p, stream);
}

namespace {

// Staged launch (gemm.h): a rows × cols bf16 matrix from row stride `lds` to row stride `ldd`
// (a multiple of 8, 16-byte aligned rows). Each thread writes 8 consecutive elements of a row
// with one 16-byte store (the pad past `cols` too: it is never read, TMA zero-fills past the
// matrix), from one 16-byte load where the source rows are 16-byte aligned (kSrcAligned) and
// the 8 lie within `cols`, else from element loads, which a warp makes over 512 contiguous
// bytes.
template <bool kSrcAligned>
__global__ void __launch_bounds__(256)
    restride_kernel(const __nv_bfloat16* __restrict__ src, int64_t lds, __nv_bfloat16* __restrict__ dst,
                    int64_t ldd, int rows, int cols) {
  const int groups = (cols + 7) / 8;
  const int64_t total = int64_t(rows) * groups;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / groups;
    const int c0 = static_cast<int>(i - r * groups) * 8;
    const __nv_bfloat16* s = src + r * lds + c0;
    uint4* d = reinterpret_cast<uint4*>(dst + r * ldd + c0);
    const int n = min(8, cols - c0);
    if (kSrcAligned && n == 8) {
      *d = *reinterpret_cast<const uint4*>(s);
    } else {  // a row's last, partial group is read element by element: nothing past `cols`
      alignas(16) __nv_bfloat16 v[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = j < n ? s[j] : __nv_bfloat16{};
      *d = *reinterpret_cast<const uint4*>(v);
    }
  }
}

int64_t pad64(int64_t x) { return (x + 63) / 64 * 64; }
size_t align256(size_t x) { return (x + 255) / 256 * 256; }

// The staged operands of `a`: padded row strides (0: the operand is used in place) and bytes.
// An operand is staged where TMA cannot read its rows (a stride off the multiple of 8). An
// operand whose rows are off the 128-byte lines (a stride off the multiple of 64) is staged
// where the cost model of tuning.h (kStage*, kOffLine*) puts the copies and the GEMM on the
// copied rows below the GEMM on the rows in place: each choice of copies is planned as
// launch_gemm would plan it, and timed as its copies plus waves × tile time, the waves on rows
// left off the lines weighed by their penalty. Staged rows are padded to 64 elements.
struct Staging {
  int64_t lda, ldb;
  size_t a_bytes, b_bytes;
};

// The model's time of the GEMM that `q` plans (tuning.h), in µs; < 0 where it is refused.
double modelled_gemm_us(const GemmArgs& q) {
  detail::GemmPlan p;
  if (detail::plan_launch(q, &p, false, true) != cudaSuccess) return -1;
  const int ctas = q.num_ctas > 0 ? q.num_ctas : sm_count();
  const int tiles = p.prob.m_blocks * p.prob.n_blocks;
  double waves;
  if (p.cluster == 2) {
    waves = ceil_div(detail::pair_sweep(p.prob.m_blocks, p.prob.n_blocks), std::max(1, ctas / 2));
  } else if (p.prob.sk_tiles > 0) {
    waves = tiles / ctas + double(tiles % ctas) / ctas + tuning::kStreamKFixupSlices / p.prob.k_blocks;
  } else {
    waves = ceil_div(tiles, std::max(1, std::min(ctas, tiles)));
  }
  const double tile_us = 2.0 * detail::kTileM * 256 * q.K / (tuning::kStageModelTflops * 1e6 / ctas);
  const double t = waves * (p.pingpong ? tuning::kTileTimeTurns : tile_time(p.tile_n)) * tile_us;
  // Rows left off the 128-byte lines (strides that are multiples of 8, not of 64).
  const bool off_a = q.lda % 64 != 0, off_b = q.ldb % 64 != 0;
  if (!off_a && !off_b) return t;
  if (p.cluster == 2 && p.tile_n == 256) return t * tuning::kOffLinePairs;
  const double pa = q.lda % 16 != 0 ? tuning::kOffLineSplitA : tuning::kOffLineWholeA;
  const double pb = q.ldb % 16 != 0 ? tuning::kOffLineSplitB : tuning::kOffLineWholeB;
  return t * (1.0 + (off_a ? pa : 0.0) + (off_b ? pb : 0.0));
}

Staging staging_of(const GemmArgs& a) {
  const bool kn = a.b_layout == GemmLayoutB::kKN;
  Staging st{};
  if (a.M < 1 || a.N < 1 || a.K < 1) return st;
  auto copy_us = [](int64_t rows, int64_t cols) {
    return double(rows) * cols * 4 / (tuning::kStageModelGBps * 1e3) + tuning::kStageModelLaunchUs;
  };
  const int64_t b_rows = kn ? a.K : a.N, b_cols = kn ? a.N : a.K;
  const bool must_a = a.lda % 8 != 0, must_b = a.ldb % 8 != 0;
  const bool off_a = !must_a && a.lda % 64 != 0, off_b = !must_b && a.ldb % 64 != 0;
  // Copies: bit 0 A, bit 1 B. The cheapest by the model; fewer copies on a tie.
  int copies = (must_a ? 1 : 0) | (must_b ? 2 : 0);
  if (off_a || off_b) {
    double best = -1;
    const int base = copies;
    for (int extra : {0, 1, 2, 3}) {
      if (((extra & 1) && !off_a) || ((extra & 2) && !off_b)) continue;
      const int c = base | extra;
      GemmArgs q = a;
      double t = 0;
      if (c & 1) q.lda = pad64(a.K), t += copy_us(a.M, a.K);
      if (c & 2) q.ldb = pad64(b_cols), t += copy_us(b_rows, b_cols);
      const double g = modelled_gemm_us(q);
      if (g < 0) continue;
      if (best < 0 || t + g < best) {
        best = t + g;
        copies = c;
      }
    }
  }
  if (copies & 1) {
    st.lda = pad64(a.K);
    st.a_bytes = align256(size_t(a.M) * st.lda * 2);
  }
  if (copies & 2) {
    st.ldb = pad64(b_cols);
    st.b_bytes = align256(size_t(b_rows) * st.ldb * 2);
  }
  return st;
}

cudaError_t restride(const __nv_bfloat16* src, int64_t lds, __nv_bfloat16* dst, int64_t ldd, int rows,
                     int cols, cudaStream_t stream) {
  const int64_t groups = int64_t(rows) * ((cols + 7) / 8);
  const int blocks = static_cast<int>(std::min<int64_t>((groups + 255) / 256, int64_t(sm_count()) * 16));
  if (lds % 8 == 0 && (reinterpret_cast<uintptr_t>(src) & 15) == 0) {
    restride_kernel<true><<<blocks, 256, 0, stream>>>(src, lds, dst, ldd, rows, cols);
  } else {
    restride_kernel<false><<<blocks, 256, 0, stream>>>(src, lds, dst, ldd, rows, cols);
  }
  return cudaGetLastError();
}

}  // namespace

size_t gemm_staging_bytes(const GemmArgs& a) {
  const Staging st = staging_of(a);
  return st.a_bytes + st.b_bytes;
}

cudaError_t launch_gemm_staged(const GemmArgs& a, void* staging, size_t staging_bytes, cudaStream_t stream) {
  const Staging st = staging_of(a);
  const size_t need = st.a_bytes + st.b_bytes;
  if (need == 0) return launch_gemm(a, stream);
  const bool hooks = a.wait.a.flags != nullptr || a.wait.b.flags != nullptr ||
                     a.sink.mode != GemmSinkMode::kNone || a.sink.tile_flags != nullptr;
  const bool kn = a.b_layout == GemmLayoutB::kKN;
  if (hooks || a.cluster == 2 || staging == nullptr || staging_bytes < need ||
      (reinterpret_cast<uintptr_t>(staging) & 255) != 0 || a.lda < a.K || a.ldb < (kn ? a.N : a.K)) {
    return cudaErrorInvalidValue;
  }
  GemmArgs p = a;
  auto* sa = static_cast<__nv_bfloat16*>(staging);
  auto* sb = reinterpret_cast<__nv_bfloat16*>(static_cast<uint8_t*>(staging) + st.a_bytes);
  if (st.lda != 0) p.A = sa, p.lda = st.lda;
  if (st.ldb != 0) p.B = sb, p.ldb = st.ldb;
  // The padded arguments must pass launch_gemm's checks before anything is enqueued.
  GemmLaunchPlan plan;
  if (cudaError_t e = gemm_launch_plan(p, &plan); e != cudaSuccess) return e;
  cudaError_t e = cudaSuccess;
  if (st.lda != 0 && (e = restride(a.A, a.lda, sa, st.lda, a.M, a.K, stream)) != cudaSuccess) return e;
  if (st.ldb != 0 &&
      (e = restride(a.B, a.ldb, sb, st.ldb, kn ? a.K : a.N, kn ? a.N : a.K, stream)) != cudaSuccess) {
    return e;
  }
  return launch_gemm(p, stream);
}

}  // namespace fusedcomm::kernels
