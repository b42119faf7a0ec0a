// loopback_duplex: what one TCP connection carries both ways at once on this host's loopback,
// against one connection per direction (the question behind the socket transport's
// "one connection per pair of ranks"; kernels/bench/NOTES.md, "The proxy path's own
// throughput"). No GPU, no fusedcomm code: plain blocking sockets, 1 MiB sends and receives,
// one thread per (end, direction). Prints GB/s per direction for:
//   one-way      one connection, one direction
//   duplex-1     one connection, both directions at once
//   duplex-2     two connections, one per direction
//   stripe-N     (with a second argument N > 1) N connections per direction, each with its own
//                sending and receiving thread, both directions at once; the figure is the
//                sum over a direction's N connections (the question behind striping the
//                socket transport's traffic to a peer over several connections)
// Build: g++ -O2 -std=c++20 -pthread loopback_duplex.cc -o loopback_duplex;
// run: ./loopback_duplex [GiB per flow] [N]
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

namespace {

constexpr size_t kMsg = 1 << 20;

void die(const char* what) {
  std::perror(what);
  std::exit(1);
}

// A connected pair of TCP sockets on 127.0.0.1.
std::pair<int, int> tcp_pair() {
  const int l = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (l < 0 || bind(l, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || listen(l, 1) != 0) die("listen");
  socklen_t n = sizeof a;
  getsockname(l, reinterpret_cast<sockaddr*>(&a), &n);
  const int c = socket(AF_INET, SOCK_STREAM, 0);
  if (connect(c, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) die("connect");
  const int s = accept(l, nullptr, nullptr);
  if (s < 0) die("accept");
  close(l);
  const int one = 1;
  for (int fd : {c, s}) setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return {c, s};
}

void send_all(int fd, size_t total) {
  std::vector<char> buf(kMsg, 1);
  for (size_t done = 0; done < total;) {
    const ssize_t r = send(fd, buf.data(), std::min(kMsg, total - done), 0);
    if (r <= 0) die("send");
    done += static_cast<size_t>(r);
  }
}

void recv_all(int fd, size_t total) {
  std::vector<char> buf(kMsg);
  for (size_t done = 0; done < total;) {
    const ssize_t r = recv(fd, buf.data(), std::min(kMsg, total - done), 0);
    if (r <= 0) die("recv");
    done += static_cast<size_t>(r);
  }
}

// Runs the (send fd, recv fd) flows at once; returns GB/s per flow.
double run(const std::vector<std::pair<int, int>>& flows, size_t bytes) {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> ts;
  for (auto [tx, rx] : flows) {
    ts.emplace_back(send_all, tx, bytes);
    ts.emplace_back(recv_all, rx, bytes);
  }
  for (auto& t : ts) t.join();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return bytes / s / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  const size_t bytes = static_cast<size_t>((argc > 1 ? std::atof(argv[1]) : 4.0) * (1ull << 30));
  const int stripes = argc > 2 ? std::atoi(argv[2]) : 1;
  for (int round = 0; round < 3; ++round) {
    auto [a, b] = tcp_pair();
    const double one = run({{a, b}}, bytes);
    const double duplex1 = run({{a, b}, {b, a}}, bytes);
    close(a);
    close(b);
    auto [c, d] = tcp_pair();
    auto [e, f] = tcp_pair();
    const double duplex2 = run({{c, d}, {f, e}}, bytes);
    for (int fd : {c, d, e, f}) close(fd);
    std::printf("round %d: one-way %.2f GB/s; duplex-1 %.2f GB/s each way; duplex-2 %.2f GB/s each way", round,
                one, duplex1, duplex2);
    if (stripes > 1) {
      std::vector<std::pair<int, int>> flows;
      for (int i = 0; i < 2 * stripes; ++i) {
        auto [x, y] = tcp_pair();
        flows.push_back(i % 2 == 0 ? std::pair{x, y} : std::pair{y, x});  // odd: the other way
      }
      // Every flow moves `bytes / stripes`, so a direction moves `bytes` as in the rows above.
      const double per_flow = run(flows, bytes / stripes);
      std::printf("; stripe-%d %.2f GB/s each way", stripes, per_flow * stripes);
      for (auto [x, y] : flows) {
        close(x);
        close(y);
      }
    }
    std::printf("\n");
  }
  return 0;
}
