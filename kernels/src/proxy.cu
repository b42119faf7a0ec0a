// The GPU producers of the proxy ring (kernels/proxy.h): allReduce across hosts, and the
// streaming test pair of gpu_proxy_test.
#include "fusedcomm/kernels/detail/proxy_device.cuh"
#include "fusedcomm/kernels/proxy.h"

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
        uint4 v;
        asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                     : "l"(src + i));
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

__global__ void proxy_allreduce_kernel(ProxyAllReduce a) {
  __shared__ uint32_t status;
  if (threadIdx.x == 0) status = kProxyOk;
  __syncthreads();
  const int H = a.hosts, me = a.rank;
  const int64_t per_chunk = static_cast<int64_t>(a.chunk_bytes / 4);
  const int64_t chunks = (a.count + per_chunk - 1) / per_chunk;
  const uint64_t* recv = a.signals + a.base_word;        // word s: chunks from source s
  const uint64_t* credit = a.signals + a.base_word + H;  // word H + s: credits from s
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t e0 = c * per_chunk, n = min(per_chunk, a.count - e0);
    if (threadIdx.x == 0 && c > 0) {
      for (int p = 0; p < H && status == kProxyOk; ++p) {
        if (p != me) status = detail::proxy_wait_signal(a.ring, credit + p, a.value_base + c, a.timeout_ns);
      }
    }
    __syncthreads();
    if (status != kProxyOk) break;
    float* out = reinterpret_cast<float*>(a.outbox);
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) out[i] = a.x[e0 + i];
    __threadfence_system();  // the staged chunk before the posts (cumulative)
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int p = 0; p < H && status == kProxyOk; ++p) {
        if (p == me) continue;
        detail::ProxyWrite w{};
        w.peer = p;
        w.src_key = a.outbox_key;
        w.dst_key = a.inbox_keys[p];
        w.dst_offset = static_cast<uint64_t>(me) * a.chunk_bytes;
        w.bytes = static_cast<uint64_t>(n) * 4;
        w.signal_key = a.signal_keys[p];
        w.signal_offset = 8 * (a.base_word + me);
        w.signal_value = a.value_base + c + 1;
        status = detail::proxy_post_write(a.ring, w, a.timeout_ns);
      }
      for (int p = 0; p < H && status == kProxyOk; ++p) {
        if (p != me) status = detail::proxy_wait_signal(a.ring, recv + p, a.value_base + c + 1, a.timeout_ns);
      }
    }
    __syncthreads();
    if (status != kProxyOk) break;
    // 16-byte vectors (chunk starts are 16-byte aligned: x from cudaMalloc, chunk_bytes % 16
    // == 0), then the tail element by element. Each read of a peer's slot crosses PCIe, so
    // vectors carry four times the data per round trip.
    const int64_t n4 = a.x != nullptr && reinterpret_cast<uintptr_t>(a.x) % 16 == 0 ? n / 4 : 0;
    for (int64_t i = threadIdx.x; i < n4; i += blockDim.x) {
      float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
      for (int s = 0; s < H; ++s) {
        float4 v;
        if (s == me) {
          v = reinterpret_cast<const float4*>(a.x + e0)[i];
        } else {
          const float4* src = reinterpret_cast<const float4*>(a.inbox + s * a.chunk_bytes) + i;
          asm volatile("ld.volatile.global.v4.f32 {%0, %1, %2, %3}, [%4];"
                       : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                       : "l"(src));
        }
        if (s == 0) {
          sum = v;
        } else {
          sum = make_float4(sum.x + v.x, sum.y + v.y, sum.z + v.z, sum.w + v.w);
        }
      }
      reinterpret_cast<float4*>(a.x + e0)[i] = sum;
    }
    for (int64_t i = 4 * n4 + threadIdx.x; i < n; i += blockDim.x) {
      float sum = 0.f;
      for (int s = 0; s < H; ++s) {
        float v;
        if (s == me) {
          v = a.x[e0 + i];
        } else {
          const float* src = reinterpret_cast<const float*>(a.inbox + s * a.chunk_bytes) + i;
          asm volatile("ld.volatile.global.f32 %0, [%1];" : "=f"(v) : "l"(src));
        }
        sum = s == 0 ? v : sum + v;
      }
      a.x[e0 + i] = sum;
    }
    __syncthreads();  // every read of the inbox slots is done: credit the sources
    if (threadIdx.x == 0) {
      for (int p = 0; p < H && status == kProxyOk; ++p) {
        if (p == me) continue;
        detail::ProxyWrite w{};
        w.peer = p;
        w.signal_key = a.signal_keys[p];
        w.signal_offset = 8 * (a.base_word + H + me);
        w.signal_value = a.value_base + c + 1;
        status = detail::proxy_post_write(a.ring, w, a.timeout_ns);
      }
    }
    __syncthreads();
    if (status != kProxyOk) break;
  }
  if (threadIdx.x == 0 && status != kProxyOk) atomicCAS(a.status, kProxyOk, status);
}

}  // namespace

cudaError_t launch_proxy_allreduce(const ProxyAllReduce& a, cudaStream_t stream) {
  if (a.hosts < 1 || a.hosts > kProxyMaxHosts || a.rank < 0 || a.rank >= a.hosts ||
      a.count < 0 || a.chunk_bytes == 0 || a.chunk_bytes % 16 != 0 ||
      a.ring.capacity == 0 || (a.ring.capacity & (a.ring.capacity - 1)) != 0) {
    return cudaErrorInvalidValue;
  }
  if (a.count == 0 || a.hosts == 1) return cudaSuccess;
  proxy_allreduce_kernel<<<1, 1024, 0, stream>>>(a);
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
