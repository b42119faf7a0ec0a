// Host side of gemm_ar.h: gemmAllReduce as gemmReduceScatter's fused kernel then an allGather,
// or our GEMM then an allReduce (no kernel of its own).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/collectives/collectives.h"
#include "kernels/collectives/copy_segments.h"
#include "kernels/common/fused_choice.h"
#include "kernels/common/fused_launch.cuh"
#include "kernels/gemm/gemm.h"
#include "kernels/gemm_ar/gemm_ar.h"
#include "kernels/gemm_rs/gemm_rs.h"

namespace fusedcomm::kernels {
namespace {

using detail::aligned16;
using detail::base_gemm_args;
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
FusedWorkspace ar_workspace(const GemmArArgs& a, int world, FusedAlgo path) {
  const int W = std::max(1, world);
  const uint64_t M = static_cast<uint64_t>(std::max(0, a.M));
  const uint64_t N = static_cast<uint64_t>(std::max(0, a.N));
  if (W == 1) return {a.ws_offset, 0};  // the GEMM alone
  if (path == FusedAlgo::kFused) return {ar_block_offset(a, W) + (M + W - 1) / W * N * 2, 0};
  // The partial product at ws_offset; the allReduce's reduced slices in the scratch area.
  const uint64_t bytes = M * N * (a.partials == RsPartials::kBF16 ? 2 : 4);
  return {a.ws_offset + bytes, W > 1 ? bytes : 0};
}
// kAuto (fused_choice.h).
FusedAlgo choose_ar(const CommDevice& d, const GemmArArgs& a) {
  return choose_gemm_all_reduce(a.algo, d.world, a.M, a.N, a.partials == RsPartials::kBF16, [&] {
    GemmRsArgs rs = ar_rs_args(a);
    rs.algo = FusedAlgo::kAuto;
    const FusedWorkspace ws = ar_workspace(a, d.world, FusedAlgo::kFused);
    return gemm_reduce_scatter_info(d, rs).algo == FusedAlgo::kFused && ws.data_bytes <= d.data_bytes;
  });
}
}  // namespace

FusedWorkspace gemm_all_reduce_workspace(const GemmArArgs& a, int world) {
  if (a.algo != FusedAlgo::kAuto) return ar_workspace(a, world, a.algo);
  return larger(ar_workspace(a, world, FusedAlgo::kFused), ar_workspace(a, world, FusedAlgo::kDecomposed));
}

FusedLaunchInfo gemm_all_reduce_info(const CommDevice& d, const GemmArArgs& a) {
  FusedLaunchInfo info{};
  info.algo = choose_ar(d, a);
  if (info.algo == FusedAlgo::kFused) {
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
