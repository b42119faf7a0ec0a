// The collectives of collectives.h: one-shot (push into peers' staging) and two-phase (pull from
// peers' data areas) kernels for fp32 and bf16, and the host launcher.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <type_traits>

#include "kernels/collectives/collectives.h"
#include "kernels/common/comm_protocol.cuh"
#include "kernels/common/early_launch.h"

namespace fusedcomm::kernels {
namespace {

using namespace detail;

#ifndef FC_THREADS
#define FC_THREADS 512
#endif
constexpr int kThreads = FC_THREADS;
#ifndef FC_COPY_UNROLL
#define FC_COPY_UNROLL 8
#endif
constexpr int kTwoPhaseCopyUnroll = FC_COPY_UNROLL;
constexpr int kOneShotCopyUnroll = 4;
constexpr int64_t kVecBytes = 16;

// The uneven-split rule (same as executor-native/include/fusedcomm/runtime/split.h).
__host__ __device__ __forceinline__ int64_t split_count(int64_t n, int w, int r) {
  return n / w + (r < n % w ? 1 : 0);
}
__host__ __device__ __forceinline__ int64_t split_offset(int64_t n, int w, int r) {
  const int64_t rem = n % w;
  return static_cast<int64_t>(r) * (n / w) + (r < rem ? r : rem);
}
// Part `c` of `parts` of [0, n), cut at multiples of `unit` elements (16-byte vectors).
__device__ __forceinline__ void part_range(int64_t n, int parts, int c, int unit, int64_t& b,
                                           int64_t& e) {
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

// 16-byte load of data pulled from a peer (or local). kReadOnly: the memory is not written by
// anyone during the kernel (the callers' inputs in the data areas), so with -DFC_PULL_LD=1 it
// may use the non-coherent path without L1 allocation and a 256-byte L2 prefetch hint (a
// measurement variant); scratch and staging (written by peers during the kernel) always use
// ld.global.cg.
#ifndef FC_PULL_LD
#define FC_PULL_LD 0
#endif
constexpr bool kDataReadOnly = FC_PULL_LD == 1;  // two-phase copies of data areas
template <bool kReadOnly>
__device__ __forceinline__ uint4 ld_vec(const uint4* p) {
#if FC_PULL_LD == 1
  if constexpr (kReadOnly) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
  }
#endif
  return __ldcg(p);
}

// The CTA copies n elements src -> dst (either may be peer memory). 16-byte vectors when both
// are 16-byte aligned, with kUnroll loads in flight per thread (NVLink reads need many; the
// one-shot path, small parts, keeps its 4).
template <typename T, int kUnroll = kTwoPhaseCopyUnroll, bool kReadOnly = false>
__device__ void cta_copy(T* dst, const T* src, int64_t n) {
  using Raw = typename Elem<T>::Raw;
  constexpr int kEpv = kVecBytes / sizeof(T);
  const int tid = threadIdx.x, nt = blockDim.x;
  int64_t done = 0;
  if (aligned16(dst) && aligned16(src)) {
    const int64_t nv = n / kEpv;
    const uint4* s = reinterpret_cast<const uint4*>(src);
    uint4* o = reinterpret_cast<uint4*>(dst);
    int64_t i = tid;
    for (; i + (kUnroll - 1) * nt < nv; i += kUnroll * nt) {
      uint4 v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) v[u] = ld_vec<kReadOnly>(s + i + u * nt);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) o[i + u * nt] = v[u];
    }
    for (; i < nv; i += nt) o[i] = ld_vec<kReadOnly>(s + i);
    done = nv * kEpv;
  }
  const Raw* s = reinterpret_cast<const Raw*>(src);
  Raw* o = reinterpret_cast<Raw*>(dst);
  for (int64_t i = done + tid; i < n; i += nt) o[i] = __ldcg(s + i);
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
    reinterpret_cast<uint2*>(dst)[i] = make_uint2(Elem<__nv_bfloat16>::pack2(acc[0], acc[1]),
                                                  Elem<__nv_bfloat16>::pack2(acc[2], acc[3]));
    if (dst2 != nullptr) reinterpret_cast<uint4*>(dst2)[i] = Elem<float>::pack(acc);
  }
};

// Vector part of cta_reduce with the source count NS known at compile time: kRedUnroll
// vectors per source per thread are loaded before the first add, so a thread keeps
// NS * kRedUnroll independent 16-byte loads in flight (NVLink reads need many).
#ifndef FC_RED_UNROLL
#define FC_RED_UNROLL 2
#endif
constexpr int kTwoPhaseRedUnroll = FC_RED_UNROLL;
template <typename T, typename Out, int NS, int kRedUnroll>
__device__ __forceinline__ void cta_reduce_vec(Out* dst, T* dst2, const T* const* src,
                                               int64_t nv) {
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
      for (int k = 0; k < NS; ++k) v[u][k] = ld_vec<true>(s[k] + i + u * nt);
#pragma unroll
    for (int u = 0; u < kRedUnroll; ++u) {
      float acc[kEpv];
#pragma unroll
      for (int e = 0; e < kEpv; ++e) acc[e] = 0.f;
#pragma unroll
      for (int k = 0; k < NS; ++k) Elem<T>::add_vec(acc, v[u][k]);
      VecOut<T, Out>::put(dst, dst2, i + u * nt, acc);
    }
  }
  for (; i < nv; i += nt) {
    uint4 v[NS];
#pragma unroll
    for (int k = 0; k < NS; ++k) v[k] = ld_vec<true>(s[k] + i);
    float acc[kEpv];
#pragma unroll
    for (int e = 0; e < kEpv; ++e) acc[e] = 0.f;
#pragma unroll
    for (int k = 0; k < NS; ++k) Elem<T>::add_vec(acc, v[k]);
    VecOut<T, Out>::put(dst, dst2, i, acc);
  }
}

// True when the vector paths may run: every source 16-byte aligned, dst aligned for Out's
// vectors, dst2 (if set) 16-byte aligned.
template <typename T, typename Out>
__device__ __forceinline__ bool reduce_vectorizable(const Out* dst, const T* dst2,
                                                    const T* const* src, int nsrc) {
  bool vec = (reinterpret_cast<uintptr_t>(dst) & (VecOut<T, Out>::kAlign - 1)) == 0 &&
             (dst2 == nullptr || aligned16(dst2));
  for (int s = 0; s < nsrc; ++s) vec = vec && aligned16(src[s]);
  return vec;
}

// dst[i] (and dst2[i] if set) = sum over s of src[s][i], in fp32, s = 0..nsrc-1 in order,
// stored as Out in dst (T, or bf16 from fp32 inputs) and as T in dst2.
// U: vectors per source in flight per thread (used by the two-phase kernel).
template <typename T, int U, typename Out = T>
__device__ void cta_reduce(Out* dst, T* dst2, const T* const* src, int nsrc, int64_t n) {
  constexpr int kEpv = kVecBytes / sizeof(T);
  const int tid = threadIdx.x, nt = blockDim.x;
  int64_t done = 0;
  if (reduce_vectorizable(dst, dst2, src, nsrc)) {
    const int64_t nv = n / kEpv;
    switch (nsrc) {
      case 1: cta_reduce_vec<T, Out, 1, U>(dst, dst2, src, nv); break;
      case 2: cta_reduce_vec<T, Out, 2, U>(dst, dst2, src, nv); break;
      case 3: cta_reduce_vec<T, Out, 3, U>(dst, dst2, src, nv); break;
      case 4: cta_reduce_vec<T, Out, 4, U>(dst, dst2, src, nv); break;
      case 5: cta_reduce_vec<T, Out, 5, U>(dst, dst2, src, nv); break;
      case 6: cta_reduce_vec<T, Out, 6, U>(dst, dst2, src, nv); break;
      case 7: cta_reduce_vec<T, Out, 7, U>(dst, dst2, src, nv); break;
      default: cta_reduce_vec<T, Out, 8, U>(dst, dst2, src, nv); break;
    }
    done = nv * kEpv;
  }
  for (int64_t i = done + tid; i < n; i += nt) {
    float acc = 0.f;
    for (int s = 0; s < nsrc; ++s) acc += Elem<T>::load(src[s] + i);
    Elem<Out>::store(dst + i, acc);
    if (dst2 != nullptr) Elem<T>::store(dst2 + i, acc);
  }
}

// One-shot's reduction (local staging, small parts): one vector per source in flight, the source
// count a run-time value. Same result as cta_reduce.
template <typename T, typename Out = T>
__device__ void cta_reduce_small(Out* dst, T* dst2, const T* const* src, int nsrc, int64_t n) {
  constexpr int kEpv = kVecBytes / sizeof(T);
  const int tid = threadIdx.x, nt = blockDim.x;
  int64_t done = 0;
  if (reduce_vectorizable(dst, dst2, src, nsrc)) {
    const int64_t nv = n / kEpv;
    for (int64_t i = tid; i < nv; i += nt) {
      uint4 v[kCommMaxRanks];
#pragma unroll
      for (int s = 0; s < kCommMaxRanks; ++s)
        if (s < nsrc) v[s] = __ldcg(reinterpret_cast<const uint4*>(src[s]) + i);
      float acc[kEpv];
#pragma unroll
      for (int k = 0; k < kEpv; ++k) acc[k] = 0.f;
#pragma unroll
      for (int s = 0; s < kCommMaxRanks; ++s)
        if (s < nsrc) Elem<T>::add_vec(acc, v[s]);
      VecOut<T, Out>::put(dst, dst2, i, acc);
    }
    done = nv * kEpv;
  }
  for (int64_t i = done + tid; i < n; i += nt) {
    float acc = 0.f;
    for (int s = 0; s < nsrc; ++s) acc += Elem<T>::load(src[s] + i);
    Elem<Out>::store(dst + i, acc);
    if (dst2 != nullptr) Elem<T>::store(dst2 + i, acc);
  }
}

struct Params {
  CollectiveArgs a;
  int64_t chunk;  // two-phase, pipelined: elements per work item (multiple of the vector width)
  int pull_ctas;  // two-phase: CTAs [0, pull_ctas) read peers; the rest copy the local segment.
                  // pipelined kernel: the producer CTAs
  int consumers;  // pipelined kernel: CTAs [pull_ctas, pull_ctas + consumers)
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
__device__ __forceinline__ uint64_t enter_collective(const CommDevice& d) {
  pdl_wait();
  pdl_release_dependents();
  return comm_launch_epoch(d);
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
__device__ __forceinline__ void finish_with_end_barrier(const CommDevice& d, uint64_t epoch,
                                                        CommOp op) {
  comm_publish_fence();
  if (threadIdx.x == 0 && comm_last_cta(&comm_control(d)->exit_count)) {
    const int r = d.rank, W = d.world;
    comm_signal_peers(d, [&](CommFlags* f) { return &f->done[r]; }, epoch);
    CommFlags* const mine = comm_flags(d, r);
    for (int i = 1; i < W; ++i) {
      const int p = (r + i) % W;
      if (!comm_wait_flag(d, &mine->done[p], epoch, static_cast<uint32_t>(op), kCommStepDone, p))
        break;
    }
    *reinterpret_cast<volatile uint64_t*>(&comm_control(d)->epoch) = epoch;
  }
}

// ---- one-shot: push, one flag per (source, CTA), reduce/copy from local staging -------------
// Out: the reductions' output type (T, or bf16 for fp32 reduceScatter with out_bf16).
// (__launch_bounds__(kThreads, 1) asks for one resident CTA per SM, which lets ptxas use the
// registers it needs; with (kThreads) alone it held the bf16 instance to 64 and spilled.)
template <typename T, typename Out = T>
__global__ void __launch_bounds__(kThreads, 1) one_shot_kernel(CommDevice d, Params prm) {
  const CollectiveArgs& a = prm.a;
  constexpr int kEpv = kVecBytes / sizeof(T);
  const uint64_t epoch = enter_collective(d);
  const uint64_t par = epoch & 1;
  const int W = d.world, r = d.rank, G = gridDim.x, c = blockIdx.x;
  const T* in = static_cast<const T*>(a.input);  // the launcher sets it (data area or not)
  T* out = static_cast<T*>(a.output);
  const int64_t count = a.count;
  const int64_t n_r = split_count(count, W, r);
  int64_t b, e;
  // CTA 0's ready flags are its first releases: its thread 0 publishes the signature first.
  if (c == 0 && threadIdx.x == 0) comm_publish_signature(d, epoch);

  // 1. Push this CTA's part to every peer's slot [par][r].
  for (int i = 1; i < W; ++i) {
    const int p = (r + i) % W;
    T* dst = slot_of<T>(d, p, par, r);
    switch (a.op) {
      case CommOp::kAllReduce:
        part_range(count, G, c, kEpv, b, e);
        cta_copy<T, kOneShotCopyUnroll>(dst + b, in + b, e - b);
        break;
      case CommOp::kAllGather:
        part_range(n_r, G, c, kEpv, b, e);
        cta_copy<T, kOneShotCopyUnroll>(dst + b, in + b, e - b);
        break;
      case CommOp::kReduceScatter:
      case CommOp::kAllToAll: {
        const int64_t n_p = split_count(count, W, p);
        part_range(n_p, G, c, kEpv, b, e);
        cta_copy<T, kOneShotCopyUnroll>(dst + b, in + split_offset(count, W, p) + b, e - b);
        break;
      }
    }
  }
  // Local parts that need no peer.
  if (a.op == CommOp::kAllGather) {
    part_range(n_r, G, c, kEpv, b, e);
    cta_copy<T, kOneShotCopyUnroll>(out + split_offset(count, W, r) + b, in + b, e - b);
  } else if (a.op == CommOp::kAllToAll) {
    part_range(n_r, G, c, kEpv, b, e);
    cta_copy<T, kOneShotCopyUnroll>(out + r * n_r + b, in + split_offset(count, W, r) + b, e - b);
  }
  // 2. Publish: flags ready[r][c] in every peer (ordering: CommFlags::ready). Alone (W = 1)
  // there is no peer to publish to, and the system fence would only cost time.
  if (W > 1) {
    comm_publish_fence();
    if (threadIdx.x == 0) {
      comm_signal_peers(d, [&](CommFlags* f) { return &f->ready[r][c]; }, epoch);
    }
  }
  // 3. Wait for every peer's CTA c, then combine from local staging.
  const bool ok = comm_wait_peers(d, &comm_flags(d, r)->ready[0][c], kCommMaxOneShotCtas, epoch,
                                  a.op, kCommStepReady, c == 0);
  if (ok) {
    switch (a.op) {
      case CommOp::kAllReduce:
      case CommOp::kReduceScatter: {
        const bool ar = a.op == CommOp::kAllReduce;
        const int64_t n = ar ? count : n_r;
        part_range(n, G, c, kEpv, b, e);
        const T* srcs[kCommMaxRanks];
        for (int p = 0; p < W; ++p) {
          srcs[p] = (p == r ? (ar ? in : in + split_offset(count, W, r)) : slot_of<T>(d, r, par, p)) + b;
        }
        cta_reduce_small<T, Out>(static_cast<Out*>(a.output) + b, nullptr, srcs, W, e - b);
        break;
      }
      case CommOp::kAllGather:
        for (int p = 0; p < W; ++p) {
          if (p == r) continue;
          part_range(split_count(count, W, p), G, c, kEpv, b, e);
          cta_copy<T, kOneShotCopyUnroll>(out + split_offset(count, W, p) + b, slot_of<T>(d, r, par, p) + b, e - b);
        }
        break;
      case CommOp::kAllToAll:
        part_range(n_r, G, c, kEpv, b, e);
        for (int p = 0; p < W; ++p) {
          if (p == r) continue;
          cta_copy<T, kOneShotCopyUnroll>(out + p * n_r + b, slot_of<T>(d, r, par, p) + b, e - b);
        }
        break;
    }
  }
  finish_launch(d, epoch);
}

// ---- two-phase: start barrier, pull (allReduce: reduce-scatter, grid barrier, all-gather),
// end barrier --------------------------------------------------------------------------------

// Work items: the W-1 peers' segments, interleaved chunk by chunk (item k reads peer
// (r + 1 + k % (W-1)) % W, so at any moment the pulling CTAs read from all peers), and, unless
// skip_self, this rank's own segment (local copies). With pull_ctas < gridDim.x, CTAs
// [0, pull_ctas) take the remote items and the others the local ones, concurrently (fewer
// CTAs pulling over NVLink was faster on 4 x H200: too many reads in flight congest the links);
// otherwise every CTA takes remote items first, then local ones.
// Calls f(p, elem_begin, elem_end) for each item of this CTA.
template <typename SegLen, typename F>
__device__ void for_interleaved_chunks(int W, int r, int64_t chunk, SegLen seg_len, F f,
                                       bool skip_self, int pull_ctas) {
  int64_t max_chunks = 0;
  for (int p = 0; p < W; ++p) {
    if (p != r) max_chunks = max(max_chunks, (seg_len(p) + chunk - 1) / chunk);
  }
  const int nseg = W - 1;
  const int64_t remote_items = max_chunks * nseg;
  const int64_t self_items = skip_self ? 0 : (seg_len(r) + chunk - 1) / chunk;
  const int G = gridDim.x, c = blockIdx.x;
  const bool split = pull_ctas < G;
  int64_t k0, k1, step;
  if (!split) {
    k0 = c, k1 = remote_items + self_items, step = G;
  } else if (c < pull_ctas) {
    k0 = c, k1 = remote_items, step = pull_ctas;
  } else {
    k0 = remote_items + (c - pull_ctas), k1 = remote_items + self_items, step = G - pull_ctas;
  }
  for (int64_t k = k0; k < k1; k += step) {
    int p;
    int64_t b;
    if (k < remote_items) {
      p = (r + 1 + static_cast<int>(k % nseg)) % W;
      b = (k / nseg) * chunk;
    } else {
      p = r;
      b = (k - remote_items) * chunk;
    }
    const int64_t n = seg_len(p);
    if (b >= n) continue;
    f(p, b, min(b + chunk, n));
  }
}

#ifndef FC_TP_CTAS_PER_SM
#define FC_TP_CTAS_PER_SM 1
#endif
constexpr int kTwoPhaseCtasPerSm = FC_TP_CTAS_PER_SM;  // resident by the launch bounds

template <typename T, typename Out = T>  // Out: as one_shot_kernel
__global__ void __launch_bounds__(kThreads, kTwoPhaseCtasPerSm) two_phase_kernel(CommDevice d, Params prm) {
  const CollectiveArgs& a = prm.a;
  const uint64_t epoch = enter_collective(d);
  const int W = d.world, r = d.rank;
  const int64_t count = a.count, chunk = prm.chunk;
  T* out = static_cast<T*>(a.output);
  CommFlags* mine = comm_flags(d, r);

  // Start barrier (ordering: CommFlags::arrive). Stream order makes this rank's input, written
  // by earlier work on the stream, precede the kernel; the fence publishes it at system scope.
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    comm_publish_signature(d, epoch);
    __threadfence_system();
    comm_signal_peers(d, [&](CommFlags* f) { return &f->arrive[r]; }, epoch);
  }
  bool ok = comm_wait_peers(d, mine->arrive, 1, epoch, a.op, kCommStepArrive, blockIdx.x == 0);

  const int64_t n_r = split_count(count, W, r);
  if (ok) {
    switch (a.op) {
      case CommOp::kAllGather:
        for_interleaved_chunks(
            W, r, chunk, [&](int p) { return split_count(count, W, p); },
            [&](int p, int64_t b, int64_t e) {
              cta_copy<T, kTwoPhaseCopyUnroll, kDataReadOnly>(out + split_offset(count, W, p) + b,
                                                     data_of<T>(d, a, p) + b, e - b);
            },
            false, prm.pull_ctas);
        break;
      case CommOp::kAllToAll:
        for_interleaved_chunks(
            W, r, chunk, [&](int) { return n_r; },
            [&](int p, int64_t b, int64_t e) {
              cta_copy<T, kTwoPhaseCopyUnroll, kDataReadOnly>(
                  out + p * n_r + b, data_of<T>(d, a, p) + split_offset(count, W, r) + b, e - b);
            },
            false, prm.pull_ctas);
        break;
      case CommOp::kReduceScatter:
      case CommOp::kAllReduce: {
        const bool ar = a.op == CommOp::kAllReduce;
        const int64_t off_r = split_offset(count, W, r);
        T* scratch_r = reinterpret_cast<T*>(d.base[r] + d.scratch_offset) + off_r;
        Out* dst = static_cast<Out*>(a.output) + (ar ? off_r : 0);
        for (int64_t b = blockIdx.x * chunk; b < n_r; b += gridDim.x * chunk) {
          const int64_t e = min(b + chunk, n_r);
          const T* srcs[kCommMaxRanks];
          for (int p = 0; p < W; ++p) srcs[p] = data_of<T>(d, a, p) + off_r + b;
          cta_reduce<T, kTwoPhaseRedUnroll, Out>(dst + b, ar ? scratch_r + b : nullptr, srcs, W,
                                                 e - b);
        }
        if (!ar) break;
        // Grid barrier + publish (ordering: CommFlags::phase).
        comm_publish_fence();
        if (threadIdx.x == 0 && comm_last_cta(&comm_control(d)->phase_count)) {
          comm_signal_peers(d, [&](CommFlags* f) { return &f->phase[r]; }, epoch);
        }
        ok = comm_wait_peers(d, mine->phase, 1, epoch, a.op, kCommStepPhase);
        if (!ok) break;
        for_interleaved_chunks(
            W, r, chunk, [&](int p) { return split_count(count, W, p); },
            [&](int p, int64_t b, int64_t e) {
              const int64_t off_p = split_offset(count, W, p);
              const T* src = reinterpret_cast<const T*>(d.base[p] + d.scratch_offset) + off_p;
              cta_copy(out + off_p + b, src + b, e - b);
            },
            true, prm.pull_ctas);
        break;
      }
    }
  }
  finish_with_end_barrier(d, epoch, a.op);
}

// ---- chunk-pipelined variants (kTwoPhasePush, kPipelined): per-chunk flags ---------------------
//
// CTAs [0, P) produce, [P, P + C) consume (collectives.h). Inside every CTA warp 0 is the
// control warp (flag waits and releases) and warps 1.. move data, so that neither a release's
// fence.sc.sys (it waits for the CTA's remote stores to be acknowledged) nor a flag acquire
// sits on the data path: in loop iteration j the data warps work on round j while the control
// warp releases round j - 1 (producers) or acquires the flags of round j + 1 (consumers); one
// bar.sync ends the iteration. Ordering: round j's stores (data warps) -> bar.sync -> thread 0
// fence.sc.sys + st.release.sys (next iteration); acquire (control lane) -> bar.sync -> reads
// of round j + 1 (next iteration). See CommFlags::pipe.

constexpr int kCtl = 32;  // control warp
// Direct allReduce diagnostics (wrong results; bench only): 1 = producers move no data (flags
// only: the reducers' half alone), 2 = reducers store only locally (the producers' half and
// the local reduction).
#ifndef FC_DIRECT_DIAG
#define FC_DIRECT_DIAG 0
#endif
constexpr int kDirectDiag = FC_DIRECT_DIAG;
#ifndef FC_PIPE_COPY_UNROLL
#define FC_PIPE_COPY_UNROLL 8
#endif
#ifndef FC_PIPE_RED_LOADS  // 16-byte loads in flight per data thread in a reduction
#define FC_PIPE_RED_LOADS 8
#endif

__device__ __forceinline__ uint64_t pipe_tag(uint64_t epoch, int64_t rounds_done) {
  return (epoch << kCommPipeRoundBits) | static_cast<uint64_t>(rounds_done);
}

// Where a pipelined copy / reduction stores: an optional local pointer, plus the same byte
// offset in the regions of the ranks in peer_order (remote stores, or this rank's own scratch).
struct Dests {
  uint8_t* local;
  uint32_t peer_order;  // rank_order(mask of ranks, this rank)
  uint64_t peer_off;
};
// A rank mask laid out so that the lowest set bit first visits ranks r+1, r+2, ... then 0,
// 1, ...: every rank stores to a different peer first (bit p, or bit p + 8 for p <= r).
static_assert((kCommMaxRanks & (kCommMaxRanks - 1)) == 0 && 2 * kCommMaxRanks <= 32, "rank_order");
__device__ __forceinline__ uint32_t rank_order(uint32_t mask, int r) {
  const uint32_t upto = (2u << r) - 1u;
  return (mask & ~upto) | ((mask & upto) << kCommMaxRanks);
}
__device__ __forceinline__ bool dests_aligned16(const Dests& ds) {
  return (reinterpret_cast<uintptr_t>(ds.local) & 15) == 0 && (ds.peer_off & 15) == 0;
}
// The peer loop stays rolled (region bases read from the parameter space per store): unrolled,
// eight hoisted bases per batch of stores pushed the reductions over 128 registers.
template <typename V>
__device__ __forceinline__ void dests_store(const CommDevice& d, const Dests& ds, int64_t i, V v) {
  if (ds.local != nullptr) reinterpret_cast<V*>(ds.local)[i] = v;
#pragma unroll 1
  for (uint32_t m = ds.peer_order; m != 0; m &= m - 1) {
    reinterpret_cast<V*>(d.base[(__ffs(m) - 1) & (kCommMaxRanks - 1)] + ds.peer_off)[i] = v;
  }
}

// Data warps: n elements from src to every destination. FC_PIPE_COPY_UNROLL vectors in flight
// per thread, the last batch predicated (no serial tail loop on NVLink latency).
template <typename T, bool kReadOnly>
__device__ __forceinline__ void pipe_copy(const CommDevice& d, const uint8_t* src,
                                          const Dests& ds, int64_t n) {
  using Raw = typename Elem<T>::Raw;
  constexpr int kEpv = kVecBytes / sizeof(T);
  constexpr int U = FC_PIPE_COPY_UNROLL;
  const int tid = threadIdx.x - kCtl, nt = blockDim.x - kCtl;
  int64_t done = 0;
  if (aligned16(src) && dests_aligned16(ds)) {
    const int64_t nv = n / kEpv;
    const uint4* s = reinterpret_cast<const uint4*>(src);
    for (int64_t i = tid; i < nv; i += static_cast<int64_t>(U) * nt) {
      uint4 v[U];
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (i + u * nt < nv) v[u] = ld_vec<kReadOnly>(s + i + u * nt);
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (i + u * nt < nv) dests_store(d, ds, i + u * nt, v[u]);
    }
    done = nv * kEpv;
  }
  const Raw* s = reinterpret_cast<const Raw*>(src);
  for (int64_t i = done + tid; i < n; i += nt) dests_store(d, ds, i, static_cast<Raw>(__ldcg(s + i)));
}

// Data warps: element-wise fp32 sum of the ns <= NS sources (src(k): chunk start of source k,
// rank order) rounded once, to every destination. NS is a compile-time bucket (2, 4, 8) with
// the sources past ns predicated off, so a kernel holds one instantiation (a switch over eight
// inlined source counts pushed the kernel past 128 registers). NS * U loads in flight.
template <typename T, int NS, bool kReadOnly, typename Src>
__device__ __forceinline__ void pipe_reduce(const CommDevice& d, int ns, Src src, const Dests& ds,
                                            int64_t n) {
  constexpr int kEpv = kVecBytes / sizeof(T);
  constexpr int U = NS >= FC_PIPE_RED_LOADS ? 1 : FC_PIPE_RED_LOADS / NS;
  const int tid = threadIdx.x - kCtl, nt = blockDim.x - kCtl;
  bool vec = dests_aligned16(ds);
  for (int k = 0; k < ns; ++k) vec = vec && aligned16(src(k));
  int64_t done = 0;
  if (vec) {
    const int64_t nv = n / kEpv;
    for (int64_t i = tid; i < nv; i += static_cast<int64_t>(U) * nt) {
      uint4 v[U][NS];
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (i + u * nt < nv) {
#pragma unroll
          for (int k = 0; k < NS; ++k)
            if (k < ns) {
              v[u][k] = ld_vec<kReadOnly>(reinterpret_cast<const uint4*>(src(k)) + i + u * nt);
            }
        }
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (i + u * nt < nv) {
          float acc[kEpv];
#pragma unroll
          for (int e = 0; e < kEpv; ++e) acc[e] = 0.f;
#pragma unroll
          for (int k = 0; k < NS; ++k)
            if (k < ns) Elem<T>::add_vec(acc, v[u][k]);
          dests_store(d, ds, i + u * nt, Elem<T>::pack(acc));
        }
    }
    done = nv * kEpv;
  }
  for (int64_t i = done + tid; i < n; i += nt) {
    float acc = 0.f;
    for (int k = 0; k < ns; ++k) acc += Elem<T>::load(reinterpret_cast<const T*>(src(k)) + i);
    T t;
    Elem<T>::store(&t, acc);
    dests_store(d, ds, i, *reinterpret_cast<const typename Elem<T>::Raw*>(&t));
  }
}

// The round loop of a pipelined CTA (all threads). acquire(j): control warp, all lanes,
// returns (warp-uniformly) whether round j's inputs are observed; work(j): data warps;
// release(j): control warp (thread 0 acts) publishes round j. Returns false, to every
// thread, if an acquire gave up.
template <typename Acquire, typename Work, typename Release>
__device__ __forceinline__ bool pipe_rounds(int rounds, Acquire acquire, Work work,
                                            Release release) {
  __shared__ int s_ok[2];  // [round parity]: written by thread 0 one iteration ahead
  const bool ctl = threadIdx.x < kCtl;
  if (ctl) {
    const bool ok = rounds > 0 ? acquire(0) : true;
    if (threadIdx.x == 0) s_ok[0] = ok;
  }
  __syncthreads();
  int j = 0;
  for (; j < rounds; ++j) {
    if (!s_ok[j & 1]) break;  // every thread reads it after the same barrier
    if (ctl) {
      if (j > 0) release(j - 1);
      const bool ok = j + 1 < rounds ? acquire(j + 1) : true;
      if (threadIdx.x == 0) s_ok[(j + 1) & 1] = ok;  // last read before the previous barrier
    } else {
      work(j);
    }
    __syncthreads();
  }
  if (j < rounds) return false;
  if (ctl && rounds > 0) release(rounds - 1);
  return true;
}

// One kernel per (dtype, op, push or pull, source-count bucket NS >= world for the reducing
// ops): each holds a single data path (all of them in one kernel spilled).
// kDirect (allReduce in place, CommAlgo::kDirect): producers push block p of the input into
// owner p's scratch slot as the push reduceScatter does; each consumer reduces chunks of this
// rank's block from its input and the slots, and stores the sums into the data area of every
// rank (its own included) at the block's place; an end barrier (CommFlags::done) then says
// every peer's stores into this rank's data area are complete. Only stores cross NVLink.
template <typename T, CommOp kOp, bool kPush, int NS, bool kDirect = false>
__global__ void __launch_bounds__(kThreads, 1)
    pipe_kernel(const __grid_constant__ CommDevice d, const __grid_constant__ Params prm) {
  const CollectiveArgs& a = prm.a;
  const uint64_t epoch = enter_collective(d);
  const int W = d.world, r = d.rank;
  const int P = prm.pull_ctas, C = prm.consumers;
  constexpr bool push = kPush;
  constexpr CommOp op = kOp;
  static_assert(!kDirect || (op == CommOp::kAllReduce && kPush), "direct: allReduce only");
  constexpr bool blocks = kDirect || op == CommOp::kReduceScatter || op == CommOp::kAllToAll;
  constexpr int64_t es = sizeof(T);
  const int64_t count = a.count, chunk = prm.chunk;
  const int64_t n_r = split_count(count, W, r), off_r = split_offset(count, W, r);
  const int64_t n_0 = split_count(count, W, 0);  // the longest slice / block
  const uint64_t in_off = d.data_offset + a.in_offset;  // input's byte offset in every region
  uint8_t* const out = static_cast<uint8_t*>(a.output);
  CommFlags* const mine = comm_flags(d, r);
  const uint32_t peers = ((1u << W) - 1u) & ~(1u << r);
  auto nch = [&](int64_t len) { return (len + chunk - 1) / chunk; };
  // Element offset of source `src`'s slot in receiver `recv`'s scratch (push RS / A2A).
  auto slot = [&](int recv, int src) {
    return static_cast<int64_t>((src - recv - 1 + W) % W) * prm.slot_stride;
  };
  auto rounds_of = [&](int64_t chunks, int first) {
    return static_cast<int>(chunks > first ? (chunks - first + P - 1) / P : 0);
  };
  bool ok = true;

  if (static_cast<int>(blockIdx.x) < P) {
    // ---- producer c: start barrier (CommFlags::arrive), then rounds of chunks c + j * P.
    const int c = blockIdx.x;
    if (c == 0 && threadIdx.x == 0) {
      comm_publish_signature(d, epoch);
      __threadfence_system();
      comm_signal_peers(d, [&](CommFlags* f) { return &f->arrive[r]; }, epoch);
    }
    ok = comm_wait_peers(d, mine->arrive, 1, epoch, op, kCommStepArrive, c == 0);
    if (ok) {
      // RS / A2A push block p (<= n_0 long) to every peer p; AR / AG handle this rank's slice.
      const int rounds = rounds_of(nch(blocks ? n_0 : n_r), c);
      auto work = [&](int j) {
        const int64_t k = c + static_cast<int64_t>(j) * P, b = k * chunk;
        if constexpr (!blocks) {
          if (k >= nch(n_r)) return;
          const int64_t n = min(chunk, n_r - b);
          const uint64_t pos = (off_r + b) * es;  // the slice's place in output and scratch
          const Dests ds{out + pos, rank_order(push ? peers : (1u << r), r),
                         d.scratch_offset + pos};
          if constexpr (op == CommOp::kAllReduce) {
            const uint64_t so = in_off + pos;
            pipe_reduce<T, NS, true>(d, W, [&](int s) { return d.base[s] + so; }, ds, n);
          } else {  // allGather (push): this rank's block
            pipe_copy<T, true>(d, d.base[r] + in_off + b * es, ds, n);
          }
        } else {
        for (int i = 1; i < W; ++i) {
          const int p = (r + i) % W;
          const int64_t n_p = split_count(count, W, p);
          if (k >= nch(n_p) || (kDirect && kDirectDiag == 1)) continue;
          const Dests ds{nullptr, rank_order(1u << p, r), d.scratch_offset + (slot(p, r) + b) * es};
          pipe_copy<T, true>(d, d.base[r] + in_off + (split_offset(count, W, p) + b) * es, ds,
                             min(chunk, n_p - b));
        }
        if (op == CommOp::kAllToAll && k < nch(n_r)) {
          const Dests ds{out + (r * n_r + b) * es, 0u, 0};
          pipe_copy<T, true>(d, d.base[r] + in_off + (off_r + b) * es, ds, min(chunk, n_r - b));
        }
        }
      };
      auto release = [&](int j) {
        if (threadIdx.x == 0) {
          __threadfence_system();
          comm_signal_peers(d, [&](CommFlags* f) { return &f->pipe[r][c]; },
                            pipe_tag(epoch, j + 1));
        }
      };
      pipe_rounds(rounds, [](int) { return true; }, work, release);
    }
  } else {
    // ---- consumer q: chunks of producers c = q, q + C, ... (< P) of every peer.
    const int q = blockIdx.x - P;
    const int ncov = (P - q + C - 1) / C;
    // Length whose chunks source s's producers release to this rank.
    auto seg = [&](int s) { return blocks ? n_r : split_count(count, W, s); };
    const int rounds = rounds_of(nch(n_0), q);
    auto acquire = [&](int j) {
      bool good = true;
      const int npeer = W - 1;
      for (int idx = threadIdx.x; good && idx < ncov * npeer; idx += kCtl) {
        const int c = q + (idx / npeer) * C;
        const int s = (r + 1 + idx % npeer) % W;
        if (c + static_cast<int64_t>(j) * P < nch(seg(s))) {
          good = comm_wait_flag_inline(d, &mine->pipe[s][c], pipe_tag(epoch, j + 1),
                                       static_cast<uint32_t>(op), kCommStepChunk, s);
        }
      }
      return __all_sync(0xffffffffu, good);
    };
    auto work = [&](int j) {
      for (int ci = 0; ci < ncov; ++ci) {
        const int64_t k = q + ci * C + static_cast<int64_t>(j) * P, b = k * chunk;
        if constexpr (kDirect) {
          // This rank's block, chunk k: the sum (rank order) of its own input there and the
          // peers' blocks in the slots, into every rank's data area at the same place. The
          // own input is overwritten by the thread that read it (pipe_reduce loads before it
          // stores); peer p's copy of this chunk was already pushed here (its chunk flag).
          if (k >= nch(n_r)) continue;
          const uint64_t pos = in_off + (off_r + b) * es;
          const uint8_t* own = d.base[r] + pos;
          const uint8_t* scr = d.base[r] + d.scratch_offset + b * es;
          pipe_reduce<T, NS, false>(
              d, W, [&](int s) { return s == r ? own : scr + slot(r, s) * es; },
              Dests{d.base[r] + pos, kDirectDiag == 2 ? 0u : rank_order(peers, r), pos},
              min(chunk, n_r - b));
        } else if constexpr (op == CommOp::kReduceScatter) {
          if (k >= nch(n_r)) continue;
          const uint8_t* own = d.base[r] + in_off + (off_r + b) * es;
          const uint8_t* scr = d.base[r] + d.scratch_offset + b * es;
          pipe_reduce<T, NS, false>(
              d, W, [&](int s) { return s == r ? own : scr + slot(r, s) * es; },
              Dests{out + b * es, 0u, 0}, min(chunk, n_r - b));
        } else {
        for (int i = 1; i < W; ++i) {
          const int s = (r + i) % W;
          if constexpr (op == CommOp::kAllToAll) {
            if (k >= nch(n_r)) continue;
            pipe_copy<T, false>(d, d.base[r] + d.scratch_offset + (slot(r, s) + b) * es,
                                Dests{out + (s * n_r + b) * es, 0u, 0}, min(chunk, n_r - b));
          } else {  // allReduce, allGather: slice s at its output position
            const int64_t n_s = split_count(count, W, s);
            if (k >= nch(n_s)) continue;
            const uint64_t pos = (split_offset(count, W, s) + b) * es;
            // push: the peer stored it into this rank's scratch; pipelined: pull it from the
            // peer's own scratch.
            pipe_copy<T, false>(d, d.base[push ? r : s] + d.scratch_offset + pos,
                                Dests{out + pos, 0u, 0}, min(chunk, n_s - b));
          }
        }
        }
      }
    };
    ok = pipe_rounds(rounds, acquire, work, [](int) {});
  }

  if constexpr (push && !kDirect) {
    // No end barrier: every peer's reads of this rank's memory (allReduce's phase-1 loads of
    // the input) precede the chunk flags this rank's consumers have acquired (CommFlags::pipe).
    finish_launch(d, epoch);
    return;
  }
  // End barrier. Pipelined: peers read this rank's scratch. Direct: no peer reads this rank's
  // memory, but the peers' reducers store into its data area (the output); done[p] >= epoch
  // says all of p's CTAs, those stores included, are done.
  finish_with_end_barrier(d, epoch, op);
  (void)ok;
}

// CTAs that pull from peers in the two-phase kernels, by world size (tuned on 4 x H200: more
// CTAs keep more NVLink reads outstanding and go slower). Tuning sweeps rebuild with
// -DFC_PULL_CTAS_W2=N / -DFC_PULL_CTAS_W4=N (bench/collectives/variants.sh); the library reads no
// environment variables.
#ifndef FC_PULL_CTAS_W2
#define FC_PULL_CTAS_W2 64
#endif
#ifndef FC_PULL_CTAS_W4  // world >= 3
#define FC_PULL_CTAS_W4 48
#endif
int two_phase_pull_ctas(int world) { return world <= 2 ? FC_PULL_CTAS_W2 : FC_PULL_CTAS_W4; }

// Pipelined variants' defaults (rebuild with -D to sweep; CollectiveArgs::num_ctas and
// chunk_bytes override producers and chunk at run time). push: producers pull-reduce and push,
// 1 consumer (local copies) per FC_PUSH_COPY_DIV producers; pipelined: as many consumers
// (pulls of peers' scratch) as producers, so that about as many CTAs pull as in two-phase.
#ifndef FC_PUSH_PRODUCERS_W2
#define FC_PUSH_PRODUCERS_W2 64
#endif
#ifndef FC_PUSH_PRODUCERS_W4  // world >= 3
#define FC_PUSH_PRODUCERS_W4 48
#endif
#ifndef FC_PUSH_COPY_DIV
#define FC_PUSH_COPY_DIV 2
#endif
#ifndef FC_PIPE_PRODUCERS_W2
#define FC_PIPE_PRODUCERS_W2 32
#endif
#ifndef FC_PIPE_PRODUCERS_W4
#define FC_PIPE_PRODUCERS_W4 24
#endif
#ifndef FC_PIPE_CHUNK_KIB
#define FC_PIPE_CHUNK_KIB 64
#endif
// Direct allReduce: producers, and reducers as a percentage of them. Both halves only store
// over NVLink; the store-only probe (bench/probes/ar_store_probe.cu) needed 96-132 CTAs. With
// 128 + 128 (more CTAs than SMs: the producers take the SMs first, the reducers follow as they
// finish, so the two halves run nearly one after the other, each on every SM) the kernel
// matched the probe on 2 x H200 (run 12, results/run12_h200x2/direct_tune_w2.txt, 128 KiB
// chunks: 341 / 358 / 365 GB/s busbw at 64 MiB / 256 MiB / 1 GiB, the probe's direct
// 335 / 353 / 363; 64 + 64: 315 / 327 / 353; 96 + 96: 329 / 350 / 352). Producers never wait
// for reducers, so the reducers need not be resident with them.
#ifndef FC_DIRECT_PRODUCERS
#define FC_DIRECT_PRODUCERS 128
#endif
#ifndef FC_DIRECT_REDUCERS_PCT
#define FC_DIRECT_REDUCERS_PCT 100
#endif

// kAuto's push allReduce (collective_choose_algo): from this size, with these chunks.
constexpr int64_t kAutoPushMinBytes = int64_t{256} << 20;
constexpr int64_t kAutoPushChunkBytes = int64_t{128} << 10;
// kAuto's direct allReduce (in place only): from this size at W = 2 and at W >= 3, with the
// default chunk (FC_PIPE_CHUNK_KIB). 0: never. W = 2: on
// 2 x H200 (2026-11-27, kernels/bench/results/run12_h200x2/direct_ab_w2.txt, one run) direct
// with 64 + 64 CTAs and 128 KiB chunks moved 311 / 327 / 352 GB/s busbw at 64 MiB / 256 MiB /
// 1 GiB in place, against two-phase's 300 / 317 / 329 and push's 302 / 330 / 339 (NCCL:
// 267 / 297 / 327); with 128 + 128 CTAs (the default since) 341 / 358 / 365 in a second call
// (direct_tune_w2.txt). Smaller sizes were not measured.
#ifndef FC_AUTO_DIRECT_MIN_MIB_W2
#define FC_AUTO_DIRECT_MIN_MIB_W2 64
#endif
// W >= 3: on 4 x H200 (run 12, results/run12_h200x4/direct_ab_w4.txt) direct with the default
// plan (64 KiB chunks) moved 325 / 339 / 340 GB/s at W = 4 against two-phase's 292 / 317 / 327
// and NCCL's 311 / 338 / 355; with 128 KiB chunks 317 / 332 / 342.
#ifndef FC_AUTO_DIRECT_MIN_MIB_W4
#define FC_AUTO_DIRECT_MIN_MIB_W4 64
#endif

// True when the allReduce's output is its input's place in this rank's data area.
bool in_place(const CommDevice& d, const CollectiveArgs& a) {
  return a.input == nullptr && a.output != nullptr &&
         static_cast<const uint8_t*>(a.output) == d.base[d.rank] + d.data_offset + a.in_offset;
}

int64_t elem_size(CommDtype t) { return t == CommDtype::kBF16 ? 2 : 4; }

// Bytes that one staging slot must hold for a one-shot launch.
int64_t one_shot_payload(const CollectiveArgs& a, int world) {
  const int64_t es = elem_size(a.dtype);
  if (a.op == CommOp::kAllReduce) return a.count * es;
  return split_count(a.count, world, 0) * es;  // the largest block (rank 0's)
}

// Bytes of NVLink traffic per rank of the two-phase algorithm (for the grid / chunk choice).
int64_t two_phase_bytes(const CollectiveArgs& a, int world, int rank) {
  const int64_t es = elem_size(a.dtype);
  switch (a.op) {
    case CommOp::kAllGather:
    case CommOp::kAllToAll: return a.count * es;
    default: return split_count(a.count, world, rank) * es * world;
  }
}

// Every collective kernel starts through here: launched early (early_launch.h), kThreads each.
template <class Kernel>
cudaError_t start_kernel(Kernel kernel, int grid, cudaStream_t stream, const CommDevice& d,
                         const Params& prm) {
  return launch_early(kernel, dim3(grid), dim3(kThreads), 0, stream, d, prm);
}

template <typename T, CommOp kOp, bool kPush, bool kDirect = false>
cudaError_t launch_pipe_ns(const CommDevice& d, const Params& prm, int grid, cudaStream_t stream) {
  if (d.world <= 2) return start_kernel(pipe_kernel<T, kOp, kPush, 2, kDirect>, grid, stream, d, prm);
  if (d.world <= 4) return start_kernel(pipe_kernel<T, kOp, kPush, 4, kDirect>, grid, stream, d, prm);
  return start_kernel(pipe_kernel<T, kOp, kPush, 8, kDirect>, grid, stream, d, prm);
}
template <typename T>
cudaError_t launch_pipe(const CommDevice& d, const Params& prm, int grid, cudaStream_t stream) {
  const bool push = prm.a.algo == CommAlgo::kTwoPhasePush;
  if (prm.a.algo == CommAlgo::kDirect) {
    return launch_pipe_ns<T, CommOp::kAllReduce, true, true>(d, prm, grid, stream);
  }
  switch (prm.a.op) {
    case CommOp::kAllReduce:
      return push ? launch_pipe_ns<T, CommOp::kAllReduce, true>(d, prm, grid, stream)
                  : launch_pipe_ns<T, CommOp::kAllReduce, false>(d, prm, grid, stream);
    case CommOp::kReduceScatter:
      return launch_pipe_ns<T, CommOp::kReduceScatter, true>(d, prm, grid, stream);
    case CommOp::kAllGather:
      return start_kernel(pipe_kernel<T, CommOp::kAllGather, true, 1>, grid, stream, d, prm);
    case CommOp::kAllToAll:
      return start_kernel(pipe_kernel<T, CommOp::kAllToAll, true, 1>, grid, stream, d, prm);
  }
  return cudaErrorInvalidValue;
}

// The pipelined kernel's plan (Params::pull_ctas = producers, consumers, chunk, slot_stride)
// from (op, dtype, count, world, num_ctas, chunk_bytes) only: identical on every rank. Returns
// false if the scratch cannot hold what the peers push.
bool pipe_plan(const CommDevice& d, const CollectiveArgs& a, CommAlgo algo, Params& prm) {
  const int W = d.world;
  const int64_t es = elem_size(a.dtype), epv = kVecBytes / es;
  const bool direct = algo == CommAlgo::kDirect;
  const bool push = algo == CommAlgo::kTwoPhasePush || direct;
  int P = a.num_ctas > 0 ? a.num_ctas
          : direct       ? FC_DIRECT_PRODUCERS
          : push         ? (W <= 2 ? FC_PUSH_PRODUCERS_W2 : FC_PUSH_PRODUCERS_W4)
                         : (W <= 2 ? FC_PIPE_PRODUCERS_W2 : FC_PIPE_PRODUCERS_W4);
  P = std::clamp(P, 1, kCommMaxPipeCtas);
  // The chunk: the target rounded to whole copy batches of the data warps (FC_PIPE_COPY_UNROLL
  // vectors per data thread: one NVLink round trip per chunk in pipe_copy), or to vectors for
  // small targets; spread over all producers when the longest slice / block n_0 has fewer
  // chunks than producers; grown if a producer would exceed kCommPipeMaxRounds rounds.
  const int64_t n0 = split_count(a.count, W, 0);
  const int64_t target = std::max<int64_t>(
      epv, (a.chunk_bytes > 0 ? a.chunk_bytes : int64_t{FC_PIPE_CHUNK_KIB} << 10) / es);
  const int64_t batch = int64_t{kThreads - kCtl} * epv;  // one vector per data thread
  const int64_t copy_batch = batch * FC_PIPE_COPY_UNROLL;
  auto round_up = [](int64_t x, int64_t g) { return (x + g - 1) / g * g; };
  int64_t chunk = target >= copy_batch
                      ? std::max(copy_batch, (target + copy_batch / 2) / copy_batch * copy_batch)
                      : round_up(target, epv);
  if (n0 < P * chunk) {
    const int64_t even = (n0 + P - 1) / P;
    chunk = std::max(epv, std::min(chunk, round_up(even, even >= batch ? batch : epv)));
  }
  if ((n0 + chunk - 1) / chunk > P * kCommPipeMaxRounds) {
    chunk = round_up((n0 + P * kCommPipeMaxRounds - 1) / (P * kCommPipeMaxRounds), epv);
  }
  prm.chunk = chunk;
  prm.pull_ctas = P;
  prm.consumers = direct ? std::max(1, P * FC_DIRECT_REDUCERS_PCT / 100)
                 : push ? std::max(1, (P + FC_PUSH_COPY_DIV - 1) / FC_PUSH_COPY_DIV)
                        : P;
  prm.slot_stride = (n0 + epv - 1) / epv * epv;
  if (push && W > 1) {
    const uint64_t need = direct ? static_cast<uint64_t>((W - 1) * prm.slot_stride * es)
                          : a.op == CommOp::kAllGather || a.op == CommOp::kAllReduce
                              ? static_cast<uint64_t>(a.count * es)
                          : a.op == CommOp::kReduceScatter || a.op == CommOp::kAllToAll
                              ? static_cast<uint64_t>((W - 1) * prm.slot_stride * es)
                              : 0;
    if (need > d.data_bytes) return false;
  }
  return true;
}

}  // namespace

int64_t collective_output_count(CommOp op, int64_t count, int world, int rank) {
  switch (op) {
    case CommOp::kAllGather:
    case CommOp::kAllReduce: return count;
    case CommOp::kReduceScatter: return split_count(count, world, rank);
    case CommOp::kAllToAll: return world * split_count(count, world, rank);
  }
  return 0;
}

int64_t collective_input_count(CommOp op, int64_t count, int world, int rank) {
  return op == CommOp::kAllGather ? split_count(count, world, rank) : count;
}

CommAlgo collective_choose_algo(const CommDevice& dev, const CollectiveArgs& args) {
  if (args.algo != CommAlgo::kAuto) return args.algo;
  if (dev.world == 1) return CommAlgo::kOneShot;
  const int64_t bytes = args.count * elem_size(args.dtype);
  // allReduce in place, large: the direct variant (only stores cross NVLink), where measured
  // faster (FC_AUTO_DIRECT_MIN_MIB_*). In-placeness is this rank's own fact: callers do it on
  // every rank or on none (a rank that differs gets the launch-mismatch error, not a hang).
  const int64_t direct_min = int64_t{dev.world <= 2 ? FC_AUTO_DIRECT_MIN_MIB_W2 : FC_AUTO_DIRECT_MIN_MIB_W4} << 20;
  if (args.op == CommOp::kAllReduce && direct_min > 0 && bytes >= direct_min && in_place(dev, args)) {
    Params prm{args, 0, 0};
    if (pipe_plan(dev, args, CommAlgo::kDirect, prm)) return CommAlgo::kDirect;
  }
  // allReduce at W = 2 from kAutoPushMinBytes: the push variant (with kAutoPushChunkBytes
  // chunks) moved 2-3 % more than two-phase (W = 2 on a 4 x H200 host, 2026-11-22, one run,
  // kernels/bench/results/collectives_variants_h200x4.txt: 326.8 against 319.4 GB/s busbw at
  // 256 MiB, 334.6 against 326.7 at 1 GiB), while two-phase led at 64 MiB (300.0 against
  // 293.6) and at W = 4 at every size. Its scratch need (the whole tensor) always fits: the
  // input occupies as much of the data area.
  if (args.op == CommOp::kAllReduce && dev.world == 2 && bytes >= kAutoPushMinBytes) {
    return CommAlgo::kTwoPhasePush;
  }
  const int64_t payload = one_shot_payload(args, dev.world);
  if (payload > static_cast<int64_t>(dev.slot_bytes)) return CommAlgo::kTwoPhase;
  // Crossovers (total message bytes). One-shot moves (W-1)x the payload per rank but needs a
  // single flag exchange; two-phase is bandwidth-optimal but needs two or three.
  int64_t limit = 0;
  switch (args.op) {
    case CommOp::kAllReduce: limit = dev.world <= 2 ? (512 << 10) : (256 << 10); break;
    case CommOp::kAllGather:
    case CommOp::kReduceScatter:
    case CommOp::kAllToAll: limit = dev.world <= 2 ? (1 << 20) : (512 << 10); break;
  }
  return bytes <= limit ? CommAlgo::kOneShot : CommAlgo::kTwoPhase;
}

cudaError_t launch_collective(const CommDevice& dev, const CollectiveArgs& a, cudaStream_t stream) {
  CommDevice d = dev;  // the kernel's copy, with this launch's signature (below)
  if (d.world < 1 || d.world > kCommMaxRanks || d.rank < 0 || d.rank >= d.world) {
    return cudaErrorInvalidValue;
  }
  for (int p = 0; p < d.world; ++p) {
    if (d.base[p] == nullptr) return cudaErrorInvalidValue;
  }
  if (d.error == nullptr || a.count < 0 || d.slot_bytes % 16 != 0) return cudaErrorInvalidValue;
  const int64_t es = elem_size(a.dtype);
  const int64_t in_bytes = collective_input_count(a.op, a.count, d.world, d.rank) * es;
  if (a.input == nullptr && a.in_offset + static_cast<uint64_t>(in_bytes) > d.data_bytes) {
    return cudaErrorInvalidValue;
  }
  if (collective_output_count(a.op, a.count, d.world, d.rank) > 0 && a.output == nullptr) {
    return cudaErrorInvalidValue;
  }
  CommAlgo algo = collective_choose_algo(d, a);
  // kPipelined only changes allReduce (the only op with two phases).
  if (algo == CommAlgo::kPipelined && a.op != CommOp::kAllReduce) algo = CommAlgo::kTwoPhase;
  if (a.input != nullptr && algo != CommAlgo::kOneShot) return cudaErrorInvalidValue;
  if (algo == CommAlgo::kDirect && (a.op != CommOp::kAllReduce || !in_place(d, a))) {
    return cudaErrorInvalidValue;
  }
  if (a.out_bf16 && (a.op != CommOp::kReduceScatter || a.dtype != CommDtype::kF32 ||
                     (algo != CommAlgo::kOneShot && algo != CommAlgo::kTwoPhase))) {
    return cudaErrorInvalidValue;
  }
  if (d.launch_sig == 0) {
    d.launch_sig = comm_launch_signature(static_cast<uint32_t>(a.op), static_cast<uint32_t>(a.dtype),
                                         static_cast<uint32_t>(algo), static_cast<uint64_t>(a.count));
  }
  const int sms = d.sm_count > 0 ? d.sm_count : 1;
  Params prm{a, 0, 0};
  if (algo == CommAlgo::kOneShot) {
    // The kernel reads its input through prm.a.input: the caller's, or its data-area slice.
    if (a.input == nullptr) prm.a.input = d.base[d.rank] + d.data_offset + a.in_offset;
    const int64_t payload = one_shot_payload(a, d.world);
    if (d.world > 1 && payload > static_cast<int64_t>(d.slot_bytes)) return cudaErrorInvalidValue;
    // About 8 KiB per CTA and peer: remote stores from few SMs do not fill NVLink.
    const int64_t pushed = payload * std::max(1, d.world - 1);
    int grid = a.num_ctas > 0 ? a.num_ctas
                              : static_cast<int>(std::min<int64_t>((pushed + 8191) / 8192,
                                                                   kCommMaxOneShotCtas));
    grid = std::clamp(grid, 1, std::min(kCommMaxOneShotCtas, sms));
    if (a.dtype == CommDtype::kBF16) {
      return start_kernel(one_shot_kernel<__nv_bfloat16>, grid, stream, d, prm);
    }
    if (a.out_bf16) return start_kernel(one_shot_kernel<float, __nv_bfloat16>, grid, stream, d, prm);
    return start_kernel(one_shot_kernel<float>, grid, stream, d, prm);
  } else if (algo == CommAlgo::kTwoPhase) {
    const int64_t bytes = two_phase_bytes(a, d.world, d.rank);
#ifndef FC_MAX_CHUNK_KIB
#define FC_MAX_CHUNK_KIB 64
#endif
    int64_t chunk_bytes = 8 << 10;
    while (chunk_bytes < (FC_MAX_CHUNK_KIB << 10) && chunk_bytes * 2 * sms * 2 <= bytes) chunk_bytes *= 2;
    prm.chunk = chunk_bytes / es;
    const int64_t items = std::max<int64_t>(1, bytes / chunk_bytes);
    // Every CTA must be resident (the allReduce grid barrier): at most kTwoPhaseCtasPerSm per
    // SM, which the kernel's launch bounds guarantee.
    const int max_grid = sms * kTwoPhaseCtasPerSm;
    int grid;
    if (a.num_ctas > 0) {
      grid = std::clamp(a.num_ctas, 1, max_grid);
      prm.pull_ctas = grid;
    } else {
      // CTAs that read peers: few enough not to congest NVLink (measured, 4 x H200), at most
      // one per work item. allGather / allToAll add CTAs for the local segment (a local copy
      // is several times faster per CTA than a pull, and its segment is 1/(W-1) of the rest).
      int pull = two_phase_pull_ctas(d.world);
      pull = static_cast<int>(std::clamp<int64_t>(std::min<int64_t>(items, pull), 1, max_grid));
      int local = 0;
      if (a.op == CommOp::kAllGather || a.op == CommOp::kAllToAll) {
        local = std::max(1, pull / (2 * std::max(1, d.world - 1)));
        local = std::min(local, max_grid - pull);
      }
      grid = pull + local;
      prm.pull_ctas = pull;
    }
    if (a.dtype == CommDtype::kBF16) {
      return start_kernel(two_phase_kernel<__nv_bfloat16>, grid, stream, d, prm);
    }
    if (a.out_bf16) return start_kernel(two_phase_kernel<float, __nv_bfloat16>, grid, stream, d, prm);
    return start_kernel(two_phase_kernel<float>, grid, stream, d, prm);
  } else if (algo == CommAlgo::kTwoPhasePush || algo == CommAlgo::kPipelined ||
             algo == CommAlgo::kDirect) {
    CollectiveArgs planned = a;
    // kAuto's push: kAutoPushChunkBytes; its direct: the default chunk (64 KiB: at 64 and
    // 256 MiB faster than 128 KiB in both run-12 calls that had both, equal at 1 GiB).
    if (a.algo == CommAlgo::kAuto && a.chunk_bytes == 0 && algo != CommAlgo::kDirect) {
      planned.chunk_bytes = kAutoPushChunkBytes;
    }
    if (!pipe_plan(d, planned, algo, prm)) return cudaErrorInvalidValue;
    prm.a.algo = algo;  // launch_pipe picks the kernel from it (kAuto may resolve to these)
    const int grid = prm.pull_ctas + prm.consumers;
    return a.dtype == CommDtype::kBF16 ? launch_pipe<__nv_bfloat16>(d, prm, grid, stream)
                                       : launch_pipe<float>(d, prm, grid, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace fusedcomm::kernels
