#include "fusedcomm/runtime/device_memory.h"

#include <cuda.h>

#include <string>

#include "fusedcomm/runtime/errors.h"
#include "fusedcomm/runtime/gpu.h"
#include "kernels/common/driver_entry.h"

namespace fusedcomm {
namespace {

std::string cuda_message(cudaError_t e) {
  return std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
}

// A failed call: without a usable GPU the probe's sentence; a bad address or handle is the
// caller's argument; out of device memory leaves the GPU usable; anything else poisons it.
[[noreturn]] void fail_cuda(cudaError_t e, const std::string& what) {
  cudaGetLastError();  // reported here, not left for the next launch to find
  const CudaAvailability a = probe_cuda();
  if (a.device_count == 0) fail(ErrorKind::kUnavailable, what + ": " + a.reason);
  const std::string message = what + " failed (" + cuda_message(e) + ")";
  switch (e) {
    case cudaErrorInvalidValue:
    case cudaErrorInvalidResourceHandle:
    case cudaErrorInvalidDevicePointer: fail(ErrorKind::kInvalidArgument, message);
    case cudaErrorMemoryAllocation: fail(ErrorKind::kState, message);
    default: fail(ErrorKind::kFatalGpu, message);
  }
}

using MemGetAddressRange = CUresult (*)(CUdeviceptr*, size_t*, CUdeviceptr);

}  // namespace

PointerInfo pointer_info(const void* ptr) {
  cudaPointerAttributes a{};
  const cudaError_t e = cudaPointerGetAttributes(&a, ptr);
  if (e != cudaSuccess) fail_cuda(e, "cudaPointerGetAttributes");
  PointerInfo info;
  switch (a.type) {
    case cudaMemoryTypeHost: info.type = MemoryType::kHost; break;
    case cudaMemoryTypeDevice: info.type = MemoryType::kDevice; break;
    case cudaMemoryTypeManaged: info.type = MemoryType::kManaged; break;
    default: info.type = MemoryType::kUnregistered; break;
  }
  info.device = info.type == MemoryType::kUnregistered ? -1 : a.device;
  if (info.type == MemoryType::kDevice || info.type == MemoryType::kManaged) {
    static const auto range = kernels::detail::driver_entry<MemGetAddressRange>("cuMemGetAddressRange", 12000);
    CUdeviceptr base = 0;
    size_t bytes = 0;
    if (range != nullptr && range(&base, &bytes, reinterpret_cast<CUdeviceptr>(ptr)) == CUDA_SUCCESS) {
      info.range_base = static_cast<uint64_t>(base);
      info.range_bytes = static_cast<uint64_t>(bytes);
    }
  }
  return info;
}

int stream_device(cudaStream_t stream) {
  int device = -1;
  // A stream being captured into a graph refuses the query (cudaErrorStreamCaptureUnsupported,
  // and the capture is invalidated); asking whether it captures is allowed.
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &capture) == cudaSuccess && capture != cudaStreamCaptureStatusNone) {
    return -1;
  }
  cudaGetLastError();
  const cudaError_t e = cudaStreamGetDevice(stream, &device);
  if (e != cudaSuccess) fail_cuda(e, "cudaStreamGetDevice");
  return device;
}

void* device_alloc(size_t bytes) {
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, bytes == 0 ? 1 : bytes);
  if (e != cudaSuccess) fail_cuda(e, "cudaMalloc of " + std::to_string(bytes) + " bytes");
  return p;
}

void device_free(void* ptr) {
  if (ptr == nullptr) return;
  const cudaError_t e = cudaFree(ptr);
  if (e != cudaSuccess) fail_cuda(e, "cudaFree");
}

void device_copy(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  const cudaError_t e = cudaMemcpy(dst, src, bytes, cudaMemcpyDefault);
  if (e != cudaSuccess) fail_cuda(e, "cudaMemcpy of " + std::to_string(bytes) + " bytes");
}

void device_copy_2d(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width,
                    size_t height) {
  if (width == 0 || height == 0) return;
  const cudaError_t e = cudaMemcpy2D(dst, dst_pitch, src, src_pitch, width, height, cudaMemcpyDefault);
  if (e != cudaSuccess)
    fail_cuda(e, "cudaMemcpy2D of " + std::to_string(height) + " rows of " + std::to_string(width) + " bytes");
}

void device_memory(uint64_t* free_bytes, uint64_t* total_bytes) {
  size_t free_b = 0;
  size_t total_b = 0;
  const cudaError_t e = cudaMemGetInfo(&free_b, &total_b);
  if (e != cudaSuccess) fail_cuda(e, "cudaMemGetInfo");
  *free_bytes = free_b;
  *total_bytes = total_b;
}

}  // namespace fusedcomm
