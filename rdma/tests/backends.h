// The backend a transport contract test runs on, named by its first argument: "socket" (the
// default), "libfabric-tcp" or "libfabric-shm" (rdma/CMakeLists.txt registers each). A
// libfabric run on a host or build without libfabric or without that provider prints why and
// exits 77, which ctest reports as skipped.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "fusedcomm/rdma/transport.h"

namespace fctest {

inline constexpr int kSkipped = 77;

struct TestBackend {
  std::string label = "socket";
  fusedcomm::rdma::TransportKind kind = fusedcomm::rdma::TransportKind::kSocket;
  fusedcomm::rdma::LibfabricProvider provider = fusedcomm::rdma::LibfabricProvider::kTcp;
  // libfabric: how signals travel (a test may run its cases again with kMessage, the path of
  // providers without remote CQ data).
  fusedcomm::rdma::LibfabricSignal signal = fusedcomm::rdma::LibfabricSignal::kAuto;
  // libfabric: how long a silent peer lives.
  std::chrono::milliseconds peer_timeout = fusedcomm::rdma::LibfabricOptions{}.peer_timeout;

  bool socket() const { return kind == fusedcomm::rdma::TransportKind::kSocket; }

  // A transport on loopback. Socket: bound to 127.0.0.1 with `receive_threads` receivers;
  // libfabric: the provider (tcp bound to 127.0.0.1). Both poll for `busy_poll` around traffic.
  std::unique_ptr<fusedcomm::rdma::Transport> make(int receive_threads = 1,
                                                   std::chrono::microseconds busy_poll = {}) const {
    fusedcomm::rdma::TransportOptions o;
    o.socket.bind_host = "127.0.0.1";
    o.socket.receive_threads = receive_threads;
    o.socket.busy_poll = busy_poll;
    o.libfabric.provider = provider;
    o.libfabric.bind_host = "127.0.0.1";
    o.libfabric.busy_poll = busy_poll;
    o.libfabric.signal = signal;
    o.libfabric.peer_timeout = peer_timeout;
    return fusedcomm::rdma::make_transport(kind, o);
  }

  // How this backend's addresses start: "127.0.0.1:" or "ofi:<provider>:".
  std::string address_prefix() const { return socket() ? "127.0.0.1:" : "ofi:"; }
};

// The backend of argv[1]; exits 77 with the reason when it cannot run here, 2 on a bad name.
// The check runs in a child process, so that a test that forks its ranks (and must not carry
// an initialised libfabric into them) starts clean.
inline TestBackend backend_from_args(int argc, char** argv) {
  using fusedcomm::rdma::LibfabricProvider;
  TestBackend b;
  const std::string arg = argc > 1 ? argv[1] : "socket";
  if (arg == "socket") return b;
  if (arg != "libfabric-tcp" && arg != "libfabric-shm") {
    std::fprintf(stderr, "unknown backend '%s' (socket, libfabric-tcp, libfabric-shm)\n", arg.c_str());
    std::exit(2);
  }
  b.label = arg;
  b.kind = fusedcomm::rdma::TransportKind::kLibfabric;
  b.provider = arg == "libfabric-tcp" ? LibfabricProvider::kTcp : LibfabricProvider::kShm;
  int pipefd[2];
  if (pipe(pipefd) != 0) std::exit(2);
  std::fflush(stdout);
  const pid_t pid = fork();
  if (pid == 0) {
    ::close(pipefd[0]);
    const fusedcomm::rdma::Availability a = fusedcomm::rdma::probe_libfabric(b.provider);
    const std::string line = a.reason + "\n";
    ssize_t w = ::write(pipefd[1], line.data(), line.size());
    (void)w;
    _exit(a.available ? 0 : 1);
  }
  ::close(pipefd[1]);
  std::string reason;
  char buf[512];
  ssize_t n;
  while ((n = ::read(pipefd[0], buf, sizeof buf)) > 0) reason.append(buf, static_cast<size_t>(n));
  ::close(pipefd[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (!reason.empty() && reason.back() == '\n') reason.pop_back();
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::printf("SKIPPED on %s: %s\n", arg.c_str(), reason.c_str());
    std::exit(kSkipped);
  }
  std::printf("backend %s: %s\n", arg.c_str(), reason.c_str());
  return b;
}

}  // namespace fctest
