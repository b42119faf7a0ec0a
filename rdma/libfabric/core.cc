// Core: choosing the provider and its rails, the progress threads, liveness, and shutdown.
#include "core.h"

#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <random>
#include <set>

#include "../socket/net.h"
#include "../src/thread_name.h"

namespace fusedcomm::rdma::libfabric {
namespace {

std::string hex_bytes(const std::string& raw) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  for (unsigned char c : raw) {
    s += digits[c >> 4];
    s += digits[c & 15];
  }
  return s;
}

bool unhex(const std::string& text, std::string* raw) {
  if (text.empty() || text.size() % 2) return false;
  raw->clear();
  for (size_t i = 0; i < text.size(); i += 2) {
    int v = 0;
    for (char c : {text[i], text[i + 1]}) {
      const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
      if (d < 0) return false;
      v = v * 16 + d;
    }
    raw->push_back(static_cast<char>(v));
  }
  return true;
}

std::string address_prefix(const std::string& provider) { return "ofi:" + provider + ":"; }

}  // namespace

// ---- construction ---------------------------------------------------------------------------

Core::Core(const LibfabricOptions& o) : options_(o), api_(FabricApi::get(o.library)) {
  const std::string unavailable = "libfabric transport is unavailable: ";
  if (!api_.ok()) throw TransportError(-1, unavailable + api_.error);
  if (o.rails < 1) throw std::invalid_argument("libfabric transport: rails must be at least 1");
  // A peer misses several heartbeats before its silence fails it, whatever the timeout.
  options_.heartbeat = std::min(o.heartbeat, o.peer_timeout / 5);
  if (o.stripes < 0 || o.stripes > kMaxStripes)
    throw std::invalid_argument("libfabric transport: stripes must be 0 (the provider's default) to " +
                                std::to_string(kMaxStripes));
  LibfabricProvider provider = o.provider;
  const std::string node = o.bind_host.empty() ? socket_backend::primary_host_address() : o.bind_host;
  std::string why;
  if (provider == LibfabricProvider::kAuto) {
    provider = pick_provider(api_, node, &why);
    if (provider == LibfabricProvider::kAuto)
      throw TransportError(-1, unavailable + "no provider answers: " + why);
  }
  InfoPtr infos = find_provider(api_, provider, node, &why);
  if (!infos) throw TransportError(-1, unavailable + libfabric_provider_name(provider) + ": " + why);
  // One rail per NIC: the first entry of each distinct domain, in the provider's order.
  std::vector<const fi_info*> picked;
  std::set<std::string> domains;
  std::string seen;
  for (const fi_info* i = infos.get(); i; i = i->next) {
    const Caps c = caps_of(*i);
    if (!domains.insert(c.domain).second) continue;
    seen += (seen.empty() ? "" : ", ") + c.domain;
    if (static_cast<int>(picked.size()) < o.rails) picked.push_back(i);
  }
  if (static_cast<int>(picked.size()) < o.rails) {
    throw TransportError(-1, unavailable + caps_of(*infos).provider + " offers " +
                                 std::to_string(domains.size()) + " NIC(s) (" + seen + "), fewer than the " +
                                 std::to_string(o.rails) + " rails asked for");
  }
  // Endpoints per NIC: TCP moves each stream with one core's copies (sending and receiving), so
  // tcp stripes large writes over two endpoints, each progressed by its own thread, and with
  // one_way_lanes gives each lane an endpoint each way (GroupSpec::direction); an RDMA
  // NIC places the bytes itself. Stripes share remote keys, which the provider must let us
  // choose.
  const Caps first = caps_of(*picked[0]);
  one_way_ = o.one_way_lanes > 0;
  stripes_ = o.stripes ? o.stripes
             : provider == LibfabricProvider::kTcp && !first.prov_key
                 ? (one_way_ ? std::min(kMaxStripes, 2 * o.one_way_lanes) : 2)
                 : 1;
  if (stripes_ > 1 && first.prov_key) {
    throw TransportError(-1, unavailable + first.provider +
                                 " chooses its own remote keys (FI_MR_PROV_KEY): " +
                                 "one endpoint per rail only (stripes " + std::to_string(stripes_) + ")");
  }
  nics_ = static_cast<int>(picked.size());
  for (int r = 0; r < nics_; ++r) {
    for (int s = 0; s < stripes_; ++s) {
      rails_.push_back(std::make_unique<Rail>(api_, *picked[r], r * stripes_ + s));
    }
  }
  caps_ = rails_[0]->caps();
  caps_.hmem = hmem_offered(api_, caps_.provider, provider == LibfabricProvider::kTcp ? node : "");
  plan_ = plan_for(caps_, o.signal);
  cq_data_ = plan_.cq_data;
  layout_ = plan_.layout;
  streams_.resize(size_t{layout_.max_stream()} + 1);

  address_ = address_prefix(caps_.provider);
  for (size_t r = 0; r < rails_.size(); ++r) {
    if (r) address_ += ',';
    address_ += hex_bytes(rails_[r]->name());
  }

  std::random_device rd;
  key_salt_ = (static_cast<uint64_t>(rd()) & 0xffffffull) << 40;

  running_ = true;
  for (size_t r = 0; r < rails_.size(); ++r) {
    wake_fds_.push_back(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
    sleeping_.push_back(std::make_unique<std::atomic<bool>>(false));
    busy_poll_.push_back(std::make_unique<BusyPollWindow>(o.busy_poll));
    driven_.push_back(std::make_unique<std::atomic<int>>(0));
    aside_.push_back(std::make_unique<std::atomic<bool>>(false));
    caught_up_.push_back(std::make_unique<std::atomic<int64_t>>(Clock::now().time_since_epoch().count()));
  }
  housekept_.assign(rails_.size(), Clock::now());
  deaf_until_.assign(rails_.size(), Clock::now());
  for (size_t r = 0; r < rails_.size(); ++r) {
    threads_.emplace_back([this, r] {
      name_this_thread("fc-ofi-ep" + std::to_string(r));
      run(static_cast<int>(r));
    });
  }
}

Core::~Core() { shutdown(); }

void Core::shutdown() {
  if (!running_.exchange(false)) return;
  for (size_t r = 0; r < threads_.size(); ++r) {
    const uint64_t one = 1;
    ssize_t w = ::write(wake_fds_[r], &one, sizeof one);
    (void)w;
  }
  for (auto& t : threads_) t.join();
  std::vector<std::shared_ptr<GroupState>> live;
  {
    std::lock_guard<std::mutex> l(groups_mu_);
    for (auto& [id, w] : groups_) {
      if (auto g = w.lock()) live.push_back(g);
    }
  }
  for (auto& g : live) g->abort();
  {
    // Registrations go before their domains: a domain with registrations does not close.
    std::unique_lock<std::shared_mutex> l(reg_mu_);
    for (auto& [key, reg] : registrations_) {
      for (size_t i = 0; i < reg.mrs.size(); ++i) rails_[i]->deregister(reg.mrs[i]);
    }
    registrations_.clear();
    regions_.clear();
    registered_bytes_ = 0;
  }
  for (auto& rail : rails_) rail->close();
  for (int fd : wake_fds_) ::close(fd);
  wake_fds_.clear();
}

std::string Core::describe() const {
  std::string domains;
  for (size_t r = 0; r < rails_.size(); r += stripes_) {
    domains += (domains.empty() ? "" : "+") + rails_[r]->caps().domain;
  }
  return "libfabric " + caps_.provider + " on " + domains + " (" + std::to_string(nics_) +
         (nics_ == 1 ? " rail" : " rails") + ", " + std::to_string(stripes_) +
         (stripes_ == 1 ? " endpoint" : " endpoints") + " per rail; " + describe_plan(caps_, plan_) +
         "; peer timeout " + std::to_string(options_.peer_timeout.count()) + " ms)";
}

std::string Core::peer_name(const std::string& address, int r, int rail) const {
  const std::string prefix = address_prefix(caps_.provider);
  auto refuse = [&](const std::string& what) -> TransportError {
    return TransportError(r, "connect: the address of rank " + std::to_string(r) + " ('" +
                                 address.substr(0, 120) + "') " + what +
                                 " (every executor must use the same transport, provider and rails)");
  };
  if (address.compare(0, prefix.size(), prefix) != 0)
    throw refuse("is not a libfabric " + caps_.provider + " endpoint");
  std::vector<std::string> parts;
  size_t start = prefix.size();
  while (true) {
    const size_t comma = address.find(',', start);
    parts.push_back(address.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (parts.size() != rails_.size()) {
    throw refuse("names " + std::to_string(parts.size()) + " endpoint(s), this transport has " +
                 std::to_string(rails_.size()) + " (" + std::to_string(nics_) + " rail(s) of " +
                 std::to_string(stripes_) + ")");
  }
  std::string raw;
  if (!unhex(parts[rail], &raw)) throw refuse("is malformed");
  return raw;
}

// ---- groups and streams ---------------------------------------------------------------------

std::shared_ptr<GroupState> Core::group(uint64_t comm_id) const {
  std::lock_guard<std::mutex> l(groups_mu_);
  auto it = groups_.find(comm_id);
  return it == groups_.end() ? nullptr : it->second.lock();
}

void Core::forget_group(const GroupState* g) {
  std::lock_guard<std::mutex> l(groups_mu_);
  auto it = groups_.find(g->comm_id);
  if (it == groups_.end()) return;
  auto cur = it->second.lock();
  if (!cur || cur.get() == g) groups_.erase(it);
}

uint32_t Core::alloc_stream(const std::shared_ptr<GroupState>& g, int peer) {
  // Round robin: an id comes back into use only after every other one did, long after the
  // last late arrival of an aborted group.
  std::lock_guard<std::mutex> l(streams_mu_);
  const uint32_t n = static_cast<uint32_t>(streams_.size());
  for (uint32_t tried = 0; tried + 1 < n; ++tried) {
    const uint32_t id = next_stream_;
    next_stream_ = next_stream_ + 1 < n ? next_stream_ + 1 : 1;
    if (!streams_[id].used) {
      streams_[id] = {g, peer, true};
      return id;
    }
  }
  throw TransportError(-1, "libfabric transport: all " + std::to_string(n - 1) +
                               " receive streams are in use (too many groups at once)");
}

void Core::free_stream(uint32_t id) {
  if (id == 0) return;
  std::lock_guard<std::mutex> l(streams_mu_);
  streams_[id] = {};
}

// ---- progress -------------------------------------------------------------------------------

int Core::progress(int i) {
  std::vector<Event> events;
  const auto start = Clock::now();
  const int n = rails_[i]->poll(&events, kPollBatch);
  // Fewer than a batch: the queue was read to empty, so everything sent before `start` is seen
  // once these are handled.
  if (n < kPollBatch) caught_up_[i]->store(start.time_since_epoch().count(), std::memory_order_relaxed);
  for (Event& e : events) handle(i, e);
  return n + static_cast<int>(events.size());
}

void Core::handle(int rail, Event& e) {
  switch (e.kind) {
    case Event::kMessage: on_message(rail, e.msg, e.msg_bytes); return;
    case Event::kPayload: on_payload(rail, e.data); return;
    case Event::kSendDone: {
      auto g = e.group.lock();
      if (!g) return;
      if (e.error && e.peer >= 0 && e.peer < g->world) {
        std::lock_guard<std::mutex> l(g->mu);
        Peer& pe = g->peers[e.peer];
        if (g->phase == Phase::kDone || g->aborted) {
          // nothing more to say
        } else if (pe.up) {
          g->fail_locked(e.peer, "sending to " + g->who(e.peer) + " failed: " + e.error_text);
        } else if (e.peer < g->rank) {
          pe.dial.last_error = "the handshake could not be sent: " + e.error_text;
        }
      }
      if (e.counted) {
        g->outstanding.fetch_sub(1);
        std::lock_guard<std::mutex> l(g->mu);
        g->cv.notify_all();
      }
      return;
    }
    case Event::kWriteDone: {
      std::unique_ptr<Op> op(e.op);
      if (e.error) {
        std::lock_guard<std::mutex> l(op->wait->mu);
        if (!op->wait->failed.exchange(true)) op->wait->error = e.error_text;
      }
      op->wait->left.fetch_sub(1);
      if (auto g = op->group.lock()) {
        g->outstanding.fetch_sub(1);
        std::lock_guard<std::mutex> l(g->mu);
        g->cv.notify_all();
      }
      return;
    }
  }
}

void Core::expect_traffic() noexcept {
  for (size_t r = 0; r < busy_poll_.size(); ++r) expect_traffic(static_cast<int>(r));
}

void Core::expect_traffic(int i) noexcept {
  if (!busy_poll_[i]->enabled() || !running_) return;
  busy_poll_[i]->open();
  if (sleeping_[i]->load(std::memory_order_seq_cst)) {
    const uint64_t one = 1;
    ssize_t w = ::write(wake_fds_[i], &one, sizeof one);
    (void)w;
  }
}

void Core::drive(int i) noexcept { driven_[i]->fetch_add(1, std::memory_order_seq_cst); }

void Core::undrive(int i) noexcept {
  // seq_cst with run()'s parking: either the thread sees no driver left and does not park, or
  // this sees it parked and wakes it.
  if (driven_[i]->fetch_sub(1, std::memory_order_seq_cst) == 1 &&
      aside_[i]->load(std::memory_order_seq_cst)) {
    const uint64_t one = 1;
    ssize_t w = ::write(wake_fds_[i], &one, sizeof one);
    (void)w;
  }
}

void Core::run(int i) {
  using std::chrono::microseconds;
  Rail& rail = *rails_[i];
  BusyPollWindow& busy_poll = *busy_poll_[i];
  auto next_housekeeping = Clock::now();
  auto idle_since = Clock::now();
  uint32_t spins = 0;
  while (running_) {
    if (driven_[i]->load(std::memory_order_relaxed) > 0) {
      // A waiting writer polls this endpoint (drive()): stand aside, on the wake fd only (the
      // completion queue's would wake us for every completion it reads), until it is done.
      const auto now = Clock::now();
      if (now >= next_housekeeping) {
        housekeeping(i, now);
        next_housekeeping = now + kHousekeeping;
      }
      aside_[i]->store(true, std::memory_order_seq_cst);
      if (driven_[i]->load(std::memory_order_seq_cst) > 0) {
        const auto left = std::max<Clock::duration>(next_housekeeping - Clock::now(), microseconds(1));
        const auto s = std::chrono::duration_cast<std::chrono::seconds>(left);
        timespec ts{
            static_cast<time_t>(s.count()),
            static_cast<long>(std::chrono::duration_cast<std::chrono::nanoseconds>(left - s).count())};
        pollfd fd{wake_fds_[i], POLLIN, 0};
        ::ppoll(&fd, 1, &ts, nullptr);
      }
      aside_[i]->store(false, std::memory_order_relaxed);
      uint64_t drained;
      while (::read(wake_fds_[i], &drained, sizeof drained) > 0) {}
      spins = 0;
      idle_since = Clock::now();
      continue;
    }
    const int n = progress(i);
    const auto now = Clock::now();
    if (now >= next_housekeeping) {
      housekeeping(i, now);
      next_housekeeping = now + kHousekeeping;
    }
    if (n > 0 || rail.has_backlog()) {
      busy_poll.open();
      spins = 0;
      idle_since = now;
      continue;
    }
    if (busy_poll.is_open()) {
      sched_yield();  // polling must not hold a core that a thread with work is waiting for
      continue;
    }
    if (++spins < 64) continue;
    // Idle: sleep in slices that grow with the quiet, never past the next housekeeping.
    const auto quiet = now - idle_since;
    microseconds slice = quiet < milliseconds(10)    ? microseconds(20)
                         : quiet < milliseconds(100) ? microseconds(200)
                                                     : microseconds(1000);
    const auto until_housekeeping = std::chrono::duration_cast<microseconds>(next_housekeeping - now);
    if (until_housekeeping < slice) slice = std::max(until_housekeeping, microseconds(1));
    sleeping_[i]->store(true, std::memory_order_seq_cst);
    if (!busy_poll.is_open()) rail.wait(wake_fds_[i], slice);
    sleeping_[i]->store(false, std::memory_order_relaxed);
    uint64_t drained;
    while (::read(wake_fds_[i], &drained, sizeof drained) > 0) {}
  }
}

void Core::housekeeping(int rail, Clock::time_point now) {
  // Silence is counted only while this endpoint listened: after a gap in its housekeeping or in
  // the reading of its queue, a peer's heartbeats may be waiting unread.
  const Clock::time_point caught_up{Clock::duration(caught_up_[rail]->load(std::memory_order_relaxed))};
  if (now - housekept_[rail] > kDeafGap || now - caught_up > kDeafGap) deaf_until_[rail] = now;
  housekept_[rail] = now;
  const Clock::time_point listening_since = deaf_until_[rail];
  {
    std::lock_guard<std::mutex> l(hs_mu_);
    while (!parked_.empty() && now - parked_.front().at > kHandshakeTimeout) parked_.pop_front();
  }
  std::vector<std::shared_ptr<GroupState>> live;
  {
    std::lock_guard<std::mutex> l(groups_mu_);
    for (auto& [id, w] : groups_) {
      auto g = w.lock();
      if (g && g->rail == rail) live.push_back(std::move(g));
    }
  }
  for (auto& g : live) {
    std::lock_guard<std::mutex> l(g->mu);
    if (g->phase == Phase::kDone || g->aborted) continue;
    for (int p = 0; p < g->world; ++p) {
      Peer& pe = g->peers[p];
      auto& ch = pe.challenges;
      std::erase_if(ch, [&](const Peer::Challenge& c) { return now - c.at > kHandshakeTimeout; });
      if (!pe.up || pe.state != PeerState::kConnected) continue;
      if (now - std::max(pe.last_heard, listening_since) > options_.peer_timeout) {
        const auto ms = std::chrono::duration_cast<milliseconds>(now - pe.last_heard).count();
        const std::string why = g->who(p) + " stopped answering: nothing heard from it for " +
                                std::to_string(ms) + " ms (killed, hung, or unreachable)";
        if (g->phase == Phase::kConnecting) {
          g->lose_locked(p);
        } else {
          g->fail_locked(p, why);
        }
        continue;
      }
      if (now - pe.last_sent >= options_.heartbeat) {
        wire::Msg m{};
        m.kind = wire::kHeartbeat;
        m.w[0] = pe.delivered;
        g->send_locked(p, m, false);
      }
    }
  }
}

}  // namespace fusedcomm::rdma::libfabric
