// The executor's GPU: availability probe, opening (pin + self-test launch), identity.
// Everything here goes through the CUDA runtime linked statically; on a host without a driver
// or device the probe reports why instead of failing.
#pragma once

#include <string>

namespace fusedcomm {

struct CudaAvailability {
  bool available = false;
  int device_count = 0;
  std::string reason;  // why not, as a sentence a user can act on
};
CudaAvailability probe_cuda();

struct GpuInfo {
  int ordinal = -1;
  std::string uuid;  // "GPU-xxxxxxxx-..." as nvidia-smi prints it
  std::string name;
  std::string pci_bus_id;
  int sm_count = 0;
  int cc_major = 0, cc_minor = 0;
};

// Makes `ordinal` current on the calling thread, checks it is a Hopper (sm_90) device, runs the
// kernels library's self-test, and describes it. Throws Error(kUnavailable) for a setup
// problem, Error(kFatalGpu) if the device fails.
GpuInfo open_gpu(int ordinal);
// Makes `ordinal` current on the calling thread (Spark task threads are pooled).
void pin_gpu(int ordinal);

}  // namespace fusedcomm
