// What arrives after the handshake: messages of authenticated pairs (signals, region queries
// and answers, refusals, acks, heartbeats, goodbyes) and payload arrivals (remote CQ data),
// with signals applied in the order of their ops.
#include "core.h"

namespace fusedcomm::rdma::libfabric {

void Core::on_message(int rail, const wire::Msg& m, size_t bytes) {
  if (bytes != sizeof m || m.magic != wire::kMsgMagic) return;  // not ours: dropped
  if (m.kind == wire::kHandshake) {
    on_handshake(rail, m);
    return;
  }
  std::shared_ptr<GroupState> gp = group(m.comm_id);
  if (!gp || gp->rail != rail) return;
  GroupState& g = *gp;
  std::lock_guard<std::mutex> l(g.mu);
  const int p = m.rank;
  if (g.phase == Phase::kDone || p < 0 || p >= g.world || p == g.rank || m.target != g.rank) return;
  Peer& pe = g.peers[p];
  // Only the pair's session tag speaks for rank p (wire.h).
  if (pe.session == 0 || m.session != pe.session) return;
  pe.last_heard = Clock::now();
  busy_poll_[rail]->open();
  switch (m.kind) {
    case wire::kSignal:
      pe.signals_received++;
      if (m.w[0] == 0) {
        // Message mode: the writer sent it after its payload was placed.
        apply_signal(g, p, m.w[1], m.w[2], m.w[3]);
        if (m.w[4] > pe.bytes_received) {
          bytes_received.fetch_add(m.w[4] - pe.bytes_received);
          pe.bytes_received = m.w[4];
        }
      } else if (m.w[0] > pe.delivered) {
        RxOp& op = pe.early[m.w[0]];
        op.need_signal = op.got_signal = true;
        op.need_payload = op.need_payload || (m.flags & wire::kHasPayload);
        op.key = m.w[1];
        op.offset = m.w[2];
        op.value = m.w[3];
        op.bytes_through = m.w[4];
        advance(g, p);
      }
      break;
    case wire::kQuery: on_query(g, p, m); break;
    case wire::kRegion:
      pe.answers[m.w[0]] = {m.flags != 0, RemoteRegion{m.w[2], m.w[3], m.w[4]}};
      g.cv.notify_all();
      break;
    case wire::kViolation: {
      std::string why;
      {
        std::shared_lock<std::shared_mutex> rl(reg_mu_);
        if (check_write(regions_, m.w[1], m.w[2], m.w[3], 0, 0, &why)) {
          why = "reported an invalid write to region " + hex(m.w[1]);
        }
      }
      g.fail_locked(p, g.who(p) + " " + why);
      break;
    }
    case wire::kRefused:
      g.fail_locked(p, g.who(p) + " refused our " + (m.flags == wire::kRefusedSignal ? "signal" : "write") +
                           ": its error names the check that failed");
      break;
    case wire::kAck:
    case wire::kHeartbeat:
      pe.acked = std::max(pe.acked, m.w[0]);
      g.cv.notify_all();
      break;
    case wire::kBye:
      pe.bye_seen = true;
      pe.bye_ops = m.w[0];
      pe.bye_signals = m.w[1];
      pe.bye_bytes = m.w[2];
      if (pe.state == PeerState::kConnected) pe.state = PeerState::kClosed;
      advance(g, p);
      g.cv.notify_all();
      break;
    case wire::kAbort:
      if (g.phase == Phase::kConnecting) {
        g.lose_locked(p);
      } else if (g.aborted || pe.bye_seen) {
        if (pe.state == PeerState::kConnected) pe.state = PeerState::kClosed;
      } else {
        g.fail_locked(p, g.who(p) + " closed the connection");
      }
      g.cv.notify_all();
      break;
    default: break;
  }
}

void Core::on_query(GroupState& g, int p, const wire::Msg& m) {
  wire::Msg a{};
  a.kind = wire::kRegion;
  a.w[0] = m.w[0];
  a.w[1] = m.w[1];
  std::string why;
  {
    std::shared_lock<std::shared_mutex> rl(reg_mu_);
    if (check_write(regions_, m.w[1], m.w[2], m.w[3], m.w[4], m.w[5], &why)) {
      const Registration& reg = registrations_.at(m.w[1]);
      a.flags = 1;
      a.w[2] = caps_.virt_addr ? reinterpret_cast<uintptr_t>(reg.region.base) : 0;
      a.w[3] = reg.mrs[g.rail].key;
      a.w[4] = reg.region.bytes;
    }
  }
  if (!a.flags) g.fail_locked(p, g.who(p) + " " + why);  // as a socket receiver refuses a header
  g.send_locked(p, a, true);
}

void Core::apply_signal(GroupState& g, int p, uint64_t key, uint64_t offset, uint64_t value) {
  std::string why;
  {
    std::shared_lock<std::shared_mutex> rl(reg_mu_);
    if (check_write(regions_, 0, 0, 0, key, offset, &why)) {
      store_max_release(static_cast<char*>(regions_.at(key).base) + offset, value);
      return;
    }
  }
  if (g.peers[p].state != PeerState::kConnected) return;
  g.fail_locked(p, g.who(p) + " " + why);
  wire::Msg r{};
  r.kind = wire::kRefused;
  r.flags = wire::kRefusedSignal;
  g.send_locked(p, r, false);
}

void Core::on_payload(int rail, uint64_t data) {
  std::shared_ptr<GroupState> gp;
  int p = -1;
  {
    std::lock_guard<std::mutex> l(streams_mu_);
    const uint32_t id = layout_.stream_of(data);
    if (id == 0 || id >= streams_.size() || !streams_[id].used) return;  // a late arrival
    gp = streams_[id].group.lock();
    p = streams_[id].peer;
  }
  if (!gp) return;
  GroupState& g = *gp;
  std::lock_guard<std::mutex> l(g.mu);
  if (g.phase == Phase::kDone) return;
  Peer& pe = g.peers[p];
  pe.last_heard = Clock::now();
  busy_poll_[rail]->open();
  const uint64_t seq = layout_.seq_of(data, pe.delivered + 1);
  if (seq - pe.delivered > 2 * layout_.window()) {
    g.fail_locked(p, g.who(p) + " wrote past its window (op " + std::to_string(seq) + ", " +
                         std::to_string(pe.delivered) + " delivered)");
    return;
  }
  RxOp& op = pe.early[seq];
  op.need_payload = op.got_payload = true;
  op.need_signal = op.need_signal || layout_.has_signal(data);
  advance(g, p);
}

void Core::advance(GroupState& g, int p) {
  Peer& pe = g.peers[p];
  auto it = pe.early.begin();
  while (it != pe.early.end() && it->first == pe.delivered + 1) {
    const RxOp& op = it->second;
    if (op.need_payload != op.got_payload || op.need_signal != op.got_signal) break;
    if (op.got_signal) {
      apply_signal(g, p, op.key, op.offset, op.value);
      if (op.bytes_through > pe.bytes_received) {
        bytes_received.fetch_add(op.bytes_through - pe.bytes_received);
        pe.bytes_received = op.bytes_through;
      }
    }
    pe.delivered++;
    it = pe.early.erase(it);
  }
  if (pe.drained() && pe.bye_bytes > pe.bytes_received) {
    bytes_received.fetch_add(pe.bye_bytes - pe.bytes_received);
    pe.bytes_received = pe.bye_bytes;
  }
  // Return how far ops have arrived often enough that the writer's window never closes on a
  // healthy pair (heartbeats carry it too).
  if (pe.delivered - pe.ack_sent >= layout_.window() / 4 && pe.state == PeerState::kConnected) {
    pe.ack_sent = pe.delivered;
    wire::Msg a{};
    a.kind = wire::kAck;
    a.w[0] = pe.delivered;
    g.send_locked(p, a, false);
  }
  g.cv.notify_all();
}

}  // namespace fusedcomm::rdma::libfabric
