// Contract details of a transport and the proxy, in one process: two transports talk over
// loopback (rank 1's half of every connect runs on a helper thread), on the backend named by
// the first argument (backends.h).
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backends.h"
#include "fusedcomm/rdma/one_way_pairs.h"
#include "fusedcomm/rdma/proxy.h"
#include "fusedcomm/rdma/transport.h"
#include "test_util.h"

using namespace fusedcomm::rdma;
using namespace std::chrono_literals;

namespace {

// main() runs the cases with one receiver thread per transport and no busy polling, then again
// with three receivers (socket: connections then move from the accepting receiver to their
// readers, so each case exercises that hand-over) and a busy-poll window for receivers,
// progress threads and proxies (the polling paths then carry every case).
fctest::TestBackend g_backend;
int g_receive_threads = 1;
std::chrono::microseconds g_busy_poll{0};

std::unique_ptr<Transport> loopback() { return g_backend.make(g_receive_threads, g_busy_poll); }

GroupSpec spec(int rank, int world, std::vector<std::string> addrs, uint64_t comm,
               std::chrono::milliseconds timeout = 5000ms) {
  GroupSpec s;
  s.comm_id = comm;
  s.key = auth::derive_comm_key(0xABCDEF, comm, {});
  s.rank = rank;
  s.world = world;
  s.addresses = std::move(addrs);
  s.connect_timeout = timeout;
  return s;
}

struct Pair {
  std::unique_ptr<PeerGroup> g0, g1;
};

Pair connect_pair(Transport& t0, Transport& t1, uint64_t comm) {
  std::vector<std::string> addrs = {t0.address(), t1.address()};
  auto f = std::async(std::launch::async, [&] { return t1.connect(spec(1, 2, addrs, comm)); });
  Pair p;
  p.g0 = t0.connect(spec(0, 2, addrs, comm));
  p.g1 = f.get();
  return p;
}

// A registered buffer with signal words at its end.
struct Buf {
  std::vector<uint64_t> words;
  Region r;
  Buf(Transport& t, size_t n_words) : words(n_words, 0) { r = t.register_memory(words.data(), n_words * 8); }
  uint64_t load(size_t i) const {
    return std::atomic_ref<uint64_t>(const_cast<uint64_t&>(words[i])).load(std::memory_order_acquire);
  }
};

void test_probes() {
  Availability s = probe_socket();
  FC_CHECK(s.available, "socket backend available: " + s.reason);
  Availability v = probe_ibverbs();
  Availability e = probe_efa();
  Availability f = probe_libfabric();
  std::printf("  ibverbs: %s\n  efa: %s\n  libfabric: %s\n", v.reason.c_str(), e.reason.c_str(), f.reason.c_str());
  FC_CHECK(!f.reason.empty(), "libfabric reason");
  // The raw ibverbs and efa backends are not built (libfabric drives those NICs), so they are
  // unavailable everywhere, with a reason.
  FC_CHECK(!v.available && !v.reason.empty(), "ibverbs reason");
  FC_CHECK(!e.available && !e.reason.empty(), "efa reason");
  FC_CHECK(v.reason.find("libibverbs") != std::string::npos || v.reason.find("RDMA") != std::string::npos,
           "ibverbs reason names the library or the device: " + v.reason);
}

void test_addresses() {
  auto t = loopback();
  std::string a = t->address();
  FC_CHECK(t->api_version() == kTransportApiVersion, "version");
  FC_CHECK(std::string(t->name()) == transport_kind_name(g_backend.kind), std::string("name ") + t->name());
  FC_CHECK(t->describe().rfind(t->name(), 0) == 0, "describe() starts with the name: " + t->describe());
  std::unique_ptr<Transport> d;
  if (g_backend.socket()) {
    FC_CHECK(a.rfind("127.0.0.1:", 0) == 0 && std::stoi(a.substr(10)) > 0, "loopback address " + a);
    // Default options: wildcard bind, advertised under the host's own address; reachable.
    d = make_socket_transport(SocketOptions{});
    std::string da = d->address();
    FC_CHECK(da.find("0.0.0.0") == std::string::npos && da.rfind(':') != std::string::npos && da.rfind(':') > 0,
             "advertised address " + da);
  } else {
    // "ofi:<provider>:<endpoint name in hex>", no separator the bootstrap uses.
    FC_CHECK(a.rfind("ofi:", 0) == 0 && a.find_first_of(" #") == std::string::npos, "libfabric address " + a);
    std::printf("  %s\n", t->describe().c_str());
    // The provider's default endpoints per rail (LibfabricOptions::stripes = 0): two on tcp,
    // whose large writes are split over both; one elsewhere.
    const std::string per_rail =
        g_backend.provider == LibfabricProvider::kTcp ? "2 endpoints per rail" : "1 endpoint per rail";
    const std::string said = t->describe();
    FC_CHECK(said.find(per_rail) != std::string::npos, "describe() says " + per_rail + ": " + said);
    // Default options: the provider's own choice of interface (tcp: the host's primary address).
    TransportOptions o;
    o.libfabric.provider = g_backend.provider;
    d = make_transport(TransportKind::kLibfabric, o);
  }
  const std::string da = d->address();
  auto p = connect_pair(*d, *t, 1);
  FC_CHECK(p.g0->status(1) == PeerState::kConnected, "default-bound transport is reachable at " + da);
  auto f = std::async(std::launch::async, [&] { p.g1->close(5000ms); });
  p.g0->close(5000ms);
  f.get();
}

void test_world_one_and_self_writes() {
  auto t = loopback();
  Buf b(*t, 64);
  for (int i = 0; i < 8; ++i) b.words[i] = 1000 + i;
  auto g = t->connect(spec(0, 1, {}, 3));
  FC_CHECK(g->world() == 1 && g->rank() == 0, "world 1");
  WriteOp op;
  op.peer = 0;
  op.src_key = b.r.key;
  op.src_offset = 0;
  op.dst_key = b.r.key;
  op.dst_offset = 16 * 8;
  op.bytes = 8 * 8;
  op.signal_key = b.r.key;
  op.signal_offset = 63 * 8;
  op.signal_value = 9;
  g->write(op);
  FC_CHECK(b.load(63) == 9 && b.words[16] == 1000 && b.words[23] == 1007, "self write copies and signals");
  op.signal_value = 4;
  g->write(op);
  FC_CHECK(b.load(63) == 9, "signal keeps the max");
  FC_CHECK(t->stats().open_connections == 0, "no connections for world 1");
  g->close(1000ms);
}

void test_graceful_close_is_not_a_failure() {
  auto t0 = loopback(), t1 = loopback();
  Buf b0(*t0, 16), b1(*t1, 16);
  auto p = connect_pair(*t0, *t1, 4);
  auto closing = std::async(std::launch::async, [&] { p.g1->close(5000ms); });
  bool closed = fctest::wait_for([&] { return p.g0->status(1) == PeerState::kClosed; }, 3000ms);
  FC_CHECK(closed, "rank 0 sees rank 1 closed");
  try {
    p.g0->check();
  } catch (const std::exception& e) {
    FC_CHECK(false, std::string("a polite close must not fail check(): ") + e.what());
  }
  WriteOp op;
  op.peer = 1;
  op.signal_key = b1.r.key;
  op.signal_value = 1;
  FC_EXPECT_THROW(TransportError, p.g0->write(op), e, {
    FC_CHECK(e.peer() == 1, "write to a closed peer names it");
    FC_CHECK(std::string(e.what()).find("rank 1 at " + t1->address()) != std::string::npos, e.what());
  });
  const auto t = std::chrono::steady_clock::now();
  p.g0->close(5000ms);
  closing.get();
  FC_CHECK(std::chrono::steady_clock::now() - t < 2000ms, "both closes finish promptly");
  FC_CHECK(t0->stats().open_connections == 0 && t1->stats().open_connections == 0, "sockets released");
}

void test_abort_and_destroy_are_failures() {
  auto t0 = loopback(), t1 = loopback();
  for (int how = 0; how < 2; ++how) {
    auto p = connect_pair(*t0, *t1, 5 + how);
    if (how == 0) {
      p.g1->abort();
    } else {
      p.g1.reset();  // destroyed without close
    }
    bool failed = fctest::wait_for([&] { return p.g0->status(1) == PeerState::kFailed; }, 3000ms);
    FC_CHECK(failed, "peer failure seen");
    FC_EXPECT_THROW(TransportError, p.g0->check(), e, {
      FC_CHECK(e.peer() == 1, "check names rank 1");
      FC_CHECK(std::string(e.what()) == "peer rank 1 at " + t1->address() + " closed the connection",
               std::string("message: ") + e.what());
    });
    p.g0->close(1000ms);
  }
  FC_CHECK(t0->stats().open_connections == 0 && t1->stats().open_connections == 0,
           "sockets released: " + std::to_string(t0->stats().open_connections) + ", " +
               std::to_string(t1->stats().open_connections));
}

void test_receiver_validates_writes() {
  auto t0 = loopback(), t1 = loopback();
  Buf src(*t0, 1024), dst(*t1, 128);
  // 0: past the end, 1: unknown key, 2: bad signal word
  for (int kind = 0; kind < 3; ++kind) {
    auto p = connect_pair(*t0, *t1, 10 + kind);
    WriteOp op;
    op.peer = 1;
    op.src_key = src.r.key;
    op.dst_key = kind == 1 ? dst.r.key + 999 : dst.r.key;
    op.dst_offset = kind == 0 ? 120 * 8 : 0;
    op.bytes = 16 * 8;
    if (kind == 2) {
      op.bytes = 8;
      op.signal_key = dst.r.key;
      op.signal_offset = 128 * 8;  // one past the last word
      op.signal_value = 1;
    }
    // The socket writer cannot know and the receiver refuses; the libfabric writer asks the
    // receiver where the region lives, and the receiver refuses then (the write throws).
    if (g_backend.socket()) {
      p.g0->write(op);
    } else {
      FC_EXPECT_THROW(TransportError, p.g0->write(op), e, { FC_CHECK(e.peer() == 1, "names the receiver"); });
    }
    bool failed = fctest::wait_for([&] { return p.g1->status(0) == PeerState::kFailed; }, 3000ms);
    FC_CHECK(failed, "receiver failed the connection (kind " + std::to_string(kind) + ")");
    FC_EXPECT_THROW(TransportError, p.g1->check(), e, {
      FC_CHECK(e.peer() == 0, "names the writer");
      std::string m = e.what();
      FC_CHECK(m.find("peer rank 0 at " + t0->address()) == 0, m);
      const char* want[] = {"out of range", "unknown region", "invalid word"};
      FC_CHECK(m.find(want[kind]) != std::string::npos, m);
    });
    bool seen = fctest::wait_for([&] { return p.g0->status(1) == PeerState::kFailed; }, 3000ms);
    FC_CHECK(seen, "the writer sees the connection dropped");
    for (uint64_t w : dst.words) FC_CHECK(w == 0, "nothing landed");
    p.g0->close(500ms);
    p.g1->close(500ms);
  }
  // Local argument errors throw at the sender and leave the connection alone.
  auto p = connect_pair(*t0, *t1, 20);
  WriteOp bad;
  bad.peer = 1;
  bad.src_key = src.r.key;
  bad.src_offset = 1020 * 8;
  bad.bytes = 8 * 8;
  bad.dst_key = dst.r.key;
  FC_EXPECT_THROW(std::invalid_argument, p.g0->write(bad), e, {});
  bad.bytes = 0;
  bad.signal_key = dst.r.key;
  bad.signal_offset = 4;
  FC_EXPECT_THROW(std::invalid_argument, p.g0->write(bad), e, {});
  bad.peer = 2;
  FC_EXPECT_THROW(std::invalid_argument, p.g0->write(bad), e, {});
  WriteOp good;
  good.peer = 1;
  good.src_key = src.r.key;
  good.bytes = 8;
  good.dst_key = dst.r.key;
  good.dst_offset = 8;
  good.signal_key = dst.r.key;
  good.signal_offset = 0;
  good.signal_value = 77;
  src.words[0] = 0x1234;
  p.g0->write(good);
  FC_CHECK(fctest::wait_for([&] { return dst.load(0) >= 77; }, 3000ms) && dst.words[1] == 0x1234,
           "connection still works");
  auto f = std::async(std::launch::async, [&] { p.g1->close(2000ms); });
  p.g0->close(2000ms);
  f.get();
}

void test_connect_errors() {
  auto t0 = loopback(), t1 = loopback();
  // A lower rank whose port has no listener: refused until the timeout.
  std::string dead;
  {
    auto gone = loopback();
    dead = gone->address();
  }
  const auto start = std::chrono::steady_clock::now();
  FC_EXPECT_THROW(ConnectTimeout, t1->connect(spec(1, 2, {dead, t1->address()}, 30, 800ms)), e, {
    FC_CHECK(e.peer() == 0, "names rank 0");
    std::string m = e.what();
    FC_CHECK(m.find("rank 0 at " + dead) != std::string::npos, m);
    FC_CHECK(!g_backend.socket() || m.find("refused") != std::string::npos, m);
  });
  FC_CHECK(std::chrono::steady_clock::now() - start < 3000ms, "bounded");
  // One communicator id cannot be open twice on one transport.
  auto p = connect_pair(*t0, *t1, 31);
  FC_EXPECT_THROW(TransportError, t0->connect(spec(0, 2, {t0->address(), t1->address()}, 31, 200ms)), e,
                  { FC_CHECK(std::string(e.what()).find("already open") != std::string::npos, e.what()); });
  FC_EXPECT_THROW(std::invalid_argument, t0->connect(spec(2, 2, {"a:1", "b:1"}, 32)), e, {});
  FC_EXPECT_THROW(std::invalid_argument, t0->connect(spec(0, 3, {"a:1", "b:1"}, 33)), e, {});
  p.g0->abort();
  p.g1->abort();
}

void test_transport_destroyed_under_a_group() {
  auto t0 = loopback();
  auto t1 = loopback();
  Buf b(*t1, 8);
  auto p = connect_pair(*t0, *t1, 40);
  t1.reset();  // groups outlive their transport: they are aborted, never crash
  WriteOp op;
  op.peer = 0;
  op.signal_key = 1;
  op.signal_value = 1;
  FC_EXPECT_THROW(TransportError, p.g1->write(op), e, {});
  FC_CHECK(fctest::wait_for([&] { return p.g0->status(1) != PeerState::kConnected; }, 3000ms),
           "the peer notices");
  p.g1.reset();
  p.g0->close(500ms);
}

// ------------------------------------------------------------------------------------------
// Proxy ring

struct RingMem {
  void* p;
  explicit RingMem(uint32_t cap) {
    size_t n = (ProxyRing::bytes_for(cap) + 4095) / 4096 * 4096;
    p = std::aligned_alloc(4096, n);
    std::memset(p, 0, n);
  }
  ~RingMem() { std::free(p); }
};

void test_ring_basics() {
  FC_CHECK(ProxyRing::bytes_for(8) == 128 + 8 * 128, "layout size");
  RingMem m(8);
  FC_EXPECT_THROW(std::invalid_argument, ProxyRing(m.p, 6), e, {});
  FC_EXPECT_THROW(std::invalid_argument, ProxyRing(static_cast<char*>(m.p) + 64, 8), e, {});
  ProxyRing ring(m.p, 8);
  FC_CHECK(reinterpret_cast<char*>(ring.slots()) == static_cast<char*>(m.p) + 128, "slots after header");
  WriteOp op;
  op.peer = 1;
  op.bytes = 5;
  for (uint64_t i = 1; i <= 8; ++i) FC_CHECK(ring.post(op, 100ms) == i, "sequence numbers");
  FC_CHECK(ring.slots()[3].seq == 4 && ring.slots()[3].bytes == 5 && ring.slots()[3].peer == 1,
           "command stored");
  const auto t = std::chrono::steady_clock::now();
  FC_EXPECT_THROW(TransportError, ring.post(op, 150ms), e,
                  { FC_CHECK(std::string(e.what()).find("full") != std::string::npos, e.what()); });
  const auto waited = std::chrono::steady_clock::now() - t;
  FC_CHECK(waited >= 140ms && waited < 2000ms, "bounded wait while full");
  FC_CHECK(ring.header()->reserved == 8, "a timed-out post leaves no hole");
  ring.header()->abort = 1;
  ring.header()->consumed = 8;
  FC_EXPECT_THROW(TransportError, ring.post(op, 100ms), e,
                  { FC_CHECK(std::string(e.what()).find("aborted") != std::string::npos, e.what()); });
}

void test_proxy_wraps_and_reports_errors() {
  auto t0 = loopback(), t1 = loopback();
  Buf src(*t0, 4096), dst(*t1, 4096 + 8);
  for (size_t i = 0; i < 4096; ++i) src.words[i] = fctest::splitmix64(i);
  auto p = connect_pair(*t0, *t1, 50);
  {
    RingMem m(4);  // tiny: many laps, producers wait on a full ring
    ProxyRing ring(m.p, 4);
    Proxy proxy(ring, *p.g0, nullptr, g_busy_poll);
    const int n = 1000;
    for (int i = 0; i < n; ++i) {
      WriteOp op;
      op.peer = 1;
      op.src_key = src.r.key;
      op.src_offset = uint64_t(i % 4096) * 8;
      op.dst_key = dst.r.key;
      op.dst_offset = uint64_t(i % 4096) * 8;
      op.bytes = 8 * uint64_t(1 + i % 3);
      if (op.src_offset + op.bytes > 4096 * 8) op.bytes = 8;
      op.signal_key = dst.r.key;
      op.signal_offset = 4096 * 8;
      op.signal_value = uint64_t(i + 1);
      ring.post(op, 5000ms);
    }
    FC_CHECK(fctest::wait_for([&] { return dst.load(4096) == uint64_t(n); }, 10000ms), "all signals arrived");
    for (int i = 0; i < n && i < 4096; ++i) {
      if (dst.words[i] != src.words[i]) {
        FC_CHECK(false, "word " + std::to_string(i));
        break;
      }
    }
    proxy.stop(true, 5000ms);
    FC_CHECK(proxy.error().empty() && proxy.failed_peer() == -2, "healthy: " + proxy.error());
    FC_CHECK(ring.header()->completed == uint64_t(n), "completed counts every command");
    proxy.stop(true, 100ms);  // idempotent
  }
  {
    // An invalid command is recorded (no single peer at fault), not a crash.
    RingMem m(8);
    ProxyRing ring(m.p, 8);
    Proxy proxy(ring, *p.g0, nullptr, g_busy_poll);
    WriteOp op;
    op.peer = 1;
    op.src_key = 0xdead;
    op.bytes = 8;
    ring.post(op, 100ms);
    FC_CHECK(fctest::wait_for([&] { return !proxy.error().empty(); }, 3000ms), "error recorded");
    FC_CHECK(proxy.failed_peer() == -1, "no peer blamed");
    FC_CHECK(std::atomic_ref<uint64_t>(ring.header()->abort).load() != 0, "abort word raised for producers");
    FC_EXPECT_THROW(TransportError, ring.post(op, 100ms), e, {});
  }
  {
    // A dead peer stops the proxy with the transport's error naming it.
    RingMem m(8);
    ProxyRing ring(m.p, 8);
    Proxy proxy(ring, *p.g0, nullptr, g_busy_poll);
    p.g1->abort();
    FC_CHECK(fctest::wait_for([&] { return p.g0->status(1) == PeerState::kFailed; }, 3000ms), "peer failed");
    WriteOp op;
    op.peer = 1;
    op.signal_key = dst.r.key;
    op.signal_value = 1;
    ring.post(op, 100ms);
    FC_CHECK(fctest::wait_for([&] { return proxy.failed_peer() == 1; }, 3000ms), "peer 1 blamed");
    FC_CHECK(proxy.error().find("peer rank 1 at " + t1->address()) != std::string::npos, proxy.error());
    proxy.stop(true, 100ms);
  }
  p.g0->close(500ms);
}

// The GPU producers' protocol (kernels/proxy/detail/proxy_device.cuh), played by host threads: slots
// from a counter outside the ring (header.reserved stays 0), a wait for space against
// header.consumed, the fields, then seq released; four producers publish out of order.
void test_gpu_style_producers() {
  auto t0 = loopback(), t1 = loopback();
  Buf src(*t0, 4096), dst(*t1, 4096 + 8);
  for (size_t i = 0; i < 4096; ++i) src.words[i] = fctest::splitmix64(i + 7);
  auto p = connect_pair(*t0, *t1, 51);
  RingMem m(8);
  ProxyRing ring(m.p, 8);
  Proxy proxy(ring, *p.g0, nullptr, g_busy_poll);
  std::atomic<uint64_t> next{0};
  auto post = [&](const WriteOp& op) {  // proxy_post_write, on the host
    const uint64_t slot = next.fetch_add(1);
    while (slot - std::atomic_ref<uint64_t>(ring.header()->consumed).load(std::memory_order_acquire) >=
           ring.capacity()) {
      std::this_thread::yield();
    }
    ProxyCommand& c = ring.slots()[slot & (ring.capacity() - 1)];
    fill_command(c, op);
    std::atomic_ref<uint64_t>(c.seq).store(slot + 1, std::memory_order_release);
  };
  constexpr int kPerThread = 256, kThreads = 4;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int j = 0; j < kPerThread; ++j) {
        const uint64_t i = uint64_t(t) * kPerThread + j;  // word i of src to word i of dst
        WriteOp op;
        op.peer = 1;
        op.src_key = src.r.key;
        op.src_offset = i * 8;
        op.dst_key = dst.r.key;
        op.dst_offset = i * 8;
        op.bytes = 8;
        post(op);
      }
    });
  }
  for (auto& th : threads) th.join();
  const uint64_t n = kThreads * kPerThread;
  FC_CHECK(fctest::wait_for([&] { return std::atomic_ref<uint64_t>(ring.header()->completed).load() == n; },
                            10000ms),
           "every command handed to the transport");
  // Writes between one pair are delivered in order: a last, signal-only write fences them.
  WriteOp last;
  last.peer = 1;
  last.signal_key = dst.r.key;
  last.signal_offset = 4096 * 8;
  last.signal_value = 1;
  post(last);
  FC_CHECK(fctest::wait_for([&] { return dst.load(4096) == 1; }, 10000ms), "the fencing signal arrived");
  int bad = 0;
  for (uint64_t i = 0; i < n; ++i) bad += dst.words[i] != src.words[i];
  FC_CHECK(bad == 0, std::to_string(bad) + " words differ");
  FC_CHECK(ring.header()->reserved == 0, "GPU-style producers leave header.reserved alone");
  proxy.stop(true, 5000ms);
  FC_CHECK(proxy.error().empty(), "healthy: " + proxy.error());
  p.g0->close(500ms);
}

}  // namespace

// connect_one_way_pairs: each direction of a pair on a connection of its own (two per pair on
// each transport), writes both ways landing with their signals, a polite close of both groups,
// and a peer's abort seen as a failure of the writes to it.
void test_one_way_pairs() {
  auto t0 = loopback(), t1 = loopback();
  Buf b0(*t0, 1024 + 8), b1(*t1, 1024 + 8);
  for (size_t i = 0; i < 1024; ++i) {
    b0.words[i] = fctest::splitmix64(i);
    b1.words[i] = fctest::splitmix64(i + 5000);
  }
  std::vector<std::string> addrs = {t0->address(), t1->address()};
  for (int round = 0; round < 2; ++round) {
    auto f = std::async(std::launch::async,
                        [&] { return connect_one_way_pairs(*t1, spec(1, 2, addrs, 60 + round)); });
    std::unique_ptr<PeerGroup> g0 = connect_one_way_pairs(*t0, spec(0, 2, addrs, 60 + round));
    std::unique_ptr<PeerGroup> g1 = f.get();
    FC_CHECK(g0->rank() == 0 && g1->rank() == 1 && g0->world() == 2, "ranks and world");
    FC_CHECK(t0->stats().open_connections == 2 && t1->stats().open_connections == 2,
             "one connection per direction: " + std::to_string(t0->stats().open_connections));
    // Words 0..511 of each go to 512..1023 of the other, both ways at once, 64 writes each.
    auto writer = [](PeerGroup& g, const Buf& src, const Buf& dst, int peer) {
      for (int i = 0; i < 64; ++i) {
        WriteOp op;
        op.peer = peer;
        op.src_key = src.r.key;
        op.src_offset = uint64_t(i) * 64;
        op.dst_key = dst.r.key;
        op.dst_offset = 512 * 8 + uint64_t(i) * 64;
        op.bytes = 64;
        op.signal_key = dst.r.key;
        op.signal_offset = 1024 * 8;
        op.signal_value = uint64_t(i + 1);
        g.write(op);
      }
    };
    std::vector<uint64_t> want0(b1.words.begin(), b1.words.begin() + 512);
    std::vector<uint64_t> want1(b0.words.begin(), b0.words.begin() + 512);
    auto w1 = std::async(std::launch::async, [&] { writer(*g1, b1, b0, 0); });
    writer(*g0, b0, b1, 1);
    w1.get();
    FC_CHECK(fctest::wait_for([&] { return b0.load(1024) == 64 && b1.load(1024) == 64; }, 5000ms),
             "signals both ways");
    FC_CHECK(std::equal(want0.begin(), want0.end(), b0.words.begin() + 512),
             "rank 1's words landed at rank 0");
    FC_CHECK(std::equal(want1.begin(), want1.end(), b1.words.begin() + 512),
             "rank 0's words landed at rank 1");
    std::atomic_ref<uint64_t>(b0.words[1024]).store(0);
    std::atomic_ref<uint64_t>(b1.words[1024]).store(0);
    FC_CHECK(g0->status(1) == PeerState::kConnected && g1->status(0) == PeerState::kConnected, "connected");
    if (round == 0) {
      auto closing = std::async(std::launch::async, [&] { g1->close(5000ms); });
      g0->close(5000ms);
      closing.get();
      FC_CHECK(t0->stats().open_connections == 0 && t1->stats().open_connections == 0,
               "both groups' sockets released");
    } else {
      g1->abort();
      FC_CHECK(fctest::wait_for([&] { return g0->status(1) == PeerState::kFailed; }, 3000ms),
               "rank 1's abort fails rank 0's writes to it");
      WriteOp op;
      op.peer = 1;
      op.signal_key = b1.r.key;
      op.signal_value = 1;
      FC_EXPECT_THROW(TransportError, g0->write(op), e,
                      { FC_CHECK(e.peer() == 1, "the write names rank 1"); });
      g0->abort();
    }
  }
}

// Striping: three groups between the same two transports, one per lane, written at once from
// a thread per lane and side (as a link's lanes are); every lane's payloads and signal arrive.
void test_lanes() {
  constexpr int kLanes = 3, kWrites = 200;
  constexpr uint64_t kWords = 512;  // per write
  auto t0 = loopback(), t1 = loopback();
  std::vector<std::string> addrs = {t0->address(), t1->address()};
  // Per side: a source of kWrites * kWords words, and a destination with one such area per
  // lane and a signal word per lane after them.
  const size_t area = kWrites * kWords, n = kLanes * area + kLanes;
  Buf s0(*t0, area), s1(*t1, area), d0(*t0, n), d1(*t1, n);
  for (size_t i = 0; i < area; ++i) {
    s0.words[i] = fctest::splitmix64(i);
    s1.words[i] = fctest::splitmix64(i + 1000000);
  }
  std::vector<std::unique_ptr<PeerGroup>> g0(kLanes), g1(kLanes);
  for (int l = 0; l < kLanes; ++l) {
    GroupSpec a = spec(0, 2, addrs, 90 + l), b = spec(1, 2, addrs, 90 + l);
    a.lane = b.lane = static_cast<uint32_t>(l);
    auto f = std::async(std::launch::async, [&] { return connect_one_way_pairs(*t1, b); });
    g0[l] = connect_one_way_pairs(*t0, a);
    g1[l] = f.get();
  }
  auto writer = [&](PeerGroup& g, const Buf& src, const Buf& dst, int peer, int lane) {
    for (int i = 0; i < kWrites; ++i) {
      WriteOp op;
      op.peer = peer;
      op.src_key = src.r.key;
      op.src_offset = uint64_t(i) * kWords * 8;
      op.dst_key = dst.r.key;
      op.dst_offset = (uint64_t(lane) * area + uint64_t(i) * kWords) * 8;
      op.bytes = kWords * 8;
      op.signal_key = dst.r.key;
      op.signal_offset = (kLanes * area + lane) * 8;
      op.signal_value = uint64_t(i + 1);
      g.write(op);
    }
  };
  std::vector<std::future<void>> writers;
  for (int l = 0; l < kLanes; ++l) {
    writers.push_back(std::async(std::launch::async, [&, l] { writer(*g0[l], s0, d1, 1, l); }));
    writers.push_back(std::async(std::launch::async, [&, l] { writer(*g1[l], s1, d0, 0, l); }));
  }
  for (auto& w : writers) w.get();
  FC_CHECK(fctest::wait_for(
               [&] {
                 for (int l = 0; l < kLanes; ++l) {
                   if (d0.load(kLanes * area + l) != kWrites || d1.load(kLanes * area + l) != kWrites)
                     return false;
                 }
                 return true;
               },
               5000ms),
           "every lane's last signal arrived, both ways");
  for (int l = 0; l < kLanes; ++l) {
    FC_CHECK(std::equal(s1.words.begin(), s1.words.end(), d0.words.begin() + l * area),
             "lane " + std::to_string(l) + " to rank 0");
    FC_CHECK(std::equal(s0.words.begin(), s0.words.end(), d1.words.begin() + l * area),
             "lane " + std::to_string(l) + " to rank 1");
  }
  FC_CHECK(t0->stats().open_connections == 2 * kLanes, "two connections per lane");
  std::vector<std::future<void>> closing;
  for (int l = 0; l < kLanes; ++l)
    closing.push_back(std::async(std::launch::async, [&, l] { g1[l]->close(5000ms); }));
  for (int l = 0; l < kLanes; ++l) g0[l]->close(5000ms);
  for (auto& c : closing) c.get();
  FC_CHECK(t0->stats().open_connections == 0 && t1->stats().open_connections == 0,
           "every lane's sockets released");
}

// Writes of several MiB (the libfabric backend splits them over a rail's endpoints, each part
// on its own connection): every byte of a write has arrived by the time its signal is seen, for
// uneven sizes that no part boundary divides evenly.
void test_large_writes() {
  constexpr int kWrites = 6;
  constexpr uint64_t kMaxWords = (uint64_t{5} << 20) / 8;  // 5 MiB per area
  auto words_of = [](int i) { return (uint64_t{4} << 20) / 8 + 1237 * uint64_t(i) + 3; };
  auto t0 = loopback(), t1 = loopback();
  Buf src(*t0, kMaxWords), dst(*t1, kWrites * kMaxWords + 1);
  for (uint64_t i = 0; i < kMaxWords; ++i) src.words[i] = fctest::splitmix64(i + 77);
  auto p = connect_pair(*t0, *t1, 110);
  const size_t signal = kWrites * kMaxWords;
  auto writer = std::async(std::launch::async, [&] {
    for (int i = 0; i < kWrites; ++i) {
      WriteOp op;
      op.peer = 1;
      op.src_key = src.r.key;
      op.src_offset = 8 * uint64_t(i);  // a source that starts off its region's start
      op.dst_key = dst.r.key;
      op.dst_offset = uint64_t(i) * kMaxWords * 8;
      op.bytes = (words_of(i) - uint64_t(i)) * 8;
      op.signal_key = dst.r.key;
      op.signal_offset = signal * 8;
      op.signal_value = uint64_t(i + 1);
      p.g0->write(op);
    }
  });
  for (int v = 1; v <= kWrites; ++v) {
    FC_CHECK(fctest::wait_for([&] { return dst.load(signal) >= uint64_t(v); }, 10000ms),
             "signal " + std::to_string(v) + " arrived");
    const int i = v - 1;
    const uint64_t n = words_of(i) - uint64_t(i);
    const uint64_t* area = dst.words.data() + uint64_t(i) * kMaxWords;
    FC_CHECK(std::equal(area, area + n, src.words.begin() + i),
             "write " + std::to_string(i) + ": every byte, before its signal");
    FC_CHECK(area[n] == 0, "write " + std::to_string(i) + ": nothing past its end");
  }
  writer.get();
  auto f = std::async(std::launch::async, [&] { p.g1->close(5000ms); });
  p.g0->close(5000ms);
  f.get();
}

// Busy polling (busy_poll.h): after a quiet spell the proxy and the receivers sleep; the hints
// (Proxy::expect_commands, Transport::expect_traffic) wake them and every write lands; once the
// window has passed they sleep again instead of spinning. The times from hint to arrival,
// with the window and without, are printed for information only (a 2-core CI machine times
// nothing reliably); the effect on an op between hosts is measured on GPU hosts, not here.
// The names of this process's threads (/proc/self/task/*/comm).
std::vector<std::string> thread_names() {
  std::vector<std::string> names;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(task.path() / "comm");
    std::string name;
    if (std::getline(comm, name)) names.push_back(name);
  }
  return names;
}

bool has_thread(const std::string& name) {
  const auto names = thread_names();
  return std::find(names.begin(), names.end(), name) != names.end();
}

// A transport's threads and a proxy's carry names that say what they are (`top -H`, gdb).
void test_thread_names() {
  auto t = loopback();
  const std::string first = g_backend.socket() ? "fc-sock-rx0" : "fc-ofi-ep0";
  // A thread names itself as it starts: give it a moment.
  for (int i = 0; i < 200 && !has_thread(first); ++i) std::this_thread::sleep_for(5ms);
  FC_CHECK(has_thread(first), "a thread named " + first);
  auto t1 = loopback();
  auto p = connect_pair(*t, *t1, 77);
  {
    RingMem m(8);
    ProxyRing ring(m.p, 8);
    Proxy proxy(ring, *p.g0, nullptr, g_busy_poll);
    for (int i = 0; i < 200 && !has_thread("fc-proxy"); ++i) std::this_thread::sleep_for(5ms);
    FC_CHECK(has_thread("fc-proxy"), "a thread named fc-proxy");
  }
}

void test_busy_poll_hints() {
  using std::chrono::microseconds;
  auto cpu_time = [] {
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec);
  };
  for (microseconds window : {microseconds(0), microseconds(2000)}) {
    auto t0 = g_backend.make(2, window), t1 = g_backend.make(2, window);
    Buf src(*t0, 64), dst(*t1, 64 + 8);
    auto p = connect_pair(*t0, *t1, 60);
    RingMem m(8);
    ProxyRing ring(m.p, 8);
    Proxy proxy(ring, *p.g0, nullptr, window);
    std::vector<double> us;
    constexpr uint64_t kRounds = 8;
    for (uint64_t round = 1; round <= kRounds; ++round) {
      std::this_thread::sleep_for(20ms);  // quiet: the threads go to sleep
      const auto start = std::chrono::steady_clock::now();
      proxy.expect_commands();
      t1->expect_traffic();
      WriteOp op;
      op.peer = 1;
      op.src_key = src.r.key;
      op.dst_key = dst.r.key;
      op.bytes = 64;
      op.signal_key = dst.r.key;
      op.signal_offset = 64 * 8;
      op.signal_value = round;
      ring.post(op, 1000ms);
      while (dst.load(64) < round && std::chrono::steady_clock::now() - start < 5s) std::this_thread::yield();
      us.push_back(
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count());
      FC_CHECK(dst.load(64) == round, "round " + std::to_string(round) + "'s write landed");
    }
    // Past the window nothing spins: over a quiet 300 ms the process takes well under a core
    // (a spinning proxy or receiver alone would take about 300 ms).
    std::this_thread::sleep_for(window + 20ms);
    const auto c0 = cpu_time();
    std::this_thread::sleep_for(300ms);
    const auto busy = std::chrono::duration_cast<std::chrono::milliseconds>(cpu_time() - c0);
    FC_CHECK(busy < 150ms, "CPU time while quiet after the window: " + std::to_string(busy.count()) + " ms");
    std::sort(us.begin(), us.end());
    std::printf(
        "  busy poll %lld us: hint to arrival after 20 ms quiet, median %.0f us (min %.0f, max %.0f); "
        "CPU while quiet %lld ms of 300\n",
        static_cast<long long>(window.count()), us[kRounds / 2], us.front(), us.back(),
        static_cast<long long>(busy.count()));
    proxy.stop(true, 1000ms);
    FC_CHECK(proxy.error().empty(), proxy.error());
    auto f = std::async(std::launch::async, [&] { p.g1->close(5000ms); });
    p.g0->close(5000ms);
    f.get();
  }
}

int main(int argc, char** argv) {
  g_backend = fctest::backend_from_args(argc, argv);
  const std::pair<const char*, void (*)()> cases[] = {
      {"probes report availability with a reason", test_probes},
      {"listener addresses", test_addresses},
      {"world 1 and writes to self", test_world_one_and_self_writes},
      {"a polite close is not a failure", test_graceful_close_is_not_a_failure},
      {"abort and destroy look like failures to the peer", test_abort_and_destroy_are_failures},
      {"the receiver validates keys, offsets, lengths", test_receiver_validates_writes},
      {"connect errors", test_connect_errors},
      {"a transport destroyed under its group", test_transport_destroyed_under_a_group},
      {"proxy ring basics", test_ring_basics},
      {"proxy: laps, invalid commands, dead peers", test_proxy_wraps_and_reports_errors},
      {"proxy: GPU-style producers (slots from their own counter)", test_gpu_style_producers},
      {"a connection per direction (connect_one_way_pairs)", test_one_way_pairs},
      {"lanes: groups striped between the same ranks", test_lanes},
      {"writes of several MiB: every byte before its signal", test_large_writes},
      {"threads are named", test_thread_names},
  };
  // libfabric's second pass sends signals as messages after delivery-complete writes, the path
  // of providers without remote CQ data.
  for (int threads : {1, 3}) {
    g_receive_threads = threads;
    g_busy_poll = std::chrono::microseconds(threads == 1 ? 0 : 200);
    if (!g_backend.socket()) g_backend.signal = threads == 1 ? LibfabricSignal::kAuto : LibfabricSignal::kMessage;
    const std::string pass =
        (g_backend.socket() ? std::to_string(threads) + " receiver(s)"
                            : std::string(threads == 1 ? "signals on CQ data" : "signals as messages")) +
        ", busy poll " + std::to_string(g_busy_poll.count()) + " us: ";
    for (const auto& [name, body] : cases) fctest::run_case((pass + name).c_str(), body);
  }
  fctest::run_case("busy poll: hints wake sleeping threads, which sleep again after the window",
                   test_busy_poll_hints);
  return fctest::finish();
}
