// The layout math of the MoE dispatch (moe.h), shared by the kernels and the CPU unit test
// (moe_layout_test): how the pairs are cut into chunks, and where the row of a pair lands at
// its expert's owner given the W × E count matrix. Host and device code, no CUDA calls.
#pragma once

#include <cstdint>

#include "kernels/common/split.h"

namespace fusedcomm::kernels::detail {

// Pairs per chunk of the count kernel (one warp per chunk): at least 1024, and at most 256
// chunks, so that the count exchange's per-expert prefix over chunks stays short.
__host__ __device__ __forceinline__ int64_t moe_chunk_pairs(int64_t pairs) {
  int64_t c = (pairs + 255) / 256;
  c = (c + 31) / 32 * 32;
  return c < 1024 ? 1024 : c;
}
__host__ __device__ __forceinline__ int64_t moe_chunks(int64_t pairs) {
  return pairs <= 0 ? 0 : (pairs + moe_chunk_pairs(pairs) - 1) / moe_chunk_pairs(pairs);
}

// The low-latency kernel's counting (moe.h "Low latency"): its CTA 0's kMoeLlCountWarps warps
// each take one contiguous chunk of this many pairs, the last ones fewer (0 pairs: 0).
inline constexpr int kMoeLlCountWarps = 12;
__host__ __device__ __forceinline__ int64_t moe_ll_chunk_pairs(int64_t pairs) {
  return (pairs + kMoeLlCountWarps - 1) / kMoeLlCountWarps;
}

// m: the count matrix, m[s * E + e] = pairs rank s routes to expert e.
__host__ __device__ __forceinline__ int64_t moe_expert_total(const int32_t* m, int W, int E, int e) {
  int64_t t = 0;
  for (int s = 0; s < W; ++s) t += m[static_cast<int64_t>(s) * E + e];
  return t;
}

// Rows at the owner of expert e that come before e's rows: the rows of its lower local
// experts. `totals`: per-expert totals (moe_expert_total).
template <typename T>
__host__ __device__ __forceinline__ int64_t moe_owner_offset(const T* totals, int W, int E, int e) {
  const int p = split_owner(E, W, e);
  int64_t off = 0;
  for (int64_t i = split_offset(E, W, p); i < e; ++i) off += totals[i];
  return off;
}

// The first row at e's owner of the pairs rank s routes to e: the owner's rows before e, then
// e's rows from the ranks below s (row order: local expert, source rank, token, slot).
template <typename T>
__host__ __device__ __forceinline__ int64_t moe_send_base(const int32_t* m, const T* totals, int W, int E,
                                                          int s, int e) {
  int64_t off = moe_owner_offset(totals, W, E, e);
  for (int q = 0; q < s; ++q) off += m[static_cast<int64_t>(q) * E + e];
  return off;
}

// Rows rank p receives.
template <typename T>
__host__ __device__ __forceinline__ int64_t moe_owner_rows(const T* totals, int W, int E, int p) {
  int64_t rows = 0;
  const int64_t first = split_offset(E, W, p);
  for (int64_t i = first; i < first + split_count(E, W, p); ++i) rows += totals[i];
  return rows;
}

// The fused dispatch's order of the experts at sender r: f(e) for every expert e, every owner's
// first local expert, then every owner's second, ..., the owners from r + 1 on (r last) each
// time. Every owner's GEMM starts on its first expert, which then gets its rows from every
// sender first; the owners take turns so that the links to all of them carry rows at once.
template <typename F>
__host__ __device__ __forceinline__ void moe_for_send_order(int E, int W, int r, F f) {
  for (int64_t i = 0; i < split_count(E, W, 0); ++i) {  // owner 0 has the most experts
    for (int q = 0; q < W; ++q) {
      const int o = (r + 1 + q) % W;
      if (i < split_count(E, W, o)) f(static_cast<int>(split_offset(E, W, o) + i));
    }
  }
}

}  // namespace fusedcomm::kernels::detail
