#include "fusedcomm/comm/cuda_comm.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>

#include "cross_host_paths.h"
#include "fused_plan.h"
#include "fusedcomm/runtime/device_attention.h"
#include "fusedcomm/runtime/device_gemm.h"
#include "fusedcomm/runtime/errors.h"
#include "fusedcomm/runtime/split.h"
#include "kernels/attention/ring.h"
#include "kernels/moe/moe.h"
#include "local_collectives.h"

namespace fusedcomm {
namespace {

namespace k = kernels;

// The operands that gemmReduceScatter's and gemmAllReduce's kernel arguments (k::GemmRsArgs,
// k::GemmArArgs) share; kAuto, the workspace at the data area's start.
template <typename Args>
Args gemm_reduce_operands(const void* a, const void* w, int64_t m, int64_t n, int64_t k_local,
                          WeightLayout layout, PartialPrecision partials) {
  Args args;
  args.M = static_cast<int>(m);
  args.N = static_cast<int>(n);
  args.K = static_cast<int>(k_local);
  args.A = static_cast<const __nv_bfloat16*>(a);
  args.B = static_cast<const __nv_bfloat16*>(w);
  args.b_layout = layout == WeightLayout::kNK ? k::GemmLayoutB::kNK : k::GemmLayoutB::kKN;
  args.ws_offset = 0;
  args.partials = static_cast<k::RsPartials>(partials);  // the same values
  return args;
}

// The shapes that gemmReduceScatter and gemmAllReduce accept on the GPU.
void require_gemm_reduce_args(const char* op, int64_t m, int64_t n, int64_t k_local) {
  FC_REQUIRE(m >= 1 && n >= 8 && k_local >= 8 && n % 8 == 0 && k_local % 8 == 0 && m < (1ll << 31) &&
                 n < (1ll << 31) && k_local < (1ll << 31),
             std::string(op) + " on the GPU: M >= 1, N and K_r multiples of 8 (got M=" + std::to_string(m) +
                 ", N=" + std::to_string(n) + ", K_r=" + std::to_string(k_local) + ")");
}

// The shapes that allGatherGemm accepts on the GPU.
void require_ag_args(int64_t m, int64_t n_local, int64_t k) {
  FC_REQUIRE(m >= 1 && n_local >= 8 && k >= 8 && n_local % 8 == 0 && k % 8 == 0 && m < (1ll << 31) &&
                 n_local < (1ll << 31) && k < (1ll << 31),
             "allGatherGemm on the GPU: M >= 1, N_r and K multiples of 8 (got M=" + std::to_string(m) +
                 ", N_r=" + std::to_string(n_local) + ", K=" + std::to_string(k) + ")");
}

void require_bf16(DType t, const char* op) {
  FC_REQUIRE(t == DType::kBF16, std::string(op) + " on the cuda backend takes bf16 tensors");
}

}  // namespace

CudaComm::CudaComm(Runtime& runtime, int rank, int world) : runtime_(runtime), host_(runtime, world) {
  if (runtime.backend() != Backend::kCuda) {
    fail(ErrorKind::kState, "a device communicator needs the cuda backend");
  }
  pin_gpu(runtime.gpu().ordinal);
  // Pooled regions are staged for kCommMaxRanks: enough for one host's ranks, which is what
  // shares the region when the world (across hosts) is larger.
  sm_ = std::make_unique<SymmetricMemory>(rank, world,
                                          runtime.acquire_region(std::min(world, k::kCommMaxRanks)));
  local_ = std::make_unique<LocalCollectives>(*sm_);
  try {
    // Blocking (not cudaStreamNonBlocking): callers fill tensors with plain cudaMemcpy (JCuda)
    // on the legacy default stream; see cuda_comm.h.
    check_cuda(cudaStreamCreateWithFlags(&own_, cudaStreamDefault), "cudaStreamCreate");
    check_cuda(cudaEventCreateWithFlags(&last_done_, cudaEventDisableTiming), "cudaEventCreate");
  } catch (...) {
    close_gpu();
    throw;
  }
}

CudaComm::~CudaComm() {
  if (closed_) return;
  abort();
  try {
    close();
  } catch (...) {}
}

std::vector<uint8_t> CudaComm::device_handle() const { return sm_->export_handle(); }

uint64_t CudaComm::symmetric_bytes() const { return sm_ != nullptr ? sm_->region_bytes() : 0; }

void CudaComm::connect(const Bootstrap& peers) {
  host_.connect(peers.endpoints, peers.rank, peers.comm_id, peers.auth_shares);
  FC_REQUIRE(static_cast<int>(peers.host_ids.size()) == host_.world(),
             "connect: " + std::to_string(peers.host_ids.size()) + " host ids for world " +
                 std::to_string(host_.world()));
  pin_gpu(runtime_.gpu().ordinal);
  layout_ = make_host_layout(peers.host_ids, host_.rank());
  if (layout_.hosts > 1) sm_->restrict_to(layout_.members());
  sm_->connect(peers.device_handles);
  if (layout_.hosts > 1)
    hosts_ = std::make_unique<CrossHostPaths>(runtime_, layout_, *local_, host_, peers.comm_id);
  connected_ = true;
}

uint64_t CudaComm::input_copies() const { return local_ != nullptr ? local_->input_copies() : 0; }

void CudaComm::check_usable() const {
  if (closed_ || gpu_closed_) fail(ErrorKind::kState, "the device communicator is closed");
  if (!connected_) fail(ErrorKind::kState, "the device communicator is not connected");
  if (failed_) {
    fail(ErrorKind::kCommunicator,
         "the device communicator failed earlier (see the first error); close it and build a new one");
  }
}

// Kernels on one CommDevice must not overlap (collectives.h): an op on a new stream waits for
// the previous op's stream. Costs nothing while the caller keeps to one stream.
void CudaComm::join_previous(cudaStream_t s) {
  if (any_op_ && s != last_) check_cuda(cudaStreamWaitEvent(s, last_done_, 0), "cudaStreamWaitEvent");
}

cudaStream_t CudaComm::begin(cudaStream_t stream) {
  check_usable();
  pin_gpu(runtime_.gpu().ordinal);
  raise_device_failure();  // an earlier asynchronous op's failure surfaces here
  cudaStream_t s = stream == nullptr ? own_ : stream;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  check_cuda(cudaStreamIsCapturing(s, &status), "cudaStreamIsCapturing");
  FC_REQUIRE(status != cudaStreamCaptureStatusInvalidated,
             "the stream's CUDA graph capture was invalidated by an earlier call; end it and capture again");
  capturing_ = status == cudaStreamCaptureStatusActive;
  // A captured op runs when its graph is launched; the order against earlier ops is the
  // graph launch's stream order (the header's contract), not an event of this communicator.
  if (!capturing_) join_previous(s);
  return s;
}

void CudaComm::end(cudaStream_t s, bool sync) {
  if (capturing_) return;  // nothing ran: the previous op stays the one to order after
  check_cuda(cudaEventRecord(last_done_, s), "cudaEventRecord");
  last_ = s;
  any_op_ = true;
  if (sync) {
    check_cuda(cudaStreamSynchronize(s), "waiting for the op");
    raise_device_failure();
  }
}

std::string CudaComm::shortfall(uint64_t bytes) const {
  return "needs " + std::to_string(bytes) + " bytes of symmetric memory, more than its " +
         std::to_string(sm_->data_bytes()) + "-byte data area";
}

void CudaComm::require_fits(const char* op, uint64_t bytes) const {
  if (bytes > sm_->data_bytes()) {
    fail(ErrorKind::kInvalidArgument,
         std::string(op) + " " + shortfall(bytes) + "; raise spark.fusedcomm.cuda.symmetricBytes");
  }
}

// ---- collectives ----------------------------------------------------------------------------

void CudaComm::all_gather(const OpDesc&, DType dtype, const void* in, void* out, int64_t count,
                          cudaStream_t stream) {
  collective(Op::kAllGather, dtype, in, out, count, stream);
}
void CudaComm::reduce_scatter(const OpDesc&, DType dtype, const void* in, void* out, int64_t count,
                              cudaStream_t stream) {
  collective(Op::kReduceScatter, dtype, in, out, count, stream);
}
void CudaComm::all_reduce(const OpDesc&, DType dtype, const void* in, void* out, int64_t count,
                          cudaStream_t stream) {
  collective(Op::kAllReduce, dtype, in, out, count, stream);
}
void CudaComm::all_to_all(const OpDesc&, DType dtype, const void* in, void* out, int64_t count,
                          cudaStream_t stream) {
  collective(Op::kAllToAll, dtype, in, out, count, stream);
}

void CudaComm::collective(Op op, DType dtype, const void* in, void* out, int64_t count, cudaStream_t stream) {
  FC_REQUIRE(is_collective(op), "unknown collective " + std::to_string(static_cast<int>(op)));
  FC_REQUIRE(dtype == DType::kF32 || dtype == DType::kBF16,
             "unsupported dtype " + std::to_string(static_cast<int>(dtype)) + " (f32 or bf16)");
  FC_REQUIRE(count >= 0, "negative element count");
  check_usable();
  const k::CommOp kop = comm_op(op);
  const k::CommDtype kdt = comm_dtype(dtype);
  const char* name = k::comm_op_name(static_cast<uint32_t>(kop));
  if (op == Op::kAllReduce) {
    cudaStream_t s = begin(stream);
    enqueue_all_reduce(kdt, in, out, count, s);
    end(s, stream == nullptr);
    return;
  }
  if (hosts_ != nullptr) {
    const CrossHostPaths::Needs need = hosts_->collective_needs(kop, element_bytes(kdt), count);
    require_fits(name, need.data_bytes);
    cudaStream_t s = begin(stream);
    char* work = static_cast<char*>(workspace(need.work_bytes));
    hosts_->enqueue_collective(kop, kdt, in, UINT64_MAX, out, count, work, s);
    end(s, stream == nullptr);
    return;
  }
  const int world = sm_->world(), rank = sm_->rank();
  const size_t esize = element_bytes(kdt);
  // The largest input of any rank decides, so that every rank takes the same branch.
  require_fits(name, static_cast<uint64_t>(k::collective_input_count(kop, count, world, 0)) * esize);
  cudaStream_t s = begin(stream);
  k::CollectiveArgs args;
  args.op = kop;
  args.dtype = kdt;
  args.count = count;
  args.output = out;
  local_->enqueue(args, in, static_cast<size_t>(k::collective_input_count(kop, count, world, rank)) * esize,
                  s);
  end(s, stream == nullptr);
}

// allReduce is element-wise: pieces of the data area's size (16-byte multiples) are
// independent ops.
void CudaComm::enqueue_all_reduce(k::CommDtype dtype, const void* in, void* out, int64_t count,
                                  cudaStream_t s) {
  const size_t esize = element_bytes(dtype);
  const uint64_t capacity = sm_->data_bytes();
  const auto* src = static_cast<const char*>(in);
  auto* dst = static_cast<char*>(out);
  k::CollectiveArgs args;
  args.op = k::CommOp::kAllReduce;
  args.dtype = dtype;
  if (hosts_ == nullptr && static_cast<uint64_t>(count) * esize <= capacity) {
    args.count = count;
    args.output = out;
    local_->enqueue(args, in, static_cast<size_t>(count) * esize, s);
    return;
  }
  const int64_t piece = static_cast<int64_t>(capacity / esize) / 8 * 8;
  for (int64_t done = 0; done < count; done += piece) {
    const int64_t n = std::min(piece, count - done);
    if (hosts_ != nullptr) {
      hosts_->all_reduce(dtype, src + done * esize, dst + done * esize, n, s);
    } else {
      args.count = n;
      args.output = dst + done * esize;
      local_->enqueue(args, src + done * esize, n * esize, s);
    }
  }
}

int64_t CudaComm::time_collective(Op op, DType dtype, const void* in, void* out, int64_t count, int iters) {
  FC_REQUIRE(is_collective(op), "unknown collective " + std::to_string(static_cast<int>(op)));
  FC_REQUIRE(iters > 0, "iterations must be positive");
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) collective(op, dtype, in, out, count, nullptr);
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
}

// ---- fused ops --------------------------------------------------------------------------------

FusedContext CudaComm::fused_context() const {
  return FusedContext{sm_->device(), sm_->data_bytes(), layout_.world(), hosts_.get()};
}

bool CudaComm::peers_on_other_gpus() const {
  const std::vector<PeerLink>& peers = sm_->peers();  // by local rank, this rank's own included
  const int me = sm_->rank();
  if (me < 0 || me >= static_cast<int>(peers.size())) return false;
  for (int p = 0; p < static_cast<int>(peers.size()); ++p) {
    if (p != me && peers[p].pci_bus_id == peers[me].pci_bus_id) return false;
  }
  return true;
}

k::AgGemmArgs CudaComm::ag_operands(const void* w, void* c, void* gathered, int64_t m, int64_t n_local,
                                    int64_t k, WeightLayout layout) const {
  k::AgGemmArgs args;
  args.M = static_cast<int>(m);
  args.N = static_cast<int>(n_local);
  args.K = static_cast<int>(k);
  args.in_offset = 0;
  args.B = static_cast<const __nv_bfloat16*>(w);
  args.b_layout = layout == WeightLayout::kNK ? k::GemmLayoutB::kNK : k::GemmLayoutB::kKN;
  args.C = static_cast<__nv_bfloat16*>(c);
  args.gathered = static_cast<__nv_bfloat16*>(gathered);
  // kAuto may move the exchange with the copy engines, which need every peer on another GPU
  // (kernels/ag_gemm/ag_gemm.h FusedSideStreams; the tests' shared-GPU mode has them all on one).
  args.side = peers_on_other_gpus() ? ag_side_.get() : nullptr;
  return args;
}

void CudaComm::set_fused_across_hosts(bool on) {
  if (hosts_ != nullptr) hosts_->set_fused(on);
}

template <class Run>
void CudaComm::across_hosts(uint64_t work_bytes, cudaStream_t stream, Run run) {
  cudaStream_t s = begin(stream);
  char* work = static_cast<char*>(workspace(work_bytes));
  run(work, gemm_workspace(s), s);
  end(s, stream == nullptr);
}

void CudaComm::all_gather_gemm(const OpDesc&, DType dtype, const void* a_local, const void* w, void* c,
                               void* gathered, int64_t m, int64_t n_local, int64_t k, WeightLayout layout,
                               cudaStream_t stream) {
  require_bf16(dtype, "allGatherGemm");
  check_usable();
  require_ag_args(m, n_local, k);
  k::AgGemmArgs args = ag_operands(w, c, gathered, m, n_local, k, layout);
  const FusedPlan plan = plan_all_gather_gemm(fused_context(), args);
  require_fits("allGatherGemm", plan.needs);
  if (plan.route == FusedRoute::kAcrossHosts) {
    across_hosts(hosts_->all_gather_gemm_needs(m, k, gathered != nullptr).work_bytes, stream,
                 [&](char* work, k::GemmWorkspace gemm_ws, cudaStream_t s) {
                   hosts_->all_gather_gemm(a_local, w, c, gathered, m, n_local, k, layout, work, gemm_ws, s);
                 });
    return;
  }
  cudaStream_t s = begin(stream);
  args.gemm_ws = gemm_workspace(s);
  const int64_t rows = static_cast<int64_t>(split_count(m, sm_->world(), sm_->rank()));
  if (rows > 0) {
    check_cuda(
        cudaMemcpyAsync(sm_->data(), a_local, static_cast<size_t>(rows * k * 2), cudaMemcpyDeviceToDevice, s),
        "copying A into symmetric memory");
  }
  check_fused_launch(k::launch_all_gather_gemm(sm_->device(), args, s), "allGatherGemm");
  end(s, stream == nullptr);
}

void CudaComm::gemm_reduce_scatter(const OpDesc&, DType dtype, const void* a, const void* w, void* out,
                                   int64_t m, int64_t n, int64_t k_local, WeightLayout layout,
                                   PartialPrecision partials, cudaStream_t stream) {
  require_bf16(dtype, "gemmReduceScatter");
  check_usable();
  require_gemm_reduce_args("gemmReduceScatter", m, n, k_local);
  k::GemmRsArgs args = gemm_reduce_operands<k::GemmRsArgs>(a, w, m, n, k_local, layout, partials);
  args.out = static_cast<__nv_bfloat16*>(out);
  const FusedPlan plan = plan_gemm_reduce_scatter(fused_context(), args);
  require_fits("gemmReduceScatter", plan.needs);
  if (plan.route == FusedRoute::kAcrossHosts) {
    across_hosts(hosts_->gemm_reduce_scatter_needs(m, n, partials).work_bytes, stream,
                 [&](char* work, k::GemmWorkspace gemm_ws, cudaStream_t s) {
                   hosts_->gemm_reduce_scatter(a, w, out, m, n, k_local, layout, partials, work, gemm_ws, s);
                 });
    return;
  }
  cudaStream_t s = begin(stream);
  args.gemm_ws = gemm_workspace(s);
  check_fused_launch(k::launch_gemm_reduce_scatter(sm_->device(), args, s), "gemmReduceScatter");
  end(s, stream == nullptr);
}

// kKernels: the kernels' gemmAllReduce (the fused gemmReduceScatter then an allGather, or our
// GEMM into the data area then our allReduce, as its rule picks). Across hosts, where the plan
// says fused: gemmReduceScatter's one kernel, then the hierarchical allGather
// (CrossHostPaths::gemm_all_reduce). Otherwise our GEMM, then our
// allReduce, in pieces where needed and hierarchical across hosts: bf16 partials: the GEMM
// rounds each rank's product into c and the allReduce sums c in place (fp32 sums, rounded once
// more; across hosts, per host and then between hosts); fp32 partials: the product stays fp32
// in the workspace until the sum is rounded once into c. Every path gives every rank the same
// bits; at world 1 each is the GEMM.
void CudaComm::gemm_all_reduce(const OpDesc&, DType dtype, const void* a, const void* w, void* c, int64_t m,
                               int64_t n, int64_t k_local, WeightLayout layout, PartialPrecision partials,
                               cudaStream_t stream) {
  require_bf16(dtype, "gemmAllReduce");
  check_usable();
  require_gemm_reduce_args("gemmAllReduce", m, n, k_local);
  const int W = layout_.world();
  const bool bf16 = partials == PartialPrecision::kBF16;
  k::GemmArArgs args = gemm_reduce_operands<k::GemmArArgs>(a, w, m, n, k_local, layout, partials);
  args.C = static_cast<__nv_bfloat16*>(c);
  const FusedPlan plan = plan_gemm_all_reduce(fused_context(), args);
  if (plan.route == FusedRoute::kAcrossHosts && plan.info.algo == k::FusedAlgo::kFused &&
      (reinterpret_cast<uintptr_t>(c) & 15) == 0) {
    across_hosts(hosts_->gemm_all_reduce_needs(m, n, partials).work_bytes, stream,
                 [&](char* work, k::GemmWorkspace gemm_ws, cudaStream_t s) {
                   hosts_->gemm_all_reduce(a, w, c, m, n, k_local, layout, partials, work, gemm_ws, s);
                 });
    return;
  }
  if (plan.route == FusedRoute::kKernels) {
    args.algo = plan.info.algo;
    cudaStream_t s = begin(stream);
    args.gemm_ws = gemm_workspace(s);
    if (W > 1 && args.algo == k::FusedAlgo::kDecomposed && !bf16) {
      args.sums = static_cast<float*>(workspace(round16(static_cast<uint64_t>(m * n) * 4)));
    }
    check_fused_launch(k::launch_gemm_all_reduce(sm_->device(), args, s), "gemmAllReduce");
    end(s, stream == nullptr);
    return;
  }
  cudaStream_t s = begin(stream);
  if (W == 1 || bf16) {
    check_fused_launch(
        k::launch_gemm(
            with_gemm_workspace(dense_gemm_args(a, w, c, m, n, k_local, layout, k::GemmOutType::kBF16), s),
            s),
        "gemmAllReduce");
    if (W > 1) enqueue_all_reduce(k::CommDtype::kBF16, c, c, m * n, s);
  } else {
    auto* sums = static_cast<float*>(workspace(round16(static_cast<uint64_t>(m * n) * 4)));
    check_fused_launch(
        k::launch_gemm(
            with_gemm_workspace(dense_gemm_args(a, w, sums, m, n, k_local, layout, k::GemmOutType::kF32), s),
            s),
        "gemmAllReduce");
    enqueue_all_reduce(k::CommDtype::kF32, sums, sums, m * n, s);
    check_cuda(k::launch_narrow_to_bf16(sums, c, m * n, s), "gemmAllReduce: rounding the sums");
  }
  end(s, stream == nullptr);
}

std::string CudaComm::describe_fused(Op op, int64_t m, int64_t n, int64_t k,
                                     PartialPrecision partials) const {
  check_usable();
  FC_REQUIRE(is_fused(op), "unknown fused op " + std::to_string(static_cast<int>(op)));
  const FusedContext ctx = fused_context();
  // The kernels' arguments as the op passes them, without pointers: the plan reads sizes only.
  if (op == Op::kAllGatherGemm) {
    require_ag_args(m, n, k);
    return describe_plan(
        ctx, op,
        plan_all_gather_gemm(ctx, ag_operands(nullptr, nullptr, nullptr, m, n, k, WeightLayout::kNK)),
        partials);
  }
  require_gemm_reduce_args(op_name(op), m, n, k);
  if (op == Op::kGemmReduceScatter) {
    const auto args =
        gemm_reduce_operands<k::GemmRsArgs>(nullptr, nullptr, m, n, k, WeightLayout::kNK, partials);
    return describe_plan(ctx, op, plan_gemm_reduce_scatter(ctx, args), partials);
  }
  const auto args =
      gemm_reduce_operands<k::GemmArArgs>(nullptr, nullptr, m, n, k, WeightLayout::kNK, partials);
  return describe_plan(ctx, op, plan_gemm_all_reduce(ctx, args), partials);
}

// ---- ops not on the GPU yet -------------------------------------------------------------------

void CudaComm::unavailable(const OpDesc& desc) const {
  fail(ErrorKind::kUnavailable,
       std::string(desc.description) +
           ": not available across hosts on the cuda backend yet (it runs moeDispatchGemm and moeCombine "
           "among the GPUs of one host); use spark.fusedcomm.backend=host for this op");
}

// ---- MoE (kernels/moe/moe.h) --------------------------------------------------------------------

namespace {

// Device memory of one MoE dispatch result (cudaMalloc'd; the result may outlive the op's stream).
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) {
    check_cuda(cudaMalloc(&p_, std::max<size_t>(bytes, 256)),
               "cudaMalloc of a MoE result (" + std::to_string(bytes) + " bytes)");
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (p_ != nullptr) cudaFree(p_);
  }
  template <typename T>
  T* as() const {
    return static_cast<T*>(p_);
  }

 private:
  void* p_ = nullptr;
};

// The grid cap of the MoE kernels whose CTAs wait for every rank's (the low-latency ones): with
// ranks sharing a GPU (native tests), each rank's grid takes a 1/W share of the SMs so that
// every rank's kernel is resident at once; 0 (no cap) otherwise.
int shared_gpu_ctas(const Runtime& runtime, int world) {
  if (!runtime.config().allow_shared_gpu || world <= 1) return 0;
  int sms = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, runtime.gpu().ordinal) != cudaSuccess)
    return 2;
  return std::max(2, sms / world);
}

// What moeDispatchGemm leaves on the GPU: the outputs at the capacity's size, the device layout
// the combine reads, and a copy of this rank's routing weights (the combine's weights).
class CudaMoeResult final : public MoeDeviceResult {
 public:
  CudaMoeResult(const void* owner, int gpu, int world, int64_t experts, int64_t local, int64_t tokens,
                int topk, int64_t capacity, int64_t hidden, int64_t ffn)
      : owner(owner),
        gpu(gpu),
        capacity(capacity),
        hidden(hidden),
        ffn(ffn),
        routed(static_cast<size_t>(capacity * hidden * 2)),
        out(static_cast<size_t>(capacity * ffn * 2)),
        offsets(static_cast<size_t>(local + 1) * 8),
        src_rank(static_cast<size_t>(capacity) * 4),
        src_token(static_cast<size_t>(capacity) * 4),
        src_slot(static_cast<size_t>(capacity) * 4),
        weight(static_cast<size_t>(capacity) * 4),
        counts(static_cast<size_t>(world * experts) * 4),
        tokens(static_cast<size_t>(world) * 4),
        status(sizeof(k::MoeStatus)),
        topk_weights(static_cast<size_t>(tokens * topk) * 4) {}

  k::MoeDeviceLayout layout() const {
    return {offsets.as<int64_t>(),  src_rank.as<int32_t>(),   src_token.as<int32_t>(),
            src_slot.as<int32_t>(), weight.as<float>(),       counts.as<int32_t>(),
            tokens.as<int32_t>(),   status.as<k::MoeStatus>()};
  }

  void copy(void* expert_out, void* routed_x) const override {
    pin_gpu(gpu);
    if (expert_out != nullptr && rows > 0) {
      check_cuda(
          cudaMemcpy(expert_out, out.as<void>(), static_cast<size_t>(rows * ffn * 2), cudaMemcpyDefault),
          "copying the MoE expert outputs");
    }
    if (routed_x != nullptr && rows > 0) {
      check_cuda(
          cudaMemcpy(routed_x, routed.as<void>(), static_cast<size_t>(rows * hidden * 2), cudaMemcpyDefault),
          "copying the MoE routed tokens");
    }
  }

  void* expert_out() const override { return rows > 0 ? out.as<void>() : nullptr; }
  void* routed_x() const override { return rows > 0 ? routed.as<void>() : nullptr; }

  const void* owner;  // the communicator
  int gpu;
  int64_t capacity, hidden, ffn;
  int64_t rows = 0;
  std::vector<int32_t> all_tokens;  // every rank's T (host copy)
  DeviceBuffer routed, out, offsets, src_rank, src_token, src_slot, weight, counts, tokens, status,
      topk_weights;
};

k::MoeStatus read_status(const k::MoeStatus* status) {
  k::MoeStatus st{};
  check_cuda(cudaMemcpy(&st, status, sizeof st, cudaMemcpyDeviceToHost), "reading the MoE status");
  return st;
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// The data area a combine of `width` columns needs at the busiest home rank: every home rank's
// rows must fit its data area, and every rank knows every T_s, so all agree.
uint64_t combine_area_bytes(const CudaMoeResult& dev, int topk, int64_t width) {
  int64_t most = 0;
  for (int32_t t : dev.all_tokens) most = std::max<int64_t>(most, t);
  return k::moe_combine_data_bytes(most, topk, static_cast<int>(width));
}

}  // namespace

std::unique_ptr<host::MoeDispatchResult> CudaComm::moe_dispatch_gemm(
    const OpDesc& desc, DType dtype, const void* x, int64_t tokens, int64_t hidden, const int32_t* topk_ids,
    const float* topk_weights, int topk, int64_t num_experts, const void* w1_local, int64_t ffn,
    const host::MoeDispatchOptions& options) {
  constexpr const char* kOp = "moeDispatchGemm";
  require_bf16(dtype, kOp);
  check_usable();
  if (hosts_ != nullptr) unavailable(desc);
  const int world = sm_->world(), rank = sm_->rank();
  FC_REQUIRE(num_experts >= 1 && num_experts <= k::kMoeMaxExperts && topk >= 1 && topk <= k::kMoeMaxTopk,
             std::string(kOp) + " on the GPU: 1 <= experts <= " + std::to_string(k::kMoeMaxExperts) +
                 " and 1 <= topk <= " + std::to_string(k::kMoeMaxTopk) + " (got " +
                 std::to_string(num_experts) + ", " + std::to_string(topk) + ")");
  FC_REQUIRE(
      hidden >= 8 && ffn >= 8 && hidden % 8 == 0 && ffn % 8 == 0 && hidden < (1 << 30) && ffn < (1 << 30),
      std::string(kOp) + " on the GPU: hidden and ffn multiples of 8, at least 8 (got " +
          std::to_string(hidden) + ", " + std::to_string(ffn) + ")");
  FC_REQUIRE(tokens >= 0 && tokens * topk < (1ll << 31),
             std::string(kOp) + ": tokens x topk must stay below 2^31");
  FC_REQUIRE(aligned16(x) && aligned16(w1_local),
             std::string(kOp) + " on the GPU: x and w1 must be 16-byte aligned device memory");
  const int64_t local = split_count(num_experts, world, rank);
  // The receive capacity (the same on every rank): the caller's bound, or every row the data
  // area holds. The outputs and the receive area are sized by it.
  const int64_t holds =
      std::min<int64_t>(k::moe_capacity_for(sm_->data_bytes(), static_cast<int>(hidden)), (1ll << 31) - 1);
  FC_REQUIRE(options.max_recv_rows >= 0 && options.max_recv_rows <= holds,
             std::string(kOp) + ": maxRecvRows = " + std::to_string(options.max_recv_rows) +
                 " must be in [0, " + std::to_string(holds) +
                 "] (0: no bound; the symmetric data area holds " + std::to_string(holds) + " rows of " +
                 std::to_string(hidden) + " x 2 + 16 bytes; spark.fusedcomm.cuda.symmetricBytes)");
  const bool bounded = options.max_recv_rows > 0;
  const int64_t capacity = bounded ? options.max_recv_rows : holds;
  auto result = std::make_unique<host::MoeDispatchResult>();
  auto dev = std::make_shared<CudaMoeResult>(this, runtime_.gpu().ordinal, world, num_experts, local, tokens,
                                             topk, capacity, hidden, ffn);
  cudaStream_t s = begin(nullptr);
  if (tokens > 0) {
    check_cuda(cudaMemcpyAsync(dev->topk_weights.as<void>(), topk_weights,
                               static_cast<size_t>(tokens * topk) * 4, cudaMemcpyDeviceToDevice, s),
               "copying the routing weights");
  }
  k::MoeDispatchArgs a;
  a.x = static_cast<const __nv_bfloat16*>(x);
  a.tokens = tokens;
  a.hidden = static_cast<int>(hidden);
  a.topk_ids = topk_ids;
  a.topk_weights = topk_weights;
  a.topk = topk;
  a.num_experts = static_cast<int>(num_experts);
  a.w1 = static_cast<const __nv_bfloat16*>(w1_local);
  a.ffn = static_cast<int>(ffn);
  a.capacity = capacity;
  a.routed_x = dev->routed.as<__nv_bfloat16>();
  a.out = dev->out.as<__nv_bfloat16>();
  a.layout = dev->layout();
  a.workspace_bytes =
      k::moe_dispatch_workspace_bytes(tokens, topk, static_cast<int>(num_experts), world, rank, capacity);
  a.workspace = workspace(a.workspace_bytes);
  a.fused_ctas = shared_gpu_ctas(runtime_, world);
  const k::MoeLaunchInfo info = k::moe_dispatch_info(sm_->device(), a);
  result->path = info.low_latency ? "low-latency"
                 : info.algo == k::FusedAlgo::kFused
                     ? "fused (" + std::to_string(info.gemm_ctas) + " GEMM + " +
                           std::to_string(info.dispatch_ctas) + " dispatch CTAs)"
                     : "decomposed";
  check_fused_launch(k::launch_moe_dispatch(sm_->device(), a, s), kOp);
  end(s, true);

  const k::MoeStatus st = read_status(dev->status.as<k::MoeStatus>());
  if (st.code == k::kMoeBadExpert) {
    fail(ErrorKind::kInvalidArgument,
         std::string(kOp) + ": " +
             (st.rank == rank ? std::string() : "rank " + std::to_string(st.rank) + ": ") + "token " +
             std::to_string(st.a / topk) + " slot " + std::to_string(st.a % topk) + " routes to expert id " +
             std::to_string(st.b) + ", outside [0, " + std::to_string(num_experts) + ")");
  }
  if (st.code == k::kMoeOverflow) {
    fail(
        ErrorKind::kInvalidArgument,
        std::string(kOp) + ": rank " + std::to_string(st.rank) + " would receive " + std::to_string(st.a) +
            " routed rows, more than " +
            (bounded ? "maxRecvRows = " + std::to_string(st.b) + "; no row moved"
                     : "the " + std::to_string(st.b) + " its symmetric data area holds (" +
                           std::to_string(hidden) +
                           " x 2 + 16 bytes each); no row moved; raise spark.fusedcomm.cuda.symmetricBytes"));
  }
  if (st.code != k::kMoeOk) {
    fail(ErrorKind::kCommunicator, std::string(kOp) + ": " + k::moe_status_name(st.code));
  }

  // The layout on the host (docs/ops.md: an explicit copy when the synchronous op returns).
  host::MoeLayout& l = result->layout;
  l.world = world;
  l.rank = rank;
  l.topk = topk;
  l.num_experts = num_experts;
  l.first_local_expert = split_offset(num_experts, world, rank);
  l.local_experts = local;
  l.tokens = tokens;
  l.sent_pairs.assign(world, {});
  l.expert_offsets.resize(local + 1);
  check_cuda(
      cudaMemcpy(l.expert_offsets.data(), dev->offsets.as<void>(), (local + 1) * 8, cudaMemcpyDeviceToHost),
      "reading the MoE layout");
  const int64_t rows = l.expert_offsets.back();
  dev->rows = rows;
  l.src_rank.resize(rows);
  l.src_token.resize(rows);
  l.src_slot.resize(rows);
  l.weight.resize(rows);
  dev->all_tokens.resize(world);
  const std::pair<void*, const void*> copies[] = {{l.src_rank.data(), dev->src_rank.as<void>()},
                                                  {l.src_token.data(), dev->src_token.as<void>()},
                                                  {l.src_slot.data(), dev->src_slot.as<void>()},
                                                  {l.weight.data(), dev->weight.as<void>()}};
  for (const auto& [to, from] : copies) {
    if (rows > 0)
      check_cuda(cudaMemcpy(to, from, rows * 4, cudaMemcpyDeviceToHost), "reading the MoE layout");
  }
  check_cuda(cudaMemcpy(dev->all_tokens.data(), dev->tokens.as<void>(), world * 4, cudaMemcpyDeviceToHost),
             "reading the MoE layout");
  result->device = std::move(dev);
  return result;
}

// The checks both combines begin with; the dispatch's device half, made by this communicator.
const MoeDeviceResult* CudaComm::combine_source(const OpDesc& desc, DType dtype,
                                                const host::MoeDispatchResult& dispatch, const char* op) {
  require_bf16(dtype, op);
  check_usable();
  if (hosts_ != nullptr) unavailable(desc);
  const auto* dev = dynamic_cast<const CudaMoeResult*>(dispatch.device.get());
  FC_REQUIRE(dev != nullptr && dev->owner == this,
             std::string(op) + ": the dispatch must come from this communicator's moeDispatchGemm");
  return dev;
}

void CudaComm::moe_combine(const OpDesc& desc, DType dtype, const host::MoeDispatchResult& dispatch,
                           const void* expert_out, int64_t width, void* out) {
  constexpr const char* kOp = "moeCombine";
  const auto* dev = static_cast<const CudaMoeResult*>(combine_source(desc, dtype, dispatch, kOp));
  const host::MoeLayout& l = dispatch.layout;
  FC_REQUIRE(
      width >= 0 && width % 8 == 0 && width < (1 << 30),
      std::string(kOp) + " on the GPU: width must be a multiple of 8 (got " + std::to_string(width) + ")");
  FC_REQUIRE(aligned16(expert_out) && aligned16(out),
             std::string(kOp) + " on the GPU: expertOut and out must be 16-byte aligned device memory");
  require_fits(kOp, combine_area_bytes(*dev, l.topk, width));
  cudaStream_t s = begin(nullptr);
  k::MoeCombineArgs a;
  a.expert_out = static_cast<const __nv_bfloat16*>(expert_out);
  a.width = static_cast<int>(width);
  a.layout = dev->layout();
  a.num_experts = static_cast<int>(l.num_experts);
  a.topk = l.topk;
  a.capacity = dev->capacity;
  a.tokens = l.tokens;
  a.topk_weights = dev->topk_weights.as<float>();
  a.out = static_cast<__nv_bfloat16*>(out);
  a.ctas = shared_gpu_ctas(runtime_, sm_->world());
  check_fused_launch(k::launch_moe_combine(sm_->device(), a, s), kOp);
  end(s, true);
  const k::MoeStatus st = read_status(dev->status.as<k::MoeStatus>());
  if (st.code != k::kMoeOk)
    fail(ErrorKind::kCommunicator, std::string(kOp) + ": " + k::moe_status_name(st.code));
}

void CudaComm::moe_gemm_combine(const OpDesc& desc, DType dtype, const host::MoeDispatchResult& dispatch,
                                const void* h, int64_t k, const void* w2_local, WeightLayout layout,
                                int64_t width, void* out) {
  constexpr const char* kOp = "moeGemmCombine";
  const auto* dev = static_cast<const CudaMoeResult*>(combine_source(desc, dtype, dispatch, kOp));
  FC_REQUIRE(k >= 8 && k % 8 == 0 && width >= 8 && width % 8 == 0 && k < (1 << 30) && width < (1 << 30),
             std::string(kOp) + " on the GPU: k and width multiples of 8, at least 8 (got " +
                 std::to_string(k) + ", " + std::to_string(width) + ")");
  FC_REQUIRE(aligned16(h) && aligned16(w2_local) && aligned16(out),
             std::string(kOp) + " on the GPU: h, w2 and out must be 16-byte aligned device memory");
  const host::MoeLayout& l = dispatch.layout;
  require_fits(kOp, combine_area_bytes(*dev, l.topk, width));
  cudaStream_t s = begin(nullptr);
  k::MoeGemmCombineArgs a;
  a.h = static_cast<const __nv_bfloat16*>(h);
  a.rows = l.rows();
  a.k = static_cast<int>(k);
  a.w2 = static_cast<const __nv_bfloat16*>(w2_local);
  a.w2_layout = layout == WeightLayout::kKN ? k::GemmLayoutB::kKN : k::GemmLayoutB::kNK;
  a.width = static_cast<int>(width);
  a.layout = dev->layout();
  a.num_experts = static_cast<int>(l.num_experts);
  a.topk = l.topk;
  a.tokens = l.tokens;
  a.topk_weights = dev->topk_weights.as<float>();
  a.out = static_cast<__nv_bfloat16*>(out);
  const k::FusedAlgo algo = k::moe_gemm_combine_algo(sm_->device(), a);
  a.algo = algo;
  a.workspace_bytes =
      k::moe_gemm_combine_workspace_bytes(a.rows, static_cast<int>(l.local_experts), a.width, algo);
  a.workspace = workspace(a.workspace_bytes);
  moe_gemm_combine_path_ = algo == k::FusedAlgo::kFused ? "fused" : "decomposed";
  check_fused_launch(k::launch_moe_gemm_combine(sm_->device(), a, s), kOp);
  end(s, true);
  const k::MoeStatus st = read_status(dev->status.as<k::MoeStatus>());
  if (st.code != k::kMoeOk)
    fail(ErrorKind::kCommunicator, std::string(kOp) + ": " + k::moe_status_name(st.code));
}

void CudaComm::ring_attention(const OpDesc& desc, DType dtype, const host::AttentionShape& shape,
                              const void* q, const void* k, const void* v, void* o, float* lse,
                              cudaStream_t stream) {
  ring_attention_gpu(desc, dtype, ring_attention_shape(shape), q, k, v, o, lse, stream);
}

void CudaComm::ring_attention_backward(const OpDesc& desc, DType dtype, const host::AttentionShape& shape,
                                       const void* q, const void* k, const void* v, const void* o,
                                       const float* lse, const void* d_o, void* dq, void* dk, void* dv,
                                       cudaStream_t stream) {
  ring_attention_backward_gpu(desc, dtype, ring_attention_shape(shape), q, k, v, o, lse, d_o, dq, dk, dv,
                              stream);
}

// A ring on one host, in the form kernels::choose_ring_fwd_path picks: one persistent kernel per
// rank (kernels/attention/ring_fwd.h: the pulls and the tiles inside one launch), or the step
// pipeline below (kernels/attention/ring.h has the protocol and its ordering argument):
// every rank keeps two K/V buffers in its symmetric data area; at step s it computes the block
// of rank (r - s) mod W on the op's stream while the copy engine pulls the next block from its
// predecessor's buffer into its other buffer on the side stream, each copy gated by the ring's
// one-thread sync kernels (epoch-tagged flags, bounded waits naming the neighbour) and by
// events (a buffer is refilled only after this rank's attention on it). Step 0 reads the
// caller's k and v in place (where aligned for TMA). Partial results merge by log-sum-exp in fp32 (enqueue_ring_step).
// All stream-ordered: no host round trip between the steps. Memory per rank: two blocks.
// The copy engines rather than SM copies: a block is one contiguous range, so a copy needs no
// kernel of its own, takes no SMs from the attention kernel (whose grid fills the GPU) and
// needs no grid-wide completion counter before its flag: stream order completes it before the
// sync kernel that publishes it.
void CudaComm::ring_attention_gpu(const OpDesc&, DType dtype, const RingAttentionShape& shape, const void* q,
                                  const void* k, const void* v, void* o, float* lse, cudaStream_t stream) {
  constexpr const char* kOp = "ringAttention";
  require_bf16(dtype, kOp);
  require_ring_attention_shape(shape);
  if (hosts_ != nullptr) {
    ring_attention_hosts(shape, q, k, v, o, lse, stream);
    return;
  }
  const int world = sm_->world(), rank = sm_->rank();
  const int64_t s_r = ring_block_rows(shape, world, rank);
  const int64_t slot = ring_kv_slot_elems(shape, world);
  const uint64_t slot_bytes = (static_cast<uint64_t>(slot) * 2 + 255) / 256 * 256;
  // Step 0 reads the caller's k and v in place where the kernel's TMA can (16-byte aligned),
  // else this rank's packed copy in buffer 0.
  const bool in_place = aligned16(k) && aligned16(v);
  if (world > 1 || !in_place) require_fits(kOp, slot_bytes * (world > 1 ? 2 : 1));
  const uint64_t acc_bytes =
      (static_cast<uint64_t>(shape.batch * s_r * shape.q_heads * shape.head_dim) * 4 + 255) / 256 * 256;
  const uint64_t lse_bytes = (static_cast<uint64_t>(shape.batch * shape.q_heads * s_r) * 4 + 255) / 256 * 256;
  const bool persistent = ring_forward_path() == k::RingFwdPath::kPersistent;
  k::RingFwdArgs plan;
  if (persistent) ring_fwd_plan(shape, world, rank, plan);
  const uint64_t ctr_bytes = persistent ? k::ring_fwd_counter_words(plan) * 8 : 0;
  cudaStream_t s = begin(stream);
  // Workspace: [o_acc: B·S_r·Hq·D fp32, rounded up to 256 B][lse stand-in: B·Hq·S_r fp32, the
  // same][the persistent kernel's counters].
  char* work = static_cast<char*>(workspace(acc_bytes + lse_bytes + ctr_bytes + 256));
  float* o_acc = reinterpret_cast<float*>(work);
  float* lse_tmp = reinterpret_cast<float*>(work + acc_bytes);
  // Bytes of rank p's K (its V follows): its block's rows, not the buffer's.
  auto k_bytes = [&](int p) {
    return static_cast<size_t>(shape.batch * ring_block_rows(shape, world, p) * shape.kv_heads *
                               shape.head_dim) *
           2;
  };
  const k::CommDevice& dev = sm_->device();
  const int pred = (rank + world - 1) % world;
  // The two buffers, in every rank's data area at the same offsets.
  auto buffer = [&](int owner, int i) {
    return static_cast<char*>(static_cast<void*>(dev.base[owner])) + dev.data_offset + i * slot_bytes;
  };
  if (persistent) {
    // One launch (kernels/attention/ring_fwd.h): this rank's block packed into buffer 0 first
    // (stream order; step 0 reads k and v in place where TMA can), the pulls inside the kernel.
    plan.q = static_cast<const __nv_bfloat16*>(q);
    plan.o = static_cast<__nv_bfloat16*>(o);
    plan.lse = lse != nullptr ? lse : lse_tmp;
    plan.o_acc = o_acc;
    plan.counters = reinterpret_cast<uint64_t*>(work + acc_bytes + lse_bytes);
    plan.sig_size = k::comm_sig_hash(static_cast<uint64_t>(shape.batch), static_cast<uint64_t>(shape.seq),
                                     (static_cast<uint64_t>(shape.q_heads) << 32) |
                                         (static_cast<uint64_t>(shape.kv_heads) << 12) |
                                         (static_cast<uint64_t>(shape.head_dim) << 2) |
                                         (shape.causal ? 2u : 0u) | (shape.zigzag ? 1u : 0u));
    for (int step = 0; step < world; ++step) {
      const int owner = (rank - step + world) % world;
      k::RingFwdStep& st = plan.steps[step];
      st.rows = ring_block_rows(shape, world, owner);
      if (step == 0 && in_place) {
        st.k = k;
        st.v = v;
      } else {
        st.k = buffer(rank, step & 1);
        st.v = static_cast<const char*>(st.k) + k_bytes(owner);
      }
      if (step > 0) {
        st.pull_src = buffer(pred, (step - 1) & 1);
        st.pull_dst = buffer(rank, step & 1);
        st.pull_bytes = 2 * k_bytes(owner);
      }
    }
    if (world > 1 || !in_place) enqueue_ring_pack(shape, world, rank, k, v, buffer(rank, 0), s);
    check_cuda(k::launch_ring_fwd(dev, plan, s), "ringAttention: launching the ring kernel");
    end(s, stream == nullptr);
    return;
  }
  if (world == 1) {
    const void *kb = k, *vb = v;
    if (!in_place) {
      enqueue_ring_pack(shape, world, rank, k, v, sm_->data(), s);
      kb = sm_->data();
      vb = static_cast<const char*>(kb) + k_bytes(rank);
    }
    enqueue_ring_step(shape, world, rank, 0, q, kb, vb, o, lse, o_acc, lse_tmp, s);
    end(s, stream == nullptr);
    return;
  }
  make_ring_streams();
  k::RingSyncArgs sync;
  sync.sig_size = k::comm_sig_hash(
      static_cast<uint64_t>(shape.batch), static_cast<uint64_t>(shape.seq),
      (static_cast<uint64_t>(shape.q_heads) << 32) | (static_cast<uint64_t>(shape.kv_heads) << 12) |
          (static_cast<uint64_t>(shape.head_dim) << 2) | (shape.causal ? 2u : 0u) | (shape.zigzag ? 1u : 0u));
  auto enqueue_sync = [&](uint32_t publish, uint32_t wait, bool first, bool last) {
    k::RingSyncArgs a = sync;
    a.publish = publish;
    a.wait = wait;
    a.begin = first;
    a.finish = last;
    check_cuda(k::launch_ring_sync(dev, a, ring_side_), "ringAttention: launching the ring's sync kernel");
  };
  check_cuda(cudaEventRecord(ring_fork_, s), "cudaEventRecord");
  check_cuda(cudaStreamWaitEvent(ring_side_, ring_fork_, 0), "cudaStreamWaitEvent");
  enqueue_ring_pack(shape, world, rank, k, v, buffer(rank, 0), ring_side_);
  if (!in_place) {
    check_cuda(cudaEventRecord(ring_packed_, ring_side_), "cudaEventRecord");
    check_cuda(cudaStreamWaitEvent(s, ring_packed_, 0), "cudaStreamWaitEvent");
  }
  enqueue_sync(1, 1, true, false);
  for (int step = 0; step < world; ++step) {
    const int owner = (rank - step + world) % world;
    if (step + 1 < world) {
      // The pull of step + 1's block: pred's block of its step `step` (owner - 1).
      if (step > 0)
        check_cuda(cudaStreamWaitEvent(ring_side_, ring_computed_[step - 1], 0), "cudaStreamWaitEvent");
      const size_t bytes = k_bytes((owner - 1 + world) % world);
      if (bytes > 0) {
        check_cuda(cudaMemcpyAsync(buffer(rank, (step + 1) & 1), buffer(pred, step & 1), 2 * bytes,
                                   cudaMemcpyDeviceToDevice, ring_side_),
                   "ringAttention: copying a K/V block from the predecessor");
      }
      check_cuda(cudaEventRecord(ring_pulled_[step], ring_side_), "cudaEventRecord");
      enqueue_sync(static_cast<uint32_t>(step + 2), step + 2 < world ? static_cast<uint32_t>(step + 2) : 0,
                   false, false);
    }
    const void *kb = k, *vb = v;
    if (step > 0 || !in_place) {  // step 0: ordered after the pack above
      if (step > 0) check_cuda(cudaStreamWaitEvent(s, ring_pulled_[step - 1], 0), "cudaStreamWaitEvent");
      kb = buffer(rank, step & 1);
      vb = static_cast<const char*>(kb) + k_bytes(owner);
    }
    enqueue_ring_step(shape, world, rank, step, q, kb, vb, o, lse, o_acc, lse_tmp, s);
    check_cuda(cudaEventRecord(ring_computed_[step], s), "cudaEventRecord");
  }
  // End barrier: the successor's last pull from this rank's buffers is done.
  enqueue_sync(0, static_cast<uint32_t>(world), false, true);
  check_cuda(cudaEventRecord(ring_join_, ring_side_), "cudaEventRecord");
  check_cuda(cudaStreamWaitEvent(s, ring_join_, 0), "cudaStreamWaitEvent");
  end(s, stream == nullptr);
}

void CudaComm::make_ring_streams() {
  if (ring_side_ != nullptr) return;
  FC_REQUIRE(!capturing_,
             "ring attention: run it once before a CUDA graph captures it (its side stream and "
             "events are made at the first run)");
  int least = 0, greatest = 0;
  check_cuda(cudaDeviceGetStreamPriorityRange(&least, &greatest), "cudaDeviceGetStreamPriorityRange");
  check_cuda(cudaStreamCreateWithPriority(&ring_side_, cudaStreamNonBlocking, greatest),
             "cudaStreamCreateWithPriority");
  for (cudaEvent_t* e : {&ring_fork_, &ring_join_, &ring_packed_}) {
    check_cuda(cudaEventCreateWithFlags(e, cudaEventDisableTiming), "cudaEventCreate");
  }
  for (int i = 0; i < k::kCommMaxRanks; ++i) {
    check_cuda(cudaEventCreateWithFlags(&ring_pulled_[i], cudaEventDisableTiming), "cudaEventCreate");
    check_cuda(cudaEventCreateWithFlags(&ring_computed_[i], cudaEventDisableTiming), "cudaEventCreate");
    check_cuda(cudaEventCreateWithFlags(&ring_grads_pulled_[i], cudaEventDisableTiming), "cudaEventCreate");
  }
}

// ---- workspaces -----------------------------------------------------------------------------

// Grows (never shrinks) this communicator's private device buffer. Growing waits for the
// previous op, which may still use the old buffer; the caller has not enqueued anything of its
// op yet.
void* CudaComm::workspace(uint64_t bytes) {
  if (bytes <= work_bytes_) return work_;
  if (capturing_) {
    // Growing frees and allocates, which a capture forbids (and a replay could not see).
    fail(ErrorKind::kInvalidArgument,
         "this op needs " + std::to_string(bytes) + " bytes of the communicator's workspace, more than the " +
             std::to_string(work_bytes_) +
             " it has, and the stream is capturing a CUDA graph: run the op "
             "(or a larger one of its kind) once before the capture; the workspace only grows");
  }
  if (any_op_) check_cuda(cudaEventSynchronize(last_done_), "waiting for the previous op");
  if (work_ != nullptr) check_cuda(cudaFree(work_), "cudaFree (workspace)");
  work_ = nullptr;
  work_bytes_ = 0;
  check_cuda(cudaMalloc(&work_, bytes), "cudaMalloc of the workspace (" + std::to_string(bytes) + " bytes)");
  work_bytes_ = bytes;
  return work_;
}

k::GemmWorkspace CudaComm::gemm_workspace(cudaStream_t s) {
  if (gemm_ws_.ptr == nullptr && !gemm_ws_tried_ && !capturing_) {
    gemm_ws_tried_ = true;
    gemm_ws_ = make_gemm_workspace(s);
  }
  return gemm_ws_;
}

k::GemmArgs CudaComm::with_gemm_workspace(k::GemmArgs g, cudaStream_t s) {
  k::use_workspace(g, gemm_workspace(s));
  return g;
}

// ---- teardown -------------------------------------------------------------------------------

void CudaComm::raise_device_failure() {
  try {
    // The link first: its error names the remote rank, where the symmetric memory's says only
    // that a step between hosts failed (kCommHostsFailed).
    if (hosts_ != nullptr) hosts_->raise_if_failed();
    sm_->raise_if_failed();
  } catch (...) {
    failed_ = true;
    throw;
  }
}

void CudaComm::synchronize() {
  if (closed_ || gpu_closed_ || !any_op_) return;
  pin_gpu(runtime_.gpu().ordinal);
  check_cuda(cudaEventSynchronize(last_done_), "waiting for the communicator's ops");
  raise_device_failure();
}

void CudaComm::finish() {
  synchronize();
  host_.finish();
}

void CudaComm::abort_gpu() noexcept {
  failed_ = true;
  if (sm_ != nullptr) sm_->abort();
  if (hosts_ != nullptr) hosts_->abort();
}

void CudaComm::abort() noexcept {
  abort_gpu();
  host_.abort();
}

void CudaComm::close() {
  if (closed_) return;
  try {
    synchronize();
    host_.close();
  } catch (...) {
    // The region is dropped, not pooled; peers learn at once that this rank left.
    closed_ = true;
    abort_gpu();
    close_gpu();
    host_.abort();
    try {
      host_.close();
    } catch (...) {}
    throw;
  }
  closed_ = true;
  close_gpu();
}

// Waits for this rank's ops (best effort), unmaps peers, and returns the region to the pool
// unless something failed. The caller has passed a barrier with every rank first (or aborted),
// so no peer still uses this rank's memory.
void CudaComm::close_gpu() noexcept {
  if (gpu_closed_) return;
  gpu_closed_ = true;
  if (sm_ != nullptr) {
    try {
      pin_gpu(runtime_.gpu().ordinal);
      if (hosts_ != nullptr) {
        // The link's kernels need its proxy until they end (or give up: abort()).
        cudaDeviceSynchronize();
        if (hosts_->failed()) failed_ = true;
        hosts_->close(!failed_);
      }
      sm_->close();  // synchronises the device first
      std::unique_ptr<SymmetricRegion> region = failed_ ? nullptr : sm_->take_region();
      if (region != nullptr) runtime_.release_region(std::move(region));
    } catch (...) {
      // close_gpu() never throws: a failing GPU here is reported by the next op on the runtime.
    }
  }
  hosts_.reset();
  local_.reset();
  sm_.reset();
  ag_side_.reset();  // its copies ended with the device synchronisation above
  if (work_ != nullptr) cudaFree(work_);
  work_ = nullptr;
  if (gemm_ws_.ptr != nullptr) cudaFree(gemm_ws_.ptr);
  gemm_ws_ = k::GemmWorkspace{};
  for (cudaEvent_t& e : ring_pulled_) {
    if (e != nullptr) cudaEventDestroy(e);
    e = nullptr;
  }
  for (cudaEvent_t& e : ring_computed_) {
    if (e != nullptr) cudaEventDestroy(e);
    e = nullptr;
  }
  for (cudaEvent_t& e : ring_grads_pulled_) {
    if (e != nullptr) cudaEventDestroy(e);
    e = nullptr;
  }
  for (cudaEvent_t* e : {&ring_fork_, &ring_join_, &ring_packed_}) {
    if (*e != nullptr) cudaEventDestroy(*e);
    *e = nullptr;
  }
  if (ring_side_ != nullptr) cudaStreamDestroy(ring_side_);
  ring_side_ = nullptr;
  if (last_done_ != nullptr) cudaEventDestroy(last_done_);
  if (own_ != nullptr) cudaStreamDestroy(own_);
  last_done_ = nullptr;
  own_ = nullptr;
  cudaGetLastError();
}

}  // namespace fusedcomm
