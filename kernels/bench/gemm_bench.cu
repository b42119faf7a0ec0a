// gemm_bench: times launch_gemm on a list of shapes with CUDA events (one event pair per launch,
// median over the timed launches after warm-up) and prints one JSON object per shape.
//
//   gemm_bench <shapes.txt> [warmup=10] [iters=50]
//
// shapes.txt: one shape per line, "<op> <M> <N> <K> <nk|kn> [tile_n]" (op is a free label, e.g.
// the layer name). Inputs are uniform random bf16 in [-1, 1) (never zeros: see METHOD.md).
#include "fusedcomm/kernels/gemm.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

using namespace fusedcomm::kernels;

#define CHECK_CUDA(x)                                                                          \
  do {                                                                                         \
    cudaError_t e_ = (x);                                                                      \
    if (e_ != cudaSuccess) {                                                                   \
      std::fprintf(stderr, "%s:%d: %s -> %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                            \
    }                                                                                          \
  } while (0)

__global__ void fill_uniform(__nv_bfloat16* p, size_t n, uint64_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    uint64_t x = (seed ^ (i * 0x9E3779B97F4A7C15ull)) + 0x632BE59BD9B4E019ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    x ^= x >> 31;
    p[i] = __float2bfloat16(static_cast<float>(x >> 40) * (2.0f / 16777216.0f) - 1.0f);
  }
}

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s shapes.txt [warmup] [iters]\n", argv[0]);
    return 2;
  }
  const int warmup = argc > 2 ? std::atoi(argv[2]) : 10;
  const int iters = argc > 3 ? std::atoi(argv[3]) : 50;
  int dev_count = 0;
  if (cudaGetDeviceCount(&dev_count) != cudaSuccess || dev_count == 0) {
    std::printf("SKIP: no CUDA GPU\n");
    return 77;
  }
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));

  std::ifstream in(argv[1]);
  std::string line;
  cudaEvent_t ev0, ev1;
  CHECK_CUDA(cudaEventCreate(&ev0));
  CHECK_CUDA(cudaEventCreate(&ev1));
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream ss(line);
    std::string op, layout;
    int M, N, K, tile_n = 0;
    ss >> op >> M >> N >> K >> layout;
    if (!(ss >> tile_n)) tile_n = 0;
    const bool kn = layout == "kn";
    __nv_bfloat16 *A, *B, *C;
    CHECK_CUDA(cudaMalloc(&A, size_t(M) * K * 2));
    CHECK_CUDA(cudaMalloc(&B, size_t(N) * K * 2));
    CHECK_CUDA(cudaMalloc(&C, size_t(M) * N * 2));
    fill_uniform<<<1024, 256>>>(A, size_t(M) * K, 1);
    fill_uniform<<<1024, 256>>>(B, size_t(N) * K, 2);
    CHECK_CUDA(cudaGetLastError());
    GemmArgs a;
    a.A = A;
    a.B = B;
    a.C = C;
    a.lda = K;
    a.ldb = kn ? N : K;
    a.ldc = N;
    a.M = M;
    a.N = N;
    a.K = K;
    a.b_layout = kn ? GemmLayoutB::kKN : GemmLayoutB::kNK;
    a.tile_n = tile_n;
    for (int i = 0; i < warmup; ++i) CHECK_CUDA(launch_gemm(a, nullptr));
    std::vector<float> ms(iters);
    for (int i = 0; i < iters; ++i) {
      CHECK_CUDA(cudaEventRecord(ev0));
      CHECK_CUDA(launch_gemm(a, nullptr));
      CHECK_CUDA(cudaEventRecord(ev1));
      CHECK_CUDA(cudaEventSynchronize(ev1));
      CHECK_CUDA(cudaEventElapsedTime(&ms[i], ev0, ev1));
    }
    std::sort(ms.begin(), ms.end());
    const double med = ms[iters / 2];
    const double tflops = 2.0 * M * N * K / (med * 1e-3) / 1e12;
    const GemmTileGrid g = gemm_tile_grid(M, N, tile_n, 0);
    std::printf(
        "{\"op\": \"%s\", \"impl\": \"fusedcomm\", \"M\": %d, \"N\": %d, \"K\": %d, "
        "\"layout\": \"%s\", \"dtype\": \"bf16\", \"tile_n\": %d, \"ms_median\": %.5f, "
        "\"ms_min\": %.5f, \"tflops\": %.1f, \"device\": \"%s\"}\n",
        op.c_str(), M, N, K, layout.c_str(), g.tile_n, med, ms[0], tflops, prop.name);
    std::fflush(stdout);
    CHECK_CUDA(cudaFree(A));
    CHECK_CUDA(cudaFree(B));
    CHECK_CUDA(cudaFree(C));
  }
  return 0;
}
