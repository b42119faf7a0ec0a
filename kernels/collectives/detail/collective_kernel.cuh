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

// One 16-byte vector of elements to dst, which is off the 16-byte grid: in the widest pieces
// its alignment allows (8, 4 or 2 bytes).
__device__ __forceinline__ void store_vec_split(void* dst, uint4 v) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(dst);
  if ((a & 7) == 0) {
    uint2* d = static_cast<uint2*>(dst);
    d[0] = make_uint2(v.x, v.y);
    d[1] = make_uint2(v.z, v.w);
  } else if ((a & 3) == 0) {
    uint32_t* d = static_cast<uint32_t*>(dst);
    d[0] = v.x, d[1] = v.y, d[2] = v.z, d[3] = v.w;
  } else {
    uint16_t* d = static_cast<uint16_t*>(dst);
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      d[2 * k] = static_cast<uint16_t>(w[k] & 0xFFFFu);
      d[2 * k + 1] = static_cast<uint16_t>(w[k] >> 16);
    }
  }
}

// The CTA copies n elements src -> dst (either may be peer memory): the elements before src's
// first 16-byte boundary one by one, then 16-byte vector loads with kUnroll in flight per
// thread (NVLink reads need many; the one-shot path, small parts, keeps its 4), stored as
// vectors where dst is then on the 16-byte grid too, else in pieces (store_vec_split), then
// the tail one by one.
template <typename T, int kUnroll = tuning::kTwoPhaseCopyUnroll>
__device__ void cta_copy(T* dst, const T* src, int64_t n) {
  using Raw = typename Elem<T>::Raw;
  constexpr int kEpv = kVecBytes / sizeof(T);
  const int tid = threadIdx.x, nt = blockDim.x;
  const int64_t head = head_elems(src, n);
  if (tid < head) reinterpret_cast<Raw*>(dst)[tid] = __ldcg(reinterpret_cast<const Raw*>(src) + tid);
  dst += head;
  src += head;
  n -= head;
  const int64_t nv = n / kEpv;
  const uint4* s = reinterpret_cast<const uint4*>(src);
  if (aligned16(dst)) {
    uint4* o = reinterpret_cast<uint4*>(dst);
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
    int64_t i = tid;
    for (; i + (kUnroll - 1) * nt < nv; i += kUnroll * nt) {
      uint4 v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) v[u] = ld_vec(s + i + u * nt);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) store_vec_split(dst + (i + u * nt) * kEpv, v[u]);
    }
    for (; i < nv; i += nt) store_vec_split(dst + i * kEpv, ld_vec(s + i));
  }
  const Raw* rs = reinterpret_cast<const Raw*>(src);
  Raw* o = reinterpret_cast<Raw*>(dst);
  for (int64_t i = nv * kEpv + tid; i < n; i += nt) o[i] = __ldcg(rs + i);
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

// dst[i] (and dst2[i] if set) = sum over s of src[s][i], in fp32, s = 0..nsrc-1 in order,
// stored as Out in dst (T, or bf16 from fp32 inputs) and as T in dst2. Sources at one offset
// from the 16-byte grid (a rank's segment at any element offset: every rank's copy sits at
// the same offset) are read in 16-byte vectors after a head of single elements; the sums go
// out as vectors where dst and dst2 are then on the grid too, else element by element. Every
// path adds in the same order and rounds once: the results do not depend on the offsets.
// U: vectors per source in flight per thread (used by the two-phase kernel).
template <typename T, int U, typename Out = T>
__device__ void cta_reduce(Out* dst, T* dst2, const T* const* src, int nsrc, int64_t n) {
  constexpr int kEpv = kVecBytes / sizeof(T);
  int64_t head = 0, nv = 0;
  if (!reduce_body(src, nsrc, n, head, nv)) {
    reduce_elems(dst, dst2, src, nsrc, 0, n);
    return;
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
  int64_t slot_stride;  // push reduceScatter / allToAll: elements between scratch slots
};

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
  if (threadIdx.x == 0) s_failed = comm_failed(d) ? 1u : 0u;
  const uint64_t epoch = comm_launch_epoch(d);  // synchronises the CTA
  return s_failed != 0 ? 0 : epoch;
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
