// The registry of local memory regions: keys, bounds checks, and writes a rank makes to itself.
#include "core.h"

#include <cstring>

namespace fusedcomm::rdma::socket_backend {

Region Core::register_memory(void* base, uint64_t bytes) {
  if (!base && bytes) throw std::invalid_argument("register_memory: null base");
  std::unique_lock<std::shared_mutex> l(reg_mu_);
  Region r{base, bytes, key_salt_ | next_key_++};
  regions_.emplace(r.key, r);
  registered_bytes_ += bytes;
  return r;
}

void Core::deregister_memory(const Region& r) {
  std::unique_lock<std::shared_mutex> l(reg_mu_);
  auto it = regions_.find(r.key);
  if (it == regions_.end()) return;
  registered_bytes_ -= it->second.bytes;
  regions_.erase(it);
}

TransportStats Core::stats() const {
  TransportStats s;
  {
    std::shared_lock<std::shared_mutex> l(reg_mu_);
    s.registered_regions = regions_.size();
    s.registered_bytes = registered_bytes_;
  }
  s.open_connections = open_connections.load();
  s.handshakes = handshakes.load();
  s.bytes_sent = bytes_sent.load();
  s.bytes_received = bytes_received.load();
  return s;
}

const char* Core::source(uint64_t key, uint64_t offset, uint64_t bytes) const {
  std::shared_lock<std::shared_mutex> l(reg_mu_);
  return source_of(regions_, key, offset, bytes);
}

void Core::local_write(const WriteOp& op) {
  std::shared_lock<std::shared_mutex> l(reg_mu_);
  rdma::local_write(regions_, op);
}

}  // namespace fusedcomm::rdma::socket_backend
