// Copy engines beside our GEMM: does an allGatherGemm whose exchange runs on the copy engines
// get closer to its GEMM alone than our fused kernel, whose exchange takes SMs from the GEMM?
// Why (kernels/bench/fused/NOTES.md, runs 15-16): at W = 4 square 8192 the fused allGatherGemm
// takes 1.27-1.28 x our GEMM alone, its exchange being ~0.7 x the GEMM's time; PyTorch's
// symmetric memory moves the shards with copy engines (on one host 1.21 x cuBLAS alone, on
// others 1.70 x), and the NVLink probe had copy engines at 390 GB/s per GPU against 335 for SM
// loads. Before building a copy-engine exchange into the fused op (host-enqueued copies on a
// second stream, flags per chunk, bounded waits around them), this measures its floor: the
// GEMM and the copies side by side, no dependency between them.
//
// One process drives every GPU (peer access between all pairs). Per GPU g, for each shape
// (allGatherGemm under TP = G: the gathered A is M x K, split by rows; B is N_r x K):
//   gemm  our GEMM alone (launch_gemm, every SM), on stream A
//   ce    the exchange alone: for each peer o, cudaMemcpyPeerAsync of o's rows from o's gathered
//         A into g's, on a copy stream that forks from A and that A joins (every GPU at once:
//         each GPU pulls G-1 shards)
//   both  per repetition: the copies on the copy stream and the GEMM on A, A joins
// --issue push: each GPU's copy engines push its own rows into every peer instead (the NVLink
// probe's 388 GB/s ring was a push). --streams per-peer: one copy stream per peer, so that the
// copies to or from different peers can run on different copy engines at once (run 17 on
// 4 x H200: one stream, pulls one peer after another, moved only 132-144 GB/s into each GPU,
// against 367-386 at W = 2 with one peer).
// Each phase first runs back to back for --sustain-ms on every GPU (the GPUs' power-capped
// clock settles, as in fused_bench --sustain-ms), then --reps timed repetitions (events on
// each GPU). --chunk-mib C splits each peer's copy into C MiB pieces (what per-chunk flags
// would need). After the ce phase a sample of every GPU's gathered rows is checked against the
// values the owner wrote.
// Prints per shape: GEMM alone, copies alone (GB/s into each GPU), both, both / GEMM alone,
// and max(GEMM, copies) / GEMM alone (the floor); slowest GPU's figures; one JSON line each.
// Build (repo root; gemm.o from kernels/bench/build_gemm.sh or build.sh of bench/fused):
//   nvcc -O3 -std=c++20 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr \
//     -Ikernels/include -o build/ce_gemm_probe kernels/bench/probes/ce_gemm_probe.cu build/devbin/gemm.o
//   ./ce_gemm_probe [--gpus N] [--shape substring] [--reps R] [--sustain-ms S] [--chunk-mib C]
//                   [--issue pull|push] [--streams one|per-peer]
// A watchdog ends the run after 170 s.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/gemm/gemm.h"
#include "probe_common.h"

namespace k = fusedcomm::kernels;


namespace {

constexpr int kMaxGpus = 8;
constexpr int kWatchdogS = 170;

struct Shape {
  std::string label;
  int M, N_r, K;
};

// allGatherGemm's shapes of fused_bench (kernels/bench/fused/fused_bench.cc) that runs 15-16
// looked at: the square ones and the largest exchange of each model.
std::vector<Shape> shapes(int tp) {
  return {{"square S=8192", 8192, 8192 / tp, 8192},
          {"square S=16384", 16384, 16384 / tp, 16384},
          {"llama3-8b M=16384", 16384, 2 * 14336 / tp, 4096},
          {"llama3-70b M=2048", 2048, 2 * 28672 / tp, 8192},
          {"llama3-70b M=16384", 16384, 2 * 28672 / tp, 8192}};
}

// Rows [off, off + cnt) of GPU o: M / G each, the remainder to the first ranks (DESIGN.md §4's
// rule; what the probe copies only needs to partition M).
int64_t rows_of(int M, int G, int o) { return M / G + (o < M % G ? 1 : 0); }
int64_t first_row(int M, int G, int o) {
  return static_cast<int64_t>(o) * (M / G) + std::min(o, M % G);
}

// The value GPU g writes at element e of its own rows: positive, while the rows of the others
// start as fill_noise's negative values.
__host__ __device__ inline uint16_t own_value(int g, uint64_t e) {
  return static_cast<uint16_t>(0x3c00u + ((e * 2654435761ull + g * 97u) & 0x3ffu));
}

__global__ void fill_own(uint16_t* p, uint64_t first, uint64_t n, int g) {
  for (uint64_t i = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x; i < n;
       i += uint64_t{gridDim.x} * blockDim.x)
    p[i] = own_value(g, first + i);
}

// Operand values with random mantissas, for the GEMM to draw the power it draws in fused_bench
// (random data). Run 17's first call had B zero and the peers' rows of A zero until the first
// copy: its GEMM alone ran at 827 TF/s at 8B M = 16384 against ~670 in fused_bench, likely the
// power-capped clock staying high at a low draw. `negative`: -[0.5, 1) only, never one of
// own_value's (positive) values, so the copies' check still sees a missed row.
__global__ void fill_noise(uint16_t* p, uint64_t n, int g, bool negative) {
  for (uint64_t i = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x; i < n;
       i += uint64_t{gridDim.x} * blockDim.x) {
    const uint64_t h = ((i + 0x9E3779B97F4A7C15ull * (g + 1)) * 0xD6E8FEB86659FD93ull) >> 32;
    const uint32_t sign_and_mantissa = h & (negative ? 0x7fu : 0x807fu);
    p[i] = static_cast<uint16_t>(sign_and_mantissa | (negative ? 0xbf00u : 0x3f00u));
  }
}

struct Gpu {
  int dev = 0;
  __nv_bfloat16 *a = nullptr, *b = nullptr, *c = nullptr;  // gathered A, B (N_r x K), C
  void* ws = nullptr;
  size_t ws_bytes = 0;
  cudaStream_t sa = nullptr;                 // the GEMM's stream; every phase is timed on it
  std::vector<cudaStream_t> sc;               // copy streams: one, or one per peer
  std::vector<cudaEvent_t> joins;             // one per copy stream
  cudaEvent_t t0 = nullptr, t1 = nullptr, fork = nullptr;
};

struct Opts {
  int gpus = 0;
  std::string shape;
  int reps = 20;
  int sustain_ms = 500;
  int chunk_mib = 0;
  bool push = false;       // --issue push: copies of the own rows into the peers
  bool per_peer = false;   // --streams per-peer
};

enum class Phase { kGemm, kCe, kBoth };

class Probe {
 public:
  Probe(const Opts& o, int G) : o_(o), G_(G), gpu_(G) {}

  void setup(const Shape& s) {
    s_ = s;
    for (int g = 0; g < G_; ++g) {
      Gpu& x = gpu_[g];
      x.dev = g;
      CK(cudaSetDevice(g));
      CK(cudaMalloc(&x.a, size_t(s.M) * s.K * 2));
      CK(cudaMalloc(&x.b, size_t(s.N_r) * s.K * 2));
      CK(cudaMalloc(&x.c, size_t(s.M) * s.N_r * 2));
      x.ws_bytes = k::gemm_workspace_bytes(0);
      CK(cudaMalloc(&x.ws, x.ws_bytes));
      CK(cudaMemset(x.ws, 0, x.ws_bytes));
      fill_noise<<<264, 512>>>(reinterpret_cast<uint16_t*>(x.a), uint64_t(s.M) * s.K, g, true);
      fill_noise<<<264, 512>>>(reinterpret_cast<uint16_t*>(x.b), uint64_t(s.N_r) * s.K, g, false);
      const uint64_t first = uint64_t(first_row(s.M, G_, g)) * s.K;
      const uint64_t n = uint64_t(rows_of(s.M, G_, g)) * s.K;
      fill_own<<<264, 512>>>(reinterpret_cast<uint16_t*>(x.a) + first, first, n, g);
      CK(cudaGetLastError());
      CK(cudaStreamCreateWithFlags(&x.sa, cudaStreamNonBlocking));
      x.sc.resize(o_.per_peer ? G_ - 1 : 1);
      x.joins.resize(x.sc.size());
      for (size_t i = 0; i < x.sc.size(); ++i) {
        CK(cudaStreamCreateWithFlags(&x.sc[i], cudaStreamNonBlocking));
        CK(cudaEventCreateWithFlags(&x.joins[i], cudaEventDisableTiming));
      }
      CK(cudaEventCreate(&x.t0));
      CK(cudaEventCreate(&x.t1));
      CK(cudaEventCreateWithFlags(&x.fork, cudaEventDisableTiming));
    }
    sync_all();
  }

  void teardown() {
    for (Gpu& x : gpu_) {
      CK(cudaSetDevice(x.dev));
      CK(cudaFree(x.a));
      CK(cudaFree(x.b));
      CK(cudaFree(x.c));
      CK(cudaFree(x.ws));
      CK(cudaStreamDestroy(x.sa));
      for (size_t i = 0; i < x.sc.size(); ++i) {
        CK(cudaStreamDestroy(x.sc[i]));
        CK(cudaEventDestroy(x.joins[i]));
      }
      CK(cudaEventDestroy(x.t0));
      CK(cudaEventDestroy(x.t1));
      CK(cudaEventDestroy(x.fork));
      x = Gpu{};
    }
  }

  // Milliseconds per repetition of `p` on each GPU, after the sustain period.
  std::vector<double> run(Phase p) {
    const auto start = std::chrono::steady_clock::now();
    while (std::chrono::steady_clock::now() - start < std::chrono::milliseconds(o_.sustain_ms)) {
      for (int i = 0; i < 4; ++i) rep_all(p);
      sync_all();
    }
    for (Gpu& x : gpu_) {
      CK(cudaSetDevice(x.dev));
      CK(cudaEventRecord(x.t0, x.sa));
    }
    for (int r = 0; r < o_.reps; ++r) rep_all(p);
    std::vector<double> ms(G_);
    for (Gpu& x : gpu_) {
      CK(cudaSetDevice(x.dev));
      CK(cudaEventRecord(x.t1, x.sa));
    }
    for (int g = 0; g < G_; ++g) {
      CK(cudaSetDevice(g));
      CK(cudaEventSynchronize(gpu_[g].t1));
      float t = 0;
      CK(cudaEventElapsedTime(&t, gpu_[g].t0, gpu_[g].t1));
      ms[g] = t / o_.reps;
    }
    return ms;
  }

  // Sampled check of every GPU's gathered A after copies: each sampled element of o's rows
  // holds o's value. Returns the mismatches.
  int64_t check() {
    sync_all();
    int64_t bad = 0;
    const uint64_t total = uint64_t(s_.M) * s_.K;
    for (int g = 0; g < G_; ++g) {
      CK(cudaSetDevice(g));
      for (int i = 0; i < 4096; ++i) {
        const uint64_t e = (uint64_t(i) * 0x9E3779B97F4A7C15ull) % total;
        uint16_t v = 0;
        CK(cudaMemcpy(&v, reinterpret_cast<uint16_t*>(gpu_[g].a) + e, 2, cudaMemcpyDeviceToHost));
        int owner = 0;
        while (owner + 1 < G_ && int64_t(e / s_.K) >= first_row(s_.M, G_, owner + 1)) ++owner;
        if (v != own_value(owner, e)) ++bad;
      }
    }
    return bad;
  }

  int64_t exchanged_bytes(int g) const {  // bytes pulled into GPU g
    return (int64_t(s_.M) - rows_of(s_.M, G_, g)) * s_.K * 2;
  }

 private:
  void sync_all() {
    for (int g = 0; g < G_; ++g) {
      CK(cudaSetDevice(g));
      CK(cudaDeviceSynchronize());
    }
  }

  void gemm(Gpu& x) {
    k::GemmArgs a;
    a.A = x.a;
    a.B = x.b;
    a.C = x.c;
    a.M = s_.M;
    a.N = s_.N_r;
    a.K = s_.K;
    a.lda = s_.K;
    a.ldb = s_.K;
    a.ldc = s_.N_r;
    a.b_layout = k::GemmLayoutB::kNK;
    a.workspace = x.ws;
    a.workspace_bytes = x.ws_bytes;
    CK(k::launch_gemm(a, x.sa));
  }

  // The exchange of GPU x: its peers' rows pulled into x (or, --issue push, x's rows pushed
  // into its peers), each peer on x's copy stream i % streams.
  void copies(Gpu& x) {
    const size_t row_bytes = size_t(s_.K) * 2;
    const size_t piece = o_.chunk_mib > 0 ? size_t(o_.chunk_mib) << 20 : SIZE_MAX;
    // Peers in the order g+1, g+2, ...: every GPU starts on a different peer.
    for (int i = 1; i < G_; ++i) {
      const int o = (x.dev + i) % G_;
      const int owner = o_.push ? x.dev : o;  // whose rows move
      const int dst = o_.push ? o : x.dev;
      const size_t off = size_t(first_row(s_.M, G_, owner)) * row_bytes;
      const size_t bytes = size_t(rows_of(s_.M, G_, owner)) * row_bytes;
      cudaStream_t st = x.sc[(i - 1) % x.sc.size()];
      for (size_t done = 0; done < bytes; done += std::min(piece, bytes - done)) {
        const size_t n = std::min(piece, bytes - done);
        CK(cudaMemcpyPeerAsync(reinterpret_cast<uint8_t*>(gpu_[dst].a) + off + done, dst,
                               reinterpret_cast<const uint8_t*>(gpu_[owner].a) + off + done, owner, n, st));
      }
    }
  }

  // Every phase runs on stream A: the copy streams fork from it and A joins them.
  void rep_all(Phase p) {
    for (Gpu& x : gpu_) {
      CK(cudaSetDevice(x.dev));
      if (p == Phase::kGemm) {
        gemm(x);
        continue;
      }
      CK(cudaEventRecord(x.fork, x.sa));
      for (cudaStream_t st : x.sc) CK(cudaStreamWaitEvent(st, x.fork, 0));
      copies(x);
      if (p == Phase::kBoth) gemm(x);
      for (size_t i = 0; i < x.sc.size(); ++i) {
        CK(cudaEventRecord(x.joins[i], x.sc[i]));
        CK(cudaStreamWaitEvent(x.sa, x.joins[i], 0));
      }
    }
  }

  Opts o_;
  int G_;
  std::vector<Gpu> gpu_;
  Shape s_;
};

double max_of(const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); }

// An option with two values: false for `no`, true for `yes`; any other value ends the run (a
// misspelt mode would otherwise time the default one under the wrong name).
bool one_of(const std::string& opt, const std::string& v, const char* no, const char* yes) {
  if (v == no || v == yes) return v == yes;
  std::printf("%s takes %s or %s, not %s\n", opt.c_str(), no, yes, v.c_str());
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  Opts o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::printf("%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--gpus") o.gpus = std::atoi(next());
    else if (a == "--shape") o.shape = next();
    else if (a == "--reps") o.reps = std::max(1, std::atoi(next()));
    else if (a == "--sustain-ms") o.sustain_ms = std::max(0, std::atoi(next()));
    else if (a == "--chunk-mib") o.chunk_mib = std::max(0, std::atoi(next()));
    else if (a == "--issue") o.push = one_of(a, next(), "pull", "push");
    else if (a == "--streams") o.per_peer = one_of(a, next(), "one", "per-peer");
    else {
      std::printf("unknown option %s\n", a.c_str());
      return 2;
    }
  }
  start_watchdog(kWatchdogS,
                 "ce_gemm_probe: watchdog: still running after " + std::to_string(kWatchdogS) +
                     " s, exiting",
                 3);
  int n = 0;
  CK(cudaGetDeviceCount(&n));
  const int G = o.gpus > 0 ? std::min(o.gpus, n) : n;
  if (G < 2 || G > kMaxGpus) {
    std::printf("ce_gemm_probe: needs 2-%d GPUs, %d visible\n", kMaxGpus, n);
    return 1;
  }
  if (!enable_peer_access(G, "ce_gemm_probe", "")) return 1;
  std::printf("ce_gemm_probe: %d GPUs, %d timed reps after %d ms sustained per phase, copies in %s, %s, "
              "%s\n", G, o.reps, o.sustain_ms,
              o.chunk_mib > 0 ? (std::to_string(o.chunk_mib) + " MiB pieces").c_str() : "one piece per peer",
              o.push ? "pushed" : "pulled", o.per_peer ? "one stream per peer" : "one stream");
  std::printf("%-20s %6s %6s %6s | %9s %9s %8s %9s | %7s %7s | %s\n", "shape", "M", "N_r", "K",
              "gemm ms", "ce ms", "ce GB/s", "both ms", "both/g", "floor/g", "check");
  Probe probe(o, G);
  int rc = 0;
  for (const Shape& s : shapes(G)) {
    if (!o.shape.empty() && s.label.find(o.shape) == std::string::npos) continue;
    probe.setup(s);
    const std::vector<double> tg = probe.run(Phase::kGemm);
    const std::vector<double> tc = probe.run(Phase::kCe);
    const int64_t bad = probe.check();
    const std::vector<double> tb = probe.run(Phase::kBoth);
    // The slowest GPU's figures: the op ends on every rank together.
    const double g = max_of(tg), c = max_of(tc), b = max_of(tb);
    const double gbps = probe.exchanged_bytes(0) / (c * 1e-3) / 1e9;
    std::printf("%-20s %6d %6d %6d | %9.4f %9.4f %8.1f %9.4f | %7.3f %7.3f | %s\n", s.label.c_str(),
                s.M, s.N_r, s.K, g, c, gbps, b, b / g, std::max(g, c) / g,
                bad == 0 ? "ok" : (std::to_string(bad) + " BAD").c_str());
    std::printf("{\"probe\": \"ce_gemm\", \"shape\": \"%s\", \"gpus\": %d, \"M\": %d, \"N_r\": %d, \"K\": %d, "
                "\"chunk_mib\": %d, \"issue\": \"%s\", \"streams\": \"%s\", \"gemm_ms\": %.5f, \"ce_ms\": %.5f, \"ce_gbps\": %.1f, \"both_ms\": %.5f, "
                "\"gemm_ms_gpus\": [",
                s.label.c_str(), G, s.M, s.N_r, s.K, o.chunk_mib, o.push ? "push" : "pull",
                o.per_peer ? "per-peer" : "one", g, c, gbps, b);
    for (int i = 0; i < G; ++i) std::printf("%s%.5f", i ? ", " : "", tg[i]);
    std::printf("], \"both_ms_gpus\": [");
    for (int i = 0; i < G; ++i) std::printf("%s%.5f", i ? ", " : "", tb[i]);
    std::printf("], \"check_mismatches\": %lld}\n", static_cast<long long>(bad));
    std::fflush(stdout);
    if (bad != 0) rc = 1;
    probe.teardown();
  }
  return rc;
}
