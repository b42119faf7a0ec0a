// coll_bench: our collectives (launch_collective) among one forked process per GPU, bf16, on the
// ops and sizes of a list. For each (op, size): the input written with check values, the output
// poisoned, one launch checked on every rank (reductions exact: check.h's values sum exactly),
// then timed: 5 warm-up launches, then 10 batches of `iters` back-to-back launches between CUDA
// events on rank 0 (a barrier before each batch); the row holds the median of the batches'
// per-launch means, and busbw as nccl-tests counts it. nccl_bench.py times NCCL the same way.
//
// With --graph, each (op, size) is also captured once in a CUDA graph (one launch per graph, as
// a decode loop captures it; impl "<impl>_graph"): the input written again, the graph replayed
// once and checked on every rank, then timed as above with a replay per call.
// torch_allreduce.py times NCCL and torch's symmetric-memory allReduce the same two ways.
//
// The input sits in the symmetric memory's data area, as the runtime places it; the output in
// ordinary device memory, except allReduce, which runs in place (as NCCL's in nccl_bench.py)
// unless --out-of-place. The algorithm is the automatic choice (impl "fusedcomm") or, with
// --algo, forced (impl "fusedcomm_<algo>").
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench/common/bench_util.h"
#include "bench/common/check.h"
#include "bench/common/ranks.h"
#include "fusedcomm/runtime/symmetric_memory.h"
#include "kernels/collectives/collectives.h"

namespace b = fusedcomm::bench;
namespace k = fusedcomm::kernels;

namespace {

const char* kUsage =
    "usage: coll_bench --world W [--shapes FILE] [--random N [--seed S]] [--out ROWS.jsonl]\n"
    "                  [--algo NAME] [--ctas N] [--out-of-place] [--graph] [--set NAME]\n"
    "  FILE: one op per line, \"<op> <bytes>...\" (bench/shapes/collectives.txt); op: allGather,\n"
    "  reduceScatter, allReduce or allToAll; bytes as nccl-tests counts them (allGather: the\n"
    "  output, reduceScatter: the input, allToAll: the input per rank).\n"
    "  --random N: each op also at N seeded random element counts from 1 MiB to 1 GiB of bf16,\n"
    "  multiples of nothing in particular (rows of set random-<seed>; nccl_bench.py --random N\n"
    "  --seed S draws the same counts); --seed, else one chosen and printed.\n"
    "  --algo: one-shot, two-phase, push, pipelined, direct (allReduce in place only) or two-shot\n"
    "  (allReduce) instead of the automatic choice. Rows go to --out as JSON lines (rank 0).\n"
    "  --ctas N: CollectiveArgs::num_ctas (0: the launcher's choice); rows of impl <impl>_c<N>.\n"
    "  --graph: each (op, size) also captured in a CUDA graph (one launch), checked and timed as\n"
    "  replays, rows of impl <impl>_graph (fusedcomm_graph for the automatic choice).\n"
    "  --set NAME: the list's rows carry set NAME (report.py tabulates a set apart; run.sh runs\n"
    "  bench/shapes/allreduce_small.txt with --graph --set small-medium).\n"
    "  Exit 0: every check passed; 1: a mismatch or an error; 77: fewer than W GPUs.\n";

struct OpSizes {
  std::string name;
  k::CommOp op;
  std::vector<int64_t> bytes;
  std::string set;  // "" (the list's), or "random-<seed>"
};

// The seeded random counts (nccl_bench.py's random_bytes draws the same ones): per count, an
// octave 2^e elements, e uniform in 19..28, then a count uniform in [2^e, 2^(e+1)), from
// splitmix64; bytes = 2 · count (bf16): 1 MiB to 1 GiB.
uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
std::vector<int64_t> random_bytes(int n, uint64_t seed) {
  std::vector<int64_t> v;
  uint64_t x = seed;
  for (int i = 0; i < n; ++i) {
    const int e = 19 + static_cast<int>(splitmix64(x) % 10);
    const int64_t count = (int64_t{1} << e) + static_cast<int64_t>(splitmix64(x) % (uint64_t{1} << e));
    v.push_back(2 * count);
  }
  return v;
}

std::vector<OpSizes> read_shapes(const std::string& path) {
  std::vector<OpSizes> v;
  for (const auto& w : b::read_shape_lines(path)) {
    OpSizes o{w[0], k::CommOp::kAllGather, {}, ""};
    if (w[0] == "allGather")
      o.op = k::CommOp::kAllGather;
    else if (w[0] == "reduceScatter")
      o.op = k::CommOp::kReduceScatter;
    else if (w[0] == "allReduce")
      o.op = k::CommOp::kAllReduce;
    else if (w[0] == "allToAll")
      o.op = k::CommOp::kAllToAll;
    else
      throw std::runtime_error(path + ": unknown op " + w[0]);
    for (size_t i = 1; i < w.size(); ++i) o.bytes.push_back(std::stoll(w[i]));
    v.push_back(o);
  }
  return v;
}

struct AlgoName {
  const char* name;
  k::CommAlgo algo;
};
constexpr AlgoName kAlgos[] = {{"auto", k::CommAlgo::kAuto},           {"one-shot", k::CommAlgo::kOneShot},
                               {"two-phase", k::CommAlgo::kTwoPhase},  {"push", k::CommAlgo::kTwoPhasePush},
                               {"pipelined", k::CommAlgo::kPipelined}, {"direct", k::CommAlgo::kDirect},
                               {"two-shot", k::CommAlgo::kTwoShot}};

const char* algo_name(k::CommAlgo a) {
  for (const AlgoName& n : kAlgos) {
    if (n.algo == a) return n.name;
  }
  return "?";
}

struct Options {
  int world = 2;
  std::vector<OpSizes> ops;
  std::string out;
  std::string algo = "auto";
  k::CommAlgo algo_code = k::CommAlgo::kAuto;
  bool out_of_place = false;
  int ctas = 0;          // CollectiveArgs::num_ctas
  bool graph = false;    // also time each (op, size) as CUDA-graph replays
  std::string list_set;  // the list's rows' set ("" : none)
  uint64_t seed = 0;     // the random set's
};

int64_t split_offset(int64_t n, int w, int r) { return r * (n / w) + (r < n % w ? r : n % w); }

int bench(fusedcomm::testing::ProcessGroup& g, const Options& o) {
  const int W = g.world, r = g.rank;
  FC_BENCH_CUDA(cudaSetDevice(r));
  int64_t max_bytes = 0;
  for (const OpSizes& s : o.ops) {
    for (int64_t x : s.bytes) max_bytes = std::max(max_bytes, x);
  }
  fusedcomm::SymmetricConfig cfg;
  cfg.data_bytes = static_cast<uint64_t>(max_bytes) + 4096;
  auto sm = std::make_unique<fusedcomm::SymmetricMemory>(r, W, cfg);
  sm->connect(g.all_gather(sm->export_handle()));
  const k::CommDevice& dev = sm->device();
  void* out = nullptr;
  FC_BENCH_CUDA(cudaMalloc(&out, max_bytes + 4096));
  cudaStream_t st;
  FC_BENCH_CUDA(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cudaEvent_t ev0, ev1;
  FC_BENCH_CUDA(cudaEventCreate(&ev0));
  FC_BENCH_CUDA(cudaEventCreate(&ev1));
  b::RowWriter rows(r == 0 ? o.out : "");
  const std::string impl = (o.algo == "auto" ? "fusedcomm" : "fusedcomm_" + o.algo) +
                           (o.ctas > 0 ? "_c" + std::to_string(o.ctas) : "");
  int failed = 0;
  for (const OpSizes& s : o.ops) {
    const bool is_ar = s.op == k::CommOp::kAllReduce;
    if (o.algo_code == k::CommAlgo::kDirect && (!is_ar || o.out_of_place)) continue;
    for (const int64_t bytes : s.bytes) {
      const bool in_place = is_ar && !o.out_of_place;
      k::CollectiveArgs a;
      a.op = s.op;
      a.dtype = k::CommDtype::kBF16;
      a.count = bytes / 2;
      a.output = in_place ? sm->data() : out;
      a.algo = o.algo_code;
      a.num_ctas = o.ctas;
      const int64_t n_in = k::collective_input_count(s.op, a.count, W, r);
      const int64_t first = s.op == k::CommOp::kAllGather ? split_offset(a.count, W, r) : 0;
      // This rank's input written at the data area's start and the output poisoned, all ranks
      // ready: before each check (in place, the timed launches overwrite the input).
      auto prepare = [&] {
        b::fill_pattern(static_cast<__nv_bfloat16*>(sm->data()), n_in, first, r, st);
        if (!in_place) {
          const int64_t n_out = k::collective_output_count(s.op, a.count, W, r);
          FC_BENCH_CUDA(cudaMemsetAsync(out, 0xFF, n_out * 2, st));  // bf16 NaN
        }
        FC_BENCH_CUDA(cudaStreamSynchronize(st));
        g.barrier();
      };
      // The output of the launch just made, checked on every rank: true when all match.
      auto check = [&](const std::string& what) {
        FC_BENCH_CUDA(cudaStreamSynchronize(st));
        sm->raise_if_failed();
        const b::Mismatch m = b::check_collective(
            static_cast<int>(s.op), static_cast<const __nv_bfloat16*>(a.output), a.count, W, r, st);
        const auto bad = b::failed_ranks(g, m);
        if (r == 0) {
          for (const auto& [p, q] : bad) {
            std::printf(
                "%-14s W=%d %11lld B  %s check FAILED on rank %d: %lld mismatches, first out[%lld] = %g, "
                "expected %g\n",
                s.name.c_str(), W, static_cast<long long>(bytes), what.c_str(), p,
                static_cast<long long>(q.count), static_cast<long long>(q.index), q.got, q.want);
          }
        }
        return bad.empty();
      };
      // 5 warm-up calls, then the median over 10 batches of `iters` back-to-back calls of the
      // per-call mean (rank 0's CUDA events, a barrier before each batch).
      const int iters = bytes <= (1 << 20) ? 200 : bytes <= (64 << 20) ? 20 : 5;
      const int batches = 10;
      auto time_calls = [&](const std::function<void()>& call) {
        for (int i = 0; i < 5; ++i) call();
        FC_BENCH_CUDA(cudaStreamSynchronize(st));
        std::vector<double> per;
        for (int i = 0; i < batches; ++i) {
          g.barrier();
          FC_BENCH_CUDA(cudaEventRecord(ev0, st));
          for (int j = 0; j < iters; ++j) call();
          FC_BENCH_CUDA(cudaEventRecord(ev1, st));
          FC_BENCH_CUDA(cudaEventSynchronize(ev1));
          float ms = 0;
          FC_BENCH_CUDA(cudaEventElapsedTime(&ms, ev0, ev1));
          per.push_back(ms / iters);
        }
        sm->raise_if_failed();
        return b::median(per);
      };
      const char* ran = algo_name(k::collective_choose_algo(dev, a));
      auto write_row = [&](const std::string& name, double med) {
        if (r != 0) return;
        const double algbw = bytes / (med * 1e-3) / 1e9;
        const double bus = is_ar ? 2.0 * (W - 1) / W : double(W - 1) / W;
        b::Row shape;
        shape.integer("bytes", bytes);
        b::Row row;
        row.str("family", "collectives")
            .str("op", s.name)
            .str("impl", name)
            .integer("world", W)
            .obj("shape", shape)
            .str("dtype", "bf16")
            .num("ms_median", med)
            .null("tflops")
            .num("gbps", algbw * bus)
            .num("algbw", algbw)
            .str("algo", ran)
            .str("placement", in_place ? "in-place" : "out-of-place")
            .integer("iters", iters);
        if (!s.set.empty()) row.str("set", s.set);
        if (s.set.rfind("random-", 0) == 0) row.integer("seed", static_cast<int64_t>(o.seed));
        rows.write(row);
        std::printf("%-14s W=%d %11lld B  check passed  %9.4f ms  busbw %7.1f GB/s  (%s%s)\n", s.name.c_str(),
                    W, static_cast<long long>(bytes), med, algbw * bus, ran,
                    name.size() > 6 && name.compare(name.size() - 6, 6, "_graph") == 0 ? ", graph" : "");
        std::fflush(stdout);
      };

      prepare();
      const cudaError_t launched = k::launch_collective(dev, a, st);
      if (launched == cudaErrorInvalidValue && o.algo_code != k::CommAlgo::kAuto) {
        // A forced algorithm outside its domain (a one-shot payload over a slot, ...): no row.
        cudaGetLastError();
        if (r == 0)
          std::printf("%-14s W=%d %11lld B  %s: not available at this size\n", s.name.c_str(), W,
                      static_cast<long long>(bytes), o.algo.c_str());
        continue;
      }
      FC_BENCH_CUDA(launched);
      if (!check("eager")) {
        ++failed;
        continue;
      }
      write_row(impl, time_calls([&] { FC_BENCH_CUDA(k::launch_collective(dev, a, st)); }));
      if (!o.graph) continue;

      // The same launch captured once in a CUDA graph (the epoch lives on the device, so each
      // replay is a fresh launch), checked after one replay, then timed a replay per call.
      cudaGraph_t graph;
      FC_BENCH_CUDA(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
      const cudaError_t captured = k::launch_collective(dev, a, st);
      const cudaError_t ended = cudaStreamEndCapture(st, &graph);
      FC_BENCH_CUDA(captured);
      FC_BENCH_CUDA(ended);
      cudaGraphExec_t exec;
      const cudaError_t made = cudaGraphInstantiate(&exec, graph, 0);
      cudaGraphDestroy(graph);
      FC_BENCH_CUDA(made);
      std::unique_ptr<CUgraphExec_st, decltype(&cudaGraphExecDestroy)> owned(exec, cudaGraphExecDestroy);
      prepare();
      FC_BENCH_CUDA(cudaGraphLaunch(exec, st));
      if (!check("graph")) {
        ++failed;
        continue;
      }
      write_row(impl + "_graph", time_calls([&] { FC_BENCH_CUDA(cudaGraphLaunch(exec, st)); }));
    }
  }
  g.barrier();
  FC_BENCH_CUDA(cudaFree(out));
  sm->close();
  return failed ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  b::Args args(argc, argv, kUsage);
  Options o;
  o.world = static_cast<int>(args.num("world", 2));
  const std::string shapes = args.str("shapes", "");
  o.out = args.str("out", "");
  o.algo = args.str("algo", "auto");
  o.out_of_place = args.flag("out-of-place");
  o.graph = args.flag("graph");
  o.ctas = static_cast<int>(args.num("ctas", 0));
  o.list_set = args.str("set", "");
  const int random = static_cast<int>(args.num("random", 0));
  const std::string seed = args.str("seed", "");
  args.done();
  if (shapes.empty() && random <= 0) args.fail("--shapes or --random is required");
  if (random < 0) args.fail("--random: a count >= 0");
  if (!seed.empty() && random <= 0) args.fail("--seed goes with --random");
  if (!o.list_set.empty() && shapes.empty()) args.fail("--set names the rows of --shapes");
  if (o.list_set.rfind("random-", 0) == 0) args.fail("--set: random-... names the --random sets");
  if (o.world < 1 || o.world > k::kCommMaxRanks) args.fail("--world must be 1..8");
  if (o.ctas < 0) args.fail("--ctas: a count >= 0");
  bool known = false;
  for (const AlgoName& n : kAlgos) {
    if (o.algo == n.name) o.algo_code = n.algo, known = true;
  }
  if (!known) args.fail("unknown --algo " + o.algo);
  try {
    if (!shapes.empty()) o.ops = read_shapes(shapes);
    for (OpSizes& s : o.ops) s.set = o.list_set;
    if (random > 0) {
      o.seed = seed.empty() ? std::random_device{}() : std::stoull(seed);
      std::printf("random set: %d element counts from 1 MiB to 1 GiB of bf16 per op, seed %llu\n", random,
                  static_cast<unsigned long long>(o.seed));
      const std::vector<int64_t> bytes = random_bytes(random, o.seed);
      const std::string set = "random-" + std::to_string(o.seed);
      o.ops.push_back({"allGather", k::CommOp::kAllGather, bytes, set});
      o.ops.push_back({"reduceScatter", k::CommOp::kReduceScatter, bytes, set});
      o.ops.push_back({"allReduce", k::CommOp::kAllReduce, bytes, set});
      o.ops.push_back({"allToAll", k::CommOp::kAllToAll, bytes, set});
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "coll_bench: %s\n", e.what());
    return 1;
  }
  return b::run_ranks(o.world, 500, [&](fusedcomm::testing::ProcessGroup& g) { return bench(g, o); });
}
