// Host memory the runtime hands out (tensors, staging), counted so tests can assert that a
// long run leaves native memory flat; and the checked size arithmetic every tensor size that
// crosses the C API goes through.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

namespace fusedcomm {

// The largest host allocation: 1 TiB.
constexpr size_t kMaxHostAllocBytes = size_t{1} << 40;

// 128-byte aligned (proxy rings need it), zero-filled. Throws Error(kInvalidArgument) past
// kMaxHostAllocBytes, std::bad_alloc when the allocation fails.
void* host_alloc(size_t bytes);
void host_free(void* p);

struct MemoryStats {
  uint64_t live_bytes;
  uint64_t live_allocations;
};
MemoryStats memory_stats();

// The largest tensor the size arithmetic accepts, 2^62 bytes: far beyond any memory, and small
// enough that the sums derived from a size (an offset plus a length, W blocks of a split) cannot
// overflow int64 either.
constexpr int64_t kMaxTensorBytes = int64_t{1} << 62;

// The size in bytes of a tensor of shape `dims` with `elem_bytes`-byte elements, computed
// without overflow: Error(kInvalidArgument) naming `what` when it exceeds kMaxTensorBytes (an
// unchecked product wraps, e.g. 2^62 f32 elements to 0 bytes, and a copy of the real size then
// overruns the buffer). A negative dimension returns -1 without a check: the op's own argument
// checks refuse it, naming it.
int64_t checked_bytes(std::initializer_list<int64_t> dims, int64_t elem_bytes, const std::string& what);

}  // namespace fusedcomm
