// The socket handshake against an observer and a stranger, and the listener's bounds:
//   - the bytes of a real handshake, captured by a loopback proxy, hold neither the job token,
//     nor the key, nor a share, and replaying them to the same group is refused;
//   - a stranger who sniffed the token (not the shares) and dials first is refused, the slot
//     stays free, the real rank connects and the data goes to it; a fake listener without the
//     key makes the dialer fail at once, and hears no proof;
//   - the listener binds the host's address by default, closes handshakes after their
//     deadline, holds at most kMaxHandshakes, and pauses (no spin, logged once) when accept()
//     runs out of fds.
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "fusedcomm/rdma/transport.h"
#include "raw_peer.h"
#include "test_util.h"

using namespace fusedcomm::rdma;
using namespace std::chrono_literals;
using rawpeer::Clock;
namespace hs = fusedcomm::rdma::socket_backend::handshake;

namespace {

constexpr uint64_t kToken = 0x1122334455667788ull;

std::unique_ptr<Transport> loopback() {
  SocketOptions o;
  o.bind_host = "127.0.0.1";
  return make_socket_transport(o);
}

GroupSpec spec(int rank, const std::vector<std::string>& addrs, uint64_t comm, const auth::Key& key,
               std::chrono::milliseconds timeout = 5000ms) {
  GroupSpec s;
  s.key = key;
  s.comm_id = comm;
  s.rank = rank;
  s.world = static_cast<int>(addrs.size());
  s.addresses = addrs;
  s.connect_timeout = timeout;
  return s;
}

std::vector<auth::Share> shares(int n) {
  std::vector<auth::Share> out(n);
  for (auto& s : out) s = auth::random_share();
  return out;
}

bool contains(const std::vector<uint8_t>& hay, const void* needle, size_t n) {
  const auto* p = static_cast<const uint8_t*>(needle);
  return std::search(hay.begin(), hay.end(), p, p + n) != hay.end();
}

// Whether any 8 consecutive bytes of `secret` appear in `hay`.
bool leaks(const std::vector<uint8_t>& hay, const uint8_t* secret, size_t n) {
  for (size_t i = 0; i + 8 <= n; ++i) {
    if (contains(hay, secret + i, 8)) return true;
  }
  return false;
}

wire::WireHandshake message_at(const std::vector<uint8_t>& bytes, size_t index) {
  wire::WireHandshake m{};
  if (bytes.size() >= (index + 1) * sizeof m) std::memcpy(&m, bytes.data() + index * sizeof m, sizeof m);
  return m;
}

// Rank `from` writes `n` pattern bytes into `to`'s buffer and raises its signal word to 1.
void send_pattern(PeerGroup& g, int to, const Region& src, const Region& dst, uint64_t n) {
  WriteOp op;
  op.peer = to;
  op.src_key = src.key;
  op.dst_key = dst.key;
  op.bytes = n;
  op.signal_key = dst.key;
  op.signal_offset = n;
  op.signal_value = 1;
  g.write(op);
}

// Waits for the signal word after `n` pattern bytes of `seed` in `dst`, then checks the bytes.
void expect_pattern(const std::vector<uint8_t>& dst, uint64_t n, uint64_t seed, const std::string& what) {
  FC_CHECK(fctest::wait_for(
               [&] { return std::atomic_ref<uint8_t>(const_cast<uint8_t&>(dst[n])).load() == 1; }, 5000ms),
           what);
  FC_CHECK(fctest::first_mismatch(dst.data(), n, seed) < 0, what + ": intact");
}

// Closes both ends of a pair at once (each close waits for the other's goodbye).
void close_both(std::unique_ptr<PeerGroup>& a, std::unique_ptr<PeerGroup>& b) {
  auto f = std::async(std::launch::async, [&] { b->close(2000ms); });
  a->close(2000ms);
  f.get();
}

// ---------------------------------------------------------------------------------------------

void test_capture_and_replay() {
  auto t0 = loopback(), t1 = loopback();
  rawpeer::Proxy proxy(t0->address());
  // Rank 0 is published at the proxy, so both ranks' transcripts name the proxy's address.
  const std::vector<std::string> addrs = {proxy.address(), t1->address()};
  const uint64_t comm = 0xC0FFEE;
  const std::vector<auth::Share> sh = shares(2);
  const auth::Key key = auth::derive_comm_key(kToken, comm, sh);

  std::vector<uint8_t> src(256), dst(256 + 8, 0);
  fctest::fill_pattern(src.data(), 256, 7);
  const Region rs = t1->register_memory(src.data(), src.size());
  const Region rd = t0->register_memory(dst.data(), dst.size());
  {
    auto f = std::async(std::launch::async, [&] { return t1->connect(spec(1, addrs, comm, key)); });
    auto g0 = t0->connect(spec(0, addrs, comm, key));
    auto g1 = f.get();
    send_pattern(*g1, 0, rs, rd, 256);
    expect_pattern(dst, 256, 7, "the payload crossed the proxy");
    close_both(g0, g1);
  }
  const std::vector<uint8_t> up = proxy.up(), down = proxy.down();
  // The wire format: hello and proof up, challenge and accept down, then data headers.
  FC_CHECK(up.size() >= 2 * sizeof(wire::WireHandshake) && down.size() >= 2 * sizeof(wire::WireHandshake),
           "captured " + std::to_string(up.size()) + " bytes up, " + std::to_string(down.size()) + " down");
  FC_CHECK(message_at(up, 0).kind == wire::kHello && message_at(up, 1).kind == wire::kProof, "hello, proof");
  FC_CHECK(message_at(down, 0).kind == wire::kChallenge && message_at(down, 1).kind == wire::kAccept,
           "challenge, accept");
  FC_CHECK(
      message_at(up, 0).rank == 1 && message_at(up, 0).target_rank == 0 && message_at(up, 0).comm_id == comm,
      "the hello names the group and the ranks in clear");
  std::vector<uint8_t> all = up;
  all.insert(all.end(), down.begin(), down.end());
  uint8_t le[8], be[8];
  for (int i = 0; i < 8; ++i) {
    le[i] = static_cast<uint8_t>(kToken >> (8 * i));
    be[7 - i] = le[i];
  }
  FC_CHECK(!contains(all, le, 8) && !contains(all, be, 8), "the job token is not on the wire");
  FC_CHECK(!leaks(all, key.data(), key.size()), "no 8 bytes of the key are on the wire");
  for (const auth::Share& s : sh) FC_CHECK(!leaks(all, s.data(), s.size()), "no 8 bytes of a share");

  // Replay: the same group (id, key, addresses) connects again on rank 0; an observer sends the
  // captured hello and, after the fresh challenge, the captured proof. Refused; then the real
  // rank 1 connects through the proxy.
  auto f0 = std::async(std::launch::async, [&] { return t0->connect(spec(0, addrs, comm, key)); });
  int fd = rawpeer::dial(t0->address());
  FC_CHECK(fd >= 0, "dial rank 0");
  wire::WireHandshake challenge{}, answer{};
  rawpeer::send_all(fd, up.data(), sizeof(wire::WireHandshake));
  FC_CHECK(rawpeer::recv_exact(fd, &challenge, sizeof challenge) && challenge.kind == wire::kChallenge,
           "the replayed hello is challenged");
  FC_CHECK(std::memcmp(challenge.nonce, message_at(down, 0).nonce, auth::kNonceBytes) != 0,
           "with a fresh nonce");
  rawpeer::send_all(fd, up.data() + sizeof(wire::WireHandshake), sizeof(wire::WireHandshake));
  FC_CHECK(rawpeer::recv_exact(fd, &answer, sizeof answer) && answer.kind == wire::kReject &&
               answer.reason == wire::kBadAuth,
           "the replayed proof is rejected (kind " + std::to_string(answer.kind) + ")");
  FC_CHECK(rawpeer::drain_to_eof(fd, 2000ms) == 0, "and the connection closed");
  ::close(fd);
  FC_CHECK(t0->stats().open_connections == 0, "the replay took no slot");
  auto g1 = t1->connect(spec(1, addrs, comm, key));
  auto g0 = f0.get();
  FC_CHECK(g0->status(1) == PeerState::kConnected, "the real rank connects after the replay");
  close_both(g0, g1);
}

void test_stranger_with_sniffed_token() {
  auto t0 = loopback(), t1 = loopback();
  const std::vector<std::string> addrs = {t0->address(), t1->address()};
  const uint64_t comm = 0xBADC0DE;
  const auth::Key key = auth::derive_comm_key(kToken, comm, shares(2));
  std::vector<uint8_t> src(4096), dst(4096 + 8, 0), loot(4096 + 8, 0);
  fctest::fill_pattern(src.data(), 4096, 11);
  const Region rs = t0->register_memory(src.data(), src.size());
  const Region rd = t1->register_memory(dst.data(), dst.size());

  auto f0 = std::async(std::launch::async, [&] { return t0->connect(spec(0, addrs, comm, key)); });
  // The stranger dials first, as rank 1, with the key it can make: the token without the shares
  // (and once more with a wrong token).
  for (uint64_t token : {kToken, kToken + 1}) {
    const rawpeer::DialResult d =
        rawpeer::dial_with_key(t0->address(), auth::derive_comm_key(token, comm, {}), comm, 1, 2, 0, addrs);
    FC_CHECK(d.got_challenge, "the stranger's hello is challenged");
    FC_CHECK(!d.challenge_verified, "rank 0's proof does not verify with the stranger's key");
    FC_CHECK(d.got_last && d.last.kind == wire::kReject && d.last.reason == wire::kBadAuth,
             "the stranger's proof is refused");
    FC_CHECK(d.bytes_after == 0, "and it gets nothing more: " + std::to_string(d.bytes_after) + " bytes");
  }
  FC_CHECK(t0->stats().open_connections == 0, "the stranger holds no slot");
  auto g1 = t1->connect(spec(1, addrs, comm, key));
  auto g0 = f0.get();
  send_pattern(*g0, 1, rs, rd, 4096);
  expect_pattern(dst, 4096, 11, "rank 0's data reached the real rank 1");
  close_both(g0, g1);

  // When only the stranger comes, rank 0's timeout says what happened to rank 1's slot.
  auto f = std::async(std::launch::async, [&] { return t0->connect(spec(0, addrs, comm + 1, key, 1500ms)); });
  rawpeer::dial_with_key(t0->address(), auth::derive_comm_key(kToken, comm + 1, {}), comm + 1, 1, 2, 0,
                         addrs);
  FC_EXPECT_THROW(ConnectTimeout, f.get(), e, {
    FC_CHECK(e.peer() == 1, "names rank 1");
    FC_CHECK(std::string(e.what()).find("failed authentication") != std::string::npos, e.what());
  });
}

void test_fake_listener() {
  auto t1 = loopback();
  // A listener without the key where rank 0 is published: it answers hellos with challenges
  // proved with a wrong key, and records what the dialer sends next.
  std::string fake_address;
  const int lfd = rawpeer::listen_loopback(&fake_address);
  const std::vector<std::string> addrs = {fake_address, t1->address()};
  const uint64_t comm = 0xFA4E;
  const auth::Key key = auth::derive_comm_key(kToken, comm, shares(2));
  const auth::Key wrong = auth::derive_comm_key(kToken, comm, {});
  std::vector<uint8_t> heard;
  std::thread fake([&] {
    int fd = ::accept(lfd, nullptr, nullptr);
    timeval tv{3, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    wire::WireHandshake hello{};
    if (rawpeer::recv_exact(fd, &hello, sizeof hello)) {
      hs::Side me{&wrong, comm, 0, 2, &addrs};
      const wire::WireHandshake c = hs::challenge(hello, me, auth::random_nonce());
      rawpeer::send_all(fd, &c, sizeof c);
      char buf[512];
      ssize_t r;
      while ((r = ::recv(fd, buf, sizeof buf, 0)) > 0) heard.insert(heard.end(), buf, buf + r);
    }
    ::close(fd);
  });
  const auto t = Clock::now();
  FC_EXPECT_THROW(TransportError, t1->connect(spec(1, addrs, comm, key)), e, {
    FC_CHECK(e.peer() == 0, "names rank 0");
    FC_CHECK(dynamic_cast<const ConnectTimeout*>(&e) == nullptr, "at once, not at the timeout");
    FC_CHECK(std::string(e.what()).find("authentication failed") != std::string::npos, e.what());
  });
  FC_CHECK(Clock::now() - t < 2s, "the dialer gave up quickly");
  fake.join();
  ::close(lfd);
  FC_CHECK(heard.size() == sizeof(wire::WireHandshake),
           "the fake heard one message: " + std::to_string(heard.size()));
  FC_CHECK(message_at(heard, 0).kind == wire::kReject && message_at(heard, 0).reason == wire::kBadAuth,
           "a reject, never a proof");
}

void test_default_bind() {
  auto t = make_socket_transport(SocketOptions{});
  std::string host;
  int port = 0;
  rawpeer::split(t->address(), &host, &port);
  FC_CHECK(host != "0.0.0.0" && !host.empty(), "advertises an address: " + t->address());
  if (host == "127.0.0.1") {
    std::printf("  (this host has no network address: the listener is on loopback)\n");
  } else {
    const int fd = rawpeer::dial("127.0.0.1:" + std::to_string(port));
    FC_CHECK(fd < 0, "not listening on loopback (only on " + host + ")");
    if (fd >= 0) ::close(fd);
  }
  const int fd = rawpeer::dial(t->address());
  FC_CHECK(fd >= 0, "listening on its advertised address");
  if (fd >= 0) ::close(fd);
  SocketOptions all;
  all.bind_host = "0.0.0.0";
  auto w = make_socket_transport(all);
  rawpeer::split(w->address(), &host, &port);
  const int lo = rawpeer::dial("127.0.0.1:" + std::to_string(port));
  FC_CHECK(lo >= 0, "0.0.0.0 listens on every interface, loopback included");
  if (lo >= 0) ::close(lo);
}

void test_handshake_deadline() {
  auto t = loopback();
  auto elapsed_to_eof = [&](const std::vector<uint8_t>& send, int64_t* bytes) {
    int fd = rawpeer::dial(t->address());
    const auto start = Clock::now();
    if (!send.empty()) rawpeer::send_all(fd, send.data(), send.size());
    *bytes = rawpeer::drain_to_eof(fd, 5000ms);
    ::close(fd);
    return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
  };
  int64_t bytes = 0;
  int64_t ms = elapsed_to_eof({}, &bytes);
  FC_CHECK(bytes == 0 && ms >= 1300 && ms <= 2000, "silent: closed after " + std::to_string(ms) + " ms");
  ms = elapsed_to_eof(std::vector<uint8_t>(50, 0x46), &bytes);
  FC_CHECK(bytes == 0 && ms <= 2000, "half a message: closed after " + std::to_string(ms) + " ms");
  // A well-formed hello for a group nobody here connects: told to dial again, then closed.
  const std::vector<std::string> addrs = {t->address(), "127.0.0.1:9"};
  const auth::Key k = auth::derive_comm_key(1, 2, {});
  hs::Side me{&k, 0x404, 1, 2, &addrs};
  const wire::WireHandshake h = hs::hello(me, 0, auth::random_nonce());
  int fd = rawpeer::dial(t->address());
  const auto start = Clock::now();
  rawpeer::send_all(fd, &h, sizeof h);
  wire::WireHandshake reply{};
  FC_CHECK(rawpeer::recv_exact(fd, &reply, sizeof reply) && reply.kind == wire::kReject &&
               reply.reason == wire::kNotReady,
           "a parked hello hears kNotReady");
  ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
  FC_CHECK(ms <= 2000, "within 2 s: " + std::to_string(ms) + " ms");
  ::close(fd);
  FC_CHECK(fctest::wait_for([&] { return t->stats().handshakes == 0; }, 2000ms), "no handshake left");
}

void test_handshake_cap() {
  auto t0 = loopback(), t1 = loopback();
  std::vector<int> held;
  for (int i = 0; i < 400; ++i) {
    const int fd = rawpeer::dial(t0->address());
    if (fd >= 0) held.push_back(fd);
  }
  FC_CHECK(held.size() == 400, "400 half-open connections: " + std::to_string(held.size()));
  // The oldest are closed to make room as the newer ones are accepted (well before the newest
  // reach their deadline).
  uint64_t peak = 0;
  int closed = 0;
  fctest::wait_for(
      [&] {
        peak = std::max(peak, t0->stats().handshakes);
        closed = 0;
        for (int fd : held) {
          char b;
          if (::recv(fd, &b, 1, MSG_DONTWAIT) == 0) closed++;
        }
        return closed >= 400 - 128;
      },
      1200ms);
  FC_CHECK(peak > 0 && peak <= 128, "at most 128 in their handshake: " + std::to_string(peak));
  FC_CHECK(closed >= 400 - 128, "the oldest were closed: " + std::to_string(closed));
  // While the newest 128 are still held, a real group connects (room is made for it).
  const std::vector<std::string> addrs = {t0->address(), t1->address()};
  const auth::Key key = auth::derive_comm_key(kToken, 0xCA9, shares(2));
  auto f = std::async(std::launch::async, [&] { return t1->connect(spec(1, addrs, 0xCA9, key)); });
  auto g0 = t0->connect(spec(0, addrs, 0xCA9, key));
  auto g1 = f.get();
  FC_CHECK(g0->status(1) == PeerState::kConnected, "a real rank gets in during the flood");
  close_both(g0, g1);
  FC_CHECK(fctest::wait_for([&] { return t0->stats().handshakes == 0; }, 2500ms), "all expired");
  for (int fd : held) ::close(fd);
}

// accept() failing for want of fds: a child process with its fd limit at its current use owns
// the transport; the parent's dials wait in the backlog. The child's CPU must stay near idle,
// the failure is logged once, and once fds are back the waiting dials are accepted.
void test_accept_backoff() {
  int up[2], err[2];
  FC_CHECK(pipe(up) == 0 && pipe(err) == 0, "pipes");
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = fork();
  if (pid == 0) {
    ::close(up[0]);
    ::close(err[0]);
    dup2(err[1], 2);
    auto t = loopback();
    const std::string a = t->address() + "\n";
    if (::write(up[1], a.data(), a.size()) < 0) _exit(3);
    int highest = 0;
    for (int fd = 0; fd < 4096; ++fd) {
      if (fcntl(fd, F_GETFD) != -1) highest = fd;
    }
    rlimit lim{};
    getrlimit(RLIMIT_NOFILE, &lim);
    const rlimit saved = lim;
    lim.rlim_cur = static_cast<rlim_t>(highest + 1);
    setrlimit(RLIMIT_NOFILE, &lim);
    while (open("/dev/null", O_RDONLY | O_CLOEXEC) >= 0) {}  // fill the holes: no fd can be opened now
    std::this_thread::sleep_for(300ms);                      // the parent dials meanwhile
    rusage r0{}, r1{};
    getrusage(RUSAGE_SELF, &r0);
    std::this_thread::sleep_for(1500ms);
    getrusage(RUSAGE_SELF, &r1);
    auto us = [](const rusage& r) {
      return (r.ru_utime.tv_sec + r.ru_stime.tv_sec) * 1000000LL + r.ru_utime.tv_usec + r.ru_stime.tv_usec;
    };
    const long long cpu_us = us(r1) - us(r0);
    const uint64_t during = t->stats().handshakes;
    setrlimit(RLIMIT_NOFILE, &saved);
    const bool resumed = fctest::wait_for([&] { return t->stats().handshakes > 0; }, 2000ms);
    const std::string report =
        std::to_string(cpu_us) + " " + std::to_string(during) + " " + std::to_string(resumed ? 1 : 0) + "\n";
    if (::write(up[1], report.data(), report.size()) < 0) _exit(3);
    std::this_thread::sleep_for(200ms);
    _exit(0);
  }
  ::close(up[1]);
  ::close(err[1]);
  FILE* in = fdopen(up[0], "r");
  char line[256] = {};
  FC_CHECK(std::fgets(line, sizeof line, in) != nullptr, "child address");
  std::string addr(line);
  addr.erase(addr.find_last_not_of('\n') + 1);
  std::this_thread::sleep_for(100ms);
  std::vector<int> dials;
  for (int i = 0; i < 16; ++i) {
    const int fd = rawpeer::dial(addr);
    if (fd >= 0) dials.push_back(fd);
  }
  long long cpu_us = -1;
  unsigned long long during = 0;
  int resumed = 0;
  FC_CHECK(std::fgets(line, sizeof line, in) != nullptr &&
               std::sscanf(line, "%lld %llu %d", &cpu_us, &during, &resumed) == 3,
           "child report");
  std::string log;
  char buf[4096];
  ssize_t r;
  while ((r = ::read(err[0], buf, sizeof buf)) > 0) log.append(buf, static_cast<size_t>(r));
  int status = 0;
  waitpid(pid, &status, 0);
  for (int fd : dials) ::close(fd);
  std::fclose(in);
  ::close(err[0]);
  std::printf("  out of fds: %lld us of CPU in 1.5 s, %llu handshakes; accepts resumed: %d\n", cpu_us, during,
              resumed);
  FC_CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child exited cleanly");
  FC_CHECK(cpu_us >= 0 && cpu_us < 150000,
           "no busy loop while accept() fails: " + std::to_string(cpu_us) + " us");
  FC_CHECK(during == 0, "nothing accepted without fds");
  FC_CHECK(resumed == 1, "the waiting dials are accepted once fds are back");
  size_t count = 0;
  for (size_t p = log.find("accept failed"); p != std::string::npos; p = log.find("accept failed", p + 1))
    count++;
  FC_CHECK(count == 1, "logged once: " + log);
}

}  // namespace

int main() {
  signal(SIGPIPE, SIG_IGN);
  // First, while this process has no threads: it forks.
  fctest::run_case("accept() out of fds: paused, no spin, logged once, resumed", test_accept_backoff);
  fctest::run_case("a captured handshake has no secret; its replay is refused", test_capture_and_replay);
  fctest::run_case("a stranger with the sniffed token dialing first is refused",
                   test_stranger_with_sniffed_token);
  fctest::run_case("a listener without the key: the dialer fails at once, sends no proof",
                   test_fake_listener);
  fctest::run_case("the listener binds the host's address by default", test_default_bind);
  fctest::run_case("handshakes are closed within 2 s", test_handshake_deadline);
  fctest::run_case("at most 128 handshakes; a real rank still gets in", test_handshake_cap);
  return fctest::finish();
}
