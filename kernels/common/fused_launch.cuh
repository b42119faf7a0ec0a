// Host side shared by the fused launchers (ag_gemm.cu, gemm_rs.cu, gemm_ar.cu): argument
// checks, the GEMM arguments of an op, the padded-rows copies of the decomposed paths, and the
// cooperative launch of a fused kernel instance.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <utility>

#include "kernels/collectives/collectives.h"
#include "kernels/common/fused.h"
#include "kernels/common/fused_protocol.cuh"
#include "kernels/common/tuning.h"
#include "kernels/gemm/detail/gemm_sm90.cuh"
#include "kernels/gemm/gemm.h"
#include "kernels/proxy/proxy.h"

namespace fusedcomm::kernels::detail {

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
inline uint64_t round_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }
inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// The SMs the fused kernels take: CommDevice::sm_count, else the current device's.
inline int device_sms(const CommDevice& d) {
  if (d.sm_count > 0) return d.sm_count;
  int dev = 0, n = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return 132;
  if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) return 132;
  return n;
}

inline bool valid_device(const CommDevice& d) {
  if (d.world < 1 || d.world > kCommMaxRanks || d.rank < 0 || d.rank >= d.world) return false;
  for (int p = 0; p < d.world; ++p) {
    if (d.base[p] == nullptr) return false;
  }
  return d.error != nullptr;
}

// The GEMM contract's shapes (gemm.h).
inline bool valid_shape(int M, int N, int K) {
  return M >= 1 && N >= 8 && K >= 8 && N % 8 == 0 && K % 8 == 0;
}

inline uint8_t* scratch_of(const CommDevice& d) { return d.base[d.rank] + d.scratch_offset; }

// ---- the fused ops across hosts as one kernel (fused.h FusedHosts) ---------------------------
// 2..kProxyMaxHosts ranks, one per host, this rank the one on its own host.
inline bool valid_hosts(const FusedHosts& h) {
  return h.world >= 2 && h.world <= kProxyMaxHosts && h.rank >= 0 && h.rank < h.world && h.host >= 0 &&
         h.host < h.world && h.rank_of_host[h.host] == h.rank;
}
// The proxy collective's op, ranks and per-host blocks (kernels/proxy/proxy.h) over a row-major
// matrix of `rows` rows of `cols` elements of `esize` bytes at `base`, split over the op's ranks:
// host h's block is the rows of the rank on host h. No allToAll receive blocks.
inline void proxy_rank_blocks(ProxyCollective& px, uint32_t op, uint32_t dtype, const FusedHosts& hosts,
                              int64_t rows, int64_t cols, int64_t esize, void* base) {
  const int W = hosts.world;
  px.op = op;
  px.dtype = dtype;
  px.rank = hosts.host;
  px.hosts = W;
  for (int h = 0; h < kProxyMaxHosts; ++h) {
    const int q = h < W ? hosts.rank_of_host[h] : 0;
    px.counts[h] = h < W ? split_count(rows, W, q) * cols : 0;
    px.blocks[h] = h < W ? static_cast<uint8_t*>(base) + split_offset(rows, W, q) * cols * esize : nullptr;
    px.recv[h] = nullptr;
    px.recv_counts[h] = 0;
  }
}

inline FusedWorkspace larger(FusedWorkspace x, FusedWorkspace y) {
  return {std::max(x.data_bytes, y.data_bytes), std::max(x.scratch_bytes, y.scratch_bytes)};
}

// The fused kernels' raster group height (GemmArgs::group_m; tuning.h).
inline int fused_group_m(int world) {
  return world <= tuning::kFusedDefaultGroupMaxWorld ? 0 : tuning::kFusedGroupM;
}

// A dense row-major GEMM of the op's operands (C and its type left to the caller).
inline GemmArgs base_gemm_args(int M, int N, int K, const __nv_bfloat16* A, const __nv_bfloat16* B,
                               GemmLayoutB layout) {
  GemmArgs g;
  g.A = A;
  g.lda = K;
  g.B = B;
  g.ldb = layout == GemmLayoutB::kKN ? N : K;
  g.ldc = N;
  g.M = M;
  g.N = N;
  g.K = K;
  g.b_layout = layout;
  return g;
}

// Rows [0, W*ceil) of a "padded" layout (block p of ceil rows at p*ceil, rank p's
// split_count rows first in it) <-> the compact layout (rank p's rows at split_offset).
// Ranks p < M%W have ceil rows at the same offset in both: one copy; the rest one each.
inline cudaError_t copy_rows_layout(uint8_t* dst, const uint8_t* src, int64_t M, int W, int64_t row_bytes,
                                    bool to_padded, cudaStream_t stream) {
  const int64_t ceil_rows = ceil_div(M, W), rem = M % W;
  if (rem > 0) {
    if (cudaError_t e =
            cudaMemcpyAsync(dst, src, rem * ceil_rows * row_bytes, cudaMemcpyDeviceToDevice, stream);
        e != cudaSuccess) {
      return e;
    }
  }
  for (int p = static_cast<int>(rem); p < W; ++p) {
    const int64_t rows = split_count(M, W, p);
    if (rows == 0) continue;
    const int64_t padded = p * ceil_rows, compact = split_offset(M, W, p);
    const int64_t d = to_padded ? padded : compact, s = to_padded ? compact : padded;
    if (cudaError_t e = cudaMemcpyAsync(dst + d * row_bytes, src + s * row_bytes, rows * row_bytes,
                                        cudaMemcpyDeviceToDevice, stream);
        e != cudaSuccess) {
      return e;
    }
  }
  return cudaSuccess;
}

// Cooperative: the driver refuses a grid that cannot be resident at once (every CTA of the
// fused kernels waits for others) instead of letting it hang until a timeout.
template <typename... Exp, typename... Act>
cudaError_t launch_cooperative(void (*kernel)(Exp...), int grid, size_t smem, cudaStream_t stream,
                               Act&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(grid));
  cfg.blockDim = dim3(kGemmThreads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeCooperative;
  attr[0].val.cooperative = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Act>(args)...);
}

// One instance of a fused kernel (its tile width and B layout fixed): the shared-memory opt-in
// (once per device and kernel), then the cooperative launch with the GEMM plan's arguments
// followed by `extra` (the AG kernel's epilogue) and the op's parameters.
template <typename Kernel, typename... Extra>
cudaError_t launch_fused_instance(Kernel kernel, size_t smem, std::atomic<uint64_t>& opted,
                                  const GemmPlan& plan, int grid, cudaStream_t stream,
                                  const Extra&... extra) {
  if (cudaError_t e = gemm_opt_in_smem(reinterpret_cast<const void*>(kernel), smem, opted);
      e != cudaSuccess) {
    return e;
  }
  return launch_cooperative(kernel, grid, smem, stream, plan.ta, plan.tb, plan.tc, plan.prob, extra...);
}

}  // namespace fusedcomm::kernels::detail
