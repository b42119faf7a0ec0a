// gemmAllReduce: rank r holds A_r: M×K_r and W_r (as gemmReduceScatter); every rank gets the
// whole Σ_s A_s · op(W_s) : M×N, the same bits on every rank (kernels/common/fused.h: the
// contract every fused op keeps, the notation). No kernel of its own: two or three launches on
// the stream.
//
// Algorithms (FusedAlgo):
//   kFused: gemmReduceScatter's fused kernel (gemm_rs.h) writes this rank's row block of the sum
//     into its data area right after the reduce-scatter workspace (gemm_all_reduce_workspace),
//     then an allGather of those blocks fills C. The GEMM overlaps the reduce-scatter half of an
//     allReduce's traffic; only the gather's half is left after it. Needs W to divide M (the
//     allGather splits elements) and the fused reduce-scatter to fit.
//   kDecomposed: launch_gemm writes the partial product into the data area at ws_offset (bf16,
//     or fp32), then an allReduce of it: into C (bf16 partials: fp32 sums rounded once more), or
//     into `sums` (fp32) and one pass rounds them into C.
//   kAuto: kernels/common/fused_choice.h (choose_gemm_all_reduce), from M, N, W and the partials.
// Numerics as gemmReduceScatter (the fused kernel keeps the owner's own bf16-partials term in
// fp32), sums in rank order. Input lifetime and the protocol: those of the two ops it runs.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/collectives/collectives.h"
#include "kernels/common/fused.h"
#include "kernels/gemm/gemm.h"
#include "kernels/gemm_rs/gemm_rs.h"

namespace fusedcomm::kernels {

struct GemmArArgs {
  int M = 0;                         // rows of A_r and of C (same on every rank)
  int N = 0;                         // columns of C (same on every rank)
  int K = 0;                         // K_r: this rank's inner dimension (may differ by rank)
  const __nv_bfloat16* A = nullptr;  // M×K, this process's memory
  const __nv_bfloat16* B = nullptr;  // W_r: N×K (kNK) or K×N (kKN), this process's memory
  GemmLayoutB b_layout = GemmLayoutB::kNK;
  uint64_t ws_offset = 0;      // the workspace's byte offset in the data area (same on every rank)
  __nv_bfloat16* C = nullptr;  // M×N, this process's memory
  float* sums = nullptr;       // M×N fp32, this process's memory: kDecomposed with fp32 partials
  FusedAlgo algo = FusedAlgo::kAuto;
  // kF32AnyOrder: as kF32 (its fused path runs the reduce-scatter with rank-order partials).
  RsPartials partials = RsPartials::kF32;
  GemmWorkspace gemm_ws{};  // the GEMM of kDecomposed and of W = 1 (gemm_rs.h GemmRsArgs::gemm_ws)
};

// The data and scratch bytes of `args.algo` (kAuto: the larger of the two paths).
FusedWorkspace gemm_all_reduce_workspace(const GemmArArgs& args, int world);
// What a launch with these arguments would do (fused.h FusedLaunchInfo; kFused: its
// gemmReduceScatter's).
FusedLaunchInfo gemm_all_reduce_info(const CommDevice& dev, const GemmArArgs& args);
// Enqueue one op on `stream` (contract above). cudaErrorInvalidValue for bad arguments.
cudaError_t launch_gemm_all_reduce(const CommDevice& dev, const GemmArArgs& args, cudaStream_t stream);

}  // namespace fusedcomm::kernels
