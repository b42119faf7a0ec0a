// The uneven-split rule shared by every op and both backends (documented in docs/ops.md):
// n items over w ranks give rank r  n / w + (r < n % w ? 1 : 0)  items, starting at
// r * (n / w) + min(r, n % w). The first n % w ranks hold one more, as numpy.array_split does.
#pragma once

#include <algorithm>
#include <cstdint>

namespace fusedcomm {

inline int64_t split_count(int64_t n, int w, int r) { return n / w + (r < n % w ? 1 : 0); }
inline int64_t split_offset(int64_t n, int w, int r) {
  return static_cast<int64_t>(r) * (n / w) + std::min<int64_t>(r, n % w);
}

}  // namespace fusedcomm
