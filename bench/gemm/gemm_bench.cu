// gemm_bench: our GEMM (launch_gemm) on the shapes of a list, one GPU. Each shape's output is
// checked element by element against an fp32 reference GEMM first (output poisoned before the
// launch), then timed: `warmup` launches, then `iters` launches with one CUDA event pair each and
// no synchronisation between them (host launch latency stays out of the device times); the row
// holds the median. Ours is launched as the runtime launches it: with a stream-K workspace, every
// plan choice (tile width, stream-K, ping-pong) left to the launch.
//
// run.sh publishes torch_gemm.py's rows instead, which time this same launch (gemm_lib.cu)
// interleaved with cuBLAS on the same tensors; this driver needs no Python.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdio>
#include <string>
#include <vector>

#include "bench/common/bench_util.h"
#include "bench/common/check.h"
#include "kernels/gemm/gemm.h"

namespace b = fusedcomm::bench;
namespace k = fusedcomm::kernels;

namespace {

const char* kUsage =
    "usage: gemm_bench --shapes FILE [--out ROWS.jsonl] [--warmup 10] [--iters 50] [--check-only]\n"
    "  FILE: one shape per line, \"<label> <M> <N> <K> <nk|kn>\" (bench/shapes/gemm.txt);\n"
    "  nk: C = A * B^T with B: N x K (a linear layer's weight), kn: C = A * B with B: K x N.\n"
    "  Rows (impl fusedcomm) go to --out as JSON lines; a summary line per shape to stdout.\n"
    "  Exit 0: every shape passed its check; 1: a mismatch or a CUDA error; 77: no GPU.\n";

struct Shape {
  std::string label;
  int M, N, K;
  bool kn;
};

std::vector<Shape> read_shapes(const std::string& path) {
  std::vector<Shape> v;
  for (const auto& w : b::read_shape_lines(path)) {
    if (w.size() != 5 || (w[4] != "nk" && w[4] != "kn")) {
      throw std::runtime_error(path + ": expected \"<label> <M> <N> <K> <nk|kn>\"");
    }
    v.push_back({w[0], std::stoi(w[1]), std::stoi(w[2]), std::stoi(w[3]), w[4] == "kn"});
  }
  return v;
}

int run(const std::vector<Shape>& shapes, const std::string& out, int warmup, int iters, bool check_only) {
  b::RowWriter rows(out);
  k::GemmWorkspace ws;
  ws.bytes = k::gemm_workspace_bytes(0);
  FC_BENCH_CUDA(cudaMalloc(&ws.ptr, ws.bytes));
  FC_BENCH_CUDA(cudaMemset(ws.ptr, 0, ws.bytes));
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

    FC_BENCH_CUDA(cudaMemset(C, 0xFF, mn * 2));  // bf16 NaN: an unwritten element fails
    FC_BENCH_CUDA(k::launch_gemm(a, nullptr));
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
      for (int i = 0; i < warmup; ++i) FC_BENCH_CUDA(k::launch_gemm(a, nullptr));
      std::vector<cudaEvent_t> e0(iters), e1(iters);
      for (int i = 0; i < iters; ++i) {
        FC_BENCH_CUDA(cudaEventCreate(&e0[i]));
        FC_BENCH_CUDA(cudaEventCreate(&e1[i]));
      }
      for (int i = 0; i < iters; ++i) {
        FC_BENCH_CUDA(cudaEventRecord(e0[i]));
        FC_BENCH_CUDA(k::launch_gemm(a, nullptr));
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
  return failed ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  b::Args args(argc, argv, kUsage);
  const std::string shapes_path = args.str("shapes", "");
  const std::string out = args.str("out", "");
  const int warmup = static_cast<int>(args.num("warmup", 10));
  const int iters = static_cast<int>(args.num("iters", 50));
  const bool check_only = args.flag("check-only");
  args.done();
  if (shapes_path.empty()) args.fail("--shapes is required");
  if (warmup < 0 || iters < 1) args.fail("--warmup must be >= 0 and --iters >= 1");
  try {
    const std::vector<Shape> shapes = read_shapes(shapes_path);
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
