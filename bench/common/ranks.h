// How the multi-GPU drivers start their ranks: one forked process per rank, rank r on GPU r
// (executor-native/tests/support/process_group.h), or a skip where fewer GPUs are visible.
#pragma once

#include <cstdio>

#include "bench/common/bench_util.h"
#include "support/process_group.h"

namespace fusedcomm::bench {

// Runs body(group) on `world` ranks within `timeout_s`. Returns the driver's exit status: 0 when
// every rank returned 0, 1 otherwise, 77 (skipped, said on stdout) with fewer than `gpus_needed`
// GPUs (the world; 1 where the ranks share GPU 0).
template <typename Body>
int run_ranks(int world, int timeout_s, int gpus_needed, Body body) {
  const int gpus = count_gpus_in_child();
  if (gpus < gpus_needed) {
    std::printf("SKIP: --world %d needs %d GPUs, %d visible\n", world, gpus_needed, gpus);
    return 77;
  }
  const int failed = testing::run_processes(
      world, [&](testing::ProcessGroup& g) { return body(g); }, timeout_s);
  return failed == 0 ? 0 : 1;
}
template <typename Body>
int run_ranks(int world, int timeout_s, Body body) {
  return run_ranks(world, timeout_s, world, body);
}

}  // namespace fusedcomm::bench
