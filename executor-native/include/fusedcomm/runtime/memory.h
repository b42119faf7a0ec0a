// Host memory the runtime hands out (tensors, staging), counted so tests can assert that a
// long run leaves native memory flat.
#pragma once

#include <cstddef>
#include <cstdint>

namespace fusedcomm {

// 128-byte aligned (proxy rings need it), zero-filled. Throws Error(kInvalidArgument) past 1 TiB, std::bad_alloc when
// the allocation fails.
void* host_alloc(size_t bytes);
void host_free(void* p);

struct MemoryStats {
  uint64_t live_bytes;
  uint64_t live_allocations;
};
MemoryStats memory_stats();

}  // namespace fusedcomm
