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

// Chunks in flight per counterpart (kernels/proxy.h, ProxyCollective::depth): the kernel stages
// and reads one while the proxies and the transport move the other. With 2 (and the kernel's
// unrolled copies) 64 MiB per end moved at 2.1-2.4 GB/s each way over the loopback on 1 x H100,
// against 1.3-1.4 with 1, and 3.6 (median) with a connection per direction (gpu_link_threads_test;
// kernels/bench/NOTES.md).
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

InterHostLink::InterHostLink(Runtime& runtime, int host, int hosts, uint64_t chunk_bytes)
    : runtime_(runtime), host_(host), hosts_(hosts), chunk_bytes_(chunk_bytes) {
  FC_REQUIRE(hosts >= 2 && hosts <= k::kProxyMaxHosts,
             "between hosts the cuda backend connects 2.." + std::to_string(k::kProxyMaxHosts) +
                 " hosts, not " + std::to_string(hosts));
  FC_REQUIRE(host >= 0 && host < hosts, "inter-host link: host index out of range");
  FC_REQUIRE(chunk_bytes >= 16 && chunk_bytes % 16 == 0,
             "inter-host staging chunk must be a positive multiple of 16 bytes (spark.fusedcomm.host.chunkBytes)");
  const uint64_t box_bytes = chunk_bytes * static_cast<uint64_t>(hosts) * kDepth;
  outbox_ = std::make_unique<MappedHostMemory>(box_bytes);
  inbox_ = std::make_unique<MappedHostMemory>(box_bytes);
  signals_ = std::make_unique<MappedHostMemory>(kSignalBytes);
  const size_t ring_bytes = rdma::ProxyRing::bytes_for(kRingCapacity);
  ring_memory_ = std::make_unique<MappedHostMemory>(ring_bytes + 128);  // the status word after the ring
  status_ = reinterpret_cast<volatile uint32_t*>(static_cast<uint8_t*>(ring_memory_->host) + ring_bytes);
  status_dev_ = reinterpret_cast<uint32_t*>(static_cast<uint8_t*>(ring_memory_->dev) + ring_bytes);
  try {
    rdma::Transport& t = runtime_.transport();
    regions_.push_back(t.register_memory(outbox_->host, box_bytes));
    regions_.push_back(t.register_memory(inbox_->host, box_bytes));
    regions_.push_back(t.register_memory(signals_->host, kSignalBytes));
    // Two device words: the ring's next slot, the ops' signal value base.
    check(cudaMalloc(reinterpret_cast<void**>(&next_slot_), 2 * sizeof *next_slot_), "cudaMalloc (ring counters)");
    check(cudaMemset(next_slot_, 0, 2 * sizeof *next_slot_), "cudaMemset (ring counters)");
  } catch (...) {
    close(false);
    throw;
  }
  ring_device_ = k::proxy_ring_device(ring_memory_->dev, next_slot_, kRingCapacity);
}

InterHostLink::~InterHostLink() { close(false); }

InterHostLink::Blob InterHostLink::blob() const {
  Blob b{};
  const std::string address = runtime_.transport().address();
  FC_REQUIRE(address.size() < sizeof b.address, "transport address too long: " + address);
  std::memcpy(b.address, address.data(), address.size());
  b.inbox_key = regions_.at(1).key;
  b.signal_key = regions_.at(2).key;
  return b;
}

void InterHostLink::connect(const std::vector<Blob>& blobs, const std::vector<std::string>& names,
                            uint64_t comm_id) {
  FC_REQUIRE(!closed_ && group_ == nullptr, "inter-host link: connect() on a closed or connected link");
  FC_REQUIRE(static_cast<int>(blobs.size()) == hosts_ && static_cast<int>(names.size()) == hosts_,
             "inter-host link: one blob and one name per host");
  peers_ = blobs;
  names_ = names;
  rdma::GroupSpec spec;
  spec.job_token = runtime_.config().job_token;
  spec.comm_id = comm_id;
  spec.rank = host_;
  spec.world = hosts_;
  for (const Blob& b : blobs) spec.addresses.emplace_back(b.address, strnlen(b.address, sizeof b.address));
  spec.connect_timeout = std::chrono::milliseconds(runtime_.config().connect_timeout_ms);
  // A connection per direction between counterparts: the ops send both ways at once
  // (one_way_pairs.h says why).
  group_ = rdma::connect_one_way_pairs(runtime_.transport(), spec);
  proxy_ = std::make_unique<rdma::Proxy>(rdma::ProxyRing(ring_memory_->host, kRingCapacity), *group_);
}

void InterHostLink::all_reduce(void* x, int64_t count, k::CommDtype dtype, cudaStream_t stream) {
  k::ProxyCollective a{};
  k::proxy_set_all_reduce(a, x, count);
  launch(a, dtype, stream);
}

// An op's per-host blocks (kernels/proxy.h, ProxyCollective::blocks and counts).
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

void InterHostLink::reduce_scatter(const std::vector<void*>& contributions, const std::vector<int64_t>& counts,
                                   void* out, k::CommDtype dtype, cudaStream_t stream) {
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

// The fields every op shares: this link's staging, keys, signal values and limits.
void InterHostLink::launch(k::ProxyCollective& a, k::CommDtype dtype, cudaStream_t stream) {
  FC_REQUIRE(proxy_ != nullptr && !closed_, "inter-host link: not connected");
  a.ring = ring_device_;
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
  a.value_counter = next_slot_ + 1;
  a.chunk_bytes = chunk_bytes_;
  a.depth = kDepth;
  a.timeout_ns = static_cast<uint64_t>(runtime_.config().timeout_ms) * 1000000ull;
  a.status = status_dev_;
  check(k::launch_proxy_collective(a, stream),
        std::string("launching the ") + k::proxy_op_name(a.op) + " between hosts");
}

bool InterHostLink::failed() const { return k::proxy_status_code(*status_) != k::kProxyOk; }

void InterHostLink::raise_if_failed() {
  const uint32_t status = *status_;
  if (k::proxy_status_code(status) == k::kProxyOk) return;
  const int peer = k::proxy_status_peer(status);
  const std::string where = std::string(k::proxy_op_name(k::proxy_status_op(status))) + " [between hosts] on " + names_.at(host_);
  const std::string proxy_error = proxy_ != nullptr ? proxy_->error() : std::string();
  if (!proxy_error.empty()) {
    const int failed = proxy_->failed_peer();
    fail(ErrorKind::kTransport, where + ": the connection to " +
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
    // The kernels' bounded waits poll this word (kernels/detail/proxy_device.cuh).
    std::atomic_ref<uint64_t>(static_cast<rdma::RingHeader*>(ring_memory_->host)->abort)
        .store(1, std::memory_order_release);
  }
  if (group_ != nullptr) group_->abort();
}

void InterHostLink::close(bool drain) noexcept {
  if (closed_) return;
  closed_ = true;
  const auto timeout = std::chrono::milliseconds(runtime_.config().connect_timeout_ms);
  try {
    if (proxy_ != nullptr) proxy_->stop(drain && !aborted_, timeout);
    if (group_ != nullptr) {
      if (drain && !aborted_) {
        group_->close(timeout);
      } else {
        group_->abort();
      }
    }
  } catch (...) {
    // Closing never throws; a failed drain leaves nothing this rank still needs.
  }
  proxy_.reset();
  group_.reset();
  for (const rdma::Region& r : regions_) {
    try {
      runtime_.transport().deregister_memory(r);
    } catch (...) {
    }
  }
  regions_.clear();
  if (next_slot_ != nullptr) cudaFree(next_slot_);
  next_slot_ = nullptr;
  cudaGetLastError();
}

}  // namespace fusedcomm
