// The native tests' check counters, one set per process (a forked rank has its own): every
// check counts, and the first 20 failures are printed with what was checked.
#pragma once

#include <cstdio>
#include <string>

namespace fusedcomm::testing {

inline int g_failed = 0, g_passed = 0;
inline void check(bool ok, const std::string& what) {
  if (ok) {
    ++g_passed;
  } else if (++g_failed <= 20) {
    std::fprintf(stderr, "FAIL: %s\n", what.c_str());
  }
}
// The last line of a one-process test: its counts, and its exit status (0: every check passed).
inline int report(const char* test) {
  std::printf("%s: %d passed, %d failed\n", test, g_passed, g_failed);
  return g_failed == 0 ? 0 : 1;
}

}  // namespace fusedcomm::testing
