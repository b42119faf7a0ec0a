// GPU-count probe for the multi-process GPU tests: the parent must not create a CUDA context
// before it forks its ranks, so the probe runs in a child and reports back through a pipe.
#pragma once

#include <cuda_runtime_api.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include "process_group.h"

namespace fusedcomm::testing {

// Number of Hopper GPUs, all with peer access to each other; -1 with the reason otherwise.
inline int probe_peer_gpus(std::string& reason) {
  int fds[2];
  if (pipe(fds) != 0) return -1;
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    int n = 0;
    char msg[256] = {};
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
      std::snprintf(msg, sizeof msg, "no usable NVIDIA GPU (%s)", cudaGetErrorString(e));
      n = -1;
    } else {
      int major = 0;
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
      if (n > 0 && major != 9) {
        std::snprintf(msg, sizeof msg, "GPU 0 is not a Hopper (sm_90) device");
        n = -1;
      }
      for (int a = 0; a < n && n > 0; ++a) {
        for (int b = 0; b < n; ++b) {
          int can = 1;
          if (a != b) cudaDeviceCanAccessPeer(&can, a, b);
          if (!can) {
            std::snprintf(msg, sizeof msg, "GPU %d cannot access GPU %d (no P2P)", a, b);
            n = -1;
            break;
          }
        }
      }
    }
    write_full(fds[1], &n, 4);
    write_full(fds[1], msg, sizeof msg);
    _exit(0);
  }
  close(fds[1]);
  int n = -1;
  char msg[256] = {};
  if (!read_full(fds[0], &n, 4) || !read_full(fds[0], msg, sizeof msg)) {
    n = -1;
    std::snprintf(msg, sizeof msg, "the GPU probe process failed");
  }
  close(fds[0]);
  int status;
  waitpid(pid, &status, 0);
  reason = msg;
  return n;
}

}  // namespace fusedcomm::testing
