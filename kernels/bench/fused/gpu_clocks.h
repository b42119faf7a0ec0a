// Bench-only: the SM clock, board power and clock-event reasons of one GPU, sampled through
// NVML while a timed batch runs (fused_bench --clocks). Why: the fused kernels' time over our
// GEMM alone could be a lower clock under NVLink traffic (power) as much as protocol overhead;
// the samples tell the two apart per impl. NVML is opened at run time (dlopen), so the bench
// builds and runs where it is missing (the sampler then reports itself off).
#pragma once

#include <dlfcn.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

namespace fusedcomm::bench {

class GpuClocks {
 public:
  // Opens NVML and finds the device with the CUDA PCI bus id `pci` (cudaDeviceGetPCIBusId).
  bool open(const char* pci) {
    void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) return false;
    auto sym = [&](const char* n) { return dlsym(lib, n); };
    auto init = reinterpret_cast<int (*)()>(sym("nvmlInit_v2"));
    auto by_pci = reinterpret_cast<int (*)(const char*, void**)>(sym("nvmlDeviceGetHandleByPciBusId_v2"));
    clock_ = reinterpret_cast<int (*)(void*, int, unsigned*)>(sym("nvmlDeviceGetClockInfo"));
    power_ = reinterpret_cast<int (*)(void*, unsigned*)>(sym("nvmlDeviceGetPowerUsage"));
    reasons_ = reinterpret_cast<int (*)(void*, unsigned long long*)>(
        sym("nvmlDeviceGetCurrentClocksEventReasons"));
    if (!reasons_) {
      reasons_ = reinterpret_cast<int (*)(void*, unsigned long long*)>(
          sym("nvmlDeviceGetCurrentClocksThrottleReasons"));
    }
    if (!init || !by_pci || !clock_ || !power_ || init() != 0) return false;
    return by_pci(pci, &dev_) == 0;
  }
  bool on() const { return dev_ != nullptr; }

  // One sample into slot `i` (an impl).
  void sample(size_t i) {
    if (!dev_) return;
    if (stats_.size() <= i) stats_.resize(i + 1);
    Stats& s = stats_[i];
    unsigned mhz = 0, mw = 0;
    unsigned long long why = 0;
    if (clock_(dev_, /*NVML_CLOCK_SM*/ 1, &mhz) != 0) return;
    if (power_(dev_, &mw) != 0) mw = 0;
    if (reasons_ && reasons_(dev_, &why) == 0) s.reasons |= why;
    s.n += 1;
    s.mhz_sum += mhz;
    s.mhz_min = std::min(s.mhz_min, mhz);
    s.mhz_max = std::max(s.mhz_max, mhz);
    s.mw_sum += mw;
  }

  // "sm 1755 MHz (1710-1980), 612 W, reasons 0x4, 40 samples" for slot i.
  std::string summary(size_t i) const {
    if (i >= stats_.size() || stats_[i].n == 0) return "no samples";
    const Stats& s = stats_[i];
    char b[160];
    std::snprintf(b, sizeof b, "sm %.0f MHz (%u-%u), %.0f W, reasons 0x%llx, %d samples",
                  s.mhz_sum / s.n, s.mhz_min, s.mhz_max, s.mw_sum / s.n / 1000.0, s.reasons, s.n);
    return b;
  }
  void reset() { stats_.clear(); }

 private:
  struct Stats {
    int n = 0;
    double mhz_sum = 0, mw_sum = 0;
    unsigned mhz_min = ~0u, mhz_max = 0;
    unsigned long long reasons = 0;
  };
  void* dev_ = nullptr;
  int (*clock_)(void*, int, unsigned*) = nullptr;
  int (*power_)(void*, unsigned*) = nullptr;
  int (*reasons_)(void*, unsigned long long*) = nullptr;
  std::vector<Stats> stats_;
};

}  // namespace fusedcomm::bench
