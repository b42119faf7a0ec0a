// The host backend's communicator: the C++ reference ops (fusedcomm/host/host_ops.h) over the
// executor's transport (TransportExchanger). It runs every op synchronously on host memory, so
// it refuses a stream; it is the oracle for the GPU kernels and the backend of hosts without a
// GPU (and of CI).
#pragma once

#include <memory>

#include "fusedcomm/comm/comm.h"
#include "fusedcomm/runtime/transport_exchanger.h"

namespace fusedcomm {

class HostComm final : public Comm {
 public:
  HostComm(Runtime& runtime, int world);
  ~HostComm() override;

  Backend backend() const override { return Backend::kHost; }
  std::string endpoint() const override;
  std::vector<uint8_t> device_handle() const override { return {}; }
  uint64_t symmetric_bytes() const override { return 0; }
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

  void all_gather_gemm(const OpDesc& desc, DType dtype, const void* a_local, const void* w, void* c,
                       void* gathered, int64_t m, int64_t n_local, int64_t k, WeightLayout layout,
                       cudaStream_t stream) override;
  void gemm_reduce_scatter(const OpDesc& desc, DType dtype, const void* a, const void* w, void* c, int64_t m,
                           int64_t n, int64_t k_local, WeightLayout layout, PartialPrecision partials,
                           cudaStream_t stream) override;
  void gemm_all_reduce(const OpDesc& desc, DType dtype, const void* a, const void* w, void* c, int64_t m,
                       int64_t n, int64_t k_local, WeightLayout layout, PartialPrecision partials,
                       cudaStream_t stream) override;
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
  void ring_attention(const OpDesc& desc, DType dtype, const host::AttentionShape& shape, const void* q,
                      const void* k, const void* v, void* o, float* lse, cudaStream_t stream) override;
  void ring_attention_backward(const OpDesc& desc, DType dtype, const host::AttentionShape& shape,
                               const void* q, const void* k, const void* v, const void* o, const float* lse,
                               const void* d_o, void* dq, void* dk, void* dv, cudaStream_t stream) override;

  void synchronize() override {}
  void finish() override;
  void abort() noexcept override;
  void close() override;

 private:
  // Checks that no stream was given, names the op (errors and the cross-rank check) and returns
  // the exchanger the op runs on.
  Exchanger& start(const OpDesc& desc, cudaStream_t stream);

  TransportExchanger ex_;
};

}  // namespace fusedcomm
