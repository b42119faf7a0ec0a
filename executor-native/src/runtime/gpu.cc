#include "fusedcomm/runtime/gpu.h"

#include <cuda_runtime_api.h>

#include <cstdio>
#include <vector>

#include "fusedcomm/runtime/errors.h"
#include "kernels/common/selftest.h"

namespace fusedcomm {
namespace {

std::string cuda_message(cudaError_t e) {
  return std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
}

std::string format_uuid(const cudaUUID_t& u) {
  const auto* b = reinterpret_cast<const unsigned char*>(u.bytes);
  char s[64];
  std::snprintf(s, sizeof s, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
                b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14],
                b[15]);
  return s;
}

void check(cudaError_t e, ErrorKind kind, const std::string& what) {
  if (e != cudaSuccess) fail(kind, what + " failed (" + cuda_message(e) + ")");
}

}  // namespace

CudaAvailability probe_cuda() {
  CudaAvailability a;
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e == cudaErrorInsufficientDriver || e == cudaErrorNoDevice || e == cudaErrorInitializationError ||
      e == cudaErrorCompatNotSupportedOnDevice) {
    a.reason = "no usable NVIDIA GPU on this host (" + cuda_message(e) +
               "); run on a GPU host or set spark.fusedcomm.backend=host";
    cudaGetLastError();
    return a;
  }
  if (e != cudaSuccess) {
    a.reason = "the CUDA runtime could not start (" + cuda_message(e) + ")";
    cudaGetLastError();
    return a;
  }
  if (count == 0) {
    a.reason = "no NVIDIA GPU is visible (check CUDA_VISIBLE_DEVICES)";
    return a;
  }
  a.device_count = count;
  int major = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
  if (major != 9) {
    a.reason = "GPU 0 has compute capability " + std::to_string(major) +
               ".x; this build carries sm_90a (Hopper) kernels only";
    return a;
  }
  a.available = true;
  a.reason = std::to_string(count) + " Hopper GPU(s) visible";
  return a;
}

void pin_gpu(int ordinal) { check(cudaSetDevice(ordinal), ErrorKind::kFatalGpu, "cudaSetDevice"); }

GpuInfo open_gpu(int ordinal) {
  CudaAvailability a = probe_cuda();
  if (!a.available) fail(ErrorKind::kUnavailable, "the cuda backend is unavailable: " + a.reason);
  if (ordinal < 0 || ordinal >= a.device_count) {
    fail(ErrorKind::kUnavailable, "GPU address " + std::to_string(ordinal) + " is not a visible device (" +
                                      std::to_string(a.device_count) +
                                      " visible); check the GPU discovery script");
  }
  check(cudaSetDevice(ordinal), ErrorKind::kUnavailable, "cudaSetDevice(" + std::to_string(ordinal) + ")");
  cudaDeviceProp p{};
  check(cudaGetDeviceProperties(&p, ordinal), ErrorKind::kFatalGpu, "cudaGetDeviceProperties");
  GpuInfo info;
  info.ordinal = ordinal;
  info.uuid = format_uuid(p.uuid);
  info.name = p.name;
  info.sm_count = p.multiProcessorCount;
  info.cc_major = p.major;
  info.cc_minor = p.minor;
  char bus[32] = {0};
  if (cudaDeviceGetPCIBusId(bus, sizeof bus, ordinal) == cudaSuccess) info.pci_bus_id = bus;
  if (p.major != 9) {
    fail(ErrorKind::kUnavailable, "GPU " + std::to_string(ordinal) + " (" + info.name +
                                      ") is not a Hopper GPU; the cuda backend needs sm_90");
  }
  // Self-test: proves the sm_90a code in this library loads and runs on the device.
  constexpr uint32_t n = 4096;
  uint32_t* d = nullptr;
  check(cudaMalloc(reinterpret_cast<void**>(&d), n * sizeof(uint32_t)), ErrorKind::kFatalGpu,
        "cudaMalloc (self-test)");
  std::vector<uint32_t> h(n, 0);
  cudaError_t e = kernels::launch_selftest(d, n, nullptr);
  if (e == cudaSuccess) e = cudaMemcpy(h.data(), d, n * sizeof(uint32_t), cudaMemcpyDeviceToHost);
  cudaFree(d);
  check(e, ErrorKind::kFatalGpu, "the self-test kernel");
  for (uint32_t i = 0; i < n; ++i) {
    if (h[i] != i * 3u + 1u) fail(ErrorKind::kFatalGpu, "the self-test kernel computed a wrong value");
  }
  return info;
}

}  // namespace fusedcomm
