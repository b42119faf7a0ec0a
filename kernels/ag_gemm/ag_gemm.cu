// Host side of ag_gemm.h: argument checks, workspace sizes, the SM split, the chunk geometry
// of the fused kernel (detail/ag_gemm_kernel.cuh) and its launch, the copy-engine exchange on
// side streams, and the decomposed path (launch_collective + launch_gemm).
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "kernels/ag_gemm/ag_gemm.h"
#include "kernels/ag_gemm/detail/ag_gemm_kernel.cuh"
#include "kernels/ag_gemm/tuning.h"
#include "kernels/collectives/collectives.h"
#include "kernels/common/driver_entry.h"
#include "kernels/common/fused_choice.h"
#include "kernels/common/fused_launch.cuh"
#include "kernels/gemm/gemm.h"

namespace fusedcomm::kernels {
namespace {

using detail::AgParams;
using detail::aligned16;
using detail::base_gemm_args;
using detail::ceil_div;
using detail::copy_rows_layout;
using detail::device_sms;
using detail::fused_group_m;
using detail::round_up;
using detail::scratch_of;
using detail::proxy_rank_blocks;
using detail::split_count;
using detail::split_offset;
using detail::valid_device;
using detail::valid_hosts;
using detail::valid_shape;

// tuning.h's SM split table: the first row that fits.
template <size_t N>
int split_ctas(const tuning::AgSplitRow (&rows)[N], int world, int dim) {
  for (const tuning::AgSplitRow& row : rows) {
    if (world <= row.max_world && dim >= row.min_dim) return row.ctas;
  }
  return rows[N - 1].ctas;
}

FusedAlgo choose_ag(const CommDevice& d, const AgGemmArgs& a) {
  return choose_all_gather_gemm(a.algo, d.world, a.M, a.K);
}

// The gathered A's bytes (M rows of K bf16), which the size rules read.
int64_t ag_gathered_bytes(int M, int K) { return int64_t{M} * K * 2; }

// How the fused kernel's GEMM stores the own rows into the gathered A (AgParams::store_own):
// spread over every tile of an own M-block where the gathered A is large (tuning.h), else by the
// column-0 tile.
int ag_store_own(bool gathered, int world, int M, int K) {
  if (!gathered) return 0;
  const bool spread =
      world <= tuning::kAgSpreadStoresMaxWorld && ag_gathered_bytes(M, K) >= tuning::kAgSpreadStoresMinBytes;
  return spread ? detail::kAgStoreSpread : 1;
}

struct AgGeometry {
  int gemm_ctas, comm_ctas, m_block_start;
  AgParams p;
};

// Whether this rank's fused kernel moves the peers' rows with the copy engines.
bool ag_uses_ce(const CommDevice& d, const AgGemmArgs& a) {
  if (d.world < 2 || a.side == nullptr || a.exchange == AgExchange::kSmPulls) return false;
  if (a.exchange == AgExchange::kCopyEngines) return true;
  return a.side->usable() && d.world == 2 &&
         (a.N <= tuning::kAgCeMaxN || ag_gathered_bytes(a.M, a.K) >= tuning::kAgCeMinGatheredBytes);
}

// Fills everything but the device handle, pointers and tile width dependent parts.
AgGeometry ag_geometry(const CommDevice& d, const AgGemmArgs& a) {
  const int W = d.world, r = d.rank, sms = device_sms(d);
  AgGeometry g{};
  AgParams& p = g.p;
  p.M = a.M;
  p.K = a.K;
  p.world = W;
  p.rank = r;
  p.store_own = ag_store_own(a.gathered != nullptr, W, a.M, a.K);
  const int mb = static_cast<int>(ceil_div(a.M, detail::kTileM));
  p.mg = static_cast<int>(ceil_div(mb, kFusedMaxChunks));
  p.chunks = static_cast<int>(ceil_div(mb, p.mg));
  const int chunk_rows = p.mg * detail::kTileM;
  const int64_t chunk_bytes = static_cast<int64_t>(chunk_rows) * a.K * 2;
  int slices = static_cast<int>(std::clamp<int64_t>(chunk_bytes / tuning::kAgSliceBytes, 1, chunk_rows));
  p.slice_rows = static_cast<int>(ceil_div(chunk_rows, slices));
  p.slices = static_cast<int>(ceil_div(chunk_rows, p.slice_rows));
  // The GEMM starts at the first M-block made only of this rank's rows (no wait at all), else
  // at the block holding its first row.
  const int64_t off = split_offset(a.M, W, r), cnt = split_count(a.M, W, r);
  int sb = 0;
  if (cnt > 0) {
    const int64_t fb = ceil_div(off, detail::kTileM);
    const bool full = fb < mb && fb * detail::kTileM + detail::kTileM <= off + cnt;
    sb = static_cast<int>(full ? fb : off / detail::kTileM);
  }
  g.m_block_start = sb;
  p.c_start = sb / p.mg;
  // The M-blocks made only of this rank's rows (read from A_r directly: AgParams::tm_own).
  p.own_row0 = static_cast<int>(off);
  p.own_b0 = static_cast<int>(ceil_div(off, detail::kTileM));
  p.own_b1 = std::max(p.own_b0, static_cast<int>((off + cnt) / detail::kTileM));
  p.ce = ag_uses_ce(d, a) ? 1 : 0;
  // The peers' chunks in turn (detail::ag_sweep_chunk) where a chunk is one M-block and there
  // are two peers or more; by default with the copy engines only (their streams pull every
  // peer at once).
  const int interleave = a.interleave_peers >= 0 ? a.interleave_peers : p.ce;
  p.interleave = interleave > 0 && p.mg == 1 && W >= 3 ? W - 1 : 0;
  const int items = p.chunks * p.slices;
  int comm = a.comm_ctas > 0 ? a.comm_ctas : split_ctas(tuning::kAgSplit, W, a.N);
  comm = std::clamp(comm, 1, std::max(1, std::min(items, sms / 2)));
  if (p.ce) comm = 1;  // one CTA turns the side streams' progress into chunk flags
  g.comm_ctas = comm;
  g.gemm_ctas = std::max(1, sms - comm);
  return g;
}

// The copy-engine exchange (AgExchange::kCopyEngines; ag_gemm_kernel.cuh ag_ce_role): the
// steps of the side stream that pulls peer `from`'s rows, after the start barrier. One stream
// per peer (at W = 4 one stream pulling peer after peer moved about half the bytes per second
// of one stream per peer). Its positions are the chunks in the sweep's order
// (detail::ag_sweep_chunk; none made only of blocks read from A_r) that hold rows of `from`;
// their rows of `from` go into copies, and consecutive rows merge up to `copy_bytes`
// (tuning.h, kAgCeCopyBytes). A mark n follows the copy that holds the last rows of `from` in
// the chunk at position n (so every chunk at a position <= n then has them); the last step is
// the end mark, positions + 1. `position_rows`, if not null, gets each position's chunk rows
// [r0, r1) (for the test).
std::vector<AgCeStep> ag_ce_steps(const AgParams& p, int W, int r, int from, int64_t copy_bytes,
                                  std::vector<std::pair<int64_t, int64_t>>* position_rows) {
  std::vector<AgCeStep> steps;
  if (from < 0 || from >= W || from == r) return steps;
  const int64_t chunk_rows = int64_t{p.mg} * detail::kTileM;
  const int64_t row_bytes = static_cast<int64_t>(p.K) * 2;
  AgCeStep run{-1, 0, 0, 0};
  uint64_t pos = 0, marked = 0;
  auto flush = [&](uint64_t complete) {  // issue the run; positions <= complete are then done
    if (run.peer >= 0) steps.push_back(run);
    run.peer = -1;
    if (complete > marked) {
      steps.push_back({-1, 0, 0, complete});
      marked = complete;
    }
  };
  for (int k = 0; k < p.chunks; ++k) {
    const int c = detail::ag_sweep_chunk(p, k);
    if (detail::ag_chunk_is_own(p, c)) continue;  // the same chunks as ag_ce_role's
    int64_t a, b;
    detail::ag_chunk_rows_of(p, W, c, from, &a, &b);
    if (a >= b) continue;  // no rows of `from`: not a position of this stream
    ++pos;
    if (position_rows != nullptr) {
      position_rows->push_back({c * chunk_rows, std::min<int64_t>((c + 1) * chunk_rows, p.M)});
    }
    if (run.peer >= 0 && run.row1 == a && (b - run.row0) * row_bytes <= copy_bytes) {
      run.row1 = b;
      continue;
    }
    flush(pos - 1);  // the run holds every earlier position's remaining rows
    run = {from, a, b, 0};
  }
  flush(pos);
  steps.push_back({-1, 0, 0, pos + 1});  // the end mark
  return steps;
}

// ---- launch helpers -----------------------------------------------------------------------------
template <int BN, bool kBKN>
cudaError_t launch_ag_instance(const detail::GemmPlan& plan, const AgParams& p, const ProxyCollective& px,
                               cudaStream_t stream) {
  static std::atomic<uint64_t> opted{0};
  return detail::launch_fused_instance(
      detail::ag_gemm_kernel<BN, kBKN>,
      detail::GemmTileConfig<BN, detail::DefaultEpilogue::kStagingRounds>::kSmemBytes, opted, plan,
      p.gemm_ctas + p.comm_ctas, stream, plan.epi, p, px);
}

// The host-side plans' arguments (all_gather_gemm_sweep, all_gather_gemm_ce_plan): a valid
// shape on a rank of a valid world (no pointers, unlike ag_args_ok).
bool ag_plan_args_ok(const CommDevice& d, const AgGemmArgs& a) {
  return valid_shape(a.M, a.N, a.K) && d.world >= 1 && d.world <= kCommMaxRanks && d.rank >= 0 &&
         d.rank < d.world;
}

bool ag_args_ok(const CommDevice& d, const AgGemmArgs& a) {
  if (!valid_device(d) || !valid_shape(a.M, a.N, a.K)) return false;
  if (a.B == nullptr || a.C == nullptr || !aligned16(a.B) || !aligned16(a.C) || !aligned16(a.gathered) ||
      a.in_offset % 16 != 0) {
    return false;
  }
  if (a.exchange != AgExchange::kAuto && a.exchange != AgExchange::kSmPulls &&
      a.exchange != AgExchange::kCopyEngines) {
    return false;
  }
  // The copy engines need their streams (at W = 1 there is nothing to move).
  if (a.exchange == AgExchange::kCopyEngines && a.side == nullptr && d.world > 1) return false;
  const FusedWorkspace ws = all_gather_gemm_workspace(a, d.world);
  return ws.data_bytes <= d.data_bytes && ws.scratch_bytes <= d.data_bytes;
}

}  // namespace

// ---- workspace, info and plans ------------------------------------------------------------------
FusedWorkspace all_gather_gemm_workspace(const AgGemmArgs& a, int world) {
  const int W = std::max(1, world);
  const uint64_t row = static_cast<uint64_t>(std::max(0, a.K)) * 2;
  const uint64_t M = static_cast<uint64_t>(std::max(0, a.M));
  const uint64_t ceil_rows = (M + W - 1) / W;
  FusedWorkspace ws{};
  ws.data_bytes = a.in_offset + ceil_rows * row;
  // Gathered A in scratch when the caller gives none; the decomposed path with W not dividing
  // M gathers W blocks of ceil(M/W) rows after it and unpacks them.
  const uint64_t own = a.gathered == nullptr ? round_up(M * row, 256) : 0;
  ws.scratch_bytes = own + (M % W != 0 ? W * ceil_rows * row : 0);
  return ws;
}

FusedLaunchInfo all_gather_gemm_info(const CommDevice& d, const AgGemmArgs& a) {
  FusedLaunchInfo info{};
  info.algo = choose_ag(d, a);
  if (info.algo == FusedAlgo::kFused && valid_shape(a.M, a.N, a.K) && d.world >= 1) {
    const AgGeometry g = ag_geometry(d, a);
    info.gemm_ctas = g.gemm_ctas;
    info.comm_ctas = g.comm_ctas;
    info.chunks = g.p.chunks;
    info.copy_engines = g.p.ce;
    info.spread_stores = g.p.store_own == detail::kAgStoreSpread ? 1 : 0;
    info.tile_n = gemm_tile_grid(a.M, a.N, 0, g.gemm_ctas).tile_n;
  } else if (valid_shape(a.M, a.N, a.K)) {
    info.tile_n = gemm_tile_grid(a.M, a.N, 0, device_sms(d)).tile_n;
  }
  return info;
}

std::vector<int> all_gather_gemm_sweep(const CommDevice& d, const AgGemmArgs& a) {
  if (!ag_plan_args_ok(d, a)) return {};
  const AgParams p = ag_geometry(d, a).p;
  std::vector<int> order(p.chunks);
  for (int k = 0; k < p.chunks; ++k) order[k] = detail::ag_sweep_chunk(p, k);
  return order;
}

std::vector<AgCeStep> all_gather_gemm_ce_plan(const CommDevice& d, const AgGemmArgs& a, int from,
                                              int64_t copy_bytes,
                                              std::vector<std::pair<int64_t, int64_t>>* position_rows) {
  if (!ag_plan_args_ok(d, a)) return {};
  return ag_ce_steps(ag_geometry(d, a).p, d.world, d.rank, from, copy_bytes, position_rows);
}

// ---- the copy-engine exchange's side streams ----------------------------------------------------
FusedSideStreams::~FusedSideStreams() {
  // Called with the communicator's device current or not: stream and event destruction need
  // no current device, and a stream with queued copies is released once they are done.
  for (int i = 0; i + 1 < kCommMaxRanks; ++i) {
    if (joins_[i] != nullptr) cudaEventDestroy(joins_[i]);
    if (streams_[i] != nullptr) cudaStreamDestroy(streams_[i]);
  }
  if (fork_ != nullptr) cudaEventDestroy(fork_);
}

// The host half of ag_gemm_kernel.cuh ag_ce_role (which says why). The progress writes are stream
// memory operations, through the runtime's driver entry point (no link against libcuda).
cudaError_t FusedSideStreams::prepare(int world) {
  const cudaError_t e = make(world);
  failed_ = e != cudaSuccess;
  return e;
}

cudaError_t FusedSideStreams::make(int world) {
  int dev = 0;
  if (cudaError_t e = cudaGetDevice(&dev); e != cudaSuccess) return e;
  if (device_ >= 0 && device_ != dev) return cudaErrorInvalidDevice;
  device_ = dev;
  // Looked up before the kernels' launch: a kernel launched without its side streams would
  // wait for its chunks until the timeout.
  if (write_value_ == nullptr) {
    write_value_ = reinterpret_cast<void*>(
        detail::driver_entry<PFN_cuStreamWriteValue64_v11070>("cuStreamWriteValue64", 11070));
    if (write_value_ == nullptr) return cudaErrorNotSupported;
  }
  if (fork_ == nullptr && cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming) != cudaSuccess) {
    fork_ = nullptr;
    return cudaErrorMemoryAllocation;
  }
  for (int i = 0; i + 1 < world && i + 1 < kCommMaxRanks; ++i) {
    if (streams_[i] != nullptr) continue;
    if (cudaError_t e = cudaStreamCreateWithFlags(&streams_[i], cudaStreamNonBlocking); e != cudaSuccess) {
      streams_[i] = nullptr;
      return e;
    }
    if (cudaEventCreateWithFlags(&joins_[i], cudaEventDisableTiming) != cudaSuccess) {
      joins_[i] = nullptr;
      cudaStreamDestroy(streams_[i]);
      streams_[i] = nullptr;
      return cudaErrorMemoryAllocation;
    }
  }
  return cudaSuccess;
}

namespace {

// After the fused kernel's launch: on each peer's side stream, after side.fork (recorded on
// `stream` after ag_ce_barrier_kernel, before the fused kernel), the copies and progress marks
// of ag_ce_steps for that peer; then `stream` waits for every side stream.
cudaError_t ag_ce_exchange(const CommDevice& d, const AgParams& p, const FusedSideStreams& side,
                           cudaStream_t stream) {
  const auto write_value = reinterpret_cast<PFN_cuStreamWriteValue64_v11070>(side.write_value());
  const int W = d.world, r = d.rank;
  uint8_t* flags = d.base[r] + kFusedFlagsOffset;
  const int64_t row_bytes = static_cast<int64_t>(p.K) * 2;
  for (int i = 0; i + 1 < W; ++i) {
    const int from = (r + 1 + i) % W;
    cudaStream_t st = side.stream(i);
    if (cudaError_t e = cudaStreamWaitEvent(st, side.fork(), 0); e != cudaSuccess) return e;
    const auto progress =
        reinterpret_cast<CUdeviceptr>(flags + offsetof(FusedFlags, ce_progress) + i * sizeof(uint64_t));
    const int64_t off = split_offset(p.M, W, from);
    for (const AgCeStep& step : ag_ce_steps(p, W, r, from, tuning::kAgCeCopyBytes, nullptr)) {
      if (step.peer < 0) {
        if (write_value(reinterpret_cast<CUstream>(st), progress, step.progress,
                        CU_STREAM_WRITE_VALUE_DEFAULT) != CUDA_SUCCESS) {
          return cudaErrorUnknown;
        }
        continue;
      }
      const uint8_t* src = d.base[from] + d.data_offset + p.in_offset + (step.row0 - off) * row_bytes;
      uint8_t* dst = reinterpret_cast<uint8_t*>(p.gathered) + step.row0 * row_bytes;
      if (cudaError_t e =
              cudaMemcpyAsync(dst, src, (step.row1 - step.row0) * row_bytes, cudaMemcpyDeviceToDevice, st);
          e != cudaSuccess) {
        return e;
      }
    }
    if (cudaError_t e = cudaEventRecord(side.join(i), st); e != cudaSuccess) return e;
    if (cudaError_t e = cudaStreamWaitEvent(stream, side.join(i), 0); e != cudaSuccess) return e;
  }
  return cudaSuccess;
}
}  // namespace

// ---- launch -------------------------------------------------------------------------------------
namespace {

// The fused kernel, on one host (px null: d is the op's world) or across hosts (rank r of W, one
// per host; d is this rank's own symmetric memory and px the proxy's allGather of the rows).
// `own`: A_r, 16-byte aligned.
cudaError_t launch_ag_fused(const CommDevice& d, int W, int r, const AgGemmArgs& a, const uint8_t* own,
                            __nv_bfloat16* gathered, const ProxyCollective* px, cudaStream_t stream) {
  // The geometry is the op's: across hosts its world and rank, not those of `d` (world 1 there).
  CommDevice op_dev = d;
  op_dev.world = W;
  op_dev.rank = r;
  AgGeometry geo = ag_geometry(op_dev, a);
  if (px != nullptr) {  // the proxy's lanes exchange the rows (ag_gemm_kernel.cuh ag_hosts_role)
    geo.comm_ctas = static_cast<int>(proxy_active_lanes(*px));
    geo.gemm_ctas = std::max(1, device_sms(d) - geo.comm_ctas);
    geo.p.hosts = 1;
  }
  GemmArgs g = base_gemm_args(a.M, a.N, a.K, gathered, a.B, a.b_layout);
  g.C = a.C;
  g.num_ctas = geo.gemm_ctas;  // the tile width is chosen for the CTAs that start on the GEMM
  g.m_block_start = geo.m_block_start;
  g.cluster = 1;  // the fused kernel's GEMM CTAs claim tiles one by one (no CTA pairs)
  g.group_m = fused_group_m(W);
  detail::GemmPlan plan;
  if (cudaError_t e = detail::gemm_plan(g, &plan); e != cudaSuccess) return e;
  // The own rows: the GEMM reads the M-blocks made only of them from A_r itself (tm_own), and
  // when the caller asked for the gathered A it also stores them there from shared memory
  // (TMA, AgSchedule::stores_a). The rest of them (the blocks shared with a neighbour's rows)
  // go into the gathered buffer by the copy engine, stream-ordered before the kernel: copied
  // by pulling CTAs they took 0.3-1.7 ms on H200 once the GEMM's first tiles ran.
  AgParams& p = geo.p;
  const int64_t own_off = split_offset(a.M, W, r), own_cnt = split_count(a.M, W, r);
  const int64_t row_bytes = static_cast<int64_t>(a.K) * 2;
  if (p.own_b1 > p.own_b0 && !detail::encode_a_map(&p.tm_own, reinterpret_cast<const __nv_bfloat16*>(own),
                                                   static_cast<int>(own_cnt), a.K, a.K)) {
    return cudaErrorInvalidValue;
  }
  auto copy_own = [&](int64_t r0, int64_t r1) {  // gathered rows [r0, r1) from A_r
    if (r1 <= r0) return cudaSuccess;
    return cudaMemcpyAsync(reinterpret_cast<uint8_t*>(gathered) + r0 * row_bytes,
                           own + (r0 - own_off) * row_bytes, (r1 - r0) * row_bytes, cudaMemcpyDeviceToDevice,
                           stream);
  };
  const int64_t direct0 = int64_t{p.own_b0} * detail::kTileM;
  const int64_t direct1 = int64_t{p.own_b1} * detail::kTileM;
  const bool copy_all = p.own_b1 == p.own_b0;  // no block made only of own rows
  if (cudaError_t e = copy_own(own_off, copy_all ? own_off + own_cnt : direct0); e != cudaSuccess) {
    return e;
  }
  if (cudaError_t e = copy_own(copy_all ? own_off + own_cnt : direct1, own_off + own_cnt); e != cudaSuccess) {
    return e;
  }
  p.dev = d;
  p.gathered = gathered;
  p.in_offset = a.in_offset;
  p.gemm_ctas = std::min(geo.gemm_ctas, plan.prob.num_tiles);
  p.comm_ctas = geo.comm_ctas;
  if (p.ce) {
    // The start barrier as a kernel of its own, whose completion the side streams wait for
    // (ag_gemm_kernel.cuh ag_ce_role); the streams were prepared above.
    detail::ag_ce_barrier_kernel<<<1, 32, 0, stream>>>(d);
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
    if (cudaError_t e = cudaEventRecord(a.side->fork(), stream); e != cudaSuccess) return e;
  }
  const ProxyCollective exchange = px != nullptr ? *px : ProxyCollective{};
  cudaError_t launched;
  if (plan.tile_n == 256) {
    launched = plan.kn ? launch_ag_instance<256, true>(plan, p, exchange, stream)
                       : launch_ag_instance<256, false>(plan, p, exchange, stream);
  } else {
    launched = plan.kn ? launch_ag_instance<128, true>(plan, p, exchange, stream)
                       : launch_ag_instance<128, false>(plan, p, exchange, stream);
  }
  if (launched == cudaSuccess && p.ce) return ag_ce_exchange(d, p, *a.side, stream);
  return launched;
}

}  // namespace

bool all_gather_gemm_hosts_fits(const AgGemmArgs& args, int world, const ProxyCollective& px) {
  if (world < 2 || world > kProxyMaxHosts || !valid_shape(args.M, args.N, args.K)) return false;
  // Every block's chunks: the largest block is the first rank's (split_count).
  const uint64_t per = px.chunk_bytes / 2;
  const uint64_t most = static_cast<uint64_t>(split_count(args.M, world, 0)) * static_cast<uint64_t>(args.K);
  return per > 0 && (most + per - 1) / per <= static_cast<uint64_t>(kFusedMaxChunks);
}

cudaError_t launch_all_gather_gemm_hosts(const CommDevice& local, const FusedHosts& hosts, const void* own,
                                         const AgGemmArgs& args, ProxyCollective px, cudaStream_t stream) {
  const int W = hosts.world, r = hosts.rank;
  if (!valid_device(local) || local.world != 1 || !valid_hosts(hosts) ||
      !all_gather_gemm_hosts_fits(args, W, px) || args.B == nullptr || args.C == nullptr ||
      args.gathered == nullptr || own == nullptr || !aligned16(own) || !aligned16(args.B) ||
      !aligned16(args.C) || !aligned16(args.gathered) || px.lanes < 1 || px.lanes > kProxyMaxLanes) {
    return cudaErrorInvalidValue;
  }
  AgGemmArgs a = args;
  a.side = nullptr;
  a.exchange = AgExchange::kSmPulls;
  a.interleave_peers = 0;
  // The proxy's allGather of the rows: host h's block is its rank's rows of the gathered A, this
  // rank's own is A_r where it lies.
  proxy_rank_blocks(px, kProxyAllGather, kProxyBF16, hosts, a.M, a.K, 2, a.gathered);
  px.blocks[hosts.host] = const_cast<void*>(own);
  CommDevice d = local;
  d.launch_sig = comm_launch_signature(
      kFusedOpAllGatherGemm, static_cast<uint32_t>(CommDtype::kBF16), static_cast<uint32_t>(FusedAlgo::kFused),
      comm_sig_hash(static_cast<uint64_t>(a.M), static_cast<uint64_t>(a.K), static_cast<uint64_t>(W)));
  return launch_ag_fused(d, W, r, a, static_cast<const uint8_t*>(own), a.gathered, &px, stream);
}

cudaError_t launch_all_gather_gemm(const CommDevice& dev, const AgGemmArgs& args, cudaStream_t stream) {
  if (!ag_args_ok(dev, args)) return cudaErrorInvalidValue;
  const int W = dev.world;
  // The copy engines' streams and driver entry point, before anything is enqueued. Where they
  // cannot be had, kAuto falls back to the SM pulls (a rank-local choice); a forced exchange
  // returns the error.
  AgGemmArgs a = args;
  const FusedAlgo algo = choose_ag(dev, a);  // from sizes and world only: side plays no part
  if (algo == FusedAlgo::kFused && ag_uses_ce(dev, a)) {
    if (cudaError_t e = a.side->prepare(W); e != cudaSuccess) {
      if (a.exchange == AgExchange::kCopyEngines) return e;
      cudaGetLastError();
      a.side = nullptr;
    }
  }
  __nv_bfloat16* gathered =
      a.gathered != nullptr ? a.gathered : reinterpret_cast<__nv_bfloat16*>(scratch_of(dev));
  // Both paths carry the op's signature (its collective too): the rank-uniform M, K, offset.
  CommDevice d = dev;
  d.launch_sig = comm_launch_signature(
      kFusedOpAllGatherGemm, static_cast<uint32_t>(CommDtype::kBF16), static_cast<uint32_t>(algo),
      comm_sig_hash(static_cast<uint64_t>(a.M), static_cast<uint64_t>(a.K), a.in_offset));

  if (algo == FusedAlgo::kDecomposed && W == 1) {
    // Alone, the gathered A is A_r: the GEMM reads it in place, and it is copied out only when
    // asked for (no allGather launch, which would copy it anyway).
    const auto* own = reinterpret_cast<const __nv_bfloat16*>(d.base[0] + d.data_offset + a.in_offset);
    if (a.gathered != nullptr) {
      if (cudaError_t e = cudaMemcpyAsync(a.gathered, own, static_cast<size_t>(a.M) * a.K * 2,
                                          cudaMemcpyDeviceToDevice, stream);
          e != cudaSuccess) {
        return e;
      }
    }
    GemmArgs g = base_gemm_args(a.M, a.N, a.K, own, a.B, a.b_layout);
    g.C = a.C;
    use_workspace(g, a.gemm_ws);
    return launch_gemm(g, stream);
  }
  if (algo == FusedAlgo::kDecomposed) {
    const int64_t row_bytes = static_cast<int64_t>(a.K) * 2;
    CollectiveArgs c;
    c.op = CommOp::kAllGather;
    c.dtype = CommDtype::kBF16;
    c.in_offset = a.in_offset;
    if (a.M % W == 0) {
      c.count = static_cast<int64_t>(a.M) * a.K;
      c.output = gathered;
      if (cudaError_t e = launch_collective(d, c, stream); e != cudaSuccess) return e;
    } else {
      // The collective splits elements, not rows: move W blocks of ceil(M/W) rows, then unpack.
      const uint64_t own = static_cast<uint64_t>(a.M) * row_bytes;
      uint8_t* padded = scratch_of(d) + (a.gathered == nullptr ? round_up(own, 256) : 0);
      c.count = W * ceil_div(a.M, W) * a.K;
      c.output = padded;
      if (cudaError_t e = launch_collective(d, c, stream); e != cudaSuccess) return e;
      if (cudaError_t e = copy_rows_layout(reinterpret_cast<uint8_t*>(gathered), padded, a.M, W, row_bytes,
                                           false, stream);
          e != cudaSuccess) {
        return e;
      }
    }
    GemmArgs g = base_gemm_args(a.M, a.N, a.K, gathered, a.B, a.b_layout);
    g.C = a.C;
    use_workspace(g, a.gemm_ws);
    return launch_gemm(g, stream);
  }
  if (algo != FusedAlgo::kFused) return cudaErrorInvalidValue;
  return launch_ag_fused(d, d.world, d.rank, a, d.base[d.rank] + d.data_offset + a.in_offset, gathered, nullptr,
                         stream);
}

}  // namespace fusedcomm::kernels
