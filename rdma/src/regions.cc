// Region rules and group-spec checks shared by the backends (regions.h).
#include "regions.h"

#include <atomic>
#include <cstring>
#include <sstream>
#include <stdexcept>

namespace fusedcomm::rdma {

std::string hex(uint64_t v) {
  std::ostringstream s;
  s << "0x" << std::hex << v;
  return s.str();
}

bool in_range(const Region& r, uint64_t offset, uint64_t bytes) {
  return offset <= r.bytes && bytes <= r.bytes - offset;
}

bool check_write(const RegionMap& regions, uint64_t dst_key, uint64_t dst_offset, uint64_t bytes,
                 uint64_t signal_key, uint64_t signal_offset, std::string* why) {
  if (bytes) {
    auto it = regions.find(dst_key);
    if (it == regions.end()) {
      *why = "wrote " + std::to_string(bytes) + " bytes to unknown region key " + hex(dst_key);
      return false;
    }
    if (!in_range(it->second, dst_offset, bytes)) {
      *why = "wrote out of range: offset " + std::to_string(dst_offset) + " + " + std::to_string(bytes) +
             " bytes exceeds region " + hex(dst_key) + " of " + std::to_string(it->second.bytes) + " bytes";
      return false;
    }
  }
  if (signal_key) {
    auto it = regions.find(signal_key);
    if (it == regions.end()) {
      *why = "signalled unknown region key " + hex(signal_key);
      return false;
    }
    const uintptr_t addr = reinterpret_cast<uintptr_t>(it->second.base) + signal_offset;
    if (!in_range(it->second, signal_offset, 8) || addr % 8 != 0) {
      *why = "signalled an invalid word: offset " + std::to_string(signal_offset) + " in region " +
             hex(signal_key) + " of " + std::to_string(it->second.bytes) +
             " bytes (must be in range and 8-byte aligned)";
      return false;
    }
  }
  return true;
}

const char* source_of(const RegionMap& regions, uint64_t key, uint64_t offset, uint64_t bytes) {
  auto it = regions.find(key);
  if (it == regions.end()) {
    throw std::invalid_argument("write: source region " + hex(key) + " is not registered");
  }
  if (!in_range(it->second, offset, bytes)) {
    throw std::invalid_argument("write: source range [" + std::to_string(offset) + ", +" +
                                std::to_string(bytes) + ") exceeds region " + hex(key) + " of " +
                                std::to_string(it->second.bytes) + " bytes");
  }
  return static_cast<const char*>(it->second.base) + offset;
}

void store_max_release(void* word, uint64_t value) {
  std::atomic_ref<uint64_t> w(*static_cast<uint64_t*>(word));
  uint64_t old = w.load(std::memory_order_relaxed);
  while (old < value &&
         !w.compare_exchange_weak(old, value, std::memory_order_release, std::memory_order_relaxed)) {}
}

void local_write(const RegionMap& regions, const WriteOp& op) {
  auto find = [&](uint64_t key, uint64_t off, uint64_t n, const char* what) -> char* {
    auto it = regions.find(key);
    if (it == regions.end() || !in_range(it->second, off, n)) {
      throw std::invalid_argument(std::string("write to self: ") + what + " range is invalid");
    }
    return static_cast<char*>(it->second.base) + off;
  };
  if (op.bytes) {
    const char* src = find(op.src_key, op.src_offset, op.bytes, "source");
    char* dst = find(op.dst_key, op.dst_offset, op.bytes, "destination");
    std::memmove(dst, src, op.bytes);
  }
  if (op.signal_key) {
    if (op.signal_offset % 8) throw std::invalid_argument("write to self: unaligned signal");
    store_max_release(find(op.signal_key, op.signal_offset, 8, "signal"), op.signal_value);
  }
}

void check_group_spec(const GroupSpec& spec) {
  if (spec.world < 1 || spec.rank < 0 || spec.rank >= spec.world) {
    throw std::invalid_argument("connect: rank " + std::to_string(spec.rank) + " is not in [0, " +
                                std::to_string(spec.world) + ")");
  }
  if (spec.world > 1 && spec.addresses.size() != static_cast<size_t>(spec.world)) {
    throw std::invalid_argument("connect: " + std::to_string(spec.addresses.size()) +
                                " addresses for a world of " + std::to_string(spec.world));
  }
  if (spec.world > 1 && !auth::is_set(spec.key)) {
    throw std::invalid_argument(
        "connect: the group has no key (GroupSpec::key): its connections cannot be"
        " authenticated");
  }
}

}  // namespace fusedcomm::rdma
