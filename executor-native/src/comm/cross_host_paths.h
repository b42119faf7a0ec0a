// The cuda backend's paths between hosts, for a communicator whose ranks are on several hosts
// (connect() with more than one host id). The symmetric memory is shared by the ranks of each
// host (host_layout.h), and each rank reaches its counterparts on the other hosts through the
// GPU-driven proxy (inter_host.h). Every step is enqueued on the op's stream:
// - allReduce is hierarchical: reduceScatter inside the host (NVLink), allReduce of this
//   rank's block between hosts (GPU -> proxy ring -> transport), allGather inside the host.
//   The sums are in host order of the per-host sums, so every rank gets the same bits.
// - allGather exchanges this rank's block with its counterparts, then runs one allGather per
//   host among the host's ranks; reduceScatter runs one reduceScatter per host among the
//   host's ranks (the host-local sums of the counterparts' blocks), then exchanges those
//   between hosts; allToAll sends each host's blocks to the counterpart there, then forwards
//   them with one allToAll among the host's ranks. They must fit the data area (allGather: H
//   equal block slots; reduceScatter: the largest host's blocks; allToAll: W equal block slots)
//   and use a workspace of the communicator (Needs).
// - With one rank per host allGatherGemm and gemmReduceScatter are one kernel each
//   (kernels/ag_gemm's launch_all_gather_gemm_hosts, kernels/gemm_rs's
//   launch_gemm_reduce_scatter_hosts): the proxy's lanes inside it bring the other hosts' rows
//   while the GEMM works on the rows already there, or send each host its rows' partials as
//   their tiles complete and sum what arrives. Otherwise (several ranks per host, more chunks or
//   tiles than the kernels' flags, N off the multiple of 8 for gemmReduceScatter, operands not
//   16-byte aligned) the fused ops take the decomposed path: the hierarchical allGather then our GEMM; our GEMM then the hierarchical
//   reduceScatter (on W blocks of ceil(M / W) rows when W does not divide M; fp32 partials
//   rounded to bf16 after the sum).
// - gemmAllReduce, where gemmReduceScatter is one kernel (above), the bf16 product is at least
//   4 MiB and the data area holds both steps: that kernel gives this rank its block of rows, summed over every rank and rounded to
//   bf16, then the hierarchical allGather gives every rank every block (the same bits on every
//   rank: each block is summed once, by its owner). Otherwise our GEMM, then the hierarchical
//   allReduce (CudaComm::gemm_all_reduce).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>

#include "fusedcomm/runtime/host_layout.h"
#include "fusedcomm/runtime/inter_host.h"
#include "fusedcomm/runtime/runtime.h"
#include "fusedcomm/runtime/transport_exchanger.h"
#include "fusedcomm/types.h"
#include "kernels/collectives/collectives.h"
#include "kernels/common/fused.h"
#include "kernels/gemm/gemm.h"
#include "local_collectives.h"

namespace fusedcomm {

class CrossHostPaths {
 public:
  // Builds this rank's link to its counterparts: their link blobs travel as one exchange of
  // `host_half` (connected; every rank at this point), and the link's peer groups get ids
  // derived from comm_id, authenticated with the host half's key. `layout` and `local` outlive
  // this object.
  CrossHostPaths(Runtime& runtime, const HostLayout& layout, LocalCollectives& local,
                 TransportExchanger& host_half, uint64_t comm_id);
  ~CrossHostPaths();
  CrossHostPaths(const CrossHostPaths&) = delete;
  CrossHostPaths& operator=(const CrossHostPaths&) = delete;

  // What a path needs: bytes of the data area (the same on every rank; the caller refuses the
  // op above the area) and of the communicator's workspace.
  struct Needs {
    uint64_t data_bytes, work_bytes;
  };

  // allGather, reduceScatter or allToAll of `count` elements (esize bytes each).
  Needs collective_needs(kernels::CommOp op, size_t esize, int64_t count) const;
  // Its steps on s (the caller checked the data area, began the op and passes a workspace of
  // work_bytes). allGather copies at most in_bytes of its input (the rest of its block is left
  // as it was).
  void enqueue_collective(kernels::CommOp op, kernels::CommDtype dtype, const void* in, uint64_t in_bytes,
                          void* out, int64_t count, char* work, cudaStream_t s);
  // allReduce of n elements (n * element size <= the data area), in may alias out.
  void all_reduce(kernels::CommDtype dtype, const char* in, char* out, int64_t n, cudaStream_t s);

  // The fused ops' decomposed path (bf16 operands, shapes as CudaComm's ops take them).
  Needs all_gather_gemm_needs(int64_t m, int64_t k, bool gathered_given) const;
  void all_gather_gemm(const void* a_local, const void* w, void* c, void* gathered, int64_t m,
                       int64_t n_local, int64_t k, WeightLayout layout, char* work,
                       kernels::GemmWorkspace gemm_ws, cudaStream_t s);
  // Whether all_gather_gemm runs the one kernel for these shapes (A_r 16-byte aligned).
  bool all_gather_gemm_fused(int64_t m, int64_t n_local, int64_t k) const;
  // Whether gemm_reduce_scatter runs the one kernel for these shapes (operands 16-byte aligned).
  bool gemm_reduce_scatter_fused(int64_t m, int64_t n) const;
  // Native tests and benches: false makes the fused ops take the decomposed path (the baseline
  // of the kernel); true by default.
  void set_fused(bool on) { fused_ = on; }
  Needs gemm_reduce_scatter_needs(int64_t m, int64_t n, PartialPrecision partials) const;
  void gemm_reduce_scatter(const void* a, const void* w, void* out, int64_t m, int64_t n, int64_t k_local,
                           WeightLayout layout, PartialPrecision partials, char* work,
                           kernels::GemmWorkspace gemm_ws, cudaStream_t s);
  // gemmAllReduce as gemmReduceScatter's one kernel, then the hierarchical allGather: where
  // gemm_reduce_scatter_fused holds and the product is large enough for two steps between hosts
  // to beat one (gemm_all_reduce_fused), data_bytes fit the data area and C is 16-byte aligned.
  bool gemm_all_reduce_fused(int64_t m, int64_t n) const;
  Needs gemm_all_reduce_needs(int64_t m, int64_t n, PartialPrecision partials) const;
  void gemm_all_reduce(const void* a, const void* w, void* c, int64_t m, int64_t n, int64_t k_local,
                       WeightLayout layout, PartialPrecision partials, char* work, kernels::GemmWorkspace gemm_ws,
                       cudaStream_t s);

  // The link (inter_host.h): an enqueued step that gave up, as an exception; abort and close.
  void raise_if_failed();
  bool failed() const;
  void abort() noexcept;
  void close(bool drain) noexcept;

 private:
  // After a step between hosts, on s: if it failed, this rank's symmetric memory records it
  // (kCommHostsFailed), so that its later steps inside the host publish nothing and the host's
  // other ranks stop, naming it, instead of finishing with the missing blocks.
  void gate(cudaStream_t s);
  kernels::FusedHosts fused_hosts() const;  // the one-kernel forms' ranks (one per host)

  const HostLayout& layout_;
  LocalCollectives& local_;
  std::unique_ptr<InterHostLink> link_;
  bool fused_ = true;
};

}  // namespace fusedcomm
