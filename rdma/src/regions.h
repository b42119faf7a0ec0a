// What every backend checks and does the same way with registered regions and group specs
// (private to rdma/): bounds, the checks a write's destination and signal word must pass (the
// error texts peers see), writes a rank makes to itself, the monotonic signal store, and the
// arguments connect() refuses.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>

#include "fusedcomm/rdma/transport.h"

namespace fusedcomm::rdma {

using RegionMap = std::unordered_map<uint64_t, Region>;  // by Region::key

// "0x..." for region keys and communicator ids in messages.
std::string hex(uint64_t v);
// Whether [offset, offset + bytes) lies inside the region.
bool in_range(const Region& r, uint64_t offset, uint64_t bytes);
// Whether a peer's write may land in `regions`: the payload's destination (bytes > 0) and the
// signal word (signal_key != 0) lie inside registered regions, the word 8-byte aligned, no sum
// wrapping; else false with *why ("wrote 8 bytes to unknown region key 0x..", "wrote out of
// range: ...", "signalled an invalid word: ..."), which the receiver's error names the writer
// before. Pure: the fuzzer calls it through the socket backend's check_header.
bool check_write(const RegionMap& regions, uint64_t dst_key, uint64_t dst_offset, uint64_t bytes,
                 uint64_t signal_key, uint64_t signal_offset, std::string* why);
// The source bytes of a local write; throws std::invalid_argument if the range is not in a
// registered region.
const char* source_of(const RegionMap& regions, uint64_t key, uint64_t offset, uint64_t bytes);
// A rank's write to itself: copies within the process and applies the signal. Throws
// std::invalid_argument for an invalid range.
void local_write(const RegionMap& regions, const WriteOp& op);
// Stores max(*word, value) with release ordering: a signal word only grows.
void store_max_release(void* word, uint64_t value);

// Throws std::invalid_argument for a spec connect() cannot build: a rank outside the world,
// addresses not one per rank, a group of several ranks without a key.
void check_group_spec(const GroupSpec& spec);

}  // namespace fusedcomm::rdma
