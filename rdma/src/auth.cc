// SHA-256, HMAC-SHA-256, the communicator key and the handshake proofs (auth.h).
#include "fusedcomm/rdma/auth.h"

#include <sys/random.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <system_error>

#include "fusedcomm/rdma/errors.h"

namespace fusedcomm::rdma::auth {
namespace {

constexpr uint32_t kRound[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

inline uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

inline uint32_t load_be32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

inline void store_be32(uint8_t* p, uint32_t v) {
  p[0] = static_cast<uint8_t>(v >> 24);
  p[1] = static_cast<uint8_t>(v >> 16);
  p[2] = static_cast<uint8_t>(v >> 8);
  p[3] = static_cast<uint8_t>(v);
}

// Little-endian fixed-width integers and length-prefixed strings: the encodings the key
// derivation and the transcript use, so that no two field sequences encode alike.
void put_u32(HmacSha256& h, uint32_t v) {
  uint8_t b[4];
  for (int i = 0; i < 4; ++i) b[i] = static_cast<uint8_t>(v >> (8 * i));
  h.update(b, sizeof b);
}

void put_u64(HmacSha256& h, uint64_t v) {
  uint8_t b[8];
  for (int i = 0; i < 8; ++i) b[i] = static_cast<uint8_t>(v >> (8 * i));
  h.update(b, sizeof b);
}

void put_string(HmacSha256& h, const std::string& s) {
  put_u32(h, static_cast<uint32_t>(s.size()));
  h.update(s.data(), s.size());
}

constexpr char kKeyLabel[] = "fusedcomm comm key v1";
constexpr char kAcceptorLabel[] = "fusedcomm handshake v1 acceptor";
constexpr char kDialerLabel[] = "fusedcomm handshake v1 dialer";

}  // namespace

Sha256::Sha256()
    : h_{0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19} {}

void Sha256::block(const uint8_t* p) {
  uint32_t w[64];
  for (int i = 0; i < 16; ++i) w[i] = load_be32(p + 4 * i);
  for (int i = 16; i < 64; ++i) {
    const uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
    const uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
    w[i] = w[i - 16] + s0 + w[i - 7] + s1;
  }
  uint32_t a = h_[0], b = h_[1], c = h_[2], d = h_[3], e = h_[4], f = h_[5], g = h_[6], h = h_[7];
  for (int i = 0; i < 64; ++i) {
    const uint32_t s1 = rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25);
    const uint32_t ch = (e & f) ^ (~e & g);
    const uint32_t t1 = h + s1 + ch + kRound[i] + w[i];
    const uint32_t s0 = rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22);
    const uint32_t maj = (a & b) ^ (a & c) ^ (b & c);
    const uint32_t t2 = s0 + maj;
    h = g;
    g = f;
    f = e;
    e = d + t1;
    d = c;
    c = b;
    b = a;
    a = t1 + t2;
  }
  h_[0] += a;
  h_[1] += b;
  h_[2] += c;
  h_[3] += d;
  h_[4] += e;
  h_[5] += f;
  h_[6] += g;
  h_[7] += h;
}

void Sha256::update(const void* data, size_t bytes) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  total_ += bytes;
  if (buffered_ > 0) {
    const size_t take = std::min(bytes, sizeof buf_ - buffered_);
    std::memcpy(buf_ + buffered_, p, take);
    buffered_ += take;
    p += take;
    bytes -= take;
    if (buffered_ < sizeof buf_) return;
    block(buf_);
    buffered_ = 0;
  }
  for (; bytes >= 64; p += 64, bytes -= 64) block(p);
  if (bytes > 0) {
    std::memcpy(buf_, p, bytes);
    buffered_ = bytes;
  }
}

Digest Sha256::finish() {
  const uint64_t bits = total_ * 8;
  const uint8_t one = 0x80;
  update(&one, 1);
  const uint8_t zero[64] = {};
  update(zero, (buffered_ <= 56 ? 56 : 120) - buffered_);
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(bits >> (56 - 8 * i));
  update(len, sizeof len);
  Digest out;
  for (int i = 0; i < 8; ++i) store_be32(out.data() + 4 * i, h_[i]);
  return out;
}

Digest sha256(const void* data, size_t bytes) {
  Sha256 s;
  s.update(data, bytes);
  return s.finish();
}

HmacSha256::HmacSha256(const void* key, size_t key_bytes) {
  uint8_t k[64] = {};
  if (key_bytes > sizeof k) {
    const Digest d = sha256(key, key_bytes);
    std::memcpy(k, d.data(), d.size());
  } else if (key_bytes > 0) {
    std::memcpy(k, key, key_bytes);
  }
  uint8_t pad[64];
  for (size_t i = 0; i < sizeof pad; ++i) pad[i] = k[i] ^ 0x36;
  inner_.update(pad, sizeof pad);
  for (size_t i = 0; i < sizeof pad; ++i) pad[i] = k[i] ^ 0x5c;
  outer_.update(pad, sizeof pad);
}

void HmacSha256::update(const void* data, size_t bytes) { inner_.update(data, bytes); }

Digest HmacSha256::finish() {
  const Digest inner = inner_.finish();
  outer_.update(inner.data(), inner.size());
  return outer_.finish();
}

Digest hmac_sha256(const void* key, size_t key_bytes, const void* data, size_t bytes) {
  HmacSha256 h(key, key_bytes);
  h.update(data, bytes);
  return h.finish();
}

bool equal(const void* a, const void* b, size_t n) noexcept {
  const volatile uint8_t* x = static_cast<const volatile uint8_t*>(a);
  const volatile uint8_t* y = static_cast<const volatile uint8_t*>(b);
  uint8_t diff = 0;
  for (size_t i = 0; i < n; ++i) diff |= static_cast<uint8_t>(x[i] ^ y[i]);
  return diff == 0;
}

void random_bytes(void* out, size_t bytes) {
  uint8_t* p = static_cast<uint8_t*>(out);
  while (bytes > 0) {
    const ssize_t r = getrandom(p, bytes, 0);
    if (r < 0) {
      if (errno == EINTR) continue;
      throw TransportError(-1, "cannot draw random bytes (getrandom): " +
                                   std::error_code(errno, std::generic_category()).message());
    }
    p += r;
    bytes -= static_cast<size_t>(r);
  }
}

Nonce random_nonce() {
  Nonce n;
  random_bytes(n.data(), n.size());
  return n;
}

Share random_share() {
  Share s;
  random_bytes(s.data(), s.size());
  return s;
}

bool is_set(const Key& key) noexcept {
  uint8_t any = 0;
  for (uint8_t b : key) any |= b;
  return any != 0;
}

Key derive_comm_key(uint64_t job_token, uint64_t comm_id, const std::vector<Share>& shares) {
  uint8_t salt[8];
  for (int i = 0; i < 8; ++i) salt[i] = static_cast<uint8_t>(job_token >> (8 * i));
  HmacSha256 h(salt, sizeof salt);
  h.update(kKeyLabel, sizeof kKeyLabel - 1);
  put_u64(h, comm_id);
  put_u32(h, static_cast<uint32_t>(shares.size()));
  for (const Share& s : shares) h.update(s.data(), s.size());
  return h.finish();
}

Digest proof(const Key& key, Role role, const Transcript& t) {
  HmacSha256 h(key.data(), key.size());
  if (role == Role::kAcceptor) {
    h.update(kAcceptorLabel, sizeof kAcceptorLabel - 1);
  } else {
    h.update(kDialerLabel, sizeof kDialerLabel - 1);
  }
  put_u32(h, t.version);
  put_u64(h, t.group_id);
  put_u32(h, static_cast<uint32_t>(t.world));
  put_u32(h, static_cast<uint32_t>(t.dialer));
  put_u32(h, static_cast<uint32_t>(t.acceptor));
  put_string(h, t.dialer_address);
  put_string(h, t.acceptor_address);
  h.update(t.dialer_nonce.data(), t.dialer_nonce.size());
  h.update(t.acceptor_nonce.data(), t.acceptor_nonce.size());
  return h.finish();
}

bool check_proof(const Key& key, Role role, const Transcript& t, const uint8_t* mac) {
  const Digest want = proof(key, role, t);
  return equal(want.data(), mac, want.size());
}

}  // namespace fusedcomm::rdma::auth
