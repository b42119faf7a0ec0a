// Many small device-to-device copies in one launch: the rearrangements of the hierarchical
// collectives (blocks of a tensor into per-host or per-rank order and back), where one
// cudaMemcpyAsync per block would cost a few microseconds of launch each (up to 64 blocks).
// And the one conversion those paths need: fp32 sums to bf16.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace fusedcomm::kernels {

inline constexpr int kMaxCopySegments = 64;

struct CopySegment {
  const void* src;
  void* dst;
  uint64_t bytes;
};

// Up to kMaxCopySegments copies, passed by value (about 1.5 KiB of kernel parameters).
struct CopySegments {
  CopySegment seg[kMaxCopySegments];
  int count = 0;
  // Adds one copy; empty copies are dropped. Returns false when full.
  bool add(const void* src, void* dst, uint64_t bytes) {
    if (bytes == 0) return true;
    if (count == kMaxCopySegments) return false;
    seg[count++] = CopySegment{src, dst, bytes};
    return true;
  }
};

// Enqueues the copies on `stream`, in any order and in parallel: no destination may overlap
// another copy's source or destination. 16-byte vectors where a segment's pointers and size
// allow, bytes elsewhere. Nothing is launched for zero segments.
cudaError_t launch_copy_segments(const CopySegments& c, cudaStream_t stream);

// dst[i] = src[i] rounded to bf16 (nearest even), i < n. Nothing is launched for n == 0.
cudaError_t launch_narrow_to_bf16(const float* src, void* dst, int64_t n, cudaStream_t stream);

}  // namespace fusedcomm::kernels
