#include "fusedcomm/runtime/device_gemm.h"

#include <cuda_runtime_api.h>

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "fusedcomm/host/host_ops.h"
#include "fusedcomm/runtime/errors.h"
#include "kernels/gemm/gemm.h"
#include "kernels/moe/moe.h"

namespace fusedcomm {

namespace {

// The stream-K workspace of one device (kernels/gemm/gemm.h "Stream-K"; gemm_workspace_bytes(), ~33
// MiB on a 132-SM GPU): made by the first device_gemm_bf16 on that device and kept for the
// process's life (the driver frees it at exit), so that every later GEMM the launch runs with
// stream-K (small M, long K) finds it. Launches sharing it must not overlap: `mu` is held from
// launch to synchronisation.
struct SkWorkspace {
  std::mutex mu;
  kernels::GemmWorkspace ws;
  // The staged launch's copies (kernels/gemm/gemm.h, launch_gemm_staged), grown to the largest
  // need so far and kept, as the workspace is: an allocation per call would cost large GEMMs
  // more than the copy itself.
  void* staging = nullptr;
  size_t staging_bytes = 0;
  // The grouped GEMM's workspace (its block table) followed by the groups' offsets, grown to
  // the largest need so far and kept, for the same reason.
  void* grouped = nullptr;
  size_t grouped_bytes = 0;
};

// The current device's workspace, made on first use (on the legacy stream, which the GEMMs
// use too). A device whose allocation fails gets none: its GEMMs run without stream-K.
SkWorkspace& sk_workspace(int device) {
  static std::mutex registry_mu;
  static std::map<int, std::unique_ptr<SkWorkspace>>* registry =
      new std::map<int, std::unique_ptr<SkWorkspace>>();  // never destroyed: outlives static teardown
  std::lock_guard<std::mutex> lock(registry_mu);
  std::unique_ptr<SkWorkspace>& ws = (*registry)[device];
  if (!ws) {
    ws = std::make_unique<SkWorkspace>();
    ws->ws = make_gemm_workspace(nullptr);
  }
  return *ws;
}

}  // namespace

kernels::GemmWorkspace make_gemm_workspace(cudaStream_t s) {
  const size_t bytes = kernels::gemm_workspace_bytes(0);
  void* p = nullptr;
  if (bytes > 0 && cudaMalloc(&p, bytes) == cudaSuccess && cudaMemsetAsync(p, 0, bytes, s) == cudaSuccess) {
    return kernels::GemmWorkspace{p, bytes};
  }
  if (p != nullptr) cudaFree(p);
  cudaGetLastError();  // no workspace only costs stream-K; the GEMM reports its own failures
  return {};
}

kernels::GemmArgs dense_gemm_args(const void* a, const void* w, void* c, int64_t m, int64_t n, int64_t k,
                                  WeightLayout layout, kernels::GemmOutType c_type) {
  const bool nk = layout == WeightLayout::kNK;
  kernels::GemmArgs g;
  g.A = static_cast<const __nv_bfloat16*>(a);
  g.B = static_cast<const __nv_bfloat16*>(w);
  g.C = c;
  g.M = static_cast<int>(m);
  g.N = static_cast<int>(n);
  g.K = static_cast<int>(k);
  g.lda = k;
  g.ldb = nk ? k : n;
  g.ldc = n;
  g.b_layout = nk ? kernels::GemmLayoutB::kNK : kernels::GemmLayoutB::kKN;
  g.c_type = c_type;
  return g;
}

void device_gemm_bf16(const void* a, const void* w, void* c, int64_t m, int64_t n, int64_t k,
                      WeightLayout layout) {
  const std::string shape = std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k);
  FC_REQUIRE(m >= 0 && n >= 0 && k >= 0, "gemm: negative dimension in " + shape);
  if (m == 0 || n == 0) return;
  FC_REQUIRE(k > 0, "gemm on the GPU needs K >= 1, got MxNxK = " + shape);
  FC_REQUIRE(m < (int64_t{1} << 31) && n < (int64_t{1} << 31) && k < (int64_t{1} << 31),
             "gemm: dimension too large in " + shape);
  for (const void* p : {a, w, static_cast<const void*>(c)}) {
    FC_REQUIRE(reinterpret_cast<uintptr_t>(p) % 16 == 0, "gemm: device pointers must be 16-byte aligned");
  }
  kernels::GemmArgs args = dense_gemm_args(a, w, c, m, n, k, layout, kernels::GemmOutType::kBF16);
  int device = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e != cudaSuccess) {
    fail(ErrorKind::kFatalGpu, "gemm " + shape + ": no current device: " + cudaGetErrorString(e));
  }
  SkWorkspace& ws = sk_workspace(device);
  std::lock_guard<std::mutex> lock(ws.mu);
  kernels::use_workspace(args, ws.ws);
  // K or N off the multiple of 8 (or rows off the 128-byte lines of a large GEMM): the staged
  // launch copies A or W into rows TMA reads well (kernels/gemm/gemm.h), in the device's buffer.
  if (const size_t need = kernels::gemm_staging_bytes(args); need > ws.staging_bytes) {
    if (ws.staging != nullptr) cudaFree(ws.staging);  // after the previous call's sync
    ws.staging = nullptr;
    ws.staging_bytes = 0;
    if ((e = cudaMalloc(&ws.staging, need)) != cudaSuccess) {
      cudaGetLastError();
      fail(ErrorKind::kFatalGpu, "gemm " + shape + ": no memory for the staged operands (" +
                                     std::to_string(need) + " bytes): " + cudaGetErrorString(e));
    }
    ws.staging_bytes = need;
  }
  e = kernels::launch_gemm_staged(args, ws.staging, ws.staging_bytes, nullptr);
  if (e == cudaSuccess) e = cudaStreamSynchronize(nullptr);
  if (e == cudaErrorInvalidValue)
    fail(ErrorKind::kInvalidArgument, "gemm: the GEMM engine rejected " + shape);
  if (e != cudaSuccess) {
    fail(ErrorKind::kFatalGpu,
         "gemm " + shape + " failed on the GPU: " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
  }
}

void device_grouped_gemm_bf16(const void* a, const void* w, void* c, const int64_t* offsets, int64_t groups,
                              int64_t rows, int64_t n, int64_t k, WeightLayout layout) {
  constexpr const char* kOp = "groupedGemm";
  const std::string shape = std::to_string(groups) + " groups, rows x n x k = " + std::to_string(rows) + "x" +
                            std::to_string(n) + "x" + std::to_string(k);
  FC_REQUIRE(n >= 0 && k >= 0, std::string(kOp) + ": negative dimension in " + shape);
  host::require_group_offsets(kOp, offsets, groups, rows);
  FC_REQUIRE(groups <= kernels::kMoeMaxExperts, std::string(kOp) + " on the GPU takes at most " +
                                                    std::to_string(kernels::kMoeMaxExperts) +
                                                    " groups, got " + std::to_string(groups));
  if (groups == 0 || offsets[groups] == offsets[0] || n == 0) return;  // no row to write
  FC_REQUIRE(n % 8 == 0 && k % 8 == 0 && k > 0,
             std::string(kOp) + " on the GPU needs n and k to be positive multiples of 8, got " + shape);
  FC_REQUIRE(rows < (int64_t{1} << 31) && n < (int64_t{1} << 31) && k < (int64_t{1} << 31),
             std::string(kOp) + ": dimension too large in " + shape);
  for (const void* p : {a, w, static_cast<const void*>(c)}) {
    FC_REQUIRE(reinterpret_cast<uintptr_t>(p) % 16 == 0,
               std::string(kOp) + ": device pointers must be 16-byte aligned");
  }
  // One buffer of the device's (kept between calls, held under its lock until the GEMM has
  // completed): the launcher's workspace (256-byte aligned, as cudaMalloc returns), then the
  // offsets.
  const size_t ws_bytes =
      (kernels::grouped_gemm_workspace_bytes(rows, static_cast<int>(groups)) + 255) & ~size_t{255};
  const size_t off_bytes = static_cast<size_t>(groups + 1) * sizeof(int64_t);
  int device = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e != cudaSuccess) {
    fail(ErrorKind::kFatalGpu,
         std::string(kOp) + " " + shape + ": no current device: " + cudaGetErrorString(e));
  }
  SkWorkspace& cache = sk_workspace(device);
  std::lock_guard<std::mutex> lock(cache.mu);
  if (cache.grouped_bytes < ws_bytes + off_bytes) {
    if (cache.grouped != nullptr) cudaFree(cache.grouped);  // after the previous call's sync
    cache.grouped = nullptr;
    cache.grouped_bytes = 0;
    if ((e = cudaMalloc(&cache.grouped, ws_bytes + off_bytes)) != cudaSuccess) {
      cudaGetLastError();
      fail(ErrorKind::kState, std::string(kOp) + ": cudaMalloc of " + std::to_string(ws_bytes + off_bytes) +
                                  " bytes of workspace failed: " + cudaGetErrorString(e));
    }
    cache.grouped_bytes = ws_bytes + off_bytes;
  }
  void* buf = cache.grouped;
  auto* dev_offsets = reinterpret_cast<int64_t*>(static_cast<uint8_t*>(buf) + ws_bytes);
  e = cudaMemcpy(dev_offsets, offsets, off_bytes, cudaMemcpyHostToDevice);
  kernels::GroupedGemmArgs g;
  g.A = static_cast<const __nv_bfloat16*>(a);
  g.rows_capacity = rows;
  g.offsets = dev_offsets;
  g.groups = static_cast<int>(groups);
  g.B = static_cast<const __nv_bfloat16*>(w);
  g.b_layout = layout == WeightLayout::kNK ? kernels::GemmLayoutB::kNK : kernels::GemmLayoutB::kKN;
  g.N = static_cast<int>(n);
  g.K = static_cast<int>(k);
  g.C = static_cast<__nv_bfloat16*>(c);
  g.workspace = buf;
  g.workspace_bytes = ws_bytes;
  if (e == cudaSuccess) e = kernels::launch_grouped_gemm(g, nullptr);
  const bool rejected = e == cudaErrorInvalidValue;
  if (e == cudaSuccess) e = cudaStreamSynchronize(nullptr);
  if (rejected) fail(ErrorKind::kInvalidArgument, std::string(kOp) + ": the GEMM engine rejected " + shape);
  if (e != cudaSuccess) {
    fail(ErrorKind::kFatalGpu, std::string(kOp) + " " + shape + " failed on the GPU: " + cudaGetErrorName(e) +
                                   ": " + cudaGetErrorString(e));
  }
}

}  // namespace fusedcomm
