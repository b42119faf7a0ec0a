// libfc_gemm_bench.so: our GEMM behind one C entry point, so that torch_gemm.py can time ours
// and cuBLAS in one process, interleaved, on the same tensors (ctypes). The launch is
// gemm_bench's: a stream-K workspace (made on first use, one per process and device), every plan
// choice left to the launch.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include "kernels/gemm/gemm.h"

namespace k = fusedcomm::kernels;

namespace {
k::GemmWorkspace g_ws;
int g_ws_device = -1;
}  // namespace

// C = A·Bᵀ (kn = 0, B: N×K) or A·B (kn = 1, B: K×N), dense row-major bf16, on `stream`.
// Returns the launch's cudaError_t (0: enqueued).
extern "C" __attribute__((visibility("default"))) int fc_gemm_bf16(const void* A, const void* B, void* C,
                                                                   int M, int N, int K, int kn,
                                                                   void* stream) {
  int device = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e != cudaSuccess) return static_cast<int>(e);
  if (g_ws.ptr == nullptr || g_ws_device != device) {
    if (g_ws.ptr != nullptr) cudaFree(g_ws.ptr);
    g_ws = {};
    const size_t bytes = k::gemm_workspace_bytes(0);
    if ((e = cudaMalloc(&g_ws.ptr, bytes)) != cudaSuccess) return static_cast<int>(e);
    if ((e = cudaMemset(g_ws.ptr, 0, bytes)) != cudaSuccess) return static_cast<int>(e);
    g_ws.bytes = bytes;
    g_ws_device = device;
  }
  k::GemmArgs a;
  a.A = static_cast<const __nv_bfloat16*>(A);
  a.B = static_cast<const __nv_bfloat16*>(B);
  a.C = C;
  a.lda = K;
  a.ldb = kn ? N : K;
  a.ldc = N;
  a.M = M;
  a.N = N;
  a.K = K;
  a.b_layout = kn ? k::GemmLayoutB::kKN : k::GemmLayoutB::kNK;
  k::use_workspace(a, g_ws);
  return static_cast<int>(k::launch_gemm(a, static_cast<cudaStream_t>(stream)));
}
