// A transport and the proxy across real processes, on the backend named by the first argument
// (backends.h).
//
// The parent never creates a transport or a thread (it forks). Each child creates its
// transport on 127.0.0.1, sends "ADDR <address>" up its pipe, receives every rank's address,
// runs its part and reports "FAIL ..." lines and a final "DONE". Children exchange nothing but
// what the transport carries.
#include <arpa/inet.h>
#include <fcntl.h>
#include <glob.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <vector>

#include "../socket/wire.h"
#include "backends.h"
#include "fusedcomm/rdma/proxy.h"
#include "fusedcomm/rdma/transport.h"
#include "test_util.h"

using namespace fusedcomm::rdma;
using namespace std::chrono_literals;
using fctest::monotonic_ns;

namespace {

fctest::TestBackend g_backend;

// ------------------------------------------------------------------------------------------
// Process harness

bool write_all(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    ssize_t r = ::write(fd, s.data() + off, s.size() - off);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    off += static_cast<size_t>(r);
  }
  return true;
}

// Reads '\n'-terminated lines from a pipe with a deadline (a zero timeout: what is there now).
struct LineReader {
  int fd = -1;
  std::string buf;
  bool eof = false;
  bool read_line(std::string* line, std::chrono::milliseconds timeout) {
    const int64_t deadline = monotonic_ns() + timeout.count() * 1000000;
    while (true) {
      size_t nl = buf.find('\n');
      if (nl != std::string::npos) {
        *line = buf.substr(0, nl);
        buf.erase(0, nl + 1);
        return true;
      }
      if (eof) return false;
      int64_t left_ms = (deadline - monotonic_ns()) / 1000000;
      if (left_ms < 0 || (left_ms == 0 && timeout.count() > 0)) return false;
      pollfd p{fd, POLLIN, 0};
      int n = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left_ms, 1000)));
      if (n <= 0 && timeout.count() == 0) return false;  // a zero timeout looks once
      if (n <= 0) continue;
      char tmp[4096];
      ssize_t r = ::read(fd, tmp, sizeof tmp);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) {
        eof = true;
        continue;
      }
      buf.append(tmp, static_cast<size_t>(r));
    }
  }
};

// What a child sees.
struct ChildCtx {
  int rank = 0;
  int world = 0;
  std::vector<std::string> addresses;
  Transport* transport = nullptr;
  int up = -1;  // to the parent
  LineReader down;
  void say(const std::string& line) const { write_all(up, line + "\n"); }
  bool hear(std::string* line, std::chrono::milliseconds timeout) { return down.read_line(line, timeout); }
};

struct Child {
  pid_t pid = -1;
  int to_child = -1;
  LineReader from_child;
  std::string addr;
  bool reaped = false;
  int status = 0;
};

using ChildFn = std::function<void(ChildCtx&)>;

// libfabric: rank r's peer timeout, where a test sets one (else the backend's).
std::vector<std::chrono::milliseconds> g_peer_timeouts;

// Forks `world` children, exchanges addresses, and returns them running `fn`.
std::vector<Child> launch(int world, const ChildFn& fn) {
  std::vector<Child> kids(world);
  std::vector<int> parent_fds;
  for (int r = 0; r < world; ++r) {
    int up[2], down[2];
    if (pipe(up) != 0 || pipe(down) != 0) {
      std::perror("pipe");
      std::exit(2);
    }
    std::fflush(stdout);
    std::fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
      for (int fd : parent_fds) ::close(fd);
      ::close(up[0]);
      ::close(down[1]);
      fctest::g_check_failures = 0;  // the parent's failures so far are not this child's
      ChildCtx ctx;
      ctx.rank = r;
      ctx.world = world;
      ctx.up = up[1];
      ctx.down.fd = down[0];
      fctest::g_report = [&ctx](const std::string& s) {
        ctx.say("FAIL rank " + std::to_string(ctx.rank) + ": " + s);
      };
      int code = 0;
      try {
        // Ranks differ in per-process choices: socket receivers 1, 2, 3, 1, ...; odd ranks
        // poll for 500 us after each message; on libfabric, ranks from 2 on send their signals
        // as messages (every receiver takes both kinds).
        fctest::TestBackend b = g_backend;
        if (r >= 2) b.signal = LibfabricSignal::kMessage;
        if (r < static_cast<int>(g_peer_timeouts.size())) b.peer_timeout = g_peer_timeouts[r];
        auto t = b.make(1 + r % 3, std::chrono::microseconds(r % 2 ? 500 : 0));
        ctx.transport = t.get();
        ctx.say("ADDR " + t->address());
        std::string line;
        if (!ctx.hear(&line, 20s)) throw std::runtime_error("no address list from the parent");
        std::istringstream in(line);
        ctx.addresses.resize(world);
        for (auto& a : ctx.addresses) in >> a;
        fn(ctx);
      } catch (const std::exception& e) {
        fctest::fail_at(__FILE__, __LINE__, std::string("child threw: ") + e.what());
      }
      code = fctest::g_check_failures.load() ? 1 : 0;
      ctx.say("DONE");
      std::fflush(stdout);
      std::fflush(stderr);
      _exit(code);
    }
    ::close(up[1]);
    ::close(down[0]);
    kids[r].pid = pid;
    kids[r].to_child = down[1];
    kids[r].from_child.fd = up[0];
    parent_fds.push_back(up[0]);
    parent_fds.push_back(down[1]);
  }
  std::string list;
  for (int r = 0; r < world; ++r) {
    std::string line;
    if (!kids[r].from_child.read_line(&line, 20s) || line.rfind("ADDR ", 0) != 0) {
      fctest::fail_at(__FILE__, __LINE__, "child " + std::to_string(r) + " sent no address");
      continue;
    }
    kids[r].addr = line.substr(5);
    list += (r ? " " : "") + kids[r].addr;
  }
  for (auto& k : kids) write_all(k.to_child, list + "\n");
  return kids;
}

// Reads child lines until "DONE" (forwarding FAIL lines as failures), then reaps it. Kills
// whatever is still running at the deadline.
void finish_children(std::vector<Child>& kids, std::chrono::milliseconds timeout,
                     const std::vector<int>& expect_killed = {}) {
  const int64_t deadline = monotonic_ns() + timeout.count() * 1000000;
  for (size_t r = 0; r < kids.size(); ++r) {
    Child& k = kids[r];
    bool killed =
        std::find(expect_killed.begin(), expect_killed.end(), static_cast<int>(r)) != expect_killed.end();
    std::string line;
    bool done = killed;
    while (!done) {
      int64_t left = std::max<int64_t>(0, (deadline - monotonic_ns()) / 1000000);
      if (!k.from_child.read_line(&line, std::chrono::milliseconds(left))) break;
      if (line == "DONE") {
        done = true;
      } else if (line.rfind("FAIL ", 0) == 0) {
        fctest::fail_at(__FILE__, __LINE__, line.substr(5));
      }
    }
    if (!done) {
      fctest::fail_at(__FILE__, __LINE__, "child " + std::to_string(r) + " did not finish in time");
      kill(k.pid, SIGKILL);
    }
    int status = 0;
    // Bounded reap: a child that said DONE exits at once.
    for (int i = 0; i < 500; ++i) {
      pid_t p = waitpid(k.pid, &status, WNOHANG);
      if (p == k.pid) break;
      if (i == 499) {
        kill(k.pid, SIGKILL);
        waitpid(k.pid, &status, 0);
      }
      std::this_thread::sleep_for(10ms);
    }
    if (!killed) {
      FC_CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0,
               "child " + std::to_string(r) + " exited with status " + std::to_string(status));
    }
    ::close(k.to_child);
    ::close(k.from_child.fd);
  }
}

GroupSpec spec_for(const ChildCtx& c, uint64_t token, uint64_t comm, std::chrono::milliseconds timeout) {
  GroupSpec s;
  s.comm_id = comm;
  s.key = auth::derive_comm_key(token, comm, {});
  s.rank = c.rank;
  s.world = c.world;
  s.addresses = c.addresses;
  s.connect_timeout = timeout;
  return s;
}

// ------------------------------------------------------------------------------------------
// All-to-all traffic

constexpr uint64_t kSlotBytes = uint64_t{4} << 20;  // receive slot per source rank
constexpr int kSigStride = 8;                       // signal words per source rank
// signal word indices inside a source's stride
constexpr int kSigData = 0;  // chunks landed (phase base + k)
constexpr int kSigDone = 1;  // phase done marker (phase base + 7), sent after a stale signal
constexpr int kSigAck = 2;   // barrier between phases

uint64_t seed_of(int phase, int src, int dst) {
  return fctest::splitmix64((uint64_t(phase) << 40) ^ (uint64_t(src) << 20) ^ uint64_t(dst) ^ 0x5eedull);
}
uint64_t phase_base(int phase) { return uint64_t(phase) * 1000000; }

// The chunk sizes of one (src, dst) pair: tiny odd sizes, then a few MiB in odd pieces.
std::vector<uint64_t> plan(int src, int dst) {
  std::vector<uint64_t> v = {0, 1, 2, 3, 7, 64, 4093, 65537, 262147, 0};
  uint64_t big = (uint64_t{3} << 20) + uint64_t(src * 7 + dst * 3) * 1237 + 11;
  const uint64_t pieces[] = {65521, 131071, 99991, 12345, 1, 524287};
  for (size_t i = 0; big > 0; ++i) {
    uint64_t n = std::min(big, pieces[i % 6]);
    v.push_back(n);
    big -= n;
  }
  return v;
}

uint64_t plan_total(int src, int dst) {
  uint64_t t = 0;
  for (uint64_t n : plan(src, dst)) t += n;
  return t;
}

struct Buffers {
  std::vector<uint8_t> send;  // world * kSlotBytes: the bytes rank r sends to each dst
  std::vector<uint8_t> recv;  // world * kSlotBytes: slot per source
  std::vector<uint64_t> sig;  // world * kSigStride
  Region send_r, recv_r, sig_r;
};

void fill_send(Buffers& b, int phase, int rank, int world) {
  for (int d = 0; d < world; ++d) {
    fctest::fill_pattern(b.send.data() + d * kSlotBytes, plan_total(rank, d), seed_of(phase, rank, d));
  }
}

// Every write of one phase from `rank`, in per-destination order, interleaved across dsts.
std::vector<WriteOp> phase_ops(const Buffers& b, const std::vector<uint64_t>& peer_keys_recv,
                               const std::vector<uint64_t>& peer_keys_sig, int phase, int rank, int world) {
  std::vector<std::vector<WriteOp>> per(world);
  for (int d = 0; d < world; ++d) {
    uint64_t off = 0, k = 0;
    for (uint64_t n : plan(rank, d)) {
      WriteOp op;
      op.peer = d;
      op.src_key = b.send_r.key;
      op.src_offset = d * kSlotBytes + off;
      op.dst_key = peer_keys_recv[d];
      op.dst_offset = uint64_t(rank) * kSlotBytes + off;
      op.bytes = n;
      op.signal_key = peer_keys_sig[d];
      op.signal_offset = (uint64_t(rank) * kSigStride + kSigData) * 8;
      op.signal_value = phase_base(phase) + (++k);
      per[d].push_back(op);
      off += n;
    }
    WriteOp stale;  // a smaller value must not lower the word
    stale.peer = d;
    stale.signal_key = peer_keys_sig[d];
    stale.signal_offset = (uint64_t(rank) * kSigStride + kSigData) * 8;
    stale.signal_value = phase_base(phase) + 1;
    per[d].push_back(stale);
    WriteOp done = stale;
    done.signal_offset = (uint64_t(rank) * kSigStride + kSigDone) * 8;
    done.signal_value = phase_base(phase) + 7;
    per[d].push_back(done);
  }
  std::vector<WriteOp> out;
  for (size_t i = 0;; ++i) {
    bool any = false;
    for (int d = 0; d < world; ++d) {
      if (i < per[d].size()) {
        out.push_back(per[d][i]);
        any = true;
      }
    }
    if (!any) break;
  }
  return out;
}

uint64_t load_acquire(const std::vector<uint64_t>& sig, size_t i) {
  return std::atomic_ref<uint64_t>(const_cast<uint64_t&>(sig[i])).load(std::memory_order_acquire);
}

// Waits for every source's phase, checking each chunk as soon as its signal covers it (data
// must be visible before the signal), then every byte of every slot once more.
void receive_and_verify(Buffers& b, PeerGroup& g, int phase, int rank, int world) {
  const int64_t deadline = monotonic_ns() + int64_t{40} * 1000000000;
  std::vector<std::vector<uint64_t>> plans(world);
  std::vector<uint64_t> seen(world, 0), chunk_off(world, 0);
  for (int s = 0; s < world; ++s) plans[s] = plan(s, rank);
  int remaining = world;
  std::vector<bool> done(world, false);
  while (remaining > 0) {
    bool progress = false;
    for (int s = 0; s < world; ++s) {
      if (done[s]) continue;
      const uint64_t base = phase_base(phase);
      const uint64_t dword = load_acquire(b.sig, s * kSigStride + kSigDone);
      const uint64_t v = load_acquire(b.sig, s * kSigStride + kSigData);
      const uint64_t landed = v > base ? v - base : 0;
      while (seen[s] < landed && seen[s] < plans[s].size()) {
        const uint64_t n = plans[s][seen[s]];
        const uint8_t* p = b.recv.data() + s * kSlotBytes + chunk_off[s];
        int64_t bad = fctest::first_mismatch(p, n, seed_of(phase, s, rank), chunk_off[s]);
        FC_CHECK(bad < 0, "phase " + std::to_string(phase) + ": chunk " + std::to_string(seen[s]) +
                              " from rank " + std::to_string(s) + " wrong at byte " +
                              std::to_string(chunk_off[s] + bad) + " although its signal arrived");
        chunk_off[s] += n;
        seen[s]++;
        progress = true;
      }
      if (dword >= base + 7) {
        FC_CHECK(v == base + plans[s].size(), "phase " + std::to_string(phase) + ": signal from rank " +
                                                  std::to_string(s) + " is " + std::to_string(v) + ", want " +
                                                  std::to_string(base + plans[s].size()) +
                                                  " (a stale value must not lower it)");
        FC_CHECK(seen[s] == plans[s].size(), "not every chunk was seen");
        int64_t bad = fctest::first_mismatch(b.recv.data() + s * kSlotBytes, plan_total(s, rank),
                                             seed_of(phase, s, rank));
        FC_CHECK(bad < 0, "phase " + std::to_string(phase) + ": slot of rank " + std::to_string(s) +
                              " differs at byte " + std::to_string(bad));
        done[s] = true;
        remaining--;
        progress = true;
      }
    }
    if (monotonic_ns() > deadline) {
      FC_CHECK(false, "phase " + std::to_string(phase) + ": timed out waiting for " +
                          std::to_string(remaining) + " source(s)");
      return;
    }
    if (!progress) {
      g.check();
      std::this_thread::sleep_for(100us);
    }
  }
}

// Every rank signals every rank (itself included) and waits for all: a barrier out of signals.
void signal_barrier(Buffers& b, PeerGroup& g, const std::vector<uint64_t>& peer_keys_sig, int rank, int world,
                    uint64_t value) {
  for (int d = 0; d < world; ++d) {
    WriteOp op;
    op.peer = d;
    op.signal_key = peer_keys_sig[d];
    op.signal_offset = (uint64_t(rank) * kSigStride + kSigAck) * 8;
    op.signal_value = value;
    g.write(op);
  }
  bool ok = fctest::wait_for(
      [&] {
        for (int s = 0; s < world; ++s) {
          if (load_acquire(b.sig, s * kSigStride + kSigAck) < value) return false;
        }
        return true;
      },
      30s);
  FC_CHECK(ok, "barrier " + std::to_string(value) + " timed out");
}

// Region keys are per process: they travel through the parent here, as they travel through
// the bootstrap allGather in the runtime.
void child_traffic(ChildCtx& c) {
  const int W = c.world;
  Buffers b;
  b.send.assign(W * kSlotBytes, 0);
  b.recv.assign(W * kSlotBytes, 0xEE);
  b.sig.assign(W * kSigStride, 0);
  b.send_r = c.transport->register_memory(b.send.data(), b.send.size());
  b.recv_r = c.transport->register_memory(b.recv.data(), b.recv.size());
  b.sig_r = c.transport->register_memory(b.sig.data(), b.sig.size() * 8);
  FC_CHECK(b.send_r.key && b.recv_r.key && b.sig_r.key && b.send_r.key != b.recv_r.key,
           "region keys must be fresh and nonzero");
  FC_CHECK(c.transport->stats().registered_regions == 3, "three regions registered");

  // Keys travel through the parent (stand-in for the bootstrap allGather).
  c.say("KEYS " + std::to_string(b.recv_r.key) + " " + std::to_string(b.sig_r.key));
  std::string line;
  if (!c.hear(&line, 20s)) throw std::runtime_error("no key list");
  std::istringstream in(line);
  std::vector<uint64_t> recv_keys(W), sig_keys(W);
  for (int r = 0; r < W; ++r) in >> recv_keys[r] >> sig_keys[r];

  auto g = c.transport->connect(spec_for(c, 0xC0FFEE, 7, 20s));
  FC_CHECK(g->world() == W && g->rank() == c.rank, "group shape");
  for (int p = 0; p < W; ++p) FC_CHECK(g->status(p) == PeerState::kConnected, "all connected");

  // Phase 1: direct writes.
  fill_send(b, 1, c.rank, W);
  for (const WriteOp& op : phase_ops(b, recv_keys, sig_keys, 1, c.rank, W)) g->write(op);
  receive_and_verify(b, *g, 1, c.rank, W);
  signal_barrier(b, *g, sig_keys, c.rank, W, 1);

  // Phase 2: the same traffic through a ring and the proxy, two producer threads. The proxy
  // says each data write's signal has one writer that only raises it (true: this rank alone
  // writes its words at a peer, in rising order per destination; the stale value is a signal
  // alone, which backends always apply as a max), so libfabric tcp places those words with
  // their payloads' last piece, and the checks see the data first all the same.
  fill_send(b, 2, c.rank, W);
  const uint32_t cap = 64;
  void* ring_mem = std::aligned_alloc(4096, (ProxyRing::bytes_for(cap) + 4095) / 4096 * 4096);
  std::memset(ring_mem, 0, ProxyRing::bytes_for(cap));
  {
    ProxyRing ring(ring_mem, cap);
    Proxy proxy(ring, *g, nullptr, std::chrono::microseconds(0), /*signals_sole_writer=*/true);
    std::vector<WriteOp> ops = phase_ops(b, recv_keys, sig_keys, 2, c.rank, W);
    std::atomic<int> post_errors{0};
    auto producer = [&](int parity) {
      try {
        for (const WriteOp& op : ops) {
          if (op.peer % 2 == parity) proxy.ring().post(op, 20000ms);
        }
      } catch (const std::exception& e) {
        post_errors++;
        fctest::fail_at(__FILE__, __LINE__, std::string("post failed: ") + e.what());
      }
    };
    std::thread p0(producer, 0), p1(producer, 1);
    p0.join();
    p1.join();
    FC_CHECK(post_errors == 0, "posts");
    proxy.stop(true, 20000ms);
    FC_CHECK(proxy.error().empty(), "proxy error: " + proxy.error());
    FC_CHECK(proxy.failed_peer() == -2, "no failed peer");
    const RingHeader* h = ring.header();
    FC_CHECK(
        h->completed == ops.size() && h->consumed == ops.size() && h->reserved == ops.size(),
        "ring counters: completed " + std::to_string(h->completed) + " of " + std::to_string(ops.size()));
  }
  std::free(ring_mem);
  receive_and_verify(b, *g, 2, c.rank, W);
  signal_barrier(b, *g, sig_keys, c.rank, W, 2);

  g->check();
  auto st = c.transport->stats();
  FC_CHECK(st.open_connections == uint64_t(W - 1), "open connections " + std::to_string(st.open_connections));
  uint64_t want_sent = 0, want_received = 0;  // two phases; writes to self stay local
  for (int p = 0; p < W; ++p) {
    if (p == c.rank) continue;
    want_sent += 2 * plan_total(c.rank, p);
    want_received += 2 * plan_total(p, c.rank);
  }
  FC_CHECK(st.bytes_sent == want_sent && st.bytes_received == want_received,
           "byte counters: sent " + std::to_string(st.bytes_sent) + " want " + std::to_string(want_sent) +
               ", received " + std::to_string(st.bytes_received) + " want " + std::to_string(want_received));
  const auto t0 = std::chrono::steady_clock::now();
  g->close(10000ms);
  const auto close_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
  FC_CHECK(close_ms < 5000, "polite close took " + std::to_string(close_ms) + " ms");
  FC_CHECK(c.transport->stats().open_connections == 0, "connections released by close");
  g.reset();
  c.transport->deregister_memory(b.send_r);
  c.transport->deregister_memory(b.recv_r);
  c.transport->deregister_memory(b.sig_r);
  FC_CHECK(c.transport->stats().registered_regions == 0, "regions deregistered");
}

void test_all_to_all() {
  const int W = 4;
  auto kids = launch(W, child_traffic);
  std::string keys;
  for (int r = 0; r < W; ++r) {
    std::string line;
    if (!kids[r].from_child.read_line(&line, 20s) || line.rfind("KEYS ", 0) != 0) {
      FC_CHECK(false, "child " + std::to_string(r) + " sent no keys: " + line);
      line = "KEYS 0 0";
    }
    keys += line.substr(5) + " ";
  }
  for (auto& k : kids) write_all(k.to_child, keys + "\n");
  finish_children(kids, 90s);
}

// ------------------------------------------------------------------------------------------
// Handshake rejection and timeouts

void test_wrong_token() {
  auto kids = launch(2, [](ChildCtx& c) {
    const uint64_t token = c.rank == 1 ? 0xBAD : 0x600D;
    GroupSpec s = spec_for(c, token, 11, 3000ms);
    const int64_t t0 = monotonic_ns();
    if (c.rank == 0) {
      FC_EXPECT_THROW(ConnectTimeout, c.transport->connect(s), e, {
        FC_CHECK(e.peer() == 1, "timeout names rank 1, got " + std::to_string(e.peer()));
        FC_CHECK(std::string(e.what()).find("rank 1 at " + c.addresses[1]) != std::string::npos,
                 std::string("message names rank 1 and its address: ") + e.what());
        FC_CHECK(std::string(e.what()).find("authentication") != std::string::npos,
                 std::string("and that its dial failed authentication: ") + e.what());
      });
    } else {
      FC_EXPECT_THROW(TransportError, c.transport->connect(s), e, {
        FC_CHECK(e.peer() == 0, "rejection names rank 0");
        FC_CHECK(std::string(e.what()).find("authentication failed") != std::string::npos,
                 std::string("says why: ") + e.what());
        FC_CHECK(dynamic_cast<const ConnectTimeout*>(&e) == nullptr, "a rejection, not a timeout");
      });
    }
    FC_CHECK(monotonic_ns() - t0 < int64_t{6} * 1000000000, "bounded");
    FC_CHECK(c.transport->stats().open_connections == 0, "the rejected connection is not kept");
  });
  finish_children(kids, 30s);
}

// A raw client that speaks a wrong version, then garbage, to a rank that is connecting.
void test_bad_handshakes() {
  auto kids = launch(2, [](ChildCtx& c) {
    if (c.rank == 1) return;  // rank 1 never connects: rank 0 must time out naming it
    std::thread raw([&] {
      std::string host = c.addresses[0].substr(0, c.addresses[0].rfind(':'));
      int port = std::stoi(c.addresses[0].substr(c.addresses[0].rfind(':') + 1));
      auto dial = [&] {
        int fd = ::socket(AF_INET, SOCK_STREAM, 0);
        sockaddr_in sa{};
        sa.sin_family = AF_INET;
        sa.sin_port = htons(static_cast<uint16_t>(port));
        inet_pton(AF_INET, host.c_str(), &sa.sin_addr);
        FC_CHECK(::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0, "raw dial");
        timeval tv{5, 0};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        return fd;
      };
      {
        int fd = dial();
        wire::WireHandshake h{};
        h.magic = wire::kHelloMagic;
        h.version = kTransportApiVersion + 41;
        h.kind = wire::kHello;
        h.comm_id = 12;
        h.rank = 1;
        h.world = 2;
        h.target_rank = 0;
        FC_CHECK(::send(fd, &h, sizeof h, 0) == sizeof h, "send hello");
        wire::WireHandshake reply{};
        ssize_t n = ::recv(fd, &reply, sizeof reply, MSG_WAITALL);
        FC_CHECK(n == sizeof reply && reply.kind == wire::kReject && reply.reason == wire::kBadVersion,
                 "a wrong version gets a reject: n=" + std::to_string(n));
        char b;
        FC_CHECK(::recv(fd, &b, 1, 0) == 0, "and the connection is closed");
        ::close(fd);
      }
      {
        int fd = dial();
        char junk[sizeof(wire::WireHandshake)];
        std::memset(junk, 0x5a, sizeof junk);
        FC_CHECK(::send(fd, junk, sizeof junk, 0) == sizeof junk, "send junk");
        char b;
        FC_CHECK(::recv(fd, &b, 1, 0) == 0, "garbage is dropped without a reply");
        ::close(fd);
      }
    });
    FC_EXPECT_THROW(ConnectTimeout, c.transport->connect(spec_for(c, 0x600D, 12, 2500ms)), e,
                    { FC_CHECK(e.peer() == 1, "names rank 1"); });
    raw.join();
    FC_CHECK(c.transport->stats().open_connections == 0, "nothing accepted into the group");
  });
  finish_children(kids, 30s);
}

void test_missing_rank() {
  auto kids = launch(3, [](ChildCtx& c) {
    if (c.rank == 2) {  // alive and listening, but never calls connect
      std::string line;
      c.hear(&line, 30s);
      return;
    }
    const int64_t t0 = monotonic_ns();
    FC_EXPECT_THROW(ConnectTimeout, c.transport->connect(spec_for(c, 1, 21, 2000ms)), e, {
      FC_CHECK(e.peer() == 2, "names rank 2, got " + std::to_string(e.peer()));
      std::string m = e.what();
      FC_CHECK(m.find("rank 2 at " + c.addresses[2]) != std::string::npos, "message: " + m);
      // The other rank may have given up first and left: it is named after rank 2, if at all.
      FC_CHECK(m.find("missing rank 2 at") != std::string::npos, "rank 2 is named first: " + m);
      const size_t other = m.find("rank " + std::to_string(1 - c.rank) + " at");
      FC_CHECK(other == std::string::npos || m.find("connected, then closed", other) != std::string::npos,
               "the other rank is only named as having left: " + m);
    });
    const int64_t ms = (monotonic_ns() - t0) / 1000000;
    FC_CHECK(ms >= 1900 && ms < 5000, "timeout honoured: " + std::to_string(ms) + " ms");
    FC_CHECK(c.transport->stats().open_connections == 0, "connections of the failed group released");
  });
  // Ranks 0 and 1 finish first; then release rank 2.
  std::vector<Child> first(kids.begin(), kids.begin() + 2);
  finish_children(first, 30s);
  write_all(kids[2].to_child, "EXIT\n");
  std::vector<Child> last(kids.begin() + 2, kids.end());
  finish_children(last, 30s);
}

// ------------------------------------------------------------------------------------------
// A rank dies mid-traffic

// A child's side of the traffic tests: its regions, the peers' destination keys (through the
// parent), its group, and rounds of 64 KiB to every peer.
struct PeerTraffic {
  std::vector<uint8_t> out, in_buf;
  Region src, dst;
  std::vector<uint64_t> keys;
  std::unique_ptr<PeerGroup> g;

  PeerTraffic(ChildCtx& c, uint64_t comm) : out(c.world * (1 << 16), 1), in_buf(c.world * (1 << 16), 0) {
    src = c.transport->register_memory(out.data(), out.size());
    dst = c.transport->register_memory(in_buf.data(), in_buf.size());
    c.say("KEY " + std::to_string(dst.key));
    std::string line;
    if (!c.hear(&line, 20s)) throw std::runtime_error("no keys");
    std::istringstream in(line);
    keys.resize(c.world);
    for (auto& k : keys) in >> k;
    g = c.transport->connect(spec_for(c, 5, comm, 20s));
    c.say("STARTED");
  }
  void round(const ChildCtx& c) {
    for (int d = 0; d < c.world; ++d) {
      if (d == c.rank) continue;
      WriteOp op;
      op.peer = d;
      op.src_key = src.key;
      op.src_offset = d * (1 << 16);
      op.dst_key = keys[d];
      op.dst_offset = c.rank * (1 << 16);
      op.bytes = 1 << 16;
      g->write(op);
    }
  }
};

// The parent's side: hands every child the others' keys and waits until all are connected.
void start_traffic(std::vector<Child>& kids) {
  std::string keys;
  for (auto& k : kids) {
    std::string line;
    k.from_child.read_line(&line, 20s);
    keys += (line.size() > 4 ? line.substr(4) : "0") + " ";
  }
  for (auto& k : kids) write_all(k.to_child, keys + "\n");
  for (auto& k : kids) {
    std::string line;
    FC_CHECK(k.from_child.read_line(&line, 30s) && line == "STARTED", "rank started: " + line);
  }
}

void one_line(std::string* s) {
  for (char& ch : *s)
    if (ch == '\n') ch = ' ';
}

void test_kill_mid_traffic() {
  const int W = 4, victim = 3;
  auto kids = launch(W, [](ChildCtx& c) {
    PeerTraffic t(c, 31);
    const int64_t deadline = monotonic_ns() + int64_t{30} * 1000000000;
    int64_t when = 0;
    int peer = -1;
    std::string msg = "none";
    uint64_t n = 0;
    while (monotonic_ns() < deadline) {
      try {
        t.round(c);
        if (++n % 8 == 0) t.g->check();
      } catch (const TransportError& e) {
        when = monotonic_ns();
        peer = e.peer();
        msg = e.what();
        break;
      }
    }
    one_line(&msg);
    c.say("DETECT " + std::to_string(when) + " " + std::to_string(peer) + " " + msg);
    std::string line;
    c.hear(&line, 30s);  // stay alive (connections open) until the parent has seen everyone
    t.g->abort();
  });
  start_traffic(kids);
  std::this_thread::sleep_for(300ms);  // traffic is flowing
  const int64_t killed_at = monotonic_ns();
  kill(kids[victim].pid, SIGKILL);
  for (int r = 0; r < W; ++r) {
    if (r == victim) continue;
    std::string line;
    bool got = kids[r].from_child.read_line(&line, 30s);
    FC_CHECK(got && line.rfind("DETECT ", 0) == 0, "rank " + std::to_string(r) + " reported: " + line);
    if (!got) continue;
    std::istringstream in(line.substr(7));
    int64_t when = 0;
    int peer = -1;
    in >> when >> peer;
    std::string msg;
    std::getline(in, msg);
    FC_CHECK(peer == victim,
             "rank " + std::to_string(r) + " blames rank " + std::to_string(peer) + ": " + msg);
    FC_CHECK(msg.find("rank 3 at " + kids[victim].addr) != std::string::npos, "message names rank 3: " + msg);
    const double delay = (when - killed_at) / 1e9;
    FC_CHECK(when > 0 && delay <= 1.0,
             "rank " + std::to_string(r) + " noticed after " + std::to_string(delay) + " s");
    std::printf("  rank %d saw the kill after %.3f s: %s\n", r, delay, msg.c_str());
  }
  for (int r = 0; r < W; ++r) {
    if (r != victim) write_all(kids[r].to_child, "EXIT\n");
  }
  finish_children(kids, 30s, {victim});
  // A killed process cannot remove its shm region (/dev/shm/<pid>:...): the test does.
  glob_t found{};
  if (glob(("/dev/shm/" + std::to_string(kids[victim].pid) + ":*").c_str(), 0, nullptr, &found) == 0) {
    for (size_t i = 0; i < found.gl_pathc; ++i) ::unlink(found.gl_pathv[i]);
  }
  globfree(&found);
}

// A rank whose whole process stops (SIGSTOP) for longer than its own peer timeout must not fail
// its peers when it resumes: their heartbeats wait unread in its queue, and silence counts only
// while it listens. The peers' timeout is long enough to wait for it.
void test_own_pause_fails_nobody() {
  const int W = 3, victim = 2;
  g_peer_timeouts = {std::chrono::milliseconds(30000), std::chrono::milliseconds(30000),
                     std::chrono::milliseconds(1000)};
  auto kids = launch(W, [](ChildCtx& c) {
    PeerTraffic t(c, 33);
    uint64_t n = 0;
    std::string verdict = "OK", line;
    // Rounds until the parent says stop; every write and check must succeed.
    while (!c.hear(&line, 0ms)) {
      try {
        t.round(c);
        t.g->check();
        ++n;
      } catch (const TransportError& e) {
        verdict = std::string("FAILED ") + e.what();
        one_line(&verdict);
        break;
      }
    }
    c.say(verdict == "OK" ? "OK " + std::to_string(n) : verdict);
    c.hear(&line, 30s);
    t.g->close(10000ms);
  });
  g_peer_timeouts.clear();
  start_traffic(kids);
  std::this_thread::sleep_for(300ms);  // traffic is flowing
  kill(kids[victim].pid, SIGSTOP);
  std::this_thread::sleep_for(2500ms);  // 2.5 × the victim's own peer timeout
  kill(kids[victim].pid, SIGCONT);
  std::this_thread::sleep_for(1000ms);  // traffic flows again
  for (auto& k : kids) write_all(k.to_child, "STOP\n");
  for (int r = 0; r < W; ++r) {
    std::string line;
    const bool got = kids[r].from_child.read_line(&line, 30s);
    FC_CHECK(got && line.rfind("OK ", 0) == 0, "rank " + std::to_string(r) + " after the pause: " + line);
    if (got) std::printf("  rank %d: %s\n", r, line.c_str());
  }
  for (auto& k : kids) write_all(k.to_child, "EXIT\n");
  finish_children(kids, 30s);
}

}  // namespace

int main(int argc, char** argv) {
  signal(SIGPIPE, SIG_IGN);
  g_backend = fctest::backend_from_args(argc, argv);
  fctest::run_case("all-to-all traffic, 4 processes, direct and through the proxy", test_all_to_all);
  fctest::run_case("a wrong job token fails authentication", test_wrong_token);
  if (g_backend.socket()) {
    fctest::run_case("wrong version and garbage handshakes are dropped", test_bad_handshakes);
  } else {
    std::printf("[SKIP] raw TCP handshakes: the socket backend's listener only\n");
  }
  fctest::run_case("a rank that never connects gives ConnectTimeout naming it", test_missing_rank);
  if (g_backend.label != "libfabric-shm") {
    fctest::run_case("SIGKILL of a rank mid-traffic is reported naming it", test_kill_mid_traffic);
  } else {
    // libfabric's shm provider (1.17) guards each process's shared-memory queues with spin
    // locks in the shared segment: a process killed while it holds one leaves its peers
    // spinning inside fi_send / fi_cq_read for ever, where no transport can bound the wait.
    // shm only reaches ranks of one host; killed peers are tested on tcp and on sockets.
    std::printf("[SKIP] SIGKILL mid-traffic on shm: a process killed inside libfabric's shm provider can leave"
                " its peers spinning on a lock in their shared segment (provider limitation)\n");
  }
  if (!g_backend.socket()) {
    fctest::run_case("a rank's own pause longer than its peer timeout fails nobody", test_own_pause_fails_nobody);
  } else {
    std::printf("[SKIP] own pause: the socket backend has no liveness timer (a closed connection says it)\n");
  }
  return fctest::finish();
}
