// The accepting side of the socket backend: the listener, accepting sockets on receiver 0, and
// the acceptor's half of the handshake (hello, reject, matching a dial to its group). The
// dialer's half is in connect.cc; the messages are in wire.h.
#include "core.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/epoll.h>

#include <cerrno>

namespace fusedcomm::rdma::socket_backend {

void Core::open_listener(const SocketOptions& o) {
  std::string bind_host = o.bind_host;
  const bool wildcard = bind_host.empty() || bind_host == "0.0.0.0" || bind_host == "::";
  addrinfo hints{};
  hints.ai_family = bind_host.empty() ? AF_INET : AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  std::string port = std::to_string(o.port);
  int rc = getaddrinfo(bind_host.empty() ? nullptr : bind_host.c_str(), port.c_str(), &hints, &res);
  if (rc != 0) {
    throw TransportError(
        -1, "socket transport: cannot resolve bind host '" + bind_host + "': " + gai_strerror(rc));
  }
  int err = 0;
  for (addrinfo* p = res; p; p = p->ai_next) {
    int fd = ::socket(p->ai_family, p->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      err = errno;
      continue;
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, p->ai_addr, p->ai_addrlen) == 0 && ::listen(fd, 1024) == 0) {
      listen_fd_ = fd;
      break;
    }
    err = errno;
    ::close(fd);
  }
  freeaddrinfo(res);
  if (listen_fd_ < 0) throw_sys("cannot listen on '" + bind_host + ":" + port + "'", err);

  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&ss), &len);
  int bound_port = ss.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port)
                                            : ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  std::string host = o.advertise_host;
  if (host.empty()) host = wildcard ? primary_host_address() : bind_host;
  address_ = join_host_port(host, bound_port);
}

void Core::accept_all() {
  while (true) {
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    int fd = accept4(listen_fd_, reinterpret_cast<sockaddr*>(&ss), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;  // EAGAIN, or a transient error (EMFILE, ECONNABORTED): retried later
    set_nodelay(fd);
    auto c = std::make_shared<Conn>(fd, new_conn_id(), &open_connections);
    c->peer_addr = numeric_host(reinterpret_cast<sockaddr*>(&ss), len);
    c->since = Clock::now();
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.u64 = c->id;
    Receiver& r0 = *receivers_[0];
    if (r0.conns.size() >= kMaxConns || epoll_ctl(r0.epoll_fd, EPOLL_CTL_ADD, fd, &ev) != 0) {
      continue;  // ~Conn closes it
    }
    c->with_receiver = true;
    r0.conns.emplace(c->id, c);
  }
}

void Core::expire_pending() {
  auto now = Clock::now();
  std::vector<Conn*> expired;
  for (auto& [id, c] : receivers_[0]->conns) {
    if (c->is_data) continue;
    auto limit = c->hello_got == sizeof(wire::WireHello) ? kParkTimeout : kHelloTimeout;
    if (now - c->since > limit) expired.push_back(c.get());
  }
  for (auto& c : expired) drop(c);
}

void Core::read_hello(Conn* c) {
  const size_t want = sizeof(wire::WireHello) - c->hello_got;
  if (want == 0) {
    // Parked: the dialer must wait for our reply, so anything readable is EOF or a violation.
    char b;
    ssize_t r = ::recv(c->fd, &b, 1, MSG_DONTWAIT);
    if (r < 0 && (errno == EAGAIN || errno == EINTR)) return;
    drop(c);
    return;
  }
  ssize_t r = ::recv(c->fd, reinterpret_cast<char*>(&c->hello) + c->hello_got, want, MSG_DONTWAIT);
  if (r < 0 && (errno == EAGAIN || errno == EINTR)) return;
  if (r <= 0) {
    drop(c);
    return;
  }
  c->hello_got += static_cast<size_t>(r);
  if (c->hello_got < sizeof(wire::WireHello)) return;
  if (c->hello.magic != wire::kHelloMagic || c->hello.kind != wire::kHello) {
    drop(c);  // not one of us: no reply
    return;
  }
  if (c->hello.version != kTransportApiVersion) {
    reject(c, wire::kBadVersion);
    return;
  }
  c->since = Clock::now();  // the park timeout starts now
  try_match(c);
}

void Core::reject(Conn* c, uint32_t reason) {
  wire::WireHello reply{};
  reply.magic = wire::kHelloMagic;
  reply.version = kTransportApiVersion;
  reply.kind = wire::kReject;
  reply.comm_id = c->hello.comm_id;
  reply.rank = c->hello.target_rank;
  reply.world = c->hello.world;
  reply.target_rank = c->hello.rank;
  reply.reason = reason;
  send_now(c->fd, &reply, sizeof reply);
  drop(c);
}

Core::Match Core::try_match(Conn* c) {
  const wire::WireHello& h = c->hello;
  std::shared_ptr<GroupState> g;
  {
    std::lock_guard<std::mutex> l(groups_mu_);
    auto it = groups_.find(h.comm_id);
    if (it != groups_.end()) g = it->second.lock();
  }
  if (!g) return Match::kParked;  // that rank has not called connect() yet
  std::unique_lock<std::mutex> l(g->mu);
  // Maybe a later group reuses the id. An aborted group is still kConnecting until release()
  // empties it; a connection adopted in between would outlive the group, open and counted.
  if (g->phase != Phase::kConnecting || g->aborted) return Match::kParked;
  uint32_t reason = wire::kNoReason;
  if (h.job_token != g->job_token) {
    reason = wire::kBadToken;
  } else if (h.world != g->world) {
    reason = wire::kBadWorld;
  } else if (h.target_rank != g->rank || h.rank <= g->rank || h.rank >= g->world) {
    reason = wire::kBadRank;
  } else if (g->peers[h.rank]) {
    reason = wire::kDuplicate;
  }
  if (reason != wire::kNoReason) {
    l.unlock();
    reject(c, reason);
    return Match::kDropped;
  }
  wire::WireHello reply{};
  reply.magic = wire::kHelloMagic;
  reply.version = kTransportApiVersion;
  reply.kind = wire::kAccept;
  reply.job_token = g->job_token;
  reply.comm_id = g->comm_id;
  reply.rank = g->rank;
  reply.world = g->world;
  reply.target_rank = h.rank;
  if (!send_now(c->fd, &reply, sizeof reply)) {
    l.unlock();
    drop(c);
    return Match::kDropped;
  }
  c->make_data(h.rank, g->addresses[h.rank], g);
  Receiver& r0 = *receivers_[0];
  const int reader = reader_for(g->lane, h.rank);
  std::shared_ptr<Conn> adopted = r0.conns.at(c->id);
  g->peers[h.rank] = adopted;
  g->lost[h.rank] = false;
  g->connected++;
  if (reader != 0) {
    // Moves to its reader, still under the group's lock: an abort() that finds it in peers
    // sends the detach to that reader, after this attach. Nothing was read past the hello, and
    // the new epoll set reports what is already queued on the socket (level-triggered).
    epoll_ctl(r0.epoll_fd, EPOLL_CTL_DEL, c->fd, nullptr);
    r0.conns.erase(c->id);
    attach(adopted, g->lane);
  }
  g->cv.notify_all();
  return Match::kAdopted;
}

}  // namespace fusedcomm::rdma::socket_backend
