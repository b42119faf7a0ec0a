// What a small GPU op costs after the GPU has been idle, apart from sockets and proxy threads
// (kernels/bench/NOTES.md, "A busy-poll window for the threads between hosts"). Times, with CUDA
// events around each launch, 9 launches per row, launched back to back or after a 30 ms gap:
//   - an empty kernel;
//   - a kernel reading one word of mapped host memory;
//   - a GPU -> CPU -> GPU round trip through mapped host memory (the GPU writes ping, a
//     spinning CPU thread copies it to pong, the GPU polls pong), once and 4 times;
//   - the empty kernel after a 30 ms gap in which the launching thread spins instead of
//     sleeping (is the launching thread's own wake-up in it?).
// Build and run (any CUDA 13 host with a GPU):
//   nvcc -O2 -arch=sm_90a -o idle_launch_probe kernels/bench/probes/idle_launch_probe.cu && ./idle_launch_probe
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

#define CK(x)                                                  \
  do {                                                         \
    cudaError_t e_ = (x);                                      \
    if (e_ != cudaSuccess) {                                   \
      std::printf("%s: %s\n", #x, cudaGetErrorString(e_));     \
      return 1;                                                \
    }                                                          \
  } while (0)

namespace {

__global__ void empty_kernel() {}

__global__ void read_host_word(const volatile unsigned long long* w, unsigned long long* out) { *out = *w; }

__global__ void round_trips(volatile unsigned long long* ping, const volatile unsigned long long* pong,
                            unsigned long long first, int n) {
  for (int i = 0; i < n; ++i) {
    const unsigned long long v = first + i;
    __threadfence_system();
    *ping = v;
    __threadfence_system();
    while (*pong < v) {
    }
  }
}

enum class Work { kEmpty, kReadHost, kRoundTrips };

}  // namespace

int main() {
  unsigned long long *host = nullptr, *dev = nullptr, *out = nullptr;
  CK(cudaHostAlloc(&host, 4096, cudaHostAllocMapped));
  CK(cudaHostGetDevicePointer(&dev, host, 0));
  CK(cudaMalloc(&out, 8));
  volatile unsigned long long* ping = host;
  volatile unsigned long long* pong = host + 16;  // another 128-byte line
  std::atomic<bool> stop{false};
  std::thread echo([&] {
    while (!stop.load(std::memory_order_relaxed)) {
      const unsigned long long v = *ping;
      if (v != *pong) *pong = v;
    }
  });
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  unsigned long long next = 1;
  auto row = [&](const char* name, Work work, int n_round_trips, int gap_ms, bool spin_gap) {
    std::vector<float> us;
    for (int rep = 0; rep < 9; ++rep) {
      const auto t = std::chrono::steady_clock::now();
      if (spin_gap) {
        while (std::chrono::steady_clock::now() - t < std::chrono::milliseconds(gap_ms)) {
        }
      } else if (gap_ms > 0) {
        std::this_thread::sleep_for(std::chrono::milliseconds(gap_ms));
      }
      cudaEventRecord(e0, s);
      if (work == Work::kEmpty) empty_kernel<<<1, 1, 0, s>>>();
      if (work == Work::kReadHost) read_host_word<<<1, 1, 0, s>>>(dev + 32, out);
      if (work == Work::kRoundTrips) {
        round_trips<<<1, 1, 0, s>>>(dev, dev + 16, next, n_round_trips);
        next += n_round_trips;
      }
      cudaEventRecord(e1, s);
      cudaStreamSynchronize(s);
      float ms = 0;
      cudaEventElapsedTime(&ms, e0, e1);
      us.push_back(ms * 1000);
    }
    std::sort(us.begin(), us.end());
    std::printf("%-34s gap %2d ms%s: median %7.1f us (min %6.1f, max %6.1f)\n", name, gap_ms,
                spin_gap ? " (spun)" : "", us[4], us[0], us[8]);
  };
  for (int gap : {0, 30}) {
    row("empty kernel", Work::kEmpty, 0, gap, false);
    row("kernel reading one host word", Work::kReadHost, 0, gap, false);
    row("GPU->CPU->GPU round trip x1", Work::kRoundTrips, 1, gap, false);
    row("GPU->CPU->GPU round trip x4", Work::kRoundTrips, 4, gap, false);
  }
  row("empty kernel", Work::kEmpty, 0, 30, true);
  CK(cudaGetLastError());
  stop = true;
  echo.join();
  return 0;
}
