// The GPU producers of the proxy ring (kernels/proxy/proxy.h): collectives across hosts, and the
// streaming test pair of gpu_proxy_test.
#include "kernels/proxy/detail/proxy_device.cuh"
#include "kernels/proxy/proxy.h"

#include <cuda_bf16.h>

#include <type_traits>

namespace fusedcomm::kernels {
namespace {

// One CTA. Thread 0 does every wait and post; the CTA writes (sender) or checks (receiver)
// each message between two barriers.
__global__ void proxy_stream_kernel(ProxyStreamTest t) {
  __shared__ uint32_t status;
  if (threadIdx.x == 0) status = kProxyOk;
  __syncthreads();
  const uint64_t vecs = t.bytes / 16;  // 16-byte vectors: 4 words each
  uint32_t bad = 0;
  for (uint32_t m = 0; m < t.count; ++m) {
    const uint64_t off = static_cast<uint64_t>(m % t.depth) * t.bytes;
    if (threadIdx.x == 0) {
      uint32_t s = kProxyOk;
      if (t.role == 0 && m >= t.depth) {  // the receiver is done with message m - depth
        s = detail::proxy_wait_signal(t.ring, t.my_signal, m - t.depth + 1, t.timeout_ns);
      } else if (t.role == 1) {  // message m has arrived
        s = detail::proxy_wait_signal(t.ring, t.my_signal, m + 1, t.timeout_ns);
      }
      status = s;
    }
    __syncthreads();
    if (status != kProxyOk) break;
    if (t.role == 0) {
      auto* dst = reinterpret_cast<uint4*>(t.outbox + off);
      for (uint64_t i = threadIdx.x; i < vecs; i += blockDim.x) {
        dst[i] = make_uint4(proxy_stream_word(t.seed, m, 4 * i), proxy_stream_word(t.seed, m, 4 * i + 1),
                            proxy_stream_word(t.seed, m, 4 * i + 2), proxy_stream_word(t.seed, m, 4 * i + 3));
      }
      __threadfence_system();  // this thread's payload writes before the post (cumulative)
    } else if (t.check) {
      // Volatile: slot m % depth held an older message; every read goes to host memory.
      const auto* src = reinterpret_cast<const uint4*>(t.inbox + off);
      for (uint64_t i = threadIdx.x; i < vecs; i += blockDim.x) {
        const uint4 v = detail::ld_volatile_v4(src + i);
        bad += (v.x != proxy_stream_word(t.seed, m, 4 * i)) +
               (v.y != proxy_stream_word(t.seed, m, 4 * i + 1)) +
               (v.z != proxy_stream_word(t.seed, m, 4 * i + 2)) +
               (v.w != proxy_stream_word(t.seed, m, 4 * i + 3));
      }
    }
    __syncthreads();  // sender: the payload is written; receiver: every read is done
    if (threadIdx.x == 0) {
      detail::ProxyWrite w{};
      w.peer = t.peer;
      w.signal_key = t.peer_signal_key;
      w.signal_offset = t.signal_offset;
      w.signal_value = m + 1;
      if (t.role == 0) {
        w.src_key = t.outbox_key;
        w.src_offset = off;
        w.dst_key = t.peer_inbox_key;
        w.dst_offset = off;
        w.bytes = t.bytes;
      }  // receiver: a signal-only write, the credit for message m
      status = detail::proxy_post_write(t.ring, w, t.timeout_ns);
    }
    __syncthreads();
    if (status != kProxyOk) break;
  }
  if (bad != 0) atomicAdd(t.mismatches, bad);
  if (threadIdx.x == 0 && status != kProxyOk) atomicCAS(t.status, kProxyOk, status);
}

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

// The collective kernel's CTAs (one per lane). Each thread keeps several 16-byte loads in flight
// (kCopyUnroll, kSumUnroll): a load from mapped host memory crosses PCIe and takes about a
// microsecond, so one CTA's copy rate is the bytes it has in flight per round trip.
constexpr int kProxyThreads = 512;
constexpr int kCopyUnroll = 4;
template <typename T>
constexpr int kSumUnroll = sizeof(T) == 4 ? 4 : 2;  // bf16 sums take twice the registers per vector

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
      v[u] = kFromInbox ? detail::ld_volatile_v4(from + i + u * step) : from[i + u * step];
#pragma unroll
    for (int u = 0; u < kCopyUnroll; ++u) to[i + u * step] = v[u];
  }
  for (; i < nv; i += step) to[i] = kFromInbox ? detail::ld_volatile_v4(from + i) : from[i];
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
      for (int u = 0; u < kU; ++u) v[u] = s == me ? mine[u] : detail::ld_volatile_v4(slot + i + u * step);
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

template <typename T>
__global__ void __launch_bounds__(kProxyThreads, 1) proxy_collective_kernel(ProxyCollective a) {
  __shared__ uint32_t status;
  __shared__ uint64_t value_base;
  int bad_peer = -1;  // thread 0: the host whose signal a failed wait was for
  // This CTA is lane `lane`: an independent pipeline over its region of every slot, with its own
  // ring, receive and credit words and value counter (kernels/proxy/proxy.h, "Lanes").
  const uint32_t L = a.lanes, lane = blockIdx.x;
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
          status = detail::proxy_wait_signal(waits, credit + p, g + 1 - D, a.timeout_ns);
          bad_peer = p;
        }
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
          detail::ProxyWrite w{};
          w.peer = p;
          w.src_key = a.outbox_key;
          w.src_offset = slot(g, scatter ? p : 0) + first;
          w.dst_key = a.inbox_keys[p];
          w.dst_offset = slot(g, me) + first;
          w.bytes = static_cast<uint64_t>(hi(n) - lo(n)) * sizeof(T);  // 0: the signal alone
          w.signal_key = a.signal_keys[p];
          w.signal_offset = 8 * (a.base_word + lane * H + me);
          w.signal_value = g + 1;
          status = detail::proxy_post_write(ring, w, a.timeout_ns);
          bad_peer = -1;  // the ring stayed full: no single peer to blame
        }
      }
    }
    if (j >= 0) {
      const uint64_t g = value_base + j;
      if (threadIdx.x == 0) {
        for (int p = 0; p < H && status == kProxyOk; ++p) {
          if (p == me) continue;
          status = detail::proxy_wait_signal(waits, recv + p, g + 1, a.timeout_ns);
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
    __syncthreads();  // every read of this lane's inbox regions is done: credit the sources
    if (threadIdx.x == 0) {
      for (int p = 0; p < H && status == kProxyOk; ++p) {
        if (p == me) continue;
        detail::ProxyWrite w{};
        w.peer = p;
        w.signal_key = a.signal_keys[p];
        w.signal_offset = 8 * (a.base_word + (L + lane) * H + me);
        w.signal_value = g + 1;
        status = detail::proxy_post_write(ring, w, a.timeout_ns);
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
}

}  // namespace

cudaError_t launch_proxy_collective(const ProxyCollective& a, cudaStream_t stream) {
  if (a.hosts < 1 || a.hosts > kProxyMaxHosts || a.rank < 0 || a.rank >= a.hosts || a.chunk_bytes == 0 ||
      a.chunk_bytes % 16 != 0 || a.depth < 1 || a.depth > kProxyMaxDepth || a.op > kProxyAllToAll ||
      a.lanes < 1 || a.lanes > kProxyMaxLanes || (a.dtype != kProxyF32 && a.dtype != kProxyBF16)) {
    return cudaErrorInvalidValue;
  }
  for (uint32_t l = 0; l < a.lanes; ++l) {
    const uint32_t c = a.rings[l].capacity;
    if (c == 0 || (c & (c - 1)) != 0) return cudaErrorInvalidValue;
  }
  for (int h = 0; h < a.hosts; ++h) {
    if (a.counts[h] < 0 || (a.counts[h] > 0 && a.blocks[h] == nullptr)) return cudaErrorInvalidValue;
    if (a.op == kProxyAllToAll && h != a.rank && a.recv_counts[h] > 0 && a.recv[h] == nullptr) {
      return cudaErrorInvalidValue;
    }
    if (a.recv_counts[h] < 0 || (a.op != kProxyAllToAll && a.recv_counts[h] != 0))
      return cudaErrorInvalidValue;
  }
  if (a.op == kProxyReduceScatter && a.counts[a.rank] > 0 && a.out == nullptr) return cudaErrorInvalidValue;
  if (a.hosts == 1) {  // nothing to move, but reduceScatter's output is the own contribution
    if (a.op == kProxyReduceScatter && a.out != a.blocks[0] && a.counts[0] > 0) {
      return cudaMemcpyAsync(a.out, a.blocks[0],
                             static_cast<size_t>(a.counts[0]) * (a.dtype == kProxyF32 ? 4 : 2),
                             cudaMemcpyDeviceToDevice, stream);
    }
    return cudaSuccess;
  }
  if (proxy_collective_chunks(a) == 0) return cudaSuccess;
  if (a.dtype == kProxyBF16) {
    proxy_collective_kernel<__nv_bfloat16><<<proxy_active_lanes(a), kProxyThreads, 0, stream>>>(a);
  } else {
    proxy_collective_kernel<float><<<proxy_active_lanes(a), kProxyThreads, 0, stream>>>(a);
  }
  return cudaGetLastError();
}

cudaError_t launch_proxy_stream_test(const ProxyStreamTest& t, cudaStream_t stream) {
  if (t.bytes % 16 != 0 || t.depth == 0 || (t.role != 0 && t.role != 1) || t.ring.capacity == 0 ||
      (t.ring.capacity & (t.ring.capacity - 1)) != 0) {
    return cudaErrorInvalidValue;
  }
  proxy_stream_kernel<<<1, 512, 0, stream>>>(t);
  return cudaGetLastError();
}

}  // namespace fusedcomm::kernels
