// Can an allReduce made only of NVLink stores beat NCCL's at 4 GPUs? (kernels/bench/NOTES.md,
// "NVLink ceilings per pattern": SM loads over NVLink top out at ~330 GB/s per GPU, stores at
// 357-364, NCCL's allReduce reaches ~355 GB/s busbw at 1 GiB; our two-phase allReduce pulls.)
// One process drives every GPU (peer access between all pairs, plain cudaMalloc buffers, fp32
// elements: the adds are free next to the bytes), and three allReduce schedules run on N bytes
// per GPU, each phase a kernel, phases ordered across GPUs by events (cudaStreamWaitEvent on
// the other GPUs' events, no host round trip):
//   pull   (calibration, our library's two-phase): rank r loads chunk r of every rank's input
//          and reduces it into a local buffer; then loads every peer's reduced chunk.
//   direct rank r stores chunk o of its input into owner o's receive slot (all peers at once);
//          then owner r reduces its chunk from its input and the W-1 slots (local loads) and
//          stores the sum into every rank's output (its own and the peers': an output in
//          peer-addressable memory; an ordinary output would add a local copy).
//   ring   NCCL's schedule: W-1 reduce-scatter steps, each storing one chunk to the next rank
//          (local loads of the input and of the previous step's slot), then W-1 all-gather
//          steps forwarding the reduced chunks around the ring into the outputs.
// Prints per (schedule, size, CTAs) the slowest GPU's time per allReduce and busbw
// (2 (W-1)/W * N / t, as nccl-tests), and checks every schedule's result on sampled elements.
// Build and run (CUDA 13, >= 2 GPUs with peer access; a watchdog ends it at 100 s):
//   nvcc -O3 -std=c++17 -arch=sm_90a -o ar_store_probe kernels/bench/probes/ar_store_probe.cu
//   ./ar_store_probe [--gpus N]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "probe_common.h"

namespace {

constexpr int kMaxG = 8;
constexpr int kThreads = 512;
constexpr int kUnroll = 4;                                     // float4 per thread per source
constexpr size_t kPiece4 = size_t(kThreads) * kUnroll;         // float4s per work piece (32 KiB)
constexpr size_t kPieceBytes = kPiece4 * sizeof(float4);
constexpr int kReps = 5;
constexpr int kWarmups = 2;

// One job: sum of nsrc sources (float4 arrays), stored to each of ndst destinations.
struct Job {
  const float4* src[kMaxG];
  float4* dst[kMaxG];
  int nsrc, ndst;
};
struct Jobs {
  Job j[kMaxG];
  int n;
  unsigned long long pieces;  // per job
};

// Pieces of the jobs interleaved (piece c belongs to job c % n), so that neighbouring CTAs work
// for different jobs (different peers) at once.
__global__ void __launch_bounds__(kThreads) run_jobs(const __grid_constant__ Jobs J) {
  const unsigned long long total = J.pieces * static_cast<unsigned long long>(J.n);
  for (unsigned long long c = blockIdx.x; c < total; c += gridDim.x) {
    const Job& jb = J.j[c % J.n];
    const size_t base = (c / J.n) * kPiece4 + threadIdx.x;
    float4 acc[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) acc[u] = __ldcg(jb.src[0] + base + u * kThreads);
    for (int s = 1; s < jb.nsrc; ++s) {
      float4 v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) v[u] = __ldcg(jb.src[s] + base + u * kThreads);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        acc[u].x += v[u].x, acc[u].y += v[u].y, acc[u].z += v[u].z, acc[u].w += v[u].w;
      }
    }
    for (int d = 0; d < jb.ndst; ++d) {
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) jb.dst[d][base + u * kThreads] = acc[u];
    }
  }
}

__global__ void fill(float* p, size_t n, int g) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    p[i] = static_cast<float>((i % 13) + 3 * g);  // small integers: every sum exact in fp32
}

struct Gpu {
  float* in = nullptr;    // N bytes
  float* out = nullptr;   // N bytes
  float* slot = nullptr;  // (G-1) chunks: receive slots (direct: by source; ring: by step)
  float* red = nullptr;   // one chunk: pull's reduced chunk
  cudaStream_t st{};
  cudaEvent_t done{}, t0{}, t1{};
};

int G = 0;
size_t chunk4 = 0;  // float4s per chunk (N / G)
std::vector<Gpu> gpu;

float4* f4(float* p, size_t chunk_index) { return reinterpret_cast<float4*>(p) + chunk_index * chunk4; }

// Launch `jobs[r]` on every GPU r after every GPU's previous phase (all-to-all event waits), or
// after only `after[r]`'s previous phase (ring steps).
// Every wait is enqueued before any GPU records this phase's event: a wait takes the event's
// latest record at the call, so a GPU must not wait on a neighbour's record of this phase
// (that would chain the phase around the ring).
void phase(const std::vector<Jobs>& jobs, int ctas, const std::vector<int>* after = nullptr) {
  for (int r = 0; r < G; ++r) {
    CK(cudaSetDevice(r));
    for (int p = 0; p < G; ++p) {
      if (p == r) continue;
      if (after && (*after)[r] != p) continue;
      CK(cudaStreamWaitEvent(gpu[r].st, gpu[p].done, 0));
    }
  }
  for (int r = 0; r < G; ++r) {
    CK(cudaSetDevice(r));
    if (jobs[r].n > 0) run_jobs<<<ctas, kThreads, 0, gpu[r].st>>>(jobs[r]);
    CK(cudaGetLastError());
    CK(cudaEventRecord(gpu[r].done, gpu[r].st));
  }
}

Jobs jobs_of(int n, unsigned long long pieces) {
  Jobs J{};
  J.n = n;
  J.pieces = pieces;
  return J;
}

// One allReduce with schedule `s` (0 pull, 1 direct, 2 ring) on every GPU.
void all_reduce(int s, int ctas) {
  const unsigned long long pieces = chunk4 / kPiece4;
  auto nxt = [](int r, int d) { return ((r + d) % G + G) % G; };
  // Start: every GPU after every GPU's previous work (the slots are reused).
  phase(std::vector<Jobs>(G, jobs_of(0, 0)), ctas);
  if (s == 0) {
    std::vector<Jobs> a(G), b(G);
    for (int r = 0; r < G; ++r) {
      a[r] = jobs_of(1, pieces);
      a[r].j[0].nsrc = G;
      for (int p = 0; p < G; ++p) a[r].j[0].src[p] = f4(gpu[nxt(r, p)].in, r);
      a[r].j[0].ndst = 2;
      a[r].j[0].dst[0] = f4(gpu[r].red, 0);
      a[r].j[0].dst[1] = f4(gpu[r].out, r);
      b[r] = jobs_of(G - 1, pieces);
      for (int k = 1; k < G; ++k) {
        const int p = nxt(r, k);
        b[r].j[k - 1].nsrc = 1, b[r].j[k - 1].src[0] = f4(gpu[p].red, 0);
        b[r].j[k - 1].ndst = 1, b[r].j[k - 1].dst[0] = f4(gpu[r].out, p);
      }
    }
    phase(a, ctas);
    phase(b, ctas);
  } else if (s == 1) {
    std::vector<Jobs> a(G), b(G);
    for (int r = 0; r < G; ++r) {
      a[r] = jobs_of(G - 1, pieces);
      for (int k = 1; k < G; ++k) {  // chunk o of the input into o's slot for source r
        const int o = nxt(r, k);
        const int slot = (r - o + G) % G - 1;  // sources o+1.. -> slots 0..
        a[r].j[k - 1].nsrc = 1, a[r].j[k - 1].src[0] = f4(gpu[r].in, o);
        a[r].j[k - 1].ndst = 1, a[r].j[k - 1].dst[0] = f4(gpu[o].slot, slot);
      }
      b[r] = jobs_of(1, pieces);
      b[r].j[0].nsrc = G;
      b[r].j[0].src[0] = f4(gpu[r].in, r);
      for (int k = 0; k < G - 1; ++k) b[r].j[0].src[k + 1] = f4(gpu[r].slot, k);
      b[r].j[0].ndst = G;
      for (int k = 0; k < G; ++k) b[r].j[0].dst[k] = f4(gpu[nxt(r, k)].out, r);
    }
    phase(a, ctas);
    phase(b, ctas);
  } else {
    std::vector<int> prev(G);
    for (int r = 0; r < G; ++r) prev[r] = nxt(r, -1);
    // Reduce-scatter step t (0..G-2): r sends chunk (r - t) mod G to r+1's slot t, adding
    // its input to what came in at step t-1 (slot t-1). After step G-2, rank r holds in slot
    // G-2 the sum over the other ranks of chunk (r + 1) mod G.
    for (int t = 0; t < G - 1; ++t) {
      std::vector<Jobs> a(G);
      for (int r = 0; r < G; ++r) {
        const int c = nxt(r, -t);
        a[r] = jobs_of(1, pieces);
        a[r].j[0].nsrc = t == 0 ? 1 : 2;
        a[r].j[0].src[0] = f4(gpu[r].in, c);
        a[r].j[0].src[1] = f4(gpu[r].slot, t - 1 < 0 ? 0 : t - 1);
        a[r].j[0].ndst = 1, a[r].j[0].dst[0] = f4(gpu[nxt(r, 1)].slot, t);
      }
      phase(a, ctas, &prev);
    }
    // All-gather step t (0..G-2): t = 0 finishes chunk (r+1) mod G (own input + slot G-2) into
    // the own output and r+1's; later steps forward chunk (r + 1 - t) mod G from the own output.
    for (int t = 0; t < G - 1; ++t) {
      std::vector<Jobs> a(G);
      for (int r = 0; r < G; ++r) {
        const int c = nxt(r, 1 - t);
        a[r] = jobs_of(1, pieces);
        if (t == 0) {
          a[r].j[0].nsrc = 2;
          a[r].j[0].src[0] = f4(gpu[r].in, c);
          a[r].j[0].src[1] = f4(gpu[r].slot, G - 2);
          a[r].j[0].ndst = 2;
          a[r].j[0].dst[0] = f4(gpu[r].out, c);
          a[r].j[0].dst[1] = f4(gpu[nxt(r, 1)].out, c);
        } else {
          a[r].j[0].nsrc = 1, a[r].j[0].src[0] = f4(gpu[r].out, c);
          a[r].j[0].ndst = 1, a[r].j[0].dst[0] = f4(gpu[nxt(r, 1)].out, c);
        }
      }
      phase(a, ctas, &prev);
    }
  }
}

bool check(int s) {
  bool ok = true;
  const size_t n = chunk4 * 4 * G;
  for (int r = 0; r < G && ok; ++r) {
    CK(cudaSetDevice(r));
    CK(cudaMemset(gpu[r].out, 0, n * sizeof(float)));
  }
  for (int r = 0; r < G; ++r) { CK(cudaSetDevice(r)); CK(cudaDeviceSynchronize()); }
  all_reduce(s, 132);
  for (int r = 0; r < G; ++r) { CK(cudaSetDevice(r)); CK(cudaDeviceSynchronize()); }
  std::vector<float> h(1024);
  for (int r = 0; r < G && ok; ++r) {
    for (int k = 0; k < 16 && ok; ++k) {
      const size_t at = (n - h.size()) / 15 * k;
      CK(cudaSetDevice(r));
      CK(cudaMemcpy(h.data(), gpu[r].out + at, h.size() * sizeof(float), cudaMemcpyDeviceToHost));
      for (size_t i = 0; i < h.size(); ++i) {
        float want = 0;
        for (int g = 0; g < G; ++g) want += static_cast<float>(((at + i) % 13) + 3 * g);
        if (h[i] != want) {
          std::printf("# check FAILED: schedule %d rank %d element %zu: %g, want %g\n", s, r, at + i, h[i], want);
          ok = false;
          break;
        }
      }
    }
  }
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  start_watchdog(100, "# watchdog: 100 s, exiting", 2);
  int want = 0;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--gpus") && i + 1 < argc) want = std::atoi(argv[++i]);
  }
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;  // no driver: no GPU
  G = want > 0 ? std::min(want, n) : n;
  G = std::min(G, kMaxG);
  if (G < 2) {
    std::printf("ar_store_probe: needs >= 2 GPUs with peer access (found %d); nothing measured\n", n);
    return 0;
  }
  if (!enable_peer_access(G, "ar_store_probe", "; nothing measured")) return 0;
  const size_t sizes[] = {64ull << 20, 256ull << 20, 1ull << 30};
  const size_t max_bytes = sizes[2];
  gpu.resize(G);
  for (int r = 0; r < G; ++r) {
    CK(cudaSetDevice(r));
    const size_t chunk_max = max_bytes / G / kPieceBytes * kPieceBytes;
    CK(cudaMalloc(&gpu[r].in, chunk_max * G));
    CK(cudaMalloc(&gpu[r].out, chunk_max * G));
    CK(cudaMalloc(&gpu[r].slot, chunk_max * (G - 1)));
    CK(cudaMalloc(&gpu[r].red, chunk_max));
    CK(cudaStreamCreateWithFlags(&gpu[r].st, cudaStreamNonBlocking));
    CK(cudaEventCreateWithFlags(&gpu[r].done, cudaEventDisableTiming));
    CK(cudaEventCreate(&gpu[r].t0));
    CK(cudaEventCreate(&gpu[r].t1));
    fill<<<264, 512>>>(gpu[r].in, chunk_max * G / sizeof(float), r);
    CK(cudaGetLastError());
    CK(cudaEventRecord(gpu[r].done, gpu[r].st));
  }
  for (int r = 0; r < G; ++r) { CK(cudaSetDevice(r)); CK(cudaDeviceSynchronize()); }
  const char* names[] = {"pull", "direct", "ring"};
  std::printf("# %d GPUs, fp32 elements, %d threads x %d float4 per source per CTA step; %d warm-ups, %d timed\n",
              G, kThreads, kUnroll, kWarmups, kReps);
  std::printf("%-7s %6s %5s %10s %10s\n", "sched", "MiB", "ctas", "ms", "busbw");
  double best[3][3] = {};
  for (int si = 0; si < 3; ++si) {
    chunk4 = sizes[si] / G / kPieceBytes * kPiece4;
    const double bytes = static_cast<double>(chunk4) * 16 * G;
    for (int s = 0; s < 3; ++s) {
      for (int ctas : {48, 96, 132}) {
        for (int w = 0; w < kWarmups; ++w) all_reduce(s, ctas);
        phase(std::vector<Jobs>(G, jobs_of(0, 0)), ctas);
        for (int r = 0; r < G; ++r) { CK(cudaSetDevice(r)); CK(cudaEventRecord(gpu[r].t0, gpu[r].st)); }
        for (int k = 0; k < kReps; ++k) all_reduce(s, ctas);
        for (int r = 0; r < G; ++r) { CK(cudaSetDevice(r)); CK(cudaEventRecord(gpu[r].t1, gpu[r].st)); }
        float ms = 0;
        for (int r = 0; r < G; ++r) {
          CK(cudaSetDevice(r));
          CK(cudaEventSynchronize(gpu[r].t1));
          float m = 0;
          CK(cudaEventElapsedTime(&m, gpu[r].t0, gpu[r].t1));
          ms = std::max(ms, m / kReps);
        }
        const double busbw = 2.0 * (G - 1) / G * bytes / (ms * 1e-3) / 1e9;
        best[s][si] = std::max(best[s][si], busbw);
        std::printf("%-7s %6.0f %5d %10.4f %10.1f\n", names[s], bytes / (1 << 20), ctas, ms, busbw);
        std::fflush(stdout);
      }
    }
  }
  chunk4 = sizes[0] / G / kPieceBytes * kPiece4;
  std::printf("# best busbw GB/s per schedule at 64 MiB / 256 MiB / 1 GiB (NCCL's allReduce at W = 4, run 10: 308 / 337 / 355)\n");
  for (int s = 0; s < 3; ++s) {
    const bool ok = check(s);
    std::printf("%-7s %7.1f %7.1f %7.1f  check %s\n", names[s], best[s][0], best[s][1], best[s][2], ok ? "ok" : "FAILED");
  }
  return 0;
}
