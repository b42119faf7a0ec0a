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

bool in_range(const Region& r, uint64_t offset, uint64_t bytes) {
  return offset <= r.bytes && bytes <= r.bytes - offset;
}

const char* Core::source(uint64_t key, uint64_t offset, uint64_t bytes) const {
  std::shared_lock<std::shared_mutex> l(reg_mu_);
  auto it = regions_.find(key);
  if (it == regions_.end()) {
    throw std::invalid_argument("write: source region " + hex(key) + " is not registered");
  }
  if (!in_range(it->second, offset, bytes)) {
    throw std::invalid_argument("write: source range [" + std::to_string(offset) + ", +" +
                                std::to_string(bytes) + ") exceeds region " + hex(key) + " of " +
                                std::to_string(it->second.bytes) + " bytes");
  }
  return static_cast<const char*>(it->second.base) + offset;
}

void store_max_release(void* word, uint64_t value) {
  std::atomic_ref<uint64_t> w(*static_cast<uint64_t*>(word));
  uint64_t old = w.load(std::memory_order_relaxed);
  while (old < value &&
         !w.compare_exchange_weak(old, value, std::memory_order_release, std::memory_order_relaxed)) {}
}

void Core::local_write(const WriteOp& op) {
  std::shared_lock<std::shared_mutex> l(reg_mu_);
  auto find = [&](uint64_t key, uint64_t off, uint64_t n, const char* what) -> char* {
    auto it = regions_.find(key);
    if (it == regions_.end() || !in_range(it->second, off, n)) {
      throw std::invalid_argument(std::string("write to self: ") + what + " range is invalid");
    }
    return static_cast<char*>(it->second.base) + off;
  };
  if (op.bytes) {
    const char* src = find(op.src_key, op.src_offset, op.bytes, "source");
    char* dst = find(op.dst_key, op.dst_offset, op.bytes, "destination");
    std::memmove(dst, src, op.bytes);
  }
  if (op.signal_key) {
    if (op.signal_offset % 8) throw std::invalid_argument("write to self: unaligned signal");
    store_max_release(find(op.signal_key, op.signal_offset, 8, "signal"), op.signal_value);
  }
}

}  // namespace fusedcomm::rdma::socket_backend
