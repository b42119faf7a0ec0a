// fused_bench: our fused GEMM + communication ops among one forked process per GPU, bf16, on
// the shapes of a list (bench/shapes/fused.txt), with the parts that bound them. Per shape:
//   fusedcomm             the op as users get it (FusedAlgo::kAuto; the row's "algo" says
//                         which path kAuto took)
//   fusedcomm_fused       the fused kernel, forced
//   fusedcomm_decomposed  launch_gemm + launch_collective, forced
//   fusedcomm_oneshot     gemmAllReduce's one-shot kernel, forced (M <= 2048)
//   fusedcomm_graph       gemmAllReduce as users get it, captured in a CUDA graph (a replay
//                         per call, as decode loops run it)
//   fusedcomm_gemm_only   this rank's GEMM alone (same local shape)
//   fusedcomm_comm_only   the exchange alone (allGather of A; reduceScatter / allReduce of the
//                         partials the decomposed path moves)
// The two parts give the floor max(T_gemm, T_comm) (report.py). Every op path is checked on
// every rank against an fp32 reference first (inputs seeded per rank, so each rank rebuilds its
// peers'; outputs poisoned before the launch), then timed. Inputs sit in the symmetric memory's
// data area as the runtime places them; GEMMs get a stream-K workspace as the runtime's do.
//
// Timing, after every shape was checked, per shape: for each impl 2 warm-up launches and one
// timed launch that sizes its batches (rank 0's estimate, shared); then, by default, each impl
// in turn runs back to back for --sustain-ms so that it is timed at the clock its own power
// draw sustains on a power-capped GPU, then its --batches batches of back-to-back launches
// between CUDA events (a barrier and a stream sync before each batch); --sustain-ms 0: the
// batches run round robin over the impls instead. ms_median: rank 0's median over batches of the per-launch mean;
// ms_ranks: every rank's own (the GEMM alone runs each GPU on its own, and the slowest GPU's
// GEMM bounds the fused op). torch_fused.py times the baselines the same way.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "bench/common/bench_util.h"
#include "bench/common/check.h"
#include "bench/common/ranks.h"
#include "fusedcomm/runtime/symmetric_memory.h"
#include "kernels/ag_gemm/ag_gemm.h"
#include "kernels/collectives/collectives.h"
#include "kernels/common/fused.h"
#include "kernels/gemm/gemm.h"
#include "kernels/gemm_ar/gemm_ar.h"
#include "kernels/gemm_rs/gemm_rs.h"

namespace b = fusedcomm::bench;
namespace k = fusedcomm::kernels;

namespace {

const char* kUsage =
    "usage: fused_bench --world W (--shapes FILE | --m M,... --n N,... --k K,...) [--out ROWS.jsonl]\n"
    "                   [--ops ag,rs,ar]\n"
    "                   [--rs-partials f32|bf16|f32any] [--ag-gathered 1|0] [--ag-exchange auto|sm|ce]\n"
    "                   [--batch-ms 25] [--batches 7] [--sustain-ms 500]\n"
    "  FILE: one shape per line, \"<op> <label> <M> <N> <K> [<set>]\" (bench/shapes/fused.txt; a\n"
    "  set, e.g. random_shapes.py's random-<seed>, goes into the rows and tabulates apart); N is\n"
    "  split over the ranks for allGatherGemm, K for gemmReduceScatter and gemmAllReduce.\n"
    "  --m/--n/--k: explicit shapes (label \"explicit\"), each a comma list, the i-th M with the i-th\n"
    "  N and K (a single value stands for all), run for every op of --ops; with --shapes too, both.\n"
    "  M is any count (the ranks' rows split as the ops split them); the split N or K must give\n"
    "  each rank a multiple of 8 (the fused ops' contract): a shape that does not is refused,\n"
    "  never padded.\n"
    "  --ops: which ops of the list (ag allGatherGemm, rs gemmReduceScatter, ar gemmAllReduce).\n"
    "  --rs-partials: the partial products' precision of gemmReduceScatter and gemmAllReduce\n"
    "  (f32: the default, rounded once; bf16: the baselines' precision; f32any: fp32 summed in any\n"
    "  order). --ag-gathered 0: allGatherGemm without the gathered A output. --ag-exchange: the\n"
    "  fused allGatherGemm's exchange (SM pulls or copy engines), forced.\n"
    "  Rows go to --out as JSON lines (rank 0).\n"
    "  Exit 0: every check passed; 1: a mismatch or an error; 77: fewer than W GPUs.\n";

struct Shape {
  std::string op;     // allGatherGemm, gemmReduceScatter, gemmAllReduce
  std::string label;  // e.g. llama3-70b
  int M, N, K;        // local: N = N_r (allGatherGemm), K = K_r (the others)
  std::string set;    // the shape set the line names (empty: the headline list)
};

struct Options {
  int world = 2;
  std::string shapes, out;
  std::string m, n, k;  // explicit shapes (comma lists)
  bool ag = true, rs = true, ar = true;
  double batch_ms = 25, sustain_ms = 500;
  int batches = 7;
  std::string rs_partials = "f32";
  k::RsPartials rs_code = k::RsPartials::kF32;
  bool ag_gathered = true;
  std::string ag_exchange = "auto";
  k::AgExchange ag_exchange_code = k::AgExchange::kAuto;
  bool rs_bf16() const { return rs_code == k::RsPartials::kBF16; }
};

// The shape list: the file's lines, then the explicit shapes for each op of --ops; N
// (allGatherGemm) or K (the others) made the rank's share. A share off the multiple of 8 is
// refused with every such shape named.
std::vector<Shape> read_shapes(const Options& o, int W) {
  std::vector<Shape> all;
  if (!o.shapes.empty()) {
    for (const auto& w : b::read_shape_lines(o.shapes)) {
      if (w.size() != 5 && w.size() != 6) {
        throw std::runtime_error(o.shapes + ": expected \"<op> <label> <M> <N> <K> [<set>]\"");
      }
      Shape s{w[0], w[1], std::stoi(w[2]), std::stoi(w[3]), std::stoi(w[4]), w.size() == 6 ? w[5] : ""};
      if (s.op != "allGatherGemm" && s.op != "gemmReduceScatter" && s.op != "gemmAllReduce") {
        throw std::runtime_error(o.shapes + ": unknown op " + s.op);
      }
      all.push_back(s);
    }
  }
  for (const auto& [m, n, k] : b::explicit_shapes(o.m, o.n, o.k)) {
    if (o.ag) all.push_back({"allGatherGemm", "explicit", m, n, k, ""});
    if (o.rs) all.push_back({"gemmReduceScatter", "explicit", m, n, k, ""});
    if (o.ar) all.push_back({"gemmAllReduce", "explicit", m, n, k, ""});
  }
  std::vector<Shape> v;
  std::string refused;
  for (Shape s : all) {
    const bool is_ag = s.op == "allGatherGemm";
    if (!(is_ag ? o.ag : s.op == "gemmReduceScatter" ? o.rs : o.ar)) continue;
    if (s.M < 1 || s.N < 1 || s.K < 1)
      throw std::runtime_error(s.op + " " + s.label + ": dimensions must be >= 1");
    int& split = is_ag ? s.N : s.K;
    if (split % (8 * W) != 0) {
      refused += "\n  " + s.op + " " + s.label + " " + std::to_string(s.M) + " x " + std::to_string(s.N) +
                 " x " + std::to_string(s.K) + ": " + (is_ag ? "N" : "K") + " = " + std::to_string(split) +
                 " does not split into multiples of 8 over " + std::to_string(W) + " ranks";
      continue;
    }
    split /= W;
    v.push_back(s);
  }
  if (!refused.empty()) {
    throw std::runtime_error(
        "shapes refused (the fused ops take a rank's N or K in multiples of 8; nothing is "
        "padded):" +
        refused);
  }
  if (v.empty()) throw std::runtime_error("no shape of the chosen ops");
  return v;
}

// gemmAllReduce: the forced one-shot kernel is timed up to this M.
constexpr int kOneShotMaxBenchM = 2048;

const char* algo_name(k::FusedAlgo a) {
  return a == k::FusedAlgo::kFused ? "fused" : a == k::FusedAlgo::kOneShot ? "one-shot" : "decomposed";
}

int64_t split_count(int64_t n, int w, int r) { return n / w + (r < n % w ? 1 : 0); }
int64_t split_offset(int64_t n, int w, int r) { return r * (n / w) + (r < n % w ? r : n % w); }

// Input seeds: rank r's A and B of every shape (element i of a tensor is a hash of its seed and
// i, so a prefix of a longer fill is the fill of the shorter tensor).
uint64_t seed_a(int r) { return 1000 + r; }
uint64_t seed_b(int r) { return 2000 + r; }

// Instantiated CUDA graphs, destroyed at scope exit.
struct GraphExecs : std::vector<cudaGraphExec_t> {
  GraphExecs() = default;
  GraphExecs(const GraphExecs&) = delete;
  GraphExecs& operator=(const GraphExecs&) = delete;
  ~GraphExecs() {
    for (cudaGraphExec_t e : *this) cudaGraphExecDestroy(e);
  }
};

template <class T>
T* device_alloc(size_t count) {
  void* p = nullptr;
  FC_BENCH_CUDA(cudaMalloc(&p, std::max<size_t>(count, 1) * sizeof(T) + 256));
  return static_cast<T*>(p);
}

int bench(fusedcomm::testing::ProcessGroup& g, const Options& o) {
  const int W = g.world, r = g.rank;
  FC_BENCH_CUDA(cudaSetDevice(r));
  const std::vector<Shape> list = read_shapes(o, W);

  // Sizes: the largest of every buffer over the shapes. Data area: the allGatherGemm inputs
  // from offset 0, the gemmReduceScatter / gemmAllReduce workspace above them (so that partials
  // never overwrite the bf16 inputs).
  uint64_t ag_data = 0, rs_data = 0, scratch = 0;
  size_t a_max = 0, b_max = 0, c_max = 0, g_max = 0, sums_max = 0, ref_max = 0, full_max = 0;
  for (const Shape& s : list) {
    const size_t M = s.M, N = s.N, K = s.K;
    if (s.op == "allGatherGemm") {
      k::AgGemmArgs a;
      a.M = s.M, a.N = s.N, a.K = s.K;
      a.gathered = o.ag_gathered ? reinterpret_cast<__nv_bfloat16*>(16) : nullptr;
      const k::FusedWorkspace ws = k::all_gather_gemm_workspace(a, W);
      ag_data = std::max(ag_data, ws.data_bytes);
      scratch = std::max(scratch, ws.scratch_bytes);
      b_max = std::max(b_max, N * K), c_max = std::max(c_max, M * N), g_max = std::max(g_max, M * K);
      full_max = std::max(full_max, M * K), ref_max = std::max(ref_max, M * N);
    } else if (s.op == "gemmAllReduce") {
      k::GemmArArgs a;
      a.M = s.M, a.N = s.N, a.K = s.K, a.partials = o.rs_code;
      k::FusedWorkspace ws = k::gemm_all_reduce_workspace(a, W);
      if (s.M <= kOneShotMaxBenchM) {  // the forced one-shot kernel's too
        k::GemmArArgs one = a;
        one.algo = k::FusedAlgo::kOneShot;
        const k::FusedWorkspace o1 = k::gemm_all_reduce_workspace(one, W);
        ws = {std::max(ws.data_bytes, o1.data_bytes), std::max(ws.scratch_bytes, o1.scratch_bytes)};
      }
      // The GEMM alone and the allReduce alone use the product's place and the allReduce's
      // scratch.
      const uint64_t product = uint64_t{M} * N * (o.rs_bf16() ? 2 : 4);
      rs_data = std::max({rs_data, ws.data_bytes, product});
      scratch = std::max({scratch, ws.scratch_bytes, product});
      a_max = std::max(a_max, M * K), b_max = std::max(b_max, N * K), c_max = std::max(c_max, M * N);
      sums_max = std::max(sums_max, M * N), ref_max = std::max(ref_max, M * N);
      full_max = std::max(full_max, M * K);
    } else {
      k::GemmRsArgs a;
      a.M = s.M, a.N = s.N, a.K = s.K, a.partials = o.rs_code;
      const k::FusedWorkspace ws = k::gemm_reduce_scatter_workspace(a, W);
      rs_data = std::max(rs_data, ws.data_bytes);
      scratch = std::max(scratch, ws.scratch_bytes);
      a_max = std::max(a_max, M * K), b_max = std::max(b_max, N * K);
      c_max = std::max(c_max, (M + W - 1) / W * N), ref_max = std::max(ref_max, (M + W - 1) / W * N);
      full_max = std::max(full_max, M * K);
    }
  }
  const uint64_t ws_offset = (ag_data + 4095) / 4096 * 4096;
  const uint64_t data_need = std::max(ws_offset + rs_data, scratch);
  fusedcomm::SymmetricConfig cfg;
  cfg.data_bytes = (data_need + 4095) / 4096 * 4096;
  auto sm = std::make_unique<fusedcomm::SymmetricMemory>(r, W, cfg);
  k::FusedSideStreams side;  // allGatherGemm's copy-engine exchange, as the runtime passes it
  sm->connect(g.all_gather(sm->export_handle()));
  const k::CommDevice& dev = sm->device();
  auto* data = static_cast<__nv_bfloat16*>(sm->data());

  auto* A = device_alloc<__nv_bfloat16>(a_max);
  auto* B = device_alloc<__nv_bfloat16>(b_max);
  auto* C = device_alloc<__nv_bfloat16>(c_max);
  auto* G = device_alloc<__nv_bfloat16>(g_max);
  float* S = sums_max ? device_alloc<float>(sums_max) : nullptr;
  // The check's buffers: a whole A of some rank (or the gathered A), its B, the reference.
  auto* full = device_alloc<__nv_bfloat16>(full_max);
  auto* peer_b = device_alloc<__nv_bfloat16>(b_max);
  float* ref = device_alloc<float>(ref_max);
  float* absdot = device_alloc<float>(ref_max);
  k::GemmWorkspace gemm_ws;
  gemm_ws.bytes = k::gemm_workspace_bytes(0);
  FC_BENCH_CUDA(cudaMalloc(&gemm_ws.ptr, gemm_ws.bytes));
  FC_BENCH_CUDA(cudaMemset(gemm_ws.ptr, 0, gemm_ws.bytes));
  // The allGatherGemm inputs' area never holds zeros (rows past a shard are read by the
  // decomposed path's equal blocks), nor does G (the GEMM alone reads it).
  b::fill_uniform(data, int64_t(ws_offset / 2), 99 + r, nullptr);
  b::fill_uniform(G, int64_t(g_max), 98 + r, nullptr);
  FC_BENCH_CUDA(cudaDeviceSynchronize());

  cudaStream_t st;
  FC_BENCH_CUDA(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cudaEvent_t e0, e1;
  FC_BENCH_CUDA(cudaEventCreate(&e0));
  FC_BENCH_CUDA(cudaEventCreate(&e1));
  b::RowWriter rows(r == 0 ? o.out : "");

  // Times the impls of one shape; every rank runs the same sequence (see the top comment).
  // Returns per impl this rank's median over its batches of the per-launch mean; `iters` gets
  // the batch sizes.
  auto time_ops = [&](const std::vector<std::function<void()>>& launches, std::vector<int>& iters) {
    const size_t n = launches.size();
    iters.assign(n, 1);
    std::vector<float> one_ms(n, 1.0f);
    for (size_t i = 0; i < n; ++i) {
      g.barrier();
      for (int w = 0; w < 2; ++w) launches[i]();
      FC_BENCH_CUDA(cudaStreamSynchronize(st));
      g.barrier();
      FC_BENCH_CUDA(cudaEventRecord(e0, st));
      launches[i]();
      FC_BENCH_CUDA(cudaEventRecord(e1, st));
      FC_BENCH_CUDA(cudaEventSynchronize(e1));
      float one = 0;
      FC_BENCH_CUDA(cudaEventElapsedTime(&one, e0, e1));
      std::vector<uint8_t> mine(sizeof one);
      std::memcpy(mine.data(), &one, sizeof one);
      std::memcpy(&one, g.all_gather(mine)[0].data(), sizeof one);  // rank 0's, for every rank
      one_ms[i] = std::max(one, 1e-3f);
      iters[i] = std::clamp(static_cast<int>(o.batch_ms / one_ms[i]), 1, 200);
    }
    std::vector<std::vector<double>> per(n);
    auto batch = [&](size_t i) {
      FC_BENCH_CUDA(cudaStreamSynchronize(st));
      g.barrier();
      FC_BENCH_CUDA(cudaEventRecord(e0, st));
      for (int j = 0; j < iters[i]; ++j) launches[i]();
      FC_BENCH_CUDA(cudaEventRecord(e1, st));
      FC_BENCH_CUDA(cudaEventSynchronize(e1));
      float ms = 0;
      FC_BENCH_CUDA(cudaEventElapsedTime(&ms, e0, e1));
      per[i].push_back(ms / iters[i]);
      sm->raise_if_failed();
    };
    if (o.sustain_ms > 0) {
      for (size_t i = 0; i < n; ++i) {
        FC_BENCH_CUDA(cudaStreamSynchronize(st));
        g.barrier();
        const int sustain = static_cast<int>(o.sustain_ms / one_ms[i]) + 1;
        for (int j = 0; j < sustain; ++j) launches[i]();
        for (int j = 0; j < o.batches; ++j) batch(i);
      }
    } else {
      for (int j = 0; j < o.batches; ++j) {
        for (size_t i = 0; i < n; ++i) batch(i);
      }
    }
    std::vector<double> med(n);
    for (size_t i = 0; i < n; ++i) med[i] = b::median(per[i]);
    return med;
  };

  // Two passes: every shape is checked first, then every shape is timed. The check's fp32
  // reference GEMM runs for up to seconds at a power draw unlike the ops', and the impl timed
  // right after it would start from that GPU state; in the timing pass each shape follows the
  // previous shape's impls instead.
  int failed = 0;
  std::vector<bool> passed(list.size(), false);
  for (size_t step = 0; step < 2 * list.size(); ++step) {
    const size_t si = step % list.size();
    const Shape& s = list[si];
    const bool checking = step < list.size();
    if (!checking && !passed[si]) continue;
    const bool is_ag = s.op == "allGatherGemm", is_ar = s.op == "gemmAllReduce";
    const double flops = 2.0 * s.M * s.N * s.K;  // per rank
    // NVLink bytes into this rank: the peers' rows of A (bf16) or of the partials (and for
    // gemmAllReduce, as an allReduce of the partials: their reduce-scatter, then the gather).
    const double partial_bytes = o.rs_bf16() ? 2.0 : 4.0;
    const double wire = is_ag   ? (W - 1.0) / W * s.M * s.K * 2.0
                        : is_ar ? 2.0 * (W - 1.0) / W * s.M * s.N * partial_bytes
                                : (W - 1.0) / W * s.M * s.N * partial_bytes;
    const int64_t rows_r = split_count(s.M, W, r), off_r = split_offset(s.M, W, r);

    // This rank's inputs, and the reference of its output from every rank's inputs.
    if (is_ag) {
      b::fill_uniform(data, rows_r * s.K, seed_a(r), st);
      b::fill_uniform(B, int64_t(s.N) * s.K, seed_b(r), st);
      for (int p = 0; checking && p < W; ++p) {
        b::fill_uniform(full + split_offset(s.M, W, p) * s.K, split_count(s.M, W, p) * s.K, seed_a(p), st);
      }
      if (checking) b::reference_gemm(full, s.K, B, s.K, false, s.M, s.N, s.K, ref, absdot, false, st);
    } else {
      b::fill_uniform(A, int64_t(s.M) * s.K, seed_a(r), st);
      b::fill_uniform(B, int64_t(s.N) * s.K, seed_b(r), st);
      for (int p = 0; checking && p < W; ++p) {  // the sum in rank order, as the ops take it
        b::fill_uniform(full, int64_t(s.M) * s.K, seed_a(p), st);
        b::fill_uniform(peer_b, int64_t(s.N) * s.K, seed_b(p), st);
        const int64_t first = is_ar ? 0 : off_r;
        b::reference_gemm(full + first * s.K, s.K, peer_b, s.K, false, is_ar ? s.M : int(rows_r), s.N, s.K,
                          ref, absdot, p > 0, st);
      }
    }
    FC_BENCH_CUDA(cudaStreamSynchronize(st));

    k::AgGemmArgs ag;
    ag.M = s.M, ag.N = s.N, ag.K = s.K;
    ag.in_offset = 0;
    ag.B = B;
    ag.C = C;
    ag.gathered = o.ag_gathered ? G : nullptr;
    ag.exchange = o.ag_exchange_code;
    ag.side = &side;
    ag.gemm_ws = gemm_ws;
    k::GemmRsArgs rs;
    rs.M = s.M, rs.N = s.N, rs.K = s.K;
    rs.A = A;
    rs.B = B;
    rs.ws_offset = ws_offset;
    rs.out = C;
    rs.partials = o.rs_code;
    rs.gemm_ws = gemm_ws;
    k::GemmArArgs ar;
    ar.M = s.M, ar.N = s.N, ar.K = s.K;
    ar.A = A;
    ar.B = B;
    ar.ws_offset = ws_offset;
    ar.C = C;
    ar.sums = S;
    ar.partials = o.rs_code;
    ar.gemm_ws = gemm_ws;

    struct Impl {
      std::string name;
      std::function<void()> launch;
      k::FusedAlgo algo;  // the path it runs (kAuto: not an op path)
      bool checked;       // its output is the op's
    };
    std::vector<Impl> impls;
    GraphExecs graphs;  // the graph-captured impls' graphs, destroyed with the shape's impls
    const k::FusedAlgo algos[] = {k::FusedAlgo::kAuto, k::FusedAlgo::kFused, k::FusedAlgo::kDecomposed,
                                  k::FusedAlgo::kOneShot};
    for (k::FusedAlgo algo : algos) {
      // gemmAllReduce's one-shot kernel, forced, up to kOneShotMaxBenchM rows (its slots hold
      // every rank's partial product: past that it is far from being chosen).
      if (algo == k::FusedAlgo::kOneShot && (!is_ar || s.M > kOneShotMaxBenchM)) continue;
      const std::string name = algo == k::FusedAlgo::kAuto      ? "fusedcomm"
                               : algo == k::FusedAlgo::kFused   ? "fusedcomm_fused"
                               : algo == k::FusedAlgo::kOneShot ? "fusedcomm_oneshot"
                                                                : "fusedcomm_decomposed";
      if (is_ag) {
        k::AgGemmArgs a = ag;
        a.algo = algo;
        impls.push_back({name, [&, a] { FC_BENCH_CUDA(k::launch_all_gather_gemm(dev, a, st)); },
                         k::all_gather_gemm_info(dev, a).algo, true});
      } else if (is_ar) {
        k::GemmArArgs a = ar;
        a.algo = algo;
        const k::FusedAlgo path = k::gemm_all_reduce_info(dev, a).algo;
        // The fused path needs W to divide M (its allGather splits elements).
        if (path == k::FusedAlgo::kFused && s.M % W != 0) continue;
        impls.push_back({name, [&, a] { FC_BENCH_CUDA(k::launch_gemm_all_reduce(dev, a, st)); }, path, true});
        if (algo == k::FusedAlgo::kAuto) {
          // The op as a decode loop runs it: captured once in a CUDA graph, each call a replay.
          FC_BENCH_CUDA(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
          FC_BENCH_CUDA(k::launch_gemm_all_reduce(dev, a, st));
          cudaGraph_t graph;
          FC_BENCH_CUDA(cudaStreamEndCapture(st, &graph));
          cudaGraphExec_t exec;
          FC_BENCH_CUDA(cudaGraphInstantiate(&exec, graph, 0));
          FC_BENCH_CUDA(cudaGraphDestroy(graph));
          graphs.emplace_back(exec);
          impls.push_back(
              {"fusedcomm_graph", [&, exec] { FC_BENCH_CUDA(cudaGraphLaunch(exec, st)); }, path, true});
        }
      } else {
        k::GemmRsArgs a = rs;
        a.algo = algo;
        impls.push_back({name, [&, a] { FC_BENCH_CUDA(k::launch_gemm_reduce_scatter(dev, a, st)); },
                         k::gemm_reduce_scatter_info(dev, a).algo, true});
      }
    }
    {
      k::GemmArgs gm;
      gm.A = is_ag ? G : A;
      gm.lda = s.K;
      gm.B = B;
      gm.ldb = s.K;
      gm.M = s.M, gm.N = s.N, gm.K = s.K;
      if (is_ag) {
        gm.C = C;
      } else {  // the partial product as the decomposed path writes it, into the data area
        gm.C = reinterpret_cast<uint8_t*>(data) + ws_offset;
        gm.c_type = o.rs_bf16() ? k::GemmOutType::kBF16 : k::GemmOutType::kF32;
      }
      gm.ldc = s.N;
      k::use_workspace(gm, gemm_ws);
      impls.push_back({"fusedcomm_gemm_only", [&, gm] { FC_BENCH_CUDA(k::launch_gemm(gm, st)); },
                       k::FusedAlgo::kAuto, false});
      k::CollectiveArgs ca;
      ca.op = is_ag ? k::CommOp::kAllGather : is_ar ? k::CommOp::kAllReduce : k::CommOp::kReduceScatter;
      ca.dtype = is_ag || o.rs_bf16() ? k::CommDtype::kBF16 : k::CommDtype::kF32;
      ca.count = static_cast<int64_t>(s.M) * (is_ag ? s.K : s.N);
      ca.in_offset = is_ag ? 0 : ws_offset;
      ca.output = is_ag   ? static_cast<void*>(G)
                  : is_ar ? (o.rs_bf16() ? static_cast<void*>(C) : static_cast<void*>(S))
                          : static_cast<void*>(reinterpret_cast<uint8_t*>(dev.base[r]) + dev.scratch_offset);
      impls.push_back({"fusedcomm_comm_only", [&, ca] { FC_BENCH_CUDA(k::launch_collective(dev, ca, st)); },
                       k::FusedAlgo::kAuto, false});
    }

    if (!checking) {
      if (is_ag) b::fill_uniform(G, int64_t(g_max), 98 + r, st);  // the GEMM alone reads G
      std::vector<std::function<void()>> launches;
      for (const Impl& im : impls) launches.push_back(im.launch);
      std::vector<int> iters;
      const std::vector<double> ms_of = time_ops(launches, iters);
      std::vector<uint8_t> all_ms(ms_of.size() * sizeof(double));
      std::memcpy(all_ms.data(), ms_of.data(), all_ms.size());
      const auto ranks_ms = g.all_gather(all_ms);
      if (r != 0) continue;
      for (size_t i = 0; i < impls.size(); ++i) {
        const Impl& im = impls[i];
        const double ms = ms_of[i];
        std::vector<double> per_rank;
        for (const auto& rm : ranks_ms) {
          double v = 0;
          std::memcpy(&v, rm.data() + i * sizeof(double), sizeof v);
          per_rank.push_back(v);
        }
        b::Row shape;
        shape.integer("m", s.M).integer("n", s.N).integer("k", s.K);
        b::Row row;
        row.str("family", "fused")
            .str("op", s.op)
            .str("impl", im.name)
            .integer("world", W)
            .obj("shape", shape)
            .str("dtype", "bf16")
            .num("ms_median", ms)
            .num("tflops", flops / (ms * 1e-3) / 1e12)
            .num("gbps", wire / (ms * 1e-3) / 1e9)
            .str("label", s.label);
        if (!s.set.empty()) row.str("set", s.set);
        if (im.checked) row.str("algo", algo_name(im.algo));
        if (!is_ag) row.str("partials", o.rs_partials);
        if (is_ag) row.integer("ag_gathered", o.ag_gathered ? 1 : 0);
        row.integer("iters", iters[i])
            .integer("batches", o.batches)
            .num("sustain_ms", o.sustain_ms)
            .nums("ms_ranks", per_rank);
        rows.write(row);
        std::printf("%-18s W=%d %-12s M=%-6d %-21s %9.4f ms %7.1f TF/s %7.1f GB/s\n", s.op.c_str(), W,
                    s.label.c_str(), s.M, im.name.c_str(), ms, flops / (ms * 1e-3) / 1e12,
                    wire / (ms * 1e-3) / 1e9);
      }
      std::fflush(stdout);
      continue;
    }
    // The check: every op path once, output poisoned, on every rank; any mismatch anywhere
    // drops the shape's rows.
    const float partial_rel = !is_ag && o.rs_bf16() ? 1.0f / 512 : 0.f;
    const int64_t out_rows = is_ag || is_ar ? s.M : rows_r;
    b::Mismatch worst;
    std::string worst_what;
    for (const Impl& im : impls) {
      if (!im.checked) continue;
      FC_BENCH_CUDA(cudaMemsetAsync(C, 0xFF, size_t(out_rows) * s.N * 2, st));  // bf16 NaN
      if (is_ag && o.ag_gathered) FC_BENCH_CUDA(cudaMemsetAsync(G, 0xFF, size_t(s.M) * s.K * 2, st));
      FC_BENCH_CUDA(cudaStreamSynchronize(st));
      g.barrier();
      im.launch();
      FC_BENCH_CUDA(cudaStreamSynchronize(st));
      sm->raise_if_failed();
      b::Mismatch m = b::compare_gemm(C, s.N, ref, absdot, int(out_rows), s.N, partial_rel, st);
      std::string what = im.name + " C";
      if (m.count == 0 && is_ag && o.ag_gathered) {
        m = b::compare_exact(G, full, int64_t(s.M) * s.K, st);
        what = im.name + " gathered A";
      }
      if (m.count > worst.count) worst = m, worst_what = what;
    }
    const auto bad = b::failed_ranks(g, worst);
    if (r == 0) {
      for (const auto& [p, q] : bad) {
        std::printf(
            "%-18s W=%d %-12s M=%d: check FAILED on rank %d: %lld mismatches, first [%lld] = %g, "
            "expected %g\n",
            s.op.c_str(), W, s.label.c_str(), s.M, p, static_cast<long long>(q.count),
            static_cast<long long>(q.index), q.got, q.want);
      }
    }
    if (!bad.empty()) {
      if (r == 0 && !worst_what.empty()) std::printf("  (rank 0: %s)\n", worst_what.c_str());
      ++failed;
      continue;
    }
    passed[si] = true;
  }

  g.barrier();
  for (void* p : {static_cast<void*>(A), static_cast<void*>(B), static_cast<void*>(C), static_cast<void*>(G),
                  static_cast<void*>(S), static_cast<void*>(full), static_cast<void*>(peer_b),
                  static_cast<void*>(ref), static_cast<void*>(absdot), gemm_ws.ptr}) {
    cudaFree(p);
  }
  sm->close();
  return failed ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  b::Args args(argc, argv, kUsage);
  Options o;
  o.world = static_cast<int>(args.num("world", 2));
  o.shapes = args.str("shapes", "");
  o.out = args.str("out", "");
  o.m = args.str("m", "");
  o.n = args.str("n", "");
  o.k = args.str("k", "");
  const std::string ops = args.str("ops", "ag,rs,ar");
  o.rs_partials = args.str("rs-partials", "f32");
  o.ag_gathered = args.str("ag-gathered", "1") != "0";
  o.ag_exchange = args.str("ag-exchange", "auto");
  o.batch_ms = args.num("batch-ms", 25);
  o.batches = static_cast<int>(args.num("batches", 7));
  o.sustain_ms = args.num("sustain-ms", 500);
  args.done();
  if (o.shapes.empty() && o.m.empty()) args.fail("--shapes or --m/--n/--k is required");
  if (o.world < 1 || o.world > k::kCommMaxRanks) args.fail("--world must be 1..8");
  if (o.batches < 1 || o.batch_ms <= 0 || o.sustain_ms < 0)
    args.fail("bad --batches, --batch-ms or --sustain-ms");
  o.ag = ops.find("ag") != std::string::npos;
  o.rs = ops.find("rs") != std::string::npos;
  o.ar = ops.find("ar") != std::string::npos;
  if (o.rs_partials == "f32")
    o.rs_code = k::RsPartials::kF32;
  else if (o.rs_partials == "bf16")
    o.rs_code = k::RsPartials::kBF16;
  else if (o.rs_partials == "f32any")
    o.rs_code = k::RsPartials::kF32AnyOrder;
  else
    args.fail("--rs-partials takes f32, bf16 or f32any");
  if (o.ag_exchange == "auto")
    o.ag_exchange_code = k::AgExchange::kAuto;
  else if (o.ag_exchange == "sm")
    o.ag_exchange_code = k::AgExchange::kSmPulls;
  else if (o.ag_exchange == "ce")
    o.ag_exchange_code = k::AgExchange::kCopyEngines;
  else
    args.fail("--ag-exchange takes auto, sm or ce");
  try {
    read_shapes(o, o.world);  // a bad list fails here, before any process starts
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fused_bench: %s\n", e.what());
    return 1;
  }
  return b::run_ranks(o.world, 600, [&](fusedcomm::testing::ProcessGroup& g) { return bench(g, o); });
}
