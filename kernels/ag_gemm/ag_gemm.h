// allGatherGemm: rank r holds A_r: split_count(M,W,r)×K and W_r; it gets
//   C_r = [A_0; …; A_{W-1}] · op(W_r) : M×N_r   (and optionally the gathered A)
// in one launch (kernels/common/fused.h: the contract every fused op keeps, the protocol, the
// notation). M and K are the same on every rank (rank-uniform); N_r may differ by rank, and so
// may the CTA split.
//
// Numerics: exactly launch_gemm on the gathered A (the gathered A is a bit copy).
//
// Algorithms (FusedAlgo):
//   kFused: one persistent kernel (detail/ag_gemm_kernel.cuh). The GEMM reads the M-blocks made
//     only of the rank's own rows from A_r itself; its other own rows (blocks shared with a
//     neighbour's rows, and all of them when the caller asks for the gathered A) go into the
//     gathered buffer by a stream-ordered copy (copy engine) just before the kernel. CTAs
//     [0, G) run the GEMM; CTAs [G, G+P) PULL the peers' rows chunk by chunk (bulk copies from
//     the peers' data areas, in the order in which the GEMM consumes the rows: its own rows
//     first, which need no pull, then rank r+1's, ...) into the gathered buffer and set a
//     per-chunk flag; the GEMM's producer waits for a tile's chunk flag before loading it. Once
//     a pulling CTA has finished its chunks it joins the GEMM (tiles are claimed from a shared
//     counter), so the SMs lent to communication are not lost for the rest of the op.
//     Or (AgExchange::kCopyEngines, which kAuto takes at W = 2 for narrow N_r or a large
//     gathered A, tuning.h, when the caller passes side streams) the copy engines pull the
//     peers' rows, one side stream per peer forked from `stream` and joined back into it after
//     the kernel, chunk by chunk in the GEMM's order; a single CTA turns their progress into the
//     chunk flags, and every other SM runs the GEMM (a pulling SM moves ~16 GB/s beside the
//     GEMM, so where the exchange is large against the GEMM the pulls cost it SM time that the
//     copy engines do not).
//   kDecomposed: launch_collective (allGather) then launch_gemm, stream-ordered. When W does
//     not divide M the collective moves W equal blocks of ceil(M/W) rows (its element split
//     would cut rows), plus one copy to unpack the padded layout. At W = 1 there is nothing to
//     exchange: launch_gemm alone, reading A_r in place (the gathered A, when asked for, is a
//     copy of it).
//   kAuto: kernels/common/fused_choice.h (choose_all_gather_gemm), from M, K and W only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "kernels/collectives/collectives.h"
#include "kernels/common/fused.h"
#include "kernels/gemm/gemm.h"
#include "kernels/proxy/proxy.h"

namespace fusedcomm::kernels {

// How the peers' rows move in the fused kernel (contract above, "kFused").
//   kSmPulls      pulling CTAs move the peers' rows, then join the GEMM;
//   kCopyEngines  the copy engines move them on side streams (AgGemmArgs::side, required);
//   kAuto         kCopyEngines at W = 2 where tuning.h's bars say so (narrow N_r, or a large
//                 gathered A) and side streams were given, else kSmPulls (measured on H200:
//                 docs/performance.md; at W = 4 one stream per peer lost to the SM pulls). A
//                 rank-local choice: ranks that differ interoperate (both start with the same
//                 barrier and end with the same done flags), so kAuto also falls back to SM
//                 pulls where the side streams cannot be made (the launch makes them first; a
//                 forced kCopyEngines returns that error instead). The fallback sticks to that
//                 FusedSideStreams (FusedSideStreams::usable), so that all_gather_gemm_info
//                 reports it for every later launch.
enum class AgExchange : uint32_t { kAuto = 0, kSmPulls = 1, kCopyEngines = 2 };

// The side streams of the copy-engine exchange: one per peer slot, a join event per stream and a
// fork event, made on the current device at the first launch that uses them and kept until
// destruction. Pass them only where every peer's memory is on another GPU: a copy within one GPU
// may run as a kernel, which the fused kernel's cooperative grid (every SM) starves until the
// chunk waits time out. A communicator owns one (executor-native's CudaComm) and passes it to
// every allGatherGemm; one launching thread at a time, always the same device. Destroying it with
// copies still queued is safe (CUDA releases a stream once its work is done), but the
// communicator's stream must not be waited on through a destroyed object.
class FusedSideStreams {
 public:
  FusedSideStreams() = default;
  ~FusedSideStreams();
  FusedSideStreams(const FusedSideStreams&) = delete;
  FusedSideStreams& operator=(const FusedSideStreams&) = delete;

  // The streams and events for `world - 1` peers on the current device, created on first use;
  // cudaErrorInvalidDevice if it was made on another device. A failure marks the object
  // unusable: kAuto then takes the SM pulls without asking again (a rank-local choice, so a rank
  // may differ from its peers); only a forced kCopyEngines asks again, and its success makes the
  // object usable again.
  cudaError_t prepare(int world);
  // False after a failed prepare: kAuto's launches and all_gather_gemm_info take SM pulls.
  bool usable() const { return !failed_; }
  cudaStream_t stream(int slot) const { return streams_[slot]; }
  cudaEvent_t join(int slot) const { return joins_[slot]; }
  cudaEvent_t fork() const { return fork_; }
  void* write_value() const { return write_value_; }  // cuStreamWriteValue64, from the driver

 private:
  int device_ = -1;
  cudaStream_t streams_[kCommMaxRanks - 1] = {};  // slot i pulls peer (rank + 1 + i) % W
  cudaEvent_t joins_[kCommMaxRanks - 1] = {};
  cudaEvent_t fork_ = nullptr;
  void* write_value_ = nullptr;
  bool failed_ = false;

  cudaError_t make(int world);  // prepare's work
};

struct AgGemmArgs {
  int M = 0;  // rows of the gathered A and of C (same on every rank)
  int N = 0;  // N_r: columns of this rank's C (rows of W_r in kNK)
  int K = 0;  // same on every rank
  // A_r (split_count(M,W,r) × K bf16, dense) sits at this byte offset of the data area, the
  // same offset on every rank. The data area must extend ceil(M/W) rows past it (the
  // decomposed path's collective moves equal blocks).
  uint64_t in_offset = 0;
  const __nv_bfloat16* B = nullptr;  // W_r: N×K (kNK) or K×N (kKN), this process's memory
  GemmLayoutB b_layout = GemmLayoutB::kNK;
  __nv_bfloat16* C = nullptr;  // M×N, this process's memory
  // Optional output M×K: the gathered A. Null: the gathered A is built in this rank's scratch
  // area (from its offset 0), which the op then overwrites.
  __nv_bfloat16* gathered = nullptr;
  FusedAlgo algo = FusedAlgo::kAuto;
  int comm_ctas = 0;  // kFused SM pulls: CTAs that pull A (0: tuning.h's table; clamped to
                      // 1..SMs/2). The copy-engine exchange takes one.
  // kFused: how the peers' rows move (AgExchange); kCopyEngines needs `side`.
  AgExchange exchange = AgExchange::kAuto;
  FusedSideStreams* side = nullptr;  // the copy-engine exchange's streams; null: SM pulls
  // kFused, benches and tests: the GEMM and the pulls take the peers' M-blocks in turn (1) or
  // peer after peer (0); -1: in turn with the copy engines (their streams pull every peer at
  // once), else peer after peer. Honoured at W >= 3 where a flag chunk is one M-block
  // (M <= 128 * kFusedMaxChunks).
  int interleave_peers = -1;
  // kDecomposed: a stream-K workspace for its GEMM (gemm.h; this process's memory, launches
  // that share it stream-ordered); the fused kernel has no use for one.
  GemmWorkspace gemm_ws{};
};

// allGatherGemm across hosts as one kernel (executor-native's CrossHostPaths; `hosts`: one rank
// per host, fused.h). The GEMM runs as in kFused while the kernel's exchange CTAs are the lanes
// of the proxy's allGather between the hosts (kernels/proxy/proxy.h), which copy each host's
// rows from the inbox into the gathered A and raise the GEMM's chunk flags as the rows land
// (detail/ag_gemm_kernel.cuh ag_hosts_role). `local`: this rank's own symmetric memory (world
// 1: the kernel's flags and epoch); `own`: A_r, split_count(M, world, rank) × K bf16, 16-byte
// aligned, any device memory of this process; args.gathered (required): the gathered A;
// args.algo, exchange, side and in_offset are ignored. `px`: the link's collective arguments
// (rings, boxes, keys, value counters, status; InterHostLink::prepare); the launch sets its
// op, dtype, blocks and counts. The op's chunks (proxy_collective_chunks) must not exceed
// kFusedMaxChunks: all_gather_gemm_hosts_fits says whether they do.
bool all_gather_gemm_hosts_fits(const AgGemmArgs& args, int world, const ProxyCollective& px);
cudaError_t launch_all_gather_gemm_hosts(const CommDevice& local, const FusedHosts& hosts, const void* own,
                                         const AgGemmArgs& args, ProxyCollective px, cudaStream_t stream);

// The data and scratch bytes that either algorithm needs (kAuto may pick either).
FusedWorkspace all_gather_gemm_workspace(const AgGemmArgs& args, int world);
// What a launch with these arguments would do (fused.h FusedLaunchInfo).
FusedLaunchInfo all_gather_gemm_info(const CommDevice& dev, const AgGemmArgs& args);

// The sweep, for these arguments: the flag chunks in the order the GEMM takes their M-blocks
// and the pulls move them (ag_gemm_kernel.cuh ag_sweep_chunk); with the peers interleaved
// (AgGemmArgs::interleave_peers) a chunk is one M-block. Empty for bad arguments.
std::vector<int> all_gather_gemm_sweep(const CommDevice& dev, const AgGemmArgs& args);

// The exchange on the copy engines (AgExchange::kCopyEngines; ag_gemm.cu ag_ce_steps,
// ag_gemm_kernel.cuh ag_ce_role): the steps of the side stream that pulls peer `from`'s rows,
// for these arguments, in order, copies merged up to `copy_bytes`. Its positions are the chunks
// that hold rows of `from`, in the GEMM's order. peer >= 0 (always `from`): copy rows
// [row0, row1) of the gathered A from that peer's input; peer < 0: write that peer's
// ce_progress slot = progress (its rows of every chunk at a position <= progress are then
// complete; the last step, the end mark, is the position count + 1). position_rows, if not
// null, gets the rows [r0, r1) of each position's chunk. Empty for from == rank or out of
// range. Host code, so that the geometry test checks it on the CPU.
struct AgCeStep {
  int peer;
  int64_t row0, row1;
  uint64_t progress;
};
std::vector<AgCeStep> all_gather_gemm_ce_plan(
    const CommDevice& dev, const AgGemmArgs& args, int from, int64_t copy_bytes,
    std::vector<std::pair<int64_t, int64_t>>* position_rows = nullptr);

// Enqueue one op on `stream` (contract above). cudaErrorInvalidValue for bad arguments.
cudaError_t launch_all_gather_gemm(const CommDevice& dev, const AgGemmArgs& args, cudaStream_t stream);

}  // namespace fusedcomm::kernels
