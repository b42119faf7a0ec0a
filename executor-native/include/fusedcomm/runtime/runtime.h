// The per-executor runtime: one per executor process, created by the executor plugin at init
// and closed at shutdown. It owns the transport (listener + registered regions) and, with the
// cuda backend, the executor's GPU. Communicators borrow it.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "fusedcomm/rdma/transport.h"
#include "fusedcomm/runtime/gpu.h"
#include "fusedcomm/types.h"

namespace fusedcomm {

class SymmetricRegion;

// spark.fusedcomm.transport: which backend of rdma/ carries the bytes between executors.
// kAuto: libfabric where it finds an RDMA provider (efa, or verbs on InfiniBand / RoCE), else
// socket; the runtime's describe() says what it chose and why.
enum class TransportChoice : int32_t { kAuto = 0, kSocket = 1, kLibfabric = 2 };
const char* transport_choice_name(TransportChoice t);

// Everything the native side is configured with; built once from the typed Java config.
// Native code never reads environment variables.
struct RuntimeConfig {
  Backend backend = Backend::kAuto;
  int64_t timeout_ms = 60000;           // every wait inside an op
  int64_t connect_timeout_ms = 30000;   // building a communicator's connections
  int64_t chunk_bytes = 1 << 20;        // host backend: staging chunk per peer
  int64_t symmetric_bytes = 128 << 20;  // cuda backend: data area of the symmetric memory
  std::string bind_host;                // transport listener; empty: this host
  // TCP streams per direction between counterparts on different hosts (InterHostLink's lanes),
  // and the transport's receiver threads: 1..4.
  int transport_streams = 2;
  // How long the threads between hosts (proxies, transport receivers) poll without sleeping
  // after an op between hosts is enqueued and after their last traffic (rdma/busy_poll.h):
  // 0..1,000,000 us; 0: they sleep whenever idle.
  int64_t busy_poll_us = 1000;
  TransportChoice transport = TransportChoice::kAuto;
  // The libfabric backend's provider (spark.fusedcomm.libfabric.provider; kAuto: efa, else
  // verbs, else tcp) and its NICs per executor (spark.fusedcomm.libfabric.rails, 1..8).
  rdma::LibfabricProvider libfabric_provider = rdma::LibfabricProvider::kAuto;
  int libfabric_rails = 1;
  // A libfabric peer silent this long fails (spark.fusedcomm.libfabric.peerTimeout,
  // 100..600,000 ms); heartbeats go at a fifth of it, at most every 100 ms.
  int64_t libfabric_peer_timeout_ms = 5000;
  int gpu_ordinal = -1;    // the executor's GPU, -1: none assigned
  uint64_t job_token = 0;  // the application's token (driver plugin)
  // Native tests only (never set from Java): ranks of one host may share a GPU
  // (SymmetricConfig::allow_shared_gpu; correctness on a 1-GPU machine, timings meaningless).
  bool allow_shared_gpu = false;
};

class Runtime {
 public:
  // Resolves the backend (auto: cuda when a GPU is assigned and usable, else host; cuda: the
  // GPU must open, else Error(kUnavailable) with the reason) and starts the transport.
  explicit Runtime(const RuntimeConfig& config);
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  const RuntimeConfig& config() const { return config_; }
  Backend backend() const { return backend_; }  // resolved: kCuda or kHost
  const GpuInfo& gpu() const { return gpu_; }   // ordinal -1 with the host backend
  rdma::Transport& transport() { return *transport_; }
  std::string describe() const;

  // The cuda backend's symmetric regions live as long as the executor: a communicator borrows
  // one (a pooled region if there is one, else a new allocation sized for any world up to
  // kCommMaxRanks) and gives it back after a clean close (symmetric_memory.h). Thread-safe.
  std::unique_ptr<SymmetricRegion> acquire_region(int world);
  void release_region(std::unique_ptr<SymmetricRegion> region);
  size_t pooled_regions() const;

 private:
  RuntimeConfig config_;
  Backend backend_;
  GpuInfo gpu_;
  std::unique_ptr<rdma::Transport> transport_;
  std::string transport_choice_;  // what spark.fusedcomm.transport resolved to, and why
  mutable std::mutex pool_mutex_;
  std::vector<std::unique_ptr<SymmetricRegion>> pool_;
};

// One line per backend and transport: "name: available|unavailable: reason".
std::string availability_report();

// What spark.fusedcomm.transport=auto resolves to on this host: libfabric where an RDMA
// provider (efa or verbs) answers, else socket; *why says which (one phrase for describe()).
rdma::TransportKind resolve_transport(TransportChoice choice, rdma::LibfabricProvider provider, std::string* why);

}  // namespace fusedcomm
