// Registered regions: one registration per rail, keys that name them to peers, the source of
// local writes, and writes a rank makes to itself.
#include "core.h"

namespace fusedcomm::rdma::libfabric {

Region Core::register_memory(void* base, uint64_t bytes) {
  if (!base && bytes) throw std::invalid_argument("register_memory: null base");
  Registration reg;
  auto undo = [&](size_t from) {
    for (size_t i = from; i < reg.mrs.size(); ++i) rails_[i]->deregister(reg.mrs[i]);
    reg.mrs.resize(from);
  };
  try {
    for (size_t nic = 0; nic < rails_.size(); nic += stripes_) {
      // A NIC's stripes share the remote key of its first endpoint (kRegion carries one key):
      // a key taken on one of them is tried afresh on all.
      for (int attempt = 0;; ++attempt) {
        reg.mrs.push_back(rails_[nic]->register_memory(base, bytes));
        try {
          for (int s = 1; s < stripes_; ++s) {
            reg.mrs.push_back(rails_[nic + s]->register_memory(base, bytes, reg.mrs[nic].key));
          }
          break;
        } catch (const Rail::KeyTaken&) {
          undo(nic);
          if (attempt == 15) {
            throw TransportError(-1, "libfabric " + caps_.provider + ": registering " +
                                         std::to_string(bytes) +
                                         " bytes failed: no remote key free on every endpoint");
          }
        }
      }
    }
  } catch (...) {
    undo(0);
    throw;
  }
  std::unique_lock<std::shared_mutex> l(reg_mu_);
  reg.region = Region{base, bytes, key_salt_ | next_key_++};
  regions_.emplace(reg.region.key, reg.region);
  registered_bytes_ += bytes;
  const Region r = reg.region;
  registrations_.emplace(r.key, std::move(reg));
  return r;
}

void Core::deregister_memory(const Region& r) {
  Registration reg;
  {
    std::unique_lock<std::shared_mutex> l(reg_mu_);
    auto it = registrations_.find(r.key);
    if (it == registrations_.end()) return;
    reg = std::move(it->second);
    registrations_.erase(it);
    regions_.erase(r.key);
    registered_bytes_ -= reg.region.bytes;
  }
  // Peers that still write into it fail at their end (the remote key is gone).
  for (size_t i = 0; i < reg.mrs.size(); ++i) rails_[i]->deregister(reg.mrs[i]);
}

TransportStats Core::stats() const {
  TransportStats s;
  {
    std::shared_lock<std::shared_mutex> l(reg_mu_);
    s.registered_regions = regions_.size();
    s.registered_bytes = registered_bytes_;
  }
  s.open_connections = open_connections.load();
  s.bytes_sent = bytes_sent.load();
  s.bytes_received = bytes_received.load();
  {
    std::lock_guard<std::mutex> l(hs_mu_);
    s.handshakes = parked_.size();
  }
  std::vector<std::shared_ptr<GroupState>> live;
  {
    std::lock_guard<std::mutex> l(groups_mu_);
    for (auto& [id, w] : groups_) {
      if (auto g = w.lock()) live.push_back(std::move(g));
    }
  }
  for (auto& g : live) {
    std::lock_guard<std::mutex> l(g->mu);
    for (const Peer& p : g->peers) s.handshakes += p.challenges.size();
  }
  return s;
}

const char* Core::source(uint64_t key, uint64_t offset, uint64_t bytes, int rail, void** desc) const {
  std::shared_lock<std::shared_mutex> l(reg_mu_);
  const char* p = source_of(regions_, key, offset, bytes);
  *desc = registrations_.at(key).mrs[rail].desc;
  return p;
}

void Core::local_write(const WriteOp& op) {
  std::shared_lock<std::shared_mutex> l(reg_mu_);
  rdma::local_write(regions_, op);
}

}  // namespace fusedcomm::rdma::libfabric
