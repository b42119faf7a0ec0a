// gemm_bench: our GEMM (launch_gemm_staged) on any list of shapes, one GPU. Each shape's output is
// checked element by element against an fp32 reference GEMM first (output poisoned before the
// launch), then timed: `warmup` launches, then `iters` launches with one CUDA event pair each and
// no synchronisation between them (host launch latency stays out of the device times); the row
// holds the median. Ours is launched as the runtime launches it: with a stream-K workspace, every
// plan choice (tile width, stream-K, ping-pong, CTA pairs, staged copies) left to the launch.
//
// run.sh publishes torch_gemm.py's rows instead, which time this same launch (gemm_lib.cu)
// interleaved with cuBLAS on the same tensors; this driver needs no Python.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "bench/common/bench_util.h"
#include "bench/common/check.h"
#include "kernels/gemm/gemm.h"

namespace b = fusedcomm::bench;
namespace k = fusedcomm::kernels;

namespace {

const char* kUsage =
    "usage: gemm_bench [--shapes FILE] [--m M,... --n N,... --k K,...] [--random N [--seed S]]\n"
    "                  [--layouts nk,kn] [--out ROWS.jsonl] [--warmup 10] [--iters 50] [--check-only]\n"
    "  FILE: one shape per line, \"<label> <M> <N> <K> <nk|kn>\" (bench/shapes/gemm.txt);\n"
    "  nk: C = A * B^T with B: N x K (a linear layer's weight), kn: C = A * B with B: K x N.\n"
    "  --m/--n/--k: explicit shapes, comma lists (the i-th M with the i-th N and K, one value for\n"
    "  all); --random N: N shapes with M, N, K uniform in [1, 16384] (--seed, else one chosen and\n"
    "  printed); both in each layout of --layouts. Dense tensors at the shape as given: rows off\n"
    "  a multiple of 8 elements go through the staged launch, its copies inside the timed call.\n"
    "  Rows (impl fusedcomm) go to --out as JSON lines; a summary line per shape to stdout.\n"
    "  Exit 0: every shape passed its check; 1: a mismatch or a CUDA error; 77: no GPU.\n";

struct Shape {
  std::string label;
  int M, N, K;
  bool kn;
  std::string set;  // "" (a file's), "explicit" or "random-<seed>"
};

std::vector<Shape> read_shapes(const std::string& path) {
  std::vector<Shape> v;
  for (const auto& w : b::read_shape_lines(path)) {
    if (w.size() != 5 || (w[4] != "nk" && w[4] != "kn")) {
      throw std::runtime_error(path + ": expected \"<label> <M> <N> <K> <nk|kn>\"");
    }
    v.push_back({w[0], std::stoi(w[1]), std::stoi(w[2]), std::stoi(w[3]), w[4] == "kn", ""});
  }
  return v;
}

// Explicit and seeded random shapes (uniform in [1, 16384], as torch_gemm.py draws them from
// its own generator: the same seed gives other shapes there) in each layout of `layouts`.
void add_shapes(std::vector<Shape>& v, const std::string& m, const std::string& n, const std::string& k,
                int random, uint64_t seed, const std::string& layouts) {
  const bool nk = layouts.find("nk") != std::string::npos, kn = layouts.find("kn") != std::string::npos;
  if (!nk && !kn) throw std::runtime_error("--layouts: nk, kn or both");
  auto add = [&](const std::string& set, const std::string& prefix, int M, int N, int K) {
    const std::string label = prefix + std::to_string(M) + "x" + std::to_string(N) + "x" + std::to_string(K);
    if (nk) v.push_back({label, M, N, K, false, set});
    if (kn) v.push_back({label, M, N, K, true, set});
  };
  for (const auto& [M, N, K] : b::explicit_shapes(m, n, k)) add("explicit", "", M, N, K);
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> dim(1, 16384);
  for (int i = 0; i < random; ++i) {
    const int M = dim(rng), N = dim(rng), K = dim(rng);
    add("random-" + std::to_string(seed), "r", M, N, K);
  }
}

int run(const std::vector<Shape>& shapes, const std::string& out, int warmup, int iters, bool check_only) {
  b::RowWriter rows(out);
  k::GemmWorkspace ws;
  ws.bytes = k::gemm_workspace_bytes(0);
  FC_BENCH_CUDA(cudaMalloc(&ws.ptr, ws.bytes));
  FC_BENCH_CUDA(cudaMemset(ws.ptr, 0, ws.bytes));
  void* staging = nullptr;  // the staged launch's copies (gemm.h), grown as shapes need
  size_t staging_bytes = 0;
  int failed = 0;
  for (const Shape& s : shapes) {
    const size_t mk = size_t(s.M) * s.K, nk = size_t(s.N) * s.K, mn = size_t(s.M) * s.N;
    __nv_bfloat16 *A, *B, *C;
    float *ref, *absdot;
    FC_BENCH_CUDA(cudaMalloc(&A, mk * 2));
    FC_BENCH_CUDA(cudaMalloc(&B, nk * 2));
    FC_BENCH_CUDA(cudaMalloc(&C, mn * 2));
    FC_BENCH_CUDA(cudaMalloc(&ref, mn * 4));
    FC_BENCH_CUDA(cudaMalloc(&absdot, mn * 4));
    b::fill_uniform(A, int64_t(mk), 1, nullptr);
    b::fill_uniform(B, int64_t(nk), 2, nullptr);
    k::GemmArgs a;
    a.A = A;
    a.B = B;
    a.C = C;
    a.lda = s.K;
    a.ldb = s.kn ? s.N : s.K;
    a.ldc = s.N;
    a.M = s.M;
    a.N = s.N;
    a.K = s.K;
    a.b_layout = s.kn ? k::GemmLayoutB::kKN : k::GemmLayoutB::kNK;
    k::use_workspace(a, ws);
    if (const size_t need = k::gemm_staging_bytes(a); need > staging_bytes) {
      FC_BENCH_CUDA(cudaFree(staging));
      FC_BENCH_CUDA(cudaMalloc(&staging, need));
      staging_bytes = need;
    }
    auto launch = [&] { return k::launch_gemm_staged(a, staging, staging_bytes, nullptr); };

    FC_BENCH_CUDA(cudaMemset(C, 0xFF, mn * 2));  // bf16 NaN: an unwritten element fails
    FC_BENCH_CUDA(launch());
    b::reference_gemm(A, a.lda, B, a.ldb, s.kn, s.M, s.N, s.K, ref, absdot, false, nullptr);
    const b::Mismatch m = b::compare_gemm(C, s.N, ref, absdot, s.M, s.N, 0.f, nullptr);
    FC_BENCH_CUDA(cudaFree(ref));
    FC_BENCH_CUDA(cudaFree(absdot));
    std::printf("%-24s %6d %6d %6d %s: check %s", s.label.c_str(), s.M, s.N, s.K, s.kn ? "kn" : "nk",
                m.count ? "FAILED" : "passed");
    if (m.count) {
      std::printf(" (%lld mismatches, first C[%lld] = %g, expected %g)\n", static_cast<long long>(m.count),
                  static_cast<long long>(m.index), m.got, m.want);
      ++failed;
    } else if (!check_only) {
      for (int i = 0; i < warmup; ++i) FC_BENCH_CUDA(launch());
      std::vector<cudaEvent_t> e0(iters), e1(iters);
      for (int i = 0; i < iters; ++i) {
        FC_BENCH_CUDA(cudaEventCreate(&e0[i]));
        FC_BENCH_CUDA(cudaEventCreate(&e1[i]));
      }
      for (int i = 0; i < iters; ++i) {
        FC_BENCH_CUDA(cudaEventRecord(e0[i]));
        FC_BENCH_CUDA(launch());
        FC_BENCH_CUDA(cudaEventRecord(e1[i]));
      }
      FC_BENCH_CUDA(cudaDeviceSynchronize());
      std::vector<double> ms(iters);
      for (int i = 0; i < iters; ++i) {
        float t = 0;
        FC_BENCH_CUDA(cudaEventElapsedTime(&t, e0[i], e1[i]));
        ms[i] = t;
        FC_BENCH_CUDA(cudaEventDestroy(e0[i]));
        FC_BENCH_CUDA(cudaEventDestroy(e1[i]));
      }
      const double med = b::median(ms);
      const double tflops = 2.0 * s.M * s.N * s.K / (med * 1e-3) / 1e12;
      std::printf(", %.4f ms, %.1f TFLOP/s\n", med, tflops);
      b::Row shape;
      shape.integer("m", s.M).integer("n", s.N).integer("k", s.K).str("layout", s.kn ? "kn" : "nk");
      b::Row r;
      r.str("family", "gemm")
          .str("op", "gemm")
          .str("impl", "fusedcomm")
          .integer("world", 1)
          .obj("shape", shape)
          .str("dtype", "bf16")
          .num("ms_median", med)
          .num("tflops", tflops)
          .null("gbps")
          .str("label", s.label);
      if (!s.set.empty()) r.str("set", s.set);
      rows.write(r);
    } else {
      std::printf("\n");
    }
    std::fflush(stdout);
    FC_BENCH_CUDA(cudaFree(A));
    FC_BENCH_CUDA(cudaFree(B));
    FC_BENCH_CUDA(cudaFree(C));
  }
  FC_BENCH_CUDA(cudaFree(ws.ptr));
  FC_BENCH_CUDA(cudaFree(staging));
  return failed ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  b::Args args(argc, argv, kUsage);
  const std::string shapes_path = args.str("shapes", "");
  const std::string m = args.str("m", ""), n = args.str("n", ""), kk = args.str("k", "");
  const int random = static_cast<int>(args.num("random", 0));
  const bool seeded = !args.str("seed", "").empty();
  const uint64_t seed = seeded ? static_cast<uint64_t>(args.num("seed", 0)) : std::random_device{}();
  const std::string layouts = args.str("layouts", "nk,kn");
  const std::string out = args.str("out", "");
  const int warmup = static_cast<int>(args.num("warmup", 10));
  const int iters = static_cast<int>(args.num("iters", 50));
  const bool check_only = args.flag("check-only");
  args.done();
  if (shapes_path.empty() && m.empty() && random == 0) args.fail("give --shapes, --m/--n/--k or --random");
  if (warmup < 0 || iters < 1 || random < 0) args.fail("--warmup, --random must be >= 0 and --iters >= 1");
  try {
    std::vector<Shape> shapes = shapes_path.empty() ? std::vector<Shape>{} : read_shapes(shapes_path);
    add_shapes(shapes, m, n, kk, random, seed, layouts);
    if (random > 0) {
      std::printf("random set: %d shapes, M, N, K uniform in [1, 16384], seed %llu\n", random,
                  static_cast<unsigned long long>(seed));
    }
    int gpus = 0;
    if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus == 0) {
      std::printf("SKIP: no CUDA GPU visible\n");
      return 77;
    }
    return run(shapes, out, warmup, iters, check_only);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gemm_bench: %s\n", e.what());
    return 1;
  }
}
