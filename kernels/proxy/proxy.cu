// The GPU producers of the proxy ring (kernels/proxy/proxy.h): collectives across hosts, and the
// streaming test pair of gpu_proxy_test.
#include "kernels/proxy/detail/proxy_device.cuh"
#include "kernels/proxy/detail/proxy_lane.cuh"
#include "kernels/proxy/proxy.h"

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

constexpr int kProxyThreads = 512;

template <typename T>
__global__ void __launch_bounds__(kProxyThreads, 1) proxy_collective_kernel(ProxyCollective a) {
  detail::ProxyLaneNoHooks none;
  detail::proxy_lane<T>(a, blockIdx.x, none);
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
