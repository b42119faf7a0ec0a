// Ours side of the collectives benchmark: one forked process per GPU (process_group.h), bf16,
// sizes 1 KiB .. max, medians over batches of back-to-back launches timed with CUDA events on
// rank 0 after warm-up. Writes one JSON object per line to --out. NCCL's side is nccl_bench.py
// (same sizes, batches and method); report.py joins them. Usage:
//   coll_bench --world W --out ours.jsonl [--max-bytes 1073741824] [--min-bytes 0]
//              [--ops ag,rs,ar,a2a] [--ctas N (CollectiveArgs::num_ctas; 0: auto)]
//              [--algos 0,2,3,4 (CommAlgo values; default 0 = auto)]
//              [--chunks-kib 0,128 (CollectiveArgs::chunk_bytes / 1024 for algos 3, 4)]
//              [--label NAME (the "variant" field of every row; default "default")]
//              [--inplace 1 (allReduce output = its input in the data area, as NCCL's
//               in-place allReduce in nccl_bench.py; needed by algo 5, direct)]
// Rows: impl "fusedcomm", "algo" the algorithm that ran (with "/<chunk>K" when --chunks-kib
// is not 0), "variant" the label.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kernels/collectives/collectives.h"
#include "fusedcomm/runtime/symmetric_memory.h"
#include "process_group.h"

namespace k = fusedcomm::kernels;

namespace {
#define CK(x)                                                                          \
  do {                                                                                 \
    cudaError_t e_ = (x);                                                              \
    if (e_ != cudaSuccess) {                                                           \
      std::fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_));                    \
      return 2;                                                                        \
    }                                                                                  \
  } while (0)

struct OpInfo {
  const char* name;
  k::CommOp op;
  double bus_factor(int w) const {
    return op == k::CommOp::kAllReduce ? 2.0 * (w - 1) / w : double(w - 1) / w;
  }
};

const char* algo_name(k::CommAlgo a) {
  switch (a) {
    case k::CommAlgo::kOneShot: return "one-shot";
    case k::CommAlgo::kTwoPhase: return "two-phase";
    case k::CommAlgo::kTwoPhasePush: return "push";
    case k::CommAlgo::kPipelined: return "pipelined";
    case k::CommAlgo::kDirect: return "direct";
    default: return "auto";
  }
}

std::vector<int64_t> parse_list(const std::string& s) {
  std::vector<int64_t> v;
  size_t i = 0;
  while (i < s.size()) {
    size_t j = s.find(',', i);
    if (j == std::string::npos) j = s.size();
    if (j > i) v.push_back(std::atoll(s.substr(i, j - i).c_str()));
    i = j + 1;
  }
  return v;
}

int bench(fusedcomm::testing::ProcessGroup& g, const std::vector<OpInfo>& ops, int64_t min_bytes,
          int64_t max_bytes, int num_ctas, const std::vector<int64_t>& algos,
          const std::vector<int64_t>& chunks_kib, const std::string& label,
          const std::string& out_path, bool inplace) {
  const int W = g.world, r = g.rank;
  CK(cudaSetDevice(r));
  fusedcomm::SymmetricConfig cfg;
  cfg.data_bytes = static_cast<uint64_t>(max_bytes) + 4096;
  auto sm = std::make_unique<fusedcomm::SymmetricMemory>(r, W, cfg);
  sm->connect(g.all_gather(sm->export_handle()));
  void* out = nullptr;
  CK(cudaMalloc(&out, max_bytes + 4096));
  CK(cudaMemset(sm->data(), 0, max_bytes));  // bf16 zeros: a valid input of every size
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cudaEvent_t ev0, ev1;
  CK(cudaEventCreate(&ev0));
  CK(cudaEventCreate(&ev1));
  FILE* f = r == 0 ? std::fopen(out_path.c_str(), "w") : nullptr;
  for (const OpInfo& oi : ops) {
   for (int64_t algo_req : algos) {
    // kPipelined runs two-phase for every op but allReduce: measured once (a repeat of
    // two-phase, labelled so), without the chunk sweep.
    const bool repeat = algo_req == 4 && oi.op != k::CommOp::kAllReduce;
    const bool pipelined = (algo_req == 3 || algo_req == 4 || algo_req == 5) && !repeat;
    if (algo_req == 5 && oi.op != k::CommOp::kAllReduce) continue;  // direct: allReduce only
    for (int64_t chunk_kib : chunks_kib) {
     if (!pipelined && chunk_kib != chunks_kib.front()) continue;  // chunk: variants 3, 4 only
     for (int64_t bytes = 1024; bytes <= max_bytes; bytes *= 4) {
      if (bytes < min_bytes) continue;
      const bool in_place = inplace && oi.op == k::CommOp::kAllReduce;
      k::CollectiveArgs a;
      a.op = oi.op;
      a.dtype = k::CommDtype::kBF16;
      a.count = bytes / 2;
      a.output = in_place ? sm->data() : out;
      a.num_ctas = num_ctas;
      a.algo = static_cast<k::CommAlgo>(algo_req);
      a.chunk_bytes = pipelined ? chunk_kib << 10 : 0;
      const int iters = bytes <= (1 << 20) ? 200 : bytes <= (64 << 20) ? 20 : 5;
      const int batches = 10;
      g.barrier();
      for (int i = 0; i < 5; ++i) CK(k::launch_collective(sm->device(), a, st));
      CK(cudaStreamSynchronize(st));
      std::vector<double> per;
      for (int b = 0; b < batches; ++b) {
        g.barrier();
        CK(cudaEventRecord(ev0, st));
        for (int i = 0; i < iters; ++i) CK(k::launch_collective(sm->device(), a, st));
        CK(cudaEventRecord(ev1, st));
        CK(cudaEventSynchronize(ev1));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, ev0, ev1));
        per.push_back(ms / iters);
      }
      sm->raise_if_failed();
      std::sort(per.begin(), per.end());
      const double med = per[per.size() / 2];
      const double algbw = bytes / (med * 1e-3) / 1e9;
      const k::CommAlgo algo = k::collective_choose_algo(sm->device(), a);
      std::string aname = repeat ? "two-phase(rep)" : algo_name(algo);
      if (pipelined && chunk_kib != 0) aname += "/" + std::to_string(chunk_kib) + "K";
      if (num_ctas != 0) aname += "/c" + std::to_string(num_ctas);
      if (in_place) aname += "/inplace";
      if (f) {
        std::fprintf(f,
                     "{\"op\": \"%s\", \"impl\": \"fusedcomm\", \"world\": %d, \"bytes\": %lld, "
                     "\"dtype\": \"bf16\", \"ms_median\": %.6f, \"algbw\": %.3f, \"busbw\": %.3f, "
                     "\"algo\": \"%s\", \"variant\": \"%s\", \"iters\": %d, \"batches\": %d}\n",
                     oi.name, W, static_cast<long long>(bytes), med, algbw,
                     algbw * oi.bus_factor(W), aname.c_str(), label.c_str(), iters, batches);
        std::fflush(f);
        std::printf("%-14s W=%d %11lld B  %9.4f ms  busbw %7.1f GB/s  (%s)\n", oi.name, W,
                    static_cast<long long>(bytes), med, algbw * oi.bus_factor(W), aname.c_str());
        std::fflush(stdout);
      }
     }
    }
   }
  }
  if (f) std::fclose(f);
  g.barrier();
  sm->close();
  return 0;
}
}  // namespace

int main(int argc, char** argv) {
  int world = 2;
  int64_t max_bytes = 1ll << 30, min_bytes = 0;
  int num_ctas = 0;
  bool inplace = false;
  std::string out = "ours.jsonl", which = "ag,rs,ar,a2a", algos = "0", chunks = "0",
              label = "default";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--world")) world = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--out")) out = argv[i + 1];
    if (!std::strcmp(argv[i], "--max-bytes")) max_bytes = std::atoll(argv[i + 1]);
    if (!std::strcmp(argv[i], "--ops")) which = argv[i + 1];
    if (!std::strcmp(argv[i], "--min-bytes")) min_bytes = std::atoll(argv[i + 1]);
    if (!std::strcmp(argv[i], "--ctas")) num_ctas = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--algos")) algos = argv[i + 1];
    if (!std::strcmp(argv[i], "--chunks-kib")) chunks = argv[i + 1];
    if (!std::strcmp(argv[i], "--label")) label = argv[i + 1];
    if (!std::strcmp(argv[i], "--inplace")) inplace = std::atoi(argv[i + 1]) != 0;
  }
  std::vector<OpInfo> ops;
  if (which.find("ag") != std::string::npos) ops.push_back({"allGather", k::CommOp::kAllGather});
  if (which.find("rs") != std::string::npos) ops.push_back({"reduceScatter", k::CommOp::kReduceScatter});
  if (which.find("ar") != std::string::npos) ops.push_back({"allReduce", k::CommOp::kAllReduce});
  if (which.find("a2a") != std::string::npos) ops.push_back({"allToAll", k::CommOp::kAllToAll});
  const int failed = fusedcomm::testing::run_processes(
      world, [&](fusedcomm::testing::ProcessGroup& g) {
        return bench(g, ops, min_bytes, max_bytes, num_ctas, parse_list(algos), parse_list(chunks),
                     label, out, inplace);
      },
      500);
  return failed == 0 ? 0 : 1;
}
