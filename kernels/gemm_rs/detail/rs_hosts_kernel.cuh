// gemmReduceScatter across hosts as one kernel (gemm_rs.h launch_gemm_reduce_scatter_hosts; one
// rank per host): the GEMM writes this rank's partial product tile by tile while the proxy's
// lanes inside the same grid send each host its rows' partials as soon as their tiles are done
// and sum what the other hosts send for this rank's rows.
//
// Grid (one CTA per SM, all resident: cooperative launch), 384 threads per CTA:
//   [0, G)      the GEMM engine (gemm_sm90_body): the partial product P = A_r · op(W_r), M×N in
//               fp32 or bf16, into a buffer of this process, the other ranks' rows first (their
//               hosts wait for them), this rank's own last (two_part_raster, as on one host);
//               each tile's flag (FusedFlags::rs_tile[m * n_blocks + n] of this rank's own
//               memory) is raised with the launch's epoch once its stores are issued.
//   [G, G+P)    lane l of the proxy's reduceScatter (proxy_lane): host h's block is P's rows of
//               the rank on host h; chunk i of a block (elements [i * per, (i + 1) * per)) is
//               staged once every tile holding its rows is flagged (send_ready), and this
//               rank's own chunk j is summed with what the sources sent once its tiles are
//               flagged (receive_ready). The lanes end the launch with the GEMM's CTAs
//               (fused_finish_inline); they do not join the GEMM, which is done by the time
//               they are.
// The local symmetric memory `dev` (world 1) gives the epoch, the tile claims and the flags;
// nothing is read from or written to another GPU's memory: the proxy moves the bytes.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/common/fused_protocol.cuh"
#include "kernels/common/fused_schedule.cuh"
#include "kernels/gemm/detail/epilogue.cuh"
#include "kernels/gemm/detail/gemm_sm90.cuh"
#include "kernels/gemm_rs/detail/gemm_rs_kernel.cuh"
#include "kernels/proxy/detail/proxy_lane.cuh"

namespace fusedcomm::kernels::detail {

struct RsHostsParams {
  CommDevice dev;  // this rank's own symmetric memory (world 1)
  int M, N;
  int world, rank;     // the op's, one rank per host
  int n_blocks;        // tile columns
  int own_b0, own_nb;  // this rank's M-blocks (those holding any of its rows)
  int gemm_ctas;       // CTAs [0, gemm_ctas) run the GEMM, the rest are the lanes
  int rank_of_host[kCommMaxRanks];  // the proxy's block h is the rows of this rank
};

__device__ __forceinline__ uint64_t* rs_hosts_flag(const RsHostsParams& p, int m, int n) {
  return &fused_flags(p.dev, p.dev.rank)->rs_tile[static_cast<int64_t>(m) * p.n_blocks + n];
}

// The partials through registers into the buffer (DefaultEpilogue; no TMA stores: the flags
// order them), and each tile's flag raised with the launch's epoch (comm_epoch_slot: graph
// replays and back-to-back launches get fresh values), at gpu scope: the lanes of this kernel
// read it. Release: cumulative over the tile's stores, which the consumers' named barrier
// ordered before this thread's (gemm.h, hook 2).
struct RsHostsEpilogue : DefaultEpilogue {
  uint64_t* flags;  // rs_tile of the local memory
  __device__ __forceinline__ bool wants_tile_done() const { return true; }
  __device__ __forceinline__ void tile_done(TileCoord tc, const GemmProblem& p) const {
    st_release_gpu(flags + static_cast<int64_t>(tc.m) * p.n_blocks + tc.n, comm_epoch_slot());
  }
};

struct RsHostsSchedule : RsSweep<RsHostsParams> {
  __device__ __forceinline__ void consumers_done() const {
    named_barrier_sync(1, 256);
    if (threadIdx.x == 128) fused_finish(p->dev, epoch, kFusedOpGemmReduceScatter);
  }
};

// The lanes' ties to the GEMM: a chunk of a block is ready once every tile holding its rows is
// flagged (thread 0; bounded waits that record a timeout as the GEMM's own would).
struct RsHostsHooks {
  const RsHostsParams& p;
  const ProxyCollective& px;
  uint64_t epoch;
  int64_t per;  // elements per chunk
  static constexpr bool kAsyncReaders = false;
  __device__ bool chunk_ready(int h, int64_t i) const {
    const int64_t e0 = i * per, e1 = min(px.counts[h], e0 + per);
    if (e0 >= e1) return true;
    const int q = p.rank_of_host[h];
    const int64_t off = split_offset(p.M, p.world, q);
    const int m0 = static_cast<int>((off + e0 / p.N) / kTileM);
    const int m1 = static_cast<int>((off + (e1 + p.N - 1) / p.N - 1) / kTileM);
    for (int m = m0; m <= m1; ++m) {
      for (int n = 0; n < p.n_blocks; ++n) {
        const uint64_t* flag = rs_hosts_flag(p, m, n);
        if (ld_acquire_gpu(flag) >= epoch) continue;
        if (!fused_wait(p.dev, flag, epoch, kFusedOpGemmReduceScatter, kFusedStepPartial, p.rank, 1, true)) {
          return false;
        }
      }
    }
    return true;
  }
  __device__ bool send_ready(int64_t i) const {
    for (int h = 0; h < px.hosts; ++h) {
      if (h != px.rank && !chunk_ready(h, i)) return false;
    }
    return true;
  }
  __device__ bool receive_ready(int64_t j) const { return chunk_ready(px.rank, j); }
  __device__ void received(int64_t) const {}
};

template <typename T>
inline __device__ __noinline__ void rs_hosts_role(const RsHostsParams& p, const ProxyCollective& px,
                                                  uint64_t epoch, int lane) {
  RsHostsHooks hooks{p, px, epoch, static_cast<int64_t>(px.chunk_bytes / sizeof(T))};
  proxy_lane<T>(px, static_cast<uint32_t>(lane), hooks);
  __syncthreads();
  if (threadIdx.x == 0) fused_finish_inline(p.dev, epoch, kFusedOpGemmReduceScatter);
}

template <int BN, bool kBKN>
__global__ void __launch_bounds__(kGemmThreads, 1)
    rs_hosts_kernel(const __grid_constant__ CUtensorMap tm_a, const __grid_constant__ CUtensorMap tm_b,
                    const __grid_constant__ CUtensorMap tm_c, const __grid_constant__ GemmProblem prob,
                    const __grid_constant__ RsHostsEpilogue epi, const __grid_constant__ RsHostsParams p,
                    const __grid_constant__ ProxyCollective px) {
  const uint64_t epoch = comm_launch_epoch(p.dev);
  if (static_cast<int>(blockIdx.x) >= p.gemm_ctas) {
    const int lane = static_cast<int>(blockIdx.x) - p.gemm_ctas;
    if (px.dtype == kProxyF32) {
      rs_hosts_role<float>(p, px, epoch, lane);
    } else {
      rs_hosts_role<__nv_bfloat16>(p, px, epoch, lane);
    }
    return;
  }
  gemm_sm90_body<BN, kBKN>(tm_a, tm_b, tm_c, prob, epi, RsHostsSchedule{{{&p, epoch}}});
}

}  // namespace fusedcomm::kernels::detail
