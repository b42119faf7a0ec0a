// One lane of a collective across hosts through the proxy (kernels/proxy/proxy.h, "Lanes" and the
// protocol), run by one CTA of any width: the body of launch_proxy_collective's kernel, and the
// exchange role of the fused kernels across hosts (kernels/ag_gemm), which tie their own work to
// the lane's chunks through hooks.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>

#include "kernels/common/sm90_primitives.cuh"
#include "kernels/proxy/detail/proxy_device.cuh"
#include "kernels/proxy/proxy.h"

namespace fusedcomm::kernels::detail {

// Elements as the allReduce sums them: 16-byte vectors of kPerVec elements, widened to fp32.
template <typename T>
struct ProxyElems;
template <>
struct ProxyElems<float> {
  static constexpr int kPerVec = 4;
  __device__ static float get(const uint4& v, int i) { return __uint_as_float((&v.x)[i]); }
  __device__ static void put(uint4& v, int i, float f) { (&v.x)[i] = __float_as_uint(f); }
  __device__ static float load_volatile(const float* p) {
    float v;
    asm volatile("ld.volatile.global.f32 %0, [%1];" : "=f"(v) : "l"(p));
    return v;
  }
  __device__ static float widen(float v) { return v; }
  __device__ static float narrow(float v) { return v; }
};
template <>
struct ProxyElems<__nv_bfloat16> {
  static constexpr int kPerVec = 8;
  __device__ static float get(const uint4& v, int i) {
    const uint32_t w = (&v.x)[i / 2];
    return __uint_as_float(i % 2 == 0 ? w << 16 : w & 0xFFFF0000u);
  }
  __device__ static void put(uint4& v, int i, float f) {
    const uint32_t h = __bfloat16_as_ushort(__float2bfloat16_rn(f));
    uint32_t& w = (&v.x)[i / 2];
    w = i % 2 == 0 ? (w & 0xFFFF0000u) | h : (w & 0xFFFFu) | (h << 16);
  }
  __device__ static __nv_bfloat16 load_volatile(const __nv_bfloat16* p) {
    unsigned short v;
    asm volatile("ld.volatile.global.u16 %0, [%1];" : "=h"(v) : "l"(p));
    return __ushort_as_bfloat16(v);
  }
  __device__ static float widen(__nv_bfloat16 v) { return __bfloat162float(v); }
  __device__ static __nv_bfloat16 narrow(float v) { return __float2bfloat16_rn(v); }
};

// A lane's CTA copies and sums with every thread. Each thread keeps several 16-byte loads in flight
// (kCopyUnroll, kSumUnroll): a load from mapped host memory crosses PCIe and takes about a
// microsecond, so one CTA's copy rate is the bytes it has in flight per round trip.
inline constexpr int kCopyUnroll = 4;
template <typename T>
inline constexpr int kSumUnroll = sizeof(T) == 4 ? 4 : 2;  // bf16 sums take twice the registers per vector

// Copies n elements src -> dst by the CTA: 16-byte vectors when both are 16-byte aligned, then
// the tail element by element. kFromInbox: src is an inbox slot of mapped host memory that held
// older data, so every load goes to memory (volatile) and each crosses PCIe once per vector.
template <typename T, bool kFromInbox>
__device__ void copy_elems(T* dst, const T* src, int64_t n) {
  using E = ProxyElems<T>;
  const bool vec = reinterpret_cast<uintptr_t>(dst) % 16 == 0 && reinterpret_cast<uintptr_t>(src) % 16 == 0;
  const int64_t nv = vec ? n / E::kPerVec : 0;
  const auto* from = reinterpret_cast<const uint4*>(src);
  auto* to = reinterpret_cast<uint4*>(dst);
  const int64_t step = blockDim.x;
  int64_t i = threadIdx.x;
  for (; i + (kCopyUnroll - 1) * step < nv; i += kCopyUnroll * step) {
    uint4 v[kCopyUnroll];
#pragma unroll
    for (int u = 0; u < kCopyUnroll; ++u)
      v[u] = kFromInbox ? ld_volatile_v4(from + i + u * step) : from[i + u * step];
#pragma unroll
    for (int u = 0; u < kCopyUnroll; ++u) to[i + u * step] = v[u];
  }
  for (; i < nv; i += step) to[i] = kFromInbox ? ld_volatile_v4(from + i) : from[i];
  for (int64_t e = nv * E::kPerVec + threadIdx.x; e < n; e += step) {
    dst[e] = kFromInbox ? E::load_volatile(src + e) : src[e];
  }
}

// dst[i] = sum over sources s in rank order of (s == me ? own[i] : inbox slot s [i]), in fp32,
// rounded once; n elements. dst may be own.
template <typename T>
__device__ void sum_elems(T* dst, const T* own, const uint8_t* inbox, uint64_t slot_bytes, int hosts, int me,
                          int64_t n) {
  using E = ProxyElems<T>;
  const bool vec = reinterpret_cast<uintptr_t>(dst) % 16 == 0 && reinterpret_cast<uintptr_t>(own) % 16 == 0;
  const int64_t nv = vec ? n / E::kPerVec : 0;
  const int64_t step = blockDim.x;
  // kU vectors per thread and round, from index i with stride `step`; the loads of a source are
  // issued together before any is summed.
  auto sum_vectors = [&](int64_t i, auto unroll) {
    constexpr int kU = decltype(unroll)::value;
    float sum[kU][E::kPerVec];
    uint4 mine[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u) mine[u] = reinterpret_cast<const uint4*>(own)[i + u * step];
    for (int s = 0; s < hosts; ++s) {
      const uint4* slot = reinterpret_cast<const uint4*>(inbox + s * slot_bytes);
      uint4 v[kU];
#pragma unroll
      for (int u = 0; u < kU; ++u) v[u] = s == me ? mine[u] : ld_volatile_v4(slot + i + u * step);
#pragma unroll
      for (int u = 0; u < kU; ++u) {
#pragma unroll
        for (int j = 0; j < E::kPerVec; ++j)
          sum[u][j] = s == 0 ? E::get(v[u], j) : sum[u][j] + E::get(v[u], j);
      }
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      uint4 r = make_uint4(0, 0, 0, 0);
#pragma unroll
      for (int j = 0; j < E::kPerVec; ++j) E::put(r, j, sum[u][j]);
      reinterpret_cast<uint4*>(dst)[i + u * step] = r;
    }
  };
  int64_t i = threadIdx.x;
  for (; i + (kSumUnroll<T> - 1) * step < nv; i += kSumUnroll<T> * step) {
    sum_vectors(i, std::integral_constant<int, kSumUnroll<T>>{});
  }
  for (; i < nv; i += step) sum_vectors(i, std::integral_constant<int, 1>{});
  for (int64_t e = nv * E::kPerVec + threadIdx.x; e < n; e += step) {
    float sum = 0.f;
    for (int s = 0; s < hosts; ++s) {
      const float v = E::widen(
          s == me ? own[e] : E::load_volatile(reinterpret_cast<const T*>(inbox + s * slot_bytes) + e));
      sum = s == 0 ? v : sum + v;
    }
    dst[e] = E::narrow(sum);
  }
}

// What a lane's caller adds to the protocol; the plain collective adds nothing.
//   send_ready(i): thread 0, before chunk i (of this op) is staged; false gives up (a timeout).
//   receive_ready(j): thread 0, before chunk j of this rank's own block is read to be summed or
//     before the sources' chunk j is awaited; false gives up (a timeout).
//   received(j): thread 0, once chunk j of every source is copied out or summed by the CTA
//     (after a CTA barrier; with kAsyncReaders every thread fenced its stores for the async
//     proxy before it).
struct ProxyLaneNoHooks {
  static constexpr bool kAsyncReaders = false;
  __device__ bool send_ready(int64_t) const { return true; }
  __device__ bool receive_ready(int64_t) const { return true; }
  __device__ void received(int64_t) const {}
};

// Lane `lane` of the op `a` (every thread of the CTA calls it). Returns the lane's status:
// kProxyOk, or the failure it also recorded in a.status.
template <typename T, class Hooks>
__device__ uint32_t proxy_lane(const ProxyCollective& a, uint32_t lane, Hooks& hooks) {
  __shared__ uint32_t status;
  __shared__ uint64_t value_base;
  int bad_peer = -1;  // thread 0: the host whose signal a failed wait was for
  // This CTA is lane `lane`: an independent pipeline over its region of every slot, with its own
  // ring, receive and credit words and value counter (kernels/proxy/proxy.h, "Lanes").
  const uint32_t L = a.lanes;
  if (threadIdx.x == 0) {
    status = kProxyOk;
    // The previous launch on this counter wrote it before it ended (stream order).
    value_base = a.value_counter != nullptr ? a.value_counter[lane] : a.value_base;
  }
  __syncthreads();
  const int H = a.hosts, me = a.rank;
  const bool scatter = a.op == kProxyReduceScatter || a.op == kProxyAllToAll;  // a chunk per peer
  const int64_t per_chunk = static_cast<int64_t>(a.chunk_bytes / sizeof(T));
  const int64_t chunks = static_cast<int64_t>(proxy_collective_chunks(a));
  // Elements of host h's block in chunk c.
  auto part = [&](int h, int64_t c) { return max(int64_t{0}, min(per_chunk, a.counts[h] - c * per_chunk)); };
  auto block = [&](int h, int64_t c) { return static_cast<T*>(a.blocks[h]) + c * per_chunk; };
  const uint64_t* recv = a.signals + a.base_word + lane * H;          // word s: from source s
  const uint64_t* credit = a.signals + a.base_word + (L + lane) * H;  // word s: credits from s
  const ProxyRingDevice ring = a.rings[lane];
  const ProxyRingDevice waits = a.rings[0];  // every wait polls lane 0's abort word
  const uint64_t D = a.depth;
  // This lane's region of a slot, in elements: [lo, hi) of a chunk of n elements.
  const uint64_t region = proxy_lane_region(a.chunk_bytes, L) / sizeof(T);
  auto lo = [&](int64_t n) { return min(static_cast<int64_t>(lane * region), n); };
  auto hi = [&](int64_t n) { return min(static_cast<int64_t>((lane + 1) * region), n); };
  // Elements of chunk j that source s sends this rank (the sender's part(), in its counts).
  auto received = [&](int s, int64_t j) -> int64_t {
    if (a.op == kProxyAllGather) return part(s, j);
    if (a.op == kProxyAllToAll) return max(int64_t{0}, min(per_chunk, a.recv_counts[s] - j * per_chunk));
    return part(me, j);  // allReduce (every count the same) and reduceScatter (this rank's block)
  };
  // Byte offset of slot (stage of chunk g, host h) in either box.
  auto slot = [&](uint64_t g, int h) { return ((g % D) * H + h) * a.chunk_bytes; };
  for (int64_t i = 0; i < chunks + static_cast<int64_t>(D) - 1; ++i) {
    const int64_t j = i - static_cast<int64_t>(D - 1);  // the chunk received in this iteration
    if (i < chunks) {
      const uint64_t g = value_base + i;
      // Credits: every peer has consumed this lane's part of this rank's chunk g - D (of this
      // op or an earlier one). Only then is this lane's region of stage g % D free here (that
      // part was delivered) and in the peers' inboxes (they are done reading it).
      if (threadIdx.x == 0 && g + 1 > D) {
        for (int p = 0; p < H && status == kProxyOk; ++p) {
          if (p == me) continue;
          status = proxy_wait_signal(waits, credit + p, g + 1 - D, a.timeout_ns);
          bad_peer = p;
        }
      }
      if (threadIdx.x == 0 && status == kProxyOk && !hooks.send_ready(i)) {
        status = kProxyTimeout;
        bad_peer = -1;
      }
      __syncthreads();
      if (status != kProxyOk) break;
      if (scatter) {
        for (int p = 0; p < H; ++p) {
          if (p == me) continue;
          const int64_t n = part(p, i);
          copy_elems<T, false>(reinterpret_cast<T*>(a.outbox + slot(g, p)) + lo(n), block(p, i) + lo(n),
                               hi(n) - lo(n));
        }
      } else {
        const int64_t n = part(me, i);
        copy_elems<T, false>(reinterpret_cast<T*>(a.outbox + slot(g, 0)) + lo(n), block(me, i) + lo(n),
                             hi(n) - lo(n));
      }
      __threadfence_system();  // the staged chunks before the posts (cumulative)
      __syncthreads();
      if (threadIdx.x == 0) {
        for (int p = 0; p < H && status == kProxyOk; ++p) {
          if (p == me) continue;
          const int64_t n = part(scatter ? p : me, i);
          const uint64_t first = static_cast<uint64_t>(lo(n)) * sizeof(T);
          ProxyWrite w{};
          w.peer = p;
          w.src_key = a.outbox_key;
          w.src_offset = slot(g, scatter ? p : 0) + first;
          w.dst_key = a.inbox_keys[p];
          w.dst_offset = slot(g, me) + first;
          w.bytes = static_cast<uint64_t>(hi(n) - lo(n)) * sizeof(T);  // 0: the signal alone
          w.signal_key = a.signal_keys[p];
          w.signal_offset = 8 * (a.base_word + lane * H + me);
          w.signal_value = g + 1;
          status = proxy_post_write(ring, w, a.timeout_ns);
          bad_peer = -1;  // the ring stayed full: no single peer to blame
        }
      }
    }
    if (j >= 0) {
      const uint64_t g = value_base + j;
      if (threadIdx.x == 0) {
        if (status == kProxyOk && !hooks.receive_ready(j)) {
          status = kProxyTimeout;
          bad_peer = -1;
        }
        for (int p = 0; p < H && status == kProxyOk; ++p) {
          if (p == me) continue;
          status = proxy_wait_signal(waits, recv + p, g + 1, a.timeout_ns);
          bad_peer = p;
        }
      }
    }
    __syncthreads();
    if (status != kProxyOk) break;
    if (j < 0) continue;
    const uint64_t g = value_base + j;
    if (a.op == kProxyAllGather || a.op == kProxyAllToAll) {
      for (int s = 0; s < H; ++s) {
        if (s == me) continue;
        const int64_t n = received(s, j);
        const T* from = reinterpret_cast<const T*>(a.inbox + slot(g, s)) + lo(n);
        T* to = (a.op == kProxyAllGather ? block(s, j) : static_cast<T*>(a.recv[s]) + j * per_chunk) + lo(n);
        copy_elems<T, true>(to, from, hi(n) - lo(n));
      }
    } else {
      const int64_t n = part(me, j);
      T* dst = (scatter ? static_cast<T*>(a.out) : static_cast<T*>(a.blocks[me])) + j * per_chunk + lo(n);
      sum_elems<T>(dst, block(me, j) + lo(n), a.inbox + slot(g, 0) + lo(n) * sizeof(T), a.chunk_bytes, H, me,
                   hi(n) - lo(n));
    }
    if (Hooks::kAsyncReaders) fence_proxy_async_global();  // TMA reads of what was copied out
    __syncthreads();  // every read of this lane's inbox regions is done: credit the sources
    if (threadIdx.x == 0) {
      hooks.received(j);
      for (int p = 0; p < H && status == kProxyOk; ++p) {
        if (p == me) continue;
        ProxyWrite w{};
        w.peer = p;
        w.signal_key = a.signal_keys[p];
        w.signal_offset = 8 * (a.base_word + (L + lane) * H + me);
        w.signal_value = g + 1;
        status = proxy_post_write(ring, w, a.timeout_ns);
        bad_peer = -1;
      }
    }
    __syncthreads();
    if (status != kProxyOk) break;
  }
  // A plain store (no atomics: the word may be mapped host memory); one thread per lane. Lanes
  // that fail at once may overwrite each other's report: either names a real failure.
  if (threadIdx.x == 0 && status != kProxyOk) {
    volatile uint32_t* word = a.status;
    if (*word == kProxyOk) *word = proxy_status(status, bad_peer, a.op);
  }
  // The next op's values start above this one's, also after a failure (the link is dead then).
  if (threadIdx.x == 0 && a.value_counter != nullptr) a.value_counter[lane] = value_base + chunks;
  return status;
}

}  // namespace fusedcomm::kernels::detail
