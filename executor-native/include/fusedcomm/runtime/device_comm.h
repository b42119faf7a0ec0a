// The cuda backend's half of a communicator: the symmetric memory its collectives run on (one
// region per rank, mapped by every rank of the host through CUDA IPC) and the streams they are
// enqueued on. The host half (communicator.h) still carries the bootstrap barriers, finish()
// and peer-failure detection; this class only moves data on the GPUs.
//
// Life cycle (driven from JNI, every rank the same):
//   DeviceComm dc(runtime, rank, world);     // borrows a region from the runtime's pool
//   blobs = bootstrap allGather(dc.export_handle());
//   dc.connect(blobs);                       // maps every peer's region, checks peer access
//   dc.collective(...) ...                   // any number of ops
//   dc.synchronize(); host barrier; dc.close();   // region back to the pool if all went well
//
// Ops take device pointers of this process (the caller's tensors, any alignment). An op copies
// its input into this rank's data area (stream-ordered, device to device) and launches one
// persistent collective kernel (kernels/collectives.h) on the same stream:
// - stream == nullptr: the communicator's own stream; the call returns when the op is done and
//   throws Error(kTimeout) naming rank, peer, op and step if a peer never arrived. The own
//   stream is a blocking stream: it waits for work issued before on the legacy default stream,
//   e.g. a cudaMemcpy from pageable memory, which may return before its DMA has landed.
// - otherwise the caller's stream; the call returns once enqueued. A device failure is reported
//   by the next op, synchronize() or close(). Ops on different streams are ordered in call
//   order (an event joins the previous op's stream), as the kernels require.
// CUDA graphs: ops on a caller's stream may be captured (any capture mode) and the graph
// replayed any number of times; every launch takes fresh signal values on the device, so a
// replay never sees a stale flag (DESIGN.md §3). While capturing, an op records and joins no
// event: capture the communicator's ops on one stream, and launch the graph in stream order
// with its other ops (on their stream, or after an event). Across hosts some ops use a private
// workspace that only grows; growing is refused while capturing (Error(kInvalidArgument)), so
// run each op once, at its largest size, before the capture.
// allReduce larger than the data area runs in data-area-sized pieces; other ops must fit (the
// largest rank's input <= data area), else Error(kInvalidArgument) naming the config key.
//
// Across hosts (connect() with more than one host id): the symmetric memory is shared by the
// ranks of each host (host_layout.h), and each rank reaches its counterparts on the other
// hosts through the proxy (inter_host.h). allReduce is hierarchical: reduceScatter inside the
// host (NVLink), allReduce of this rank's block between hosts (GPU -> proxy ring -> transport),
// allGather inside the host, all on the op's stream. The sums are in host order of the
// per-host sums, so every rank gets the same bits. allGather exchanges this rank's block with
// its counterparts, then runs one allGather per host among the host's ranks; reduceScatter runs
// one reduceScatter per host among the host's ranks (the host-local sums of the counterparts'
// blocks), then exchanges those between hosts; allToAll sends each host's blocks to the
// counterpart there, then forwards them with one allToAll among the host's ranks. They must fit
// the data area (allGather: H equal block slots; reduceScatter: the largest host's blocks;
// allToAll: W equal block slots) and use a private device workspace, grown on first need
// (device_comm.cc). The fused ops take the decomposed path between hosts: the hierarchical
// allGather then our GEMM; our GEMM then the hierarchical reduceScatter (on W blocks of
// ceil(M / W) rows when W does not divide M; fp32 partials rounded to bf16 after the sum).
//
// The fused ops (kernels/fused.h, bf16) follow the same rules: allGatherGemm copies A_r into
// the data area; gemmReduceScatter keeps its partial product there (M×N×4 bytes must fit, M×N×2
// with bf16 partials).
//
// Not thread-safe (the Java Communicator serialises its ops); abort() may come from any thread.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/collectives/collectives.h"
#include "kernels/collectives/copy_segments.h"
#include "kernels/ag_gemm/ag_gemm.h"
#include "kernels/gemm_ar/gemm_ar.h"
#include "kernels/gemm_rs/gemm_rs.h"
#include "kernels/gemm/gemm.h"
#include "fusedcomm/runtime/communicator.h"
#include "fusedcomm/runtime/host_layout.h"
#include "fusedcomm/runtime/inter_host.h"
#include "fusedcomm/runtime/runtime.h"
#include "fusedcomm/runtime/symmetric_memory.h"

namespace fusedcomm {

class DeviceComm {
 public:
  DeviceComm(Runtime& runtime, int rank, int world);
  ~DeviceComm();
  DeviceComm(const DeviceComm&) = delete;
  DeviceComm& operator=(const DeviceComm&) = delete;

  std::vector<uint8_t> export_handle() const;
  // blobs[r]: rank r's export_handle(). host_of[r]: rank r's host id (0..H-1). With H > 1 the
  // inter-host link is built: its blobs travel through `host_comm` (the host half, connected;
  // one exchange, every rank at this point), and its peer group gets an id derived from comm_id.
  void connect(const std::vector<std::vector<uint8_t>>& blobs, const std::vector<int>& host_of,
               Communicator& host_comm, uint64_t comm_id);
  const HostLayout& layout() const { return layout_; }

  // `count` as in kernels/collectives.h (the op's global element count).
  void collective(kernels::CommOp op, kernels::CommDtype dtype, const void* in, void* out,
                  int64_t count, cudaStream_t stream);
  // C = allGather(A_r) · op(W_r) (M×N_r; `gathered`, M×K, optional). layout: 0 NK, 1 KN.
  void all_gather_gemm(const void* a_local, const void* w, void* c, void* gathered, int64_t m,
                       int64_t n_local, int64_t k, int layout, cudaStream_t stream);
  // Row block r of Σ_s A_s · op(W_s): A M×K_r, out split_count(M,W,r)×N. partials: the
  // precision of the exchanged partial products (kernels::RsPartials: 0 fp32, 1 bf16, 2 fp32
  // summed in any order).
  void gemm_reduce_scatter(const void* a, const void* w, void* out, int64_t m, int64_t n,
                           int64_t k_local, int layout, int partials, cudaStream_t stream);
  // Σ_s A_s · op(W_s) (M×N) on every rank, the same bits everywhere: our GEMM into partial
  // products of the given precision (as gemm_reduce_scatter; 2 is summed like 0), then our
  // allReduce of them, then (fp32) one rounding into c. fp32 partials use the communicator's
  // workspace: run the op once before capturing it in a CUDA graph (workspace()).
  void gemm_all_reduce(const void* a, const void* w, void* c, int64_t m, int64_t n, int64_t k_local,
                       int layout, int partials, cudaStream_t stream);

  // How all_gather_gemm (op 0), gemm_reduce_scatter (1) or gemm_all_reduce (2) would run on this
  // rank with these sizes (as the op takes them; partials as gemm_reduce_scatter's), in a phrase
  // for logs: the path kAuto picks and, fused, the SM split and how peers' data moves, from
  // kernels/fused.h's *_info with the arguments the op itself passes. Nothing is launched or
  // exchanged. Throws what the op would for sizes it refuses; says so where the data area is too
  // small. The path is the same on every rank; allGatherGemm's exchange is a rank-local choice.
  std::string describe_fused(int op, int64_t m, int64_t n, int64_t k, int partials) const;

  // Waits for every op enqueued so far and throws the first device failure.
  void synchronize();
  // Runs `iters` synchronous collectives on the own stream through collective() and returns
  // the wall time in nanoseconds: the native-initiated reference for Java's per-op overhead.
  int64_t time_collectives(kernels::CommOp op, kernels::CommDtype dtype, const void* in, void* out,
                           int64_t count, int iters);

  void abort() noexcept;  // running and future waits give up at once
  // Waits for this rank's ops (best effort), unmaps peers, and returns the region to the pool
  // unless something failed. The caller has passed a barrier with every rank first, so no peer
  // still uses this rank's memory. Idempotent.
  void close() noexcept;
  bool failed() const { return failed_; }
  // Inputs copied into the data area by the collectives so far (enqueue): for tests, which check
  // that a one-shot op reads its input in place unless it overlaps the output.
  uint64_t input_copies() const { return input_copies_; }
  const SymmetricMemory& memory() const { return *sm_; }

 private:
  void check_usable() const;
  void raise_device_failure();  // the error record, as an exception; marks this failed
  void enqueue(const kernels::CollectiveArgs& args, const void* in, size_t in_bytes, cudaStream_t s);
  void join_previous(cudaStream_t s);
  cudaStream_t begin(cudaStream_t stream);        // checks, pins, orders after the previous op
  void end(cudaStream_t s, bool sync);            // records the op; waits and raises if sync
  // "needs <bytes> bytes of symmetric memory, more than its <area>-byte data area"
  std::string shortfall(uint64_t bytes) const;
  void require_fits(const char* op, uint64_t bytes) const;
  // allReduce of `count` elements on s (begun): one kernel where the input fits the data area,
  // else pieces of its size; across hosts, each piece hierarchically. in may alias out.
  void enqueue_all_reduce(kernels::CommDtype dtype, const void* in, void* out, int64_t count, cudaStream_t s);
  void connect_hosts(Communicator& host_comm, uint64_t comm_id);
  // allReduce of n elements (n * element size <= the data area) across hosts, enqueued on s.
  void all_reduce_across_hosts(kernels::CommDtype dtype, const char* in, char* out, int64_t n,
                               cudaStream_t s);
  // allGather, reduceScatter or allToAll of `count` elements across hosts: the data area and
  // workspace bytes it needs (the same on every rank), and its steps, enqueued on s (the
  // caller checked the data area, began the op and passes a workspace of work_bytes). allGather
  // copies at most in_bytes of its input (the rest of its block is left as it was).
  struct HostsNeeds {
    uint64_t data_bytes, work_bytes;
  };
  HostsNeeds needs_across_hosts(kernels::CommOp op, size_t esize, int64_t count) const;
  void enqueue_across_hosts(kernels::CommOp op, kernels::CommDtype dtype, const void* in, uint64_t in_bytes,
                            void* out, int64_t count, char* work, cudaStream_t s);
  void copy_segments(const std::vector<kernels::CopySegment>& segments, cudaStream_t s);
  // The fused ops across hosts: the decomposed path (device_comm.cc).
  void all_gather_gemm_across_hosts(const void* a_local, const void* w, void* c, void* gathered, int64_t m,
                                    int64_t n_local, int64_t k, int layout, cudaStream_t stream);
  void gemm_reduce_scatter_across_hosts(const void* a, const void* w, void* out, int64_t m, int64_t n,
                                        int64_t k_local, int layout, int partials, cudaStream_t stream);
  void* workspace(uint64_t bytes);
  // The stream-K workspace (kernels/gemm.h) of the GEMMs this communicator launches itself (the
  // decomposed paths), made on the first such op (~33 MiB, zeroed on s): its ops are
  // stream-ordered (begin()), so one serves them all. None is made while a stream captures a
  // graph, nor after a failed allocation: those GEMMs run without stream-K.
  kernels::GemmWorkspace gemm_workspace(cudaStream_t s);
  // Every peer's region is on another GPU than this rank's (by PCI bus id): the copy engines
  // may then move allGatherGemm's exchange.
  bool peers_on_other_gpus() const;
  // allGatherGemm's kernel arguments as all_gather_gemm passes them (describe_fused too).
  kernels::AgGemmArgs ag_operands(const void* w, void* c, void* gathered, int64_t m, int64_t n_local,
                                  int64_t k, int layout) const;
  kernels::GemmArgs with_gemm_workspace(kernels::GemmArgs g, cudaStream_t s);

  Runtime& runtime_;
  std::unique_ptr<SymmetricMemory> sm_;
  HostLayout layout_;
  std::unique_ptr<InterHostLink> link_;  // null on one host
  void* work_ = nullptr;                 // device memory of the steps across hosts (workspace())
  uint64_t work_bytes_ = 0;
  kernels::GemmWorkspace gemm_ws_{};  // gemm_workspace()
  bool gemm_ws_tried_ = false;
  // allGatherGemm's copy-engine exchange (kernels/fused.h AgExchange): its side streams, made at
  // the first launch that uses them, destroyed by close() after the device is synchronised.
  std::unique_ptr<kernels::FusedSideStreams> ag_side_ = std::make_unique<kernels::FusedSideStreams>();
  cudaStream_t own_ = nullptr;
  cudaEvent_t last_done_ = nullptr;  // recorded after each op on its stream
  cudaStream_t last_ = nullptr;      // stream of the previous op
  bool any_op_ = false, connected_ = false, closed_ = false;
  bool capturing_ = false;  // the current op's stream is capturing a CUDA graph (begin())
  std::atomic<bool> failed_{false};
  uint64_t input_copies_ = 0;  // input_copies()
};

}  // namespace fusedcomm
