// A fuzzer for the socket backend's parsers of untrusted bytes: the handshake's checks on both
// sides (socket/handshake.h) and the data header's check against the registry (check_header).
// Each input is one message; its first byte picks the target. For every input the verdicts
// are compared with an independent statement of the rules (never crash, never accept a proof
// that is not the key's, never index outside the group, never let a header reach outside its
// region), so a wrong "yes" fails as surely as a crash.
//
// ctest runs a seeded loop of a fixed number of inputs (random bytes, and valid messages with
// random mutations at field boundaries); built with clang and -DFUSEDCOMM_FUZZ=ON, the same
// target runs under libFuzzer as handshake_fuzzer.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "../socket/core.h"
#include "../socket/handshake.h"
#include "../socket/wire.h"
#include "fusedcomm/rdma/auth.h"

namespace {

using namespace fusedcomm::rdma;
namespace hs = socket_backend::handshake;
constexpr size_t kMsg = sizeof(wire::WireHandshake);

[[noreturn]] void violated(const char* rule) {
  std::fprintf(stderr, "fuzz: rule violated: %s\n", rule);
  std::abort();
}
#define RULE(cond) \
  if (!(cond)) violated(#cond)

// The fixed world the fuzzer's messages meet: 4 ranks, this side rank 1.
struct World {
  auth::Key key =
      auth::derive_comm_key(0x600D, 0x77, {auth::Share{1}, auth::Share{2}, auth::Share{3}, auth::Share{4}});
  std::vector<std::string> addresses = {"10.0.0.1:7000", "10.0.0.2:7000", "10.0.0.3:7000", "10.0.0.4:7000"};
  hs::Side acceptor{&key, 0x77, 1, 4, &addresses};
  hs::Side dialer{&key, 0x77, 3, 4, &addresses};
  // What rank 3 sent to rank 1, and rank 1's challenge to it.
  wire::WireHandshake hello = hs::hello(dialer, 1, auth::Nonce{9});
  wire::WireHandshake challenge = hs::challenge(hello, acceptor, auth::Nonce{5});
  wire::WireHandshake proof = hs::proof(hello, challenge, dialer);
  std::unordered_map<uint64_t, Region> regions;
  World() {
    // Fake bases: check_header never touches the memory. One unaligned, one near the top of
    // the address space, one huge.
    regions[0x10] = Region{reinterpret_cast<void*>(0x100000), 4096, 0x10};
    regions[0x11] = Region{reinterpret_cast<void*>(0x200004), 64, 0x11};
    regions[0x12] = Region{reinterpret_cast<void*>(~uintptr_t{0} - 0xfff), 0x1000, 0x12};
    regions[0x13] = Region{reinterpret_cast<void*>(0x1000), ~uint64_t{0} >> 1, 0x13};
  }
};
const World& world() {
  static const World w;
  return w;
}

// Inputs that reached each target's deepest check and passed it: the loop must cover the yes
// paths as well as the no paths.
uint64_t g_passed[5] = {};

bool same_mac(const uint8_t* mac, const auth::Digest& want) {
  return std::memcmp(mac, want.data(), want.size()) == 0;
}

void acceptor_hello(const wire::WireHandshake& m) {
  const World& w = world();
  const hs::Check first = hs::check_hello(m);
  if (first.verdict == hs::Verdict::kDrop) {
    RULE(m.magic != wire::kHelloMagic || m.kind != wire::kHello);
    return;
  }
  RULE(m.magic == wire::kHelloMagic && m.kind == wire::kHello);
  if (first.verdict != hs::Verdict::kOk) {
    RULE(first.verdict == hs::Verdict::kReject && first.reason != wire::kNoReason);
    return;
  }
  const hs::Check group = hs::check_hello_for(m, w.acceptor);
  if (group.verdict != hs::Verdict::kOk) {
    RULE(group.verdict == hs::Verdict::kReject);
    return;
  }
  // Passing both means the transcript can index the group's addresses.
  RULE(m.world == w.acceptor.world && m.target_rank == w.acceptor.rank && m.rank > m.target_rank &&
       m.rank < m.world);
  const wire::WireHandshake c = hs::challenge(m, w.acceptor, auth::Nonce{});
  RULE(c.kind == wire::kChallenge && c.target_rank == m.rank);
  g_passed[0]++;
}

void acceptor_proof(const wire::WireHandshake& m) {
  const World& w = world();
  const hs::Check check = hs::check_proof(m, w.hello, w.challenge, w.acceptor);
  const bool genuine =
      m.magic == wire::kHelloMagic && m.kind == wire::kProof && m.version == w.proof.version &&
      m.comm_id == w.proof.comm_id && m.rank == w.proof.rank && m.world == w.proof.world &&
      m.target_rank == w.proof.target_rank &&
      same_mac(m.mac,
               auth::proof(w.key, auth::Role::kDialer, hs::transcript(w.hello, w.challenge, w.addresses)));
  RULE((check.verdict == hs::Verdict::kOk) == genuine);
  g_passed[1] += genuine;
  if (m.magic != wire::kHelloMagic || m.kind != wire::kProof) RULE(check.verdict == hs::Verdict::kDrop);
}

void dialer_challenge(const wire::WireHandshake& m) {
  const World& w = world();
  const hs::Check check = hs::check_challenge(m, w.hello, 1, w.dialer);
  if (check.verdict == hs::Verdict::kOk) {
    RULE(m.magic == wire::kHelloMagic && m.kind == wire::kChallenge && m.rank == 1 && m.target_rank == 3 &&
         m.world == 4 && m.comm_id == 0x77);
    RULE(same_mac(m.mac, auth::proof(w.key, auth::Role::kAcceptor, hs::transcript(w.hello, m, w.addresses))));
    g_passed[2]++;
  }
  if (m.magic == wire::kHelloMagic && m.kind == wire::kReject) {
    RULE(check.verdict == (m.reason == wire::kNotReady ? hs::Verdict::kRetry : hs::Verdict::kFail));
  }
}

void dialer_accept(const wire::WireHandshake& m) {
  const hs::Check check = hs::check_accept(m, 1, world().dialer);
  if (check.verdict == hs::Verdict::kOk) {
    RULE(m.magic == wire::kHelloMagic && m.kind == wire::kAccept && m.rank == 1 && m.target_rank == 3);
    g_passed[3]++;
  }
}

void data_header(const uint8_t* data, size_t n) {
  wire::WireHeader h{};
  std::memcpy(&h, data, std::min(n, sizeof h));
  std::string why;
  const bool ok = socket_backend::check_header(h, world().regions, &why);
  RULE(ok || !why.empty());
  if (!ok) return;
  g_passed[4]++;
  if (h.bytes) {
    auto it = world().regions.find(h.dst_key);
    RULE(it != world().regions.end());
    RULE(static_cast<unsigned __int128>(h.dst_offset) + h.bytes <= it->second.bytes);
  }
  if (h.signal_key) {
    auto it = world().regions.find(h.signal_key);
    RULE(it != world().regions.end());
    RULE(static_cast<unsigned __int128>(h.signal_offset) + 8 <= it->second.bytes);
    RULE((reinterpret_cast<uintptr_t>(it->second.base) + h.signal_offset) % 8 == 0);
  }
}

}  // namespace

// One input: byte 0 picks the target; the rest is the message (any length).
extern "C" int fc_fuzz_one(const uint8_t* data, size_t n) {
  if (n == 0) return 0;
  const uint8_t target = data[0] % 5;
  ++data;
  --n;
  if (target == 4) {
    data_header(data, n);
    return 0;
  }
  wire::WireHandshake m{};
  if (!hs::parse(data, n, &m)) {
    RULE(n != kMsg);
    return 0;
  }
  switch (target) {
    case 0: acceptor_hello(m); break;
    case 1: acceptor_proof(m); break;
    case 2: dialer_challenge(m); break;
    case 3: dialer_accept(m); break;
  }
  return 0;
}

#ifdef FC_LIBFUZZER
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t n) { return fc_fuzz_one(data, n); }
#else

namespace {

// A valid message for `target`, as the other side would send it (or a plausible header).
std::vector<uint8_t> seed_message(uint8_t target, std::mt19937_64& rng) {
  const World& w = world();
  wire::WireHandshake m{};
  switch (target) {
    case 0: m = w.hello; break;
    case 1: m = w.proof; break;
    case 2: m = w.challenge; break;
    case 3: m = hs::accept(w.hello, w.acceptor); break;
    default: {
      wire::WireHeader h{};
      h.magic = wire::kDataMagic;
      h.kind = wire::kData;
      const uint64_t keys[] = {0x10, 0x11, 0x12, 0x13, 0x99};
      h.dst_key = keys[rng() % 5];
      h.dst_offset = rng() % 8192;
      h.bytes = rng() % 8192;
      h.signal_key = keys[rng() % 5];
      h.signal_offset = (rng() % 8192) & ~(rng() % 2 ? uint64_t{7} : uint64_t{0});
      std::vector<uint8_t> out(1 + sizeof h, target);
      std::memcpy(out.data() + 1, &h, sizeof h);
      return out;
    }
  }
  std::vector<uint8_t> out(1 + kMsg, target);
  std::memcpy(out.data() + 1, &m, kMsg);
  return out;
}

// Values that break integer checks: ends of ranges, signs, near-wraps.
uint64_t interesting(std::mt19937_64& rng) {
  const uint64_t v[] = {0,
                        1,
                        2,
                        3,
                        4,
                        7,
                        8,
                        0x7f,
                        0xff,
                        0x7fffffff,
                        0x80000000,
                        0xffffffff,
                        ~uint64_t{0},
                        ~uint64_t{0} - 7,
                        uint64_t{1} << 63,
                        4096,
                        4088,
                        4089};
  return v[rng() % (sizeof v / sizeof v[0])];
}

void mutate(std::vector<uint8_t>& b, std::mt19937_64& rng) {
  const int edits = 1 + static_cast<int>(rng() % 4);
  for (int e = 0; e < edits && b.size() > 1; ++e) {
    const size_t at = 1 + rng() % (b.size() - 1);
    switch (rng() % 5) {
      case 0: b[at] ^= static_cast<uint8_t>(1u << (rng() % 8)); break;  // a bit
      case 1: b[at] = static_cast<uint8_t>(rng()); break;               // a byte
      case 2: {                                                         // a field, 4 or 8 bytes
        const size_t width = rng() % 2 ? 4 : 8;
        const size_t field = 1 + ((at - 1) / width) * width;
        const uint64_t v = interesting(rng);
        for (size_t i = 0; i < width && field + i < b.size(); ++i)
          b[field + i] = static_cast<uint8_t>(v >> (8 * i));
        break;
      }
      case 3: b.resize(1 + rng() % (b.size() + 8)); break;  // truncated or extended
      default: b[0] = static_cast<uint8_t>(rng()); break;   // another target's parser
    }
  }
}

}  // namespace

// fc_fuzz_one on `iterations` inputs from `seed` (defaults: 2000000, 1); prints what it ran.
int main(int argc, char** argv) {
  const uint64_t iterations = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 2000000;
  const uint64_t seed = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 1;
  std::mt19937_64 rng(seed);
  uint64_t valid_ok = 0;
  // The unmutated messages must pass: the fuzzer checks the yes path too.
  for (uint8_t t = 0; t < 4; ++t) {
    std::vector<uint8_t> b = seed_message(t, rng);
    fc_fuzz_one(b.data(), b.size());
    wire::WireHandshake m{};
    std::memcpy(&m, b.data() + 1, kMsg);
    const World& w = world();
    const bool ok = t == 0 ? hs::check_hello_for(m, w.acceptor).verdict == hs::Verdict::kOk
                    : t == 1
                        ? hs::check_proof(m, w.hello, w.challenge, w.acceptor).verdict == hs::Verdict::kOk
                    : t == 2 ? hs::check_challenge(m, w.hello, 1, w.dialer).verdict == hs::Verdict::kOk
                             : hs::check_accept(m, 1, w.dialer).verdict == hs::Verdict::kOk;
    if (!ok) {
      std::fprintf(stderr, "fuzz: the genuine message of target %d is refused\n", t);
      return 1;
    }
    valid_ok++;
  }
  for (uint64_t i = 0; i < iterations; ++i) {
    std::vector<uint8_t> b;
    if (i % 4 == 0) {
      b.resize(rng() % (2 * kMsg + 2));
      for (auto& x : b) x = static_cast<uint8_t>(rng());
    } else {
      b = seed_message(static_cast<uint8_t>(rng() % 5), rng);
      mutate(b, rng);
    }
    fc_fuzz_one(b.data(), b.size());
  }
  std::printf(
      "handshake and header parsers: %llu inputs from seed %llu, %llu genuine messages accepted, no rule"
      " violated\n",
      static_cast<unsigned long long>(iterations), static_cast<unsigned long long>(seed),
      static_cast<unsigned long long>(valid_ok));
  const char* names[5] = {"hello (acceptor)", "proof (acceptor)", "challenge (dialer)", "accept (dialer)",
                          "data header"};
  bool covered = true;
  for (int t = 0; t < 5; ++t) {
    std::printf("  %-20s %llu inputs passed every check\n", names[t],
                static_cast<unsigned long long>(g_passed[t]));
    covered = covered && g_passed[t] > 0;
  }
  if (!covered) {
    std::fprintf(stderr, "fuzz: a target's yes path was never reached\n");
    return 1;
  }
  return 0;
}
#endif
