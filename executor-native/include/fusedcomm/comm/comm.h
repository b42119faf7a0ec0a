// A communicator: `world` ranks, one per task of a barrier stage, built among themselves at the
// start of the stage, running the ops of docs/ops.md on the executor runtime's backend. One
// interface, two implementations:
//   HostComm  (host_comm.h)  the C++ reference backend over the executor's transport;
//   CudaComm  (cuda_comm.h)  the GPU backend: symmetric memory over NVLink inside a host, the
//                            GPU-driven proxy between hosts.
// The C API (fusedcomm/fusedcomm.h) is a thin shell over it; ops not on a backend yet refuse
// with Error(kUnavailable).
//
// Life cycle, every rank the same:
//   auto comm = Comm::create(runtime, rank, world);
//   blobs = launcher's allGather(comm->endpoint(), comm->device_handle());
//   comm->connect(bootstrap);           // bounded by the connect timeout; ends with a barrier
//   comm->all_reduce(...) ...           // any number of ops, from one thread
//   comm->close();                      // finish (drain) + free; abort() first to stop now
//
// Contract shared by every op: all ranks call the same ops in the same order with the same
// global parameters (each op's OpDesc fingerprint covers them; the host backend checks it across
// ranks); arguments are checked before any data moves; every wait is bounded by the runtime's
// timeout and a dead peer is named; after an error the communicator is unusable (close it).
// Streams: null runs the op synchronously; a CUDA stream (cuda backend) enqueues it there and
// the call returns once enqueued (errors then surface in a later op or synchronize()). The host
// backend refuses a stream.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fusedcomm/host/host_ops.h"
#include "fusedcomm/rdma/auth.h"
#include "fusedcomm/types.h"

namespace fusedcomm {

class Runtime;

// What connect() needs from the launcher's bootstrap exchange, one entry per rank.
struct Bootstrap {
  int rank = 0;
  uint64_t comm_id = 0;                // the same on every rank of the communicator
  std::vector<std::string> endpoints;  // [r]: rank r's endpoint()
  // [r]: the random share rank r published in the bootstrap (rdma/auth.h): with the job token
  // and comm_id it makes the communicator's key, which authenticates its connections. Empty
  // only for a world of one.
  std::vector<rdma::auth::Share> auth_shares;
  std::vector<std::vector<uint8_t>> device_handles;  // [r]: rank r's device_handle()
  std::vector<int> host_ids;                         // [r]: rank r's host, 0..H-1
};

// A moeDispatchGemm result that stays on the GPU (cuda backend; host::MoeDispatchResult::device).
class MoeDeviceResult {
 public:
  virtual ~MoeDeviceResult() = default;
  // Copies the expert outputs (rows × ffn) and the routed tokens (rows × hidden) into memory of
  // this process, device or host (either may be null). Synchronous.
  virtual void copy(void* expert_out, void* routed_x) const = 0;
  // The GPU memory that holds them, valid while this result lives (null where it holds no rows):
  // what callers wrap to use the rows in place, without a copy.
  virtual void* expert_out() const = 0;
  virtual void* routed_x() const = 0;
};

class Comm {
 public:
  // The communicator of `runtime`'s (resolved) backend. With the cuda backend this also
  // borrows a symmetric memory region from the runtime's pool.
  static std::unique_ptr<Comm> create(Runtime& runtime, int rank, int world);

  virtual ~Comm() = default;
  virtual Backend backend() const = 0;

  // ---- bootstrap ----------------------------------------------------------------------------
  // "host:port#regionKey": what peers need to reach this rank's transport staging region.
  virtual std::string endpoint() const = 0;
  // The symmetric memory's IPC blob (cuda); empty with the host backend.
  virtual std::vector<uint8_t> device_handle() const = 0;
  // Bytes of GPU memory the symmetric region takes (cuda; 0 with the host backend or once the
  // region went back to the runtime's pool).
  virtual uint64_t symmetric_bytes() const = 0;
  virtual void connect(const Bootstrap& peers) = 0;

  // ---- collectives (fusedcomm.h: `count` is the whole tensor's element count) ---------------
  virtual void all_gather(const OpDesc& desc, DType dtype, const void* in, void* out, int64_t count,
                          cudaStream_t stream) = 0;
  virtual void reduce_scatter(const OpDesc& desc, DType dtype, const void* in, void* out, int64_t count,
                              cudaStream_t stream) = 0;
  virtual void all_reduce(const OpDesc& desc, DType dtype, const void* in, void* out, int64_t count,
                          cudaStream_t stream) = 0;
  virtual void all_to_all(const OpDesc& desc, DType dtype, const void* in, void* out, int64_t count,
                          cudaStream_t stream) = 0;
  // Diagnostics: `iters` synchronous collectives (op: one of the four) initiated from native
  // code, wall nanoseconds: the reference for the Java layer's per-op overhead. cuda only.
  virtual int64_t time_collective(Op op, DType dtype, const void* in, void* out, int64_t count,
                                  int iters) = 0;

  // ---- fused GEMM + communication ----------------------------------------------------------
  virtual void all_gather_gemm(const OpDesc& desc, DType dtype, const void* a_local, const void* w, void* c,
                               void* gathered, int64_t m, int64_t n_local, int64_t k, WeightLayout layout,
                               cudaStream_t stream) = 0;
  virtual void gemm_reduce_scatter(const OpDesc& desc, DType dtype, const void* a, const void* w, void* c,
                                   int64_t m, int64_t n, int64_t k_local, WeightLayout layout,
                                   PartialPrecision partials, cudaStream_t stream) = 0;
  virtual void gemm_all_reduce(const OpDesc& desc, DType dtype, const void* a, const void* w, void* c,
                               int64_t m, int64_t n, int64_t k_local, WeightLayout layout,
                               PartialPrecision partials, cudaStream_t stream) = 0;
  // How a fused op (kAllGatherGemm: m, n_local, k; the other two: m, n, k_local) would run on
  // this rank with these sizes, in a phrase for logs. Nothing is launched or exchanged.
  virtual std::string describe_fused(Op op, int64_t m, int64_t n, int64_t k,
                                     PartialPrecision partials) const = 0;

  // ---- MoE and attention ------------------------------------------------------------------
  virtual std::unique_ptr<host::MoeDispatchResult> moe_dispatch_gemm(
      const OpDesc& desc, DType dtype, const void* x, int64_t tokens, int64_t hidden, const int32_t* topk_ids,
      const float* topk_weights, int topk, int64_t num_experts, const void* w1_local, int64_t ffn,
      const host::MoeDispatchOptions& options) = 0;
  // `dispatch`: a result of this communicator's moe_dispatch_gemm.
  virtual void moe_combine(const OpDesc& desc, DType dtype, const host::MoeDispatchResult& dispatch,
                           const void* expert_out, int64_t width, void* out) = 0;
  // The down projection with the combine (docs/ops.md "moeGemmCombine"): h (rows × k, the
  // dispatch's rows) times each local expert's w2 (local_experts × width × k, kNK, or × k ×
  // width, kKN), then the combine of those rows into out (tokens × width). The same result as
  // grouped GEMM then moe_combine on this backend, bit for bit (both backends compute it so).
  virtual void moe_gemm_combine(const OpDesc& desc, DType dtype, const host::MoeDispatchResult& dispatch,
                                const void* h, int64_t k, const void* w2_local, WeightLayout layout,
                                int64_t width, void* out) = 0;
  // stream: as the collectives' (null: synchronous; the host backend takes null only).
  virtual void ring_attention(const OpDesc& desc, DType dtype, const host::AttentionShape& shape,
                              const void* q, const void* k, const void* v, void* o, float* lse,
                              cudaStream_t stream) = 0;
  // Its backward (host::ring_attention_backward has the contract).
  virtual void ring_attention_backward(const OpDesc& desc, DType dtype, const host::AttentionShape& shape,
                                       const void* q, const void* k, const void* v, const void* o,
                                       const float* lse, const void* d_o, void* dq, void* dk, void* dv,
                                       cudaStream_t stream) = 0;

  // ---- teardown: finish (drain), close (free), abort (stop now) -----------------------------
  // Waits for the ops enqueued on streams and throws the first device failure (cuda).
  virtual void synchronize() = 0;
  // Every rank's ops are complete and every rank got here (a barrier).
  virtual void finish() = 0;
  // Waits in flight on any thread give up at once; peers learn that this rank left. Any thread.
  virtual void abort() noexcept = 0;
  // Finishes (unless aborted or broken) and frees; idempotent. Whatever happens the resources
  // are released; a failure of the closing barrier is thrown after.
  virtual void close() = 0;
};

}  // namespace fusedcomm
