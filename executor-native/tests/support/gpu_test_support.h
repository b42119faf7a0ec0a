// What the multi-process GPU tests (gpu_collectives_test, gpu_fused_test) share: the check
// counters (check.h), CUDA_OK, the seed mixer and the run's seed, a rank's state
// (SymmetricRank) and reopening its symmetric memory, the Error a failed launch raised, the
// GPU-count probe (the parent must not create a CUDA context before it forks its ranks, so the
// probe runs in a child and reports back through a pipe) with its skip line, and the shared-GPU
// mode.
//
// Shared-GPU mode (FC_TEST_SHARED_GPU=<max world>, tests only): every rank runs on GPU 0, for
// worlds 2..max. The ranks' processes then time-slice the GPU, so each flag hand-off waits for
// a context switch: the protocol and the numerics are checked (the same code paths and checks
// as on separate GPUs, minus NVLink), timings are meaningless, and the long loops are
// shortened (shared_gpu_scale). For developing on a 1-GPU host; it never replaces a run on
// several GPUs.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "fusedcomm/runtime/errors.h"
#include "fusedcomm/runtime/runtime.h"
#include "fusedcomm/runtime/symmetric_memory.h"
#include "kernels/collectives/collectives.h"
#include "support/check.h"
#include "support/process_group.h"

#define CUDA_OK(x)                                                                                    \
  do {                                                                                                \
    cudaError_t e_ = (x);                                                                             \
    if (e_ != cudaSuccess) throw std::runtime_error(std::string(#x) + ": " + cudaGetErrorString(e_)); \
  } while (0)

namespace fusedcomm::testing {

// Set by the test's main from FC_TEST_SHARED_GPU (see above); read by reopen().
inline bool g_shared_gpu = false;
// The max world of the shared-GPU mode (0: off).
inline int shared_gpu_world() {
  const char* s = std::getenv("FC_TEST_SHARED_GPU");
  const int w = s ? std::atoi(s) : 0;
  return w >= 2 ? w : 0;
}
// FC_TEST_WORLDS=<w,w,...> (tests only): run only these worlds of the test's usual list (e.g.
// "5,8" on an 8-GPU host after 1-4 passed elsewhere, or with FC_TEST_SHARED_GPU=8). Unset or
// empty: every world. A listed world the test would not run (above the GPU count) is skipped.
inline bool test_world_selected(int world) {
  const char* s = std::getenv("FC_TEST_WORLDS");
  if (s == nullptr || *s == '\0') return true;
  for (const char* p = s; *p != '\0';) {
    char* end = nullptr;
    const long w = std::strtol(p, &end, 10);
    if (end == p) return false;  // not a number: nothing matches (the log shows no world)
    if (w == world) return true;
    if (*end == '\0') break;
    if (*end != ',') return false;
    p = end + 1;
  }
  return false;
}
// Iteration counts of long loops: n, or n / 5 (at least 1) in the shared-GPU mode.
inline int shared_gpu_scale(int n) { return g_shared_gpu ? (n / 5 > 0 ? n / 5 : 1) : n; }

// splitmix64's finaliser: keys for the seeded test data.
inline uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Small integers in [-8, 8), element i of rank `rank`'s data under `seed`: sums over up to 32
// ranks stay exact in fp32 and bf16, in any order.
inline float small_value(uint64_t seed, int rank, int64_t i) {
  return static_cast<float>(static_cast<int>(mix(seed ^ uint64_t(rank) << 48 ^ uint64_t(i)) % 16) - 8);
}

// v in `dtype` (fp32, or bf16 rounded to nearest), as bytes.
inline std::vector<uint8_t> encode_elements(const std::vector<float>& v, kernels::CommDtype dtype) {
  std::vector<uint8_t> out(v.size() * (dtype == kernels::CommDtype::kF32 ? 4 : 2));
  for (size_t i = 0; i < v.size(); ++i) {
    if (dtype == kernels::CommDtype::kF32) {
      std::memcpy(&out[4 * i], &v[i], 4);
    } else {
      const __nv_bfloat16 b = __float2bfloat16(v[i]);
      std::memcpy(&out[2 * i], &b, 2);
    }
  }
  return out;
}

// The lanes between hosts (spark.fusedcomm.transport.streams) the native tests use:
// FC_TEST_STREAMS if set, else the runtime's default.
inline int test_streams() {
  const char* s = std::getenv("FC_TEST_STREAMS");
  return s ? std::atoi(s) : RuntimeConfig{}.transport_streams;
}

// The busy-poll window between hosts (spark.fusedcomm.transport.busyPoll) the native tests use,
// in microseconds: FC_TEST_BUSY_POLL_US if set, else the runtime's default.
inline int64_t test_busy_poll_us() {
  const char* s = std::getenv("FC_TEST_BUSY_POLL_US");
  return s ? std::atoll(s) : RuntimeConfig{}.busy_poll_us;
}

// The transport the native multi-rank tests use (spark.fusedcomm.transport and
// spark.fusedcomm.libfabric.provider): FUSEDCOMM_TRANSPORT=socket|libfabric|auto (default
// socket) and FUSEDCOMM_LIBFABRIC_PROVIDER=auto|efa|verbs|tcp|shm (default tcp), so that the
// virtual-host tests run between hosts over libfabric too. An unknown name ends the test.
inline void apply_test_transport(RuntimeConfig* c) {
  auto env = [](const char* name, const char* fallback) {
    const char* v = std::getenv(name);
    return std::string(v && *v ? v : fallback);
  };
  const std::string t = env("FUSEDCOMM_TRANSPORT", "socket");
  const std::string p = env("FUSEDCOMM_LIBFABRIC_PROVIDER", "tcp");
  if (t == "socket") {
    c->transport = TransportChoice::kSocket;
  } else if (t == "libfabric") {
    c->transport = TransportChoice::kLibfabric;
  } else if (t == "auto") {
    c->transport = TransportChoice::kAuto;
  } else {
    std::fprintf(stderr, "FUSEDCOMM_TRANSPORT=%s: expected socket, libfabric or auto\n", t.c_str());
    std::exit(2);
  }
  bool known = false;
  for (rdma::LibfabricProvider lp :
       {rdma::LibfabricProvider::kAuto, rdma::LibfabricProvider::kEfa, rdma::LibfabricProvider::kVerbs,
        rdma::LibfabricProvider::kTcp, rdma::LibfabricProvider::kShm}) {
    if (p == rdma::libfabric_provider_name(lp)) {
      c->libfabric_provider = lp;
      known = true;
    }
  }
  if (!known) {
    std::fprintf(stderr, "FUSEDCOMM_LIBFABRIC_PROVIDER=%s: expected auto, efa, verbs, tcp or shm\n",
                 p.c_str());
    std::exit(2);
  }
}

// A cuda-backend Runtime's config for the multi-rank tests: GPU `gpu`, the transport of
// apply_test_transport (socket unless the environment says otherwise) on the loopback, the run's job token (from its seed), every op bounded by timeout_ms, a data
// area of symmetric_bytes; `shared`: ranks may share the GPU (correctness only).
inline RuntimeConfig loopback_cuda_config(int gpu, uint64_t seed, int64_t timeout_ms, int64_t symmetric_bytes,
                                          bool shared) {
  RuntimeConfig c;
  c.backend = Backend::kCuda;
  c.gpu_ordinal = gpu;
  c.bind_host = "127.0.0.1";
  c.job_token = seed | 1;
  c.timeout_ms = timeout_ms;
  c.symmetric_bytes = symmetric_bytes;
  c.allow_shared_gpu = shared;
  c.transport_streams = test_streams();
  c.busy_poll_us = test_busy_poll_us();
  // spark.fusedcomm.host.chunkBytes, the chunk per lane between hosts: FC_TEST_CHUNK_BYTES.
  if (const char* s = std::getenv("FC_TEST_CHUNK_BYTES")) c.chunk_bytes = std::atoll(s);
  apply_test_transport(&c);
  return c;
}

// The run's seed: FC_TEST_SEED if set (a replay), else fresh; printed with the GPU count.
inline uint64_t test_seed(const char* test, int gpus) {
  uint64_t seed = std::random_device{}();
  if (const char* s = std::getenv("FC_TEST_SEED")) seed = std::strtoull(s, nullptr, 10);
  std::printf("%s: %d GPUs, seed %llu (FC_TEST_SEED=%llu replays)\n", test, gpus,
              static_cast<unsigned long long>(seed), static_cast<unsigned long long>(seed));
  return seed;
}

// Replaces `sm` by a fresh, connected symmetric memory (every rank calls it at the same point;
// the barrier first makes sure no rank still uses the old one).
inline void reopen(ProcessGroup& g, std::unique_ptr<SymmetricMemory>& sm, const SymmetricConfig& cfg) {
  if (sm) {
    g.barrier();
    sm->close();
  }
  SymmetricConfig c = cfg;
  c.allow_shared_gpu = g_shared_gpu;
  sm = std::make_unique<SymmetricMemory>(g.rank, g.world, c);
  sm->connect(g.all_gather(sm->export_handle()));
}

// One rank of a multi-process test over a SymmetricMemory (gpu_collectives_test and
// gpu_fused_test derive their Rank from it): its process group, world W and rank r, the run's
// seed, the memory (replaced by open) and the non-blocking stream its launches use (the test
// creates it).
struct SymmetricRank {
  ProcessGroup& g;
  int W, r;
  uint64_t seed;
  std::unique_ptr<SymmetricMemory> sm;
  cudaStream_t stream{};

  SymmetricRank(ProcessGroup& group, uint64_t s) : g(group), W(group.world), r(group.rank), seed(s) {}

  void open(const SymmetricConfig& cfg) { reopen(g, sm, cfg); }
};

// The Error that sm.raise_if_failed() throws after a launch, if any (the tests' timeout, abort
// and launch-mismatch sections expect one).
inline std::optional<Error> raised(SymmetricMemory& sm) {
  try {
    sm.raise_if_failed();
  } catch (const Error& e) { return e; }
  return std::nullopt;
}

// After a launch on which odd and even ranks disagree (the tests' "launch mismatch" sections),
// `seconds` after it was enqueued and synchronised: checks that raise_if_failed threw
// Error(kCommunicator) "launch mismatch", that the record names this rank, a peer of the other
// parity and launch 1, and that it came within limit_s (well before the timeout). Returns the
// record for the caller's checks of the two signatures.
inline kernels::CommErrorRecord expect_launch_mismatch(SymmetricMemory& sm, int rank, int world,
                                                       const std::string& who, double seconds,
                                                       double limit_s) {
  const std::optional<Error> e = raised(sm);
  const std::string msg = e ? e->what() : "";
  const bool threw =
      e && e->kind() == ErrorKind::kCommunicator && msg.find("launch mismatch") != std::string::npos;
  const kernels::CommErrorRecord rec = sm.error();
  if (rank < 2) std::printf("  %s after %.3f s: %s\n", who.c_str(), seconds, msg.c_str());
  check(threw, who + ": Error(kCommunicator) 'launch mismatch' (got '" + msg + "')");
  check(rec.code == kernels::kCommLaunchMismatch && rec.rank == static_cast<uint32_t>(rank) &&
            rec.peer < static_cast<uint32_t>(world) && rec.peer % 2 != static_cast<uint32_t>(rank % 2) &&
            rec.epoch == 1,
        who + ": record names this rank, a peer of the other parity, launch 1 (code " +
            std::to_string(rec.code) + " peer " + std::to_string(rec.peer) + " epoch " +
            std::to_string(rec.epoch) + ")");
  check(seconds < limit_s, who + ": named after " + std::to_string(seconds) + " s");
  check(cudaGetLastError() == cudaSuccess, who + ": the CUDA context survives");
  return rec;
}

// Number of Hopper GPUs, all with peer access to each other; -1 with the reason otherwise.
inline int probe_peer_gpus(std::string& reason) {
  int fds[2];
  if (pipe(fds) != 0) return -1;
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    int n = 0;
    char msg[256] = {};
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
      std::snprintf(msg, sizeof msg, "no usable NVIDIA GPU (%s)", cudaGetErrorString(e));
      n = -1;
    } else {
      int major = 0;
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
      if (n > 0 && major != 9) {
        std::snprintf(msg, sizeof msg, "GPU 0 is not a Hopper (sm_90) device");
        n = -1;
      }
      for (int a = 0; a < n && n > 0; ++a) {
        for (int b = 0; b < n; ++b) {
          int can = 1;
          if (a != b) cudaDeviceCanAccessPeer(&can, a, b);
          if (!can) {
            std::snprintf(msg, sizeof msg, "GPU %d cannot access GPU %d (no P2P)", a, b);
            n = -1;
            break;
          }
        }
      }
    }
    write_full(fds[1], &n, 4);
    write_full(fds[1], msg, sizeof msg);
    _exit(0);
  }
  close(fds[1]);
  int n = -1;
  char msg[256] = {};
  if (!read_full(fds[0], &n, 4) || !read_full(fds[0], msg, sizeof msg)) {
    n = -1;
    std::snprintf(msg, sizeof msg, "the GPU probe process failed");
  }
  close(fds[0]);
  int status;
  waitpid(pid, &status, 0);
  reason = msg;
  return n;
}

// The peer-connected Hopper GPUs for `test` (gpu_collectives_test, gpu_fused_test), or 0 after
// printing why it skips (exit 77 then): fewer than 2, unless the shared-GPU mode (`shared`:
// shared_gpu_world()) runs every rank on the one there is.
inline int peer_gpus_or_skip(const char* test, int shared) {
  std::string reason;
  const int n = probe_peer_gpus(reason);
  if (n >= 2 || (n == 1 && shared > 0)) return n;
  std::printf(
      "SKIP: %s needs >= 2 Hopper GPUs with peer access "
      "(or FC_TEST_SHARED_GPU=<world> on one): %s\n",
      test, n < 0 ? reason.c_str() : "only 1 GPU visible");
  return 0;
}

// Device memory owned by a test (freed on scope exit). At least `min_bytes` are allocated, for
// kernels that take a valid pointer even for an empty buffer; 0 bytes and no minimum: none.
struct DevBuf {
  void* p = nullptr;
  size_t bytes = 0;
  DevBuf() = default;
  explicit DevBuf(size_t n, size_t min_bytes = 0) : bytes(n) {
    if (std::max(n, min_bytes) > 0) CUDA_OK(cudaMalloc(&p, std::max(n, min_bytes)));
  }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  DevBuf(DevBuf&& o) noexcept : p(o.p), bytes(o.bytes) { o.p = nullptr; }
  DevBuf& operator=(DevBuf&& o) noexcept {
    if (this != &o) {
      if (p != nullptr) cudaFree(p);
      p = o.p;
      bytes = o.bytes;
      o.p = nullptr;
    }
    return *this;
  }
  ~DevBuf() {
    if (p != nullptr) cudaFree(p);
  }
  template <typename T>
  T* as() const {
    return static_cast<T*>(p);
  }
};

// On `stream`, and complete on return. Not cudaMemcpy: from pageable memory it may return
// before its DMA has landed, and it orders only the legacy default stream, not the test's
// non-blocking stream: a kernel launched there next could read the buffer half written.
template <typename T>
DevBuf upload(const std::vector<T>& v, cudaStream_t stream, size_t min_bytes = 0) {
  DevBuf b(v.size() * sizeof(T), min_bytes);
  if (!v.empty()) {
    CUDA_OK(cudaMemcpyAsync(b.p, v.data(), b.bytes, cudaMemcpyHostToDevice, stream));
    CUDA_OK(cudaStreamSynchronize(stream));
  }
  return b;
}
template <typename T>
std::vector<T> download(const void* p, size_t n) {
  std::vector<T> v(n);
  if (n > 0) CUDA_OK(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
  return v;
}

}  // namespace fusedcomm::testing
