// Wire format of the socket backend (private to rdma/socket/; tests include it to craft bad
// peers).
//
// One TCP connection per pair of ranks of a group. The higher rank dials the lower rank's
// listener, so every pair has exactly one connection and it carries writes both ways.
//
// Handshake: four WireHandshake messages, a challenge-response keyed by the group's key
// (fusedcomm/rdma/auth.h); neither the key nor the job token nor a share is ever sent.
//   dialer   -> acceptor : kHello      nonce = the dialer's fresh nonce Nd
//   acceptor -> dialer   : kChallenge  nonce = the acceptor's fresh nonce Na,
//                                      mac = proof(K, acceptor, transcript)
//                          (or kReject + reason, then close)
//   dialer   -> acceptor : kProof      mac = proof(K, dialer, transcript)
//                          (or kReject kBadAuth when the acceptor's proof is wrong, then close)
//   acceptor -> dialer   : kAccept     (or kReject + reason, then close)
// transcript = (version, comm id, world, dialer rank, acceptor rank, both ranks' published
// addresses, Nd, Na). The dialer checks the acceptor's proof before it sends its own, so a
// listener without the key learns nothing it can use; the acceptor gives a connection a rank's
// slot only after that rank's proof. An accepted socket must finish all of this within
// kHandshakeTimeout (core.h) and at most kMaxHandshakes (core.h) are in progress at once.
//
// Then, in both directions, any number of messages:
//   WireHeader{kind = kData} followed by `bytes` payload bytes
//   WireHeader{kind = kBye}  (the sender closed the group politely; nothing follows but EOF)
//
// Integers are in host byte order: all ranks of a job run on one architecture, and a peer of
// another byte order fails on the magic.
#pragma once

#include <cstdint>

#include "fusedcomm/rdma/auth.h"

namespace fusedcomm::rdma::wire {

inline constexpr uint64_t kHelloMagic = 0x324d4f4344455346ull;  // "FSEDCOM2"
inline constexpr uint32_t kDataMagic = 0x46434d31u;             // "1MCF"

enum HandshakeKind : uint32_t { kHello = 1, kAccept = 2, kReject = 3, kChallenge = 4, kProof = 5 };

enum RejectReason : uint32_t {
  kNoReason = 0,
  kBadVersion = 1,  // api versions differ
  kBadAuth = 2,     // a proof did not verify: the sender does not hold this group's key
  kBadWorld = 3,    // world size differs
  kBadRank = 4,     // target rank is not the acceptor, or the dialer's rank is not above it
  kDuplicate = 5,   // that rank is already connected
  kNotReady = 6,    // the acceptor has not called connect() for this group (yet): dial again
};

inline const char* reject_text(uint32_t reason) {
  switch (reason) {
    case kBadVersion: return "transport api version mismatch";
    case kBadAuth:
      return "authentication failed: the peer does not hold this communicator's key (a different job"
             " token or bootstrap, or not a rank of this communicator)";
    case kBadWorld: return "world size mismatch";
    case kBadRank: return "rank mismatch";
    case kDuplicate: return "that rank is already connected";
    case kNotReady: return "it has not called connect for this communicator yet";
    default: return "unspecified reason";
  }
}

struct alignas(8) WireHandshake {
  uint64_t magic;       // kHelloMagic
  uint32_t version;     // sender's kTransportApiVersion
  uint32_t kind;        // HandshakeKind
  uint64_t comm_id;     // GroupSpec::comm_id
  int32_t rank;         // sender's rank in the group
  int32_t world;        // group size
  int32_t target_rank;  // the receiver's rank
  uint32_t reason;      // kReject: RejectReason; else 0
  uint8_t nonce[auth::kNonceBytes];  // kHello: the dialer's nonce; kChallenge: the acceptor's
  uint8_t mac[auth::kDigestBytes];   // kChallenge, kProof: the sender's proof (auth::proof)
};
static_assert(sizeof(WireHandshake) == 104);

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
