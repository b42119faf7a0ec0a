// transport_bench: what the socket transport (rdma/transport.h) carries between two ranks of
// one host over the loopback, against plain TCP on the same loopback (the floor: the transport
// moves its payloads over one TCP connection per pair of ranks). No GPU.
//
//   write         rank 0 writes messages of `bytes` into rank 1's registered region, each with a
//                 signal; the time runs from the first write to rank 1 seeing the last signal
//   write_duplex  both ranks write to each other at once (one connection carries both ways)
// The tcp rows send the same bytes through one connected pair of blocking sockets (TCP_NODELAY).
// The transport gets the runtime's defaults (RuntimeConfig: receiver threads, busy-poll window).
// Per (op, size, impl): one message checked byte for byte first, then 5 batches of at least
// 256 MiB per direction; the row holds the median batch's per-message time and GB/s per
// direction.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

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
    "usage: transport_bench --shapes FILE [--out ROWS.jsonl]\n"
    "  FILE: one op per line, \"<write|write_duplex> <bytes>...\" (bench/shapes/transport.txt).\n"
    "  Rows (impl fusedcomm: the socket transport; tcp: plain sockets) go to --out as JSON lines.\n"
    "  Exit 0: every check passed; 1: a mismatch or an error.\n";

constexpr int kBatches = 5;
constexpr int64_t kBatchBytes = int64_t{256} << 20;

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
    g.write(op);
  }
}

struct Result {
  bool ok = false;
  double seconds = 0;  // median batch
  int messages = 0;    // per batch and direction
};

Result bench_transport(int64_t bytes, bool duplex) {
  rdma::SocketOptions so;
  const fusedcomm::RuntimeConfig defaults;
  so.bind_host = "127.0.0.1";
  so.receive_threads = defaults.transport_streams;
  so.busy_poll = std::chrono::microseconds(defaults.busy_poll_us);
  auto t0 = rdma::make_socket_transport(so), t1 = rdma::make_socket_transport(so);
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
  post(*g0, 1, e0, e1, 1, 0);
  if (duplex) post(*g1, 0, e1, e0, 1, 0);
  wait_signal(e1, 1, *g0);
  if (duplex) wait_signal(e0, 1, *g1);
  res.ok = std::memcmp(e1.dst.data(), e0.src.data(), bytes) == 0 &&
           (!duplex || std::memcmp(e0.dst.data(), e1.src.data(), bytes) == 0);
  if (res.ok) {
    res.messages = static_cast<int>(std::max<int64_t>(8, kBatchBytes / bytes));
    std::vector<double> secs;
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

Result bench_tcp(int64_t bytes, bool duplex) {
  auto [a, z] = tcp_pair();
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
    res.messages = static_cast<int>(std::max<int64_t>(8, kBatchBytes / bytes));
    std::vector<double> secs;
    for (int batch = 0; batch < kBatches; ++batch) {
      const auto start = Clock::now();
      round(res.messages);
      secs.push_back(std::chrono::duration<double>(Clock::now() - start).count());
    }
    res.seconds = b::median(secs);
  }
  close(a), close(z);
  return res;
}

}  // namespace

int main(int argc, char** argv) {
  b::Args args(argc, argv, kUsage);
  const std::string shapes = args.str("shapes", "");
  const std::string out = args.str("out", "");
  args.done();
  if (shapes.empty()) args.fail("--shapes is required");
  try {
    b::RowWriter rows(out);
    int failed = 0;
    for (const auto& w : b::read_shape_lines(shapes)) {
      if (w[0] != "write" && w[0] != "write_duplex")
        throw std::runtime_error(shapes + ": unknown op " + w[0]);
      const bool duplex = w[0] == "write_duplex";
      for (size_t i = 1; i < w.size(); ++i) {
        const int64_t bytes = std::stoll(w[i]);
        for (const char* impl : {"fusedcomm", "tcp"}) {
          const bool ours = std::string(impl) == "fusedcomm";
          const Result res = ours ? bench_transport(bytes, duplex) : bench_tcp(bytes, duplex);
          if (!res.ok) {
            std::printf("%-13s %11lld B %-9s check FAILED\n", w[0].c_str(), static_cast<long long>(bytes),
                        impl);
            ++failed;
            continue;
          }
          const double ms = res.seconds * 1e3 / res.messages;
          const double gbps = double(bytes) * res.messages / res.seconds / 1e9;
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
          std::printf("%-13s %11lld B %-9s check passed %9.4f ms per message %6.2f GB/s per direction\n",
                      w[0].c_str(), static_cast<long long>(bytes), impl, ms, gbps);
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
