// gpu_hier_test: the steps of a hierarchical allReduce over "virtual hosts" (docs/architecture.md),
// timed one by one: H hosts of L ranks each, one forked process per rank, rank g = h * L + l on
// GPU g % (GPU count). Inside a host the ranks share symmetric memory over CUDA IPC (NVLink);
// between hosts every rank talks to its counterparts (same l) through the runtime's
// InterHostLink (inter_host.h: the product's proxy ring, proxy thread and socket transport).
//   allReduce(x) = intra-host reduceScatter (NVLink kernel) -> allReduce of the rank's block
//   across hosts (InterHostLink::all_reduce: GPU -> ring -> proxy -> TCP -> peer host memory)
//   -> intra-host allGather (NVLink kernel), all on one stream.
// (gpu_runtime_hosts_test checks the same path end to end through CudaComm; this test times
// its steps.)
// Checks: fp32 inputs of small integers (every sum exact, whatever the order), fresh per run
// (seed printed), outputs poisoned first, every element bit-exact, counts 0, 7, 1,000,003 and
// 16 Mi, back to back on the same memory and signal words. Prints each step's time for the
// largest count and the proxy step's throughput per rank (FC_TEST_JSON=<file>: also one JSON
// row per rank, appended; the caller adds device, commit and date).
// FC_TEST_HOSTS=<H> (default 2) and FC_TEST_LOCAL=<L> (default: GPUs / H, at least 1); with
// FC_TEST_SHARED_GPU=<n> (any n >= 2), ranks may share GPUs (timings meaningless). Exit 77 (skip) with a
// reason where no Hopper GPU is visible, or where the layout would need more GPUs.
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "fusedcomm/runtime/inter_host.h"
#include "fusedcomm/runtime/runtime.h"
#include "fusedcomm/runtime/split.h"
#include "fusedcomm/runtime/symmetric_memory.h"
#include "kernels/collectives/collectives.h"
#include "support/gpu_test_support.h"
#include "support/process_group.h"
#include "support/proxy_test_support.h"

namespace {

namespace k = fusedcomm::kernels;
using fusedcomm::InterHostLink;
using fusedcomm::split_count;
using fusedcomm::SymmetricConfig;
using fusedcomm::SymmetricMemory;
using fusedcomm::testing::check;
using fusedcomm::testing::ProcessGroup;

constexpr int64_t kMaxCount = int64_t{16} << 20;

int rank_main(ProcessGroup& g, int H, int L, int gpus, bool shared, uint64_t seed) {
  const int rank = g.rank, h = rank / L, l = rank % L;
  CUDA_OK(cudaSetDevice(rank % gpus));

  // Intra-host: symmetric memory among the L ranks of host h.
  SymmetricConfig cfg;
  cfg.data_bytes = kMaxCount * 4;
  cfg.allow_shared_gpu = shared;
  SymmetricMemory sm(l, L, cfg);
  {
    const auto all = g.all_gather(sm.export_handle());
    sm.connect(std::vector<std::vector<uint8_t>>(all.begin() + h * L, all.begin() + (h + 1) * L));
  }

  // Between hosts: this rank and its counterparts (ranks l, L + l, ...), link host h.
  // Its data area is unused here (the test's own SymmetricMemory above): small.
  fusedcomm::Runtime rt(fusedcomm::testing::loopback_cuda_config(rank % gpus, seed, 60000, 1 << 20, shared));
  InterHostLink link(rt, h, H, InterHostLink::chunk_bytes_for(rt.config()), rt.config().transport_streams);
  {
    const InterHostLink::Blob mine = link.blob();
    std::vector<uint8_t> raw(sizeof mine);
    std::memcpy(raw.data(), &mine, sizeof mine);
    const auto all = g.all_gather(raw);
    std::vector<InterHostLink::Blob> peers(H);
    std::vector<std::string> names;
    for (int q = 0; q < H; ++q) {
      std::memcpy(&peers[q], all[q * L + l].data(), sizeof(InterHostLink::Blob));
      names.push_back("rank " + std::to_string(q * L + l) + " (host " + std::to_string(q) + ")");
    }
    link.connect(peers, names, 100 + l, fusedcomm::rdma::auth::derive_comm_key(seed, 100 + l, {}));
  }

  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  float *shard = nullptr, *out = nullptr;
  CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&shard), kMaxCount * 4));
  CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&out), kMaxCount * 4));
  cudaEvent_t ev[4];
  for (auto& e : ev) CUDA_OK(cudaEventCreate(&e));
  // Small integers in [-64, 64): sums over up to 64 ranks stay exact in fp32 in any order.
  auto value = [&](int r, int64_t i) {
    return static_cast<float>(
        static_cast<int>(fusedcomm::testing::mix(seed ^ uint64_t(r) << 48 ^ uint64_t(i)) % 128) - 64);
  };
  for (const int64_t count : {int64_t{0}, int64_t{7}, int64_t{1000003}, kMaxCount}) {
    std::vector<float> x(count);
    for (int64_t i = 0; i < count; ++i) x[i] = value(rank, i);
    CUDA_OK(cudaMemcpy(sm.data(), x.data(), count * 4, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemset(out, 0xFF, kMaxCount * 4));  // NaN
    const int64_t n_l = split_count(count, L, l);
    k::CollectiveArgs rs;
    rs.op = k::CommOp::kReduceScatter;
    rs.dtype = k::CommDtype::kF32;
    rs.count = count;
    rs.output = shard;
    k::CollectiveArgs ag;
    ag.op = k::CommOp::kAllGather;
    ag.dtype = k::CommDtype::kF32;
    ag.count = count;
    ag.output = out;
    g.barrier();
    CUDA_OK(cudaEventRecord(ev[0], stream));
    CUDA_OK(k::launch_collective(sm.device(), rs, stream));
    CUDA_OK(cudaEventRecord(ev[1], stream));
    link.all_reduce(shard, n_l, k::CommDtype::kF32, stream);
    CUDA_OK(cudaEventRecord(ev[2], stream));
    // The reduceScatter's peers are done with this rank's input: the block goes there.
    CUDA_OK(cudaMemcpyAsync(sm.data(), shard, n_l * 4, cudaMemcpyDeviceToDevice, stream));
    CUDA_OK(k::launch_collective(sm.device(), ag, stream));
    CUDA_OK(cudaEventRecord(ev[3], stream));
    CUDA_OK(cudaStreamSynchronize(stream));
    sm.raise_if_failed();
    std::string link_error;
    try {
      link.raise_if_failed();
    } catch (const std::exception& e) { link_error = e.what(); }
    CUDA_OK(cudaMemcpy(x.data(), out, count * 4, cudaMemcpyDeviceToHost));
    int64_t bad = 0;
    for (int64_t i = 0; i < count; ++i) {
      float want = 0;
      for (int r = 0; r < H * L; ++r) want += value(r, i);
      bad += std::memcmp(&x[i], &want, 4) != 0;
    }
    const std::string what = "allReduce of " + std::to_string(count) + " fp32, rank " + std::to_string(rank) +
                             " (host " + std::to_string(h) + ")";
    check(link_error.empty(), what + ": the step between hosts failed: " + link_error);
    check(bad == 0, what + ": " + std::to_string(bad) + " elements wrong");
    if (count == kMaxCount) {
      float ms[3];
      for (int s = 0; s < 3; ++s) CUDA_OK(cudaEventElapsedTime(&ms[s], ev[s], ev[s + 1]));
      std::printf(
          "  rank %d (host %d, local %d): 64 MiB allReduce: intra reduceScatter %.3f ms, "
          "inter-host proxy step %.3f ms (%.2f GB/s of its block), intra allGather %.3f ms\n",
          rank, h, l, ms[0], ms[1], n_l * 4.0 / (ms[1] * 1e-3) / 1e9, ms[2]);
      if (const char* path = std::getenv("FC_TEST_JSON")) {  // one row per rank, appended
        if (FILE* f = std::fopen(path, "a")) {
          std::fprintf(f,
                       "{\"op\": \"allReduce\", \"impl\": \"hierarchical_proxy\", \"hosts\": %d, "
                       "\"local\": %d, \"rank\": %d, \"dtype\": \"fp32\", \"bytes\": %lld, "
                       "\"shared_gpu\": %s, \"intra_rs_ms\": %.4f, \"proxy_ms\": %.4f, "
                       "\"proxy_block_gbps\": %.3f, \"intra_ag_ms\": %.4f}\n",
                       H, L, rank, static_cast<long long>(count * 4), shared ? "true" : "false", ms[0], ms[1],
                       n_l * 4.0 / (ms[1] * 1e-3) / 1e9, ms[2]);
          std::fclose(f);
        }
      }
    }
  }
  g.barrier();
  link.close(true);
  for (auto& e : ev) cudaEventDestroy(e);
  cudaFree(shard);
  cudaFree(out);
  cudaStreamDestroy(stream);
  sm.close();
  return fusedcomm::testing::rank_result(rank);
}

}  // namespace

int main() { return fusedcomm::testing::run_virtual_hosts("gpu_hier_test", rank_main); }
