// What every collective kernel shares (collectives.h): element types and 16-byte vectors, the
// CTA-wide copy and reduction loops, the kernels' parameter block, and the start and end of a
// launch (epoch, end barrier).
// Included by collectives.cu only, inside its anonymous namespace: the kernels keep internal
// linkage (and their symbols) in that translation unit.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>

#include "kernels/collectives/collectives.h"
#include "kernels/collectives/detail/select.h"
#include "kernels/collectives/tuning.h"
#include "kernels/common/comm_protocol.cuh"
#include "kernels/common/split.h"

namespace fusedcomm::kernels {
namespace {

using namespace detail;

// Part `c` of `parts` of [0, n), cut at multiples of `unit` elements (16-byte vectors).
__device__ __forceinline__ void part_range(int64_t n, int parts, int c, int unit, int64_t& b, int64_t& e) {
  const int64_t units = (n + unit - 1) / unit;
  const int64_t ub = split_offset(units, parts, c);
  const int64_t ue = ub + split_count(units, parts, c);
  b = min(ub * unit, n);
  e = min(ue * unit, n);
}

template <typename T>
struct Elem;
template <>
struct Elem<float> {
  using Raw = uint32_t;
  __device__ static float load(const float* p) { return __ldcg(p); }
  __device__ static float to_float(uint32_t raw) { return __uint_as_float(raw); }
  __device__ static void store(float* p, float v) { *p = v; }
  __device__ static void add_vec(float (&acc)[4], uint4 v) {
    acc[0] += __uint_as_float(v.x);
    acc[1] += __uint_as_float(v.y);
    acc[2] += __uint_as_float(v.z);
    acc[3] += __uint_as_float(v.w);
  }
  __device__ static uint4 pack(const float (&acc)[4]) {
    return make_uint4(__float_as_uint(acc[0]), __float_as_uint(acc[1]), __float_as_uint(acc[2]),
                      __float_as_uint(acc[3]));
  }
};
template <>
struct Elem<__nv_bfloat16> {
  using Raw = uint16_t;
  __device__ static float load(const __nv_bfloat16* p) {
    const uint16_t raw = __ldcg(reinterpret_cast<const unsigned short*>(p));
    return __uint_as_float(static_cast<uint32_t>(raw) << 16);
  }
  __device__ static float to_float(uint16_t raw) { return __uint_as_float(static_cast<uint32_t>(raw) << 16); }
  __device__ static void store(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }
  __device__ static void add2(float* acc, uint32_t w) {
    acc[0] += __uint_as_float(w << 16);
    acc[1] += __uint_as_float(w & 0xFFFF0000u);
  }
  __device__ static void add_vec(float (&acc)[8], uint4 v) {
    add2(acc + 0, v.x);
    add2(acc + 2, v.y);
    add2(acc + 4, v.z);
    add2(acc + 6, v.w);
  }
  __device__ static uint32_t pack2(float lo, float hi) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
  }
  __device__ static uint4 pack(const float (&acc)[8]) {
    return make_uint4(pack2(acc[0], acc[1]), pack2(acc[2], acc[3]), pack2(acc[4], acc[5]),
                      pack2(acc[6], acc[7]));
  }
};

__device__ __forceinline__ bool aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15) == 0;
}

// 16-byte load of data pulled from a peer (or local): ld.global.cg (no L1; peers write
// scratch and staging during the kernel).
__device__ __forceinline__ uint4 ld_vec(const uint4* p) { return __ldcg(p); }

// Elements before the first 16-byte boundary of p (at most n): a segment that starts at any
// element offset (a count that does not split into 16-byte pieces per rank) takes them one by
// one, then 16-byte vectors.
template <typename T>
__device__ __forceinline__ int64_t head_elems(const T* p, int64_t n) {
  const int64_t h = static_cast<int64_t>((kVecBytes - (reinterpret_cast<uintptr_t>(p) & 15)) & 15) /
                    static_cast<int64_t>(sizeof(T));
  return h < n ? h : n;
}

// Bytes [m, m + 16) of the 32 bytes lo:hi (little endian; m in 0..15, uniform): a vector of a
// source off the 16-byte grid by m bytes, from the two aligned vectors it straddles. Word
// shifts by selects (no dynamic register indexing), then one funnel shift per word.
__device__ __forceinline__ uint4 funnel16(uint4 lo, uint4 hi, uint32_t m) {
  const uint32_t x[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
  const bool w1 = (m & 4) != 0, w2 = (m & 8) != 0;
  uint32_t y[7], z[5];
#pragma unroll
  for (int i = 0; i < 7; ++i) y[i] = w1 ? x[i + 1] : x[i];
#pragma unroll
  for (int i = 0; i < 5; ++i) z[i] = w2 ? y[i + 2] : y[i];
  const uint32_t s = (m & 3) * 8;
  return make_uint4(__funnelshift_r(z[0], z[1], s), __funnelshift_r(z[1], z[2], s),
                    __funnelshift_r(z[2], z[3], s), __funnelshift_r(z[3], z[4], s));
}

__device__ __forceinline__ uint4 shfl_vec(uint4 v, int lane) {
  return make_uint4(__shfl_sync(0xffffffffu, v.x, lane), __shfl_sync(0xffffffffu, v.y, lane),
                    __shfl_sync(0xffffffffu, v.z, lane), __shfl_sync(0xffffffffu, v.w, lane));
}

// A destination on the 16-byte grid fed from a source m bytes off it (0 < m < 16): output
// vector j is funnel16(A_j, A_{j+1}, m), A_i = load(i) the source's aligned vector i (i <= nv;
// A_nv still holds source bytes, so no load leaves the source's 16-byte granules). Each source
// vector is loaded once: a warp takes U runs of 32 consecutive vectors, and lane l takes A_{j+1}
// from lane l + 1 by a shuffle (lane 31 from the next run's lane 0, or one extra load after
// the last run). tid, nt: the thread and the thread count of the group, whole warps (nt a
// multiple of 32). store(j, v) for j < nv.
template <int U, typename Load, typename Store>
__device__ __forceinline__ void shifted_stream(int tid, int nt, int64_t nv, uint32_t m, Load load,
                                               Store store) {
  const int lane = tid & 31;
  const int64_t step = static_cast<int64_t>(nt / 32) * 32 * U;
  for (int64_t base = static_cast<int64_t>(tid / 32) * 32 * U; base < nv; base += step) {
    uint4 v[U + 1];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t i = base + u * 32 + lane;
      v[u] = i <= nv ? load(i) : make_uint4(0u, 0u, 0u, 0u);
    }
    const int64_t last = base + U * 32;
    v[U] = lane == 31 && last <= nv ? load(last) : make_uint4(0u, 0u, 0u, 0u);
    uint4 next = shfl_vec(v[0], (lane + 1) & 31);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const uint4 cur = next;  // lanes 0..30: lane l + 1's v[u]; lane 31: lane 0's v[u]
      if (u + 1 < U) next = shfl_vec(v[u + 1], (lane + 1) & 31);
      const uint4 hi = lane != 31 ? cur : u + 1 < U ? next : v[U];
      const int64_t j = base + u * 32 + lane;
      if (j < nv) store(j, funnel16(v[u], hi, m));
    }
  }
}

// The CTA copies n elements src -> dst (either may be peer memory): the elements before dst's
// first 16-byte boundary one by one, then 16-byte vector stores, then the tail one by one.
// Where src is then on the 16-byte grid too, 16-byte loads with kUnroll in flight per thread
// (NVLink reads need many; the one-shot path, small parts, keeps its 4); else the aligned
// source vectors around each output vector, joined (shifted_stream): every byte is still read
// once, in 16-byte loads.
template <typename T, int kUnroll = tuning::kTwoPhaseCopyUnroll>
__device__ void cta_copy(T* dst, const T* src, int64_t n) {
  using Raw = typename Elem<T>::Raw;
  constexpr int kEpv = kVecBytes / sizeof(T);
  const int tid = threadIdx.x, nt = blockDim.x;
  const int64_t head = head_elems(dst, n);
  if (tid < head) reinterpret_cast<Raw*>(dst)[tid] = __ldcg(reinterpret_cast<const Raw*>(src) + tid);
  dst += head;
  src += head;
  n -= head;
  const int64_t nv = n / kEpv;
  uint4* o = reinterpret_cast<uint4*>(dst);
  const uint32_t m = static_cast<uint32_t>(reinterpret_cast<uintptr_t>(src) & 15);
  if (m == 0) {
    const uint4* s = reinterpret_cast<const uint4*>(src);
    int64_t i = tid;
    for (; i + (kUnroll - 1) * nt < nv; i += kUnroll * nt) {
      uint4 v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) v[u] = ld_vec(s + i + u * nt);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) o[i + u * nt] = v[u];
    }
    for (; i < nv; i += nt) o[i] = ld_vec(s + i);
  } else {
    const uint4* a = reinterpret_cast<const uint4*>(reinterpret_cast<const uint8_t*>(src) - m);
    shifted_stream<kUnroll>(
        tid, nt, nv, m, [&](int64_t i) { return ld_vec(a + i); }, [&](int64_t j, uint4 v) { o[j] = v; });
  }
  const Raw* rs = reinterpret_cast<const Raw*>(src);
  Raw* ro = reinterpret_cast<Raw*>(dst);
  for (int64_t i = nv * kEpv + tid; i < n; i += nt) ro[i] = __ldcg(rs + i);
}

// The sum of the first n of NS 16-byte vectors of T, in fp32 in source order, rounded once (NS a
// compile-time bucket, the vectors past n predicated off).
template <typename T, int NS>
__device__ __forceinline__ uint4 sum_vecs(const uint4 (&v)[NS], int n) {
  float acc[kVecBytes / sizeof(T)];
#pragma unroll
  for (int e = 0; e < kVecBytes / static_cast<int>(sizeof(T)); ++e) acc[e] = 0.f;
#pragma unroll
  for (int k = 0; k < NS; ++k)
    if (k < n) Elem<T>::add_vec(acc, v[k]);
  return Elem<T>::pack(acc);
}

// Where a reduction's sums go, one vector of kVecBytes / sizeof(T) elements at a time: vector i
// of dst in the output type Out (T: 16 bytes; bf16 from fp32 sums: 8 bytes, each sum rounded
// once), and, if dst2 is set, vector i of dst2 in T (allReduce's scratch copy).
template <typename T, typename Out>
struct VecOut {
  static_assert(std::is_same_v<T, Out>, "only fp32 sums may be stored as bf16");
  static constexpr int64_t kAlign = kVecBytes;
  template <int kEpv>
  __device__ static void put(Out* dst, T* dst2, int64_t i, const float (&acc)[kEpv]) {
    const uint4 packed = Elem<T>::pack(acc);
    reinterpret_cast<uint4*>(dst)[i] = packed;
    if (dst2 != nullptr) reinterpret_cast<uint4*>(dst2)[i] = packed;
  }
};
template <>
struct VecOut<float, __nv_bfloat16> {
  static constexpr int64_t kAlign = 8;
  __device__ static void put(__nv_bfloat16* dst, float* dst2, int64_t i, const float (&acc)[4]) {
    reinterpret_cast<uint2*>(dst)[i] =
        make_uint2(Elem<__nv_bfloat16>::pack2(acc[0], acc[1]), Elem<__nv_bfloat16>::pack2(acc[2], acc[3]));
    if (dst2 != nullptr) reinterpret_cast<uint4*>(dst2)[i] = Elem<float>::pack(acc);
  }
};

// Vector i's sums element by element: for dst (or dst2) off the grid VecOut stores on. The same
// rounding as VecOut (round to nearest even, each sum once).
template <typename T, typename Out, int kEpv>
__device__ __forceinline__ void put_elems(Out* dst, T* dst2, int64_t i, const float (&acc)[kEpv]) {
#pragma unroll
  for (int k = 0; k < kEpv; ++k) Elem<Out>::store(dst + i * kEpv + k, acc[k]);
  if (dst2 != nullptr) {
#pragma unroll
    for (int k = 0; k < kEpv; ++k) Elem<T>::store(dst2 + i * kEpv + k, acc[k]);
  }
}

// Vector part of cta_reduce with the source count NS known at compile time: kRedUnroll
// vectors per source per thread are loaded before the first add, so a thread keeps
// NS * kRedUnroll independent 16-byte loads in flight (NVLink reads need many).
// vec_out: dst (and dst2) on the grid VecOut stores on; else the sums go out element by element.
template <typename T, typename Out, int NS, int kRedUnroll>
__device__ __forceinline__ void cta_reduce_vec(Out* dst, T* dst2, const T* const* src, int64_t nv,
                                               bool vec_out) {
  constexpr int kEpv = kVecBytes / sizeof(T);
  const int tid = threadIdx.x, nt = blockDim.x;
  const uint4* s[NS];
#pragma unroll
  for (int k = 0; k < NS; ++k) s[k] = reinterpret_cast<const uint4*>(src[k]);
  int64_t i = tid;
  for (; i + (kRedUnroll - 1) * nt < nv; i += kRedUnroll * nt) {
    uint4 v[kRedUnroll][NS];
#pragma unroll
    for (int u = 0; u < kRedUnroll; ++u)
#pragma unroll
      for (int k = 0; k < NS; ++k) v[u][k] = ld_vec(s[k] + i + u * nt);
#pragma unroll
    for (int u = 0; u < kRedUnroll; ++u) {
      float acc[kEpv];
#pragma unroll
      for (int e = 0; e < kEpv; ++e) acc[e] = 0.f;
#pragma unroll
      for (int k = 0; k < NS; ++k) Elem<T>::add_vec(acc, v[u][k]);
      if (vec_out) {
        VecOut<T, Out>::put(dst, dst2, i + u * nt, acc);
      } else {
        put_elems<T, Out, kEpv>(dst, dst2, i + u * nt, acc);
      }
    }
  }
  for (; i < nv; i += nt) {
    uint4 v[NS];
#pragma unroll
    for (int k = 0; k < NS; ++k) v[k] = ld_vec(s[k] + i);
    float acc[kEpv];
#pragma unroll
    for (int e = 0; e < kEpv; ++e) acc[e] = 0.f;
#pragma unroll
    for (int k = 0; k < NS; ++k) Elem<T>::add_vec(acc, v[k]);
    if (vec_out) {
      VecOut<T, Out>::put(dst, dst2, i, acc);
    } else {
      put_elems<T, Out, kEpv>(dst, dst2, i, acc);
    }
  }
}

// True when the sums may go out as VecOut's vectors: dst on Out's vector grid, dst2 (if set)
// 16-byte aligned.
template <typename T, typename Out>
__device__ __forceinline__ bool out_vectorizable(const Out* dst, const T* dst2) {
  return (reinterpret_cast<uintptr_t>(dst) & (VecOut<T, Out>::kAlign - 1)) == 0 &&
         (dst2 == nullptr || aligned16(dst2));
}

// Sums of elements [b, e) one by one (a reduction's head and tail).
template <typename T, typename Out>
__device__ __forceinline__ void reduce_elems(Out* dst, T* dst2, const T* const* src, int nsrc, int64_t b,
                                             int64_t e) {
  for (int64_t i = b + threadIdx.x; i < e; i += blockDim.x) {
    float acc = 0.f;
    for (int s = 0; s < nsrc; ++s) acc += Elem<T>::load(src[s] + i);
    Elem<Out>::store(dst + i, acc);
    if (dst2 != nullptr) Elem<T>::store(dst2 + i, acc);
  }
}

// The vector body of a reduction: the elements before the sources' first 16-byte boundary
// (`head`, where every source sits at the same offset from it, else all of them), then whole
// vectors. Returns false where the sources are at different offsets (then nothing is
// vectorised); else sets head and nv (vectors after the head), the sources to advance by head.
template <typename T>
__device__ __forceinline__ bool reduce_body(const T* const* src, int nsrc, int64_t n, int64_t& head,
                                            int64_t& nv) {
  constexpr int kEpv = kVecBytes / sizeof(T);
  const uintptr_t mis = reinterpret_cast<uintptr_t>(src[0]) & 15;
  for (int s = 1; s < nsrc; ++s) {
    if ((reinterpret_cast<uintptr_t>(src[s]) & 15) != mis) return false;
  }
  head = head_elems(src[0], n);
  nv = (n - head) / kEpv;
  return true;
}

// The sums of NS sources that sit m bytes off the 16-byte grid (0 < m < 16, all at the same
// offset; a[k]: source k's aligned vector 0) into dst (and dst2) on the grid: each aligned
// vector of sums is formed once (U of them per thread, NS * U loads in flight) and output
// vector j joins sums j and j + 1 (shifted_stream). Bytes outside the sources' range enter only
// the sums that are dropped. Same adds in the same order as cta_reduce_vec.
template <typename T, int NS, int U>
__device__ __forceinline__ void cta_reduce_shift(T* dst, T* dst2, const uint4* const* a, int64_t nv,
                                                 uint32_t m) {
  constexpr int kEpv = kVecBytes / sizeof(T);
  const uint4* s[NS];
#pragma unroll
  for (int k = 0; k < NS; ++k) s[k] = a[k];
  shifted_stream<U>(
      threadIdx.x, blockDim.x, nv, m,
      [&](int64_t i) {
        uint4 v[NS];
#pragma unroll
        for (int k = 0; k < NS; ++k) v[k] = ld_vec(s[k] + i);
        float acc[kEpv];
#pragma unroll
        for (int e = 0; e < kEpv; ++e) acc[e] = 0.f;
#pragma unroll
        for (int k = 0; k < NS; ++k) Elem<T>::add_vec(acc, v[k]);
        return Elem<T>::pack(acc);
      },
      [&](int64_t j, uint4 v) {
        reinterpret_cast<uint4*>(dst)[j] = v;
        if (dst2 != nullptr) reinterpret_cast<uint4*>(dst2)[j] = v;
      });
}

// dst[i] (and dst2[i] if set) = sum over s of src[s][i], in fp32, s = 0..nsrc-1 in order,
// stored as Out in dst (T, or bf16 from fp32 inputs) and as T in dst2. Sources at one offset
// from the 16-byte grid (a rank's segment at any element offset: every rank's copy sits at
// the same offset) are read in 16-byte vectors. Out == T with dst2 (if set) at dst's offset:
// the elements before dst's first 16-byte boundary one by one, then 16-byte stores, the
// sources aligned (cta_reduce_vec) or joined from their aligned vectors (cta_reduce_shift).
// Otherwise a head of single elements up to the sources' boundary, and the sums go out as
// vectors where dst and dst2 are then on the grid too, else element by element. Every path adds
// in the same order and rounds once: the results do not depend on the offsets.
// U: vectors per source in flight per thread (used by the two-phase kernel).
template <typename T, int U, typename Out = T>
__device__ void cta_reduce(Out* dst, T* dst2, const T* const* src, int nsrc, int64_t n) {
  constexpr int kEpv = kVecBytes / sizeof(T);
  int64_t head = 0, nv = 0;
  if (!reduce_body(src, nsrc, n, head, nv)) {
    reduce_elems(dst, dst2, src, nsrc, 0, n);
    return;
  }
  if constexpr (std::is_same_v<T, Out>) {
    const uintptr_t md = reinterpret_cast<uintptr_t>(dst) & 15;
    if (dst2 == nullptr || (reinterpret_cast<uintptr_t>(dst2) & 15) == md) {
      head = head_elems(dst, n);
      nv = (n - head) / kEpv;
      reduce_elems(dst, dst2, src, nsrc, 0, head);
      const uint32_t m = static_cast<uint32_t>(reinterpret_cast<uintptr_t>(src[0] + head) & 15);
      T* d = dst + head;
      T* d2 = dst2 != nullptr ? dst2 + head : nullptr;
      if (m == 0) {
        const T* s2[kCommMaxRanks];
        for (int s = 0; s < nsrc; ++s) s2[s] = src[s] + head;
        switch (nsrc) {
          case 1: cta_reduce_vec<T, T, 1, U>(d, d2, s2, nv, true); break;
          case 2: cta_reduce_vec<T, T, 2, U>(d, d2, s2, nv, true); break;
          case 3: cta_reduce_vec<T, T, 3, U>(d, d2, s2, nv, true); break;
          case 4: cta_reduce_vec<T, T, 4, U>(d, d2, s2, nv, true); break;
          case 5: cta_reduce_vec<T, T, 5, U>(d, d2, s2, nv, true); break;
          case 6: cta_reduce_vec<T, T, 6, U>(d, d2, s2, nv, true); break;
          case 7: cta_reduce_vec<T, T, 7, U>(d, d2, s2, nv, true); break;
          default: cta_reduce_vec<T, T, 8, U>(d, d2, s2, nv, true); break;
        }
      } else {
        const uint4* a[kCommMaxRanks];
        for (int s = 0; s < nsrc; ++s) {
          a[s] = reinterpret_cast<const uint4*>(reinterpret_cast<const uint8_t*>(src[s] + head) - m);
        }
        switch (nsrc) {
          case 1: cta_reduce_shift<T, 1, U>(d, d2, a, nv, m); break;
          case 2: cta_reduce_shift<T, 2, U>(d, d2, a, nv, m); break;
          case 3: cta_reduce_shift<T, 3, U>(d, d2, a, nv, m); break;
          case 4: cta_reduce_shift<T, 4, U>(d, d2, a, nv, m); break;
          case 5: cta_reduce_shift<T, 5, U>(d, d2, a, nv, m); break;
          case 6: cta_reduce_shift<T, 6, U>(d, d2, a, nv, m); break;
          case 7: cta_reduce_shift<T, 7, U>(d, d2, a, nv, m); break;
          default: cta_reduce_shift<T, 8, U>(d, d2, a, nv, m); break;
        }
      }
      reduce_elems(dst, dst2, src, nsrc, head + nv * kEpv, n);
      return;
    }
  }
  reduce_elems(dst, dst2, src, nsrc, 0, head);
  const T* s2[kCommMaxRanks];
  for (int s = 0; s < nsrc; ++s) s2[s] = src[s] + head;
  Out* d = dst + head;
  T* d2 = dst2 != nullptr ? dst2 + head : nullptr;
  const bool vec_out = out_vectorizable(d, d2);
  switch (nsrc) {
    case 1: cta_reduce_vec<T, Out, 1, U>(d, d2, s2, nv, vec_out); break;
    case 2: cta_reduce_vec<T, Out, 2, U>(d, d2, s2, nv, vec_out); break;
    case 3: cta_reduce_vec<T, Out, 3, U>(d, d2, s2, nv, vec_out); break;
    case 4: cta_reduce_vec<T, Out, 4, U>(d, d2, s2, nv, vec_out); break;
    case 5: cta_reduce_vec<T, Out, 5, U>(d, d2, s2, nv, vec_out); break;
    case 6: cta_reduce_vec<T, Out, 6, U>(d, d2, s2, nv, vec_out); break;
    case 7: cta_reduce_vec<T, Out, 7, U>(d, d2, s2, nv, vec_out); break;
    default: cta_reduce_vec<T, Out, 8, U>(d, d2, s2, nv, vec_out); break;
  }
  reduce_elems(dst, dst2, src, nsrc, head + nv * kEpv, n);
}

// One-shot's reduction (local staging, small parts): one vector per source in flight, the source
// count a run-time value. Same result as cta_reduce.
template <typename T, typename Out = T>
__device__ void cta_reduce_small(Out* dst, T* dst2, const T* const* src, int nsrc, int64_t n) {
  constexpr int kEpv = kVecBytes / sizeof(T);
  const int tid = threadIdx.x, nt = blockDim.x;
  int64_t head = 0, nv = 0;
  if (!reduce_body(src, nsrc, n, head, nv)) {
    reduce_elems(dst, dst2, src, nsrc, 0, n);
    return;
  }
  reduce_elems(dst, dst2, src, nsrc, 0, head);
  Out* d = dst + head;
  T* d2 = dst2 != nullptr ? dst2 + head : nullptr;
  const bool vec_out = out_vectorizable(d, d2);
  for (int64_t i = tid; i < nv; i += nt) {
    uint4 v[kCommMaxRanks];
#pragma unroll
    for (int s = 0; s < kCommMaxRanks; ++s)
      if (s < nsrc) v[s] = __ldcg(reinterpret_cast<const uint4*>(src[s] + head) + i);
    float acc[kEpv];
#pragma unroll
    for (int k = 0; k < kEpv; ++k) acc[k] = 0.f;
#pragma unroll
    for (int s = 0; s < kCommMaxRanks; ++s)
      if (s < nsrc) Elem<T>::add_vec(acc, v[s]);
    if (vec_out) {
      VecOut<T, Out>::put(d, d2, i, acc);
    } else {
      put_elems<T, Out, kEpv>(d, d2, i, acc);
    }
  }
  reduce_elems(dst, dst2, src, nsrc, head + nv * kEpv, n);
}

struct Params {
  CollectiveArgs a;
  int64_t chunk;        // two-phase, pipelined: elements per work item (multiple of the vector width)
  int pull_ctas;        // two-phase: CTAs [0, pull_ctas) read peers; the rest copy the local segment.
                        // pipelined kernel: the producer CTAs
  int consumers;        // pipelined kernel: CTAs [pull_ctas, pull_ctas + consumers)
  int64_t slot_stride;  // push reduceScatter / allToAll / direct: elements between scratch slots
  bool in_place;        // two-shot: the output is the input's place in the data area (detail::in_place)
};

// All threads, after this CTA's accesses: `value` into flag `field` of every peer, released
// (comm_protocol.cuh's publish pattern with a lighter fence): bar.sync orders every thread's
// accesses before thread 0's fence.acq_rel.sys, and that fence followed by relaxed stores is a
// release pattern (cumulative), one fence for all peers. fence.sc.sys adds nothing here (no
// order between fences is relied on) and cost the one-shot launch ~0.6 us.
template <typename Field>
__device__ __forceinline__ void publish_to_peers(const CommDevice& d, Field field, uint64_t value) {
  __syncthreads();
  if (threadIdx.x == 0) {
    asm volatile("fence.acq_rel.sys;" ::: "memory");
    for (int i = 1; i < d.world; ++i) {
      const int p = (d.rank + i) % d.world;
      st_relaxed_sys(field(comm_flags(d, p)), value);
    }
  }
}

// Thread 0: waits until flags[p * stride] >= value for every peer p (bounded: comm_wait_flag);
// false if a wait gave up. check_signatures: the flags are released after each peer's launch
// signature (CommFlags::launch), which is then compared with this launch's
// (comm_check_signatures). The slots are read before the wait, so that their latency overlaps
// it; a slot that held an older launch then (epoch byte differs) is read again after the wait,
// ordered by its acquire. A slot's epoch byte can only name this launch or an older one (a
// peer is never two launches ahead), so an early read that names this launch is its value.
__device__ __forceinline__ bool wait_peers_checked(const CommDevice& d, const uint64_t* flags, int stride,
                                                   uint64_t value, uint64_t epoch, CommOp op, uint32_t step,
                                                   bool check_signatures) {
  const int r = d.rank, W = d.world;
  uint64_t early[kCommMaxRanks];
#pragma unroll
  for (int p = 0; p < kCommMaxRanks; ++p) {
    early[p] = check_signatures && p < W && p != r ? comm_peer_signature(d, p, epoch) : 0;
  }
  for (int i = 1; i < W; ++i) {
    const int p = (r + i) % W;
    if (!comm_wait_flag(d, flags + static_cast<int64_t>(p) * stride, value, static_cast<uint32_t>(op), step,
                        p)) {
      return false;
    }
  }
  if (!check_signatures) return true;
  const uint64_t mine = comm_signature_at(d.launch_sig, epoch);
#pragma unroll
  for (int p = 0; p < kCommMaxRanks; ++p) {
    if (p >= W || p == r) continue;
    uint64_t seen = early[p];
    if (comm_sig_epoch8(seen) != (epoch & 0xFF)) seen = comm_peer_signature(d, p, epoch);
    if (seen != mine) {
      comm_record_failure(d, kCommLaunchMismatch, epoch, seen, 0, static_cast<uint32_t>(op), step, p);
      return false;
    }
  }
  return true;
}

template <typename T>
__device__ __forceinline__ T* data_of(const CommDevice& d, const CollectiveArgs& a, int p) {
  return reinterpret_cast<T*>(d.base[p] + d.data_offset + a.in_offset);
}
template <typename T>
__device__ __forceinline__ T* slot_of(const CommDevice& d, int owner, uint64_t parity, int src) {
  return reinterpret_cast<T*>(comm_slot(d, owner, parity, src));
}

// Every collective kernel's first call (all threads). The kernels are launched early
// (start_kernel): the stream's previous kernel is complete, its memory visible, once pdl_wait
// returns, so the protocol's "the next launch is stream-ordered after this one" holds as at a
// kernel boundary. Then the stream's next kernel may be scheduled on the SMs this grid leaves
// free, and the launch's epoch is read.
// Returns 0 (the caller returns at once) on a rank that has already given up: it publishes
// nothing, so its peers' waits name it (kCommPeerFailed) instead of reading stale data. The
// verdict is thread 0's, shared, so that a CTA leaves as one.
__device__ __forceinline__ uint64_t enter_collective(const CommDevice& d) {
  pdl_wait();
  pdl_release_dependents();
  __shared__ uint32_t s_failed;
  if (threadIdx.x == 0) {
    // Both loads issued before either value is used: one L2 round trip at the start, not two.
    const uint32_t failed = *reinterpret_cast<volatile uint32_t*>(&comm_control(d)->error_claim);
    const uint64_t last = *reinterpret_cast<volatile uint64_t*>(&comm_control(d)->epoch);
    s_failed = failed;
    comm_epoch_slot() = last + 1;
  }
  __syncthreads();
  return s_failed != 0 ? 0 : comm_epoch_slot();
}

// enter_collective, and thread 0 counts this CTA in CommControl::exit_count at once instead of
// at its end (finish_counted): the CTA has read the epoch by then (the increment depends on the
// value read), so the last CTA to arrive may record the next epoch whenever it likes, and the
// atomic's round trip overlaps the CTA's work instead of delaying its exit. *arrived: thread
// 0's count before its increment (the others: unused).
__device__ __forceinline__ uint64_t enter_collective_counted(const CommDevice& d, uint32_t* arrived) {
  const uint64_t epoch = enter_collective(d);
  if (threadIdx.x == 0 && epoch != 0) {  // a rank that has given up counts nothing
    // epoch >> 63 is 0 (epochs stay far below 2^63): it makes the increment wait for the load.
    *arrived = atomicAdd(&comm_control(d)->exit_count, 1u + static_cast<uint32_t>(comm_epoch_slot() >> 63));
  }
  return epoch;
}

// The end of a launch entered with enter_collective_counted (all threads; also where the launch
// gave up, as finish_launch): the last CTA to have arrived resets the count and records the
// epoch. No fence and no barrier: nothing of this launch reads either; the next launch reads
// them after this one has completed (pdl_wait).
__device__ __forceinline__ void finish_counted(const CommDevice& d, uint64_t epoch, uint32_t arrived) {
  if (threadIdx.x == 0 && arrived + 1 == gridDim.x) {
    *reinterpret_cast<volatile uint32_t*>(&comm_control(d)->exit_count) = 0;
    *reinterpret_cast<volatile uint64_t*>(&comm_control(d)->epoch) = epoch;
  }
}

// Last CTA of the launch: record the epoch for the next launch (thread 0, after the CTA's work).
// The count makes it the last CTA, so every CTA has read the old epoch (comm_launch_epoch)
// before it changes. No fence (comm_arrive_last, not comm_last_cta): no peer reads CommControl,
// and the next launch reads it only after this one has completed (pdl_wait).
__device__ __forceinline__ void finish_launch(const CommDevice& d, uint64_t epoch) {
  __syncthreads();
  if (threadIdx.x == 0 && comm_arrive_last(&comm_control(d)->exit_count)) {
    *reinterpret_cast<volatile uint64_t*>(&comm_control(d)->epoch) = epoch;
  }
}

// Last CTA of a launch whose peers read this rank's memory (ordering: CommFlags::done): it
// tells every peer this rank is done reading theirs, waits until every peer is done reading
// ours, then records the epoch for the next launch. A wait that fails (abort or timeout, the
// error record written) stops the loop; the epoch is recorded either way.
__device__ __forceinline__ void finish_with_end_barrier(const CommDevice& d, uint64_t epoch, CommOp op) {
  comm_publish_fence();
  if (threadIdx.x == 0 && comm_last_cta(&comm_control(d)->exit_count)) {
    const int r = d.rank, W = d.world;
    comm_signal_peers(
        d, [&](CommFlags* f) { return &f->done[r]; }, epoch);
    CommFlags* const mine = comm_flags(d, r);
    for (int i = 1; i < W; ++i) {
      const int p = (r + i) % W;
      if (!comm_wait_flag(d, &mine->done[p], epoch, static_cast<uint32_t>(op), kCommStepDone, p)) break;
    }
    *reinterpret_cast<volatile uint64_t*>(&comm_control(d)->epoch) = epoch;
  }
}

}  // namespace
}  // namespace fusedcomm::kernels
