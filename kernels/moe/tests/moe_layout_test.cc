// moe_layout_test (CPU only): the MoE dispatch's layout math (kernels/moe/detail/moe_layout.h)
// against the contract's row order (docs/ops.md: at each owner, rows by local expert, then
// source rank, token, slot). For random routings (several seeds; uniform, skewed, every pair to
// one expert, empty ranks, E < W, E not divisible by W, ids repeated within a token) it computes
// each pair's row the way the kernels do (chunks of moe_chunk_pairs pairs, per-chunk counts and
// exclusive prefixes, the pair's rank within its chunk, moe_send_base from the count matrix) and
// checks it against the row the contract gives, every row of every owner exactly once, and the
// owners' row counts. Also the chunk sizing (at most 256 chunks, at least 1024 pairs each), the
// low-latency kernel's chunking (kMoeLlCountWarps contiguous chunks, moe_ll_chunk_pairs) through
// the same checks, and fused_choice.h's choose_moe_low_latency at its bar.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "fusedcomm/runtime/split.h"
#include "kernels/common/fused_choice.h"
#include "kernels/moe/detail/moe_layout.h"
#include "support/check.h"

namespace {

namespace d = fusedcomm::kernels::detail;
using fusedcomm::testing::check;

// ll: the low-latency kernel's chunking instead of the count kernel's.
void run(int W, int E, int topk, const std::vector<int64_t>& T, int mode, uint64_t seed, bool ll = false) {
  std::mt19937_64 rng(seed);
  std::vector<std::vector<int32_t>> ids(W);
  for (int s = 0; s < W; ++s) {
    ids[s].resize(static_cast<size_t>(T[s] * topk));
    for (auto& id : ids[s]) {
      const uint64_t h = rng();
      id = static_cast<int32_t>(h % E);
      if (mode == 1 && (h >> 40) % 8 != 0) id = 0;
      if (mode == 2) id = E - 1;
    }
  }
  std::vector<int32_t> m(static_cast<size_t>(W) * E, 0);
  for (int s = 0; s < W; ++s)
    for (int32_t id : ids[s]) ++m[s * E + id];
  std::vector<int64_t> totals(E);
  for (int e = 0; e < E; ++e) totals[e] = d::moe_expert_total(m.data(), W, E, e);

  // The contract: owner p's rows in order.
  std::vector<std::vector<int64_t>> expect(W);  // row -> s << 40 | pair
  for (int p = 0; p < W; ++p) {
    const int64_t first = fusedcomm::split_offset(E, W, p);
    for (int64_t e = first; e < first + fusedcomm::split_count(E, W, p); ++e)
      for (int s = 0; s < W; ++s)
        for (int64_t j = 0; j < T[s] * topk; ++j)
          if (ids[s][j] == e) expect[p].push_back(int64_t(s) << 40 | j);
  }
  // The kernels' way, per sender.
  std::vector<std::vector<int64_t>> got(W);
  for (int p = 0; p < W; ++p) got[p].assign(expect[p].size(), -1);
  bool placed = true;
  for (int s = 0; s < W; ++s) {
    const int64_t pairs = T[s] * topk;
    const int64_t cp = ll ? d::moe_ll_chunk_pairs(pairs) : d::moe_chunk_pairs(pairs);
    const int64_t chunks = ll ? d::kMoeLlCountWarps : d::moe_chunks(pairs);
    if (!ll) {
      check(chunks <= 256 && cp >= 1024 && chunks * cp >= pairs, "chunk sizing for " + std::to_string(pairs));
    } else {
      check(chunks * cp >= pairs && chunks * cp < pairs + chunks,
            "low-latency chunking for " + std::to_string(pairs));
    }
    std::vector<int32_t> prefix(static_cast<size_t>(chunks) * E), pos(static_cast<size_t>(pairs));
    std::vector<int32_t> run(E, 0);
    for (int64_t c = 0; c < chunks; ++c) {
      std::vector<int32_t> hist(E, 0);
      for (int64_t j = c * cp; j < std::min(pairs, (c + 1) * cp); ++j) pos[j] = hist[ids[s][j]]++;
      for (int e = 0; e < E; ++e) {
        prefix[c * E + e] = run[e];
        run[e] += hist[e];
      }
    }
    for (int e = 0; e < E; ++e) placed &= run[e] == m[s * E + e];
    for (int64_t j = 0; j < pairs; ++j) {
      const int e = ids[s][j];
      const int p = d::split_owner(E, W, e);
      const int64_t row =
          d::moe_send_base(m.data(), totals.data(), W, E, s, e) + prefix[(j / cp) * E + e] + pos[j];
      if (row < 0 || row >= static_cast<int64_t>(got[p].size()) || got[p][row] != -1) {
        placed = false;
        continue;
      }
      got[p][row] = int64_t(s) << 40 | j;
    }
  }
  const std::string what = std::string(ll ? "low-latency " : "") + "W=" + std::to_string(W) +
                           " E=" + std::to_string(E) + " k=" + std::to_string(topk) + " mode " +
                           std::to_string(mode) + " seed " + std::to_string(seed);
  check(placed, what + ": every pair on a row of its own");
  check(got == expect, what + ": rows in the contract's order");
  for (int p = 0; p < W; ++p) {
    check(d::moe_owner_rows(totals.data(), W, E, p) == static_cast<int64_t>(expect[p].size()),
          what + ": rows of owner " + std::to_string(p));
  }
}

}  // namespace

// The fused dispatch's expert order (moe_for_send_order): every expert exactly once, every
// owner's i-th local expert before any owner's (i + 1)-th, the owners from r + 1 on each time.
void send_order(int W, int E, int r) {
  std::vector<int> order;
  d::moe_for_send_order(E, W, r, [&](int e) { order.push_back(e); });
  std::vector<int> sorted = order;
  std::sort(sorted.begin(), sorted.end());
  bool each_once = static_cast<int>(order.size()) == E;
  for (int e = 0; e < E && each_once; ++e) each_once = sorted[e] == e;
  bool ranked = true;
  int64_t prev_i = 0, prev_q = -1;
  for (int e : order) {
    const int o = d::split_owner(E, W, e);
    const int64_t i = e - d::split_offset(E, W, o), q = (o - r - 1 + 2 * W) % W;
    if (i < prev_i || (i == prev_i && q <= prev_q)) ranked = false;
    prev_i = i;
    prev_q = q;
  }
  const std::string what =
      "send order W=" + std::to_string(W) + " E=" + std::to_string(E) + " r=" + std::to_string(r);
  check(each_once, what + ": every expert once");
  check(ranked, what + ": by local index, then owner from r + 1");
}

int main() {
  for (int W : {1, 2, 3, 4, 8})
    for (int E : {1, 3, W, 2 * W + 1, 64, 257})
      for (int r = 0; r < W; ++r) send_order(W, E, r);
  for (uint64_t seed = 1; seed <= 4; ++seed) {
    for (int W : {1, 2, 3, 4, 8}) {
      std::vector<int64_t> T;
      for (int s = 0; s < W; ++s)
        T.push_back(s % 3 == 2 ? 0 : 100 + 37 * s + static_cast<int64_t>(seed) * 11);
      for (int E : {1, 3, W, 2 * W + 1, 64}) {
        for (int mode : {0, 1, 2})
          for (bool ll : {false, true})
            run(W, E, 1 + static_cast<int>(seed % 3) * 3, T, mode, seed * 977 + W * 31 + E, ll);
      }
    }
  }
  // Many chunks: one rank's 40,000 pairs.
  run(2, 16, 8, {5000, 3}, 0, 99);
  run(2, 16, 8, {5000, 3}, 0, 99, true);
  // The low-latency bar: capacity <= W x 256 x topk, forced modes kept (every input rank-uniform).
  namespace k = fusedcomm::kernels;
  check(k::choose_moe_low_latency(k::MoeMode::kAuto, 2, 2 * 256 * 8, 8),
        "low latency at W x 256 x topk rows");
  check(!k::choose_moe_low_latency(k::MoeMode::kAuto, 2, 2 * 256 * 8 + 1, 8),
        "normal above W x 256 x topk rows");
  check(k::choose_moe_low_latency(k::MoeMode::kLowLatency, 1, 1 << 30, 1),
        "a forced low-latency mode is kept");
  check(!k::choose_moe_low_latency(k::MoeMode::kNormal, 8, 1, 8), "a forced normal mode is kept");
  return fusedcomm::testing::report("moe_layout_test");
}
