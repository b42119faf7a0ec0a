// Both halves of the handshake over messages: the socket backend's handshake messages and checks
// (../socket/handshake.h, the proofs of auth.h), carried in kHandshake messages and matched to
// their exchange by its nonces (wire.h). Replies go only to the published address of the rank a
// message claims to come from.
#include <algorithm>
#include <cstring>

#include "core.h"

namespace fusedcomm::rdma::libfabric {
namespace {

namespace hs = socket_backend::handshake;

bool same(const uint8_t* a, const auth::Nonce& b) { return auth::equal(a, b.data(), b.size()); }

auth::Nonce nonce_of(const uint8_t* p) {
  auth::Nonce n;
  std::memcpy(n.data(), p, n.size());
  return n;
}

// The pair's session tag (wire.h): both sides know K, Nd and Na once the proofs are exchanged.
uint64_t session_of(const auth::Key& key, const auth::Nonce& nd, const auth::Nonce& na) {
  static const char kLabel[] = "fusedcomm libfabric session v1";
  auth::HmacSha256 mac(key.data(), key.size());
  mac.update(kLabel, sizeof kLabel - 1);
  mac.update(nd.data(), nd.size());
  mac.update(na.data(), na.size());
  const auth::Digest d = mac.finish();
  uint64_t s;
  std::memcpy(&s, d.data(), sizeof s);
  return s ? s : 1;
}

}  // namespace

void Core::send_handshake(GroupState& g, int to, const rdma::wire::WireHandshake& h, const auth::Nonce& nd,
                          const auth::Nonce& na, uint32_t stream) {
  wire::Msg m{};
  m.magic = wire::kMsgMagic;
  m.kind = wire::kHandshake;
  m.comm_id = g.comm_id;
  m.rank = g.rank;
  m.target = to;
  m.stream = stream;
  std::memcpy(m.dialer_nonce, nd.data(), nd.size());
  std::memcpy(m.acceptor_nonce, na.data(), na.size());
  m.hs = h;
  rails_[g.rail]->send(g.peers[to].addr, m, g.weak_from_this(), to, false);
}

void Core::park(int rail, const wire::Msg& m) {
  std::lock_guard<std::mutex> l(hs_mu_);
  // A dialer repeats its hello: keep its latest only.
  std::erase_if(parked_, [&](const Parked& p) {
    return p.rail == rail && p.msg.comm_id == m.comm_id && p.msg.rank == m.rank;
  });
  if (parked_.size() >= kMaxParked) parked_.pop_front();  // the oldest makes room
  parked_.push_back({rail, m, Clock::now()});
}

std::vector<wire::Msg> Core::unpark(int rail, uint64_t comm_id) {
  std::vector<wire::Msg> out;
  std::lock_guard<std::mutex> l(hs_mu_);
  for (auto it = parked_.begin(); it != parked_.end();) {
    if (it->rail == rail && it->msg.comm_id == comm_id) {
      out.push_back(it->msg);
      it = parked_.erase(it);
    } else {
      ++it;
    }
  }
  return out;
}

void Core::on_handshake(int rail, const wire::Msg& m) {
  const rdma::wire::WireHandshake& h = m.hs;
  // The outer header must say what the handshake message says.
  if (h.magic != rdma::wire::kHelloMagic || m.comm_id != h.comm_id || m.rank != h.rank ||
      m.target != h.target_rank) {
    return;
  }
  std::shared_ptr<GroupState> g = group(m.comm_id);
  if (g && g->rail != rail) return;
  if (h.kind == rdma::wire::kHello) {
    const hs::Check first = hs::check_hello(h);
    if (first.verdict == hs::Verdict::kDrop) return;
    if (!g) {
      if (first.verdict == hs::Verdict::kOk) park(rail, m);  // its group may connect here soon
      return;
    }
    on_hello(g, m);
    return;
  }
  if (!g) return;
  // The dialer is the higher rank: its messages (proof, or its refusal of our challenge) go to
  // the acceptor's half, the acceptor's (challenge, accept, reject) to the dialer's.
  if (m.rank > m.target) {
    on_proof(*g, m);
  } else {
    on_dial_reply(*g, m);
  }
}

void Core::on_hello(const std::shared_ptr<GroupState>& gp, const wire::Msg& m) {
  GroupState& g = *gp;
  const rdma::wire::WireHandshake& h = m.hs;
  std::lock_guard<std::mutex> l(g.mu);
  if (g.phase != Phase::kConnecting || g.aborted) return;
  hs::Check check = hs::check_hello(h);
  if (check.verdict == hs::Verdict::kOk) check = hs::check_hello_for(h, g.side());
  const bool known = h.rank >= 0 && h.rank < g.world && h.rank != g.rank;
  if (check.verdict != hs::Verdict::kOk) {
    if (known)
      send_handshake(g, h.rank, hs::reject(h, g.rank, check.reason), nonce_of(m.dialer_nonce), {}, 0);
    return;
  }
  Peer& pe = g.peers[h.rank];
  if (pe.up) return;  // already authenticated: a stale repeat, or a stranger
  const auth::Nonce nd = nonce_of(h.nonce);
  for (const Peer::Challenge& c : pe.challenges) {
    if (same(c.hello.nonce, nd)) {
      // The dialer repeated its hello: the same challenge again (its nonce is unchanged).
      send_handshake(g, h.rank, c.sent, nd, nonce_of(c.sent.nonce), pe.in_stream);
      return;
    }
  }
  Peer::Challenge c;
  c.hello = h;
  try {
    c.sent = hs::challenge(h, g.side(), auth::random_nonce());
  } catch (const std::exception&) {
    return;  // no randomness: this hello cannot be answered; the dialer repeats it
  }
  c.dialer_stream = m.stream;
  c.at = Clock::now();
  if (pe.challenges.size() >= kChallengesPerPeer) pe.challenges.erase(pe.challenges.begin());
  pe.challenges.push_back(c);
  send_handshake(g, h.rank, c.sent, nd, nonce_of(c.sent.nonce), pe.in_stream);
}

void Core::on_proof(GroupState& g, const wire::Msg& m) {
  const rdma::wire::WireHandshake& h = m.hs;
  std::lock_guard<std::mutex> l(g.mu);
  if (g.phase != Phase::kConnecting || g.aborted || m.rank >= g.world || m.target != g.rank) return;
  Peer& pe = g.peers[m.rank];
  auto it = std::find_if(pe.challenges.begin(), pe.challenges.end(), [&](const Peer::Challenge& c) {
    return same(m.dialer_nonce, nonce_of(c.hello.nonce)) && same(m.acceptor_nonce, nonce_of(c.sent.nonce));
  });
  if (it == pe.challenges.end() || pe.up) return;  // not an answer to a challenge of ours
  const Peer::Challenge c = *it;
  pe.challenges.erase(it);
  const auth::Nonce nd = nonce_of(c.hello.nonce), na = nonce_of(c.sent.nonce);
  const hs::Check check = hs::check_proof(h, c.hello, c.sent, g.side());
  if (check.verdict != hs::Verdict::kOk) {
    if (check.verdict == hs::Verdict::kReject) {
      pe.refused =
          "a dial claiming to be it failed authentication (it does not hold this communicator's key)";
      send_handshake(g, m.rank, hs::reject(c.hello, g.rank, check.reason), nd, na, 0);
    } else if (h.kind == rdma::wire::kReject) {
      pe.refused = std::string("it refused our challenge: ") + rdma::wire::reject_text(h.reason);
    }
    return;
  }
  pe.up = true;
  pe.state = PeerState::kConnected;
  pe.error.clear();
  pe.session = session_of(g.key, nd, na);
  pe.out_stream = c.dialer_stream;
  pe.last_heard = pe.last_sent = Clock::now();
  pe.lost = false;
  pe.refused.clear();
  pe.challenges.clear();
  g.connected++;
  open_connections.fetch_add(1);
  send_handshake(g, m.rank, hs::accept(c.hello, g.side()), nd, na, pe.in_stream);
  g.cv.notify_all();
}

void Core::on_dial_reply(GroupState& g, const wire::Msg& m) {
  const rdma::wire::WireHandshake& h = m.hs;
  std::lock_guard<std::mutex> l(g.mu);
  if (g.phase != Phase::kConnecting || g.aborted || m.rank < 0 || m.rank >= g.rank || m.target != g.rank) {
    return;
  }
  const int to = m.rank;
  Peer& pe = g.peers[to];
  Peer::Dial& d = pe.dial;
  if (!same(m.dialer_nonce, d.nd)) return;  // not an answer to our current dial
  auto give_up = [&](const hs::Check& check) {
    g.dial_failed = to;
    g.dial_failure = g.self() + ": " + g.who(to) + " " + check.why;
    d.stage = Peer::Dial::kDone;
    g.cv.notify_all();
  };
  if (d.stage == Peer::Dial::kAwaitChallenge) {
    const hs::Check check = hs::check_challenge(h, d.hello, to, g.side());
    if (check.verdict == hs::Verdict::kRetry) {
      d.last_error = check.why;
      return;
    }
    if (check.verdict != hs::Verdict::kOk) {
      if (check.reason == rdma::wire::kBadAuth && h.kind == rdma::wire::kChallenge) {
        // Tell the acceptor why, so that its own error can say so.
        send_handshake(g, to, hs::reject(h, g.rank, rdma::wire::kBadAuth), d.nd, nonce_of(h.nonce), 0);
      }
      give_up(check);
      return;
    }
    d.na = nonce_of(h.nonce);
    pe.session = session_of(g.key, d.nd, d.na);
    pe.out_stream = m.stream;
    d.stage = Peer::Dial::kAwaitAccept;
    d.sent_at = Clock::now();
    d.last_error = "it proved the key but has not accepted our proof";
    send_handshake(g, to, hs::proof(d.hello, h, g.side()), d.nd, d.na, pe.in_stream);
    return;
  }
  if (d.stage != Peer::Dial::kAwaitAccept || !same(m.acceptor_nonce, d.na)) return;
  const hs::Check check = hs::check_accept(h, to, g.side());
  if (check.verdict == hs::Verdict::kRetry) {
    d.last_error = check.why;
    d.stage = Peer::Dial::kIdle;  // connect() dials again
    pe.session = 0;
    return;
  }
  if (check.verdict != hs::Verdict::kOk) {
    give_up(check);
    return;
  }
  d.stage = Peer::Dial::kDone;
  pe.up = true;
  pe.state = PeerState::kConnected;
  pe.error.clear();
  pe.lost = false;
  pe.last_heard = pe.last_sent = Clock::now();
  g.connected++;
  open_connections.fetch_add(1);
  g.cv.notify_all();
}

}  // namespace fusedcomm::rdma::libfabric
