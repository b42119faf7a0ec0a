// Wire format of the socket backend (private to rdma/socket/; tests include it to craft bad
// peers).
//
// One TCP connection per pair of ranks of a group. The higher rank dials the lower rank's
// listener, so every pair has exactly one connection and it carries writes both ways.
//
//   dialer  -> acceptor : WireHello{kind = kHello}
//   acceptor -> dialer  : WireHello{kind = kAccept}   (or kReject + reason, then close)
//   then, in both directions, any number of messages:
//     WireHeader{kind = kData} followed by `bytes` payload bytes
//     WireHeader{kind = kBye}  (the sender closed the group politely; nothing follows but EOF)
//
// Integers are in host byte order: all ranks of a job run on one architecture, and a peer of
// another byte order fails on the magic.
#pragma once

#include <cstdint>

namespace fusedcomm::rdma::wire {

inline constexpr uint64_t kHelloMagic = 0x314d4f4344455346ull;  // "FSEDCOM1"
inline constexpr uint32_t kDataMagic = 0x46434d31u;             // "1MCF"

enum HelloKind : uint32_t { kHello = 1, kAccept = 2, kReject = 3 };

enum RejectReason : uint32_t {
  kNoReason = 0,
  kBadVersion = 1,  // api versions differ
  kBadToken = 2,    // job token differs from the acceptor's group
  kBadWorld = 3,    // world size differs
  kBadRank = 4,     // target rank is not the acceptor, or the dialer's rank is not above it
  kDuplicate = 5,   // that rank is already connected
};

inline const char* reject_text(uint32_t reason) {
  switch (reason) {
    case kBadVersion: return "transport api version mismatch";
    case kBadToken: return "wrong job token";
    case kBadWorld: return "world size mismatch";
    case kBadRank: return "rank mismatch";
    case kDuplicate: return "that rank is already connected";
    default: return "unspecified reason";
  }
}

struct alignas(8) WireHello {
  uint64_t magic;       // kHelloMagic
  uint32_t version;     // sender's kTransportApiVersion
  uint32_t kind;        // HelloKind
  uint64_t job_token;   // GroupSpec::job_token
  uint64_t comm_id;     // GroupSpec::comm_id
  int32_t rank;         // sender's rank in the group
  int32_t world;        // group size
  int32_t target_rank;  // hello: the rank the dialer wants to reach; replies: the dialer's rank
  uint32_t reason;      // kReject: RejectReason; else 0
};
static_assert(sizeof(WireHello) == 48);

enum MessageKind : uint32_t { kData = 1, kBye = 2 };

struct alignas(8) WireHeader {
  uint32_t magic;          // kDataMagic
  uint32_t kind;           // MessageKind
  uint64_t dst_key;        // receiver's region (0 when bytes == 0)
  uint64_t dst_offset;     // byte offset in that region
  uint64_t bytes;          // payload bytes that follow this header
  uint64_t signal_key;     // 0: no signal
  uint64_t signal_offset;  // 8-byte aligned offset of the 64-bit signal word
  uint64_t signal_value;   // receiver stores max(old, value) after the payload landed
  uint64_t reserved;       // 0
};
static_assert(sizeof(WireHeader) == 64);

}  // namespace fusedcomm::rdma::wire
