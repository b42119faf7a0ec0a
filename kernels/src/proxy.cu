// The GPU producers of the proxy ring (kernels/proxy.h): collectives across hosts, and the
// streaming test pair of gpu_proxy_test.
#include "fusedcomm/kernels/detail/proxy_device.cuh"
#include "fusedcomm/kernels/proxy.h"

#include <cuda_bf16.h>

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
        dst[i] = make_uint4(
            proxy_stream_word(t.seed, m, 4 * i), proxy_stream_word(t.seed, m, 4 * i + 1),
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

// Copies n elements src -> dst by the CTA: 16-byte vectors when both are 16-byte aligned, then
// the tail element by element. kFromInbox: src is an inbox slot of mapped host memory that held
// older data, so every load goes to memory (volatile) and each crosses PCIe once per vector.
template <typename T, bool kFromInbox>
__device__ void copy_elems(T* dst, const T* src, int64_t n) {
  using E = ProxyElems<T>;
  const bool vec = reinterpret_cast<uintptr_t>(dst) % 16 == 0 && reinterpret_cast<uintptr_t>(src) % 16 == 0;
  const int64_t nv = vec ? n / E::kPerVec : 0;
  for (int64_t i = threadIdx.x; i < nv; i += blockDim.x) {
    const uint4* from = reinterpret_cast<const uint4*>(src) + i;
    reinterpret_cast<uint4*>(dst)[i] = kFromInbox ? detail::ld_volatile_v4(from) : *from;
  }
  for (int64_t i = nv * E::kPerVec + threadIdx.x; i < n; i += blockDim.x) {
    dst[i] = kFromInbox ? E::load_volatile(src + i) : src[i];
  }
}

// dst[i] = sum over sources s in rank order of (s == me ? own[i] : inbox slot s [i]), in fp32,
// rounded once; n elements. dst may be own.
template <typename T>
__device__ void sum_elems(T* dst, const T* own, const uint8_t* inbox, uint64_t slot_bytes, int hosts,
                          int me, int64_t n) {
  using E = ProxyElems<T>;
  const bool vec = reinterpret_cast<uintptr_t>(dst) % 16 == 0 && reinterpret_cast<uintptr_t>(own) % 16 == 0;
  const int64_t nv = vec ? n / E::kPerVec : 0;
  for (int64_t i = threadIdx.x; i < nv; i += blockDim.x) {
    float sum[E::kPerVec];
    const uint4 mine = reinterpret_cast<const uint4*>(own)[i];
    for (int s = 0; s < hosts; ++s) {
      const uint4* slot = reinterpret_cast<const uint4*>(inbox + s * slot_bytes);
      const uint4 v = s == me ? mine : detail::ld_volatile_v4(slot + i);
#pragma unroll
      for (int j = 0; j < E::kPerVec; ++j) sum[j] = s == 0 ? E::get(v, j) : sum[j] + E::get(v, j);
    }
    uint4 r = make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int j = 0; j < E::kPerVec; ++j) E::put(r, j, sum[j]);
    reinterpret_cast<uint4*>(dst)[i] = r;
  }
  for (int64_t i = nv * E::kPerVec + threadIdx.x; i < n; i += blockDim.x) {
    float sum = 0.f;
    for (int s = 0; s < hosts; ++s) {
      const float v = E::widen(s == me ? own[i] : E::load_volatile(reinterpret_cast<const T*>(inbox + s * slot_bytes) + i));
      sum = s == 0 ? v : sum + v;
    }
    dst[i] = E::narrow(sum);
  }
}

template <typename T>
__global__ void proxy_collective_kernel(ProxyCollective a) {
  __shared__ uint32_t status;
  __shared__ uint64_t value_base;
  int bad_peer = -1;  // thread 0: the host whose signal a failed wait was for
  if (threadIdx.x == 0) {
    status = kProxyOk;
    // The previous launch on this counter wrote it before it ended (stream order).
    value_base = a.value_counter != nullptr ? *a.value_counter : a.value_base;
  }
  __syncthreads();
  const int H = a.hosts, me = a.rank;
  const bool scatter = a.op == kProxyReduceScatter || a.op == kProxyAllToAll;  // a chunk per peer
  const int64_t per_chunk = static_cast<int64_t>(a.chunk_bytes / sizeof(T));
  const int64_t chunks = static_cast<int64_t>(proxy_collective_chunks(a));
  // Elements of host h's block in chunk c.
  auto part = [&](int h, int64_t c) { return max(int64_t{0}, min(per_chunk, a.counts[h] - c * per_chunk)); };
  auto block = [&](int h, int64_t c) { return static_cast<T*>(a.blocks[h]) + c * per_chunk; };
  const uint64_t* recv = a.signals + a.base_word;        // word s: chunks from source s
  const uint64_t* credit = a.signals + a.base_word + H;  // word H + s: credits from s
  for (int64_t c = 0; c < chunks; ++c) {
    // Credits: every peer has consumed this rank's previous chunk, of this op or (c = 0) of the
    // op before on these words. Only then are the outbox slots free (that chunk was delivered)
    // and may this chunk land in the peers' inbox slots (they are done reading the previous one).
    if (threadIdx.x == 0) {
      for (int p = 0; p < H && status == kProxyOk; ++p) {
        if (p == me) continue;
        status = detail::proxy_wait_signal(a.ring, credit + p, value_base + c, a.timeout_ns);
        bad_peer = p;
      }
    }
    __syncthreads();
    if (status != kProxyOk) break;
    if (scatter) {
      for (int p = 0; p < H; ++p) {
        if (p != me) copy_elems<T, false>(reinterpret_cast<T*>(a.outbox + p * a.chunk_bytes), block(p, c), part(p, c));
      }
    } else {
      copy_elems<T, false>(reinterpret_cast<T*>(a.outbox), block(me, c), part(me, c));
    }
    __threadfence_system();  // the staged chunks before the posts (cumulative)
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int p = 0; p < H && status == kProxyOk; ++p) {
        if (p == me) continue;
        detail::ProxyWrite w{};
        w.peer = p;
        w.src_key = a.outbox_key;
        w.src_offset = scatter ? static_cast<uint64_t>(p) * a.chunk_bytes : 0;
        w.dst_key = a.inbox_keys[p];
        w.dst_offset = static_cast<uint64_t>(me) * a.chunk_bytes;
        w.bytes = static_cast<uint64_t>(part(scatter ? p : me, c)) * sizeof(T);
        w.signal_key = a.signal_keys[p];
        w.signal_offset = 8 * (a.base_word + me);
        w.signal_value = value_base + c + 1;
        status = detail::proxy_post_write(a.ring, w, a.timeout_ns);
        bad_peer = -1;  // the ring stayed full: no single peer to blame
      }
      for (int p = 0; p < H && status == kProxyOk; ++p) {
        if (p == me) continue;
        status = detail::proxy_wait_signal(a.ring, recv + p, value_base + c + 1, a.timeout_ns);
        bad_peer = p;
      }
    }
    __syncthreads();
    if (status != kProxyOk) break;
    if (a.op == kProxyAllGather || a.op == kProxyAllToAll) {
      for (int s = 0; s < H; ++s) {
        if (s == me) continue;
        const T* slot = reinterpret_cast<const T*>(a.inbox + s * a.chunk_bytes);
        if (a.op == kProxyAllGather) {
          copy_elems<T, true>(block(s, c), slot, part(s, c));
        } else {
          const int64_t n = max(int64_t{0}, min(per_chunk, a.recv_counts[s] - c * per_chunk));
          copy_elems<T, true>(static_cast<T*>(a.recv[s]) + c * per_chunk, slot, n);
        }
      }
    } else {
      T* dst = (scatter ? static_cast<T*>(a.out) : static_cast<T*>(a.blocks[me])) + c * per_chunk;
      sum_elems<T>(dst, block(me, c), a.inbox, a.chunk_bytes, H, me, part(me, c));
    }
    __syncthreads();  // every read of the inbox slots is done: credit the sources
    if (threadIdx.x == 0) {
      for (int p = 0; p < H && status == kProxyOk; ++p) {
        if (p == me) continue;
        detail::ProxyWrite w{};
        w.peer = p;
        w.signal_key = a.signal_keys[p];
        w.signal_offset = 8 * (a.base_word + H + me);
        w.signal_value = value_base + c + 1;
        status = detail::proxy_post_write(a.ring, w, a.timeout_ns);
        bad_peer = -1;
      }
    }
    __syncthreads();
    if (status != kProxyOk) break;
  }
  // A plain store (no atomics: the word may be mapped host memory); one thread of one CTA.
  if (threadIdx.x == 0 && status != kProxyOk) {
    volatile uint32_t* word = a.status;
    if (*word == kProxyOk) *word = proxy_status(status, bad_peer, a.op);
  }
  // The next op's values start above this one's, also after a failure (the link is dead then).
  if (threadIdx.x == 0 && a.value_counter != nullptr) *a.value_counter = value_base + chunks;
}

}  // namespace

cudaError_t launch_proxy_collective(const ProxyCollective& a, cudaStream_t stream) {
  if (a.hosts < 1 || a.hosts > kProxyMaxHosts || a.rank < 0 || a.rank >= a.hosts ||
      a.chunk_bytes == 0 || a.chunk_bytes % 16 != 0 ||
      a.op > kProxyAllToAll ||
      (a.dtype != kProxyF32 && a.dtype != kProxyBF16) ||
      a.ring.capacity == 0 || (a.ring.capacity & (a.ring.capacity - 1)) != 0) {
    return cudaErrorInvalidValue;
  }
  for (int h = 0; h < a.hosts; ++h) {
    if (a.counts[h] < 0 || (a.counts[h] > 0 && a.blocks[h] == nullptr)) return cudaErrorInvalidValue;
    if (a.op == kProxyAllToAll && h != a.rank && a.recv_counts[h] > 0 && a.recv[h] == nullptr) {
      return cudaErrorInvalidValue;
    }
    if (a.recv_counts[h] < 0 || (a.op != kProxyAllToAll && a.recv_counts[h] != 0)) return cudaErrorInvalidValue;
  }
  if (a.op == kProxyReduceScatter && a.counts[a.rank] > 0 && a.out == nullptr) return cudaErrorInvalidValue;
  if (a.hosts == 1) {  // nothing to move, but reduceScatter's output is the own contribution
    if (a.op == kProxyReduceScatter && a.out != a.blocks[0] && a.counts[0] > 0) {
      return cudaMemcpyAsync(a.out, a.blocks[0], static_cast<size_t>(a.counts[0]) * (a.dtype == kProxyF32 ? 4 : 2),
                             cudaMemcpyDeviceToDevice, stream);
    }
    return cudaSuccess;
  }
  if (proxy_collective_chunks(a) == 0) return cudaSuccess;
  if (a.dtype == kProxyBF16) {
    proxy_collective_kernel<__nv_bfloat16><<<1, 1024, 0, stream>>>(a);
  } else {
    proxy_collective_kernel<float><<<1, 1024, 0, stream>>>(a);
  }
  return cudaGetLastError();
}

cudaError_t launch_proxy_stream_test(const ProxyStreamTest& t, cudaStream_t stream) {
  if (t.bytes % 16 != 0 || t.depth == 0 || (t.role != 0 && t.role != 1) ||
      t.ring.capacity == 0 || (t.ring.capacity & (t.ring.capacity - 1)) != 0) {
    return cudaErrorInvalidValue;
  }
  proxy_stream_kernel<<<1, 512, 0, stream>>>(t);
  return cudaGetLastError();
}

}  // namespace fusedcomm::kernels
