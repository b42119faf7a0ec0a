// The device side of the proxy ring (kernels/proxy/proxy.h): posting a write, and waiting for a
// signal word in mapped host memory. One thread calls each; both are bounded.
#pragma once

#include "kernels/common/sm90_primitives.cuh"
#include "kernels/proxy/proxy.h"

namespace fusedcomm::kernels::detail {

// One write (rdma::WriteOp's fields) to rank `peer`.
struct ProxyWrite {
  int peer;
  uint64_t src_key, src_offset;
  uint64_t dst_key, dst_offset;
  uint64_t bytes;
  uint64_t signal_key, signal_offset, signal_value;
};

// Polls until ready() holds: kProxyOk, or kProxyAborted once the ring's abort word is set (the
// proxy failed or the host aborted), or kProxyTimeout after timeout_ns. Backs off up to 2 us.
template <class Ready>
__device__ __forceinline__ uint32_t proxy_poll(const ProxyRingDevice& r, uint64_t timeout_ns, Ready ready) {
  if (ready()) return kProxyOk;
  const uint64_t t0 = globaltimer_ns();
  uint32_t backoff = 32;
  while (!ready()) {
    if (ld_relaxed_sys(&r.header->abort) != 0) return kProxyAborted;
    if (globaltimer_ns() - t0 >= timeout_ns) return kProxyTimeout;
    __nanosleep(backoff);
    backoff = backoff < 2048 ? backoff * 2 : 2048;
  }
  return kProxyOk;
}

// Posts `w` into the ring (rdma/proxy.h's producer protocol, with the slot taken from the
// device-side counter). The payload must already be visible at system scope to the proxy: its
// writers fenced (fence.sc.sys) and synchronised with this thread (a CTA barrier), so that
// the release of the command's seq is cumulative over them.
// Returns kProxyOk, or kProxyAborted / kProxyTimeout while the ring stayed full (then the ring
// is aborted: a reserved slot that is never filled would stall the proxy).
inline __device__ __noinline__ uint32_t proxy_post_write(const ProxyRingDevice& r, const ProxyWrite& w,
                                                         uint64_t timeout_ns) {
  const uint64_t slot = atomicAdd(r.next, 1ull);
  // consumed only grows and never passes this slot's predecessors, so slot - consumed is
  // well-defined; acquire: the proxy's reads of the old command in this slot are done.
  const uint32_t s =
      proxy_poll(r, timeout_ns, [&] { return slot - ld_acquire_sys(&r.header->consumed) < r.capacity; });
  if (s == kProxyTimeout) st_release_sys(&r.header->abort, 1);
  if (s != kProxyOk) return s;
  rdma::ProxyCommand* c = &r.slots[slot & (r.capacity - 1)];
  c->op = static_cast<uint32_t>(rdma::ProxyOp::kWrite);
  c->peer = w.peer;
  c->src_key = w.src_key;
  c->src_offset = w.src_offset;
  c->dst_key = w.dst_key;
  c->dst_offset = w.dst_offset;
  c->bytes = w.bytes;
  c->signal_key = w.signal_key;
  c->signal_offset = w.signal_offset;
  c->signal_value = w.signal_value;
  // Publishes the fields (and, cumulatively, the payload): the proxy acquires seq first.
  st_release_sys(&c->seq, slot + 1);
  return kProxyOk;
}

// Waits until *signal >= value (a word the transport raises with release ordering after the
// payload; acquire here: this thread's later reads, and those of threads that synchronise with
// it through a barrier, see the payload). Results as proxy_poll.
inline __device__ __noinline__ uint32_t proxy_wait_signal(const ProxyRingDevice& r, const uint64_t* signal,
                                                          uint64_t value, uint64_t timeout_ns) {
  return proxy_poll(r, timeout_ns, [&] { return ld_acquire_sys(signal) >= value; });
}

}  // namespace fusedcomm::kernels::detail
