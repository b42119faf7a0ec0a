// gpu_hosts_fused_test: allGatherGemm and gemmReduceScatter across "virtual hosts" as one kernel
// each (cross_host_paths.h: the proxy's lanes inside the fused kernel bring the other hosts' rows
// while the GEMM runs, or send the other hosts their rows' partials as the tiles complete), and
// gemmAllReduce as gemmReduceScatter's kernel then the hierarchical allGather, against the
// decomposed paths they replace (the hierarchical allGather, then our GEMM; our GEMM, then the
// hierarchical reduceScatter or allReduce), through
// CudaComm as the C API drives it: one forked process per rank, H hosts of L ranks, each rank
// with its own Runtime and transport on the loopback (FUSEDCOMM_TRANSPORT picks socket or
// libfabric). The one kernel runs where every host has one rank (L = 1); elsewhere both forms
// are the decomposed path and the test says so.
// Checks, each form: small-integer A and W (every product and sum exact in fp32 and bf16, in
// any order) against the exact product, bit for bit: M divisible by W and not, NK and KN;
// allGatherGemm with and without the gathered A (checked too), gemmReduceScatter and
// gemmAllReduce with fp32 and bf16 partials (gemmAllReduce on both sides of its 4 MiB bar, and
// at M < W, where a rank owns no rows); on the communicator's stream and 10 back to back on a
// caller's stream; describe_fused names the one kernel where it runs.
// Timing (FC_TEST_TIME=0 skips it; FC_TEST_ONLY=<op> times that op alone): per op and shape,
// after checking that both forms give the same output (random bf16 inputs, within bf16 rounding
// of each other), each form in turn: 2 warm-up launches, then 5 rounds of `n` back-to-back
// launches between CUDA events after a barrier;
// prints rank 0's median per launch and the ratio fused / decomposed (FC_TEST_JSON=<file>:
// one row per shape and form in the fused family's schema, appended: `fusedcomm` the one
// kernel, which the op runs at L = 1, `fusedcomm_decomposed` the other form).
// FC_TEST_HOSTS=<H> (default 2), FC_TEST_LOCAL=<L> (default GPUs / H); FC_TEST_SHARED_GPU=<n>
// lets ranks share GPUs (timings meaningless). Exit 77 (skip) with a reason without a Hopper GPU.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "fusedcomm/comm/cuda_comm.h"
#include "fusedcomm/runtime/runtime.h"
#include "fusedcomm/runtime/split.h"
#include "support/cuda_comm_support.h"
#include "support/gpu_test_support.h"
#include "support/host_ops_support.h"
#include "support/process_group.h"
#include "support/proxy_test_support.h"

namespace {

using fusedcomm::CudaComm;
using fusedcomm::DType;
using fusedcomm::Op;
using fusedcomm::PartialPrecision;
using fusedcomm::Runtime;
using fusedcomm::split_count;
using fusedcomm::split_offset;
using fusedcomm::WeightLayout;
using fusedcomm::testing::check;
using fusedcomm::testing::DevBuf;
using fusedcomm::testing::download;
using fusedcomm::testing::ProcessGroup;
using fusedcomm::testing::upload;

constexpr int64_t kTimeoutMs = 60000;
const fusedcomm::OpDesc kDesc{"gpu_hosts_fused_test", 0};

uint16_t bf16_bits(float f) { return fusedcomm::testing::host_ops::ref_round_bf16(f); }
using fusedcomm::testing::host_ops::bf16_value;
// A small integer in [-1, 1] for (rank, index): every sum of K <= 256 products is exact.
int small(uint64_t seed, int r, int64_t i) {
  return static_cast<int>(fusedcomm::testing::mix(seed ^ static_cast<uint64_t>(r) << 48 ^ static_cast<uint64_t>(i)) %
                          3) -
         1;
}

struct Shape {
  int64_t m, n, k;
};

// The ops: allGatherGemm (Shape: M, N_r, K), gemmReduceScatter and gemmAllReduce (M, N, K_r).
enum class Fused { kAg, kRs, kAr };
const char* op_name(Fused op) {
  return op == Fused::kAg ? "allGatherGemm" : op == Fused::kRs ? "gemmReduceScatter" : "gemmAllReduce";
}

// One op on `stream` (null: the communicator's own). gemmReduceScatter, gemmAllReduce: `partials`.
void run_op(CudaComm& dc, Fused op, const DevBuf& a, const DevBuf& w, const DevBuf& c, const DevBuf* gathered,
            const Shape& s, WeightLayout layout, cudaStream_t stream,
            PartialPrecision partials = PartialPrecision::kF32) {
  if (op == Fused::kAg) {
    dc.all_gather_gemm(kDesc, DType::kBF16, a.p, w.p, c.p, gathered != nullptr ? gathered->p : nullptr, s.m,
                       s.n, s.k, layout, stream);
  } else if (op == Fused::kRs) {
    dc.gemm_reduce_scatter(kDesc, DType::kBF16, a.p, w.p, c.p, s.m, s.n, s.k, layout, partials, stream);
  } else {
    dc.gemm_all_reduce(kDesc, DType::kBF16, a.p, w.p, c.p, s.m, s.n, s.k, layout, partials, stream);
  }
}

// The exact checks of one form (fused on or off) at one shape, layout and gathered choice.
void check_exact(ProcessGroup& g, CudaComm& dc, uint64_t seed, const Shape& s, WeightLayout layout, bool gathered,
                 const std::string& form, cudaStream_t stream) {
  const int W = g.world, r = g.rank;
  const int64_t rows = split_count(s.m, W, r);
  std::vector<uint16_t> a(rows * s.k), w(s.n * s.k);
  for (int64_t i = 0; i < rows * s.k; ++i) a[i] = bf16_bits(static_cast<float>(small(seed, r, i)));
  for (int64_t i = 0; i < s.n * s.k; ++i) w[i] = bf16_bits(static_cast<float>(small(seed ^ 0x77, r, i)));
  // Reference from every rank's rows (rebuilt here from the seed).
  std::vector<float> full(s.m * s.k);
  for (int q = 0; q < W; ++q) {
    const int64_t off = split_offset(s.m, W, q), n = split_count(s.m, W, q);
    for (int64_t i = 0; i < n * s.k; ++i) full[off * s.k + i] = static_cast<float>(small(seed, q, i));
  }
  std::vector<uint16_t> want(s.m * s.n);
  for (int64_t i = 0; i < s.m; ++i) {
    for (int64_t j = 0; j < s.n; ++j) {
      float acc = 0;
      for (int64_t kk = 0; kk < s.k; ++kk) {
        // w as laid out: NK is n × k, KN is k × n (the same values, transposed).
        const float wv = static_cast<float>(layout == WeightLayout::kNK ? bf16_value(w[j * s.k + kk])
                                                                         : bf16_value(w[kk * s.n + j]));
        acc += full[i * s.k + kk] * wv;
      }
      want[i * s.n + j] = bf16_bits(acc);
    }
  }
  DevBuf da = upload(a, stream, 16), dw = upload(w, stream, 16);
  DevBuf dc_out(s.m * s.n * 2), dg(s.m * s.k * 2);
  const std::string what = form + " M=" + std::to_string(s.m) + " N=" + std::to_string(s.n) + " K=" +
                           std::to_string(s.k) + (layout == WeightLayout::kNK ? " NK" : " KN") +
                           (gathered ? " gathered" : "");
  for (int pass = 0; pass < 2; ++pass) {  // the communicator's stream, then 10 on the caller's
    CUDA_OK(cudaMemset(dc_out.p, 0xFF, dc_out.bytes));
    CUDA_OK(cudaMemset(dg.p, 0xFF, dg.bytes));
    try {
      if (pass == 0) {
        run_op(dc, Fused::kAg, da, dw, dc_out, gathered ? &dg : nullptr, s, layout, nullptr);
      } else {
        for (int i = 0; i < 10; ++i) run_op(dc, Fused::kAg, da, dw, dc_out, gathered ? &dg : nullptr, s, layout, stream);
        CUDA_OK(cudaStreamSynchronize(stream));
        dc.synchronize();
      }
    } catch (const std::exception& e) {
      check(false, what + ": threw " + e.what());
      return;
    }
    check(download<uint16_t>(dc_out.p, s.m * s.n) == want,
          what + (pass ? " (10 on a caller stream)" : "") + ": C differs from the exact product");
    if (gathered) {
      std::vector<uint16_t> got = download<uint16_t>(dg.p, s.m * s.k), exp(s.m * s.k);
      for (int64_t i = 0; i < s.m * s.k; ++i) exp[i] = bf16_bits(full[i]);
      check(got == exp, what + ": the gathered A differs");
    }
  }
}

// gemmReduceScatter's and gemmAllReduce's exact checks: rows r (gemmAllReduce: every row) of
// Σ_s A_s · op(W_s), A_s M×K and W_s N×K (or K×N) of small integers, |sums| <= W·K <= 256.
void check_exact_rs(ProcessGroup& g, CudaComm& dc, Fused op, uint64_t seed, const Shape& s, WeightLayout layout,
                    PartialPrecision partials, const std::string& form, cudaStream_t stream) {
  const int W = g.world, r = g.rank;
  auto a_of = [&](int q, int64_t i) { return static_cast<float>(small(seed, q, i)); };
  auto w_of = [&](int q, int64_t i) { return static_cast<float>(small(seed ^ 0x77, q, i)); };
  std::vector<uint16_t> a(s.m * s.k), w(s.n * s.k);
  for (int64_t i = 0; i < s.m * s.k; ++i) a[i] = bf16_bits(a_of(r, i));
  for (int64_t i = 0; i < s.n * s.k; ++i) w[i] = bf16_bits(w_of(r, i));
  const bool all = op == Fused::kAr;
  const int64_t off = all ? 0 : split_offset(s.m, W, r), rows = all ? s.m : split_count(s.m, W, r);
  std::vector<uint16_t> want(rows * s.n);
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < s.n; ++j) {
      float acc = 0;
      for (int q = 0; q < W; ++q) {
        for (int64_t kk = 0; kk < s.k; ++kk) {
          const float wv = layout == WeightLayout::kNK ? w_of(q, j * s.k + kk) : w_of(q, kk * s.n + j);
          acc += a_of(q, (off + i) * s.k + kk) * wv;
        }
      }
      want[i * s.n + j] = bf16_bits(acc);
    }
  }
  DevBuf da = upload(a, stream, 16), dw = upload(w, stream, 16), out(std::max<int64_t>(rows, 1) * s.n * 2, 16);
  const std::string what = form + " " + op_name(op) + " M=" + std::to_string(s.m) + " N=" + std::to_string(s.n) +
                           " K=" + std::to_string(s.k) + (layout == WeightLayout::kNK ? " NK" : " KN") +
                           (partials == PartialPrecision::kBF16 ? " bf16 partials" : " fp32 partials");
  for (int pass = 0; pass < 2; ++pass) {
    CUDA_OK(cudaMemset(out.p, 0xFF, out.bytes));
    try {
      if (pass == 0) {
        run_op(dc, op, da, dw, out, nullptr, s, layout, nullptr, partials);
      } else {
        for (int i = 0; i < 10; ++i) run_op(dc, op, da, dw, out, nullptr, s, layout, stream, partials);
        CUDA_OK(cudaStreamSynchronize(stream));
        dc.synchronize();
      }
    } catch (const std::exception& e) {
      check(false, what + ": threw " + e.what());
      return;
    }
    check(download<uint16_t>(out.p, rows * s.n) == want,
          what + (pass ? " (10 on a caller stream)" : "") + ": the sums differ from the exact ones");
  }
}

// Milliseconds per launch, rank 0's median over 5 rounds of n launches.
double time_form(ProcessGroup& g, CudaComm& dc, Fused op, const DevBuf& a, const DevBuf& w, const DevBuf& c,
                 const Shape& s, int n, cudaStream_t stream) {
  for (int i = 0; i < 2; ++i) run_op(dc, op, a, w, c, nullptr, s, WeightLayout::kNK, stream);
  CUDA_OK(cudaStreamSynchronize(stream));
  dc.synchronize();
  cudaEvent_t e0, e1;
  CUDA_OK(cudaEventCreate(&e0));
  CUDA_OK(cudaEventCreate(&e1));
  std::vector<double> ms;
  for (int round = 0; round < 5; ++round) {
    g.barrier();
    CUDA_OK(cudaEventRecord(e0, stream));
    for (int i = 0; i < n; ++i) run_op(dc, op, a, w, c, nullptr, s, WeightLayout::kNK, stream);
    CUDA_OK(cudaEventRecord(e1, stream));
    CUDA_OK(cudaStreamSynchronize(stream));
    dc.synchronize();  // raises what an op enqueued on the stream reported
    float t = 0;
    CUDA_OK(cudaEventElapsedTime(&t, e0, e1));
    ms.push_back(t / n);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

void time_shapes(ProcessGroup& g, CudaComm& dc, uint64_t seed, int H, int L, cudaStream_t stream) {
  // (M, N_r, K) and (M, N, K_r): the exchange dominating, the two nearer even, the GEMM's share
  // largest (over TCP on the loopback the exchange dominates every shape).
  const std::vector<std::pair<Fused, Shape>> cases = {
      {Fused::kAg, {8192, 7168, 4096}},  {Fused::kAg, {8192, 28672, 4096}}, {Fused::kAg, {4096, 28672, 1024}},
      {Fused::kAg, {16384, 8192, 8192}}, {Fused::kRs, {4096, 8192, 4096}},  {Fused::kRs, {8192, 4096, 14336}},
      {Fused::kRs, {2048, 8192, 28672}}, {Fused::kRs, {16384, 8192, 4096}}, {Fused::kAr, {64, 8192, 4096}},
      {Fused::kAr, {256, 8192, 4096}},   {Fused::kAr, {1024, 8192, 4096}},  {Fused::kAr, {4096, 8192, 4096}},
      {Fused::kAr, {2048, 8192, 28672}}};
  const int W = g.world, r = g.rank;
  const char* only = std::getenv("FC_TEST_ONLY");
  for (const auto& [op, s] : cases) {
    if (only != nullptr && *only && std::strcmp(only, op_name(op)) != 0) continue;
    const bool ag = op == Fused::kAg;
    const int64_t a_rows = ag ? split_count(s.m, W, r) : s.m;
    const int64_t c_elems = op == Fused::kRs ? split_count(s.m, W, r) * s.n : s.m * s.n;
    std::vector<uint16_t> a(a_rows * s.k), w(s.n * s.k);
    for (int64_t i = 0; i < a_rows * s.k; ++i) a[i] = bf16_bits(0.125f * small(seed ^ 0x31, r, i));
    for (int64_t i = 0; i < s.n * s.k; ++i) w[i] = bf16_bits(0.125f * small(seed ^ 0x32, r, i));
    DevBuf da = upload(a, stream, 16), dw = upload(w, stream, 16), cf(c_elems * 2, 16), cd(c_elems * 2, 16);
    // Both forms' output first, compared (the same GEMM, its tiles and K splits possibly
    // differing: within bf16 rounding).
    dc.set_fused_across_hosts(true);
    run_op(dc, op, da, dw, cf, nullptr, s, WeightLayout::kNK, nullptr);
    dc.set_fused_across_hosts(false);
    run_op(dc, op, da, dw, cd, nullptr, s, WeightLayout::kNK, nullptr);
    const std::vector<uint16_t> f = download<uint16_t>(cf.p, c_elems), d = download<uint16_t>(cd.p, c_elems);
    double worst = 0;
    for (size_t i = 0; i < f.size(); ++i) {
      const double x = bf16_value(f[i]), y = bf16_value(d[i]);
      worst = std::max(worst, std::fabs(x - y) / (std::fabs(y) + 1.0));
    }
    const std::string label = std::string(op_name(op)) + " M=" + std::to_string(s.m) + " N=" + std::to_string(s.n) +
                              " K=" + std::to_string(s.k);
    check(worst <= 1.0 / 64, label + ": fused and decomposed outputs differ by " + std::to_string(worst));
    // Launches per round: about 50 ms of the decomposed form (rank 0's estimate, shared).
    const double one = time_form(g, dc, op, da, dw, cd, s, 1, stream);
    std::vector<uint8_t> est(sizeof(double));
    std::memcpy(est.data(), &one, sizeof one);
    double t0;
    std::memcpy(&t0, g.all_gather(est)[0].data(), sizeof t0);
    const int n = std::clamp(static_cast<int>(50.0 / std::max(t0, 1e-3)), 2, 200);
    dc.set_fused_across_hosts(false);
    const double dec = time_form(g, dc, op, da, dw, cd, s, n, stream);
    dc.set_fused_across_hosts(true);
    const double fus = time_form(g, dc, op, da, dw, cf, s, n, stream);
    if (r == 0) {
      std::printf("  %s: fused %.3f ms, decomposed %.3f ms, ratio %.3f (%d per round)\n", label.c_str(), fus, dec,
                  fus / dec, n);
      if (const char* path = std::getenv("FC_TEST_JSON")) {
        // bench/README.md's row schema (family fused); the caller adds device, gpus, commit
        // and date (bench/report.py).
        const char* transport = std::getenv("FUSEDCOMM_TRANSPORT");
        if (FILE* out = std::fopen(path, "a")) {
          for (int form = 0; form < 2; ++form) {
            const double ms = form == 0 ? fus : dec;
            std::fprintf(out,
                         "{\"family\": \"fused\", \"op\": \"%s across hosts\", \"impl\": \"%s\", \"world\": %d, "
                         "\"shape\": {\"m\": %lld, \"n\": %lld, \"k\": %lld}, \"label\": \"%d hosts x %d, %s\", "
                         "\"dtype\": \"bf16\", \"ms_median\": %.6f, \"tflops\": %.3f, \"gbps\": null}\n",
                         op_name(op), form == 0 ? "fusedcomm" : "fusedcomm_decomposed", W,
                         static_cast<long long>(s.m), static_cast<long long>(s.n), static_cast<long long>(s.k), H, L,
                         transport != nullptr && *transport ? transport : "socket", ms,
                         2.0 * s.m * s.n * s.k / (ms * 1e9));
          }
          std::fclose(out);
        }
      }
    }
  }
}

int rank_main(ProcessGroup& g, int H, int L, int gpus, bool shared, uint64_t seed) {
  const int rank = g.rank;
  CUDA_OK(cudaSetDevice(rank % gpus));
  Runtime rt(fusedcomm::testing::loopback_cuda_config(rank % gpus, seed, kTimeoutMs, int64_t{640} << 20, shared));
  std::vector<int> host_of(g.world);
  for (int r = 0; r < g.world; ++r) host_of[r] = r / L;
  auto dc = fusedcomm::testing::make_cuda_comm(rt, g, 7100, host_of);
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  // gemmAllReduce takes the one kernel from a 4 MiB product only (cross_host_paths.cc).
  for (const auto& [op, m, fused] : {std::tuple{Op::kAllGatherGemm, 1000, true},
                                     std::tuple{Op::kGemmReduceScatter, 1000, true},
                                     std::tuple{Op::kGemmAllReduce, 4096, true},
                                     std::tuple{Op::kGemmAllReduce, 1000, false}}) {
    const std::string said = dc->describe_fused(op, m, op == Op::kGemmAllReduce ? 1024 : 72, 200,
                                                PartialPrecision::kF32);
    if (rank == 0) std::printf("  describe_fused: %s\n", said.c_str());
    check((said.find("fused across hosts") != std::string::npos) == (fused && L == 1),
          "describe_fused names the one kernel exactly where every host has one rank and the op takes it (got '" +
              said + "')");
  }
  for (int form = 0; form < 2; ++form) {
    dc->set_fused_across_hosts(form == 0);
    const std::string name = form == 0 ? (L == 1 ? "one kernel" : "fused setting (decomposed at L > 1)")
                                       : "decomposed";
    for (const Shape& s : {Shape{1000, 72, 200}, Shape{257, 136, 64}, Shape{4096, 256, 256}}) {
      check_exact(g, *dc, seed, s, WeightLayout::kNK, false, name, stream);
      check_exact(g, *dc, seed ^ 1, s, WeightLayout::kKN, true, name, stream);
    }
    for (const Shape& s : {Shape{1000, 72, 104}, Shape{257, 136, 64}, Shape{4096, 512, 128}}) {
      check_exact_rs(g, *dc, Fused::kRs, seed ^ 2, s, WeightLayout::kNK, PartialPrecision::kF32, name, stream);
      check_exact_rs(g, *dc, Fused::kRs, seed ^ 3, s, WeightLayout::kKN, PartialPrecision::kBF16, name, stream);
    }
    // The one kernel from a 4 MiB product (M = 2051: W not dividing M), below it our GEMM and
    // allReduce (M < W: a rank owns no rows).
    for (const Shape& s : {Shape{2048, 1024, 64}, Shape{2051, 1032, 48}, Shape{257, 136, 64}, Shape{1, 64, 128}}) {
      check_exact_rs(g, *dc, Fused::kAr, seed ^ 4, s, WeightLayout::kNK, PartialPrecision::kF32, name, stream);
      check_exact_rs(g, *dc, Fused::kAr, seed ^ 5, s, WeightLayout::kKN, PartialPrecision::kBF16, name, stream);
    }
  }
  const char* t = std::getenv("FC_TEST_TIME");
  if ((t == nullptr || std::strcmp(t, "0") != 0) && !shared) time_shapes(g, *dc, seed, H, L, stream);
  dc->close();
  CUDA_OK(cudaStreamDestroy(stream));
  return fusedcomm::testing::rank_result(rank);
}

}  // namespace

int main() { return fusedcomm::testing::run_virtual_hosts("gpu_hosts_fused_test", rank_main); }
