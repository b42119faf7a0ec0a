// connect(): building a group. The peers' published addresses go into the rail's address
// vector, the caller's thread dials the lower ranks (a hello, repeated until it is challenged)
// and progresses the rail while the handshakes run (handshake.cc); it returns once every pair
// is authenticated, or throws naming the rank that failed or is missing.
#include "core.h"

#include <unistd.h>

namespace fusedcomm::rdma::libfabric {
namespace {

// shm (libfabric 1.17) crashes in fi_av_insert when the peer's shared-memory region is gone (its
// process ended, or its transport was destroyed): a name "fi_shm://X" whose /dev/shm/X is
// missing is refused before it gets there. Names of another shape are left to the provider.
bool shm_peer_gone(const std::string& provider, const std::string& raw) {
  static const std::string kScheme = "fi_shm://";
  if (provider != "shm" || raw.compare(0, kScheme.size(), kScheme) != 0) return false;
  const std::string region = raw.substr(kScheme.size(), raw.find('\0') - kScheme.size());
  return region.find('/') == std::string::npos && ::access(("/dev/shm/" + region).c_str(), F_OK) != 0;
}

}  // namespace

void Core::start_dial(GroupState& g, int to) {
  Peer& pe = g.peers[to];
  Peer::Dial& d = pe.dial;
  d.nd = auth::random_nonce();
  d.hello = socket_backend::handshake::hello(g.side(), to, d.nd);
  d.stage = Peer::Dial::kAwaitChallenge;
  d.sent_at = Clock::now();
  pe.session = 0;
  send_handshake(g, to, d.hello, d.nd, {}, pe.in_stream);
}

std::shared_ptr<GroupState> Core::connect(const GroupSpec& spec) {
  check_group_spec(spec);
  auto g = std::make_shared<GroupState>();
  g->core = shared_from_this();
  g->key = spec.key;
  g->comm_id = spec.comm_id;
  g->rank = spec.rank;
  g->world = spec.world;
  const int nic = static_cast<int>(spec.lane % nics_);
  const uint32_t slot = one_way_ ? 2 * (spec.lane / nics_) + spec.direction : spec.lane / nics_;
  const int own = static_cast<int>(slot % stripes_);
  for (int s = 0; s < stripes_; ++s) g->endpoints.push_back(nic * stripes_ + (own + s) % stripes_);
  g->rail = g->endpoints[0];
  g->addresses = spec.addresses;
  g->addresses.resize(spec.world);
  g->peers.resize(spec.world);
  if (spec.world == 1) {
    g->phase = Phase::kLive;
    return g;
  }
  if (!running_) throw TransportError(-1, "libfabric transport is shut down");
  for (int r = 0; r < spec.world; ++r) {
    if (r == spec.rank) continue;
    // Only the addresses of the bootstrap ever enter the address vectors.
    for (int e : g->endpoints) {
      const std::string name = peer_name(spec.addresses[r], r, e);
      if (shm_peer_gone(caps_.provider, name)) {
        throw ConnectTimeout(
            r, g->self() + " (world " + std::to_string(spec.world) + "): missing rank " + std::to_string(r) +
                   " at " + spec.addresses[r] +
                   " (its shared-memory endpoint is gone: the process ended or closed its transport)");
      }
      g->peers[r].stripe_addr.push_back(rails_[e]->insert(name));
    }
    g->peers[r].addr = g->peers[r].stripe_addr[0];
  }
  bool ok = false;
  struct Cleanup {  // undo everything if we leave by an exception
    GroupState* g;
    bool* ok;
    ~Cleanup() {
      if (!*ok) g->abort();
    }
  } cleanup{g.get(), &ok};
  // The streams exist before the group can be found: a challenge names ours.
  for (int r = 0; r < spec.world; ++r) {
    if (r != spec.rank) g->peers[r].in_stream = alloc_stream(g, r);
  }
  {
    std::lock_guard<std::mutex> l(groups_mu_);
    auto it = groups_.find(spec.comm_id);
    if (it != groups_.end() && !it->second.expired()) {
      throw TransportError(
          -1, "connect: communicator " + hex(spec.comm_id) + " is already open on this transport");
    }
    groups_[spec.comm_id] = g;
  }
  {
    std::lock_guard<std::mutex> l(g->mu);
    for (int r = 0; r < spec.rank; ++r) start_dial(*g, r);
  }
  for (const wire::Msg& m : unpark(g->rail, spec.comm_id)) on_hello(g, m);  // hellos that came early

  const auto start = Clock::now();
  const auto deadline = start + spec.connect_timeout;
  auto cancelled = [&] { return g->aborted.load() || (spec.cancel != nullptr && spec.cancel->load()); };
  while (true) {
    {
      std::lock_guard<std::mutex> l(g->mu);
      if (g->dial_failed >= 0) throw TransportError(g->dial_failed, g->dial_failure);
      if (g->connected == spec.world - 1) break;
      const auto now = Clock::now();
      for (int r = 0; r < spec.rank; ++r) {
        Peer::Dial& d = g->peers[r].dial;
        const bool repeat = d.stage == Peer::Dial::kAwaitChallenge && now - d.sent_at >= kHelloRetry;
        if (repeat) {
          // Same nonce: a challenge to an earlier copy still answers this dial.
          d.sent_at = now;
          send_handshake(*g, r, d.hello, d.nd, {}, g->peers[r].in_stream);
        } else if (d.stage == Peer::Dial::kIdle ||
                   (d.stage == Peer::Dial::kAwaitAccept && now - d.sent_at > kHandshakeTimeout)) {
          start_dial(*g, r);
        }
      }
    }
    if (cancelled()) throw TransportError(-1, g->self() + ": connect was aborted");
    if (Clock::now() >= deadline) break;
    const auto slice = std::min<Clock::time_point>(deadline, Clock::now() + milliseconds(5));
    g->progress_until([&] { return g->connected == spec.world - 1 || g->dial_failed >= 0; }, slice);
  }
  std::unique_lock<std::mutex> l(g->mu);
  if (g->connected != spec.world - 1) {
    const std::string msg = timeout_message(*g, spec, start);
    int first = -1;
    for (int r = 0; r < spec.world && first < 0; ++r) {
      if (r != spec.rank && !g->peers[r].up && !g->peers[r].lost) first = r;
    }
    for (int r = 0; r < spec.world && first < 0; ++r) {
      if (r != spec.rank && !g->peers[r].up) first = r;
    }
    l.unlock();
    throw ConnectTimeout(first, msg);
  }
  g->phase = Phase::kLive;
  ok = true;
  return g;
}

// Ranks that never connected come first: a rank that did connect and then left has most
// likely given up on the same missing ranks.
std::string Core::timeout_message(const GroupState& g, const GroupSpec& spec, Clock::time_point start) const {
  std::string missing, lost;
  for (int r = 0; r < spec.world; ++r) {
    const Peer& pe = g.peers[r];
    if (r == spec.rank || pe.up) continue;
    const std::string who = "rank " + std::to_string(r) + " at " + spec.addresses[r];
    if (pe.lost) {
      lost += "; " + who + " (connected, then closed the connection; did it time out too?)";
      continue;
    }
    std::string why = r < spec.rank ? pe.dial.last_error : std::string("it never connected to us");
    if (r > spec.rank && !pe.refused.empty()) why = "no authenticated connection from it; " + pe.refused;
    missing += (missing.empty() ? "" : "; ") + who + " (" + why + ")";
  }
  missing = missing.empty() ? lost.substr(std::min<size_t>(2, lost.size())) : missing + lost;
  const auto ms = std::chrono::duration_cast<milliseconds>(Clock::now() - start).count();
  return g.self() + " (world " + std::to_string(spec.world) + "): connect timed out after " +
         std::to_string(ms) + " ms; missing " + missing;
}

}  // namespace fusedcomm::rdma::libfabric
