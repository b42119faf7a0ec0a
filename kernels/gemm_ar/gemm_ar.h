// gemmAllReduce: rank r holds A_r: M×K_r and W_r (as gemmReduceScatter); every rank gets the
// whole Σ_s A_s · op(W_s) : M×N, the same bits on every rank (kernels/common/fused.h: the
// contract every fused op keeps, the notation).
//
// Algorithms (FusedAlgo):
//   kOneShot: one persistent kernel (detail/ar_oneshot_kernel.cuh), for small M (tensor-parallel
//     decode): tiles of this rank's product (mma.sync up to 32 rows, wgmma tiles of 64 or 128
//     rows above; split along K where the tiles are too few to fill the SMs), each finished tile stored into every rank's receive slot for this rank
//     and flagged there; every rank then sums the W partials of each tile in rank order and
//     rounds once. One launch, no pass over a partial product between two kernels. Any M
//     (its slots hold every rank's partial product: W × ~M×N partials in the data area; fp32
//     split partials in the scratch area).
//   kFused: gemmReduceScatter's fused kernel (gemm_rs.h) writes this rank's row block of the sum
//     into its data area right after the reduce-scatter workspace (gemm_all_reduce_workspace),
//     then an allGather of those blocks fills C. The GEMM overlaps the reduce-scatter half of an
//     allReduce's traffic; only the gather's half is left after it. Needs W to divide M (the
//     allGather splits elements) and the fused reduce-scatter to fit.
//   kDecomposed: launch_gemm writes the partial product into the data area at ws_offset (bf16,
//     or fp32), then an allReduce of it: into C (bf16 partials: fp32 sums rounded once more), or
//     into `sums` (fp32) and one pass rounds them into C.
//   kAuto: kernels/common/fused_choice.h (choose_gemm_all_reduce), from M, N, W and the partials.
// Numerics: sums in rank order, in fp32, rounded once. kOneShot: each rank's partial in fp32
// (bf16 partials: rounded to bf16 once, every rank's own included, so that every rank adds the
// same values); kFused as gemmReduceScatter (the owner's own bf16-partials term stays fp32).
// Input lifetime and the protocol: fused.h's, or those of the ops the composed paths run.
// kOneShot: its own start barrier, tile flags in FusedFlags::rs_tile and launch signature (op
// kFusedOpGemmAllReduce); it raises its done flag but, unlike fused.h's end barrier, does not
// wait for the peers': no peer reads this rank's memory, and a launch completes only after every
// peer's tiles of it arrived, so no rank runs more than one launch ahead all the same
// (detail/ar_oneshot_kernel.cuh, ar_end).
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
  // kF32AnyOrder: as kF32 (its fused path runs the reduce-scatter with rank-order partials; the
  // one-shot kernel always sums in rank order).
  RsPartials partials = RsPartials::kF32;
  GemmWorkspace gemm_ws{};  // the GEMM of kDecomposed and of W = 1 (gemm_rs.h GemmRsArgs::gemm_ws)
  // (kOneShot at W = 1 runs its kernel too, storing into its own slot.)
};

// The data and scratch bytes of `args.algo` (kAuto: the larger of the two paths).
FusedWorkspace gemm_all_reduce_workspace(const GemmArArgs& args, int world);
// What a launch with these arguments would do (fused.h FusedLaunchInfo; kFused: its
// gemmReduceScatter's).
FusedLaunchInfo gemm_all_reduce_info(const CommDevice& dev, const GemmArArgs& args);
// Enqueue one op on `stream` (contract above). cudaErrorInvalidValue for bad arguments.
cudaError_t launch_gemm_all_reduce(const CommDevice& dev, const GemmArArgs& args, cudaStream_t stream);

}  // namespace fusedcomm::kernels
