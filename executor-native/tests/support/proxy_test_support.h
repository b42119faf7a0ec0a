// What the native tests of the GPU proxy path share. ProxyEndpoint (gpu_proxy_test, which
// drives the proxy kernels directly; the other tests go through the runtime's InterHostLink):
// one rank's end of it. A socket transport on the loopback; three regions of pinned host memory
// mapped for the GPU and registered with the transport (outbox: payloads this rank sends;
// inbox: payloads peers write; signal: 64-bit words peers raise); a proxy ring in mapped host
// memory with the device counter its GPU producers take slots from; and, after connect(), the
// peer group and the proxy thread draining the ring into it.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "fusedcomm/rdma/proxy.h"
#include "fusedcomm/rdma/transport.h"
#include "fusedcomm/runtime/mapped_host.h"
#include "kernels/collectives/collectives.h"
#include "kernels/proxy/proxy.h"
#include "support/gpu_test_support.h"
#include "support/process_group.h"

namespace fusedcomm::testing {

// What a rank tells the others through the bootstrap.
struct ProxyBlob {
  char address[64];
  uint64_t inbox_key, signal_key;
};

class ProxyEndpoint {
 public:
  ProxyEndpoint(uint64_t outbox_bytes, uint64_t inbox_bytes, uint64_t signal_bytes, uint32_t capacity)
      : outbox(outbox_bytes),
        inbox(inbox_bytes),
        signal(signal_bytes),
        ring_mem_(rdma::ProxyRing::bytes_for(capacity)),
        ring_(ring_mem_.host, capacity) {
    rdma::SocketOptions o;
    o.bind_host = "127.0.0.1";
    transport_ = rdma::make_socket_transport(o);
    regions_.push_back(transport_->register_memory(outbox.host, outbox_bytes));
    out_key = regions_[0].key;
    regions_.push_back(transport_->register_memory(inbox.host, inbox_bytes));
    regions_.push_back(transport_->register_memory(signal.host, signal_bytes));
    CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&next_), sizeof *next_));
    CUDA_OK(cudaMemset(next_, 0, sizeof *next_));
    dev_ = kernels::proxy_ring_device(ring_mem_.dev, next_, capacity);
  }
  ~ProxyEndpoint() {
    close(false);
    for (const auto& r : regions_) transport_->deregister_memory(r);
    cudaFree(next_);
  }
  ProxyEndpoint(const ProxyEndpoint&) = delete;
  ProxyEndpoint& operator=(const ProxyEndpoint&) = delete;

  ProxyBlob blob() const {
    ProxyBlob b{};
    std::snprintf(b.address, sizeof b.address, "%s", transport_->address().c_str());
    b.inbox_key = regions_[1].key;
    b.signal_key = regions_[2].key;
    return b;
  }
  // Every rank's blob (the bootstrap's allGather; every rank calls it at the same point).
  static std::vector<ProxyBlob> gather(ProcessGroup& g, const ProxyBlob& mine) {
    std::vector<uint8_t> raw(sizeof mine);
    std::memcpy(raw.data(), &mine, sizeof mine);
    const auto all = g.all_gather(raw);
    std::vector<ProxyBlob> blobs(all.size());
    for (size_t r = 0; r < all.size(); ++r) std::memcpy(&blobs[r], all[r].data(), sizeof(ProxyBlob));
    return blobs;
  }
  // Connects the group of `members` (their blobs, by group rank; this rank is `rank`) and
  // starts the proxy.
  void connect(const std::vector<ProxyBlob>& members, int rank, uint64_t token, uint64_t comm_id) {
    rdma::GroupSpec spec;
    spec.comm_id = comm_id;
    spec.key = rdma::auth::derive_comm_key(token, comm_id, {});
    spec.rank = rank;
    spec.world = static_cast<int>(members.size());
    for (const auto& b : members) spec.addresses.push_back(b.address);
    group_ = transport_->connect(spec);
    proxy_ = std::make_unique<rdma::Proxy>(ring_, *group_);
  }
  // drain: the proxy sends what is posted and the group closes politely; else both stop now.
  void close(bool drain) {
    using namespace std::chrono_literals;
    if (proxy_) proxy_->stop(drain, 5000ms);
    if (group_) {
      if (drain) {
        group_->close(5000ms);
      } else {
        group_->abort();
      }
    }
    proxy_.reset();
    group_.reset();
  }

  const kernels::ProxyRingDevice& device() const { return dev_; }
  // An allReduce of x (launch_proxy_collective) with the arguments that come from this endpoint
  // and its group (`members` by group rank, this one `rank`); the caller sets the signal words,
  // chunk, limits and status.
  kernels::ProxyCollective allreduce_args(const std::vector<ProxyBlob>& members, int rank, void* x,
                                          int64_t count) const {
    kernels::ProxyCollective a{};
    kernels::proxy_set_all_reduce(a, x, count);
    a.rings[0] = dev_;
    a.lanes = 1;
    a.rank = rank;
    a.hosts = static_cast<int>(members.size());
    a.outbox = static_cast<uint8_t*>(outbox.dev);
    a.inbox = static_cast<const uint8_t*>(inbox.dev);
    a.signals = static_cast<const uint64_t*>(signal.dev);
    a.outbox_key = out_key;
    a.depth = 1;  // the boxes hold one stage of members.size() chunk slots
    for (size_t q = 0; q < members.size(); ++q) {
      a.inbox_keys[q] = members[q].inbox_key;
      a.signal_keys[q] = members[q].signal_key;
    }
    return a;
  }
  rdma::ProxyRing& ring() { return ring_; }
  std::string proxy_error() const { return proxy_ ? proxy_->error() : std::string(); }

  MappedHostMemory outbox, inbox, signal;
  uint64_t out_key = 0;

 private:
  MappedHostMemory ring_mem_;
  rdma::ProxyRing ring_;
  std::unique_ptr<rdma::Transport> transport_;
  std::vector<rdma::Region> regions_;  // outbox, inbox, signal
  unsigned long long* next_ = nullptr;
  kernels::ProxyRingDevice dev_{};
  std::unique_ptr<rdma::PeerGroup> group_;
  std::unique_ptr<rdma::Proxy> proxy_;
};

// A rank's last line (its check counts) and its exit status.
inline int rank_result(int rank) {
  std::printf("  rank %d: %d checks passed, %d failed\n", rank, g_passed, g_failed);
  return g_failed == 0 ? 0 : 1;
}

// The Hopper GPUs visible, or 0 after printing why `test` skips (exit 77 then).
inline int gpus_or_skip(const char* test) {
  std::string reason;
  const int n = probe_peer_gpus(reason);
  if (n >= 1) return n;
  std::printf("SKIP: %s needs a Hopper GPU: %s\n", test, n < 0 ? reason.c_str() : "none visible");
  return 0;
}

// The virtual-host tests' main (gpu_hier_test, gpu_runtime_hosts_test): H hosts
// (FC_TEST_HOSTS, default 2) of L ranks (FC_TEST_LOCAL, default GPUs / H, at least 1), one
// forked process per rank, rank g on GPU g % GPUs; with FC_TEST_SHARED_GPU=<n> ranks may share
// GPUs (timings meaningless). Returns the exit code: 0 pass, 1 fail, 77 skip (reason printed).
using HostsRankMain =
    std::function<int(ProcessGroup& g, int hosts, int local, int gpus, bool shared, uint64_t seed)>;
inline int run_virtual_hosts(const char* test, const HostsRankMain& rank_main) {
  const int n = gpus_or_skip(test);
  if (n == 0) return 77;
  const int shared = shared_gpu_world();
  const char* hs = std::getenv("FC_TEST_HOSTS");
  const char* ls = std::getenv("FC_TEST_LOCAL");
  const int H = hs ? std::atoi(hs) : 2;
  const int L = ls ? std::atoi(ls) : std::max(1, n / H);
  if (H < 2 || H > kernels::kProxyMaxHosts || L < 1 || L > kernels::kCommMaxRanks) {
    std::printf("FAIL: FC_TEST_HOSTS=%d FC_TEST_LOCAL=%d out of range\n", H, L);
    return 1;
  }
  if (H * L > n && shared == 0) {
    std::printf(
        "SKIP: %d hosts x %d ranks need %d GPUs (%d visible; FC_TEST_SHARED_GPU=<n> lets "
        "ranks share GPUs)\n",
        H, L, H * L, n);
    return 77;
  }
  if (shared) g_shared_gpu = true;
  const uint64_t seed = test_seed(test, n);
  std::printf("== %d virtual hosts x %d ranks on %d GPU(s)%s\n", H, L, std::min(n, H * L),
              H * L > n ? " (shared: timings meaningless)" : "");
  const int failed = run_processes(
      H * L, [&](ProcessGroup& g) { return rank_main(g, H, L, n, H * L > n, seed); }, 280);
  std::printf("== %s: %s\n", test, failed == 0 ? "PASS" : "FAIL");
  return failed == 0 ? 0 : 1;
}

}  // namespace fusedcomm::testing
