#include "fusedcomm/runtime/inter_host.h"

#include <atomic>
#include <chrono>
#include <cstring>

#include "fusedcomm/rdma/errors.h"
#include "fusedcomm/rdma/one_way_pairs.h"
#include "fusedcomm/runtime/errors.h"

namespace fusedcomm {
namespace {

namespace k = fusedcomm::kernels;

// Chunks in flight per counterpart (kernels/proxy/proxy.h, ProxyCollective::depth): the kernel stages
// and reads one while the proxies and the transport move the other. With 2 (and the kernel's
// unrolled copies) 64 MiB per end moved at 2.1-2.4 GB/s each way over the loopback on 1 x H100,
// against 1.3-1.4 with 1, and 3.6 (median) with a connection per direction
// (gpu_link_threads_test).
constexpr uint32_t kDepth = 2;
// A pipeline iteration posts at most 2 (hosts - 1) = 14 commands, and up to kDepth iterations'
// commands may wait in the ring.
constexpr uint32_t kRingCapacity = 64;
constexpr uint64_t kSignalBytes = 4096;

void check(cudaError_t e, const std::string& what) {
  if (e != cudaSuccess) {
    cudaGetLastError();
    fail(ErrorKind::kFatalGpu, what + " failed (" + cudaGetErrorName(e) + ": " + cudaGetErrorString(e) + ")");
  }
}

}  // namespace

InterHostLink::InterHostLink(Runtime& runtime, int host, int hosts, uint64_t chunk_bytes, int lanes)
    : runtime_(runtime), host_(host), hosts_(hosts), chunk_bytes_(chunk_bytes), lanes_(lanes) {
  FC_REQUIRE(hosts >= 2 && hosts <= k::kProxyMaxHosts, "between hosts the cuda backend connects 2.." +
                                                           std::to_string(k::kProxyMaxHosts) +
                                                           " hosts, not " + std::to_string(hosts));
  FC_REQUIRE(host >= 0 && host < hosts, "inter-host link: host index out of range");
  FC_REQUIRE(
      chunk_bytes >= 16 && chunk_bytes % 16 == 0,
      "inter-host staging chunk must be a positive multiple of 16 bytes (spark.fusedcomm.host.chunkBytes)");
  FC_REQUIRE(lanes >= 1 && lanes <= static_cast<int>(k::kProxyMaxLanes),
             "inter-host link: 1.." + std::to_string(k::kProxyMaxLanes) +
                 " streams (spark.fusedcomm.transport.streams), not " + std::to_string(lanes));
  // Never reallocated after this: abort() may read them from another thread during connect().
  groups_.reserve(static_cast<size_t>(lanes));
  proxies_.reserve(static_cast<size_t>(lanes));
  const uint64_t box_bytes = chunk_bytes * static_cast<uint64_t>(hosts) * kDepth;
  outbox_ = std::make_unique<MappedHostMemory>(box_bytes);
  inbox_ = std::make_unique<MappedHostMemory>(box_bytes);
  signals_ = std::make_unique<MappedHostMemory>(kSignalBytes);
  // Lane l's ring at l * ring_bytes (a multiple of 128), the status word after the last.
  const size_t ring_bytes = rdma::ProxyRing::bytes_for(kRingCapacity);
  const size_t rings_bytes = ring_bytes * static_cast<size_t>(lanes);
  ring_memory_ = std::make_unique<MappedHostMemory>(rings_bytes + 128);
  status_ = reinterpret_cast<volatile uint32_t*>(static_cast<uint8_t*>(ring_memory_->host) + rings_bytes);
  status_dev_ = reinterpret_cast<uint32_t*>(static_cast<uint8_t*>(ring_memory_->dev) + rings_bytes);
  try {
    rdma::Transport& t = runtime_.transport();
    regions_.push_back(t.register_memory(outbox_->host, box_bytes));
    regions_.push_back(t.register_memory(inbox_->host, box_bytes));
    regions_.push_back(t.register_memory(signals_->host, kSignalBytes));
    // Device words: each lane's ring's next slot, then each lane's signal value base.
    const size_t words = 2 * static_cast<size_t>(lanes);
    check(cudaMalloc(reinterpret_cast<void**>(&next_slot_), words * sizeof *next_slot_),
          "cudaMalloc (ring counters)");
    check(cudaMemset(next_slot_, 0, words * sizeof *next_slot_), "cudaMemset (ring counters)");
  } catch (...) {
    close(false);
    throw;
  }
  for (int l = 0; l < lanes; ++l) {
    ring_devices_[l] = k::proxy_ring_device(ring(l, /*device=*/true), next_slot_ + l, kRingCapacity);
  }
}

uint64_t InterHostLink::chunk_bytes_for(const RuntimeConfig& config) {
  return static_cast<uint64_t>(config.chunk_bytes) * static_cast<uint64_t>(config.transport_streams);
}

void* InterHostLink::ring(int lane, bool device) const {
  void* base = device ? ring_memory_->dev : ring_memory_->host;
  return static_cast<uint8_t*>(base) + rdma::ProxyRing::bytes_for(kRingCapacity) * static_cast<size_t>(lane);
}

InterHostLink::~InterHostLink() { close(false); }

InterHostLink::Blob InterHostLink::blob() const {
  Blob b{};
  const std::string address = runtime_.transport().address();
  FC_REQUIRE(address.size() < sizeof b.address, "transport address too long: " + address);
  std::memcpy(b.address, address.data(), address.size());
  b.inbox_key = regions_.at(1).key;
  b.signal_key = regions_.at(2).key;
  b.chunk_bytes = chunk_bytes_;
  b.lanes = static_cast<uint32_t>(lanes_);
  return b;
}

void InterHostLink::connect(const std::vector<Blob>& blobs, const std::vector<std::string>& names,
                            uint64_t comm_id, const rdma::auth::Key& key, const std::atomic<bool>* cancel) {
  FC_REQUIRE(!closed_ && groups_.empty(), "inter-host link: connect() on a closed or connected link");
  FC_REQUIRE(static_cast<int>(blobs.size()) == hosts_ && static_cast<int>(names.size()) == hosts_,
             "inter-host link: one blob and one name per host");
  for (int h = 0; h < hosts_; ++h) {
    // Every rank sees the same blobs, so a mismatch fails every rank here, before any connect.
    FC_REQUIRE(blobs[h].lanes == static_cast<uint32_t>(lanes_),
               names[h] + " uses " + std::to_string(blobs[h].lanes) + " streams between hosts and " +
                   names[host_] + " uses " + std::to_string(lanes_) +
                   ": spark.fusedcomm.transport.streams must be the same on every executor");
    FC_REQUIRE(blobs[h].chunk_bytes == chunk_bytes_,
               names[h] + " moves chunks of " + std::to_string(blobs[h].chunk_bytes) +
                   " bytes between hosts and " + names[host_] + " of " + std::to_string(chunk_bytes_) +
                   ": spark.fusedcomm.host.chunkBytes must be the same on every executor");
  }
  peers_ = blobs;
  names_ = names;
  rdma::GroupSpec spec;
  spec.key = key;
  spec.comm_id = comm_id;
  spec.rank = host_;
  spec.world = hosts_;
  for (const Blob& b : blobs) spec.addresses.emplace_back(b.address, strnlen(b.address, sizeof b.address));
  spec.connect_timeout = std::chrono::milliseconds(runtime_.config().connect_timeout_ms);
  spec.cancel = cancel;
  // Per lane, a connection per direction between counterparts: the ops send both ways at once
  // (one_way_pairs.h says why). Every counterpart connects the lanes in the same order.
  uint64_t* lane0_abort = &static_cast<rdma::RingHeader*>(ring(0, false))->abort;
  for (int l = 0; l < lanes_; ++l) {
    spec.lane = static_cast<uint32_t>(l);
    spec.comm_id =
        l == 0 ? comm_id
               : (comm_id ^ (0x6c616e6500000000ull | static_cast<uint64_t>(l))) * 0xBF58476D1CE4E5B9ull;
    try {
      groups_.push_back(rdma::connect_one_way_pairs(runtime_.transport(), spec));
    } catch (const rdma::TransportError&) {
      if (cancel != nullptr && cancel->load()) {
        fail(ErrorKind::kCommunicator, names_[host_] + ": aborted while connecting to the other hosts");
      }
      throw;
    }
    // A failing lane also sets lane 0's abort word, which every wait of the kernel polls. Each
    // signal word has one source lane and only grows (kernels/proxy/proxy.h).
    proxies_.push_back(std::make_unique<rdma::Proxy>(
        rdma::ProxyRing(ring(l, false), kRingCapacity), *groups_.back(), l == 0 ? nullptr : lane0_abort,
        std::chrono::microseconds(runtime_.config().busy_poll_us), /*signals_sole_writer=*/true));
  }
}

void InterHostLink::all_reduce(void* x, int64_t count, k::CommDtype dtype, cudaStream_t stream) {
  k::ProxyCollective a{};
  k::proxy_set_all_reduce(a, x, count);
  launch(a, dtype, stream);
}

// An op's per-host blocks (kernels/proxy/proxy.h, ProxyCollective::blocks and counts).
k::ProxyCollective InterHostLink::per_host(uint32_t op, const std::vector<void*>& blocks,
                                           const std::vector<int64_t>& counts) const {
  FC_REQUIRE(static_cast<int>(blocks.size()) == hosts_ && static_cast<int>(counts.size()) == hosts_,
             std::string("inter-host ") + k::proxy_op_name(op) + ": one block per host");
  k::ProxyCollective a{};
  a.op = op;
  for (int h = 0; h < hosts_; ++h) {
    a.blocks[h] = blocks[h];
    a.counts[h] = counts[h];
  }
  return a;
}

void InterHostLink::all_gather(const std::vector<void*>& blocks, const std::vector<int64_t>& counts,
                               k::CommDtype dtype, cudaStream_t stream) {
  k::ProxyCollective a = per_host(k::kProxyAllGather, blocks, counts);
  launch(a, dtype, stream);
}

void InterHostLink::reduce_scatter(const std::vector<void*>& contributions,
                                   const std::vector<int64_t>& counts, void* out, k::CommDtype dtype,
                                   cudaStream_t stream) {
  k::ProxyCollective a = per_host(k::kProxyReduceScatter, contributions, counts);
  a.out = out;
  launch(a, dtype, stream);
}

void InterHostLink::all_to_all(const std::vector<void*>& sends, const std::vector<int64_t>& send_counts,
                               const std::vector<void*>& recvs, const std::vector<int64_t>& recv_counts,
                               k::CommDtype dtype, cudaStream_t stream) {
  k::ProxyCollective a = per_host(k::kProxyAllToAll, sends, send_counts);
  const k::ProxyCollective r = per_host(k::kProxyAllToAll, recvs, recv_counts);
  for (int h = 0; h < hosts_; ++h) {
    a.recv[h] = r.blocks[h];
    a.recv_counts[h] = r.counts[h];
  }
  launch(a, dtype, stream);
}

void InterHostLink::launch(k::ProxyCollective& a, k::CommDtype dtype, cudaStream_t stream) {
  prepare(a, dtype);
  check(k::launch_proxy_collective(a, stream),
        std::string("launching the ") + k::proxy_op_name(a.op) + " between hosts");
}

// The fields every op shares: this link's staging, keys, signal values and limits.
void InterHostLink::prepare(k::ProxyCollective& a, k::CommDtype dtype) {
  FC_REQUIRE(static_cast<int>(proxies_.size()) == lanes_ && !closed_, "inter-host link: not connected");
  for (int l = 0; l < lanes_; ++l) a.rings[l] = ring_devices_[l];
  a.lanes = static_cast<uint32_t>(lanes_);
  a.dtype = dtype == k::CommDtype::kF32 ? k::kProxyF32 : k::kProxyBF16;
  a.rank = host_;
  a.hosts = hosts_;
  a.outbox = static_cast<uint8_t*>(outbox_->dev);
  a.inbox = static_cast<const uint8_t*>(inbox_->dev);
  a.signals = static_cast<const uint64_t*>(signals_->dev);
  a.outbox_key = regions_[0].key;
  for (int h = 0; h < hosts_; ++h) {
    a.inbox_keys[h] = peers_[h].inbox_key;
    a.signal_keys[h] = peers_[h].signal_key;
  }
  a.base_word = 0;
  a.value_counter = next_slot_ + lanes_;
  a.chunk_bytes = chunk_bytes_;
  a.depth = kDepth;
  a.timeout_ns = static_cast<uint64_t>(runtime_.config().timeout_ms) * 1000000ull;
  a.status = status_dev_;
  // The threads this op passes through poll without sleeping from now until their busy-poll
  // window after its last traffic (spark.fusedcomm.transport.busyPoll). Hinted before
  // the launch so that their wake-ups overlap it. A graph replay gets no hint: its threads
  // wake from their sleep ladder on the first command or message (slower, still correct).
  for (auto& proxy : proxies_) proxy->expect_commands();
  runtime_.transport().expect_traffic();
}

bool InterHostLink::failed() const { return k::proxy_status_code(*status_) != k::kProxyOk; }

void InterHostLink::raise_if_failed() {
  const uint32_t status = *status_;
  if (k::proxy_status_code(status) == k::kProxyOk) return;
  const int peer = k::proxy_status_peer(status);
  const std::string where =
      std::string(k::proxy_op_name(k::proxy_status_op(status))) + " [between hosts] on " + names_.at(host_);
  std::string proxy_error;
  int failed = -1;
  for (const auto& proxy : proxies_) {
    proxy_error = proxy->error();
    failed = proxy->failed_peer();
    if (!proxy_error.empty()) break;
  }
  if (!proxy_error.empty()) {
    fail(ErrorKind::kTransport,
         where + ": the connection to " +
             (failed >= 0 && failed < hosts_ ? names_[failed] : std::string("a counterpart")) +
             " failed: " + proxy_error);
  }
  if (k::proxy_status_code(status) == k::kProxyAborted || aborted_) {
    fail(ErrorKind::kCommunicator, where + ": aborted");
  }
  fail(ErrorKind::kTimeout,
       where + ": timed out after " + std::to_string(runtime_.config().timeout_ms) + " ms waiting for " +
           (peer >= 0 && peer < hosts_ ? names_[peer] : std::string("the proxy ring (full)")) +
           " (spark.fusedcomm.timeout); a rank that never ran the op, or a dead executor; the "
           "communicator must be closed and rebuilt");
}

void InterHostLink::abort() noexcept {
  aborted_ = true;
  if (ring_memory_ != nullptr) {
    // The kernels' bounded waits poll lane 0's word, producers waiting for space their lane's
    // (kernels/detail/proxy_device.cuh).
    for (int l = 0; l < lanes_; ++l) {
      std::atomic_ref<uint64_t>(static_cast<rdma::RingHeader*>(ring(l, false))->abort)
          .store(1, std::memory_order_release);
    }
  }
  for (auto& group : groups_) group->abort();
}

void InterHostLink::close(bool drain) noexcept {
  if (closed_) return;
  closed_ = true;
  const auto timeout = std::chrono::milliseconds(runtime_.config().connect_timeout_ms);
  try {
    for (auto& proxy : proxies_) proxy->stop(drain && !aborted_, timeout);
    for (auto& group : groups_) {
      if (drain && !aborted_) {
        group->close(timeout);
      } else {
        group->abort();
      }
    }
  } catch (...) {
    // Closing never throws; a failed drain leaves nothing this rank still needs.
  }
  proxies_.clear();
  groups_.clear();
  for (const rdma::Region& r : regions_) {
    try {
      runtime_.transport().deregister_memory(r);
    } catch (...) {}
  }
  regions_.clear();
  if (next_slot_ != nullptr) cudaFree(next_slot_);
  next_slot_ = nullptr;
  cudaGetLastError();
}

}  // namespace fusedcomm
