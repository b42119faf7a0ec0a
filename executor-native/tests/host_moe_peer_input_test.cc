// host_moe_peer_input_test: moeDispatchGemm on rank 0 of 2 where rank 1 is played by a scripted
// Exchanger that delivers what the test crafts: row counts (negative, above the peer's tokens ×
// topk, near 2^62, for either rank or in all) and token counts (negative, past int32) that no
// buffer may be sized from, a receive bound other than rank 0's, and
// routed rows whose identity does not fit (a token the peer does not have, a slot past topk, a
// pair repeated or out of order). Each must fail with Error(kCommunicator) naming rank 1 before
// anything is sized from it (the rows exchange is never reached after bad counts); a receive
// total above the bound (maxRecvRows), at rank 0 or at rank 1, fails with Error(kInvalidArgument)
// naming the rank, its rows and the bound before any row moves; an honest script at the bound
// (tokens × topk rows) goes through and routes every row. Host code only.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "fusedcomm/host/host_ops.h"
#include "fusedcomm/runtime/errors.h"
#include "support/check.h"

namespace {

using namespace fusedcomm;
using fusedcomm::testing::check;

// The wire format of moe.cc's dispatch (its header comment), written out independently: the
// count block is {tokens, max_recv_rows, rows to rank 0, rows to rank 1}; the script's Counts
// gives the rows to rank 0 and the tokens.
struct Counts {
  int64_t rows, tokens;
};
struct CountBlock {
  int64_t tokens, max_recv_rows, rows_to[2];
};
struct Meta {
  int32_t token, slot, expert;
  float weight;
};

constexpr int kTopk = 2;
constexpr int64_t kTokens = 3, kHidden = 4, kFfn = 2, kExperts = 4;  // rank 0 owns experts 0, 1

// Rank 1 of a world of 2, as the script says: what it "sends" rank 0 at each step.
class ScriptedPeer final : public Exchanger {
 public:
  Counts counts{0, 0};
  int64_t bound = 0;         // the receive bound it announces
  int64_t rows_to_self = 0;  // the rows it routes to itself (rank 1)
  std::vector<Meta> meta;    // the routed rows' identities; their payload is zeros
  int rows_exchanges = 0;    // how often rank 0 got as far as exchanging rows
  uint64_t rows_block_bytes = 0;
  CountBlock sent{};  // what rank 0 announced

  int rank() const override { return 0; }
  int world() const override { return 2; }
  void exchange(const std::vector<SendBlock>& send, const std::vector<RecvBlock>& recv,
                const char* step) override {
    if (send[0].bytes > 0 && send[0].data != recv[0].data)
      std::memcpy(recv[0].data, send[0].data, send[0].bytes);
    const std::string s = step;
    if (s == "moeDispatch/counts") {
      if (recv[1].bytes != sizeof(CountBlock) || send[1].bytes != sizeof(CountBlock))
        fail(ErrorKind::kCommunicator, "script: counts block of odd size");
      std::memcpy(&sent, send[1].data, sizeof sent);
      const CountBlock block{counts.tokens, bound, {counts.rows, rows_to_self}};
      std::memcpy(recv[1].data, &block, sizeof block);
    } else if (s == "moeDispatch/rows") {
      ++rows_exchanges;
      rows_block_bytes = recv[1].bytes;
      const uint64_t want = meta.size() * (sizeof(Meta) + kHidden * sizeof(float));
      if (recv[1].bytes != want) {
        fail(ErrorKind::kCommunicator, "script: rows block of " + std::to_string(recv[1].bytes) + " bytes, " +
                                           std::to_string(want) + " scripted");
      }
      std::memset(recv[1].data, 0, recv[1].bytes);
      if (!meta.empty()) std::memcpy(recv[1].data, meta.data(), meta.size() * sizeof(Meta));
    } else {
      fail(ErrorKind::kCommunicator, "script: unexpected step " + s);
    }
  }
};

// Rank 0's own inputs: every token routed to experts 0 and 1 (its own), so it sends rank 1
// nothing.
struct Inputs {
  std::vector<float> x = std::vector<float>(kTokens * kHidden, 1.f);
  std::vector<int32_t> ids;
  std::vector<float> weights = std::vector<float>(kTokens * kTopk, 0.5f);
  std::vector<float> w1 = std::vector<float>(2 * kFfn * kHidden, 1.f);
  Inputs() {
    for (int64_t t = 0; t < kTokens; ++t) ids.insert(ids.end(), {0, 1});
  }
};

// Runs the dispatch against `peer`; returns the error message ("" if it succeeded).
std::string dispatch(ScriptedPeer& peer, host::MoeDispatchResult* result = nullptr, ErrorKind* kind = nullptr,
                     int64_t bound = 0) {
  Inputs in;
  try {
    host::MoeDispatchOptions options;
    options.max_recv_rows = bound;
    host::MoeDispatchResult r =
        host::moe_dispatch_gemm(peer, DType::kF32, in.x.data(), kTokens, kHidden, in.ids.data(),
                                in.weights.data(), kTopk, kExperts, in.w1.data(), kFfn, options);
    if (result != nullptr) *result = std::move(r);
    return "";
  } catch (const Error& e) {
    if (kind != nullptr) *kind = e.kind();
    return e.what();
  }
}

void expect_refused(ScriptedPeer& peer, const std::string& text, bool rows_reached, const std::string& what) {
  ErrorKind kind = ErrorKind::kInvalidArgument;
  const std::string message = dispatch(peer, nullptr, &kind);
  std::printf("  %s: %s\n", what.c_str(), message.c_str());
  check(!message.empty() && kind == ErrorKind::kCommunicator, what + ": " + message);
  check(message.find(text) != std::string::npos, what + ": message lacks '" + text + "': " + message);
  check(message.find("rank 1") != std::string::npos, what + ": rank 1 is not named: " + message);
  check(peer.rows_exchanges == (rows_reached ? 1 : 0),
        what + ": rows exchanged " + std::to_string(peer.rows_exchanges) + " times");
}

std::vector<Meta> honest_meta(int64_t tokens) {
  std::vector<Meta> m;
  for (int32_t t = 0; t < tokens; ++t)
    for (int32_t k = 0; k < kTopk; ++k) m.push_back({t, k, k, 0.25f});
  return m;
}

void counts() {
  const int64_t int32_max = std::numeric_limits<int32_t>::max();
  struct Case {
    const char* what;
    Counts c;
    const char* text;
  };
  const Case cases[] = {
      {"negative rows", {-5, 2}, "announced -5 rows for rank 0"},
      {"rows above tokens x topk", {5, 2}, "outside [0, 4]"},
      {"rows near 2^62", {int64_t{1} << 62, 2}, "outside [0, 4]"},
      {"rows at the most int32 tokens allow, plus one", {int32_max * kTopk + 1, int32_max}, "outside [0, "},
      {"negative tokens", {0, -1}, "announced -1 tokens"},
      {"tokens past int32", {4, int32_max + 1}, "tokens, outside [0, 2147483647]"},
      {"tokens at int64's end", {4, std::numeric_limits<int64_t>::max()}, "tokens, outside"},
  };
  for (const Case& c : cases) {
    ScriptedPeer peer;
    peer.counts = c.c;
    expect_refused(peer, c.text, false, c.what);
  }
  // Rows for rank 1 itself: each and in all at most its tokens × topk.
  ScriptedPeer self_rows;
  self_rows.counts = {0, 2};
  self_rows.rows_to_self = 5;
  expect_refused(self_rows, "announced 5 rows for rank 1", false, "rows for itself above tokens x topk");
  ScriptedPeer in_all;
  in_all.counts = {3, 2};
  in_all.rows_to_self = 3;
  expect_refused(in_all, ", in all)", false, "rows in all above tokens x topk");
}

// The receive bound: the same on every rank, and every rank's total within it, judged from the
// count blocks alone (no row moves when it fails).
void bound() {
  {  // rank 0 announces its own rows and its bound to rank 1
    ScriptedPeer peer;
    peer.counts = {0, 0};
    peer.bound = 64;
    check(dispatch(peer, nullptr, nullptr, 64).empty(), "bound 64: an honest dispatch");
    check(peer.sent.tokens == kTokens && peer.sent.max_recv_rows == 64 &&
              peer.sent.rows_to[0] == kTokens * kTopk && peer.sent.rows_to[1] == 0,
          "rank 0's count block: tokens, bound, rows to each rank");
  }
  struct Case {
    const char* what;
    int64_t peer_rows, peer_self_rows, bound, peer_bound;
    const char* text;
  };
  const Case cases[] = {
      // rank 0 receives its own 6 rows and the peer's 3: 9 > 8
      {"rank 0 over the bound", 3, 0, 8, 8, "rank 0 would receive 9 routed rows, more than maxRecvRows = 8"},
      // rank 0 receives its own 6 rows (within 6), rank 1 its own 8
      {"rank 1 over the bound", 0, 8, 6, 6, "rank 1 would receive 8 routed rows, more than maxRecvRows = 6"},
      {"bounds differ", 0, 0, 8, 9, "maxRecvRows differs between ranks (rank 0: 8, rank 1: 9)"},
  };
  for (const Case& c : cases) {
    ScriptedPeer peer;
    peer.counts = {c.peer_rows, 5};
    peer.rows_to_self = c.peer_self_rows;
    peer.bound = c.peer_bound;
    ErrorKind kind = ErrorKind::kCommunicator;
    const std::string message = dispatch(peer, nullptr, &kind, c.bound);
    std::printf("  %s: %s\n", c.what, message.c_str());
    check(kind == ErrorKind::kInvalidArgument, std::string(c.what) + ": not an invalid argument: " + message);
    check(message.find(c.text) != std::string::npos,
          std::string(c.what) + ": message lacks '" + c.text + "': " + message);
    check(peer.rows_exchanges == 0, std::string(c.what) + ": rows moved");
  }
}

void rows() {
  struct Case {
    const char* what;
    Meta bad;  // replaces the last honest row
    const char* text;
  };
  const Case cases[] = {
      {"token the peer does not have", {2, 1, 1, 0.25f}, "token 2 slot 1"},
      {"negative token", {-1, 1, 1, 0.25f}, "token -1 slot 1"},
      {"slot past topk", {1, 2, 1, 0.25f}, "token 1 slot 2"},
      {"pair repeated", {1, 0, 1, 0.25f}, "not a new (token, slot)"},
      {"expert not owned", {1, 1, 3, 0.25f}, "which it does not own"},
  };
  for (const Case& c : cases) {
    ScriptedPeer peer;
    peer.counts = {4, 2};
    peer.meta = honest_meta(2);
    peer.meta.back() = c.bad;
    expect_refused(peer, c.text, true, c.what);
  }
}

void honest_at_the_bound() {
  ScriptedPeer peer;
  peer.counts = {kTokens * kTopk, kTokens};  // every (token, slot) of rank 1 comes here
  peer.meta = honest_meta(kTokens);
  host::MoeDispatchResult r;
  const std::string message = dispatch(peer, &r);
  check(message.empty(), "honest script at the bound: " + message);
  // Rank 0's own 6 rows and rank 1's 6 rows, over its 2 experts.
  check(r.layout.rows() == 2 * kTokens * kTopk,
        "honest script: " + std::to_string(r.layout.rows()) + " rows");
  int from_peer = 0;
  for (int64_t i = 0; i < r.layout.rows(); ++i) from_peer += r.layout.src_rank[i] == 1;
  check(from_peer == kTokens * kTopk, "honest script: " + std::to_string(from_peer) + " rows from rank 1");
  check(peer.rows_block_bytes == kTokens * kTopk * (sizeof(Meta) + kHidden * sizeof(float)),
        "honest script: rows block sized from the counts");
}

}  // namespace

int main() {
  counts();
  bound();
  rows();
  honest_at_the_bound();
  return fusedcomm::testing::report("host_moe_peer_input_test");
}
