// connect(): building a group. The caller's thread dials the lower ranks (the dialer's half of
// the handshake: hello, check the acceptor's proof, send ours, wait for the accept; wire.h) and
// waits for receiver 0 to authenticate the higher ranks' dials and match them to the group.
#include "core.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace fusedcomm::rdma::socket_backend {

namespace {

struct Dial {
  int peer = -1;
  int fd = -1;
  enum State { kIdle, kConnecting, kAwaitChallenge, kAwaitAccept, kDone } state = kIdle;
  Clock::time_point retry_at;
  milliseconds backoff{10};
  wire::WireHandshake sent{};  // our hello (its nonce is new on every dial)
  wire::WireHandshake reply{};
  size_t got = 0;
  std::string last_error = "no answer yet";
  std::vector<sockaddr_storage> addrs;
  std::vector<socklen_t> lens;
  size_t next_addr = 0;

  void close_fd() {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
  void retry(const std::string& why, Clock::time_point now) {
    close_fd();
    last_error = why;
    state = kIdle;
    retry_at = now + backoff;
    backoff = std::min(backoff * 2, milliseconds(500));
  }
};

bool resolve(const std::string& address, Dial* d, std::string* err) {
  std::string host, port;
  if (!split_host_port(address, &host, &port)) {
    *err = "malformed address '" + address + "' (want host:port)";
    return false;
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &res);
  if (rc != 0) {
    *err = "cannot resolve '" + host + "': " + gai_strerror(rc);
    return false;
  }
  d->addrs.clear();
  d->lens.clear();
  for (addrinfo* p = res; p; p = p->ai_next) {
    sockaddr_storage ss{};
    std::memcpy(&ss, p->ai_addr, p->ai_addrlen);
    d->addrs.push_back(ss);
    d->lens.push_back(p->ai_addrlen);
  }
  freeaddrinfo(res);
  return !d->addrs.empty();
}

}  // namespace

std::shared_ptr<GroupState> Core::connect(const GroupSpec& spec) {
  check_group_spec(spec);
  auto g = std::make_shared<GroupState>();
  g->core = shared_from_this();
  g->key = spec.key;
  g->comm_id = spec.comm_id;
  g->rank = spec.rank;
  g->world = spec.world;
  g->lane = spec.lane;
  g->addresses = spec.addresses;
  g->addresses.resize(spec.world);
  g->peers.assign(spec.world, nullptr);
  g->lost.assign(spec.world, false);
  g->refused.assign(spec.world, std::string());
  if (spec.world == 1) {
    g->phase = Phase::kLive;
    return g;
  }
  if (!running_) throw TransportError(-1, "socket transport is shut down");
  {
    std::lock_guard<std::mutex> l(groups_mu_);
    auto it = groups_.find(spec.comm_id);
    if (it != groups_.end() && !it->second.expired()) {
      throw TransportError(
          -1, "connect: communicator " + hex(spec.comm_id) + " is already open on this transport");
    }
    groups_[spec.comm_id] = g;
  }
  post(0, {Command::kRescan, nullptr});  // dials that arrived before this call

  std::vector<Dial> dials(spec.rank);
  for (int j = 0; j < spec.rank; ++j) dials[j].peer = j;
  bool ok = false;
  // Undo everything if we leave by an exception.
  struct Cleanup {
    GroupState* g;
    std::vector<Dial>* dials;
    bool* ok;
    ~Cleanup() {
      for (auto& d : *dials) d.close_fd();
      if (*ok) return;
      g->abort();
      g->release(true);
    }
  } cleanup{g.get(), &dials, &ok};

  const handshake::Side me = g->side();
  // A failed handshake that ends the group: tell the acceptor why when it failed our check of
  // its proof (so that its own error can say so), then throw naming it.
  auto give_up = [&](Dial& d, const handshake::Check& check) {
    if (check.reason == wire::kBadAuth && d.state == Dial::kAwaitChallenge) {
      const wire::WireHandshake no = handshake::reject(d.reply, spec.rank, wire::kBadAuth);
      send_now(d.fd, &no, sizeof no);
    }
    throw TransportError(d.peer, g->self() + ": " + g->who(d.peer) + " " + check.why);
  };

  const auto start = Clock::now();
  const auto deadline = start + spec.connect_timeout;
  auto all_connected = [&] { return g->connected == spec.world - 1; };
  auto cancelled = [&] { return g->aborted.load() || (spec.cancel != nullptr && spec.cancel->load()); };
  while (true) {
    if (cancelled()) throw TransportError(-1, g->self() + ": connect was aborted");
    auto now = Clock::now();
    std::vector<pollfd> pfds;
    std::vector<Dial*> polled;
    Clock::time_point wake = deadline;
    for (auto& d : dials) {
      if (d.state == Dial::kIdle && now >= d.retry_at) {
        std::string err;
        if (d.addrs.empty() && !resolve(spec.addresses[d.peer], &d, &err)) {
          d.retry(err, now);
        } else {
          const auto& ss = d.addrs[d.next_addr++ % d.addrs.size()];
          const socklen_t len = d.lens[(d.next_addr - 1) % d.lens.size()];
          d.fd = ::socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
          if (d.fd < 0) {
            d.retry("socket: " + errno_text(errno), now);
          } else {
            set_nodelay(d.fd);
            int r = ::connect(d.fd, reinterpret_cast<const sockaddr*>(&ss), len);
            if (r == 0 || errno == EINPROGRESS) {
              d.state = Dial::kConnecting;
            } else {
              d.retry(errno_text(errno), now);
            }
          }
        }
      }
      if (d.state == Dial::kConnecting) {
        pfds.push_back({d.fd, POLLOUT, 0});
        polled.push_back(&d);
      } else if (d.state == Dial::kAwaitChallenge || d.state == Dial::kAwaitAccept) {
        pfds.push_back({d.fd, POLLIN, 0});
        polled.push_back(&d);
      } else if (d.state == Dial::kIdle) {
        wake = std::min(wake, d.retry_at);
      }
    }
    {
      std::unique_lock<std::mutex> l(g->mu);
      if (all_connected()) break;
      if (now >= deadline) break;
      if (pfds.empty()) {
        // Nothing to dial now: wait for the higher ranks (or the next retry). A cancel flag is
        // not a condition the group's cv hears of, so it is polled every slice.
        if (spec.cancel != nullptr) wake = std::min(wake, now + milliseconds(kPollSliceMs));
        g->cv.wait_until(l, wake, [&] { return all_connected() || cancelled(); });
        continue;
      }
    }
    auto ms = std::chrono::duration_cast<milliseconds>(wake - now).count();
    int slice = static_cast<int>(std::clamp<int64_t>(ms, 0, kPollSliceMs));
    int n = ::poll(pfds.data(), pfds.size(), slice);
    if (n <= 0) continue;
    now = Clock::now();
    for (size_t i = 0; i < pfds.size(); ++i) {
      if (!pfds[i].revents) continue;
      Dial& d = *polled[i];
      if (d.state == Dial::kConnecting) {
        int err = 0;
        socklen_t len = sizeof err;
        getsockopt(d.fd, SOL_SOCKET, SO_ERROR, &err, &len);
        if (err) {
          d.retry(errno_text(err), now);
          continue;
        }
        d.sent = handshake::hello(me, d.peer, auth::random_nonce());
        if (!send_now(d.fd, &d.sent, sizeof d.sent)) {
          d.retry("could not send the handshake", now);
          continue;
        }
        d.state = Dial::kAwaitChallenge;
        d.got = 0;
        d.last_error = "connected, but it has not answered the handshake (has it called connect?)";
      } else {
        ssize_t r =
            ::recv(d.fd, reinterpret_cast<char*>(&d.reply) + d.got, sizeof d.reply - d.got, MSG_DONTWAIT);
        if (r < 0 && (errno == EAGAIN || errno == EINTR)) continue;
        if (r <= 0) {
          d.retry(r == 0 ? "closed the connection during the handshake" : errno_text(errno), now);
          continue;
        }
        d.got += static_cast<size_t>(r);
        if (d.got < sizeof d.reply) continue;
        d.got = 0;
        if (d.state == Dial::kAwaitChallenge) {
          const handshake::Check check = handshake::check_challenge(d.reply, d.sent, d.peer, me);
          if (check.verdict == handshake::Verdict::kRetry) {
            d.retry(check.why, now);
          } else if (check.verdict != handshake::Verdict::kOk) {
            give_up(d, check);
          } else {
            const wire::WireHandshake mine = handshake::proof(d.sent, d.reply, me);
            if (!send_now(d.fd, &mine, sizeof mine)) {
              d.retry("could not send the handshake", now);
            } else {
              d.state = Dial::kAwaitAccept;
              d.last_error = "it proved the key but has not accepted our proof";
            }
          }
          continue;
        }
        const handshake::Check check = handshake::check_accept(d.reply, d.peer, me);
        if (check.verdict == handshake::Verdict::kRetry) {
          d.retry(check.why, now);
          continue;
        }
        if (check.verdict != handshake::Verdict::kOk) give_up(d, check);
        auto c = std::make_shared<Conn>(d.fd, new_conn_id(), &open_connections);
        d.fd = -1;  // now owned by c
        d.state = Dial::kDone;
        c->make_data(d.peer, spec.addresses[d.peer], g);
        {
          // Attach under the group lock so that an abort() sees the connection only after
          // its attach command is queued (its detach then follows the attach).
          std::lock_guard<std::mutex> l(g->mu);
          g->peers[d.peer] = c;
          g->connected++;
          attach(c, spec.lane);
        }
      }
    }
  }

  std::unique_lock<std::mutex> l(g->mu);
  if (!all_connected()) {
    // Ranks that never connected come first: a rank that did connect and then left has most
    // likely given up on the same missing ranks.
    std::string missing, lost;
    int first = -1, first_lost = -1;
    for (int r = 0; r < spec.world; ++r) {
      if (r == spec.rank || g->peers[r]) continue;
      const std::string who = "rank " + std::to_string(r) + " at " + spec.addresses[r];
      if (g->lost[r]) {
        if (first_lost < 0) first_lost = r;
        lost += "; " + who + " (connected, then closed the connection; did it time out too?)";
        continue;
      }
      if (first < 0) first = r;
      missing += missing.empty() ? "" : "; ";
      std::string why = r < spec.rank ? dials[r].last_error : std::string("it never connected to us");
      if (r > spec.rank && !g->refused[r].empty()) {
        why = "no authenticated connection from it; " + g->refused[r];
      }
      missing += who + " (" + why + ")";
    }
    if (first < 0) {
      first = first_lost;
      missing = lost.substr(2);
    } else {
      missing += lost;
    }
    auto ms = std::chrono::duration_cast<milliseconds>(Clock::now() - start).count();
    l.unlock();
    throw ConnectTimeout(first, g->self() + " (world " + std::to_string(spec.world) +
                                    "): connect timed out after " + std::to_string(ms) + " ms; missing " +
                                    missing);
  }
  g->phase = Phase::kLive;
  ok = true;
  return g;
}

}  // namespace fusedcomm::rdma::socket_backend
