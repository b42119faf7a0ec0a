// transport_bench: what a transport (rdma/transport.h) carries between two ranks of one host
// over the loopback, against plain TCP on the same loopback (the floor for the socket transport,
// which moves its payloads over one TCP connection per pair of ranks). No GPU.
//
//   write         rank 0 writes messages of `bytes` into rank 1's registered region, each with a
//                 signal; the time runs from the first write to rank 1 seeing the last signal
//                 (per message: the inverse of the message rate at small sizes)
//   write_duplex  both ranks write to each other at once
//   pingpong      rank 0 writes with a signal, rank 1 waits for it and writes back the same way;
//                 the row's time is half a round trip: the latency of one write and its signal
// The tcp rows send the same bytes through one connected pair of blocking sockets (TCP_NODELAY).
// --transports names the backends measured (socket: impl "fusedcomm"; libfabric-<provider>:
// impl "fusedcomm_libfabric_<provider>"); each gets the runtime's defaults (RuntimeConfig:
// receiver threads, busy-poll window). Per (op, size, impl): one message checked byte for byte
// first, then 5 batches of at least 256 MiB per direction (at most 100,000 messages; pingpong:
// at most 2,000 round trips); the row holds the median batch's per-message time and GB/s per
// direction. --rounds N measures every (op, size) N times, the impls taking turns round by round
// (a busy machine's swings then fall on all of them alike), and reports the median round. The
// printed line also says how many cores the process kept busy over the batches (CPU time over
// wall time: user and kernel, both ranks).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <future>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "bench/common/bench_util.h"
#include "fusedcomm/rdma/transport.h"
#include "fusedcomm/runtime/runtime.h"

namespace b = fusedcomm::bench;
namespace rdma = fusedcomm::rdma;
using Clock = std::chrono::steady_clock;

namespace {

const char* kUsage =
    "usage: transport_bench --shapes FILE [--out ROWS.jsonl] [--transports LIST] [--rounds N]\n"
    "  FILE: one op per line, \"<write|write_duplex|pingpong> <bytes>...\" (bench/shapes/transport.txt).\n"
    "  LIST: comma-separated backends, socket (default), libfabric-tcp, libfabric-shm, libfabric-efa,\n"
    "  libfabric-verbs, libfabric-auto; a libfabric provider absent here is reported and skipped.\n"
    "  Rows (impl fusedcomm: the socket transport; fusedcomm_libfabric_<provider>; tcp: plain\n"
    "  sockets) go to --out as JSON lines. N: measure each (op, size) N times, the impls in turn,\n"
    "  and report the median round (default 1).\n"
    "  Exit 0: every check passed; 1: a mismatch or an error.\n";

constexpr int kBatches = 5;
constexpr int64_t kBatchBytes = int64_t{256} << 20;
constexpr int64_t kMaxMessages = 100000;  // small messages: the batch is this many, not 256 MiB
constexpr int64_t kMaxRoundTrips = 2000;

int messages_for(int64_t bytes, bool pingpong) {
  const int64_t n = std::max<int64_t>(8, kBatchBytes / bytes);
  return static_cast<int>(std::min(n, pingpong ? kMaxRoundTrips : kMaxMessages));
}

// A backend to measure: "socket" or "libfabric-<provider>".
struct Backend {
  std::string name;
  rdma::TransportKind kind = rdma::TransportKind::kSocket;
  rdma::LibfabricProvider provider = rdma::LibfabricProvider::kAuto;
  std::string impl() const {
    return kind == rdma::TransportKind::kSocket
               ? "fusedcomm"
               : "fusedcomm_libfabric_" + std::string(rdma::libfabric_provider_name(provider));
  }
  std::unique_ptr<rdma::Transport> make() const {
    const fusedcomm::RuntimeConfig defaults;
    rdma::TransportOptions o;
    o.socket.bind_host = "127.0.0.1";
    o.socket.receive_threads = defaults.transport_streams;
    o.socket.busy_poll = std::chrono::microseconds(defaults.busy_poll_us);
    o.libfabric.provider = provider;
    o.libfabric.bind_host = "127.0.0.1";
    o.libfabric.busy_poll = std::chrono::microseconds(defaults.busy_poll_us);
    return rdma::make_transport(kind, o);
  }
};

Backend parse_backend(const std::string& name) {
  Backend b;
  b.name = name;
  if (name == "socket") return b;
  const std::string prefix = "libfabric-";
  if (name.rfind(prefix, 0) == 0) {
    for (rdma::LibfabricProvider p :
         {rdma::LibfabricProvider::kAuto, rdma::LibfabricProvider::kEfa, rdma::LibfabricProvider::kVerbs,
          rdma::LibfabricProvider::kTcp, rdma::LibfabricProvider::kShm}) {
      if (name.substr(prefix.size()) == rdma::libfabric_provider_name(p)) {
        b.kind = rdma::TransportKind::kLibfabric;
        b.provider = p;
        return b;
      }
    }
  }
  throw std::runtime_error("unknown transport '" + name + "' (socket, libfabric-tcp, libfabric-shm, ...)");
}

void fill(std::vector<uint8_t>& v, int salt) {
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<uint8_t>(i * 131 + salt);
}

// One rank's buffers: a registered source, and a registered destination with its signal word
// in the last 8 of 64 extra bytes.
struct End {
  std::vector<uint8_t> src, dst;
  rdma::Region src_r, dst_r;
  End(rdma::Transport& t, int64_t bytes, int salt) : src(bytes), dst(bytes + 64, 0) {
    fill(src, salt);
    src_r = t.register_memory(src.data(), src.size());
    dst_r = t.register_memory(dst.data(), dst.size());
  }
  uint64_t signal() {
    return std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(dst.data() + dst.size() - 8))
        .load(std::memory_order_acquire);
  }
};

void wait_signal(End& e, uint64_t value, rdma::PeerGroup& g) {
  const auto limit = Clock::now() + std::chrono::seconds(30);
  for (uint64_t polls = 1; e.signal() < value; ++polls) {
    // Polls, yielding the core: the transport's own threads may need it (on a small machine
    // a spinning waiter would hold the core its signal has to arrive through).
    if (polls > 64) std::this_thread::yield();
    if (polls % 4096 != 0) continue;
    g.check();  // a broken connection, named
    if (Clock::now() > limit) throw std::runtime_error("no signal within 30 s");
  }
}

// `n` writes of the whole source into the peer's destination, the last signal = `seq`.
void post(rdma::PeerGroup& g, int peer, End& from, const End& to, int n, uint64_t seq0) {
  for (int i = 1; i <= n; ++i) {
    rdma::WriteOp op;
    op.peer = peer;
    op.src_key = from.src_r.key;
    op.dst_key = to.dst_r.key;
    op.bytes = from.src.size();
    op.signal_key = to.dst_r.key;
    op.signal_offset = to.dst.size() - 8;
    op.signal_value = seq0 + i;
    op.signal_sole_writer = true;  // this rank alone writes the peer's word, and only raises it
    g.write(op);
  }
}

struct Result {
  bool ok = false;
  double seconds = 0;  // median batch
  int messages = 0;    // per batch and direction
  double cores = 0;    // process CPU time over wall time, all batches
};

double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return double(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * double(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

// CPU time over wall time from construction to done().
struct CoresBusy {
  double cpu0 = cpu_seconds();
  Clock::time_point wall0 = Clock::now();
  double done() const {
    const double wall = std::chrono::duration<double>(Clock::now() - wall0).count();
    return wall > 0 ? (cpu_seconds() - cpu0) / wall : 0;
  }
};

Result bench_transport(const Backend& backend, int64_t bytes, bool duplex, bool pingpong) {
  auto t0 = backend.make(), t1 = backend.make();
  rdma::GroupSpec spec;
  spec.comm_id = 1;
  spec.key = rdma::auth::derive_comm_key(0x5eed, spec.comm_id, {});
  spec.world = 2;
  spec.addresses = {t0->address(), t1->address()};
  auto later = std::async(std::launch::async, [&] {
    rdma::GroupSpec s = spec;
    s.rank = 1;
    return t1->connect(s);
  });
  auto g0 = t0->connect(spec);
  auto g1 = later.get();
  End e0(*t0, bytes, 1), e1(*t1, bytes, 2);
  Result res;
  // The check: one message each way in use, every byte.
  const bool both = duplex || pingpong;
  post(*g0, 1, e0, e1, 1, 0);
  if (both) post(*g1, 0, e1, e0, 1, 0);
  wait_signal(e1, 1, *g0);
  if (both) wait_signal(e0, 1, *g1);
  res.ok = std::memcmp(e1.dst.data(), e0.src.data(), bytes) == 0 &&
           (!both || std::memcmp(e0.dst.data(), e1.src.data(), bytes) == 0);
  if (res.ok && pingpong) {
    // Rank 1 answers each signal with its own write; rank 0 waits for each answer.
    res.messages = messages_for(bytes, true);
    std::vector<double> secs;
    const CoresBusy busy;
    uint64_t seq = 1;
    for (int batch = 0; batch < kBatches; ++batch) {
      const uint64_t first = seq;
      std::thread echo([&, first] {
        for (int i = 1; i <= res.messages; ++i) {
          wait_signal(e1, first + i, *g1);
          post(*g1, 0, e1, e0, 1, first + i - 1);
        }
      });
      const auto start = Clock::now();
      for (int i = 1; i <= res.messages; ++i) {
        post(*g0, 1, e0, e1, 1, first + i - 1);
        wait_signal(e0, first + i, *g0);
      }
      // Half a round trip per message: the row's time is one write's latency.
      secs.push_back(std::chrono::duration<double>(Clock::now() - start).count() / 2);
      echo.join();
      seq += res.messages;
    }
    res.seconds = b::median(secs);
    res.cores = busy.done();
  } else if (res.ok) {
    res.messages = messages_for(bytes, false);
    std::vector<double> secs;
    const CoresBusy busy;
    uint64_t seq = 1;
    for (int batch = 0; batch < kBatches; ++batch) {
      const auto start = Clock::now();
      std::thread back;
      if (duplex) back = std::thread([&, seq] { post(*g1, 0, e1, e0, res.messages, seq); });
      post(*g0, 1, e0, e1, res.messages, seq);
      seq += res.messages;
      wait_signal(e1, seq, *g0);
      if (duplex) {
        back.join();
        wait_signal(e0, seq, *g1);
      }
      secs.push_back(std::chrono::duration<double>(Clock::now() - start).count());
    }
    res.seconds = b::median(secs);
    res.cores = busy.done();
  }
  auto closing = std::async(std::launch::async, [&] { g1->close(std::chrono::seconds(10)); });
  g0->close(std::chrono::seconds(10));
  closing.get();
  t0->deregister_memory(e0.src_r), t0->deregister_memory(e0.dst_r);
  t1->deregister_memory(e1.src_r), t1->deregister_memory(e1.dst_r);
  return res;
}

// ---- plain TCP ------------------------------------------------------------------------------
std::pair<int, int> tcp_pair() {
  const int l = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (l < 0 || bind(l, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || listen(l, 1) != 0) {
    throw std::runtime_error("listen on the loopback failed");
  }
  socklen_t n = sizeof a;
  getsockname(l, reinterpret_cast<sockaddr*>(&a), &n);
  const int c = socket(AF_INET, SOCK_STREAM, 0);
  if (c < 0 || connect(c, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0)
    throw std::runtime_error("connect failed");
  const int s = accept(l, nullptr, nullptr);
  close(l);
  if (s < 0) throw std::runtime_error("accept failed");
  const int one = 1;
  for (int fd : {c, s}) setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return {c, s};
}

void send_all(int fd, const std::vector<uint8_t>& buf, int n) {
  for (int i = 0; i < n; ++i) {
    for (size_t done = 0; done < buf.size();) {
      const ssize_t w = send(fd, buf.data() + done, buf.size() - done, 0);
      if (w <= 0) throw std::runtime_error("send failed");
      done += static_cast<size_t>(w);
    }
  }
}

void recv_all(int fd, std::vector<uint8_t>& buf, int n) {
  for (int i = 0; i < n; ++i) {
    for (size_t done = 0; done < buf.size();) {
      const ssize_t r = recv(fd, buf.data() + done, buf.size() - done, 0);
      if (r <= 0) throw std::runtime_error("recv failed");
      done += static_cast<size_t>(r);
    }
  }
}

Result bench_tcp(int64_t bytes, bool duplex, bool pingpong) {
  auto [a, z] = tcp_pair();
  if (pingpong) {
    std::vector<uint8_t> src_a(bytes), src_z(bytes), dst_a(bytes), dst_z(bytes);
    fill(src_a, 1), fill(src_z, 2);
    auto trips = [&](int n) {
      std::thread echo([&] {
        for (int i = 0; i < n; ++i) recv_all(z, dst_z, 1), send_all(z, src_z, 1);
      });
      for (int i = 0; i < n; ++i) send_all(a, src_a, 1), recv_all(a, dst_a, 1);
      echo.join();
    };
    Result res;
    trips(1);
    res.ok = dst_z == src_a && dst_a == src_z;
    if (res.ok) {
      res.messages = messages_for(bytes, true);
      std::vector<double> secs;
      const CoresBusy busy;
      for (int batch = 0; batch < kBatches; ++batch) {
        const auto start = Clock::now();
        trips(res.messages);
        secs.push_back(std::chrono::duration<double>(Clock::now() - start).count() / 2);
      }
      res.seconds = b::median(secs);
      res.cores = busy.done();
    }
    close(a), close(z);
    return res;
  }
  std::vector<uint8_t> src_a(bytes), src_z(bytes), dst_a(bytes), dst_z(bytes);
  fill(src_a, 1), fill(src_z, 2);
  // One round: a sends n messages to z (and z to a at once when duplex).
  auto round = [&](int n) {
    std::thread rx([&] { recv_all(z, dst_z, n); });
    std::thread back, back_rx;
    if (duplex) {
      back = std::thread([&] { send_all(z, src_z, n); });
      back_rx = std::thread([&] { recv_all(a, dst_a, n); });
    }
    send_all(a, src_a, n);
    rx.join();
    if (duplex) back.join(), back_rx.join();
  };
  Result res;
  round(1);
  res.ok = dst_z == src_a && (!duplex || dst_a == src_z);
  if (res.ok) {
    res.messages = messages_for(bytes, false);
    std::vector<double> secs;
    const CoresBusy busy;
    for (int batch = 0; batch < kBatches; ++batch) {
      const auto start = Clock::now();
      round(res.messages);
      secs.push_back(std::chrono::duration<double>(Clock::now() - start).count());
    }
    res.seconds = b::median(secs);
    res.cores = busy.done();
  }
  close(a), close(z);
  return res;
}

}  // namespace

int main(int argc, char** argv) {
  b::Args args(argc, argv, kUsage);
  const std::string shapes = args.str("shapes", "");
  const std::string out = args.str("out", "");
  const std::string transports = args.str("transports", "socket");
  const int rounds = static_cast<int>(args.num("rounds", 1));
  args.done();
  if (shapes.empty()) args.fail("--shapes is required");
  if (rounds < 1) args.fail("--rounds must be at least 1");
  try {
    std::vector<Backend> backends;
    for (size_t start = 0; start <= transports.size();) {
      const size_t comma = std::min(transports.find(',', start), transports.size());
      const Backend bk = parse_backend(transports.substr(start, comma - start));
      const rdma::Availability a =
          bk.kind == rdma::TransportKind::kSocket ? rdma::probe_socket() : rdma::probe_libfabric(bk.provider);
      if (a.available) {
        backends.push_back(bk);
        std::printf("%s: %s\n", bk.name.c_str(), a.reason.c_str());
      } else {
        std::printf("%s: SKIPPED: %s\n", bk.name.c_str(), a.reason.c_str());
      }
      start = comma + 1;
    }
    b::RowWriter rows(out);
    int failed = 0;
    for (const auto& w : b::read_shape_lines(shapes)) {
      if (w[0] != "write" && w[0] != "write_duplex" && w[0] != "pingpong")
        throw std::runtime_error(shapes + ": unknown op " + w[0]);
      const bool duplex = w[0] == "write_duplex";
      const bool pingpong = w[0] == "pingpong";
      for (size_t i = 1; i < w.size(); ++i) {
        const int64_t bytes = std::stoll(w[i]);
        // By impl (the backends, then plain TCP): every round's result.
        std::vector<std::vector<Result>> runs(backends.size() + 1);
        for (int r = 0; r < rounds; ++r) {
          for (size_t k = 0; k <= backends.size(); ++k) {
            const bool ours = k < backends.size();
            runs[k].push_back(ours ? bench_transport(backends[k], bytes, duplex, pingpong)
                                   : bench_tcp(bytes, duplex, pingpong));
          }
        }
        for (size_t k = 0; k <= backends.size(); ++k) {
          const std::string impl_name = k < backends.size() ? backends[k].impl() : "tcp";
          const char* impl = impl_name.c_str();
          std::vector<double> per_message, cores;
          bool ok = true;
          for (const Result& res : runs[k]) {
            ok = ok && res.ok;
            per_message.push_back(res.seconds / res.messages);
            cores.push_back(res.cores);
          }
          if (!ok) {
            std::printf("%-13s %11lld B %-24s check FAILED\n", w[0].c_str(), static_cast<long long>(bytes),
                        impl);
            ++failed;
            continue;
          }
          const double ms = b::median(per_message) * 1e3;
          const double gbps = double(bytes) / (ms * 1e-3) / 1e9;
          b::Row shape;
          shape.integer("bytes", bytes);
          b::Row row;
          row.str("family", "transport")
              .str("op", w[0])
              .str("impl", impl)
              .integer("world", 2)
              .obj("shape", shape)
              .str("dtype", "bytes")
              .num("ms_median", ms)
              .null("tflops")
              .num("gbps", gbps);
          rows.write(row);
          std::printf(
              "%-13s %11lld B %-24s check passed %9.4f ms per message %6.2f GB/s per direction %5.2f cores\n",
              w[0].c_str(), static_cast<long long>(bytes), impl, ms, gbps, b::median(cores));
          std::fflush(stdout);
        }
      }
    }
    return failed ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "transport_bench: %s\n", e.what());
    return 1;
  }
}
