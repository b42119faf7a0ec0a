// Raw TCP peers for the transport's security tests: blocking socket helpers, a client that
// speaks (or breaks) the socket handshake, a loopback proxy that records what crosses it, and
// the stranger: a catalogue of attacks on a listener (random bytes, truncated and oversize
// messages, replays, handshakes with a wrong key, half-open connections). Shared by
// rdma/tests/transport_handshake_test and executor-native/tests/stranger_test.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "../socket/handshake.h"
#include "../socket/wire.h"
#include "fusedcomm/rdma/auth.h"
#include "fusedcomm/rdma/transport.h"

namespace rawpeer {

namespace hs = fusedcomm::rdma::socket_backend::handshake;
namespace wire = fusedcomm::rdma::wire;
namespace auth = fusedcomm::rdma::auth;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

inline bool split(const std::string& addr, std::string* host, int* port) {
  const size_t colon = addr.rfind(':');
  if (colon == std::string::npos) return false;
  *host = addr.substr(0, colon);
  *port = std::atoi(addr.c_str() + colon + 1);
  return true;
}

// A blocking IPv4 connection to "host:port", or -1 if it is not up within 2 s. Receives time
// out after `recv_timeout`.
inline int dial(const std::string& addr, milliseconds recv_timeout = milliseconds(5000)) {
  std::string host;
  int port = 0;
  if (!split(addr, &host, &port)) return -1;
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return -1;
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  bool up = inet_pton(AF_INET, host.c_str(), &sa.sin_addr) == 1 &&
            (::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0 || errno == EINPROGRESS);
  if (up) {
    pollfd p{fd, POLLOUT, 0};
    int err = 0;
    socklen_t len = sizeof err;
    up = ::poll(&p, 1, 2000) == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0;
  }
  if (!up || fcntl(fd, F_SETFL, 0) != 0) {
    ::close(fd);
    return -1;
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  timeval tv{static_cast<time_t>(recv_timeout.count() / 1000),
             static_cast<suseconds_t>(recv_timeout.count() % 1000 * 1000)};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

inline bool send_all(int fd, const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    ssize_t r = ::send(fd, c, n, MSG_NOSIGNAL);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    c += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

// Reads exactly n bytes (false on EOF, error or the socket's receive timeout).
inline bool recv_exact(int fd, void* p, size_t n) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    ssize_t r = ::recv(fd, c, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    c += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

// Reads until EOF (or a reset) and returns the bytes read; -1 if the peer still holds the
// connection open after `limit`.
inline int64_t drain_to_eof(int fd, milliseconds limit) {
  const auto deadline = Clock::now() + limit;
  int64_t total = 0;
  char buf[4096];
  while (Clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
    if (::poll(&p, 1, static_cast<int>(std::max<int64_t>(left, 1))) <= 0) continue;
    ssize_t r = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (r < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (r <= 0) return total;
    total += r;
  }
  return -1;
}

// A listening socket on 127.0.0.1 at an ephemeral port; its "host:port" in *address.
inline int listen_loopback(std::string* address) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa);
  ::listen(fd, 64);
  socklen_t len = sizeof sa;
  getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
  *address = "127.0.0.1:" + std::to_string(ntohs(sa.sin_port));
  return fd;
}

// ---------------------------------------------------------------------------------------------
// A dialer's handshake with any key: what a stranger who holds `key` (right or wrong) can do.

struct DialResult {
  bool got_challenge = false;       // the acceptor answered our hello with a challenge
  bool challenge_verified = false;  // ... whose proof verifies with our key
  wire::WireHandshake challenge{};
  wire::WireHandshake last{};  // the acceptor's answer to our proof (or its first answer)
  bool got_last = false;
  int64_t bytes_after = -1;  // bytes the acceptor sent after `last` until EOF (-1: no EOF)
};

// Dials `addr` as rank `rank` of `world` targeting `target` of group `comm_id`, with `key` and
// the published `addresses`, sends its proof whatever the challenge proves, and reads to EOF.
inline DialResult dial_with_key(const std::string& addr, const auth::Key& key, uint64_t comm_id, int rank,
                                int world, int target, const std::vector<std::string>& addresses) {
  DialResult out;
  int fd = dial(addr);
  if (fd < 0) return out;
  hs::Side me{&key, comm_id, rank, world, &addresses};
  const wire::WireHandshake hello = hs::hello(me, target, auth::random_nonce());
  if (send_all(fd, &hello, sizeof hello) && recv_exact(fd, &out.challenge, sizeof out.challenge)) {
    out.got_challenge = out.challenge.magic == wire::kHelloMagic && out.challenge.kind == wire::kChallenge;
    if (!out.got_challenge) {
      out.last = out.challenge;
      out.got_last = true;
    } else {
      out.challenge_verified =
          hs::check_challenge(out.challenge, hello, target, me).verdict == hs::Verdict::kOk;
      const wire::WireHandshake proof = hs::proof(hello, out.challenge, me);
      if (send_all(fd, &proof, sizeof proof)) out.got_last = recv_exact(fd, &out.last, sizeof out.last);
    }
    if (out.got_last) out.bytes_after = drain_to_eof(fd, milliseconds(3000));
  }
  ::close(fd);
  return out;
}

// ---------------------------------------------------------------------------------------------
// A loopback proxy: listens on 127.0.0.1, forwards every connection to `target`, and records the
// bytes of the first one in each direction.

class Proxy {
 public:
  explicit Proxy(const std::string& target) : target_(target), listen_fd_(listen_loopback(&address_)) {
    thread_ = std::thread([this] { run(); });
  }
  ~Proxy() {
    stop_ = true;
    thread_.join();
    for (auto& p : pairs_) {
      ::close(p.a);
      ::close(p.b);
    }
    ::close(listen_fd_);
  }
  const std::string& address() const { return address_; }
  // What the first connection carried: from its dialer (up) and from the target (down).
  std::vector<uint8_t> up() const {
    std::lock_guard<std::mutex> l(mu_);
    return up_;
  }
  std::vector<uint8_t> down() const {
    std::lock_guard<std::mutex> l(mu_);
    return down_;
  }

 private:
  struct Pair {
    int a, b;  // dialer side, target side
    bool first;
  };
  void run() {
    while (!stop_) {
      std::vector<pollfd> pfds{{listen_fd_, POLLIN, 0}};
      for (auto& p : pairs_) {
        pfds.push_back({p.a, POLLIN, 0});
        pfds.push_back({p.b, POLLIN, 0});
      }
      if (::poll(pfds.data(), pfds.size(), 20) <= 0) continue;
      if (pfds[0].revents) {
        int a = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
        int b = a >= 0 ? dial(target_) : -1;
        if (b >= 0) {
          pairs_.push_back({a, b, !recorded_});
          recorded_ = true;
        } else if (a >= 0) {
          ::close(a);
        }
        continue;
      }
      for (size_t i = 0; i < pairs_.size(); ++i) {
        for (int side = 0; side < 2; ++side) {
          if (!pfds[1 + 2 * i + side].revents) continue;
          Pair& p = pairs_[i];
          const int from = side == 0 ? p.a : p.b, to = side == 0 ? p.b : p.a;
          char buf[65536];
          ssize_t r = ::recv(from, buf, sizeof buf, MSG_DONTWAIT);
          if (r > 0) {
            send_all(to, buf, static_cast<size_t>(r));
            if (p.first) {
              std::lock_guard<std::mutex> l(mu_);
              auto& log = side == 0 ? up_ : down_;
              log.insert(log.end(), buf, buf + r);
            }
          } else if (r == 0 || (errno != EAGAIN && errno != EINTR)) {
            ::shutdown(to, SHUT_WR);
          }
        }
      }
    }
  }
  std::string target_, address_;
  int listen_fd_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::vector<Pair> pairs_;  // proxy thread only
  bool recorded_ = false;
  mutable std::mutex mu_;
  std::vector<uint8_t> up_, down_;
};

// ---------------------------------------------------------------------------------------------
// The stranger: knows the listeners' addresses, the job token and a communicator's id and
// published addresses (it sniffed them), but not the bootstrap's shares.

struct StrangerPlan {
  std::vector<std::string> targets;    // listeners to attack
  uint64_t job_token = 0;              // sniffed: the right token
  uint64_t comm_id = 0;                // sniffed: a communicator of the job
  std::vector<std::string> addresses;  // sniffed: its published addresses
  int rounds = 1;                      // how often the catalogue runs
  int half_open = 2000;                // connections held open without a word
  milliseconds hold{2500};             // how long they are held
  uint64_t seed = 1;
};

struct StrangerReport {
  int dials = 0;                // connections opened
  int half_open = 0;            // half-open ones that connected
  int authenticated = 0;        // handshakes the listener accepted: must stay 0
  int challenges_verified = 0;  // challenges whose proof our key verified: must stay 0
};

// Runs the catalogue against every target. Never throws; what it learns is in the report.
inline StrangerReport run_stranger(const StrangerPlan& plan) {
  StrangerReport rep;
  rlimit fds{};
  if (getrlimit(RLIMIT_NOFILE, &fds) == 0 && fds.rlim_cur < fds.rlim_max) {
    fds.rlim_cur = fds.rlim_max;  // room for the half-open connections
    setrlimit(RLIMIT_NOFILE, &fds);
  }
  std::mt19937_64 rng(plan.seed);
  const int world = static_cast<int>(std::max<size_t>(plan.addresses.size(), 2));
  const auth::Key token_only = auth::derive_comm_key(plan.job_token, plan.comm_id, {});
  const auth::Key wrong_token = auth::derive_comm_key(plan.job_token ^ 0x5a5a, plan.comm_id, {});
  std::vector<std::string> addresses = plan.addresses;
  addresses.resize(world, "127.0.0.1:1");
  auto rand_bytes = [&](size_t n) {
    std::vector<uint8_t> b(n);
    for (auto& x : b) x = static_cast<uint8_t>(rng());
    return b;
  };
  auto fire = [&](const std::string& t, const std::vector<uint8_t>& bytes, bool wait_eof) {
    int fd = dial(t, milliseconds(3000));
    if (fd < 0) return;
    rep.dials++;
    send_all(fd, bytes.data(), bytes.size());
    if (wait_eof) drain_to_eof(fd, milliseconds(2500));
    ::close(fd);
  };
  auto hello_bytes = [&](uint64_t comm, int rank, int target) {
    hs::Side me{&token_only, comm, rank, world, &addresses};
    const wire::WireHandshake h = hs::hello(me, target, auth::random_nonce());
    const auto* p = reinterpret_cast<const uint8_t*>(&h);
    return std::vector<uint8_t>(p, p + sizeof h);
  };
  for (int round = 0; round < plan.rounds; ++round) {
    for (const std::string& t : plan.targets) {
      // Random bytes of every length around the handshake's size.
      for (size_t n : {1, 7, 63, 103, 104, 105, 208, 4096}) fire(t, rand_bytes(n), false);
      // Truncated hellos, and hellos followed by garbage (oversize).
      for (size_t cut : {8, 40, 103}) {
        auto h = hello_bytes(plan.comm_id, 1, 0);
        h.resize(cut);
        fire(t, h, false);
      }
      auto big = hello_bytes(plan.comm_id, 1, 0);
      auto tail = rand_bytes(64 * 1024);
      big.insert(big.end(), tail.begin(), tail.end());
      fire(t, big, false);
      // Hellos with broken fields: version, kind, ranks, world.
      for (int v = 0; v < 6; ++v) {
        auto h = hello_bytes(plan.comm_id, 1, 0);
        auto* m = reinterpret_cast<wire::WireHandshake*>(h.data());
        if (v == 0) m->version += 7;
        if (v == 1) m->kind = wire::kProof;
        if (v == 2) m->rank = -5;
        if (v == 3) m->world = 1 << 30;
        if (v == 4) m->target_rank = m->rank;
        if (v == 5) m->comm_id = rng();
        fire(t, h, false);
      }
      // A replayed hello, twice on one connection (a second message where a proof belongs).
      auto twice = hello_bytes(plan.comm_id, 1, 0);
      twice.insert(twice.end(), twice.begin(), twice.end());
      fire(t, twice, false);
      // Full handshakes with the sniffed token but no shares, and with a wrong token, claiming
      // every rank above 0.
      for (int rank = 1; rank < world; ++rank) {
        for (const auth::Key* k : {&token_only, &wrong_token}) {
          const DialResult d = dial_with_key(t, *k, plan.comm_id, rank, world, 0, addresses);
          rep.dials++;
          if (d.challenge_verified) rep.challenges_verified++;
          if (d.got_last && d.last.kind == wire::kAccept) rep.authenticated++;
        }
      }
    }
    // Half-open connections: opened, never a word, held, then dropped.
    std::vector<int> held;
    for (int i = 0; i < plan.half_open; ++i) {
      int fd = dial(plan.targets[static_cast<size_t>(i) % plan.targets.size()], milliseconds(100));
      if (fd < 0) continue;
      held.push_back(fd);
    }
    rep.half_open += static_cast<int>(held.size());
    rep.dials += static_cast<int>(held.size());
    std::this_thread::sleep_for(plan.hold);
    for (int fd : held) ::close(fd);
  }
  return rep;
}

}  // namespace rawpeer
