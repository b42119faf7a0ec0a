// The uneven-split rule shared by every op and both backends (documented in docs/ops.md):
// n items over w ranks give rank r  n / w + (r < n % w ? 1 : 0)  items, starting at
// r * (n / w) + min(r, n % w). The first n % w ranks hold one more, as numpy.array_split does.
// And the sequence layouts of ringAttention built on it (seq_runs).
#pragma once

#include <algorithm>
#include <cstdint>

#include "fusedcomm/types.h"

namespace fusedcomm {

inline int64_t split_count(int64_t n, int w, int r) { return n / w + (r < n % w ? 1 : 0); }
inline int64_t split_offset(int64_t n, int w, int r) {
  return static_cast<int64_t>(r) * (n / w) + std::min<int64_t>(r, n % w);
}

// A run of `count` consecutive sequence positions from global position `pos`.
struct SeqRun {
  int64_t pos = 0, count = 0;
};
// The positions rank r of w holds of a sequence of `seq` positions, as the runs they form, in
// the order they sit in the rank's tensors (docs/ops.md "ringAttention"):
// - kContiguous: one run, [split_offset(seq, w, r), + split_count(seq, w, r));
// - kZigzag: the sequence cut into 2w chunks by the split rule (chunk c: split_count(seq, 2w, c)
//   positions at split_offset(seq, 2w, c)); rank r holds chunk r, then chunk 2w-1-r.
// Runs may be empty (count 0).
struct SeqRuns {
  SeqRun run[2];
  int n = 0;  // 1 or 2
  const SeqRun* begin() const { return run; }
  const SeqRun* end() const { return run + n; }
  int64_t total() const { return n == 1 ? run[0].count : run[0].count + run[1].count; }
};
inline SeqRuns seq_runs(int64_t seq, int w, int r, SeqLayout layout) {
  SeqRuns out;
  if (layout == SeqLayout::kZigzag) {
    const int chunks = 2 * w, last = chunks - 1 - r;
    out.run[0] = {split_offset(seq, chunks, r), split_count(seq, chunks, r)};
    out.run[1] = {split_offset(seq, chunks, last), split_count(seq, chunks, last)};
    out.n = 2;
  } else {
    out.run[0] = {split_offset(seq, w, r), split_count(seq, w, r)};
    out.n = 1;
  }
  return out;
}

}  // namespace fusedcomm
