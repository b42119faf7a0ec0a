// A peer of a TransportExchanger played by the test over the real transport: its own socket
// transport, staging region and group, speaking the chunk protocol of
// src/runtime/chunk_wire.h by hand, so that a test can send what an honest rank never would
// (wrapping offsets, oversize lengths, unterminated names, flags out of step) and see what the
// exchanger makes of it. Rank 1 of a world of 2; the exchanger under test is rank 0.
#pragma once

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "../../src/runtime/chunk_wire.h"
#include "fusedcomm/rdma/auth.h"
#include "fusedcomm/rdma/transport.h"
#include "fusedcomm/runtime/memory.h"

namespace fusedcomm::testing {

// The bootstrap shares of a test communicator of `world` ranks (fixed: both sides of a test derive
// the same key from them, as ranks do from the real bootstrap's).
inline std::vector<rdma::auth::Share> test_shares(size_t world) {
  std::vector<rdma::auth::Share> shares(world);
  for (size_t r = 0; r < world; ++r) shares[r].fill(static_cast<uint8_t>(r + 1));
  return shares;
}

class FakePeer {
 public:
  static constexpr int kRank = 1, kWorld = 2, kExchanger = 0;
  using Header = chunk_wire::ChunkHeader;

  FakePeer(rdma::Transport& transport, uint64_t chunk_bytes)
      : transport_(transport), layout_{kWorld, chunk_bytes} {
    memory_ = static_cast<char*>(host_alloc(layout_.bytes()));
    region_ = transport_.register_memory(memory_, layout_.bytes());
  }
  ~FakePeer() {
    if (group_) group_->abort();
    group_.reset();
    transport_.deregister_memory(region_);
    host_free(memory_);
  }
  FakePeer(const FakePeer&) = delete;
  FakePeer& operator=(const FakePeer&) = delete;

  std::string endpoint() const { return transport_.address() + "#" + std::to_string(region_.key); }

  // Connects to the exchanger (whose endpoint is `exchanger`), then plays its part of the
  // exchanger's connect barrier.
  void connect(const std::string& exchanger, uint64_t job_token, uint64_t comm_id) {
    const auto hash = exchanger.rfind('#');
    peer_key_ = std::stoull(exchanger.substr(hash + 1));
    rdma::GroupSpec spec;
    spec.key = rdma::auth::derive_comm_key(job_token, comm_id, test_shares(kWorld));
    spec.comm_id = comm_id;
    spec.rank = kRank;
    spec.world = kWorld;
    spec.addresses = {exchanger.substr(0, hash), transport_.address()};
    spec.connect_timeout = std::chrono::seconds(10);
    group_ = transport_.connect(spec);
    const char* barrier = "connect";
    expect_chunk();
    send(header(1, chunk_wire::barrier_fingerprint(barrier), 0, 0, 0, barrier, "connect barrier"), nullptr);
  }

  // A well-formed header (what an honest rank sends for this chunk).
  static Header header(uint64_t seq, uint64_t fingerprint, uint64_t total, uint64_t offset, uint64_t bytes,
                       const char* op, const char* step) {
    Header h;
    std::memset(&h, 0, sizeof h);
    h.magic = chunk_wire::kChunkMagic;
    h.exchange_seq = seq;
    h.fingerprint = fingerprint;
    h.total_bytes = total;
    h.offset = offset;
    h.bytes = bytes;
    std::strncpy(h.op, op, sizeof h.op - 1);
    std::strncpy(h.step, step, sizeof h.step - 1);
    return h;
  }

  // Sends `h` and `payload_bytes` of payload (at most a chunk; the header's own `bytes` may say
  // anything) as the next chunk, once the exchanger's credits allow it; `signal` overrides the
  // data flag value (0: the honest chunk count).
  void send(const Header& h, const void* payload, uint64_t payload_bytes = 0, uint64_t signal = 0) {
    if (payload_bytes > layout_.chunk_bytes) throw std::logic_error("FakePeer::send: payload over a chunk");
    wait_for([&] { return sent_ - load(layout_.credit_flag(kExchanger)) < 2; }, "credit");
    const size_t slot = layout_.send_slot(kExchanger, sent_);
    std::memcpy(memory_ + slot, &h, sizeof h);
    if (payload_bytes > 0) std::memcpy(memory_ + slot + sizeof h, payload, payload_bytes);
    rdma::WriteOp w;
    w.peer = kExchanger;
    w.src_key = region_.key;
    w.src_offset = slot;
    w.dst_key = peer_key_;
    w.dst_offset = layout_.recv_slot(kRank, sent_);
    w.bytes = sizeof h + payload_bytes;
    w.signal_key = peer_key_;
    w.signal_offset = layout_.data_flag(kRank);
    w.signal_value = signal != 0 ? signal : sent_ + 1;
    group_->write(w);
    ++sent_;
  }

  // A bare signal into the exchanger's region: its data flag for this rank, or its credit flag.
  void signal_data(uint64_t value) { signal(layout_.data_flag(kRank), value); }
  void signal_credit(uint64_t value) { signal(layout_.credit_flag(kRank), value); }

  // Waits for the exchanger's next chunk to this rank, credits it, and returns its header.
  Header expect_chunk() {
    wait_for([&] { return load(layout_.data_flag(kExchanger)) > consumed_; }, "a chunk");
    Header h;
    std::memcpy(&h, memory_ + layout_.recv_slot(kExchanger, consumed_), sizeof h);
    ++consumed_;
    signal(layout_.credit_flag(kRank), consumed_);
    return h;
  }

  void abort() {
    if (group_) group_->abort();
  }

 private:
  uint64_t load(size_t offset) const {
    return std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(memory_ + offset))
        .load(std::memory_order_acquire);
  }
  void signal(uint64_t offset, uint64_t value) {
    rdma::WriteOp w;
    w.peer = kExchanger;
    w.signal_key = peer_key_;
    w.signal_offset = offset;
    w.signal_value = value;
    group_->write(w);
  }
  template <typename Ready>
  void wait_for(Ready ready, const char* what) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!ready()) {
      if (std::chrono::steady_clock::now() > deadline)
        throw std::runtime_error(std::string("FakePeer: no ") + what);
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }

  rdma::Transport& transport_;
  chunk_wire::StagingLayout layout_;
  char* memory_ = nullptr;
  rdma::Region region_;
  uint64_t peer_key_ = 0;
  std::unique_ptr<rdma::PeerGroup> group_;
  uint64_t sent_ = 0, consumed_ = 0;
};

}  // namespace fusedcomm::testing
