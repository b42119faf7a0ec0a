// gemm_bench: times launch_gemm on a list of shapes with CUDA events (one event pair per launch,
// median over the timed launches after warm-up) and prints one JSON object per shape. Built
// also as libfc_gemm_bench.so, whose fc_gemm_bf16() lets run_gemm_bench.py time ours and
// cuBLAS interleaved in one process on the same tensors.
//
//   gemm_bench <shapes.txt> [warmup=10] [iters=50] [cluster=0] [stream_k=-1] [pingpong=0]
//
// cluster: GemmArgs::cluster for every shape (0 chosen, 1 single CTAs, 2 CTA pairs), for A/B
// runs of one build (ab_gemm.sh <dir>@1 <dir>@2). stream_k: GemmArgs::stream_k with a
// workspace (0 chosen, 1 off, 2 forced), or -1: no workspace (ab_gemm.sh <dir>@1:2).
// pingpong: GemmArgs::pingpong (0 chosen, 1 off, 2 wherever allowed; ab_gemm.sh <dir>@0:-1:2).
// shapes.txt: one shape per line, "<op> <M> <N> <K> <nk|kn> [tile_n] [f32]" (op is a free
// label, e.g. the layer name; f32: C in fp32, else bf16). Inputs are uniform random bf16 in
// [-1, 1) (never zeros: see METHOD.md).
#include "kernels/gemm/gemm.h"

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

// GemmArgs::cluster for fc_gemm_bf16 (run_gemm_bench.py --cluster).
static int g_cluster = 0;
extern "C" __attribute__((visibility("default"))) void fc_gemm_set_cluster(int cluster) {
  g_cluster = cluster;
}

// GemmArgs::group_m for fc_gemm_bf16 (gemm_power_probe.py --group-ms), 0: the launch's default.
static int g_group_m = 0;
extern "C" __attribute__((visibility("default"))) void fc_gemm_set_group_m(int group_m) {
  g_group_m = group_m;
}

// A stream-K workspace for every launch of this process (launches on one stream at a time).
static void* g_workspace = nullptr;
static size_t g_workspace_bytes = 0;
static int g_stream_k = -1;
static void set_stream_k(GemmArgs& a, int mode) {
  if (mode < 0) return;
  if (g_workspace == nullptr) {
    g_workspace_bytes = gemm_workspace_bytes(0);
    CHECK_CUDA(cudaMalloc(&g_workspace, g_workspace_bytes));
    CHECK_CUDA(cudaMemset(g_workspace, 0, g_workspace_bytes));
  }
  a.workspace = g_workspace;
  a.workspace_bytes = g_workspace_bytes;
  a.stream_k = mode;
}
// GemmArgs::stream_k for fc_gemm_bf16 (run_gemm_bench.py --stream-k), -1: no workspace.
extern "C" __attribute__((visibility("default"))) void fc_gemm_set_stream_k(int mode) {
  g_stream_k = mode;
}

// C entry point for run_gemm_bench.py (ctypes): C = A·Bᵀ (kn = 0) or A·B (kn = 1), packed
// row-major bf16 operands and output, on `stream`. Returns the cudaError_t of the launch.
extern "C" __attribute__((visibility("default"))) int fc_gemm_bf16(
    const void* A, const void* B, void* C, int M, int N, int K, int kn, int tile_n,
    void* stream) {
  GemmArgs a;
  a.A = static_cast<const __nv_bfloat16*>(A);
  a.B = static_cast<const __nv_bfloat16*>(B);
  a.C = C;
  a.lda = K;
  a.ldb = kn ? N : K;
  a.ldc = N;
  a.M = M;
  a.N = N;
  a.K = K;
  a.b_layout = kn ? GemmLayoutB::kKN : GemmLayoutB::kNK;
  a.tile_n = tile_n;
  a.cluster = g_cluster;
  a.group_m = g_group_m;
  set_stream_k(a, g_stream_k);
  return static_cast<int>(launch_gemm(a, static_cast<cudaStream_t>(stream)));
}

extern "C" __attribute__((visibility("default"))) int fc_gemm_tile_n(int M, int N, int tile_n) {
  return gemm_tile_grid(M, N, tile_n, 0).tile_n;
}

#if defined(FC_GEMM_TRACE)
extern "C" int fc_gemm_trace_copy(uint64_t* host, size_t count);
extern "C" int fc_gemm_pp_timeline_copy(uint64_t* host);
#endif

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s shapes.txt [warmup] [iters] [cluster] [stream_k] [pingpong]\n",
                 argv[0]);
    return 2;
  }
  const int warmup = argc > 2 ? std::atoi(argv[2]) : 10;
  const int iters = argc > 3 ? std::atoi(argv[3]) : 50;
  const int cluster = argc > 4 ? std::atoi(argv[4]) : 0;
  const int stream_k = argc > 5 ? std::atoi(argv[5]) : -1;
  const int pingpong = argc > 6 ? std::atoi(argv[6]) : 0;
  int dev_count = 0;
  if (cudaGetDeviceCount(&dev_count) != cudaSuccess || dev_count == 0) {
    std::printf("SKIP: no CUDA GPU\n");
    return 77;
  }
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));

  std::ifstream in(argv[1]);
  std::string line;
  while (std::getline(in, line)) {
    line = line.substr(0, line.find('#'));  // comments: whole lines or after a shape
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    std::istringstream ss(line);
    std::string op, layout, tok;
    int M, N, K, tile_n = 0;
    bool c_f32 = false;
    ss >> op >> M >> N >> K >> layout;
    while (ss >> tok) {
      if (tok == "f32") {
        c_f32 = true;
      } else {
        tile_n = std::atoi(tok.c_str());
      }
    }
    const bool kn = layout == "kn";
    __nv_bfloat16 *A, *B;
    void* C;
    CHECK_CUDA(cudaMalloc(&A, size_t(M) * K * 2));
    CHECK_CUDA(cudaMalloc(&B, size_t(N) * K * 2));
    CHECK_CUDA(cudaMalloc(&C, size_t(M) * N * (c_f32 ? 4 : 2)));
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
    a.c_type = c_f32 ? GemmOutType::kF32 : GemmOutType::kBF16;
    a.tile_n = tile_n;
    a.cluster = cluster;
    a.pingpong = pingpong;
    set_stream_k(a, stream_k);
    GemmLaunchPlan plan{};
    CHECK_CUDA(gemm_launch_plan(a, &plan));
    for (int i = 0; i < warmup; ++i) CHECK_CUDA(launch_gemm(a, nullptr));
    // One event pair per launch, no sync in between: the queue stays full, so host launch
    // latency stays out of the device times.
    std::vector<cudaEvent_t> e0(iters), e1(iters);
    for (int i = 0; i < iters; ++i) {
      CHECK_CUDA(cudaEventCreate(&e0[i]));
      CHECK_CUDA(cudaEventCreate(&e1[i]));
    }
    for (int i = 0; i < iters; ++i) {
      CHECK_CUDA(cudaEventRecord(e0[i]));
      CHECK_CUDA(launch_gemm(a, nullptr));
      CHECK_CUDA(cudaEventRecord(e1[i]));
    }
    CHECK_CUDA(cudaDeviceSynchronize());
    std::vector<float> ms(iters);
    for (int i = 0; i < iters; ++i) {
      CHECK_CUDA(cudaEventElapsedTime(&ms[i], e0[i], e1[i]));
      cudaEventDestroy(e0[i]);
      cudaEventDestroy(e1[i]);
    }
#if defined(FC_GEMM_TRACE)
    {  // one more launch, alone: where its CTAs spend the time (µs from the first CTA's start)
      constexpr int kPts = 12;  // trace points per warpgroup: detail::kGemmTraceWords
      std::vector<uint64_t> tr(1024 * 2 * kPts, 0);
      CHECK_CUDA(static_cast<cudaError_t>(fc_gemm_trace_copy(nullptr, tr.size())));
      CHECK_CUDA(static_cast<cudaError_t>(fc_gemm_pp_timeline_copy(nullptr)));
      CHECK_CUDA(launch_gemm(a, nullptr));
      CHECK_CUDA(cudaDeviceSynchronize());
      CHECK_CUDA(static_cast<cudaError_t>(fc_gemm_trace_copy(tr.data(), tr.size())));
      uint64_t t0 = ~0ull;
      for (int c = 0; c < 2 * plan.ctas; ++c) t0 = std::min(t0, tr[c * kPts]);
      auto pct = [&](int point, double q) {
        std::vector<double> v;
        for (int c = 0; c < plan.ctas; ++c)
          for (int w = 0; w < 2; ++w) v.push_back((tr[(c * 2 + w) * kPts + point] - t0) * 1e-3);
        std::sort(v.begin(), v.end());
        return v[std::min(v.size() - 1, size_t(q * v.size()))];
      };
      int sums = 0;
      uint64_t gap = 0, gaps = 0, epi = 0, waitn = 0;
      for (int c = 0; c < plan.ctas; ++c) {
        sums += int(tr[(c * 2) * kPts + 5] + tr[(c * 2 + 1) * kPts + 5]);
        // Ping-pong: each warpgroup its own tiles (7: tiles after its first, 8: epilogues,
        // 9: waits for the turn and the first slice of those tiles); otherwise warpgroup 0
        // speaks for the tile.
        for (int w = 0; w < (plan.pingpong ? 2 : 1); ++w) {
          gap += tr[(c * 2 + w) * kPts + 6];
          gaps += tr[(c * 2 + w) * kPts + 7];
          epi += tr[(c * 2 + w) * kPts + 8];
          waitn += tr[(c * 2 + w) * kPts + 9];
        }
      }
      std::printf("trace %s %dx%dx%d sk=%d:", op.c_str(), M, N, K, plan.stream_k_tiles);
      const char* names[5] = {"start", "whole", "sk_main", "barrier", "end"};
      for (int p = 0; p < 5; ++p) {
        // Points 2 and 3 are stream-K's: never written without it.
        if ((plan.pingpong || plan.stream_k_tiles == 0) && (p == 2 || p == 3)) continue;
        std::printf(" %s %.1f/%.1f/%.1f", names[p], pct(p, 0), pct(p, 0.5), pct(p, 0.999));
      }
      const double per = gaps ? 1e-3 / gaps : 0.0;
      const auto n = static_cast<unsigned long long>(gaps);
      if (!plan.pingpong) {
        std::printf(" sums %d between_tiles %.2f us (epilogue %.2f, first-stage wait %.2f) x %llu\n",
                    sums, gap * per, epi * per, waitn * per, n);
      } else {
        std::printf(" per tile after a warpgroup's first: epilogue %.2f us, turn + first-slice wait "
                    "%.2f us x %llu\n", epi * per, waitn * per, n);
        // CTA 0's tiles: µs from its first point.
        std::vector<uint64_t> tl(32 * 4, 0);
        CHECK_CUDA(static_cast<cudaError_t>(fc_gemm_pp_timeline_copy(tl.data())));
        const uint64_t z = tl[0];
        for (int i = 0; i < 32 && tl[i * 4 + 3] != 0; ++i)
          std::printf("  tile %d (wg %d): start %.2f first slice %.2f mma end %.2f epilogue end %.2f\n",
                      i, i % 2, (tl[i * 4] - z) * 1e-3, (tl[i * 4 + 1] - z) * 1e-3,
                      (tl[i * 4 + 2] - z) * 1e-3, (tl[i * 4 + 3] - z) * 1e-3);
      }
    }
#endif
    std::sort(ms.begin(), ms.end());
    const double med = ms[iters / 2];
    const double tflops = 2.0 * M * N * K / (med * 1e-3) / 1e12;
    std::printf(
        "{\"op\": \"%s\", \"impl\": \"fusedcomm\", \"M\": %d, \"N\": %d, \"K\": %d, "
        "\"layout\": \"%s\", \"dtype\": \"bf16\", \"c_dtype\": \"%s\", \"tile_n\": %d, "
        "\"cluster_arg\": %d, \"stream_k_arg\": %d, \"stream_k_tiles\": %d, \"ctas\": %d, "
        "\"pingpong_arg\": %d, \"pingpong\": %d, "
        "\"ms_median\": %.5f, \"ms_min\": %.5f, \"tflops\": %.1f, \"device\": \"%s\"}\n",
        op.c_str(), M, N, K, layout.c_str(), c_f32 ? "f32" : "bf16", plan.grid.tile_n, cluster,
        stream_k, plan.stream_k_tiles, plan.ctas, pingpong, plan.pingpong ? 1 : 0, med, ms[0], tflops, prop.name);
    std::fflush(stdout);
    CHECK_CUDA(cudaFree(A));
    CHECK_CUDA(cudaFree(B));
    CHECK_CUDA(cudaFree(C));
  }
  return 0;
}
