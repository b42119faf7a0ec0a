// The accepting side of the socket backend: the listener (bound to the host's own address
// unless the options say otherwise), accepting sockets on receiver 0 with a bound on the
// handshakes in progress and a pause when accept() runs out of resources, and the acceptor's
// half of the handshake (hello, challenge, proof, matching a dial to its group's slot). The
// dialer's half is in connect.cc; the messages in wire.h, their checks in handshake.cc.
#include "core.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/epoll.h>

#include <cerrno>
#include <cstdio>

namespace fusedcomm::rdma::socket_backend {
namespace {

// A listening socket on host:port (host empty: the IPv4 wildcard), or -1 with *err set.
int listen_on(const std::string& host, const std::string& port, int* err, std::string* resolve_error) {
  addrinfo hints{};
  hints.ai_family = host.empty() ? AF_INET : AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), port.c_str(), &hints, &res);
  if (rc != 0) {
    *resolve_error = gai_strerror(rc);
    return -1;
  }
  int listen_fd = -1;
  for (addrinfo* p = res; p && listen_fd < 0; p = p->ai_next) {
    int fd = ::socket(p->ai_family, p->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      *err = errno;
      continue;
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, p->ai_addr, p->ai_addrlen) == 0 && ::listen(fd, 1024) == 0) {
      listen_fd = fd;
    } else {
      *err = errno;
      ::close(fd);
    }
  }
  freeaddrinfo(res);
  return listen_fd;
}

}  // namespace

void Core::open_listener(const SocketOptions& o) {
  const std::string& bind_host = o.bind_host;
  const bool wildcard = bind_host == "0.0.0.0" || bind_host == "::";
  const std::string port = std::to_string(o.port);
  int err = 0;
  std::string bound_host;
  if (bind_host.empty()) {
    // The host's own address, and only that one: every interface is what "0.0.0.0" asks for.
    std::string tried;
    for (const std::string& candidate : host_address_candidates()) {
      std::string ignored;
      listen_fd_ = listen_on(candidate, port, &err, &ignored);
      if (listen_fd_ >= 0) {
        bound_host = candidate;
        break;
      }
      tried += (tried.empty() ? "" : ", ") + candidate;
    }
    if (listen_fd_ < 0) {
      throw_sys("cannot listen on this host's addresses (" + tried + ") at port " + port +
                    "; set the bind host (spark.fusedcomm.transport.bindHost)",
                err);
    }
  } else {
    std::string resolve_error;
    listen_fd_ = listen_on(bind_host, port, &err, &resolve_error);
    if (!resolve_error.empty()) {
      throw TransportError(
          -1, "socket transport: cannot resolve bind host '" + bind_host + "': " + resolve_error);
    }
    if (listen_fd_ < 0) throw_sys("cannot listen on '" + bind_host + ":" + port + "'", err);
    bound_host = bind_host;
  }

  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&ss), &len);
  int bound_port = ss.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port)
                                            : ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  std::string host = o.advertise_host;
  if (host.empty()) host = wildcard ? primary_host_address() : bound_host;
  address_ = join_host_port(host, bound_port);
}

void Core::accept_all() {
  Receiver& r0 = *receivers_[0];
  // A bounded batch per wake-up: a flood of dials cannot hold receiver 0 away from the data
  // connections it reads (the listener stays readable and is seen again next round).
  for (int batch = 0; batch < kAcceptBatch && !accepts_paused_; ++batch) {
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    int fd = accept4(listen_fd_, reinterpret_cast<sockaddr*>(&ss), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      const int e = errno;
      if (e == EMFILE || e == ENFILE || e == ENOBUFS || e == ENOMEM) {
        pause_accepts(e);
        return;
      }
      if (e == EAGAIN || e == EWOULDBLOCK) return;
      continue;  // the connection failed before we took it (ECONNABORTED, EPROTO, ...): next one
    }
    accept_pause_ = kAcceptPauseMin;
    set_nodelay(fd);
    auto c = std::make_shared<Conn>(fd, new_conn_id(), &open_connections);
    c->peer_addr = numeric_host(reinterpret_cast<sockaddr*>(&ss), len);
    c->since = Clock::now();
    if (handshakes.load(std::memory_order_relaxed) >= kMaxHandshakes) evict_oldest_handshake();
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.u64 = c->id;
    if (epoll_ctl(r0.epoll_fd, EPOLL_CTL_ADD, fd, &ev) != 0) continue;  // ~Conn closes it
    c->start_handshake(&handshakes);
    c->with_receiver = true;
    handshake_order_.push_back(c->id);
    r0.conns.emplace(c->id, std::move(c));
  }
}

void Core::pause_accepts(int err) {
  epoll_ctl(receivers_[0]->epoll_fd, EPOLL_CTL_DEL, listen_fd_, nullptr);
  accepts_paused_ = true;
  accept_resume_ = Clock::now() + accept_pause_;
  if (!logged_accept_error_.exchange(true)) {
    std::fprintf(stderr,
                 "fusedcomm socket transport %s: accept failed (%s); pausing new connections for %lld ms"
                 " and backing off up to %lld ms while it lasts (logged once)\n",
                 address_.c_str(), errno_text(err).c_str(), static_cast<long long>(accept_pause_.count()),
                 static_cast<long long>(kAcceptPauseMax.count()));
  }
  accept_pause_ = std::min(accept_pause_ * 2, kAcceptPauseMax);
}

void Core::resume_accepts() {
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = 0;
  epoll_ctl(receivers_[0]->epoll_fd, EPOLL_CTL_ADD, listen_fd_, &ev);
  accepts_paused_ = false;
}

void Core::evict_oldest_handshake() {
  auto& conns = receivers_[0]->conns;
  while (!handshake_order_.empty()) {
    const uint64_t id = handshake_order_.front();
    handshake_order_.pop_front();
    auto it = conns.find(id);
    if (it == conns.end() || it->second->is_data) continue;
    if (!logged_evictions_.exchange(true)) {
      std::fprintf(stderr,
                   "fusedcomm socket transport %s: more than %zu connections in their handshake at once;"
                   " closing the oldest to make room (a stranger flooding the listener?) (logged once)\n",
                   address_.c_str(), kMaxHandshakes);
    }
    drop(it->second.get());
    return;
  }
}

void Core::expire_handshakes() {
  auto& conns = receivers_[0]->conns;
  const auto now = Clock::now();
  while (!handshake_order_.empty()) {
    auto it = conns.find(handshake_order_.front());
    if (it == conns.end() || it->second->is_data) {
      handshake_order_.pop_front();
      continue;
    }
    Conn* c = it->second.get();
    if (now - c->since < kHandshakeTimeout) break;  // accept order: the rest are younger
    handshake_order_.pop_front();
    if (c->stage == Conn::Stage::kParked) {
      // Its group never started connecting here in time: tell the dialer, which dials again.
      reject(c, c->hello, c->hello.target_rank, wire::kNotReady);
    } else {
      drop(c);
    }
  }
}

void Core::read_handshake(Conn* c) {
  if (c->stage == Conn::Stage::kParked) {
    // The dialer must wait for our challenge, so anything readable is EOF or a violation.
    char b;
    ssize_t r = ::recv(c->fd, &b, 1, MSG_DONTWAIT);
    if (r < 0 && (errno == EAGAIN || errno == EINTR)) return;
    drop(c);
    return;
  }
  const size_t want = sizeof(wire::WireHandshake) - c->in_got;
  ssize_t r = ::recv(c->fd, reinterpret_cast<char*>(&c->in) + c->in_got, want, MSG_DONTWAIT);
  if (r < 0 && (errno == EAGAIN || errno == EINTR)) return;
  if (r <= 0) {
    drop(c);
    return;
  }
  c->in_got += static_cast<size_t>(r);
  if (c->in_got < sizeof(wire::WireHandshake)) return;
  c->in_got = 0;
  if (c->stage == Conn::Stage::kAwaitProof) {
    on_proof(c);
    return;
  }
  const handshake::Check check = handshake::check_hello(c->in);
  if (check.verdict == handshake::Verdict::kDrop) {
    drop(c);  // not one of us: no reply
  } else if (check.verdict != handshake::Verdict::kOk) {
    reject(c, c->in, c->in.target_rank, check.reason);
  } else {
    c->hello = c->in;
    c->stage = Conn::Stage::kParked;
    try_match(c);
  }
}

void Core::reject(Conn* c, const wire::WireHandshake& to, int rank, uint32_t reason) {
  const wire::WireHandshake reply = handshake::reject(to, rank, reason);
  send_now(c->fd, &reply, sizeof reply);
  drop(c);
}

void Core::try_match(Conn* c) {
  const wire::WireHandshake& h = c->hello;
  std::shared_ptr<GroupState> g;
  {
    std::lock_guard<std::mutex> l(groups_mu_);
    auto it = groups_.find(h.comm_id);
    if (it != groups_.end()) g = it->second.lock();
  }
  if (!g) return;  // that rank has not called connect() yet
  handshake::Check check;
  {
    std::lock_guard<std::mutex> l(g->mu);
    // Maybe a later group reuses the id. An aborted group is still kConnecting until release()
    // empties it; a connection adopted in between would outlive the group, open and counted.
    if (g->phase != Phase::kConnecting || g->aborted) return;
    check = handshake::check_hello_for(h, g->side());
    if (check.verdict == handshake::Verdict::kOk && g->peers[h.rank]) {
      check = {handshake::Verdict::kReject, wire::kDuplicate, {}};
    }
  }
  if (check.verdict != handshake::Verdict::kOk) {
    reject(c, h, g->rank, check.reason);
    return;
  }
  try {
    c->sent = handshake::challenge(h, g->side(), auth::random_nonce());
  } catch (const std::exception&) {
    drop(c);  // no randomness: this dial cannot be authenticated; the dialer tries again
    return;
  }
  if (!send_now(c->fd, &c->sent, sizeof c->sent)) {
    drop(c);
    return;
  }
  c->group = g;
  c->stage = Conn::Stage::kAwaitProof;
}

void Core::on_proof(Conn* c) {
  std::shared_ptr<GroupState> g = c->group.lock();
  if (!g) {
    drop(c);
    return;
  }
  const handshake::Check check = handshake::check_proof(c->in, c->hello, c->sent, g->side());
  if (check.verdict == handshake::Verdict::kOk) {
    adopt(c, g);
    return;
  }
  std::string why;
  if (check.verdict == handshake::Verdict::kReject) {
    why = "a dial claiming to be it failed authentication (it does not hold this communicator's key)";
  } else if (c->in.magic == wire::kHelloMagic && c->in.kind == wire::kReject) {
    why = std::string("it refused our challenge: ") + wire::reject_text(c->in.reason);
  }
  if (!why.empty()) {
    std::lock_guard<std::mutex> l(g->mu);
    if (g->phase == Phase::kConnecting) g->refused[c->hello.rank] = why;
  }
  if (check.verdict == handshake::Verdict::kReject) {
    reject(c, c->hello, g->rank, check.reason);
  } else {
    drop(c);
  }
}

void Core::adopt(Conn* c, const std::shared_ptr<GroupState>& g) {
  const int dialer = c->hello.rank;
  std::unique_lock<std::mutex> l(g->mu);
  if (g->phase != Phase::kConnecting || g->aborted || g->peers[dialer]) {
    const uint32_t reason = g->peers[dialer] ? wire::kDuplicate : wire::kNotReady;
    l.unlock();
    reject(c, c->hello, g->rank, reason);
    return;
  }
  const wire::WireHandshake reply = handshake::accept(c->hello, g->side());
  if (!send_now(c->fd, &reply, sizeof reply)) {
    l.unlock();
    drop(c);
    return;
  }
  c->make_data(dialer, g->addresses[dialer], g);
  Receiver& r0 = *receivers_[0];
  const int reader = reader_for(g->lane, dialer);
  std::shared_ptr<Conn> adopted = r0.conns.at(c->id);
  g->peers[dialer] = adopted;
  g->lost[dialer] = false;
  g->refused[dialer].clear();
  g->connected++;
  if (reader != 0) {
    // Moves to its reader, still under the group's lock: an abort() that finds it in peers
    // sends the detach to that reader, after this attach. Nothing was read past the proof, and
    // the new epoll set reports what is already queued on the socket (level-triggered).
    epoll_ctl(r0.epoll_fd, EPOLL_CTL_DEL, c->fd, nullptr);
    r0.conns.erase(c->id);
    attach(adopted, g->lane);
  }
  g->cv.notify_all();
}

}  // namespace fusedcomm::rdma::socket_backend
