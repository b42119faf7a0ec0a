// The cuda backend's communicator. Its host half (TransportExchanger) carries the bootstrap
// barriers, finish() and peer-failure detection; its GPU half is the symmetric memory its ops
// run on (one region per rank, mapped by every rank of the host through CUDA IPC), the streams
// they are enqueued on and, with ranks on several hosts, the paths between hosts
// (src/comm/cross_host_paths.h). Ring attention across hosts takes a decomposed form
// (src/comm/cuda_comm_ring_hosts.cc); MoE across hosts is not on the GPU yet and refuses with
// Error(kUnavailable).
//
// MoE (kernels/moe/moe.h), synchronous: moe_dispatch_gemm routes on the GPU (no host round
// trip inside the op), receives up to the rows that the data area holds (hidden × 2 + 16 bytes
// each; more: Error(kInvalidArgument) on every rank, naming the rank and the config key), keeps
// routed_x, out and the layout on the GPU (MoeDeviceResult, outputs sized by that capacity) and
// copies the layout to the host when it returns. moe_combine takes such a result of this
// communicator; every home rank's T · topk · width · 2 bytes must fit the data area.
//
// Ops take device pointers of this process (the caller's tensors, any alignment) and bf16 for
// the GEMM ops. A collective copies its input into this rank's data area where the launch
// needs it (stream-ordered, device to device) and launches one persistent collective kernel
// (kernels/collectives/collectives.h) on the same stream:
// - stream == nullptr: the communicator's own stream; the call returns when the op is done and
//   throws Error(kTimeout) naming rank, peer, op and step if a peer never arrived. The own
//   stream is a blocking stream: it waits for work issued before on the legacy default stream,
//   e.g. a cudaMemcpy from pageable memory, which may return before its DMA has landed.
// - otherwise the caller's stream; the call returns once enqueued. A device failure is reported
//   by the next op, synchronize() or close(). Ops on different streams are ordered in call
//   order (an event joins the previous op's stream), as the kernels require.
// CUDA graphs: ops on a caller's stream may be captured (any capture mode) and the graph
// replayed any number of times; every launch takes fresh signal values on the device, so a
// replay never sees a stale flag (docs/architecture.md, the GPU protocol rules). While
// capturing, an op records and joins no event: capture the communicator's ops on one stream,
// and launch the graph in stream order with its other ops (on their stream, or after an event).
// Some ops use a private workspace that only grows; growing is refused while capturing
// (Error(kInvalidArgument)), so run each op once, at its largest size, before the capture.
// allReduce larger than the data area runs in data-area-sized pieces; other ops must fit (the
// largest rank's input <= data area), else Error(kInvalidArgument) naming the config key.
//
// The fused ops: where each runs is decided in one place (src/comm/fused_plan.h), which the
// ops and describe_fused() share: on one host the kernels' launchers (kernels/<op>/<op>.h),
// whose size rule picks the fused kernel or our GEMM then our collective; across hosts our
// GEMM and the hierarchical collective; gemmAllReduce larger than the data area our GEMM then
// our allReduce in pieces. allGatherGemm copies A_r into the data area; gemmReduceScatter keeps
// its partial product there (M×N×4 bytes must fit, M×N×2 with bf16 partials).
//
// Not thread-safe (the Java Communicator serialises its ops); abort() may come from any thread.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fusedcomm/comm/comm.h"
#include "fusedcomm/runtime/host_layout.h"
#include "fusedcomm/runtime/symmetric_memory.h"
#include "fusedcomm/runtime/transport_exchanger.h"
#include "kernels/ag_gemm/ag_gemm.h"
#include "kernels/attention/ring_fwd.h"
#include "kernels/collectives/collectives.h"
#include "kernels/common/fused.h"
#include "kernels/gemm/gemm.h"
#include "kernels/gemm_ar/gemm_ar.h"
#include "kernels/gemm_rs/gemm_rs.h"

namespace fusedcomm {

class CrossHostPaths;
struct RingAttentionShape;
class LocalCollectives;
struct FusedContext;

class CudaComm final : public Comm {
 public:
  // The host half first (its staging region), then a symmetric region borrowed from the
  // runtime's pool.
  CudaComm(Runtime& runtime, int rank, int world);
  ~CudaComm() override;
  CudaComm(const CudaComm&) = delete;
  CudaComm& operator=(const CudaComm&) = delete;

  Backend backend() const override { return Backend::kCuda; }
  std::string endpoint() const override { return host_.endpoint(); }
  std::vector<uint8_t> device_handle() const override;
  uint64_t symmetric_bytes() const override;
  // The host half's connections first (they end with a barrier, so every rank has created its
  // symmetric memory), then the peers' memory is mapped; with ranks on several hosts
  // (peers.host_ids) each rank also connects to its counterparts on the other hosts.
  void connect(const Bootstrap& peers) override;

  void all_gather(const OpDesc& desc, DType dtype, const void* in, void* out, int64_t count,
                  cudaStream_t stream) override;
  void reduce_scatter(const OpDesc& desc, DType dtype, const void* in, void* out, int64_t count,
                      cudaStream_t stream) override;
  void all_reduce(const OpDesc& desc, DType dtype, const void* in, void* out, int64_t count,
                  cudaStream_t stream) override;
  void all_to_all(const OpDesc& desc, DType dtype, const void* in, void* out, int64_t count,
                  cudaStream_t stream) override;
  int64_t time_collective(Op op, DType dtype, const void* in, void* out, int64_t count, int iters) override;
  // The four collectives above (op: one of them); `count` as in fusedcomm.h.
  void collective(Op op, DType dtype, const void* in, void* out, int64_t count, cudaStream_t stream);

  void all_gather_gemm(const OpDesc& desc, DType dtype, const void* a_local, const void* w, void* c,
                       void* gathered, int64_t m, int64_t n_local, int64_t k, WeightLayout layout,
                       cudaStream_t stream) override;
  // Row block r of Σ_s A_s · op(W_s): A M×K_r, out split_count(M,W,r)×N.
  void gemm_reduce_scatter(const OpDesc& desc, DType dtype, const void* a, const void* w, void* c, int64_t m,
                           int64_t n, int64_t k_local, WeightLayout layout, PartialPrecision partials,
                           cudaStream_t stream) override;
  // Σ_s A_s · op(W_s) (M×N) on every rank, the same bits everywhere (kF32AnyOrder is summed
  // like kF32). fp32 partials may use the communicator's workspace: run the op once before
  // capturing it in a CUDA graph.
  void gemm_all_reduce(const OpDesc& desc, DType dtype, const void* a, const void* w, void* c, int64_t m,
                       int64_t n, int64_t k_local, WeightLayout layout, PartialPrecision partials,
                       cudaStream_t stream) override;
  // The path the op's plan picks and, fused, the SM split and how peers' data moves, from the
  // kernels' *_info with the arguments the op itself passes. Throws what the op would for
  // sizes it refuses; says so where the data area is too small. The path is the same on every
  // rank; allGatherGemm's exchange is a rank-local choice.
  std::string describe_fused(Op op, int64_t m, int64_t n, int64_t k,
                             PartialPrecision partials) const override;

  std::unique_ptr<host::MoeDispatchResult> moe_dispatch_gemm(
      const OpDesc& desc, DType dtype, const void* x, int64_t tokens, int64_t hidden, const int32_t* topk_ids,
      const float* topk_weights, int topk, int64_t num_experts, const void* w1_local, int64_t ffn,
      const host::MoeDispatchOptions& options) override;
  void moe_combine(const OpDesc& desc, DType dtype, const host::MoeDispatchResult& dispatch,
                   const void* expert_out, int64_t width, void* out) override;
  void moe_gemm_combine(const OpDesc& desc, DType dtype, const host::MoeDispatchResult& dispatch,
                        const void* h, int64_t k, const void* w2_local, WeightLayout layout, int64_t width,
                        void* out) override;
  // The path the last moe_gemm_combine took: "fused" (one kernel: each tile of h · W2ᵀ stored
  // into its rows' home slots, the weighted sums in the same kernel) or "decomposed" (the
  // grouped GEMM, then the combine); fused_choice.h's choose_moe_gemm_combine.
  const std::string& moe_gemm_combine_path() const { return moe_gemm_combine_path_; }
  void ring_attention(const OpDesc& desc, DType dtype, const host::AttentionShape& shape, const void* q,
                      const void* k, const void* v, void* o, float* lse, cudaStream_t stream) override;
  void ring_attention_backward(const OpDesc& desc, DType dtype, const host::AttentionShape& shape,
                               const void* q, const void* k, const void* v, const void* o, const float* lse,
                               const void* d_o, void* dq, void* dk, void* dv, cudaStream_t stream) override;
  // The same with the layout named (device_attention.h RingAttentionShape). Across hosts, the
  // decomposed form (ring_attention_hosts). stream: null runs the op on the communicator's own
  // stream and returns when it is done; else the op is enqueued on `stream` (errors at
  // synchronize(); a CUDA graph may capture it once it has run at its size: its workspace and
  // side stream are made at the first run).
  void ring_attention_gpu(const OpDesc& desc, DType dtype, const RingAttentionShape& shape, const void* q,
                          const void* k, const void* v, void* o, float* lse, cudaStream_t stream = nullptr);
  // The ring's backward (docs/ops.md ringAttentionBackward): from this rank's q, k, v, the
  // forward's o and lse, and d_o, its dq (as q), dk, dv (as k, v); bf16, fp32 accumulation. K/V
  // blocks and their fp32 dK/dV partials travel around the ring together (kernels/attention/
  // ring.h has the protocol). q, o, d_o, dq, dk, dv 16-byte aligned. Across hosts, the
  // decomposed form (ring_attention_backward_hosts). stream as ring_attention_gpu's. From the
  // Comm interface's shape: ring_attention_shape (device_attention.h).
  // The forward ring's form on one host (kernels/attention/ring_fwd.h choose_ring_fwd_path):
  // kAuto, or one forced (tests and benchmarks; every rank must force the same).
  void set_ring_forward_path(kernels::RingFwdPath path) { ring_fwd_path_ = path; }
  kernels::RingFwdPath ring_forward_path() const { return kernels::choose_ring_fwd_path(ring_fwd_path_); }
  void ring_attention_backward_gpu(const OpDesc& desc, DType dtype, const RingAttentionShape& shape,
                                   const void* q, const void* k, const void* v, const void* o,
                                   const float* lse, const void* d_o, void* dq, void* dk, void* dv,
                                   cudaStream_t stream = nullptr);

  void synchronize() override;
  // This rank's ops are complete (device), then the host half's barrier.
  void finish() override;
  void abort() noexcept override;
  // Waits for this rank's ops, passes the host half's closing barrier, then releases the GPU
  // half: after the barrier no peer uses this rank's memory, so its region goes back to the
  // runtime's pool. If anything failed the region is dropped instead and the host half aborted.
  void close() override;

  // For tests.
  const HostLayout& layout() const { return layout_; }
  // Tests and benches across hosts: false runs the fused ops decomposed (cross_host_paths.h),
  // the baseline of their one-kernel form; every rank must set the same. No effect on one host.
  void set_fused_across_hosts(bool on);
  const SymmetricMemory& memory() const { return *sm_; }
  bool failed() const { return failed_; }
  // Inputs copied into the data area by the collectives so far (enqueue): one-shot launches
  // read their input in place unless it overlaps the output.
  uint64_t input_copies() const;

 private:
  void check_usable() const;
  void raise_device_failure();              // the error record, as an exception
  cudaStream_t begin(cudaStream_t stream);  // checks, pins, orders after the previous op
  void end(cudaStream_t s, bool sync);      // records the op; waits and raises if sync
  void join_previous(cudaStream_t s);
  // "needs <bytes> bytes of symmetric memory, more than its <area>-byte data area"
  std::string shortfall(uint64_t bytes) const;
  void require_fits(const char* op, uint64_t bytes) const;
  // allReduce of `count` elements on s (begun): one kernel where the input fits the data area,
  // else pieces of its size; across hosts, each piece hierarchically. in may alias out.
  void enqueue_all_reduce(kernels::CommDtype dtype, const void* in, void* out, int64_t count, cudaStream_t s);
  void* workspace(uint64_t bytes);
  // The stream-K workspace (kernels/gemm/gemm.h) of the GEMMs this communicator launches
  // itself (the decomposed paths), made on the first such op (~33 MiB, zeroed on s): its ops
  // are stream-ordered (begin()), so one serves them all. None is made while a stream captures
  // a graph, nor after a failed allocation: those GEMMs run without stream-K.
  kernels::GemmWorkspace gemm_workspace(cudaStream_t s);
  kernels::GemmArgs with_gemm_workspace(kernels::GemmArgs g, cudaStream_t s);
  // A fused op's path between hosts as one op on `stream` (null: the communicator's own):
  // run(workspace of work_bytes, the GEMM workspace, the begun stream).
  template <class Run>
  void across_hosts(uint64_t work_bytes, cudaStream_t stream, Run run);
  // Every peer's region is on another GPU than this rank's (by PCI bus id): the copy engines
  // may then move allGatherGemm's exchange.
  bool peers_on_other_gpus() const;
  // The fused ops' kernel arguments as the ops pass them (describe_fused too).
  kernels::AgGemmArgs ag_operands(const void* w, void* c, void* gathered, int64_t m, int64_t n_local,
                                  int64_t k, WeightLayout layout) const;
  FusedContext fused_context() const;
  // Ring attention across hosts (src/comm/cuda_comm_ring_hosts.cc): every K/V block gathered
  // through the hierarchical allGather, the ring's steps over them in ring order; the backward's
  // dK/dV partials summed at their owners by the hierarchical reduceScatter. Shapes checked.
  void ring_attention_hosts(const RingAttentionShape& shape, const void* q, const void* k, const void* v,
                            void* o, float* lse, cudaStream_t stream);
  void ring_attention_backward_hosts(const RingAttentionShape& shape, const void* q, const void* k,
                                     const void* v, const void* o, const float* lse, const void* d_o,
                                     void* dq, void* dk, void* dv, cudaStream_t stream);
  // The checks moe_combine and moe_gemm_combine begin with; the dispatch's device half (this
  // communicator's CudaMoeResult, src/comm/cuda_comm.cc).
  const MoeDeviceResult* combine_source(const OpDesc& desc, DType dtype,
                                        const host::MoeDispatchResult& dispatch, const char* op);
  // Ops not on the GPU yet.
  [[noreturn]] void unavailable(const OpDesc& desc) const;

  Runtime& runtime_;
  TransportExchanger host_;
  std::unique_ptr<SymmetricMemory> sm_;
  std::unique_ptr<LocalCollectives> local_;
  HostLayout layout_;
  std::unique_ptr<CrossHostPaths> hosts_;  // null on one host
  void* work_ = nullptr;                   // device memory of some paths (workspace())
  uint64_t work_bytes_ = 0;
  kernels::GemmWorkspace gemm_ws_{};  // gemm_workspace()
  bool gemm_ws_tried_ = false;
  // allGatherGemm's copy-engine exchange (kernels/ag_gemm/ag_gemm.h AgExchange): its side streams,
  // made at the first launch that uses them, destroyed after the device is synchronised.
  std::unique_ptr<kernels::FusedSideStreams> ag_side_ = std::make_unique<kernels::FusedSideStreams>();
  // The ring attention's side stream (the K/V copies and the ring's sync kernels; highest
  // priority, so that its one-thread kernels are scheduled between the attention's CTAs) and its
  // events (fork, join, own block packed, and per step: block pulled, block computed); made at the first ring at
  // W >= 2, destroyed after the device is synchronised.
  cudaStream_t ring_side_ = nullptr;
  cudaEvent_t ring_fork_ = nullptr, ring_join_ = nullptr, ring_packed_ = nullptr;
  cudaEvent_t ring_pulled_[kernels::kCommMaxRanks] = {}, ring_computed_[kernels::kCommMaxRanks] = {};
  // The backward's: per step, the block's dK/dV partial pulled.
  cudaEvent_t ring_grads_pulled_[kernels::kCommMaxRanks] = {};
  void make_ring_streams();
  kernels::RingFwdPath ring_fwd_path_ = kernels::RingFwdPath::kAuto;
  cudaStream_t own_ = nullptr;
  cudaEvent_t last_done_ = nullptr;  // recorded after each op on its stream
  cudaStream_t last_ = nullptr;      // stream of the previous op
  bool any_op_ = false, connected_ = false, closed_ = false, gpu_closed_ = false;
  bool capturing_ = false;  // the current op's stream is capturing a CUDA graph (begin())
  std::atomic<bool> failed_{false};

  void abort_gpu() noexcept;  // running and future device waits give up at once
  void close_gpu() noexcept;  // the GPU half: region back to the pool unless failed; idempotent
  std::string moe_gemm_combine_path_;
};

}  // namespace fusedcomm
