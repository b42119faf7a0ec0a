// Where a communicator's ranks live: which host each is on, and what that makes of this rank.
// Inside a host the cuda backend shares symmetric memory (NVLink, CUDA IPC) among the host's
// ranks; between hosts each rank talks to its counterparts, the ranks with the same local
// rank on the other hosts (inter_host.h). Ranks need not be contiguous per host (Spark assigns
// partitions to executors freely), but every host must hold the same number of ranks, so that
// every rank has exactly one counterpart per host.
#pragma once

#include <vector>

namespace fusedcomm {

struct HostLayout {
  int hosts = 1, host = 0;  // host ids 0..hosts-1 (the caller's numbering)
  int local_rank = 0, local_world = 1;
  std::vector<int> counterparts;             // [h]: the rank with this local rank on host h
  std::vector<std::vector<int>> host_ranks;  // [h]: the global ranks on host h, ascending

  // The global ranks on this rank's host, ascending.
  const std::vector<int>& members() const { return host_ranks[host]; }
  int rank() const { return counterparts[host]; }  // this rank, globally
  int world() const { return hosts * local_world; }
};

// host_of[r]: rank r's host id. Every id in 0..H-1 must be used. Throws Error(kInvalidArgument)
// for ids out of range or unused, Error(kUnavailable) when hosts hold different numbers of
// ranks (naming two of them).
HostLayout make_host_layout(const std::vector<int>& host_of, int rank);

}  // namespace fusedcomm
