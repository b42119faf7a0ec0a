// rdma/auth.h: SHA-256 (FIPS 180-4 vectors), HMAC-SHA-256 (all RFC 4231 vectors), the
// constant-time compare, the communicator key and the handshake proofs.
#include "fusedcomm/rdma/auth.h"

#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "test_util.h"

using namespace fusedcomm::rdma;

namespace {

std::string hex(const uint8_t* p, size_t n) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    s += digits[p[i] >> 4];
    s += digits[p[i] & 15];
  }
  return s;
}
std::string hex(const auth::Digest& d) { return hex(d.data(), d.size()); }

std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }
std::vector<uint8_t> repeat(uint8_t b, size_t n) { return std::vector<uint8_t>(n, b); }

void test_sha256_vectors() {
  struct V {
    std::string msg, digest;
  };
  const V vs[] = {
      {"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
      {"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
      {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
       "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
  };
  for (const V& v : vs) {
    FC_CHECK(hex(auth::sha256(v.msg.data(), v.msg.size())) == v.digest, "SHA-256(\"" + v.msg + "\")");
  }
  // One million 'a', fed in uneven pieces: the incremental path crosses block edges everywhere.
  auth::Sha256 s;
  const std::string a(1000, 'a');
  size_t fed = 0;
  for (size_t piece = 1; fed < 1000000; piece = piece % 997 + 1) {
    const size_t n = std::min(piece, 1000000 - fed);
    s.update(a.data(), n);
    fed += n;
  }
  FC_CHECK(hex(s.finish()) == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0",
           "SHA-256 of a million 'a'");
  // Lengths around the padding edge (55, 56, 63, 64 bytes) agree whether fed whole or bytewise.
  for (size_t n : {55, 56, 57, 63, 64, 65, 119, 120, 128}) {
    std::vector<uint8_t> m(n);
    for (size_t i = 0; i < n; ++i) m[i] = static_cast<uint8_t>(i * 7 + 1);
    auth::Sha256 byte_wise;
    for (uint8_t b : m) byte_wise.update(&b, 1);
    FC_CHECK(byte_wise.finish() == auth::sha256(m.data(), m.size()),
             "bytewise = whole at " + std::to_string(n));
  }
}

void test_hmac_rfc4231() {
  struct V {
    std::vector<uint8_t> key, data;
    std::string mac;
    size_t truncate = 32;
  };
  std::vector<uint8_t> key4(25);
  for (size_t i = 0; i < key4.size(); ++i) key4[i] = static_cast<uint8_t>(i + 1);
  const V vs[] = {
      {repeat(0x0b, 20), bytes("Hi There"),
       "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"},
      {bytes("Jefe"), bytes("what do ya want for nothing?"),
       "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"},
      {repeat(0xaa, 20), repeat(0xdd, 50),
       "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe"},
      {key4, repeat(0xcd, 50), "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b"},
      {repeat(0x0c, 20), bytes("Test With Truncation"), "a3b6167473100ee06e0c796c2955552b", 16},
      {repeat(0xaa, 131), bytes("Test Using Larger Than Block-Size Key - Hash Key First"),
       "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"},
      {repeat(0xaa, 131),
       bytes("This is a test using a larger than block-size key and a larger than block-size data. The key "
             "needs to be hashed before being used by the HMAC algorithm."),
       "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2"},
  };
  int i = 1;
  for (const V& v : vs) {
    const auth::Digest d = auth::hmac_sha256(v.key.data(), v.key.size(), v.data.data(), v.data.size());
    FC_CHECK(hex(d.data(), v.truncate) == v.mac, "RFC 4231 test case " + std::to_string(i));
    auth::HmacSha256 pieces(v.key.data(), v.key.size());
    for (size_t off = 0; off < v.data.size(); off += 3)
      pieces.update(v.data.data() + off, std::min<size_t>(3, v.data.size() - off));
    FC_CHECK(pieces.finish() == d, "incremental HMAC, test case " + std::to_string(i));
    ++i;
  }
}

void test_equal_and_random() {
  uint8_t a[32], b[32];
  auth::random_bytes(a, sizeof a);
  std::memcpy(b, a, sizeof b);
  FC_CHECK(auth::equal(a, b, sizeof a), "equal buffers");
  for (size_t i = 0; i < sizeof a; ++i) {
    b[i] ^= 0x40;
    FC_CHECK(!auth::equal(a, b, sizeof a), "a difference at byte " + std::to_string(i));
    b[i] ^= 0x40;
  }
  FC_CHECK(auth::equal(a, b, 0), "empty ranges are equal");
  std::set<std::string> seen;
  for (int i = 0; i < 64; ++i) seen.insert(hex(auth::random_nonce()));
  FC_CHECK(seen.size() == 64, "random nonces differ");
  FC_CHECK(!auth::is_set(auth::Key{}) && auth::is_set(auth::derive_comm_key(0, 0, {})), "is_set");
}

void test_comm_key() {
  std::vector<auth::Share> shares(3);
  for (auto& s : shares) s = auth::random_share();
  const auth::Key k = auth::derive_comm_key(0x5eed, 7, shares);
  FC_CHECK(k == auth::derive_comm_key(0x5eed, 7, shares), "deterministic");
  FC_CHECK(k != auth::derive_comm_key(0x5eee, 7, shares), "depends on the token");
  FC_CHECK(k != auth::derive_comm_key(0x5eed, 8, shares), "depends on the comm id");
  FC_CHECK(k != auth::derive_comm_key(0x5eed, 7, {shares[0], shares[1]}), "depends on the world");
  FC_CHECK(k != auth::derive_comm_key(0x5eed, 7, {}), "the token alone does not give it");
  auto swapped = shares;
  std::swap(swapped[0], swapped[2]);
  FC_CHECK(k != auth::derive_comm_key(0x5eed, 7, swapped), "depends on the shares' order");
  for (size_t r = 0; r < shares.size(); ++r) {
    auto changed = shares;
    changed[r][5] ^= 1;
    FC_CHECK(k != auth::derive_comm_key(0x5eed, 7, changed), "depends on share " + std::to_string(r));
  }
  // The construction is the documented one (auth.h), so other bindings can compute it.
  std::vector<uint8_t> msg = bytes("fusedcomm comm key v1");
  for (int i = 0; i < 8; ++i) msg.push_back(static_cast<uint8_t>(uint64_t{7} >> (8 * i)));
  for (int i = 0; i < 4; ++i) msg.push_back(static_cast<uint8_t>(uint32_t{3} >> (8 * i)));
  for (const auto& s : shares) msg.insert(msg.end(), s.begin(), s.end());
  const uint8_t salt[8] = {0xed, 0x5e, 0, 0, 0, 0, 0, 0};
  FC_CHECK(k == auth::hmac_sha256(salt, sizeof salt, msg.data(), msg.size()),
           "HMAC(token, label || id || W || shares)");
}

void test_proofs() {
  const auth::Key key = auth::derive_comm_key(1, 2, {auth::random_share(), auth::random_share()});
  auth::Transcript t;
  t.version = 2;
  t.group_id = 2;
  t.world = 2;
  t.dialer = 1;
  t.acceptor = 0;
  t.dialer_address = "10.0.0.2:4000";
  t.acceptor_address = "10.0.0.1:4000";
  t.dialer_nonce = auth::random_nonce();
  t.acceptor_nonce = auth::random_nonce();
  const auth::Digest acc = auth::proof(key, auth::Role::kAcceptor, t);
  const auth::Digest dia = auth::proof(key, auth::Role::kDialer, t);
  FC_CHECK(acc != dia, "the roles' proofs differ (no reflection)");
  FC_CHECK(auth::check_proof(key, auth::Role::kAcceptor, t, acc.data()), "acceptor proof verifies");
  FC_CHECK(!auth::check_proof(key, auth::Role::kDialer, t, acc.data()), "not as the dialer's");
  auth::Key other = key;
  other[0] ^= 1;
  FC_CHECK(!auth::check_proof(other, auth::Role::kAcceptor, t, acc.data()), "another key fails");
  // Every transcript field is covered.
  auto changed = [&](auto mutate, const char* what) {
    auth::Transcript u = t;
    mutate(u);
    FC_CHECK(!auth::check_proof(key, auth::Role::kDialer, u, dia.data()), std::string("covers ") + what);
  };
  changed([](auth::Transcript& u) { u.version++; }, "the version");
  changed([](auth::Transcript& u) { u.group_id++; }, "the group id");
  changed([](auth::Transcript& u) { u.world++; }, "the world");
  changed([](auth::Transcript& u) { u.dialer = 2; }, "the dialer");
  changed([](auth::Transcript& u) { u.acceptor = 1; }, "the acceptor");
  changed([](auth::Transcript& u) { u.dialer_address += "1"; }, "the dialer's address");
  changed([](auth::Transcript& u) { u.acceptor_address = "10.0.0.1:4001"; }, "the acceptor's address");
  changed([](auth::Transcript& u) { u.dialer_nonce[31] ^= 1; }, "the dialer's nonce");
  changed([](auth::Transcript& u) { u.acceptor_nonce[0] ^= 1; }, "the acceptor's nonce");
  // Length-prefixed strings: moving a byte between the addresses changes the proof.
  changed(
      [](auth::Transcript& u) {
        u.dialer_address = "10.0.0.2:400";
        u.acceptor_address = "010.0.0.1:4000";
      },
      "where one address ends");
}

}  // namespace

int main() {
  fctest::run_case("SHA-256: FIPS 180-4 vectors, incremental", test_sha256_vectors);
  fctest::run_case("HMAC-SHA-256: RFC 4231 test cases 1-7", test_hmac_rfc4231);
  fctest::run_case("constant-time compare, random nonces", test_equal_and_random);
  fctest::run_case("communicator key: inputs and construction", test_comm_key);
  fctest::run_case("handshake proofs: roles, keys, every transcript field", test_proofs);
  return fctest::finish();
}
