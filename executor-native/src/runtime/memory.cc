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
  FC_REQUIRE(bytes <= (size_t{1} << 40),
             "host allocation of " + std::to_string(bytes) + " bytes is too large");
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

}  // namespace fusedcomm
