// libfc_moe_bench.so: our grouped GEMM (kernels/moe/moe.h, launch_grouped_gemm) behind one C
// entry point, so that torch_moe.py can time it beside torch._grouped_mm and dense cuBLAS in
// one process, interleaved, on the same tensors (ctypes). The workspace is made on first use
// and kept (one per process and device, grown as shapes need): a call allocates nothing.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/moe/moe.h"

namespace k = fusedcomm::kernels;

namespace {
void* g_ws = nullptr;
size_t g_ws_bytes = 0;
int g_ws_device = -1;
}  // namespace

// C[rows of group g] = A[rows of g] · W_gᵀ (kn = 0, W: groups × N × K) or A · W_g (kn = 1, W:
// groups × K × N); offsets: groups + 1 int64 row offsets on the device. tile_n, num_ctas,
// group_m, tma_store: the launch's choices forced (0 leaves each to the launch; moe.h's
// GroupedGemmArgs), for A/B runs.
// Returns the launch's cudaError_t (0: enqueued).
extern "C" __attribute__((visibility("default"))) int fc_grouped_gemm_bf16_forced(
    const void* A, const void* W, void* C, const int64_t* offsets, int groups, long rows, int N, int K,
    int kn, void* stream, int tile_n, int num_ctas, int group_m, int tma_store) {
  int device = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e != cudaSuccess) return static_cast<int>(e);
  const size_t need = k::grouped_gemm_workspace_bytes(rows, groups);
  if (g_ws == nullptr || g_ws_device != device || g_ws_bytes < need) {
    // A shape's first call (its check, untimed) grows the buffer; timed calls find it.
    if (g_ws != nullptr && (e = cudaFree(g_ws)) != cudaSuccess) return static_cast<int>(e);
    g_ws = nullptr;
    g_ws_bytes = 0;
    if ((e = cudaMalloc(&g_ws, need)) != cudaSuccess) return static_cast<int>(e);
    g_ws_bytes = need;
    g_ws_device = device;
  }
  k::GroupedGemmArgs a;
  a.A = static_cast<const __nv_bfloat16*>(A);
  a.rows_capacity = rows;
  a.offsets = offsets;
  a.groups = groups;
  a.B = static_cast<const __nv_bfloat16*>(W);
  a.b_layout = kn ? k::GemmLayoutB::kKN : k::GemmLayoutB::kNK;
  a.N = N;
  a.K = K;
  a.C = static_cast<__nv_bfloat16*>(C);
  a.workspace = g_ws;
  a.workspace_bytes = g_ws_bytes;
  a.tile_n = tile_n;
  a.num_ctas = num_ctas;
  a.group_m = group_m;
  a.tma_store = tma_store;
  return static_cast<int>(k::launch_grouped_gemm(a, static_cast<cudaStream_t>(stream)));
}

extern "C" __attribute__((visibility("default"))) int fc_grouped_gemm_bf16(const void* A, const void* W,
                                                                           void* C, const int64_t* offsets,
                                                                           int groups, long rows, int N,
                                                                           int K, int kn, void* stream) {
  return fc_grouped_gemm_bf16_forced(A, W, C, offsets, groups, rows, N, K, kn, stream, 0, 0, 0, 0);
}
