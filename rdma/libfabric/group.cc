// A group's peer states, its messages, and its end: close() (drain, kBye both ways, bounded),
// abort() (kAbort, now) and release() (streams and counts given back).
#include "core.h"

namespace fusedcomm::rdma::libfabric {

void GroupState::fail_locked(int r, const std::string& msg) {
  Peer& p = peers[r];
  if (p.state != PeerState::kConnected) return;
  p.state = PeerState::kFailed;
  p.error = msg;
  if (failed_peer < 0) {
    failed_peer = r;
    failed_msg = msg;
  }
  cv.notify_all();
}

void GroupState::lose_locked(int r) {
  Peer& p = peers[r];
  if (p.up) {
    p.up = false;
    connected--;
    core->open_connections.fetch_sub(1);
  }
  p.lost = true;
  p.session = 0;
  p.state = PeerState::kConnected;
  p.challenges.clear();
  if (r < rank) p.dial.stage = Peer::Dial::kIdle;  // connect() dials it again
  cv.notify_all();
}

void GroupState::check() const {
  std::lock_guard<std::mutex> l(mu);
  if (failed_peer >= 0) throw TransportError(failed_peer, failed_msg);
}

PeerState GroupState::status(int r) const {
  if (r < 0 || r >= world) throw std::invalid_argument("status: peer out of range");
  if (r == rank) return aborted ? PeerState::kClosed : PeerState::kConnected;
  std::lock_guard<std::mutex> l(mu);
  if (phase == Phase::kDone || !peers[r].up) return PeerState::kClosed;
  return peers[r].state;
}

void GroupState::send(int r, wire::Msg m, bool counted) {
  std::lock_guard<std::mutex> l(mu);
  send_locked(r, m, counted);
}

void GroupState::send_locked(int r, wire::Msg m, bool counted) {
  Peer& p = peers[r];
  m.magic = wire::kMsgMagic;
  m.comm_id = comm_id;
  m.rank = rank;
  m.target = r;
  m.session = p.session;
  p.last_sent = Clock::now();
  if (counted) outstanding.fetch_add(1);
  if (!core->rail(rail).send(p.addr, m, weak_from_this(), r, counted) && counted) outstanding.fetch_sub(1);
}

void GroupState::close(milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  {
    std::lock_guard<std::mutex> l(mu);
    if (phase == Phase::kDone) return;
    if (!aborted) phase = Phase::kClosing;
  }
  if (!aborted) {
    // What this rank posted reaches its peers before it says goodbye.
    progress_until([&] { return outstanding.load() == 0; }, deadline);
    {
      std::lock_guard<std::mutex> l(mu);
      for (int r = 0; r < world; ++r) {
        Peer& p = peers[r];
        if (r == rank || !p.up || p.state == PeerState::kFailed) continue;
        wire::Msg bye{};
        bye.kind = wire::kBye;
        bye.w[0] = p.next_seq;
        bye.w[1] = p.signals_sent;
        bye.w[2] = p.bytes_sent;
        send_locked(r, bye, true);
      }
    }
    // Every peer's kBye, and everything it sent before, has arrived (or it failed); our own
    // kBye has left.
    progress_until(
        [&] {
          for (int r = 0; r < world; ++r) {
            const Peer& p = peers[r];
            if (r != rank && p.up && p.state != PeerState::kFailed && !p.drained()) return false;
          }
          return outstanding.load() == 0;
        },
        deadline);
  }
  release();
}

void GroupState::abort() {
  if (aborted.exchange(true)) return;
  {
    std::lock_guard<std::mutex> l(mu);
    for (int r = 0; r < world; ++r) {
      Peer& p = peers[r];
      if (r == rank || !p.up) continue;
      if (p.state == PeerState::kConnected) p.state = PeerState::kClosed;
      if (phase != Phase::kDone) {
        wire::Msg m{};
        m.kind = wire::kAbort;
        send_locked(r, m, false);  // the peer learns at once instead of by silence
      }
    }
    cv.notify_all();
  }
  release();
}

void GroupState::release() {
  std::vector<uint32_t> streams;
  {
    std::lock_guard<std::mutex> l(mu);
    if (phase == Phase::kDone) return;
    phase = Phase::kDone;
    for (int r = 0; r < world; ++r) {
      Peer& p = peers[r];
      if (p.up) {
        core->open_connections.fetch_sub(1);
        p.up = false;
        if (p.state == PeerState::kConnected) p.state = PeerState::kClosed;
      }
      p.challenges.clear();
      streams.push_back(p.in_stream);
      p.in_stream = 0;
    }
    connected = 0;
    cv.notify_all();
  }
  for (uint32_t id : streams) core->free_stream(id);
  core->forget_group(this);
}

}  // namespace fusedcomm::rdma::libfabric
