// gpu_link_threads_test: the cuda backend's path between hosts (InterHostLink, inter_host.h) with
// its H ends (FC_TEST_HOSTS, default 2, at most 8) as threads of one process on one GPU, each
// with its own Runtime (socket
// transport on the loopback, proxy thread) and its own stream. Threads share the process's CUDA
// context, so both ends' kernels run at the same time; forked ranks on one GPU time-slice it
// instead, and there every chunk of a proxy op waits for a context switch (gpu_hier_test's
// "shared" timings). So this is the one-GPU measure of the proxy path's own throughput:
// GPU -> mapped host memory -> proxy -> TCP loopback -> peer host memory -> peer GPU. With more
// than two ends it also runs the protocol with every end's kernel truly concurrent.
// Per op (allReduce, allGather, reduceScatter, allToAll; fp32 and bf16; `count` = 16 Mi elements per
// host block unless FC_TEST_COUNT says otherwise): fresh small-integer inputs, outputs poisoned,
// every element checked bit-exact after the first launch; then 5 timed launches back to back,
// and the bytes each end sends per second (to all its peers, all ends at once); and an
// allGather in which only host 0's block is not empty, for one direction alone; and allReduces
// 30 ms apart (the proxies asleep in between), their median time per launch and the process's
// CPU time meanwhile. FC_TEST_CHUNK=<bytes> sets the link's chunk (default: what CudaComm gives
// the link, spark.fusedcomm.host.chunkBytes's default of 1 MiB per stream), FC_TEST_STREAMS=<1..4>
// the link's lanes and the transports' receiver threads, FC_TEST_BUSY_POLL_US their busy-poll
// window (defaults: RuntimeConfig's). FC_TEST_JSON=<file>: one JSON row per op, appended. First, two ends with different stream counts, then two with
// different chunks, must both be refused at connect. Exit 77 (skip) with the reason where no
// Hopper GPU is visible.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <barrier>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <exception>
#include <string>
#include <thread>
#include <vector>

#include <mutex>

#include "fusedcomm/runtime/inter_host.h"
#include "fusedcomm/runtime/runtime.h"
#include "support/gpu_test_support.h"
#include "support/proxy_test_support.h"

namespace {

namespace k = fusedcomm::kernels;
using fusedcomm::InterHostLink;

// check() (check.h) counts in plain ints: the ends take turns.
std::mutex g_check_mu;
void check(bool ok, const std::string& what) {
  std::lock_guard<std::mutex> l(g_check_mu);
  fusedcomm::testing::check(ok, what);
}

constexpr int kTimed = 5;

using fusedcomm::testing::encode_elements;
float value(uint64_t seed, int host, int64_t i) { return fusedcomm::testing::small_value(seed, host, i); }

struct Shared {
  explicit Shared(int hosts)
      : H(hosts),
        sync(hosts),
        blobs(hosts),
        gbps(hosts),
        us(hosts),
        spaced_ms(hosts),
        launch_ns(hosts),
        behind_start(hosts),
        behind_end(hosts) {}
  const int H;
  // A thread that throws drops out (arrive_and_drop), so the others never wait for it here;
  // their link ops then time out (bounded).
  std::barrier<> sync;
  std::vector<InterHostLink::Blob> blobs;
  std::vector<std::array<std::array<double, 4>, 2>> gbps;  // [end][dtype][op]
  std::vector<std::array<std::array<double, 4>, 2>> us;    // [end][dtype][op]: per launch
  double one_way[2] = {};  // [dtype]: host 0 -> the others, allGather with only host 0's block
  // [end][dtype][launch] of the spaced allReduces: each one's time, and when its end launched it
  // (steady clock): the ends leave the barrier at different times, and an op cannot end before
  // the last end launched it, so the last end's time is the op's latency without that skew.
  static constexpr int kSpaced = 5;
  std::vector<std::array<std::array<float, kSpaced>, 2>> spaced_ms;
  std::vector<std::array<std::array<int64_t, kSpaced>, 2>> launch_ns;
  // Spaced allReduces each enqueued behind milliseconds of other GPU work (as an op enqueued
  // ahead of the GPU is: the launch's hint to the proxies comes that much early). The ends'
  // work shares the one GPU and ends at different times, so an op's time is taken from the
  // last end's start to the last end's finish, all on the GPU's clock: [end][launch] events
  // around each end's op, and [dtype][launch] the times end 0 derives from them.
  std::vector<std::array<cudaEvent_t, kSpaced>> behind_start, behind_end;
  std::array<std::array<float, kSpaced>, 2> behind_us{};
  // [dtype]: the process's CPU time and the wall time over the spaced launches (measured by
  // end 0 between barriers: every end's threads, the proxies' and receivers' included), for
  // what the busy-poll window costs.
  double spaced_cpu_ms[2] = {}, spaced_wall_ms[2] = {};
};

double process_cpu_ms() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

// One op: every end calls it at the same point. Returns this end's sent GB/s (to all its peers)
// over the timed launches, after checking the first launch's result.
// one_way (allGather only): every block but host 0's is empty, so only host 0 sends (and the
// others check).
struct Timing {
  double gbps, us_per_launch;
};
Timing run_op(InterHostLink& link, Shared& sh, int host, uint32_t op, k::CommDtype dtype, int64_t count,
              uint64_t seed, cudaStream_t s, bool one_way = false) {
  const int H = sh.H;
  const size_t es = dtype == k::CommDtype::kF32 ? 4 : 2;
  const size_t bytes = static_cast<size_t>(count) * es;
  // in[h]: this host's block for host h (reduceScatter, allToAll), or its input (in[0]).
  std::vector<void*> in(H), out(H);
  for (int h = 0; h < H; ++h) {
    CUDA_OK(cudaMalloc(&in[h], bytes));
    CUDA_OK(cudaMalloc(&out[h], bytes));
  }
  // Everything before the launches on s (a non-blocking stream: no ordering with the legacy
  // default stream).
  std::vector<float> host_in(count);
  for (int h = 0; h < H; ++h) {
    for (int64_t i = 0; i < count; ++i) host_in[i] = value(seed + h, host, i);
    const std::vector<uint8_t> enc = encode_elements(host_in, dtype);
    CUDA_OK(cudaMemcpyAsync(in[h], enc.data(), bytes, cudaMemcpyHostToDevice, s));
    CUDA_OK(cudaMemsetAsync(out[h], 0xFF, bytes, s));
    CUDA_OK(cudaStreamSynchronize(s));  // host_in is refilled next
  }
  std::vector<int64_t> counts(H, count);
  if (one_way) std::fill(counts.begin() + 1, counts.end(), 0);
  auto launch = [&] {
    switch (op) {
      case k::kProxyAllReduce: link.all_reduce(out[0], count, dtype, s); break;
      case k::kProxyAllGather: link.all_gather(out, counts, dtype, s); break;
      case k::kProxyReduceScatter: link.reduce_scatter(in, counts, out[host], dtype, s); break;
      default: link.all_to_all(in, counts, out, counts, dtype, s);
    }
  };
  // allReduce works in place on out[0], allGather from the own block of the output.
  if (op == k::kProxyAllReduce || op == k::kProxyAllGather) {
    CUDA_OK(
        cudaMemcpyAsync(out[op == k::kProxyAllReduce ? 0 : host], in[0], bytes, cudaMemcpyDeviceToDevice, s));
  }
  CUDA_OK(cudaStreamSynchronize(s));
  sh.sync.arrive_and_wait();
  launch();
  CUDA_OK(cudaStreamSynchronize(s));
  const std::string what = std::string(k::proxy_op_name(op)) + " of " + std::to_string(count) +
                           (es == 4 ? " fp32" : " bf16") + (one_way ? " (one way)" : "") + ", host " +
                           std::to_string(host) + " of " + std::to_string(H);
  try {
    link.raise_if_failed();
  } catch (const std::exception& e) { check(false, what + ": " + e.what()); }
  // What arrived, per output block b: allReduce (b = 0): the sum of every host's in[0];
  // allGather: host b's own block (b != host); reduceScatter (b = host): the sum of every
  // host's block for this host; allToAll: what host b sent this one (b != host).
  std::vector<uint8_t> got(bytes);
  std::vector<float> want(count);
  for (int b = 0; b < H; ++b) {
    const bool checked = op == k::kProxyAllReduce       ? b == 0
                         : op == k::kProxyReduceScatter ? b == host
                         : op == k::kProxyAllGather     ? b != host && (!one_way || b == 0)
                                                        : b != host;
    if (!checked) continue;
    CUDA_OK(cudaMemcpy(got.data(), out[b], bytes, cudaMemcpyDeviceToHost));
    for (int64_t i = 0; i < count; ++i) {
      float w = 0;
      switch (op) {
        case k::kProxyAllReduce:
          for (int h = 0; h < H; ++h) w += value(seed, h, i);
          break;
        case k::kProxyAllGather: w = value(seed, b, i); break;
        case k::kProxyReduceScatter:
          for (int h = 0; h < H; ++h) w += value(seed + host, h, i);
          break;
        default: w = value(seed + host, b, i);
      }
      want[i] = w;
    }
    const std::vector<uint8_t> want_bytes = encode_elements(want, dtype);
    int64_t bad = 0;
    for (size_t i = 0; i < bytes; i += es) bad += std::memcmp(&got[i], &want_bytes[i], es) != 0;
    check(bad == 0, what + ": block " + std::to_string(b) + ": " + std::to_string(bad) + " elements wrong");
  }
  // Timed: kTimed launches back to back (allReduce keeps summing in place, unchecked).
  cudaEvent_t t0, t1;
  CUDA_OK(cudaEventCreate(&t0));
  CUDA_OK(cudaEventCreate(&t1));
  sh.sync.arrive_and_wait();
  CUDA_OK(cudaEventRecord(t0, s));
  for (int i = 0; i < kTimed; ++i) launch();
  CUDA_OK(cudaEventRecord(t1, s));
  CUDA_OK(cudaStreamSynchronize(s));
  float ms = 0;
  CUDA_OK(cudaEventElapsedTime(&ms, t0, t1));
  try {
    link.raise_if_failed();
  } catch (const std::exception& e) { check(false, what + " (timed): " + e.what()); }
  cudaEventDestroy(t0);
  cudaEventDestroy(t1);
  for (int h = 0; h < H; ++h) {
    cudaFree(in[h]);
    cudaFree(out[h]);
  }
  const double sent = one_way ? (host == 0 ? bytes * (H - 1.0) : 0.0) : bytes * (H - 1.0);
  return {sent * kTimed / (ms * 1e-3) / 1e9, ms * 1e3 / kTimed};
}

void end_main(Shared& sh, int host, uint64_t seed, int64_t count, int64_t chunk) {
  CUDA_OK(cudaSetDevice(0));
  // No symmetric memory here: a small data area.
  fusedcomm::Runtime rt(fusedcomm::testing::loopback_cuda_config(0, seed, 60000, 1 << 20, true));
  InterHostLink link(rt, host, sh.H, static_cast<uint64_t>(chunk), rt.config().transport_streams);
  sh.blobs[host] = link.blob();
  sh.sync.arrive_and_wait();
  std::vector<std::string> names;
  for (int h = 0; h < sh.H; ++h) names.push_back("host " + std::to_string(h));
  link.connect(sh.blobs, names, 7, fusedcomm::rdma::auth::derive_comm_key(seed, 7, {}));
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  for (int d = 0; d < 2; ++d) {
    const k::CommDtype dtype = d == 0 ? k::CommDtype::kF32 : k::CommDtype::kBF16;
    for (uint32_t op = k::kProxyAllReduce; op <= k::kProxyAllToAll; ++op) {
      const Timing t = run_op(link, sh, host, op, dtype, count, seed ^ (op * 0x100 + d), s);
      sh.gbps[host][d][op] = t.gbps;
      sh.us[host][d][op] = t.us_per_launch;
    }
    const double g =
        run_op(link, sh, host, k::kProxyAllGather, dtype, count, seed ^ (0x500 + d), s, true).gbps;
    if (host == 0) sh.one_way[d] = g;
    // Spaced: 5 allReduces, each after 30 ms of idleness (as between the steps of a job: the
    // proxies have gone to sleep); the median time from launch to done, per end.
    void* x = nullptr;
    CUDA_OK(cudaMalloc(&x, count * 4));
    CUDA_OK(cudaMemsetAsync(x, 0, count * 4, s));
    cudaEvent_t e0, e1;
    CUDA_OK(cudaEventCreate(&e0));
    CUDA_OK(cudaEventCreate(&e1));
    sh.sync.arrive_and_wait();
    const double cpu0 = process_cpu_ms();
    const auto wall0 = std::chrono::steady_clock::now();
    for (int rep = 0; rep < Shared::kSpaced; ++rep) {
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
      sh.sync.arrive_and_wait();
      sh.launch_ns[host][d][rep] = std::chrono::steady_clock::now().time_since_epoch().count();
      CUDA_OK(cudaEventRecord(e0, s));
      link.all_reduce(x, count, dtype, s);
      CUDA_OK(cudaEventRecord(e1, s));
      CUDA_OK(cudaStreamSynchronize(s));
      CUDA_OK(cudaEventElapsedTime(&sh.spaced_ms[host][d][rep], e0, e1));
    }
    sh.sync.arrive_and_wait();
    if (host == 0) {
      sh.spaced_cpu_ms[d] = process_cpu_ms() - cpu0;
      sh.spaced_wall_ms[d] =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - wall0).count();
    }
    // Spaced and enqueued behind two 1 GiB memsets (milliseconds of GPU work).
    void* filler = nullptr;
    CUDA_OK(cudaMalloc(&filler, size_t{1} << 30));
    for (int rep = 0; rep < Shared::kSpaced; ++rep) {
      cudaEvent_t& b0 = sh.behind_start[host][rep];
      cudaEvent_t& b1 = sh.behind_end[host][rep];
      CUDA_OK(cudaEventCreate(&b0));
      CUDA_OK(cudaEventCreate(&b1));
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
      sh.sync.arrive_and_wait();
      for (int f = 0; f < 2; ++f) CUDA_OK(cudaMemsetAsync(filler, f, size_t{1} << 30, s));
      CUDA_OK(cudaEventRecord(b0, s));
      link.all_reduce(x, count, dtype, s);
      CUDA_OK(cudaEventRecord(b1, s));
      CUDA_OK(cudaStreamSynchronize(s));
    }
    sh.sync.arrive_and_wait();
    if (host == 0) {
      for (int rep = 0; rep < Shared::kSpaced; ++rep) {
        float last_start = 0, last_end = 0, t = 0;
        for (int h = 0; h < sh.H; ++h) {
          CUDA_OK(cudaEventElapsedTime(&t, sh.behind_start[0][rep], sh.behind_start[h][rep]));
          last_start = std::max(last_start, t);
          CUDA_OK(cudaEventElapsedTime(&t, sh.behind_start[0][rep], sh.behind_end[h][rep]));
          last_end = std::max(last_end, t);
        }
        sh.behind_us[d][rep] = (last_end - last_start) * 1e3f;
      }
    }
    sh.sync.arrive_and_wait();
    for (int rep = 0; rep < Shared::kSpaced; ++rep) {
      cudaEventDestroy(sh.behind_start[host][rep]);
      cudaEventDestroy(sh.behind_end[host][rep]);
    }
    cudaFree(filler);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaFree(x);
  }
  sh.sync.arrive_and_wait();
  link.close(true);
  cudaStreamDestroy(s);
}

// Two ends that disagree on what shapes the protocol's slots, the streams between hosts (1 and 2)
// or the chunk (1 and 2 MiB at 2 streams): connect() must refuse on both, naming the setting,
// before any connection is tried.
void mismatch_case(uint64_t seed, const int streams[2], const uint64_t chunks[2],
                   const std::string& setting) {
  InterHostLink::Blob blobs[2];
  std::barrier<> sync(2);
  std::string errors[2];
  auto end = [&](int host) {
    CUDA_OK(cudaSetDevice(0));
    fusedcomm::RuntimeConfig config = fusedcomm::testing::loopback_cuda_config(0, seed, 5000, 1 << 20, true);
    config.transport_streams = streams[host];
    fusedcomm::Runtime rt(config);
    InterHostLink link(rt, host, 2, chunks[host], streams[host]);
    blobs[host] = link.blob();
    sync.arrive_and_wait();
    try {
      link.connect({blobs[0], blobs[1]}, {"host 0", "host 1"}, 11,
                   fusedcomm::rdma::auth::derive_comm_key(seed, 11, {}));
    } catch (const std::exception& e) { errors[host] = e.what(); }
    link.close(false);
  };
  std::thread other(end, 1);
  end(0);
  other.join();
  for (int h = 0; h < 2; ++h) {
    check(errors[h].find(setting + " must be the same") != std::string::npos,
          "host " + std::to_string(h) + " refuses a counterpart with another " + setting + ": '" + errors[h] +
              "'");
  }
}

}  // namespace

int main() {
  if (fusedcomm::testing::gpus_or_skip("gpu_link_threads_test") == 0) return 77;
  const char* hs = std::getenv("FC_TEST_HOSTS");
  const char* cs = std::getenv("FC_TEST_COUNT");
  const char* ks = std::getenv("FC_TEST_CHUNK");
  const int H = hs ? std::atoi(hs) : 2;
  const int64_t count = cs ? std::atoll(cs) : int64_t{16} << 20;
  const int streams = fusedcomm::testing::test_streams();
  // The link's chunk (FC_TEST_CHUNK): by default what CudaComm gives it, the default
  // spark.fusedcomm.host.chunkBytes per stream.
  fusedcomm::RuntimeConfig defaults;
  defaults.transport_streams = streams;
  const int64_t chunk = ks ? std::atoll(ks) : static_cast<int64_t>(InterHostLink::chunk_bytes_for(defaults));
  const long long busy_poll_us = fusedcomm::testing::test_busy_poll_us();
  if (H < 2 || H > k::kProxyMaxHosts) {
    std::printf("FAIL: FC_TEST_HOSTS=%d out of range 2..%d\n", H, k::kProxyMaxHosts);
    return 1;
  }
  const uint64_t seed = fusedcomm::testing::test_seed("gpu_link_threads_test", 1);
  std::printf(
      "== %d hosts as %d threads on GPU 0: %lld elements per block, %lld-byte chunks, %d streams, busy poll "
      "%lld us\n",
      H, H, static_cast<long long>(count), static_cast<long long>(chunk), streams, busy_poll_us);
  {
    const int one_two[2] = {1, 2}, two_two[2] = {2, 2};
    const uint64_t same[2] = {1 << 20, 1 << 20}, other[2] = {1 << 20, 2 << 20};
    mismatch_case(seed, one_two, same, "spark.fusedcomm.transport.streams");
    mismatch_case(seed, two_two, other, "spark.fusedcomm.host.chunkBytes");
  }
  Shared sh(H);
  std::vector<std::thread> ends;
  std::vector<std::string> errors(H);
  for (int h = 0; h < H; ++h) {
    ends.emplace_back([&, h] {
      try {
        end_main(sh, h, seed, count, chunk);
      } catch (const std::exception& e) {
        errors[h] = e.what();
        sh.sync.arrive_and_drop();
      }
    });
  }
  for (auto& t : ends) t.join();
  bool all_ran = true;
  for (int h = 0; h < H; ++h) {
    check(errors[h].empty(), "host " + std::to_string(h) + " threw: " + errors[h]);
    all_ran &= errors[h].empty();
  }
  if (all_ran) {
    const char* json = std::getenv("FC_TEST_JSON");
    FILE* f = json ? std::fopen(json, "a") : nullptr;
    for (int d = 0; d < 2; ++d) {
      const char* dt = d == 0 ? "fp32" : "bf16";
      const long long block = static_cast<long long>(count) * (d == 0 ? 4 : 2);
      for (uint32_t op = k::kProxyAllReduce; op <= k::kProxyAllToAll; ++op) {
        double lo = sh.gbps[0][d][op], hi = lo, us = 0;
        for (int h = 0; h < H; ++h) {
          lo = std::min(lo, sh.gbps[h][d][op]);
          hi = std::max(hi, sh.gbps[h][d][op]);
          us = std::max(us, sh.us[h][d][op]);
        }
        std::printf(
            "  %-13s %s %6.2f - %6.2f GB/s sent per end to its %d peers, %8.1f us per launch (%lld bytes per "
            "block, %d launches)\n",
            k::proxy_op_name(op), dt, lo, hi, H - 1, us, block, kTimed);
        if (f) {
          std::fprintf(
              f,
              "{\"op\": \"%s\", \"impl\": \"inter_host_link_threads\", \"hosts\": %d, \"streams\": %d, "
              "\"busy_poll_us\": %lld, \"dtype\": \"%s\", \"bytes\": %lld, \"chunk_bytes\": %lld, "
              "\"gbps_min\": %.3f, "
              "\"gbps_max\": %.3f, \"us_per_launch\": %.2f}\n",
              k::proxy_op_name(op), H, streams, busy_poll_us, dt, block, static_cast<long long>(chunk), lo,
              hi, us);
        }
      }
      std::printf("  %-13s %s %6.2f GB/s sent by host 0 to its %d peers (the other blocks empty)\n",
                  "allGather", dt, sh.one_way[d], H - 1);
      double spaced = 0;
      for (int h = 0; h < H; ++h) {
        std::array<float, Shared::kSpaced> ms = sh.spaced_ms[h][d];
        std::sort(ms.begin(), ms.end());
        spaced = std::max(spaced, ms[Shared::kSpaced / 2] * 1e3);
      }
      std::printf("  %-13s %s %8.1f us per launch, launches 30 ms apart (median; the slowest end)\n",
                  "allReduce", dt, spaced);
      std::array<float, Shared::kSpaced> behind_us = sh.behind_us[d];
      std::sort(behind_us.begin(), behind_us.end());
      const double behind = behind_us[Shared::kSpaced / 2];
      std::printf(
          "  %-13s %s %8.1f us per launch, 30 ms apart, each behind ms of other GPU work (median; last start "
          "to last end)\n",
          "allReduce", dt, behind);
      std::vector<double> last_us, skew_us;
      for (int rep = 0; rep < Shared::kSpaced; ++rep) {
        int last = 0, first = 0;
        for (int h = 1; h < H; ++h) {
          if (sh.launch_ns[h][d][rep] > sh.launch_ns[last][d][rep]) last = h;
          if (sh.launch_ns[h][d][rep] < sh.launch_ns[first][d][rep]) first = h;
        }
        last_us.push_back(sh.spaced_ms[last][d][rep] * 1e3);
        skew_us.push_back((sh.launch_ns[last][d][rep] - sh.launch_ns[first][d][rep]) * 1e-3);
      }
      std::sort(last_us.begin(), last_us.end());
      std::sort(skew_us.begin(), skew_us.end());
      std::printf(
          "  %-13s %s %8.1f us per launch at the end that launched last (median; launches %.1f us apart)\n",
          "allReduce", dt, last_us[Shared::kSpaced / 2], skew_us[Shared::kSpaced / 2]);
      const double cpu_per_op_end = sh.spaced_cpu_ms[d] * 1e3 / Shared::kSpaced / H;
      std::printf(
          "  %-13s %s %8.0f us of CPU per end per spaced launch (the process: %.1f ms of CPU in %.1f ms)\n",
          "allReduce", dt, cpu_per_op_end, sh.spaced_cpu_ms[d], sh.spaced_wall_ms[d]);
      if (f) {
        std::fprintf(f,
                     "{\"op\": \"allGather_one_way\", \"impl\": \"inter_host_link_threads\", \"hosts\": %d, "
                     "\"streams\": %d, \"busy_poll_us\": %lld, \"dtype\": \"%s\", \"bytes\": %lld, "
                     "\"chunk_bytes\": %lld, "
                     "\"gbps_host0\": %.3f}\n",
                     H, streams, busy_poll_us, dt, block, static_cast<long long>(chunk), sh.one_way[d]);
        std::fprintf(
            f,
            "{\"op\": \"allReduce_spaced_30ms\", \"impl\": \"inter_host_link_threads\", \"hosts\": %d, "
            "\"streams\": %d, \"busy_poll_us\": %lld, \"dtype\": \"%s\", \"bytes\": %lld, "
            "\"us_median_slowest_end\": %.1f, "
            "\"us_median_last_launcher\": %.1f, \"launch_skew_us_median\": %.1f, "
            "\"cpu_us_per_end_per_launch\": %.0f, "
            "\"us_median_behind_gpu_work\": %.1f}\n",
            H, streams, busy_poll_us, dt, block, spaced, last_us[Shared::kSpaced / 2],
            skew_us[Shared::kSpaced / 2], cpu_per_op_end, behind);
      }
    }
    if (f) std::fclose(f);
  }
  std::printf("  %d checks passed, %d failed\n== gpu_link_threads_test: %s\n", fusedcomm::testing::g_passed,
              fusedcomm::testing::g_failed, fusedcomm::testing::g_failed == 0 ? "PASS" : "FAIL");
  return fusedcomm::testing::g_failed == 0 ? 0 : 1;
}
