// gemmReduceScatter: rank r holds A_r: M×K_r and W_r; it gets rows block r of
//   Σ_s A_s · op(W_s) : split_count(M,W,r)×N
// in one launch (kernels/common/fused.h: the contract every fused op keeps, the protocol, the
// notation). M and N are the same on every rank (rank-uniform); K_r may differ by rank.
//
// Numerics: the W partial products are summed in fp32 and rounded once to bf16; the partials are
// kept (and cross NVLink) in fp32 by default (the host backend's rule: the sum is rounded once),
// or in bf16 with RsPartials::kBF16 (half the bytes in the workspace and over NVLink; each
// partial is rounded once more, as in cuBLAS + NCCL and PyTorch's symmetric-memory op). The sum
// is in rank order 0..W-1, so the result is the same on every run and for both algorithms,
// unless the caller allows any order (RsPartials::kF32AnyOrder): then the fused kernel at W >= 3
// lets the peers add their partials into the owner's memory as they arrive (TMA reduce-add), so
// the fp32 sum's order, and rarely the bf16 result's last bit, can change from run to run.
//
// Algorithms (FusedAlgo):
//   kFused: one persistent kernel (detail/gemm_rs_kernel.cuh). Every CTA runs the GEMM (one per
//     SM). A 64-row half-tile of rows that another rank o owns is PUSHED as soon as it is
//     computed: staged in shared memory and stored over NVLink into o's receive slot for this
//     rank (o's data area at ws_offset) by the warpgroup's pusher warp, then flagged in o's
//     region once the stores are complete. A half-tile of the rank's own rows is reduced in the
//     epilogue: it waits for the W-1 peers' flags of that half-tile, adds their partials (local
//     loads) and its accumulator in rank order and stores the bf16 sums once. Each rank sweeps
//     the tiles of other ranks' rows first (starting with rank r+1's), its own last, so its
//     peers pushed those long before. No partial product is stored where it is computed, and
//     no reduction pass follows the GEMM.
//   kDecomposed: launch_gemm then launch_collective, stream-ordered: the GEMM in fp32 to the
//     data area, then a reduceScatter of the fp32 partials that writes the bf16-rounded sums
//     (CollectiveArgs::out_bf16); with bf16 partials, the GEMM in bf16 then a bf16
//     reduceScatter, which sums in fp32 too. When W does not divide M the collective moves W
//     equal blocks of ceil(M/W) rows (its element split would cut rows), plus one copy to pack
//     or unpack the padded layout. At W = 1 there is nothing to exchange: launch_gemm alone
//     writes the bf16 output (either partial precision reads the same there: fp32 accumulators
//     rounded once).
//   kAuto: kernels/common/fused_choice.h (choose_gemm_reduce_scatter), from M, N and W only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/collectives/collectives.h"
#include "kernels/common/fused.h"
#include "kernels/gemm/gemm.h"
#include "kernels/proxy/proxy.h"

namespace fusedcomm::kernels {

// The partial products: their precision in the workspace and over NVLink. The sum is fp32
// either way. kBF16 adds at most 2^-9 · Σ_s |partial_s| per output element to the error (one
// rounding per partial), and halves the exchanged bytes. kF32AnyOrder: fp32 partials whose sum
// may be taken in any order (the fused kernel at W >= 3 lets the peers add into the owner's
// memory as they arrive: one slot to read instead of W-1); the result may then differ in the
// last bits from run to run. Elsewhere it is kF32. Part of the launch signature (its dtype
// field): ranks that disagree fail the launch.
enum class RsPartials : uint32_t { kF32 = 0, kBF16 = 1, kF32AnyOrder = 2 };

// The fused kernel: each receive slot starts with this many rows of padding, so that a
// half-tile that begins before the owner's first row is still one TMA box at a row coordinate
// >= 0 (its rows of the previous owner land in the padding, which nobody reads).
inline constexpr int kFusedRsSlotPadRows = 64;

struct GemmRsArgs {
  int M = 0;                         // rows of every partial product (same on every rank)
  int N = 0;                         // columns of the partial products and of the output (same on every rank)
  int K = 0;                         // K_r: this rank's inner dimension (may differ by rank)
  const __nv_bfloat16* A = nullptr;  // M×K, this process's memory
  const __nv_bfloat16* B = nullptr;  // W_r: N×K (kNK) or K×N (kKN), this process's memory
  GemmLayoutB b_layout = GemmLayoutB::kNK;
  // Workspace at this byte offset of the data area, the same offset on every rank (size:
  // gemm_reduce_scatter_workspace). Decomposed: this rank's partial product (M×N; W*ceil(M/W) ×
  // N when W does not divide M), which peers read. Fused: W-1 receive slots of
  // kFusedRsSlotPadRows + ceil(M/W) rows, where peers write their partials of this rank's rows
  // (W >= 3 with kF32AnyOrder: one such slot, which they add into).
  uint64_t ws_offset = 0;
  __nv_bfloat16* out = nullptr;  // split_count(M,W,r) × N, this process's memory
  FusedAlgo algo = FusedAlgo::kAuto;
  RsPartials partials = RsPartials::kF32;  // same on every rank (part of the launch signature)
  // kDecomposed: a stream-K workspace for its GEMM (gemm.h; this process's memory, launches
  // that share it stream-ordered); the fused kernel has no use for one.
  GemmWorkspace gemm_ws{};
};

// The data and scratch bytes that either algorithm needs (kAuto may pick either).
FusedWorkspace gemm_reduce_scatter_workspace(const GemmRsArgs& args, int world);
// What a launch with these arguments would do (fused.h FusedLaunchInfo).
FusedLaunchInfo gemm_reduce_scatter_info(const CommDevice& dev, const GemmRsArgs& args);

// Enqueue one op on `stream` (contract above). cudaErrorInvalidValue for bad arguments, and for
// a forced kFused whose half-tile flags would not fit FusedFlags (kAuto takes kDecomposed there).
cudaError_t launch_gemm_reduce_scatter(const CommDevice& dev, const GemmRsArgs& args, cudaStream_t stream);

// gemmReduceScatter across hosts as one kernel (executor-native's CrossHostPaths; `hosts`: one
// rank per host, fused.h): the GEMM writes this rank's partial product (args.partials: fp32, or
// bf16; kF32AnyOrder is kF32 here) into `partial` (M×N, this process's device memory) tile by
// tile while the kernel's exchange CTAs, the lanes of the proxy's reduceScatter between the
// hosts (kernels/proxy/proxy.h), send each host its rows' partials as their tiles complete and
// sum, in fp32 and host order, the other hosts' partials of this rank's rows with its own into
// `sums` (split_count(M, world, rank) × N of the partials' type; bf16: may be args.out), rounded
// once (detail/rs_hosts_kernel.cuh). The sums equal those of the decomposed path. fp32 sums are
// the caller's to round to bf16. `local`: this rank's own symmetric memory (world 1: the
// kernel's flags and epoch); `px` as for allGatherGemm across hosts (ag_gemm.h). args.out,
// ws_offset, algo and gemm_ws are ignored. gemm_reduce_scatter_hosts_fits: N a multiple of 8
// and the tile flags within FusedFlags.
bool gemm_reduce_scatter_hosts_fits(const GemmRsArgs& args, int world);
cudaError_t launch_gemm_reduce_scatter_hosts(const CommDevice& local, const FusedHosts& hosts,
                                             const GemmRsArgs& args, void* partial, void* sums,
                                             ProxyCollective px, cudaStream_t stream);

namespace detail {
// The workspace of one path (gemm_all_reduce runs the fused one).
FusedWorkspace rs_workspace(const GemmRsArgs& args, int world, FusedAlgo path);
}  // namespace detail

}  // namespace fusedcomm::kernels
