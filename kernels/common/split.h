// The uneven-split rule every op follows (docs/ops.md; the same as executor-native's split.h):
// n items over w ranks, rank r gets n/w + (r < n%w) of them, starting at r*(n/w) + min(r, n%w).
// Host and device code (compiled by nvcc).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace fusedcomm::kernels::detail {

__host__ __device__ __forceinline__ int64_t split_count(int64_t n, int w, int r) {
  return n / w + (r < n % w ? 1 : 0);
}
__host__ __device__ __forceinline__ int64_t split_offset(int64_t n, int w, int r) {
  const int64_t rem = n % w;
  return static_cast<int64_t>(r) * (n / w) + (r < rem ? r : rem);
}
// The rank whose block holds item i (0 <= i < n).
__host__ __device__ __forceinline__ int split_owner(int64_t n, int w, int64_t i) {
  const int64_t q = n / w, rem = n % w;
  if (i < rem * (q + 1)) return static_cast<int>(i / (q + 1));
  return static_cast<int>(rem + (i - rem * (q + 1)) / q);  // q > 0 here: i < n
}

}  // namespace fusedcomm::kernels::detail
