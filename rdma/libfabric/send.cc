// The write path (PeerGroup::write): the destination's region from the peer (kQuery, once per
// region and group), its bounds checked, the payload as RMA writes in pieces, the signal as a
// message, and a wait for the writes' local completions so that the source may be reused.
#include "core.h"

#include <rdma/fi_errno.h>

#include <algorithm>

namespace fusedcomm::rdma::libfabric {

// Where the peer's destination region lives: cached, or asked for. The first write into a region
// is checked by the peer against its registry (as the socket backend's receiver checks every
// write); later ones against the bounds it answered with. Throws TransportError naming the peer.
RemoteRegion GroupState::remote_region(int peer, const WriteOp& op) {
  uint64_t id;
  {
    std::lock_guard<std::mutex> l(mu);
    auto it = peers[peer].regions.find(op.dst_key);
    if (it != peers[peer].regions.end()) {
      const RemoteRegion rr = it->second;
      std::string why;
      const RegionMap bounds{{op.dst_key, Region{nullptr, rr.bytes, op.dst_key}}};
      if (check_write(bounds, op.dst_key, op.dst_offset, op.bytes, 0, 0, &why)) return rr;
      // The peer decides with its own registry, and fails us with its own words.
      wire::Msg v{};
      v.kind = wire::kViolation;
      v.w[1] = op.dst_key;
      v.w[2] = op.dst_offset;
      v.w[3] = op.bytes;
      send_locked(peer, v, true);
      const std::string msg = "a write to " + who(peer) + " was refused: " + why;
      fail_locked(peer, msg);
      throw TransportError(peer, msg);
    }
    id = ++peers[peer].next_query;
    wire::Msg q{};
    q.kind = wire::kQuery;
    q.w[0] = id;
    q.w[1] = op.dst_key;
    q.w[2] = op.dst_offset;
    q.w[3] = op.bytes;
    q.w[4] = op.signal_key;
    q.w[5] = op.signal_offset;
    send_locked(peer, q, true);
  }
  const bool answered = progress_until(
      [&] { return peers[peer].answers.count(id) || peers[peer].state != PeerState::kConnected; },
      Clock::now() + kSendStallTimeout);
  std::lock_guard<std::mutex> l(mu);
  auto it = peers[peer].answers.find(id);
  if (it == peers[peer].answers.end()) {
    if (aborted) throw TransportError(-1, self() + ": the group was aborted");
    const Peer& p = peers[peer];
    throw TransportError(
        peer, p.error.empty() ? (answered ? who(peer) + " has closed the group"
                                          : who(peer) + " did not answer for its region " + hex(op.dst_key))
                              : p.error);
  }
  const auto [found, rr] = it->second;
  peers[peer].answers.erase(it);
  if (!found) {
    const std::string msg = who(peer) + " refused our write to region " + hex(op.dst_key) + " (offset " +
                            std::to_string(op.dst_offset) + ", " + std::to_string(op.bytes) +
                            " bytes; signal region " + hex(op.signal_key) + " offset " +
                            std::to_string(op.signal_offset) + "): its error names the check that failed";
    fail_locked(peer, msg);
    throw TransportError(peer, msg);
  }
  peers[peer].regions[op.dst_key] = rr;
  return rr;
}

void GroupState::write(const WriteOp& op) {
  if (aborted) throw TransportError(-1, self() + ": the group was aborted");
  if (op.peer < 0 || op.peer >= world) {
    throw std::invalid_argument("write: peer " + std::to_string(op.peer) + " is not in [0, " +
                                std::to_string(world) + ")");
  }
  if (op.signal_key && op.signal_offset % 8) {
    throw std::invalid_argument("write: signal_offset must be 8-byte aligned");
  }
  if (op.peer == rank) {
    core->local_write(op);
    return;
  }
  const int p = op.peer;
  auto refuse_if_down = [&] {  // mu held
    if (phase != Phase::kLive) throw TransportError(-1, self() + ": the group is closed");
    const Peer& pe = peers[p];
    if (!pe.up) throw TransportError(p, who(p) + " is not connected");
    if (pe.state != PeerState::kConnected) {
      throw TransportError(p, pe.error.empty() ? who(p) + " has closed the group" : pe.error);
    }
  };
  {
    std::lock_guard<std::mutex> l(mu);
    refuse_if_down();
  }
  // A large payload goes in `parts` contiguous parts, part s on the group's endpoint s (each
  // with its own connection and progress thread), each part in pieces of at most the
  // provider's largest write. Every piece is an op of the pair: the receiver applies the
  // signal once all of them have arrived, whichever endpoint they came through.
  const int parts = op.bytes >= kStripeMinBytes ? std::min(static_cast<int>(endpoints.size()), kSplitParts) : 1;
  void* descs[kMaxStripes] = {};
  const char* src = nullptr;
  for (int s = 0; op.bytes && s < parts; ++s) {
    src = core->source(op.src_key, op.src_offset, op.bytes, endpoints[s], &descs[s]);
  }
  RemoteRegion rr;
  if (op.bytes) rr = remote_region(p, op);
  const bool cq_data = core->cq_data();
  // A sole writer's signal rides as the last piece's second iov where the provider places an
  // operation's bytes in order and the pair's writes in order (one part: one connection): the
  // word lands after every byte of the payload, and no signal message follows.
  const Caps& caps = core->caps();
  const bool signal_iov = cq_data && op.signal_key && op.signal_sole_writer && op.bytes && parts == 1 &&
                          caps.ordered_iovs && !caps.mr_local;
  RemoteRegion sr;
  if (signal_iov) {
    WriteOp word;
    word.peer = p;
    word.dst_key = op.signal_key;
    word.dst_offset = op.signal_offset;
    word.bytes = sizeof op.signal_value;
    sr = remote_region(p, word);
  }
  constexpr uint64_t kPartAlign = 4096;
  const uint64_t part_bytes = (op.bytes / parts + kPartAlign - 1) / kPartAlign * kPartAlign;

  const wire::CqDataLayout& layout = core->layout();
  const uint64_t piece_max = caps.max_write;
  auto wait = std::make_shared<WriteWait>();
  uint64_t last_seq = 0;
  const auto deadline = Clock::now() + kSendStallTimeout;
  for (uint64_t done = 0; done < op.bytes;) {
    const int part = static_cast<int>(std::min<uint64_t>(done / part_bytes, parts - 1));
    const uint64_t part_end = part == parts - 1 ? op.bytes : (part + 1) * part_bytes;
    const uint64_t n = std::min(part_end - done, piece_max);
    const bool last = done + n == op.bytes;
    uint64_t seq = 0, data = 0;
    {
      std::unique_lock<std::mutex> l(mu);
      refuse_if_down();
      if (cq_data) {
        if (peers[p].next_seq - peers[p].acked >= layout.window()) {
          // The peer has not confirmed enough: wait, so that truncated sequence numbers stay
          // unambiguous at its end.
          l.unlock();
          progress_until(
              [&] {
                return peers[p].next_seq - peers[p].acked < layout.window() ||
                       peers[p].state != PeerState::kConnected;
              },
              deadline);
          continue;
        }
        seq = ++peers[p].next_seq;
        data = layout.encode(peers[p].out_stream, last && op.signal_key && !signal_iov, seq);
      }
    }
    auto* ctx = new Op;
    ctx->kind = Op::kWrite;
    ctx->group = weak_from_this();
    ctx->peer = p;
    ctx->wait = wait;
    wait->left.fetch_add(1);
    outstanding.fetch_add(1);
    auto post = [&] {
      Rail& rail = core->rail(endpoints[part]);
      const fi_addr_t to = peers[p].stripe_addr[part];
      if (signal_iov && last) {
        ctx->signal_value = op.signal_value;
        return rail.post_write_with_signal(ctx, src + done, n, descs[part], to, rr.addr + op.dst_offset + done,
                                           rr.key, sr.addr + op.signal_offset, sr.key, data);
      }
      return rail.post_write(ctx, src + done, n, descs[part], to, rr.addr + op.dst_offset + done, rr.key, cq_data,
                             data);
    };
    int rc;
    while ((rc = post()) == -FI_EAGAIN) {
      // The provider's queue is full (or the endpoint still connecting): make room, unless the
      // peer is gone.
      core->progress(endpoints[part]);
      std::lock_guard<std::mutex> l(mu);
      if (aborted || peers[p].state != PeerState::kConnected || Clock::now() > deadline) break;
    }
    if (rc != 0) {
      wait->left.fetch_sub(1);
      outstanding.fetch_sub(1);
      delete ctx;
      std::lock_guard<std::mutex> l(mu);
      if (aborted) throw TransportError(-1, self() + ": the group was aborted");
      refuse_if_down();
      const std::string msg =
          "writing to " + who(p) + " failed: " +
          (rc == -FI_EAGAIN ? "no progress for " + std::to_string(kSendStallTimeout.count()) + " ms"
                            : core->api_.error_text(rc));
      fail_locked(p, msg);
      throw TransportError(p, msg);
    }
    // The part's endpoint carries no messages of this group: its thread polls from its first
    // piece on, as the group's own does from the traffic it sees.
    if (part > 0 && done == part * part_bytes) core->expect_traffic(endpoints[part]);
    last_seq = seq;
    done += n;
  }
  {
    std::lock_guard<std::mutex> l(mu);
    peers[p].bytes_sent += op.bytes;
    if (op.signal_key && cq_data && !signal_iov) {
      // Sent before the payload completes: the peer applies it once op `seq` and every op
      // before it have arrived.
      wire::Msg s{};
      s.kind = wire::kSignal;
      s.flags = op.bytes ? wire::kHasPayload : 0;
      s.w[0] = op.bytes ? last_seq : ++peers[p].next_seq;
      s.w[1] = op.signal_key;
      s.w[2] = op.signal_offset;
      s.w[3] = op.signal_value;
      s.w[4] = peers[p].bytes_sent;
      peers[p].signals_sent++;
      send_locked(p, s, true);
    }
  }
  if (op.bytes) {
    // The source may be reused only once the provider is done with it (the proxy publishes
    // `completed` when this returns).
    // A peer that closed politely meanwhile still receives until our goodbye; one that failed
    // needs nothing more.
    // One part: this thread polls its endpoint alone, its progress thread standing aside (two
    // pollers of one endpoint only take turns at its lock, and on a small host the second
    // spins on the core the receiver needs). Several parts: each endpoint's thread keeps moving
    // its own part's bytes beside this one.
    progress_until([&] { return wait->left.load() == 0 || peers[p].state == PeerState::kFailed; }, deadline,
                   parts, parts == 1);
    if (wait->left.load() != 0 || wait->failed.load()) {
      std::lock_guard<std::mutex> l(mu);
      if (aborted) throw TransportError(-1, self() + ": the group was aborted");
      std::string err;
      {
        std::lock_guard<std::mutex> wl(wait->mu);
        err = wait->error;
      }
      const std::string msg =
          err.empty() ? (peers[p].error.empty() ? "writing to " + who(p) + " made no progress for " +
                                                      std::to_string(kSendStallTimeout.count()) + " ms"
                                                : peers[p].error)
                      : "writing to " + who(p) + " failed: " + err;
      fail_locked(p, msg);
      throw TransportError(p, msg);
    }
  }
  if (op.signal_key && !cq_data) {
    // The payload is placed (delivery completion): the signal may follow.
    std::lock_guard<std::mutex> l(mu);
    refuse_if_down();
    wire::Msg s{};
    s.kind = wire::kSignal;
    s.w[1] = op.signal_key;
    s.w[2] = op.signal_offset;
    s.w[3] = op.signal_value;
    s.w[4] = peers[p].bytes_sent;
    peers[p].signals_sent++;
    send_locked(p, s, true);
  }
  core->bytes_sent.fetch_add(op.bytes, std::memory_order_relaxed);
}

}  // namespace fusedcomm::rdma::libfabric
