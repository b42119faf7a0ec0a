// Authentication of a group's connections, shared by every transport backend: SHA-256 and
// HMAC-SHA-256 (FIPS 180-4, RFC 2104; written here, no system library, checked against the
// FIPS and RFC 4231 vectors by rdma/tests/transport_auth_test), the communicator key, and the
// proofs of the challenge-response handshake that a backend's connection setup runs.
//
// No secret ever travels on a transport's own connections:
//   - The key. Every rank draws a random share (kShareBytes) and publishes it in its bootstrap
//     blob, which travels only through the launcher's allGather (Spark's barrier RPC, covered
//     by spark.authenticate / spark.network.crypto.enabled). The communicator's key is
//       K = HMAC-SHA-256(key = job token (8 bytes, little-endian),
//                        "fusedcomm comm key v1" || comm_id || W || share_0 || ... || share_W-1)
//     (integers little-endian, comm_id 8 bytes, W 4 bytes): an HKDF-Extract with the token as
//     salt. A sniffer of the transport sees neither the token nor any share, so it cannot
//     compute K, and a new communicator gets a new key.
//   - The handshake. The dialer and the acceptor each send a fresh random nonce; each proves
//     that it holds K with
//       proof = HMAC-SHA-256(K, role || transcript)
//     where the transcript binds the protocol version, the group id, the world, both ranks,
//     both ranks' published addresses and both nonces, and role ("acceptor" / "dialer") keeps a
//     proof from being reflected back. A captured handshake is useless: the other side's nonce
//     is new every time. Proofs are compared in constant time.
//   - Slot binding. A connection takes rank r's slot only once it proved K over the identity
//     that rank r published in the bootstrap (rank, address, share): first come takes nothing.
//
// A backend's handshake (socket/handshake.cc; the libfabric backend's when it lands) builds a
// Transcript from its messages and calls proof() / check_proof(); nothing else here is
// backend-specific.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace fusedcomm::rdma::auth {

inline constexpr size_t kDigestBytes = 32;
inline constexpr size_t kShareBytes = 32;  // a rank's random contribution to the key
inline constexpr size_t kNonceBytes = 32;  // a handshake's fresh challenge
using Digest = std::array<uint8_t, kDigestBytes>;
using Key = Digest;
using Share = std::array<uint8_t, kShareBytes>;
using Nonce = std::array<uint8_t, kNonceBytes>;

// SHA-256, incremental (FIPS 180-4).
class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t bytes);
  Digest finish();  // the object is spent after it

 private:
  void block(const uint8_t* p);
  uint32_t h_[8];
  uint8_t buf_[64];
  size_t buffered_ = 0;
  uint64_t total_ = 0;  // bytes hashed
};

Digest sha256(const void* data, size_t bytes);

// HMAC-SHA-256, incremental (RFC 2104); keys longer than 64 bytes are hashed first.
class HmacSha256 {
 public:
  HmacSha256(const void* key, size_t key_bytes);
  void update(const void* data, size_t bytes);
  Digest finish();

 private:
  Sha256 inner_, outer_;
};

Digest hmac_sha256(const void* key, size_t key_bytes, const void* data, size_t bytes);

// Whether a[0, n) == b[0, n), in time that depends on n only.
bool equal(const void* a, const void* b, size_t n) noexcept;
// Fills out with bytes from the kernel's CSPRNG (getrandom). Throws TransportError if it fails.
void random_bytes(void* out, size_t bytes);
Nonce random_nonce();
Share random_share();
// Whether any byte of the key is nonzero (all zero: no key was given).
bool is_set(const Key& key) noexcept;

// The communicator key from the job token, the communicator id and every rank's share, by rank
// (see the top of this file). Every rank computes the same key from the same bootstrap.
Key derive_comm_key(uint64_t job_token, uint64_t comm_id, const std::vector<Share>& shares);

// What a handshake's proofs cover. Both sides build it from their own copy of the bootstrap
// (addresses) and the nonces exchanged; every field must agree for a proof to verify.
struct Transcript {
  uint32_t version = 0;                          // the transport api version both sides run
  uint64_t group_id = 0;                         // GroupSpec::comm_id
  int32_t world = 0;                             // group size
  int32_t dialer = -1;                           // the dialing rank
  int32_t acceptor = -1;                         // the accepting rank
  std::string dialer_address, acceptor_address;  // as published in the bootstrap
  Nonce dialer_nonce{}, acceptor_nonce{};
};

enum class Role : uint8_t { kAcceptor = 1, kDialer = 2 };

// HMAC-SHA-256(key, role label || encoded transcript).
Digest proof(const Key& key, Role role, const Transcript& t);
// Whether mac (kDigestBytes bytes) is proof(key, role, t), compared in constant time.
bool check_proof(const Key& key, Role role, const Transcript& t, const uint8_t* mac);

}  // namespace fusedcomm::rdma::auth
