// Small test harness shared by the rdma tests: checks that count failures, named cases, the
// final "N passed, M failed" line, deterministic payload patterns and leak counters.
#pragma once

#include <dirent.h>
#include <time.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <string>
#include <thread>

namespace fctest {

inline std::atomic<int> g_check_failures{0};

// Hook for forked children: where failure lines go (default: stderr).
inline std::function<void(const std::string&)> g_report = [](const std::string& s) {
  std::fprintf(stderr, "%s\n", s.c_str());
};

inline void fail_at(const char* file, int line, const std::string& what) {
  g_check_failures++;
  g_report(std::string("CHECK FAILED ") + file + ":" + std::to_string(line) + ": " + what);
}

#define FC_CHECK(cond, msg)                                                                  \
  do {                                                                                       \
    if (!(cond)) ::fctest::fail_at(__FILE__, __LINE__, std::string(#cond) + " -- " + (msg)); \
  } while (0)

// Evaluates `expr`, which must throw `Type`; binds the caught exception to `var` in `body`.
#define FC_EXPECT_THROW(Type, expr, var, ...)                                                                \
  do {                                                                                                       \
    bool fc_thrown_ = false;                                                                                 \
    try {                                                                                                    \
      expr;                                                                                                  \
    } catch (const Type& var) {                                                                              \
      fc_thrown_ = true;                                                                                     \
      __VA_ARGS__;                                                                                           \
    } catch (const std::exception& fc_e_) {                                                                  \
      ::fctest::fail_at(__FILE__, __LINE__, std::string(#expr " threw another exception: ") + fc_e_.what()); \
      fc_thrown_ = true;                                                                                     \
    }                                                                                                        \
    if (!fc_thrown_) ::fctest::fail_at(__FILE__, __LINE__, #expr " did not throw " #Type);                   \
  } while (0)

struct Tally {
  int passed = 0;
  int failed = 0;
};
inline Tally g_tally;

// Runs one named case; it passes when it throws nothing and no check failed.
inline void run_case(const char* name, const std::function<void()>& body) {
  const int before = g_check_failures.load();
  const auto t0 = std::chrono::steady_clock::now();
  bool ok = true;
  try {
    body();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "  unexpected exception: %s\n", e.what());
    ok = false;
  }
  ok = ok && g_check_failures.load() == before;
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("[%s] %s (%.2f s)\n", ok ? "PASS" : "FAIL", name, s);
  std::fflush(stdout);
  (ok ? g_tally.passed : g_tally.failed)++;
}

inline int finish() {
  std::printf("%d passed, %d failed\n", g_tally.passed, g_tally.failed);
  std::fflush(stdout);
  return g_tally.failed == 0 ? 0 : 1;
}

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Byte i of the pattern named by `seed`: pseudo-random, cheap to recompute for any offset.
inline uint8_t pattern_byte(uint64_t seed, uint64_t i) {
  return static_cast<uint8_t>(splitmix64(seed ^ ((i >> 3) * 0x2545f4914f6cdd1dull)) >> ((i & 7) * 8));
}

inline void fill_pattern(uint8_t* p, uint64_t n, uint64_t seed, uint64_t start = 0) {
  for (uint64_t i = 0; i < n; ++i) p[i] = pattern_byte(seed, start + i);
}

// Index of the first byte that differs from the pattern, or -1.
inline int64_t first_mismatch(const uint8_t* p, uint64_t n, uint64_t seed, uint64_t start = 0) {
  for (uint64_t i = 0; i < n; ++i) {
    if (p[i] != pattern_byte(seed, start + i)) return static_cast<int64_t>(i);
  }
  return -1;
}

inline int count_dir(const char* path) {
  DIR* d = opendir(path);
  if (!d) return -1;
  int n = 0;
  while (dirent* e = readdir(d)) {
    if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) ++n;
  }
  closedir(d);
  return n - 1 * (std::strcmp(path, "/proc/self/fd") == 0);  // minus the DIR's own fd
}
inline int open_fds() { return count_dir("/proc/self/fd"); }
inline int live_threads() { return count_dir("/proc/self/task"); }

inline int64_t monotonic_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// Waits until pred() or the timeout; true if pred() held.
template <class Pred>
bool wait_for(Pred pred, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!pred()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return true;
}

}  // namespace fctest
