// Test/bench harness: one forked process per rank, and a parent that relays allGathers of byte
// blobs between them over pipes (the stand-in for the Java barrier bootstrap). The parent
// never touches CUDA (a CUDA context does not survive fork), so probing is done in a child too.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <vector>

namespace fusedcomm::testing {

inline bool write_full(int fd, const void* p, size_t n) {
  const auto* c = static_cast<const uint8_t*>(p);
  while (n > 0) {
    const ssize_t w = ::write(fd, c, n);
    if (w <= 0) return false;
    c += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}
inline bool read_full(int fd, void* p, size_t n) {
  auto* c = static_cast<uint8_t*>(p);
  while (n > 0) {
    const ssize_t r = ::read(fd, c, n);
    if (r <= 0) return false;
    c += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

// A rank's end of the bootstrap.
struct ProcessGroup {
  int rank = 0, world = 1;
  int to_parent = -1, from_parent = -1;

  std::vector<std::vector<uint8_t>> all_gather(const std::vector<uint8_t>& mine) {
    const uint32_t n = static_cast<uint32_t>(mine.size());
    if (!write_full(to_parent, &n, 4) || !write_full(to_parent, mine.data(), n)) {
      throw std::runtime_error("bootstrap: parent pipe closed");
    }
    std::vector<std::vector<uint8_t>> all(world);
    for (auto& b : all) {
      uint32_t len = 0;
      if (!read_full(from_parent, &len, 4)) throw std::runtime_error("bootstrap: a peer exited");
      b.resize(len);
      if (!read_full(from_parent, b.data(), len)) throw std::runtime_error("bootstrap: a peer exited");
    }
    return all;
  }
  void barrier() { all_gather({}); }
};

// Runs fn in `world` children (exit status = fn's return value; an exception or a signal
// counts as a failure; each child is killed by SIGALRM after timeout_s). Returns the number of
// children that failed.
inline int run_processes(int world, const std::function<int(ProcessGroup&)>& fn, int timeout_s) {
  std::vector<int> up(world), down(world);
  std::vector<pid_t> pids(world);
  std::fflush(stdout);
  std::fflush(stderr);
  for (int r = 0; r < world; ++r) {
    int a[2], b[2];
    if (pipe(a) != 0 || pipe(b) != 0) throw std::runtime_error("pipe failed");
    const pid_t pid = fork();
    if (pid == 0) {
      ::close(a[0]);
      ::close(b[1]);
      for (int q = 0; q < r; ++q) {  // earlier ranks' parent ends
        ::close(up[q]);
        ::close(down[q]);
      }
      alarm(static_cast<unsigned>(timeout_s));
      ProcessGroup g{r, world, a[1], b[0]};
      int rc = 1;
      try {
        rc = fn(g);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: uncaught exception: %s\n", r, e.what());
        rc = 1;
      }
      std::fflush(stdout);
      std::fflush(stderr);
      _exit(rc);
    }
    ::close(a[1]);
    ::close(b[0]);
    up[r] = a[0];
    down[r] = b[1];
    pids[r] = pid;
  }
  // Relay rounds until a child closes its pipe (exit); then close ours so the rest fail fast.
  for (bool open = true; open;) {
    std::vector<std::vector<uint8_t>> msgs(world);
    for (int r = 0; r < world && open; ++r) {
      uint32_t n = 0;
      if (!read_full(up[r], &n, 4)) {
        open = false;
        break;
      }
      msgs[r].resize(n);
      if (!read_full(up[r], msgs[r].data(), n)) open = false;
    }
    if (!open) break;
    for (int r = 0; r < world; ++r) {
      for (const auto& m : msgs) {
        const uint32_t n = static_cast<uint32_t>(m.size());
        write_full(down[r], &n, 4);
        write_full(down[r], m.data(), n);
      }
    }
  }
  for (int r = 0; r < world; ++r) ::close(down[r]);
  int failed = 0;
  for (int r = 0; r < world; ++r) {
    int status = 0;
    waitpid(pids[r], &status, 0);
    ::close(up[r]);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      ++failed;
      if (WIFSIGNALED(status)) {
        std::fprintf(stderr, "rank %d died of signal %d\n", r, WTERMSIG(status));
      } else {
        std::fprintf(stderr, "rank %d exited with %d\n", r, WEXITSTATUS(status));
      }
    }
  }
  return failed;
}

}  // namespace fusedcomm::testing
