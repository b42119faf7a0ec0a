// Host side of gemm_ar.h: gemmAllReduce as its one-shot kernel (detail/ar_oneshot_kernel.cuh:
// geometry, workspace, launch), as gemmReduceScatter's fused kernel then an allGather, or as our
// GEMM then an allReduce.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <type_traits>

#include "kernels/collectives/collectives.h"
#include "kernels/collectives/copy_segments.h"
#include "kernels/common/fused_choice.h"
#include "kernels/common/fused_launch.cuh"
#include "kernels/gemm/gemm.h"
#include "kernels/gemm_ar/detail/ar_oneshot_kernel.cuh"
#include "kernels/gemm_ar/detail/ar_oneshot_wgmma.cuh"
#include "kernels/gemm_ar/gemm_ar.h"
#include "kernels/gemm_ar/tuning.h"
#include "kernels/gemm_rs/gemm_rs.h"

namespace fusedcomm::kernels {
namespace {

using detail::aligned16;
using detail::base_gemm_args;
using detail::ceil_div;
using detail::device_sms;
using detail::larger;
using detail::round_up;
using detail::valid_device;
using detail::valid_shape;

// The gemmReduceScatter that gemmAllReduce's fused path runs (partials: any order is fp32).
GemmRsArgs ar_rs_args(const GemmArArgs& a) {
  GemmRsArgs r;
  r.M = a.M;
  r.N = a.N;
  r.K = a.K;
  r.A = a.A;
  r.B = a.B;
  r.b_layout = a.b_layout;
  r.ws_offset = a.ws_offset;
  r.algo = FusedAlgo::kFused;
  r.partials = a.partials == RsPartials::kBF16 ? RsPartials::kBF16 : RsPartials::kF32;
  return r;
}
// Fused path: where this rank's row block of the sum goes (a byte offset of the data area),
// right after the reduce-scatter's receive slots.
uint64_t ar_block_offset(const GemmArArgs& a, int world) {
  return round_up(detail::rs_workspace(ar_rs_args(a), world, FusedAlgo::kFused).data_bytes, 256);
}

// ---- the one-shot kernel's geometry (detail/ar_oneshot_kernel.cuh) -----------------------------
// The tile grid, from M and N only (every rank's slots and flags are per tile): the tile height
// from M; for the mma.sync tiles (16 and 32 rows) the widest tile (128, 64, 32 columns) that
// still gives kArFillTiles tiles, for the wgmma tiles (64 and 128 rows) 128 columns where those
// alone give kArFillTiles tiles, else 64; and the largest split any rank may pick (rank-uniform:
// it sizes the workspace).
struct ArTiles {
  int bm, bn, tiles_n, tiles, max_splits;
};
ArTiles ar_tiles(int M, int N) {
  ArTiles g{};
  g.bm = M <= tuning::kArTileM16MaxM   ? 16
         : M <= tuning::kArTileM32MaxM ? 32
         : M <= tuning::kArTileM64MaxM ? 64
                                       : 128;
  const int64_t m_blocks = ceil_div(std::max(M, 1), g.bm);
  if (g.bm >= 64) {
    g.bn = m_blocks * ceil_div(std::max(N, 1), 128) >= tuning::kArFillTiles ? 128 : 64;
  } else {
    g.bn = 128;
    while (g.bn > 32 && m_blocks * ceil_div(std::max(N, 1), g.bn) < tuning::kArFillTiles) g.bn /= 2;
  }
  g.tiles_n = static_cast<int>(ceil_div(std::max(N, 1), g.bn));
  const int64_t tiles = m_blocks * g.tiles_n;
  g.tiles = static_cast<int>(std::min<int64_t>(tiles, int64_t{1} << 30));
  g.max_splits = std::clamp(tuning::kArSplitUnits / g.tiles, 1, tuning::kArMaxSplits);
  return g;
}
uint64_t ar_partial_bytes(const GemmArArgs& a) { return a.partials == RsPartials::kBF16 ? 2 : 4; }
// One source's receive slot: every tile's BM × BN partials.
uint64_t ar_slot_bytes(const GemmArArgs& a, const ArTiles& g) {
  return round_up(static_cast<uint64_t>(g.tiles) * g.bm * g.bn * ar_partial_bytes(a), 256);
}
// The tile flags (W per tile) and, where a tile may be split, its arrival counter fit FusedFlags.
bool ar_one_shot_flags_fit(int world, const ArTiles& g) {
  return static_cast<int64_t>(g.tiles) * world <= kFusedRsTileFlags &&
         (g.max_splits == 1 || g.tiles <= kFusedMaxChunks);
}
// This rank's split of every tile (K_r and the SM count: local, see the kernel's header).
int ar_splits(const CommDevice& d, const GemmArArgs& a, const ArTiles& g) {
  const int by_sms = std::max(1, device_sms(d) / g.tiles);
  const int by_k = std::max(1, a.K / tuning::kArMinSplitK);
  return std::min({g.max_splits, by_sms, by_k});
}

FusedWorkspace ar_workspace(const GemmArArgs& a, int world, FusedAlgo path) {
  const int W = std::max(1, world);
  const uint64_t M = static_cast<uint64_t>(std::max(0, a.M));
  const uint64_t N = static_cast<uint64_t>(std::max(0, a.N));
  if (path == FusedAlgo::kOneShot) {
    // W receive slots in the data area; the split partials in the scratch area.
    const ArTiles g = ar_tiles(a.M, a.N);
    const uint64_t split = g.max_splits > 1 ? uint64_t(g.max_splits) * g.tiles * g.bm * g.bn * 4 : 0;
    return {a.ws_offset + W * ar_slot_bytes(a, g), split};
  }
  if (W == 1) return {a.ws_offset, 0};  // the GEMM alone
  if (path == FusedAlgo::kFused) return {ar_block_offset(a, W) + (M + W - 1) / W * N * 2, 0};
  // The partial product at ws_offset; the allReduce's reduced slices in the scratch area.
  const uint64_t bytes = M * N * (a.partials == RsPartials::kBF16 ? 2 : 4);
  return {a.ws_offset + bytes, W > 1 ? bytes : 0};
}
// kAuto (fused_choice.h).
FusedAlgo choose_ar(const CommDevice& d, const GemmArArgs& a) {
  const auto one_shot_fits = [&] {
    const FusedWorkspace ws = ar_workspace(a, d.world, FusedAlgo::kOneShot);
    return ar_one_shot_flags_fit(d.world, ar_tiles(a.M, a.N)) && ws.data_bytes <= d.data_bytes &&
           ws.scratch_bytes <= d.data_bytes;
  };
  return choose_gemm_all_reduce(a.algo, d.world, a.M, a.N, a.partials == RsPartials::kBF16, one_shot_fits, [&] {
    GemmRsArgs rs = ar_rs_args(a);
    rs.algo = FusedAlgo::kAuto;
    const FusedWorkspace ws = ar_workspace(a, d.world, FusedAlgo::kFused);
    return gemm_reduce_scatter_info(d, rs).algo == FusedAlgo::kFused && ws.data_bytes <= d.data_bytes;
  });
}

// A one-shot instance's launch, either form: its shared memory opted in once (`opted`, the
// instance's), then cooperative: every CTA waits for others (the sums for every rank's pushes),
// so a grid that cannot be resident at once fails instead of hanging.
template <class... Params, class... Args>
cudaError_t launch_ar_cooperative(void (*kernel)(Params...), std::atomic<uint64_t>& opted, int smem, int threads,
                                  int grid, cudaStream_t stream, Args... args) {
  if (cudaError_t e = detail::gemm_opt_in_smem(reinterpret_cast<const void*>(kernel), smem, opted);
      e != cudaSuccess) {
    return e;
  }
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(grid));
  cfg.blockDim = dim3(static_cast<unsigned>(threads));
  cfg.dynamicSmemBytes = static_cast<size_t>(smem);
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeCooperative;
  attr[0].val.cooperative = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, kernel, args...);
}

template <int BM, int BN, bool kKN>
cudaError_t launch_ar_instance(const detail::ArParams& p, int grid, cudaStream_t stream) {
  static std::atomic<uint64_t> opted{0};
  return launch_ar_cooperative(detail::ar_oneshot_kernel<BM, BN, kKN>, opted, detail::ar_smem_bytes(BM, BN),
                               detail::kArThreads, grid, stream, p);
}

// The wgmma instance of BM × BN (ar_oneshot_wgmma.cuh): tensor maps of A (M × K_r, boxes of
// BM × 64) and W_r (kNK: N × K_r, boxes of BN × 64; kKN: K_r × N, boxes of 64 × 64), 128-byte
// swizzled, as the GEMM engine's (encode_b_map: a row-major rows × cols matrix in boxes of
// tile_n × 64, here A's too).
template <int BM, int BN, bool kKN>
cudaError_t launch_ar_wgmma(const detail::ArParams& p, int grid, cudaStream_t stream) {
  static std::atomic<uint64_t> opted{0};
  CUtensorMap ta{}, tb{};
  if (!detail::encode_b_map(&ta, p.A, p.M, p.K, p.K, false, BM)) return cudaErrorInvalidValue;
  const bool ok_b = kKN ? detail::encode_b_map(&tb, p.B, p.K, p.N, p.N, true, BN)
                        : detail::encode_b_map(&tb, p.B, p.N, p.K, p.K, false, BN);
  if (!ok_b) return cudaErrorInvalidValue;
  return launch_ar_cooperative(detail::ar_oneshot_wgmma_kernel<BM, BN, kKN>, opted, detail::ar_wg_smem_bytes(BM, BN),
                               detail::ar_wg_threads(BM), grid, stream, p, ta, tb);
}

// The instance for a tile of bm × bn (ar_tiles' values) and W_r's layout.
cudaError_t launch_ar_tile(int bm, int bn, bool kn, const detail::ArParams& p, int grid, cudaStream_t stream) {
  const auto wgmma = [&](auto bm_c) {
    constexpr int BM = decltype(bm_c)::value;
    if (bn == 64) return kn ? launch_ar_wgmma<BM, 64, true>(p, grid, stream) : launch_ar_wgmma<BM, 64, false>(p, grid, stream);
    return kn ? launch_ar_wgmma<BM, 128, true>(p, grid, stream) : launch_ar_wgmma<BM, 128, false>(p, grid, stream);
  };
  if (bm == 64) return wgmma(std::integral_constant<int, 64>{});
  if (bm == 128) return wgmma(std::integral_constant<int, 128>{});
  const auto by_bn = [&](auto bm_c) {
    constexpr int BM = decltype(bm_c)::value;
    if (bn == 32) return kn ? launch_ar_instance<BM, 32, true>(p, grid, stream) : launch_ar_instance<BM, 32, false>(p, grid, stream);
    if (bn == 64) return kn ? launch_ar_instance<BM, 64, true>(p, grid, stream) : launch_ar_instance<BM, 64, false>(p, grid, stream);
    return kn ? launch_ar_instance<BM, 128, true>(p, grid, stream) : launch_ar_instance<BM, 128, false>(p, grid, stream);
  };
  if (bm == 16) return by_bn(std::integral_constant<int, 16>{});
  return by_bn(std::integral_constant<int, 32>{});
}

// The one-shot kernel (arguments checked by the caller; W = 1 runs it too, pushing to itself).
cudaError_t launch_ar_one_shot(const CommDevice& dev, const GemmArArgs& a, cudaStream_t stream) {
  if (a.A == nullptr || a.B == nullptr || !aligned16(a.A) || !aligned16(a.B)) return cudaErrorInvalidValue;
  if (a.partials != RsPartials::kF32 && a.partials != RsPartials::kBF16 &&
      a.partials != RsPartials::kF32AnyOrder) {
    return cudaErrorInvalidValue;
  }
  const int W = dev.world;
  const ArTiles g = ar_tiles(a.M, a.N);
  if (!ar_one_shot_flags_fit(W, g)) return cudaErrorInvalidValue;
  const FusedWorkspace ws = ar_workspace(a, W, FusedAlgo::kOneShot);
  if (ws.data_bytes > dev.data_bytes || ws.scratch_bytes > dev.data_bytes) return cudaErrorInvalidValue;
  detail::ArParams p{};
  p.dev = dev;
  // The signature: the rank-uniform sizes, the slots' offset and tile height, and (dtype
  // field) the partials' precision, which sets the slots' layout.
  const bool bf16 = a.partials == RsPartials::kBF16;
  p.dev.launch_sig = comm_launch_signature(
      kFusedOpGemmAllReduce, bf16 ? 1u : 0u, static_cast<uint32_t>(FusedAlgo::kOneShot),
      comm_sig_hash(static_cast<uint64_t>(a.M), static_cast<uint64_t>(a.N),
                    comm_sig_hash(a.ws_offset, static_cast<uint64_t>(g.bm), static_cast<uint64_t>(g.bn))));
  p.A = a.A;
  p.B = a.B;
  p.C = a.C;
  p.ws_offset = a.ws_offset;
  p.slot_bytes = ar_slot_bytes(a, g);
  p.M = a.M;
  p.N = a.N;
  p.K = a.K;
  p.tiles_n = g.tiles_n;
  p.tiles = g.tiles;
  p.splits = ar_splits(dev, a, g);
  p.k_tiles = static_cast<int>(ceil_div(a.K, detail::ar_bk(g.bm, g.bn)));
  p.bf16_partials = bf16 ? 1 : 0;
  p.split_ws = p.splits > 1 ? reinterpret_cast<float*>(detail::scratch_of(dev)) : nullptr;
  const int grid = std::min(device_sms(dev), g.tiles * p.splits);
  return launch_ar_tile(g.bm, g.bn, a.b_layout == GemmLayoutB::kKN, p, grid, stream);
}
}  // namespace

FusedWorkspace gemm_all_reduce_workspace(const GemmArArgs& a, int world) {
  if (a.algo != FusedAlgo::kAuto) return ar_workspace(a, world, a.algo);
  const FusedWorkspace composed =
      larger(ar_workspace(a, world, FusedAlgo::kFused), ar_workspace(a, world, FusedAlgo::kDecomposed));
  // kAuto takes the one-shot kernel only where kArOneShotMaxM allows it.
  return a.M <= kArOneShotMaxM ? larger(composed, ar_workspace(a, world, FusedAlgo::kOneShot)) : composed;
}

FusedLaunchInfo gemm_all_reduce_info(const CommDevice& d, const GemmArArgs& a) {
  FusedLaunchInfo info{};
  info.algo = choose_ar(d, a);
  if (info.algo == FusedAlgo::kOneShot && valid_shape(a.M, a.N, a.K)) {
    const ArTiles g = ar_tiles(a.M, a.N);
    const int splits = ar_splits(d, a, g);
    info.gemm_ctas = std::min(device_sms(d), g.tiles * splits);
    info.tile_n = g.bn;
    info.chunks = g.tiles;
    info.k_splits = splits;
  } else if (info.algo == FusedAlgo::kFused) {
    GemmRsArgs rs = ar_rs_args(a);
    info = gemm_reduce_scatter_info(d, rs);
  }
  return info;
}

cudaError_t launch_gemm_all_reduce(const CommDevice& dev, const GemmArArgs& a, cudaStream_t stream) {
  if (!valid_device(dev) || !valid_shape(a.M, a.N, a.K) || a.C == nullptr || !aligned16(a.C) ||
      a.ws_offset % 16 != 0) {
    return cudaErrorInvalidValue;
  }
  const int W = dev.world;
  const FusedAlgo algo = choose_ar(dev, a);
  const FusedWorkspace ws = ar_workspace(a, W, algo);
  if (ws.data_bytes > dev.data_bytes || ws.scratch_bytes > dev.data_bytes) return cudaErrorInvalidValue;
  const int64_t count = static_cast<int64_t>(a.M) * a.N;
  if (algo == FusedAlgo::kOneShot) return launch_ar_one_shot(dev, a, stream);
  uint8_t* data = dev.base[dev.rank] + dev.data_offset;
  GemmArgs gm = base_gemm_args(a.M, a.N, a.K, a.A, a.B, a.b_layout);
  use_workspace(gm, a.gemm_ws);  // gm runs only on the W = 1 and decomposed paths
  if (W == 1) {                  // either path is the GEMM, rounded once
    gm.C = a.C;
    return launch_gemm(gm, stream);
  }
  if (algo == FusedAlgo::kFused) {
    if (a.M % W != 0) return cudaErrorInvalidValue;  // the allGather splits elements, not rows
    const uint64_t block = ar_block_offset(a, W);
    GemmRsArgs rs = ar_rs_args(a);
    rs.out = reinterpret_cast<__nv_bfloat16*>(data + block);
    if (cudaError_t e = launch_gemm_reduce_scatter(dev, rs, stream); e != cudaSuccess) return e;
    CollectiveArgs g;
    g.op = CommOp::kAllGather;
    g.dtype = CommDtype::kBF16;
    g.count = count;
    g.in_offset = block;
    g.output = a.C;
    return launch_collective(dev, g, stream);
  }
  if (algo != FusedAlgo::kDecomposed) return cudaErrorInvalidValue;
  const bool bf16 = a.partials == RsPartials::kBF16;
  if (!bf16 && (a.sums == nullptr || !aligned16(a.sums))) return cudaErrorInvalidValue;
  gm.C = data + a.ws_offset;
  gm.c_type = bf16 ? GemmOutType::kBF16 : GemmOutType::kF32;
  if (cudaError_t e = launch_gemm(gm, stream); e != cudaSuccess) return e;
  CollectiveArgs c;
  c.op = CommOp::kAllReduce;
  c.dtype = bf16 ? CommDtype::kBF16 : CommDtype::kF32;
  c.count = count;
  c.in_offset = a.ws_offset;
  c.output = bf16 ? static_cast<void*>(a.C) : static_cast<void*>(a.sums);
  if (cudaError_t e = launch_collective(dev, c, stream); e != cudaSuccess) return e;
  return bf16 ? cudaSuccess : launch_narrow_to_bf16(a.sums, a.C, count, stream);
}

}  // namespace fusedcomm::kernels
