// What the one-process, every-GPU probes of this folder share (ar_store_probe.cu,
// ce_gemm_probe.cu): a CUDA call that exits on failure, peer access between every pair of
// GPUs, and a watchdog that bounds the run even if something blocks in the driver.
#pragma once

#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#define CK(x)                                                                               \
  do {                                                                                      \
    cudaError_t e_ = (x);                                                                   \
    if (e_ != cudaSuccess) {                                                                \
      std::printf("%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));       \
      std::exit(1);                                                                         \
    }                                                                                       \
  } while (0)

// Peer access between GPUs [0, G), each way. False where a pair has none, after printing
// "<probe>: GPU a cannot access GPU b<why>".
inline bool enable_peer_access(int G, const char* probe, const char* why) {
  for (int a = 0; a < G; ++a) {
    CK(cudaSetDevice(a));
    for (int b = 0; b < G; ++b) {
      if (a == b) continue;
      int can = 0;
      CK(cudaDeviceCanAccessPeer(&can, a, b));
      if (!can) {
        std::printf("%s: GPU %d cannot access GPU %d%s\n", probe, a, b, why);
        return false;
      }
      const cudaError_t e = cudaDeviceEnablePeerAccess(b, 0);
      if (e != cudaErrorPeerAccessAlreadyEnabled) CK(e);
      (void)cudaGetLastError();  // the already-enabled error is sticky in the last-error slot
    }
  }
  return true;
}

// After `seconds`, prints `message` and ends the process with `code`.
inline void start_watchdog(int seconds, std::string message, int code) {
  std::thread([=] {
    std::this_thread::sleep_for(std::chrono::seconds(seconds));
    std::printf("%s\n", message.c_str());
    std::fflush(stdout);
    std::_Exit(code);
  }).detach();
}
