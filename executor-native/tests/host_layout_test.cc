// host_layout_test: make_host_layout (runtime/host_layout.h), the split of a communicator's
// ranks into hosts that the cuda backend connects (symmetric memory inside a host, counterparts
// across hosts). Host code only: runs everywhere (CI included); gpu_runtime_hosts_test runs the
// layouts on GPUs.
#include <cstdio>
#include <string>
#include <vector>

#include "fusedcomm/runtime/errors.h"
#include "fusedcomm/runtime/host_layout.h"
#include "support/check.h"

namespace {

using fusedcomm::Error;
using fusedcomm::ErrorKind;
using fusedcomm::make_host_layout;
using fusedcomm::testing::check;

// The layout's kind of refusal for host_of seen from `rank`, or an empty message when accepted.
std::string refusal(const std::vector<int>& host_of, int rank, ErrorKind* kind) {
  try {
    make_host_layout(host_of, rank);
    return "";
  } catch (const Error& e) {
    *kind = e.kind();
    return e.what();
  }
}

}  // namespace

int main() {
  // Interleaved ranks (Spark places barrier tasks freely): hosts {0, 2, 4} and {1, 3, 5}.
  const std::vector<int> interleaved = {0, 1, 0, 1, 0, 1};
  for (int r = 0; r < 6; ++r) {
    const auto l = make_host_layout(interleaved, r);
    check(l.hosts == 2 && l.host == r % 2 && l.local_world == 3 && l.local_rank == r / 2,
          "interleaved: rank " + std::to_string(r) + "'s host and local rank");
    check(l.members() == (r % 2 == 0 ? std::vector<int>{0, 2, 4} : std::vector<int>{1, 3, 5}),
          "interleaved: members of rank " + std::to_string(r));
    check(l.counterparts == std::vector<int>{2 * (r / 2), 2 * (r / 2) + 1},
          "interleaved: counterparts of rank " + std::to_string(r));
    check(l.host_ranks == std::vector<std::vector<int>>{{0, 2, 4}, {1, 3, 5}},
          "interleaved: every host's ranks, seen from rank " + std::to_string(r));
  }
  // Blocks of two on three hosts.
  const auto b = make_host_layout({0, 0, 1, 1, 2, 2}, 3);
  check(b.hosts == 3 && b.host == 1 && b.local_rank == 1 && b.members() == std::vector<int>{2, 3} &&
            b.counterparts == std::vector<int>{1, 3, 5} &&
            b.host_ranks == std::vector<std::vector<int>>{{0, 1}, {2, 3}, {4, 5}},
        "blocks: rank 3");
  // One host: everyone a member, no one else to reach.
  const auto one = make_host_layout({0, 0, 0}, 2);
  check(one.hosts == 1 && one.local_world == 3 && one.local_rank == 2 &&
            one.counterparts == std::vector<int>{2},
        "one host");

  ErrorKind kind = ErrorKind::kState;
  std::string m = refusal({0, 0, 1}, 2, &kind);
  check(kind == ErrorKind::kUnavailable &&
            m.find("same number of ranks on every host: host 1 has 1") != std::string::npos,
        "uneven hosts refused: " + m);
  m = refusal({0, 2, 2, 0}, 0, &kind);
  check(kind == ErrorKind::kInvalidArgument && m.find("host id 1 has no rank") != std::string::npos,
        "an unused host id refused: " + m);
  m = refusal({0, -1}, 0, &kind);
  check(kind == ErrorKind::kInvalidArgument && m.find("negative host id") != std::string::npos,
        "a negative host id refused: " + m);
  m = refusal({0, 0}, 2, &kind);
  check(kind == ErrorKind::kInvalidArgument && m.find("outside world 2") != std::string::npos,
        "a rank outside the world refused: " + m);

  std::printf("host_layout_test: %d checks passed, %d failed\n", fusedcomm::testing::g_passed,
              fusedcomm::testing::g_failed);
  return fusedcomm::testing::g_failed == 0 ? 0 : 1;
}
