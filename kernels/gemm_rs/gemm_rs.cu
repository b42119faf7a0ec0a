// Host side of gemm_rs.h: argument checks, workspace sizes, the fused kernel's geometry
// (detail/gemm_rs_kernel.cuh) and its launch, and the decomposed path (launch_gemm +
// launch_collective).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>

#include "kernels/collectives/collectives.h"
#include "kernels/common/fused_choice.h"
#include "kernels/common/fused_launch.cuh"
#include "kernels/gemm/gemm.h"
#include "kernels/gemm_rs/detail/gemm_rs_kernel.cuh"
#include "kernels/gemm_rs/detail/rs_hosts_kernel.cuh"
#include "kernels/gemm_rs/gemm_rs.h"
#include "kernels/gemm_rs/tuning.h"

namespace fusedcomm::kernels {
namespace {

using detail::aligned16;
using detail::base_gemm_args;
using detail::ceil_div;
using detail::copy_rows_layout;
using detail::device_sms;
using detail::fused_group_m;
using detail::larger;
using detail::RsParams;
using detail::scratch_of;
using detail::proxy_rank_blocks;
using detail::split_count;
using detail::split_offset;
using detail::valid_device;
using detail::valid_hosts;
using detail::valid_shape;

// Bytes per element of the partial products.
int partial_bytes(const GemmRsArgs& a) { return a.partials == RsPartials::kBF16 ? 2 : 4; }
// Whether the fused kernel's sources add into one slot per owner (gemm_rs_kernel.cuh, "Receive
// slots"): any order allowed, from tuning.h's world.
bool rs_accumulates(int world, const GemmRsArgs& a) {
  return world >= tuning::kRsAccumulateMinWorld && a.partials == RsPartials::kF32AnyOrder;
}

// The pusher warps' pacing (RsParams::push_pace_ns; tuning.h says why and where).
uint32_t rs_push_pace_ns(const CommDevice& d, const GemmRsArgs& a, const RsParams& p) {
  if (d.world < 2 || !p.bf16_partials) return 0;
  const int64_t tiles = static_cast<int64_t>(ceil_div(a.M, detail::kTileM)) * p.n_blocks;
  if (tiles < tuning::kRsPushPaceMinWaves * static_cast<int64_t>(device_sms(d))) return 0;
  const double tile_ns = static_cast<double>(p.tile_n) * a.K / tuning::kRsTileKPerNs;
  const int chunks = p.tile_n / 16;  // 2 KiB pieces of a 64-row bf16 half-tile
  return static_cast<uint32_t>(tile_ns * tuning::kRsPushSpreadPct / 100.0 / chunks);
}

// The fused kernel's geometry (detail/gemm_rs_kernel.cuh), all but the device
// handle, pointers and tensor maps. The tile width comes from M, N and the SM count only (never
// K_r): every rank must sweep the same tile grid, since flags are per half-tile and tile column
// (the width is part of the launch signature, so a rank that differs fails the launch).
RsParams rs_geometry(const CommDevice& d, const GemmRsArgs& a) {
  const int W = d.world, r = d.rank;
  RsParams p{};
  p.M = a.M;
  p.N = a.N;
  const GemmTileGrid tg = gemm_tile_grid(a.M, a.N, 0, device_sms(d));
  p.n_blocks = tg.n_blocks;
  p.tile_n = tg.tile_n;
  const int64_t ceil_rows = ceil_div(a.M, W);
  p.slot_elems = static_cast<uint64_t>(ceil_rows + kFusedRsSlotPadRows) * static_cast<uint64_t>(a.N);
  p.halves = static_cast<int>(ceil_div(ceil_rows, 64)) + 1;
  const int64_t off = split_offset(a.M, W, r), cnt = split_count(a.M, W, r);
  p.own_b0 = cnt > 0 ? static_cast<int>(off / detail::kTileM) : 0;
  p.own_nb = cnt > 0 ? static_cast<int>((off + cnt - 1) / detail::kTileM) - p.own_b0 + 1 : 0;
  p.bf16_partials = a.partials == RsPartials::kBF16 ? 1 : 0;
  p.accumulate = rs_accumulates(W, a) ? 1 : 0;
  // One received slot of bf16 partials, which the staging buffer holds: gemm_rs_kernel.cuh,
  // "Early fetch".
  p.prefetch = W == tuning::kRsPrefetchWorld && p.bf16_partials && cnt > 0 ? 1 : 0;
  p.push_pace_ns = rs_push_pace_ns(d, a, p);
  return p;
}

// Half-tile flags per owner that the fused kernel needs (FusedFlags::rs_tile).
int64_t rs_flags_needed(const CommDevice& d, const RsParams& p) {
  return int64_t{d.world - 1} * p.halves * p.n_blocks;
}
bool rs_fused_fits(const CommDevice& d, const RsParams& p) {
  return rs_flags_needed(d, p) <= kFusedRsTileFlags;
}

FusedAlgo choose_rs(const CommDevice& d, const GemmRsArgs& a, const RsParams& p) {
  return choose_gemm_reduce_scatter(a.algo, d.world, a.M, a.N, [&] { return rs_fused_fits(d, p); });
}

// ---- launch helpers -----------------------------------------------------------------------------
template <int BN, bool kBKN>
cudaError_t launch_rs_instance(const detail::GemmPlan& plan, const RsParams& p, int grid,
                               cudaStream_t stream) {
  static std::atomic<uint64_t> opted{0};
  return detail::launch_fused_instance(
      detail::rs_gemm_kernel<BN, kBKN>,
      detail::GemmTileConfig<BN, detail::RsEpilogue::kStagingRounds>::kSmemBytes, opted, plan, grid, stream,
      p);
}

bool rs_args_ok(const CommDevice& d, const GemmRsArgs& a) {
  if (!valid_device(d) || !valid_shape(a.M, a.N, a.K)) return false;
  if (a.A == nullptr || a.B == nullptr || !aligned16(a.A) || !aligned16(a.B) || !aligned16(a.out) ||
      a.ws_offset % 16 != 0) {
    return false;
  }
  if (a.partials != RsPartials::kF32 && a.partials != RsPartials::kBF16 &&
      a.partials != RsPartials::kF32AnyOrder) {
    return false;
  }
  if (a.out == nullptr && split_count(a.M, d.world, d.rank) > 0) return false;
  // (A forced fused launch whose half-tile flags would not fit FusedFlags is refused by the
  // launch, which has the geometry; kAuto picks the decomposed path there.)
  const FusedWorkspace ws = gemm_reduce_scatter_workspace(a, d.world);
  return ws.data_bytes <= d.data_bytes && ws.scratch_bytes <= d.data_bytes;
}

}  // namespace

// ---- workspace and info -------------------------------------------------------------------------
namespace detail {
// Decomposed: W blocks of ceil(M/W) rows in the data area; with W not dividing M, the compact
// partial before it is padded, then the reduce-scatter output block (ceil(M/W) rows) before its
// real rows are copied out, in the scratch area. Fused: W-1 padded receive slots, or one where
// the sources add into it (rs_accumulates).
FusedWorkspace rs_workspace(const GemmRsArgs& a, int world, FusedAlgo path) {
  const int W = std::max(1, world);
  const uint64_t row = static_cast<uint64_t>(std::max(0, a.N)) * partial_bytes(a);
  const uint64_t M = static_cast<uint64_t>(std::max(0, a.M));
  const uint64_t ceil_rows = (M + W - 1) / W;
  if (path == FusedAlgo::kFused) {
    const uint64_t nslots = rs_accumulates(W, a) ? 1 : W - 1;
    const uint64_t slots = W > 1 ? nslots * (ceil_rows + kFusedRsSlotPadRows) : 0;
    return {a.ws_offset + slots * row, 0};
  }
  return {a.ws_offset + W * ceil_rows * row, (M % W != 0 ? M : ceil_rows) * row};
}
}  // namespace detail

FusedWorkspace gemm_reduce_scatter_workspace(const GemmRsArgs& a, int world) {
  return larger(detail::rs_workspace(a, world, FusedAlgo::kFused),
                detail::rs_workspace(a, world, FusedAlgo::kDecomposed));
}

FusedLaunchInfo gemm_reduce_scatter_info(const CommDevice& d, const GemmRsArgs& a) {
  FusedLaunchInfo info{};
  if (!valid_shape(a.M, a.N, a.K) || d.world < 1) {
    info.algo = a.algo == FusedAlgo::kAuto ? FusedAlgo::kDecomposed : a.algo;
    return info;
  }
  const RsParams p = rs_geometry(d, a);
  info.algo = choose_rs(d, a, p);
  info.tile_n = p.tile_n;
  if (info.algo == FusedAlgo::kFused) {
    // As the launch: every CTA runs the GEMM, never more than the tiles.
    const int64_t tiles = ceil_div(a.M, detail::kTileM) * p.n_blocks;
    info.gemm_ctas = static_cast<int>(std::min<int64_t>(device_sms(d), tiles));
    info.comm_ctas = 0;
    info.chunks = static_cast<int>(rs_flags_needed(d, p));
    info.push_pace_ns = p.push_pace_ns;
  }
  return info;
}

// ---- launch -------------------------------------------------------------------------------------
cudaError_t launch_gemm_reduce_scatter(const CommDevice& dev, const GemmRsArgs& a, cudaStream_t stream) {
  if (!rs_args_ok(dev, a)) return cudaErrorInvalidValue;
  RsParams p = rs_geometry(dev, a);
  if (a.algo == FusedAlgo::kFused && !rs_fused_fits(dev, p)) return cudaErrorInvalidValue;
  const FusedAlgo algo = choose_rs(dev, a, p);
  // Both paths carry the op's signature (its collective too): the rank-uniform M, N, offset,
  // and in its dtype field the partials' code (RsPartials: ranks that disagree on the order
  // would store and add into different slots); the fused kernel's also its tile width (its
  // flags are per tile column: ranks with different widths must fail, not wait).
  const bool bf16 = a.partials == RsPartials::kBF16;
  const uint64_t shape = algo == FusedAlgo::kFused
                             ? comm_sig_hash(a.ws_offset, static_cast<uint64_t>(p.tile_n), 0)
                             : a.ws_offset;
  CommDevice d = dev;
  d.launch_sig = comm_launch_signature(
      kFusedOpGemmReduceScatter, static_cast<uint32_t>(a.partials), static_cast<uint32_t>(algo),
      comm_sig_hash(static_cast<uint64_t>(a.M), static_cast<uint64_t>(a.N), shape));
  const int W = d.world, r = d.rank;
  uint8_t* ws = d.base[r] + d.data_offset + a.ws_offset;

  if (algo == FusedAlgo::kDecomposed && W == 1) {
    // Alone, the reduceScatter would copy the partials: the GEMM writes the output itself,
    // rounded once from its fp32 accumulators, the numerics of either partial precision at W = 1
    // (as gemmAllReduce at W = 1).
    GemmArgs g = base_gemm_args(a.M, a.N, a.K, a.A, a.B, a.b_layout);
    g.C = a.out;
    g.c_type = GemmOutType::kBF16;
    use_workspace(g, a.gemm_ws);
    return launch_gemm(g, stream);
  }
  if (algo == FusedAlgo::kDecomposed) {
    const int64_t row_bytes = static_cast<int64_t>(a.N) * partial_bytes(a);
    const bool even = a.M % W == 0;
    uint8_t* scratch = scratch_of(d);
    GemmArgs g = base_gemm_args(a.M, a.N, a.K, a.A, a.B, a.b_layout);
    g.C = even ? ws : scratch;
    g.c_type = bf16 ? GemmOutType::kBF16 : GemmOutType::kF32;
    use_workspace(g, a.gemm_ws);
    if (cudaError_t e = launch_gemm(g, stream); e != cudaSuccess) return e;
    if (!even) {
      // The collective splits elements, not rows: W blocks of ceil(M/W) rows (pad rows unused).
      if (cudaError_t e = copy_rows_layout(ws, scratch, a.M, W, row_bytes, true, stream); e != cudaSuccess) {
        return e;
      }
    }
    // fp32 partials: the sums are rounded to bf16 by the collective itself (out_bf16); bf16
    // partials: a bf16 reduceScatter (fp32 sums, rounded once). Its block holds ceil(M/W) rows;
    // with W dividing M that is exactly this rank's output, else the block goes to the scratch
    // area and its first split_count rows (the real ones) are copied out.
    CollectiveArgs c;
    c.op = CommOp::kReduceScatter;
    c.dtype = bf16 ? CommDtype::kBF16 : CommDtype::kF32;
    c.out_bf16 = !bf16;
    c.count = W * ceil_div(a.M, W) * a.N;
    c.in_offset = a.ws_offset;
    c.output = even ? static_cast<void*>(a.out) : static_cast<void*>(scratch);
    if (cudaError_t e = launch_collective(d, c, stream); e != cudaSuccess) return e;
    if (even) return cudaSuccess;
    return cudaMemcpyAsync(a.out, scratch, split_count(a.M, W, r) * a.N * 2, cudaMemcpyDeviceToDevice,
                           stream);
  }
  if (algo != FusedAlgo::kFused) return cudaErrorInvalidValue;

  GemmArgs g = base_gemm_args(a.M, a.N, a.K, a.A, a.B, a.b_layout);
  g.C = ws;  // checked as C; the kernel's epilogue (RsEpilogue) writes the receive slots
  g.c_type = bf16 ? GemmOutType::kBF16 : GemmOutType::kF32;
  g.tile_n = p.tile_n;  // shared by every rank (rs_geometry)
  g.cluster = 1;        // dynamic claims, no CTA pairs
  g.group_m = fused_group_m(W);
  detail::GemmPlan plan;
  if (cudaError_t e = detail::gemm_plan(g, &plan); e != cudaSuccess) return e;
  plan.prob.c_tma = 0;  // RsEpilogue stores every half-tile itself (kOwnsTile)
  // Tensor maps: each peer owner's receive slot for this rank (padding + its rows, × N
  // partials; RsParams::tm_push: encoded, so checked, though the pusher warps store through
  // plain addresses), and this rank's output rows.
  const int64_t slot = static_cast<int64_t>(p.slot_elems) * partial_bytes(a);
  for (int o = 0; o < W; ++o) {
    const int64_t rows = split_count(a.M, W, o);
    if (o == r || rows == 0) continue;
    const int64_t slot_index = p.accumulate ? 0 : (r < o ? r : r - 1);
    uint8_t* base = d.base[o] + d.data_offset + a.ws_offset + slot_index * slot;
    if (!detail::encode_store_map(&p.tm_push[o], base, static_cast<int>(rows) + kFusedRsSlotPadRows, a.N, a.N,
                                  !bf16)) {
      return cudaErrorInvalidValue;
    }
  }
  const int64_t own_rows = split_count(a.M, W, r);
  if (own_rows > 0 &&
      !detail::encode_store_map(&p.tm_out, a.out, static_cast<int>(own_rows), a.N, a.N, false)) {
    return cudaErrorInvalidValue;
  }
  // This rank's one receive slot, for the early fetches of its own half-tiles.
  if (p.prefetch && !detail::encode_store_map(
                        &p.tm_recv, ws, static_cast<int>(own_rows) + kFusedRsSlotPadRows, a.N, a.N, false)) {
    return cudaErrorInvalidValue;
  }
  p.dev = d;
  p.out = a.out;
  p.ws_offset = a.ws_offset;
  if (p.accumulate && own_rows > 0) {
    // The peers add into this rank's rows of its slot: zero them first (stream order puts this
    // before the kernel's start barrier; the padding rows are never read).
    uint8_t* rows = ws + static_cast<uint64_t>(kFusedRsSlotPadRows) * a.N * partial_bytes(a);
    if (cudaError_t e = cudaMemsetAsync(rows, 0, own_rows * a.N * partial_bytes(a), stream);
        e != cudaSuccess) {
      return e;
    }
  }
  const int grid = std::min(device_sms(d), plan.prob.num_tiles);
  if (plan.tile_n == 256) {
    return plan.kn ? launch_rs_instance<256, true>(plan, p, grid, stream)
                   : launch_rs_instance<256, false>(plan, p, grid, stream);
  }
  return plan.kn ? launch_rs_instance<128, true>(plan, p, grid, stream)
                 : launch_rs_instance<128, false>(plan, p, grid, stream);
}

// ---- across hosts as one kernel -----------------------------------------------------------------
namespace {

template <int BN, bool kBKN>
cudaError_t launch_rs_hosts_instance(const detail::GemmPlan& plan, const detail::RsHostsEpilogue& epi,
                                     const detail::RsHostsParams& p, const ProxyCollective& px, int grid,
                                     cudaStream_t stream) {
  static std::atomic<uint64_t> opted{0};
  return detail::launch_fused_instance(
      detail::rs_hosts_kernel<BN, kBKN>,
      detail::GemmTileConfig<BN, detail::DefaultEpilogue::kStagingRounds>::kSmemBytes, opted, plan, grid, stream,
      epi, p, px);
}

}  // namespace

bool gemm_reduce_scatter_hosts_fits(const GemmRsArgs& a, int world) {
  if (world < 2 || world > kProxyMaxHosts || !valid_shape(a.M, a.N, a.K) || a.N % 8 != 0) return false;
  // The tile flags at the narrowest tiles the plan may take.
  return ceil_div(a.M, detail::kTileM) * ceil_div(a.N, 128) <= kFusedRsTileFlags;
}

cudaError_t launch_gemm_reduce_scatter_hosts(const CommDevice& local, const FusedHosts& hosts,
                                             const GemmRsArgs& a, void* partial, void* sums, ProxyCollective px,
                                             cudaStream_t stream) {
  const int W = hosts.world, r = hosts.rank;
  const int64_t own_rows = r >= 0 && r < W ? split_count(a.M, W, r) : 0;
  if (!valid_device(local) || local.world != 1 || !valid_hosts(hosts) ||
      !gemm_reduce_scatter_hosts_fits(a, W) || a.A == nullptr || a.B == nullptr || partial == nullptr ||
      (sums == nullptr && own_rows > 0) || !aligned16(a.A) || !aligned16(a.B) || !aligned16(partial) ||
      !aligned16(sums) || px.lanes < 1 || px.lanes > kProxyMaxLanes) {
    return cudaErrorInvalidValue;
  }
  const bool bf16 = a.partials == RsPartials::kBF16;
  const int64_t esize = bf16 ? 2 : 4;
  // Host h's block: the partials of its rank's rows; this rank's sums go to `sums`.
  proxy_rank_blocks(px, kProxyReduceScatter, bf16 ? kProxyBF16 : kProxyF32, hosts, a.M, a.N, esize,
                    partial);
  px.out = sums;
  const int lanes = static_cast<int>(proxy_active_lanes(px));
  CommDevice d = local;
  d.launch_sig = comm_launch_signature(
      kFusedOpGemmReduceScatter, static_cast<uint32_t>(a.partials), static_cast<uint32_t>(FusedAlgo::kFused),
      comm_sig_hash(static_cast<uint64_t>(a.M), static_cast<uint64_t>(a.N), static_cast<uint64_t>(W)));
  auto* flags = reinterpret_cast<uint64_t*>(d.base[d.rank] + kFusedFlagsOffset + offsetof(FusedFlags, rs_tile));
  GemmArgs g = base_gemm_args(a.M, a.N, a.K, a.A, a.B, a.b_layout);
  g.C = partial;
  g.c_type = bf16 ? GemmOutType::kBF16 : GemmOutType::kF32;
  g.num_ctas = std::max(1, device_sms(d) - lanes);
  g.cluster = 1;  // dynamic claims, no CTA pairs
  g.group_m = fused_group_m(W);
  g.sink.tile_flags = flags;  // stores from registers, ordered by the tile flags (gemm.h hook 2)
  detail::GemmPlan plan;
  if (cudaError_t e = detail::gemm_plan(g, &plan); e != cudaSuccess) return e;
  if (static_cast<int64_t>(plan.prob.num_tiles) > kFusedRsTileFlags) return cudaErrorInvalidValue;
  detail::RsHostsParams p{};
  p.dev = d;
  p.M = a.M;
  p.N = a.N;
  p.world = W;
  p.rank = r;
  p.n_blocks = plan.prob.n_blocks;
  const int64_t off = split_offset(a.M, W, r);
  p.own_b0 = own_rows > 0 ? static_cast<int>(off / detail::kTileM) : 0;
  p.own_nb = own_rows > 0 ? static_cast<int>((off + own_rows - 1) / detail::kTileM) - p.own_b0 + 1 : 0;
  p.gemm_ctas = std::min(g.num_ctas, plan.prob.num_tiles);
  for (int h = 0; h < W; ++h) p.rank_of_host[h] = hosts.rank_of_host[h];
  detail::RsHostsEpilogue epi{plan.epi, flags};
  const int grid = p.gemm_ctas + lanes;
  if (plan.tile_n == 256) {
    return plan.kn ? launch_rs_hosts_instance<256, true>(plan, epi, p, px, grid, stream)
                   : launch_rs_hosts_instance<256, false>(plan, epi, p, px, grid, stream);
  }
  return plan.kn ? launch_rs_hosts_instance<128, true>(plan, epi, p, px, grid, stream)
                 : launch_rs_hosts_instance<128, false>(plan, epi, p, px, grid, stream);
}

}  // namespace fusedcomm::kernels
