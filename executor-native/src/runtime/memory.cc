#include "fusedcomm/runtime/memory.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <new>

#include "fusedcomm/runtime/errors.h"

namespace fusedcomm {
namespace {
std::atomic<uint64_t> g_live_bytes{0};
std::atomic<uint64_t> g_live_allocations{0};
constexpr size_t kAlign = 128;  // ProxyCommand slots are alignas(128)
// Each block starts with its size so host_free can count it down.
constexpr size_t kHeader = kAlign;
}  // namespace

void* host_alloc(size_t bytes) {
  // Checked first: the rounding below cannot overflow a size_t below this bound.
  FC_REQUIRE(bytes <= kMaxHostAllocBytes, "host allocation of " + std::to_string(bytes) +
                                              " bytes is too large (at most " +
                                              std::to_string(kMaxHostAllocBytes) + ")");
  size_t total = kHeader + ((bytes + kAlign - 1) / kAlign) * kAlign;
  void* raw = std::aligned_alloc(kAlign, total);
  if (raw == nullptr) throw std::bad_alloc();
  std::memset(raw, 0, total);
  *static_cast<uint64_t*>(raw) = bytes;
  g_live_bytes += bytes;
  g_live_allocations += 1;
  return static_cast<char*>(raw) + kHeader;
}

void host_free(void* p) {
  if (p == nullptr) return;
  char* raw = static_cast<char*>(p) - kHeader;
  g_live_bytes -= *reinterpret_cast<uint64_t*>(raw);
  g_live_allocations -= 1;
  std::free(raw);
}

MemoryStats memory_stats() { return {g_live_bytes.load(), g_live_allocations.load()}; }

int64_t checked_bytes(std::initializer_list<int64_t> dims, int64_t elem_bytes, const std::string& what) {
  bool empty = false;
  for (int64_t d : dims) {
    if (d < 0) return -1;  // the op's own check names it
    empty = empty || d == 0;
  }
  if (empty) return 0;
  int64_t bytes = elem_bytes;
  for (int64_t d : dims) {
    if (__builtin_mul_overflow(bytes, d, &bytes) || bytes > kMaxTensorBytes) {
      std::string shape;
      for (int64_t e : dims) shape += (shape.empty() ? "" : " x ") + std::to_string(e);
      fail(ErrorKind::kInvalidArgument, what + ": " + shape + " elements of " + std::to_string(elem_bytes) +
                                            " bytes are more than a tensor can hold (" +
                                            std::to_string(kMaxTensorBytes) + " bytes)");
    }
  }
  return bytes;
}

}  // namespace fusedcomm
