// The cuda backend's communicator made as the C API's callers make it, for the multi-process
// GPU tests: the endpoints, device handles and authentication shares go through the test's
// ProcessGroup (the stand-in for the launcher's allGather), and every rank is given a host id,
// so that a test can lay its ranks out as "virtual hosts" (docs/architecture.md).
#pragma once

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "fusedcomm/comm/cuda_comm.h"
#include "fusedcomm/rdma/auth.h"
#include "fusedcomm/runtime/errors.h"
#include "fusedcomm/runtime/runtime.h"
#include "support/check.h"
#include "support/process_group.h"

namespace fusedcomm::testing {

// host_of[r]: rank r's host id (every id 0..H-1 used, the same number of ranks on each).
inline std::unique_ptr<CudaComm> make_cuda_comm(Runtime& rt, ProcessGroup& g, uint64_t comm_id,
                                                const std::vector<int>& host_of) {
  auto dc = std::make_unique<CudaComm>(rt, g.rank, g.world);
  const std::string ep = dc->endpoint();
  const auto eps = g.all_gather(std::vector<uint8_t>(ep.begin(), ep.end()));
  Bootstrap b;
  b.rank = g.rank;
  b.comm_id = comm_id;
  b.device_handles = g.all_gather(dc->device_handle());
  const rdma::auth::Share share = rdma::auth::random_share();
  for (const auto& sh : g.all_gather(std::vector<uint8_t>(share.begin(), share.end()))) {
    std::memcpy(b.auth_shares.emplace_back().data(), sh.data(), share.size());
  }
  b.host_ids = host_of;
  for (const auto& e : eps) b.endpoints.emplace_back(e.begin(), e.end());
  dc->connect(b);
  return dc;
}

// FC_TEST_HOSTS=<H> (tests that take it): H virtual hosts, rank r on host r * H / W, where H
// divides W; 1 (unset, or a world H does not divide): every rank on one host.
inline std::vector<int> virtual_hosts(int world) {
  const char* s = std::getenv("FC_TEST_HOSTS");
  const int h = s ? std::atoi(s) : 1;
  std::vector<int> host_of(world, 0);
  if (h > 1 && world % h == 0) {
    for (int r = 0; r < world; ++r) host_of[r] = r * h / world;
  }
  return host_of;
}

// Runs op(stream) on a stream of the caller and waits; with `graph`, captures it on that stream
// (thread-local mode) and replays the graph `replays` times instead. Returns the first CUDA error.
template <class Op>
cudaError_t run_on_stream(cudaStream_t stream, bool graph, int replays, Op op) {
  if (!graph) {
    op(stream);
    return cudaStreamSynchronize(stream);
  }
  cudaGraph_t g = nullptr;
  cudaGraphExec_t exec = nullptr;
  cudaError_t e = cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal);
  if (e != cudaSuccess) return e;
  op(stream);
  e = cudaStreamEndCapture(stream, &g);
  if (e == cudaSuccess) e = cudaGraphInstantiate(&exec, g, 0);
  for (int i = 0; e == cudaSuccess && i < replays; ++i) e = cudaGraphLaunch(exec, stream);
  if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
  if (exec != nullptr) cudaGraphExecDestroy(exec);
  if (g != nullptr) cudaGraphDestroy(g);
  return e;
}

inline int host_count(const std::vector<int>& host_of) {
  int h = 0;
  for (int x : host_of) h = x + 1 > h ? x + 1 : h;
  return h;
}

// A rank that never arrives: on a rank that runs it (not the last, which skips it), op() must
// end in Error(kTimeout) within seconds, naming a rank. With every rank on one host the ring's
// own waits name the missing one ("peer N "); across hosts (virtual_hosts) the waits are the
// collectives', naming a rank of this host or one between hosts ("rank N (host h)").
template <class Op>
void expect_dead_rank_timeout(const ProcessGroup& g, Op op) {
  const auto t0 = std::chrono::steady_clock::now();
  bool timeout = false;
  std::string msg;
  try {
    op();
  } catch (const Error& e) {
    timeout = e.kind() == ErrorKind::kTimeout;
    msg = e.what();
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (g.rank == 0) std::printf("  dead rank: %s (%.1f s)\n", msg.c_str(), secs);
  check(timeout && secs < 10.0,
        "a rank that never arrives: Error(kTimeout) within seconds (got '" + msg + "')");
  const bool named = host_count(virtual_hosts(g.world)) > 1
                         ? msg.find("(host ") != std::string::npos || msg.find("peer ") != std::string::npos
                         : msg.find("peer " + std::to_string(g.world - 1) + " ") != std::string::npos;
  check(named, "a rank that never arrives: the error names a rank (got '" + msg + "')");
}

}  // namespace fusedcomm::testing
