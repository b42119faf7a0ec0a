#include "fusedcomm/runtime/transport_exchanger.h"

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cstring>
#include <thread>

#include "chunk_wire.h"
#include "fusedcomm/rdma/errors.h"
#include "fusedcomm/runtime/errors.h"
#include "fusedcomm/runtime/memory.h"

namespace fusedcomm {
namespace {

using Clock = std::chrono::steady_clock;
using chunk_wire::barrier_fingerprint;
using chunk_wire::ChunkHeader;
using chunk_wire::kChunkMagic;
constexpr uint32_t kRingSlots = 1024;

uint64_t ceil_div(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

void copy_text(char* dst, size_t cap, const std::string& s) {
  size_t n = std::min(cap - 1, s.size());
  std::memcpy(dst, s.data(), n);
  dst[n] = '\0';
}

// A text field a peer wrote (at most `cap` bytes, NUL-terminated within them), as it may appear
// in an error message: the bytes before the NUL, or all `cap` if there is none, with every byte
// that is not printable ASCII or part of a well-formed UTF-8 sequence of up to three bytes
// written as \xNN (messages end up in Java exceptions, whose text must be valid modified
// UTF-8). Returns whether the field was terminated.
bool peer_text(const char* field, size_t cap, std::string* out) {
  const auto* b = reinterpret_cast<const unsigned char*>(field);
  const size_t n = strnlen(field, cap);
  out->clear();
  static const char kHex[] = "0123456789abcdef";
  for (size_t i = 0; i < n;) {
    const unsigned char c = b[i];
    size_t len = 0;  // of a well-formed sequence starting at i; 0: escape this byte
    if (c >= 0x20 && c < 0x7f) {
      len = 1;
    } else if (c >= 0xc2 && c <= 0xdf) {
      len = 2;
    } else if (c >= 0xe0 && c <= 0xef) {
      len = 3;
    }
    for (size_t k = 1; k < len; ++k) {
      if (i + k >= n || (b[i + k] & 0xc0) != 0x80) len = 0;
    }
    if (len == 3) {
      const unsigned cp = (c & 0x0fu) << 12 | (b[i + 1] & 0x3fu) << 6 | (b[i + 2] & 0x3fu);
      if (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff)) len = 0;  // overlong, or a surrogate
    }
    if (len == 0) {
      *out += "\\x";
      *out += kHex[c >> 4];
      *out += kHex[c & 15];
      ++i;
    } else {
      out->append(field + i, len);
      i += len;
    }
  }
  return n < cap;
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

}  // namespace

// The staging region's layout and the chunk header: chunk_wire.h.
size_t TransportExchanger::slot_stride() const { return layout().slot_stride(); }
size_t TransportExchanger::recv_slot(int src, uint64_t chunk) const { return layout().recv_slot(src, chunk); }
size_t TransportExchanger::send_slot(int dst, uint64_t chunk) const { return layout().send_slot(dst, chunk); }
size_t TransportExchanger::data_flag(int src) const { return layout().data_flag(src); }
size_t TransportExchanger::credit_flag(int dst) const { return layout().credit_flag(dst); }
chunk_wire::StagingLayout TransportExchanger::layout() const { return {world_, chunk_bytes_}; }
uint64_t TransportExchanger::load_flag(size_t offset) const {
  return std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(staging_ + offset))
      .load(std::memory_order_acquire);
}

TransportExchanger::TransportExchanger(Runtime& runtime, int world)
    : runtime_(runtime), chunk_bytes_(runtime.config().chunk_bytes), world_(world) {
  FC_REQUIRE(world >= 1, "world size must be at least 1, got " + std::to_string(world));
  staging_bytes_ = layout().bytes();
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
  // Endpoints come from every rank's bootstrap blob: parsed strictly, never trusted.
  peer_keys_.assign(world_, 0);
  peer_addresses_.clear();
  for (int i = 0; i < world_; ++i) {
    const std::string& e = endpoints[i];
    const auto hash = e.rfind('#');
    const char* key_begin = e.data() + (hash == std::string::npos ? e.size() : hash + 1);
    const char* key_end = e.data() + e.size();
    const auto parsed = std::from_chars(key_begin, key_end, peer_keys_[i]);
    if (hash == std::string::npos || hash == 0 || key_begin == key_end || parsed.ec != std::errc() ||
        parsed.ptr != key_end) {
      std::string shown;
      peer_text(e.c_str(), std::min<size_t>(e.size(), 200) + 1, &shown);
      fail(ErrorKind::kInvalidArgument, "connect: the endpoint of rank " + std::to_string(i) + " ('" + shown +
                                            "') is malformed (want host:port#regionKey)");
    }
    peer_addresses_.push_back(e.substr(0, hash));
  }
  FC_REQUIRE(peer_keys_[rank_] == region_.key,
             "connect: endpoint of rank " + std::to_string(rank) + " is not this communicator's");
  const std::string self =
      "connect of rank " + std::to_string(rank) + " (world " + std::to_string(world_) + ")";
  if (aborted_.load()) fail(ErrorKind::kCommunicator, self + ": the communicator was aborted");

  key_ = rdma::auth::derive_comm_key(runtime_.config().job_token, comm_id, shares);
  rdma::GroupSpec spec;
  spec.key = key_;
  spec.comm_id = comm_id;
  spec.rank = rank;
  spec.world = world_;
  spec.addresses = peer_addresses_;
  spec.connect_timeout = std::chrono::milliseconds(runtime_.config().connect_timeout_ms);
  // abort() from another thread reaches the transport's connect wait through this flag.
  spec.cancel = &aborted_;
  std::unique_ptr<rdma::PeerGroup> group;
  try {
    group = runtime_.transport().connect(spec);
  } catch (const rdma::TransportError&) {
    if (aborted_.load()) fail(ErrorKind::kCommunicator, self + ": aborted while connecting");
    throw;
  }
  {
    // abort() sees either the group (and aborts it) or nothing, in which case the flag it set
    // before is seen here.
    std::lock_guard<std::mutex> l(group_mu_);
    group_ = std::move(group);
  }
  if (aborted_.load()) {
    group_->abort();
    fail(ErrorKind::kCommunicator, self + ": aborted while connecting");
  }

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

// A received chunk header (a copy) against the chunk this rank waits for: chunk `off / chunk
// bytes` of a `total`-byte block of exchange `seq`, `n` payload bytes at `off`. Every field is
// the peer's word until it matches exactly; a mismatch fails the op naming the peer.
void TransportExchanger::check_chunk(const ChunkHeader& h, int p, uint64_t seq, uint64_t total, uint64_t off,
                                     uint64_t n, const char* step, const std::string& where) {
  if (h.magic != kChunkMagic) {
    fail_broken(ErrorKind::kTransport,
                where + ": corrupt chunk header from " + peer_name(p) + " (bad magic)");
  }
  std::string op, peer_step;
  const bool op_ended = peer_text(h.op, sizeof h.op, &op);
  const bool step_ended = peer_text(h.step, sizeof h.step, &peer_step);
  if (!op_ended || !step_ended) {
    std::string start;  // a bounded prefix, for the message
    peer_text(op_ended ? h.step : h.op, 64, &start);
    fail_broken(ErrorKind::kTransport, where + ": malformed chunk header from " + peer_name(p) + ": its " +
                                           (op_ended ? "step name" : "op description") +
                                           " is not NUL-terminated within its " +
                                           std::to_string(op_ended ? sizeof h.step : sizeof h.op) +
                                           "-byte field (it starts '" + start + "...')");
  }
  if (h.fingerprint != op_fingerprint_ || h.exchange_seq != seq) {
    fail_broken(ErrorKind::kCommunicator,
                "op parameters differ across ranks: " + peer_name(p) + " called " + op + " [" + peer_step +
                    "], but rank " + std::to_string(rank_) + " called " + op_description_ + " [" + step +
                    "]" +
                    (h.exchange_seq != seq
                         ? " (its exchange " + std::to_string(h.exchange_seq) + ", this rank's " +
                               std::to_string(seq) + ": the ranks have not called the same sequence of ops)"
                         : ""));
  }
  if (h.total_bytes != total) {
    fail_broken(ErrorKind::kCommunicator, where + ": " + peer_name(p) + " sends " +
                                              std::to_string(h.total_bytes) +
                                              " bytes but this rank expects " + std::to_string(total) +
                                              " (shapes inconsistent across ranks)");
  }
  if (h.offset != off || h.bytes != n) {
    fail_broken(ErrorKind::kTransport,
                where + ": chunk out of range from " + peer_name(p) + ": " + std::to_string(h.bytes) +
                    " bytes at offset " + std::to_string(h.offset) + " where this rank expects " +
                    std::to_string(n) + " bytes at offset " + std::to_string(off) + " of the " +
                    std::to_string(total) + "-byte block (protocol violation)");
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
    uint64_t send_chunks = 0, sent = 0;  // this exchange
    uint64_t recv_chunks = 0, received = 0;
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
        // Send what the credits allow. The peer's credit counts chunks it consumed: never more
        // than were sent to it.
        while (pr.sent < pr.send_chunks) {
          const uint64_t credit = load_flag(credit_flag(p));
          if (credit > sent_chunks_[p]) {
            fail_broken(ErrorKind::kTransport, where + ": " + peer_name(p) + " credited " +
                                                   std::to_string(credit) + " chunks but only " +
                                                   std::to_string(sent_chunks_[p]) +
                                                   " were sent to it (protocol violation)");
          }
          if (sent_chunks_[p] - credit >= 2) break;
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
        // Consume what has arrived. The data flag counts chunks the peer delivered; the credits
        // let it run at most two ahead of what this rank consumed.
        while (pr.received < pr.recv_chunks) {
          const uint64_t delivered = load_flag(data_flag(p));
          if (delivered <= consumed_chunks_[p]) break;
          if (delivered - consumed_chunks_[p] > 2) {
            fail_broken(ErrorKind::kTransport, where + ": " + peer_name(p) + " signalled " +
                                                   std::to_string(delivered) + " chunks delivered while " +
                                                   std::to_string(consumed_chunks_[p]) +
                                                   " were consumed here, at most 2 may be in flight "
                                                   "(protocol violation)");
          }
          // A copy: the peer can write the slot again at any time, and what was checked is what
          // gets used.
          ChunkHeader h;
          std::memcpy(&h, staging_ + recv_slot(p, consumed_chunks_[p]), sizeof h);
          const uint64_t off = pr.received * chunk_bytes_;
          const uint64_t n = std::min<uint64_t>(chunk_bytes_, recv[p].bytes - std::min(off, recv[p].bytes));
          check_chunk(h, p, seq, recv[p].bytes, off, n, step, where);
          if (n > 0) {
            std::memcpy(static_cast<char*>(recv[p].data) + off,
                        staging_ + recv_slot(p, consumed_chunks_[p]) + sizeof(ChunkHeader), n);
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
  {
    std::lock_guard<std::mutex> l(group_mu_);
    group_.reset();
  }
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
    std::lock_guard<std::mutex> l(group_mu_);
    if (group_) group_->abort();
  } catch (...) {}
}

}  // namespace fusedcomm
