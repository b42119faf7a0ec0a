#include "kernels/collectives/copy_segments.h"

#include <cuda_bf16.h>

#include <algorithm>

namespace fusedcomm::kernels {
namespace {

// blockIdx.y: the segment; the x CTAs share its bytes.
__global__ void copy_segments_kernel(const __grid_constant__ CopySegments c) {
  const CopySegment s = c.seg[blockIdx.y];
  const auto* src = static_cast<const uint8_t*>(s.src);
  auto* dst = static_cast<uint8_t*>(s.dst);
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  const uint64_t first = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  uint64_t done = 0;
  if (reinterpret_cast<uintptr_t>(src) % 16 == 0 && reinterpret_cast<uintptr_t>(dst) % 16 == 0) {
    const uint64_t vecs = s.bytes / 16;
    for (uint64_t i = first; i < vecs; i += stride) {
      reinterpret_cast<uint4*>(dst)[i] = reinterpret_cast<const uint4*>(src)[i];
    }
    done = vecs * 16;
  }
  for (uint64_t i = done + first; i < s.bytes; i += stride) dst[i] = src[i];
}

__global__ void narrow_kernel(const float* src, __nv_bfloat16* dst, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    dst[i] = __float2bfloat16_rn(src[i]);
  }
}

}  // namespace

cudaError_t launch_narrow_to_bf16(const float* src, void* dst, int64_t n, cudaStream_t stream) {
  if (n < 0 || (n > 0 && (src == nullptr || dst == nullptr))) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  const unsigned ctas = static_cast<unsigned>(std::clamp<int64_t>((n + 4095) / 4096, 1, 1024));
  narrow_kernel<<<ctas, 256, 0, stream>>>(src, static_cast<__nv_bfloat16*>(dst), n);
  return cudaGetLastError();
}

cudaError_t launch_copy_segments(const CopySegments& c, cudaStream_t stream) {
  if (c.count < 0 || c.count > kMaxCopySegments) return cudaErrorInvalidValue;
  if (c.count == 0) return cudaSuccess;
  uint64_t largest = 0;
  for (int i = 0; i < c.count; ++i) {
    if (c.seg[i].src == nullptr || c.seg[i].dst == nullptr) return cudaErrorInvalidValue;
    largest = std::max(largest, c.seg[i].bytes);
  }
  // About 64 KiB per CTA, at most 32 CTAs per segment: enough to stream a block at full speed
  // without flooding the GPU for small ones.
  const unsigned ctas = static_cast<unsigned>(std::clamp<uint64_t>((largest + 65535) / 65536, 1, 32));
  copy_segments_kernel<<<dim3(ctas, static_cast<unsigned>(c.count)), 256, 0, stream>>>(c);
  return cudaGetLastError();
}

}  // namespace fusedcomm::kernels
