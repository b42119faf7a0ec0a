#include "fusedcomm/runtime/transport_exchanger.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

#include "fusedcomm/rdma/errors.h"
#include "fusedcomm/runtime/errors.h"
#include "fusedcomm/runtime/memory.h"

namespace fusedcomm {
namespace {

using Clock = std::chrono::steady_clock;
constexpr uint64_t kChunkMagic = 0x6663636b6e6b6331ull;  // "fcckn kc1"
constexpr uint32_t kRingSlots = 1024;

uint64_t ceil_div(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

// Fingerprint of one of the communicator's own barriers: a hash of its name (FNV-1a), so that a
// rank in the finish barrier and a rank in an op are told apart.
uint64_t barrier_fingerprint(const char* name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (const char* p = name; *p; ++p) h = (h ^ static_cast<unsigned char>(*p)) * 0x100000001b3ull;
  return h;
}

void copy_text(char* dst, size_t cap, const std::string& s) {
  size_t n = std::min(cap - 1, s.size());
  std::memcpy(dst, s.data(), n);
  dst[n] = '\0';
}

// Waiting without burning the cores the other ranks (and the transport's receiver thread) need:
// a short spin, then sleeps that grow to 200 µs.
class Backoff {
 public:
  void reset() { n_ = 0; }
  void pause() {
    if (++n_ < 64) return;
    if (n_ < 128) {
      std::this_thread::yield();
      return;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(std::min<uint64_t>(200, (n_ - 127) * 5)));
  }

 private:
  uint64_t n_ = 0;
};

// Each chunk slot starts with this header; the payload follows it. It is written by the sender
// into its own send slot, then travels with the payload in one transport write.
struct alignas(64) ChunkHeader {
  uint64_t magic;         // kChunkMagic
  uint64_t exchange_seq;  // the sender's exchange counter: ranks must call ops in one order
  uint64_t fingerprint;   // the op's global parameters (begin_op)
  uint64_t total_bytes;   // whole block this exchange sends to the receiver
  uint64_t offset;        // of this chunk's payload within the block
  uint64_t bytes;         // payload bytes in this chunk
  uint64_t reserved[2];
  char op[320];    // the sender's op description, NUL-terminated
  char step[128];  // the exchange step, NUL-terminated
};
static_assert(sizeof(ChunkHeader) == 512);

}  // namespace

// Staging region layout (one registered region per communicator), W = world,
// S = slot stride = sizeof(ChunkHeader) + chunk_bytes:
//   recv slots  [0, 2WS)        slot (src, b) at (2 src + b) S: chunks from rank src, b = chunk % 2
//   send slots  [2WS, 4WS)      slot (dst, b): my chunk for rank dst, staged before posting
//   data flags  [4WS, 4WS+8W)   data[src]: chunks src has delivered here (written by src)
//   credits     [4WS+8W, +8W)   credit[dst]: my chunks dst has consumed (written by dst)
// Two slots per pair: chunk c may be sent once the receiver has consumed chunk c-2
// (c - credit < 2). Flags only grow; they are written by the transport with release ordering
// after the payload, and read here with acquire loads.
size_t TransportExchanger::slot_stride() const { return sizeof(ChunkHeader) + chunk_bytes_; }
size_t TransportExchanger::recv_slot(int src, uint64_t chunk) const {
  return (2 * static_cast<size_t>(src) + chunk % 2) * slot_stride();
}
size_t TransportExchanger::send_slot(int dst, uint64_t chunk) const {
  return 2 * world_ * slot_stride() + recv_slot(dst, chunk);
}
size_t TransportExchanger::data_flag(int src) const { return 4 * world_ * slot_stride() + 8 * src; }
size_t TransportExchanger::credit_flag(int dst) const {
  return 4 * world_ * slot_stride() + 8 * world_ + 8 * dst;
}
uint64_t TransportExchanger::load_flag(size_t offset) const {
  return std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(staging_ + offset))
      .load(std::memory_order_acquire);
}

TransportExchanger::TransportExchanger(Runtime& runtime, int world)
    : runtime_(runtime), chunk_bytes_(runtime.config().chunk_bytes), world_(world) {
  FC_REQUIRE(world >= 1, "world size must be at least 1, got " + std::to_string(world));
  staging_bytes_ = 4 * world_ * slot_stride() + 16 * static_cast<size_t>(world_);
  staging_ = static_cast<char*>(host_alloc(staging_bytes_));
  try {
    region_ = runtime_.transport().register_memory(staging_, staging_bytes_);
  } catch (...) {
    host_free(staging_);
    throw;
  }
}

TransportExchanger::~TransportExchanger() {
  try {
    if (!closed_) {
      abort();
      close();
    }
  } catch (...) {}
}

std::string TransportExchanger::endpoint() const {
  return runtime_.transport().address() + "#" + std::to_string(region_.key);
}

void TransportExchanger::connect(const std::vector<std::string>& endpoints, int rank, uint64_t comm_id,
                                 const std::vector<rdma::auth::Share>& shares) {
  FC_REQUIRE(!connected_ && !closed_, "connect: the communicator is already connected or closed");
  FC_REQUIRE(
      static_cast<int>(endpoints.size()) == world_,
      "connect: " + std::to_string(endpoints.size()) + " endpoints for world " + std::to_string(world_));
  FC_REQUIRE(rank >= 0 && rank < world_,
             "connect: rank " + std::to_string(rank) + " outside world " + std::to_string(world_));
  FC_REQUIRE(world_ == 1 || static_cast<int>(shares.size()) == world_,
             "connect: " + std::to_string(shares.size()) + " authentication shares for world " +
                 std::to_string(world_) + " (one per rank, from the bootstrap)");
  rank_ = rank;
  peer_keys_.assign(world_, 0);
  for (int i = 0; i < world_; ++i) {
    const std::string& e = endpoints[i];
    auto hash = e.rfind('#');
    FC_REQUIRE(hash != std::string::npos && hash + 1 < e.size(), "connect: malformed endpoint '" + e + "'");
    peer_addresses_.push_back(e.substr(0, hash));
    peer_keys_[i] = std::stoull(e.substr(hash + 1));
  }
  FC_REQUIRE(peer_keys_[rank_] == region_.key,
             "connect: endpoint of rank " + std::to_string(rank) + " is not this communicator's");

  key_ = rdma::auth::derive_comm_key(runtime_.config().job_token, comm_id, shares);
  rdma::GroupSpec spec;
  spec.key = key_;
  spec.comm_id = comm_id;
  spec.rank = rank;
  spec.world = world_;
  spec.addresses = peer_addresses_;
  spec.connect_timeout = std::chrono::milliseconds(runtime_.config().connect_timeout_ms);
  group_ = runtime_.transport().connect(spec);

  ring_memory_ = host_alloc(rdma::ProxyRing::bytes_for(kRingSlots));
  proxy_ = std::make_unique<rdma::Proxy>(rdma::ProxyRing(ring_memory_, kRingSlots), *group_);
  sent_chunks_.assign(world_, 0);
  consumed_chunks_.assign(world_, 0);
  connected_ = true;
  // A rank's connect() returns once its own connections are up, not once every rank's are: a
  // fast rank could otherwise run (and fail) an op and leave while a slow one is still
  // connecting, which then waits for peers that are gone. No rank starts an op before all have
  // connected.
  barrier("connect", "connect barrier");
}

void TransportExchanger::barrier(const char* name, const char* step) {
  if (world_ == 1) return;
  begin_op(name, barrier_fingerprint(name));
  std::vector<SendBlock> s(world_);
  std::vector<RecvBlock> r(world_);
  exchange(s, r, step);
}

std::string TransportExchanger::peer_name(int peer) const {
  return "rank " + std::to_string(peer) + " at " + peer_addresses_.at(peer);
}

void TransportExchanger::check_usable(const char* what) const {
  if (closed_) fail(ErrorKind::kState, std::string(what) + ": the communicator is closed");
  if (!connected_) fail(ErrorKind::kState, std::string(what) + ": the communicator is not connected");
  if (aborted_.load()) fail(ErrorKind::kCommunicator, std::string(what) + ": the communicator was aborted");
  if (!broken_.empty()) {
    fail(ErrorKind::kCommunicator,
         std::string(what) + ": the communicator is unusable after an earlier error: " + broken_);
  }
}

void TransportExchanger::fail_broken(ErrorKind kind, const std::string& message) {
  if (broken_.empty()) broken_ = message;
  // The group stays up until close(): every rank exchanges with every peer directly, so each
  // finds the rank really at fault itself; tearing our connections down first would make the
  // others name us instead.
  fail(kind, message);
}

void TransportExchanger::begin_op(const std::string& description, uint64_t fingerprint) {
  check_usable(description.c_str());
  op_description_ = description;
  op_fingerprint_ = fingerprint;
}

void TransportExchanger::post(const rdma::WriteOp& op) {
  try {
    proxy_->ring().post(op, std::chrono::milliseconds(runtime_.config().timeout_ms));
  } catch (const rdma::TransportError& e) {
    // A failed proxy aborts its ring; what failed it (naming the peer) is the error to report.
    std::string cause = proxy_->error();
    if (cause.empty()) throw;
    throw rdma::TransportError(proxy_->failed_peer(), cause);
  }
}

void TransportExchanger::exchange(const std::vector<SendBlock>& send, const std::vector<RecvBlock>& recv,
                                  const char* step) {
  check_usable(step);
  FC_REQUIRE(static_cast<int>(send.size()) == world_ && static_cast<int>(recv.size()) == world_,
             std::string(step) + ": exchange needs one send and one receive block per rank");
  const std::string where = op_description_ + " [" + step + "] on rank " + std::to_string(rank_);
  if (send[rank_].bytes != recv[rank_].bytes) {
    fail(ErrorKind::kInvalidArgument, where + ": local block of " + std::to_string(send[rank_].bytes) +
                                          " bytes but " + std::to_string(recv[rank_].bytes) + " expected");
  }
  if (send[rank_].bytes > 0 && send[rank_].data != recv[rank_].data) {
    std::memmove(recv[rank_].data, send[rank_].data, send[rank_].bytes);
  }
  if (world_ == 1) return;
  const uint64_t seq = ++exchange_seq_;

  struct Pair {
    uint64_t send_chunks = 0, sent = 0;      // this exchange
    uint64_t recv_chunks = 0, received = 0;  // recv_chunks known from the first header
    bool header_seen = false;
  };
  std::vector<Pair> pairs(world_);
  int pending = 0;
  for (int p = 0; p < world_; ++p) {
    if (p == rank_) continue;
    pairs[p].send_chunks = std::max<uint64_t>(1, ceil_div(send[p].bytes, chunk_bytes_));
    pairs[p].recv_chunks = std::max<uint64_t>(1, ceil_div(recv[p].bytes, chunk_bytes_));
    pending += 2;
  }

  const auto timeout = std::chrono::milliseconds(runtime_.config().timeout_ms);
  auto last_progress = Clock::now();
  Backoff backoff;
  bool peer_gone_seen = false;
  try {
    while (pending > 0) {
      bool progress = false;
      for (int p = 0; p < world_; ++p) {
        if (p == rank_) continue;
        Pair& pr = pairs[p];
        // Send what the credits allow.
        while (pr.sent < pr.send_chunks && sent_chunks_[p] - load_flag(credit_flag(p)) < 2) {
          const uint64_t chunk = sent_chunks_[p];
          const uint64_t off = pr.sent * chunk_bytes_;
          const uint64_t n = std::min<uint64_t>(chunk_bytes_, send[p].bytes - std::min(off, send[p].bytes));
          auto* h = reinterpret_cast<ChunkHeader*>(staging_ + send_slot(p, chunk));
          std::memset(h, 0, sizeof *h);
          h->magic = kChunkMagic;
          h->exchange_seq = seq;
          h->fingerprint = op_fingerprint_;
          h->total_bytes = send[p].bytes;
          h->offset = off;
          h->bytes = n;
          copy_text(h->op, sizeof h->op, op_description_);
          copy_text(h->step, sizeof h->step, step);
          if (n > 0)
            std::memcpy(reinterpret_cast<char*>(h + 1), static_cast<const char*>(send[p].data) + off, n);
          rdma::WriteOp w;
          w.peer = p;
          w.src_key = region_.key;
          w.src_offset = send_slot(p, chunk);
          w.dst_key = peer_keys_[p];
          w.dst_offset = recv_slot(rank_, chunk);
          w.bytes = sizeof(ChunkHeader) + n;
          w.signal_key = peer_keys_[p];
          w.signal_offset = data_flag(rank_);
          w.signal_value = chunk + 1;
          post(w);
          ++sent_chunks_[p];
          if (++pr.sent == pr.send_chunks) --pending;
          progress = true;
        }
        // Consume what has arrived.
        while (pr.received < pr.recv_chunks && load_flag(data_flag(p)) > consumed_chunks_[p]) {
          const uint64_t chunk = consumed_chunks_[p];
          const auto* h = reinterpret_cast<const ChunkHeader*>(staging_ + recv_slot(p, chunk));
          if (h->magic != kChunkMagic) {
            fail_broken(ErrorKind::kTransport, where + ": corrupt chunk header from " + peer_name(p));
          }
          if (h->fingerprint != op_fingerprint_ || h->exchange_seq != seq) {
            fail_broken(ErrorKind::kCommunicator, "op parameters differ across ranks: " + peer_name(p) +
                                                      " called " + std::string(h->op) + " [" + h->step +
                                                      "], but rank " + std::to_string(rank_) + " called " +
                                                      op_description_ + " [" + step + "]");
          }
          if (!pr.header_seen) {
            pr.header_seen = true;
            if (h->total_bytes != recv[p].bytes) {
              fail_broken(ErrorKind::kCommunicator,
                          where + ": " + peer_name(p) + " sends " + std::to_string(h->total_bytes) +
                              " bytes but this rank expects " + std::to_string(recv[p].bytes) +
                              " (shapes inconsistent across ranks)");
            }
          }
          if (h->offset + h->bytes > recv[p].bytes || h->bytes > chunk_bytes_) {
            fail_broken(ErrorKind::kTransport, where + ": chunk out of range from " + peer_name(p));
          }
          if (h->bytes > 0) {
            std::memcpy(static_cast<char*>(recv[p].data) + h->offset, reinterpret_cast<const char*>(h + 1),
                        h->bytes);
          }
          ++consumed_chunks_[p];
          rdma::WriteOp credit;
          credit.peer = p;
          credit.signal_key = peer_keys_[p];
          credit.signal_offset = credit_flag(rank_);
          credit.signal_value = consumed_chunks_[p];
          post(credit);
          if (++pr.received == pr.recv_chunks) --pending;
          progress = true;
        }
      }
      if (progress) {
        last_progress = Clock::now();
        backoff.reset();
        continue;
      }
      if (aborted_.load()) fail_broken(ErrorKind::kCommunicator, where + ": aborted");
      std::string proxy_error = proxy_->error();
      if (!proxy_error.empty()) fail_broken(ErrorKind::kTransport, where + ": " + proxy_error);
      // A peer's last chunk can land just before its goodbye: the transport makes the data
      // and flags of earlier messages visible before it reports the state change, so one more
      // pass that finds nothing new proves the peer left without what this rank waits for.
      bool gone = false;
      for (int p = 0; p < world_; ++p) {
        if (p == rank_) continue;
        const Pair& pr = pairs[p];
        bool waiting = pr.received < pr.recv_chunks || pr.sent < pr.send_chunks;
        if (waiting && group_->status(p) != rdma::PeerState::kConnected) {
          if (peer_gone_seen) {
            fail_broken(ErrorKind::kTransport,
                        where + ": " + peer_name(p) +
                            " left (connection closed or failed) while this rank waited for it");
          }
          gone = true;
        }
      }
      if (gone) {
        peer_gone_seen = true;
        continue;
      }
      if (Clock::now() - last_progress > timeout) {
        std::string who;
        for (int p = 0; p < world_; ++p) {
          if (p == rank_) continue;
          const Pair& pr = pairs[p];
          if (pr.received < pr.recv_chunks) {
            who += (who.empty() ? "" : ", ") + peer_name(p) + " (received " + std::to_string(pr.received) +
                   " of " + std::to_string(pr.recv_chunks) + " chunks)";
          } else if (pr.sent < pr.send_chunks) {
            who += (who.empty() ? "" : ", ") + peer_name(p) + " (no credit to send chunk " +
                   std::to_string(pr.sent + 1) + " of " + std::to_string(pr.send_chunks) + ")";
          }
        }
        fail_broken(ErrorKind::kTimeout, where + ": timed out after " + std::to_string(timeout.count()) +
                                             " ms waiting for " + who);
      }
      backoff.pause();
    }
  } catch (const rdma::TransportError& e) { fail_broken(ErrorKind::kTransport, where + ": " + e.what()); }
}

void TransportExchanger::finish() {
  if (!connected_ || closed_) return;
  barrier("finish", "finish barrier");
}

void TransportExchanger::close() {
  if (closed_) return;
  bool clean = connected_ && !aborted_.load() && broken_.empty();
  std::string error;
  if (clean) {
    try {
      finish();
    } catch (const std::exception& e) {
      error = e.what();
      clean = false;
    }
  }
  closed_ = true;
  const auto timeout = std::chrono::milliseconds(runtime_.config().timeout_ms);
  const bool aborted = aborted_.load();
  // After an error (not an abort) this rank leaves politely: what it already sent still reaches
  // its peers (resetting the connections can drop it), so a slower peer learns the real error
  // instead of only that this rank left. Peers may be stuck waiting for us, so the goodbye only
  // lingers briefly.
  const auto linger = clean ? timeout : std::min(timeout, std::chrono::milliseconds(1000));
  if (proxy_) proxy_->stop(!aborted, linger);
  if (group_) {
    if (aborted) {
      group_->abort();
    } else {
      group_->close(linger);
    }
  }
  proxy_.reset();
  group_.reset();
  host_free(ring_memory_);
  ring_memory_ = nullptr;
  if (staging_ != nullptr) {
    runtime_.transport().deregister_memory(region_);
    host_free(staging_);
    staging_ = nullptr;
  }
  if (!error.empty()) fail(ErrorKind::kCommunicator, "close: " + error);
}

void TransportExchanger::abort() noexcept {
  aborted_.store(true);
  try {
    if (group_) group_->abort();
  } catch (...) {}
}

}  // namespace fusedcomm
