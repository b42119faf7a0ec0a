// What the host backend's ranks write into each other's staging regions (TransportExchanger):
// the chunk header, the region's layout and the fingerprints of the communicator's own barriers.
// Internal to the runtime; the native tests that play a peer include it too.
//
// Staging region layout (one registered region per communicator), W = world,
// S = slot stride = sizeof(ChunkHeader) + chunk_bytes:
//   recv slots  [0, 2WS)        slot (src, b) at (2 src + b) S: chunks from rank src, b = chunk % 2
//   send slots  [2WS, 4WS)      slot (dst, b): my chunk for rank dst, staged before posting
//   data flags  [4WS, 4WS+8W)   data[src]: chunks src has delivered here (written by src)
//   credits     [4WS+8W, +8W)   credit[dst]: my chunks dst has consumed (written by dst)
// Two slots per pair: chunk c may be sent once the receiver has consumed chunk c-2
// (c - credit < 2). Flags only grow; they are written by the transport with release ordering
// after the payload, and read with acquire loads.
//
// Everything a peer writes here is untrusted until checked: the receiver checks each header
// against what it expects (magic, exchange, fingerprint, the exact offset and length of the
// chunk it waits for) and each flag against what the protocol allows, before using any of it.
#pragma once

#include <cstddef>
#include <cstdint>

namespace fusedcomm::chunk_wire {

inline constexpr uint64_t kChunkMagic = 0x6663636b6e6b6331ull;  // "fcckn kc1"

// Each chunk slot starts with this header; the payload follows it. It is written by the sender
// into its own send slot, then travels with the payload in one transport write.
struct alignas(64) ChunkHeader {
  uint64_t magic;         // kChunkMagic
  uint64_t exchange_seq;  // the sender's exchange counter: ranks must call ops in one order
  uint64_t fingerprint;   // the op's global parameters (begin_op)
  uint64_t total_bytes;   // whole block this exchange sends to the receiver
  uint64_t offset;        // of this chunk's payload within the block: chunk index × chunk_bytes
  uint64_t bytes;         // payload bytes in this chunk: min(chunk_bytes, total_bytes - offset)
  uint64_t reserved[2];
  char op[320];    // the sender's op description, NUL-terminated within the field
  char step[128];  // the exchange step, NUL-terminated within the field
};
static_assert(sizeof(ChunkHeader) == 512, "ChunkHeader travels between ranks");

// Offsets into the staging region of a world of `world` ranks with `chunk_bytes` chunks.
struct StagingLayout {
  int world;
  uint64_t chunk_bytes;

  size_t slot_stride() const { return sizeof(ChunkHeader) + chunk_bytes; }
  size_t recv_slot(int src, uint64_t chunk) const {
    return (2 * static_cast<size_t>(src) + chunk % 2) * slot_stride();
  }
  size_t send_slot(int dst, uint64_t chunk) const {
    return 2 * static_cast<size_t>(world) * slot_stride() + recv_slot(dst, chunk);
  }
  size_t data_flag(int src) const { return 4 * static_cast<size_t>(world) * slot_stride() + 8 * src; }
  size_t credit_flag(int dst) const {
    return 4 * static_cast<size_t>(world) * slot_stride() + 8 * static_cast<size_t>(world) + 8 * dst;
  }
  size_t bytes() const {
    return 4 * static_cast<size_t>(world) * slot_stride() + 16 * static_cast<size_t>(world);
  }
};

// Fingerprint of one of the communicator's own barriers ("connect", "finish"): a hash of its
// name (FNV-1a), so that a rank in the finish barrier and a rank in an op are told apart.
inline uint64_t barrier_fingerprint(const char* name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (const char* p = name; *p; ++p) h = (h ^ static_cast<unsigned char>(*p)) * 0x100000001b3ull;
  return h;
}

}  // namespace fusedcomm::chunk_wire
