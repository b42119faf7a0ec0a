// Test support for the GPU producers of the proxy ring (kernels/proxy.h): the streaming pair
// of gpu_proxy_test.
#include "fusedcomm/kernels/detail/proxy_device.cuh"
#include "fusedcomm/kernels/proxy.h"

namespace fusedcomm::kernels {
namespace {

__device__ __forceinline__ uint32_t stream_word(uint32_t seed, uint32_t m, uint64_t i) {
  uint64_t x = (static_cast<uint64_t>(seed) << 32 | m) * 0x9E3779B97F4A7C15ull + i;
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  return static_cast<uint32_t>(x ^ (x >> 32));
}

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
        dst[i] = make_uint4(stream_word(t.seed, m, 4 * i), stream_word(t.seed, m, 4 * i + 1),
                            stream_word(t.seed, m, 4 * i + 2), stream_word(t.seed, m, 4 * i + 3));
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
        bad += (v.x != stream_word(t.seed, m, 4 * i)) + (v.y != stream_word(t.seed, m, 4 * i + 1)) +
               (v.z != stream_word(t.seed, m, 4 * i + 2)) + (v.w != stream_word(t.seed, m, 4 * i + 3));
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

}  // namespace

cudaError_t launch_proxy_stream_test(const ProxyStreamTest& t, cudaStream_t stream) {
  if (t.bytes % 16 != 0 || t.depth == 0 || (t.role != 0 && t.role != 1) ||
      t.ring.capacity == 0 || (t.ring.capacity & (t.ring.capacity - 1)) != 0) {
    return cudaErrorInvalidValue;
  }
  proxy_stream_kernel<<<1, 512, 0, stream>>>(t);
  return cudaGetLastError();
}

}  // namespace fusedcomm::kernels
