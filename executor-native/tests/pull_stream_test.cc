// allGatherGemm's pull stream (kernels/include/fusedcomm/kernels/detail/pull_stream.h) on the
// CPU, against a simulated bulk-copy engine that moves real bytes and enforces the engine
// contract: a load lands only when waited, a store group reads its stage and writes its
// destination only when a wait covers it (or, in the second mode, at random earlier points), a
// stage reloaded before its store read it or a piece stored before its load landed is a
// failure, and publish(item) checks that every byte of the item is at its destination. Random
// item sequences (empty items, items below one piece, items of many pieces, flushes between
// items), then the whole destination against the source.
#include "fusedcomm/kernels/detail/pull_stream.h"

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <random>
#include <string>
#include <vector>

#include "check.h"

namespace {

using fusedcomm::testing::check;

constexpr int kStages = 6;
constexpr uint32_t kPiece = 256;  // small pieces: many per item, the same logic as 32 KiB

struct Range {
  int64_t off, bytes;
};

struct SimEngine {
  struct Stage {
    const uint8_t* src = nullptr;  // load in flight (not yet landed)
    uint32_t n = 0;
    bool loaded = false;  // landed, not yet handed to a store
    int group = -1;       // the latest store group that reads this stage
    std::vector<uint8_t> bytes = std::vector<uint8_t>(kPiece);
  };
  struct Group {
    int stage;
    uint8_t* dst;
    uint32_t n;
    bool read = false, done = false;
    std::vector<uint8_t> data;
  };

  uint8_t* dst_base;
  const uint8_t* src_base;
  const std::vector<std::vector<Range>>* items;  // item -> its destination ranges
  std::vector<int> published;                    // per item: times published
  Stage stages[kStages];
  std::vector<Group> groups;
  std::mt19937_64 rng;
  bool early;  // groups may also complete at random points before any wait covers them
  int in_flight = 0, max_in_flight = 0;
  std::string where;

  void read_group(Group& g) {
    if (g.read) return;
    g.data.assign(stages[g.stage].bytes.begin(), stages[g.stage].bytes.begin() + g.n);
    g.read = true;
  }
  void finish_group(Group& g) {
    read_group(g);
    if (g.done) return;
    std::memcpy(g.dst, g.data.data(), g.n);
    g.done = true;
  }
  void maybe_progress() {
    if (!early || groups.empty()) return;
    std::uniform_int_distribution<size_t> pick(0, groups.size() - 1);
    for (int i = 0; i < 2; ++i) {
      Group& g = groups[pick(rng)];
      if (rng() % 2) {
        read_group(g);
      } else {
        finish_group(g);
      }
    }
  }

  void load(int st, const uint8_t* src, uint32_t n) {
    Stage& s = stages[st];
    check(s.src == nullptr && !s.loaded, where + ": stage loaded again before its piece was stored");
    check(s.group < 0 || groups[s.group].read,
          where + ": stage loaded again before its store read it");
    check(n > 0 && n <= kPiece && n % 16 == 0, where + ": piece size");
    s.src = src;
    s.n = n;
    max_in_flight = std::max(max_in_flight, ++in_flight);
    maybe_progress();
  }
  void wait_loaded(int st) {
    Stage& s = stages[st];
    check(s.src != nullptr, where + ": waited for a stage with no load in flight");
    if (s.src != nullptr) std::memcpy(s.bytes.data(), s.src, s.n);
    s.src = nullptr;
    s.loaded = true;
    --in_flight;
    maybe_progress();
  }
  void store(int st, uint8_t* dst, uint32_t n) {
    Stage& s = stages[st];
    check(s.loaded, where + ": piece stored before its load landed");
    check(n == s.n, where + ": store size differs from the load's");
    s.loaded = false;
    s.group = static_cast<int>(groups.size());
    groups.push_back(Group{st, dst, n, false, false, {}});
    maybe_progress();
  }
  template <int N>
  void wait_read() {
    for (size_t g = 0; g + N < groups.size(); ++g) read_group(groups[g]);
  }
  template <int N>
  void wait_done() {
    for (size_t g = 0; g + N < groups.size(); ++g) finish_group(groups[g]);
  }
  void publish(int item) {
    check(item >= 0 && item < static_cast<int>(items->size()), where + ": unknown item");
    if (item < 0 || item >= static_cast<int>(items->size())) return;
    check(++published[item] == 1, where + ": item " + std::to_string(item) + " published twice");
    bool ok = true;
    for (const Range& r : (*items)[item]) {
      ok = ok && std::memcmp(dst_base + r.off, src_base + r.off, r.bytes) == 0;
    }
    check(ok, where + ": item " + std::to_string(item) + " published before its bytes arrived");
  }
};

using Stream = fusedcomm::kernels::detail::PullStream<SimEngine, kStages, kPiece>;

// One random sequence: `n_items` items of 0..max_ranges ranges each, sizes up to max_bytes.
void run_case(uint64_t seed, int n_items, int max_ranges, int64_t max_bytes, bool early) {
  std::mt19937_64 rng(seed);
  std::vector<std::vector<Range>> items(n_items);
  int64_t total = 0;
  for (auto& it : items) {
    const int ranges = static_cast<int>(rng() % (max_ranges + 1));
    for (int k = 0; k < ranges; ++k) {
      const int64_t bytes = 16 * static_cast<int64_t>(1 + rng() % (max_bytes / 16));
      it.push_back({total, bytes});
      total += bytes;
    }
  }
  std::vector<uint8_t> src(total), dst(total, 0xEE);
  for (auto& b : src) b = static_cast<uint8_t>(rng() % 251);
  SimEngine e;
  e.dst_base = dst.data();
  e.src_base = src.data();
  e.items = &items;
  e.published.assign(n_items, 0);
  e.rng.seed(seed * 7 + 1);
  e.early = early;
  e.where = "seed " + std::to_string(seed) + (early ? " (early completions)" : "");
  Stream s(e);
  for (int i = 0; i < n_items; ++i) {
    for (const Range& r : items[i]) s.add(dst.data() + r.off, src.data() + r.off, r.bytes);
    s.end_item(i);
    if (rng() % 8 == 0) s.flush();  // as before a wait on a peer's arrive flag
  }
  s.flush();
  int once = 0;
  for (int c : e.published) once += c == 1;
  check(once == n_items, e.where + ": " + std::to_string(n_items - once) + " items not published once");
  check(std::memcmp(dst.data(), src.data(), total) == 0, e.where + ": destination differs");
  check(e.in_flight == 0, e.where + ": loads left in flight");
  // The point of the stream: with enough bytes queued, kStages - 1 loads are in flight at once.
  if (total >= 4 * kStages * int64_t{kPiece} && max_ranges > 0 && !early) {
    check(e.max_in_flight == kStages - 1,
          e.where + ": at most " + std::to_string(e.max_in_flight) + " loads in flight");
  }
}

}  // namespace

int main() {
  int cases = 0;
  for (uint64_t seed = 1; seed <= 400; ++seed) {
    const bool early = seed % 2 == 0;
    // Mostly slices of several pieces, as the pulls' 128 KiB slices of 32 KiB pieces.
    run_case(seed, 1 + static_cast<int>(seed % 40), 2, 6 * kPiece, early);
    // Items below one piece and empty ones (slices past M, own rows only).
    run_case(seed + 10000, 1 + static_cast<int>(seed % 60), 3, kPiece / 2, early);
    // Long items: many pieces each.
    run_case(seed + 20000, 1 + static_cast<int>(seed % 5), 1, 40 * kPiece, early);
    cases += 3;
  }
  // More pending items than the ring holds: a full ring flushes.
  run_case(99, 200, 0, 16, false);
  run_case(98, 200, 1, 16, true);
  cases += 2;
  std::printf("pull_stream_test: %d cases, %d checks passed, %d failed\n", cases,
              fusedcomm::testing::g_passed, fusedcomm::testing::g_failed);
  return fusedcomm::testing::g_failed == 0 ? 0 : 1;
}
