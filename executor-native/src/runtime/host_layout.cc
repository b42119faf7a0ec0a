#include "fusedcomm/runtime/host_layout.h"

#include <algorithm>
#include <string>

#include "fusedcomm/runtime/errors.h"

namespace fusedcomm {

HostLayout make_host_layout(const std::vector<int>& host_of, int rank) {
  const int world = static_cast<int>(host_of.size());
  FC_REQUIRE(rank >= 0 && rank < world,
             "host layout: rank " + std::to_string(rank) + " outside world " + std::to_string(world));
  HostLayout l;
  l.hosts = *std::max_element(host_of.begin(), host_of.end()) + 1;
  std::vector<std::vector<int>> ranks_of(l.hosts);
  for (int r = 0; r < world; ++r) {
    FC_REQUIRE(host_of[r] >= 0, "host layout: rank " + std::to_string(r) + " has a negative host id");
    ranks_of[host_of[r]].push_back(r);  // ascending: r grows
  }
  for (int h = 0; h < l.hosts; ++h) {
    FC_REQUIRE(!ranks_of[h].empty(), "host layout: host id " + std::to_string(h) + " has no rank");
    if (ranks_of[h].size() != ranks_of[0].size()) {
      fail(ErrorKind::kUnavailable, "the cuda backend needs the same number of ranks on every host: host " +
                                        std::to_string(h) + " has " + std::to_string(ranks_of[h].size()) +
                                        " (ranks " + std::to_string(ranks_of[h].front()) +
                                        ", ...) and host 0 has " + std::to_string(ranks_of[0].size()) +
                                        "; give every host the same number of executors");
    }
  }
  l.host = host_of[rank];
  l.host_ranks = std::move(ranks_of);
  const std::vector<int>& mine = l.members();
  l.local_world = static_cast<int>(mine.size());
  l.local_rank = static_cast<int>(std::find(mine.begin(), mine.end(), rank) - mine.begin());
  for (int h = 0; h < l.hosts; ++h) l.counterparts.push_back(l.host_ranks[h][l.local_rank]);
  return l;
}

}  // namespace fusedcomm
