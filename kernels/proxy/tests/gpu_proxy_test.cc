// gpu_proxy_test: GPU producers of the proxy ring (proxy.h, docs/architecture.md) over the
// socket transport. Two forked processes play two hosts (each its own socket transport, ring,
// proxy thread and mapped host regions), rank r on GPU r % (GPU count); every write goes
// GPU -> ring -> proxy -> TCP -> peer's transport -> host memory -> the peer kernel's poll.
//   stream: credit-controlled message streams both ways round (rank 0 sends, rank 1 returns
//     credits), fresh seeded data, every word checked by the receiving kernel: 16 B x 1,000
//     messages (depth 1: a round trip each, the latency), 64 KiB + 16 B x 200 (depth 4), and
//     4 MiB x 64 (depth 8) without checks for the throughput (printed; the bytes are checked in
//     the 64 KiB case); one way, 48 x 4 MiB with only the sender on the GPU and the receiving
//     host checking every word (the GPU-posted send path's throughput; printed);
//   timeout: a receiver waiting for a message nobody sends gives up after 300 ms
//     (kProxyTimeout), the process survives, and the next stream on the same ring works;
//   allReduce across the two hosts (launch_proxy_collective): 1, 5, 1,000,003 and 4 Mi fp32
//     elements back to back on the same signal words, bit-exact against x_0 + x_1; one
//     allReduce captured in a CUDA graph (value base on the device) replayed 5 times with fresh
//     inputs, each bit-exact;
//   abort: the host sets the ring's abort word while a receiver waits: kProxyAborted.
// Exit 77 (skip) with a reason where no Hopper GPU is visible.
#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "fusedcomm/rdma/proxy.h"
#include "fusedcomm/rdma/transport.h"
#include "kernels/proxy/proxy.h"
#include "support/gpu_test_support.h"
#include "support/process_group.h"
#include "support/proxy_test_support.h"

namespace {

namespace k = fusedcomm::kernels;
using fusedcomm::testing::check;
using fusedcomm::testing::ProcessGroup;
using fusedcomm::testing::ProxyBlob;
using fusedcomm::testing::ProxyEndpoint;
using namespace std::chrono_literals;

constexpr uint32_t kRingCapacity = 64;
constexpr uint64_t kBoxBytes = 192ull << 20;  // outbox and inbox: up to 48 slots of 4 MiB
constexpr uint64_t kSignalBytes = 4096;       // one 8-byte signal word per stream

struct StreamResult {
  uint32_t status = 0, mismatches = 0;
  double seconds = 0;
};

// Runs one stream (both ranks call it with the same sizes; `sig` picks a fresh signal word).
StreamResult run_stream(const ProxyEndpoint& ep, int rank, const ProxyBlob& peer, int sig, uint64_t bytes,
                        uint32_t depth, uint32_t count, uint32_t seed, bool check_words, uint64_t timeout_ns,
                        int role = -1) {
  uint32_t* d = nullptr;
  CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&d), 8));
  CUDA_OK(cudaMemset(d, 0, 8));
  k::ProxyStreamTest t{};
  t.ring = ep.device();
  t.role = role >= 0 ? role : rank;
  t.peer = 1 - rank;
  t.outbox = static_cast<uint8_t*>(ep.outbox.dev);
  t.inbox = static_cast<const uint8_t*>(ep.inbox.dev);
  t.signal_offset = 8ull * sig;
  t.my_signal = reinterpret_cast<const uint64_t*>(static_cast<uint8_t*>(ep.signal.dev) + t.signal_offset);
  t.outbox_key = ep.out_key;
  t.peer_inbox_key = peer.inbox_key;
  t.peer_signal_key = peer.signal_key;
  t.bytes = bytes;
  t.depth = depth;
  t.count = count;
  t.seed = seed;
  t.check = check_words ? 1 : 0;
  t.timeout_ns = timeout_ns;
  t.status = d;
  t.mismatches = d + 1;
  const auto t0 = std::chrono::steady_clock::now();
  CUDA_OK(k::launch_proxy_stream_test(t, nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  StreamResult r;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  uint32_t h[2];
  CUDA_OK(cudaMemcpy(h, d, 8, cudaMemcpyDeviceToHost));
  r.status = h[0];
  r.mismatches = h[1];
  CUDA_OK(cudaFree(d));
  return r;
}

int rank_main(ProcessGroup& g, int gpus, uint64_t seed) {
  const int rank = g.rank;
  CUDA_OK(cudaSetDevice(rank % gpus));
  ProxyEndpoint ep(kBoxBytes, kBoxBytes, kSignalBytes, kRingCapacity);
  const std::vector<ProxyBlob> blobs = ProxyEndpoint::gather(g, ep.blob());
  const ProxyBlob& peer = blobs[1 - rank];
  ep.connect(blobs, rank, seed | 1, 1);

  const uint64_t second = 1000000000ull;
  int sig = 0;
  auto stream = [&](const char* name, uint64_t bytes, uint32_t depth, uint32_t count, bool chk) {
    const uint32_t s = static_cast<uint32_t>(fusedcomm::testing::mix(seed + sig));
    const StreamResult res = run_stream(ep, rank, peer, sig++, bytes, depth, count, s, chk, 20 * second);
    check(res.status == k::kProxyOk, std::string(name) + ": rank " + std::to_string(rank) + " status " +
                                         std::to_string(res.status) + ", proxy: " + ep.proxy_error());
    check(res.mismatches == 0, std::string(name) + ": rank " + std::to_string(rank) + " " +
                                   std::to_string(res.mismatches) + " words differ");
    g.barrier();
    return res;
  };
  const StreamResult lat = stream("16 B x 1000, depth 1", 16, 1, 1000, true);
  stream("64 KiB + 16 B x 200, depth 4", (64 << 10) + 16, 4, 200, true);
  const StreamResult bw = stream("4 MiB x 64, depth 8", 4ull << 20, 8, 64, false);
  if (rank == 0) {
    std::printf("  round trip (16 B message + credit): %.1f us%s\n", lat.seconds / 1000 * 1e6,
                gpus == 1 ? " (both ranks on one GPU: their kernels time-slice it, so this is "
                            "mostly context switches)"
                          : "");
    std::printf("  stream 4 MiB x 64 (GPU -> ring -> proxy -> TCP loopback -> peer): %.2f GB/s\n",
                64.0 * (4 << 20) / bw.seconds / 1e9);
  }

  // One way, only the sender on the GPU (so nothing time-slices it): rank 0's kernel writes
  // and posts 48 messages of 4 MiB without credits (depth = count); rank 1's host polls the
  // signal word, times the stream, then checks every word.
  {
    constexpr uint32_t kCount = 48;
    constexpr uint64_t kMsg = 4ull << 20;
    const uint32_t s = static_cast<uint32_t>(fusedcomm::testing::mix(seed + 1000));
    g.barrier();
    const auto t0 = std::chrono::steady_clock::now();
    if (rank == 0) {
      const StreamResult res = run_stream(ep, rank, peer, sig, kMsg, kCount, kCount, s, false, 20 * second);
      check(res.status == k::kProxyOk, "one way: sender status " + std::to_string(res.status));
    } else {
      std::atomic_ref<uint64_t> word(
          *reinterpret_cast<uint64_t*>(static_cast<uint8_t*>(ep.signal.host) + 8ull * sig));
      while (word.load(std::memory_order_acquire) < kCount && std::chrono::steady_clock::now() - t0 < 20s) {
        std::this_thread::yield();
      }
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      check(word.load(std::memory_order_acquire) >= kCount,
            "one way: " + std::to_string(word.load()) + " of " + std::to_string(kCount) +
                " messages arrived in 20 s; proxy: " + ep.proxy_error());
      uint64_t bad = 0;
      const auto* in = static_cast<const uint32_t*>(ep.inbox.host);
      for (uint32_t m = 0; m < kCount; ++m) {
        for (uint64_t i = 0; i < kMsg / 4; ++i) {
          bad += in[m * (kMsg / 4) + i] != k::proxy_stream_word(s, m, i);
        }
      }
      check(bad == 0, "one way: " + std::to_string(bad) + " words differ");
      std::printf(
          "  one way, 48 x 4 MiB (GPU -> ring -> proxy -> TCP loopback -> host memory, "
          "no kernel on the receiver): %.2f GB/s\n",
          kCount * kMsg / secs / 1e9);
    }
    ++sig;
    g.barrier();
  }

  // allReduce across the two hosts (launch_proxy_collective): fresh random fp32 data, sizes
  // back to back on the same signal words (value_base advancing), every element bit-exact
  // against the rank-order sum computed here.
  {
    const uint64_t chunk = 256 << 10;
    uint64_t value_base = 0;
    uint32_t* status = nullptr;
    CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&status), 4));
    for (const int64_t count : {int64_t{1}, int64_t{5}, int64_t{1000003}, int64_t{4} << 20}) {
      auto value = [&](int r, int64_t i) {
        const uint64_t h = fusedcomm::testing::mix(seed ^ (uint64_t(r) << 40) ^ uint64_t(i) << 1);
        return static_cast<float>(static_cast<int64_t>(h >> 40) - (int64_t{1} << 23)) / 8388608.f;
      };
      std::vector<float> x(count);
      for (int64_t i = 0; i < count; ++i) x[i] = value(rank, i);
      float* d = nullptr;
      CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&d), count * 4));
      CUDA_OK(cudaMemcpy(d, x.data(), count * 4, cudaMemcpyHostToDevice));
      CUDA_OK(cudaMemset(status, 0, 4));
      k::ProxyCollective a = ep.allreduce_args(blobs, rank, d, count);
      a.base_word = 64;
      a.value_base = value_base;
      a.chunk_bytes = chunk;
      a.timeout_ns = 20 * second;
      a.status = status;
      g.barrier();
      const auto t0 = std::chrono::steady_clock::now();
      CUDA_OK(k::launch_proxy_collective(a, nullptr));
      CUDA_OK(cudaDeviceSynchronize());
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      value_base += k::proxy_collective_chunks(a);
      uint32_t st = 0;
      CUDA_OK(cudaMemcpy(&st, status, 4, cudaMemcpyDeviceToHost));
      CUDA_OK(cudaMemcpy(x.data(), d, count * 4, cudaMemcpyDeviceToHost));
      CUDA_OK(cudaFree(d));
      int64_t bad = 0;
      for (int64_t i = 0; i < count; ++i) {
        const float want = value(0, i) + value(1, i);
        bad += std::memcmp(&x[i], &want, 4) != 0;
      }
      const std::string what =
          "allReduce of " + std::to_string(count) + " fp32: rank " + std::to_string(rank);
      check(st == k::kProxyOk, what + " status " + std::to_string(st) + ", proxy: " + ep.proxy_error());
      check(bad == 0, what + ": " + std::to_string(bad) + " elements differ from x_0 + x_1");
      if (rank == 0 && count == (int64_t{4} << 20)) {
        std::printf(
            "  allReduce across 2 hosts, 16 MiB fp32 (256 KiB chunks): %.3f ms, %.2f GB/s "
            "algbw%s\n",
            secs * 1e3, count * 4.0 / secs / 1e9,
            gpus == 1 ? " (one GPU: each chunk waits for a context switch)" : "");
      }
    }
    CUDA_OK(cudaFree(status));
    g.barrier();
  }

  // CUDA-graph replay: one captured allReduce (its value base on the device: value_counter),
  // replayed 5 times with fresh inputs copied into the captured buffer before each replay. A
  // host-side value base would replay the first launch's signal values, which are already
  // reached: the waits would pass on stale signals and the sums read half-written inboxes.
  {
    const uint64_t chunk = 64 << 10;
    const int64_t count = 300007;  // 19 chunks of fp32
    uint32_t* status = nullptr;
    unsigned long long* counter = nullptr;
    float* d = nullptr;
    CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&status), 4));
    CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&counter), 8));
    CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&d), count * 4));
    CUDA_OK(cudaMemset(status, 0, 4));
    CUDA_OK(cudaMemset(counter, 0, 8));
    k::ProxyCollective a = ep.allreduce_args(blobs, rank, d, count);
    a.base_word = 128;  // words no earlier test used: the counter starts at 0 with them
    a.value_counter = counter;
    a.chunk_bytes = chunk;
    a.timeout_ns = 20 * second;
    a.status = status;
    cudaStream_t s;
    CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    CUDA_OK(k::launch_proxy_collective(a, s));
    CUDA_OK(cudaStreamEndCapture(s, &graph));
    CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    for (int replay = 0; replay < 5; ++replay) {
      auto value = [&](int r, int64_t i) {
        return static_cast<float>(
            static_cast<int>(
                fusedcomm::testing::mix(seed ^ (uint64_t(r) << 40) ^ (uint64_t(replay) << 32) ^ uint64_t(i)) %
                64) -
            32);
      };
      std::vector<float> x(count);
      for (int64_t i = 0; i < count; ++i) x[i] = value(rank, i);
      CUDA_OK(cudaMemcpy(d, x.data(), count * 4, cudaMemcpyHostToDevice));
      g.barrier();  // skew: each rank's replay starts whenever; the waits order them
      CUDA_OK(cudaGraphLaunch(exec, s));
      CUDA_OK(cudaStreamSynchronize(s));
      uint32_t st = 0;
      CUDA_OK(cudaMemcpy(&st, status, 4, cudaMemcpyDeviceToHost));
      CUDA_OK(cudaMemcpy(x.data(), d, count * 4, cudaMemcpyDeviceToHost));
      int64_t bad = 0;
      for (int64_t i = 0; i < count; ++i) bad += x[i] != value(0, i) + value(1, i);
      const std::string what =
          "graph replay " + std::to_string(replay) + " of a captured allReduce: rank " + std::to_string(rank);
      check(st == k::kProxyOk, what + " status " + std::to_string(st) + ", proxy: " + ep.proxy_error());
      check(bad == 0, what + ": " + std::to_string(bad) + " elements differ from x_0 + x_1");
      g.barrier();  // both ranks checked before the next replay's input overwrites d
    }
    unsigned long long used = 0;
    CUDA_OK(cudaMemcpy(&used, counter, 8, cudaMemcpyDeviceToHost));
    check(used == 5 * k::proxy_collective_chunks(a), "graph replay: the device counter advanced by " +
                                                         std::to_string(used) +
                                                         " values, not 5 x the op's chunks");
    CUDA_OK(cudaGraphExecDestroy(exec));
    CUDA_OK(cudaGraphDestroy(graph));
    CUDA_OK(cudaStreamDestroy(s));
    for (void* p : {static_cast<void*>(status), static_cast<void*>(counter), static_cast<void*>(d)})
      cudaFree(p);
    g.barrier();
  }

  // Timeout: rank 1 waits for a message that rank 0 never sends.
  if (rank == 1) {
    const auto t0 = std::chrono::steady_clock::now();
    const StreamResult res = run_stream(ep, rank, peer, sig, 16, 1, 1, 7, true, 300000000ull);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    check(res.status == k::kProxyTimeout,
          "timeout: status " + std::to_string(res.status) + " (expected kProxyTimeout)");
    check(s >= 0.3 && s < 5.0, "timeout: gave up after " + std::to_string(s) + " s");
  }
  ++sig;
  g.barrier();
  stream("after the timeout: 64 KiB + 16 B x 20", (64 << 10) + 16, 2, 20, true);

  // Abort: rank 1's host sets the abort word while its kernel waits.
  if (rank == 1) {
    std::thread setter([&] {
      std::this_thread::sleep_for(200ms);
      std::atomic_ref<uint64_t>(ep.ring().header()->abort).store(1, std::memory_order_release);
    });
    const StreamResult res = run_stream(ep, rank, peer, sig, 16, 1, 1, 7, true, 20 * second);
    setter.join();
    check(res.status == k::kProxyAborted,
          "abort: status " + std::to_string(res.status) + " (expected kProxyAborted)");
    check(res.seconds < 5.0, "abort: returned after " + std::to_string(res.seconds) + " s");
  }
  g.barrier();
  ep.close(false);  // rank 1's proxy stopped at the abort: no polite close
  return fusedcomm::testing::rank_result(rank);
}

}  // namespace

int main() {
  const int n = fusedcomm::testing::gpus_or_skip("gpu_proxy_test");
  if (n == 0) return 77;
  const uint64_t seed = fusedcomm::testing::test_seed("gpu_proxy_test", n);
  std::printf("== 2 ranks (virtual hosts) on GPUs 0 and %d\n", 1 % n);
  const int failed = fusedcomm::testing::run_processes(
      2, [&](ProcessGroup& g) { return rank_main(g, n, seed); }, 240);
  std::printf("== gpu_proxy_test: %s\n", failed == 0 ? "PASS" : "FAIL");
  return failed == 0 ? 0 : 1;
}
