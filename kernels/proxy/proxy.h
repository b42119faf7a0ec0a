// GPU producers of the proxy ring (docs/architecture.md; the ring's layout is
// rdma/proxy_ring.h, its protocol rdma/proxy.h): a kernel posts one-sided writes to peers on
// other hosts into a ring in host memory mapped into the device's address space; a host thread
// (rdma::Proxy) drains it into the transport, and the receiver learns arrival from a signal word
// that its kernel polls. For the socket transport every region named in a write (payload source, destination,
// signal) is host memory, mapped for the GPU: the kernels write payloads there and read what
// arrives from there.
//
// This header: the device handle and, as test support, a streaming test kernel pair
// (gpu_proxy_test). The device functions are in detail/proxy_device.cuh.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "fusedcomm/rdma/proxy_ring.h"

namespace fusedcomm::kernels {

// A ring as GPU producers see it. Trivially copyable; passed by value to kernels.
struct ProxyRingDevice {
  rdma::RingHeader* header;   // the ring's header (host memory, device address)
  rdma::ProxyCommand* slots;  // its capacity slots (host memory, device address)
  unsigned long long* next;   // device memory, zeroed with the ring: the producers' next slot
  uint32_t capacity;          // a power of two
  uint32_t reserved;
};
static_assert(sizeof(ProxyRingDevice) == 32, "device-handle layout");
// The handle of a ring laid out (rdma::ProxyRing) at `ring`, a device address of mapped host
// memory, whose producers take slots from the zeroed device counter `next`.
inline ProxyRingDevice proxy_ring_device(void* ring, unsigned long long* next, uint32_t capacity) {
  ProxyRingDevice d{};
  d.header = static_cast<rdma::RingHeader*>(ring);
  d.slots = reinterpret_cast<rdma::ProxyCommand*>(static_cast<uint8_t*>(ring) + sizeof(rdma::RingHeader));
  d.next = next;
  d.capacity = capacity;
  return d;
}

// Result codes of the device-side waits and posts (ProxyStreamTest::status).
inline constexpr uint32_t kProxyOk = 0;
inline constexpr uint32_t kProxyAborted = 1;  // the ring's abort word was set
inline constexpr uint32_t kProxyTimeout = 2;  // a bounded wait ran out

// ---- test support: a credit-controlled stream of messages through the proxy --------------
// The sender writes `count` messages of `bytes` bytes, message m carrying the 32-bit words
// pattern(seed, m, i), into slot m % depth of its outbox and posts a write of it into the same
// slot of the receiver's inbox with the signal value m + 1; before reusing a slot it waits for
// the receiver's credit (its signal >= m - depth + 1). The receiver waits for each message's
// signal, checks every word, and returns a credit (a signal-only write of m + 1). One CTA each.
// Word i of message m of a stream with `seed` (host and device compute the same).
__host__ __device__ inline uint32_t proxy_stream_word(uint32_t seed, uint32_t m, uint64_t i) {
  uint64_t x = (static_cast<uint64_t>(seed) << 32 | m) * 0x9E3779B97F4A7C15ull + i;
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  return static_cast<uint32_t>(x ^ (x >> 32));
}
// depth >= count: the sender never waits for credits (a receiver without a kernel: the host
// polls the signal word).
struct ProxyStreamTest {
  ProxyRingDevice ring;                 // this rank's ring
  int role;                             // 0: sender, 1: receiver
  int peer;                             // the other rank
  uint8_t* outbox;                      // sender: device address of its outbox region
  const uint8_t* inbox;                 // receiver: device address of its inbox region
  const uint64_t* my_signal;            // device address of this rank's signal word
  uint64_t outbox_key, peer_inbox_key;  // sender: regions of the writes
  uint64_t peer_signal_key;             // the peer's signal region
  uint64_t signal_offset;               // the signal word's offset in both ranks' signal regions
  uint64_t bytes;                       // per message, a multiple of 16
  uint32_t depth;                       // slots in the boxes
  uint32_t count;                       // messages
  uint32_t seed;
  uint32_t check;        // receiver: 1 checks every word, 0 only waits (throughput)
  uint64_t timeout_ns;   // every wait
  uint32_t* status;      // device memory: kProxy* of the first failure
  uint32_t* mismatches;  // device memory: words that differed (receiver)
};
cudaError_t launch_proxy_stream_test(const ProxyStreamTest& t, cudaStream_t stream);

// ---- collectives across hosts through the proxy (the inter-host steps of hierarchical ops) ----
// `hosts` ranks (one per host; this is rank `rank`) move fp32 or bf16 elements between device
// buffers of their own, in chunks of `chunk_bytes` (a multiple of 16) staged through mapped host
// memory. blocks[h] and counts[h] (elements) name one buffer per host h:
//   kProxyAllReduce:     blocks[h] = x and counts[h] = count for every h: x becomes the sum over
//                        ranks, in place (proxy_set_all_reduce).
//   kProxyAllGather:     blocks[h]: host h's block, counts[h] elements; this rank's own block
//                        holds its data; afterwards every block holds its host's data.
//   kProxyReduceScatter: blocks[h]: this rank's contribution to host h's block (counts[h]
//                        elements); `out` (counts[rank] elements) gets the sum over ranks of
//                        their contributions to this rank's block. `out` may be blocks[rank].
//   kProxyAllToAll:      blocks[h] (counts[h] elements) goes to host h; recv[s] (recv_counts[s]
//                        elements) gets what host s sent this rank. The own entries are not
//                        touched (the caller copies its own part).
// The counts are the same on every rank (recv_counts[s] on rank r = counts[r] on rank s, for
// allToAll); they set the op's chunks, ceil(max count / elements per chunk)
// (proxy_collective_chunks), and chunk c of every block is its elements [c * per, (c + 1) *
// per), possibly none. Sums are in fp32, in rank order ((x_0 + x_1) + ...),
// rounded once to the element type: every rank gets the same bits.
// Chunks are numbered across the ops on these signal words: this op's chunk c is the link's
// chunk g = B + c, where B, the op's value base, is the previous op's B plus its chunks (every
// rank the same). Chunk g uses stage k = g % depth of each box and is signalled with g + 1.
// Staging (`depth` stages of `hosts` chunk slots in each box; slot (k, h) at byte
// (k * hosts + h) * chunk_bytes):
//   outbox (this rank, `outbox_key`): slot (k, 0) goes to every peer (allReduce, allGather),
//     slot (k, h) to host h (reduceScatter, allToAll);
//   inbox (every rank, `inbox_keys[p]`): slot (k, s) for source s;
//   signals (every rank, `signal_keys[p]`): word l * hosts + s = lane l's chunks received from
//     source s, word (lanes + l) * hosts + s = lane l's chunks that source s has consumed of
//     this rank's (credits);
// with signal offsets 8 * (base_word + word). Signal words only grow and are never reset
// (docs/architecture.md). With `value_counter` (device memory, `lanes` words, zero before the first op
// on these words) lane l reads B from word l and adds its chunks when done, so back-to-back
// launches and CUDA-graph replays each get fresh values with no host involvement; without it,
// B = `value_base`, which the caller advances. Every rank uses the same depth and lanes.
// Lanes (striping): the kernel runs proxy_active_lanes() CTAs (all `lanes`, or lane 0 alone for
// an op that fits its region), and CTA l is an independent instance of the
// protocol below over lane l's region of every slot, bytes [l * R, (l + 1) * R) with R =
// proxy_lane_region(chunk_bytes, lanes) (a chunk's elements past its count are not moved, so
// small chunks leave the later lanes empty: they still exchange their signals). Each lane has
// its own ring (rings[l]: its own proxy thread and connections, which the socket transport's
// receiver threads read in parallel), its own receive and credit words and its own value
// counter, so the lanes never wait for each other; they share nothing but disjoint regions of
// the same slots, which is why a region is fixed per slot and not per chunk size. Why lanes: a
// TCP stream moves what one core copies, and one CTA stages and reads what its loads in flight
// over PCIe allow; both bound a single lane at about 4 GB/s each way on an H100 host
// (docs/performance.md).
// Each lane is a software pipeline: for i = 0 .. chunks + depth - 2 it sends chunk i, then
// receives chunk i - (depth - 1), so up to `depth` chunks are in flight per peer while the CTA
// stages and reads (tests/proxy_protocol_model.py checks it, with lanes and lane-0-only ops):
//   send chunk g: wait until every peer consumed this lane's part of this rank's chunk g -
//     depth (its credit word >= g + 1 - depth; of this op or an earlier one, so back-to-back
//     ops need no host synchronisation: the lane's region of stage k is then free in this
//     outbox and in the peers' inboxes), stage the part(s) in the outbox, post one write per
//     peer (bytes 0 when the lane's region holds none of the chunk: the signal alone);
//   receive chunk g: wait for every peer's part of chunk g (its receive word >= g + 1), sum or
//     copy it out of the inbox, credit each peer (a signal-only write of g + 1).
// Every wait bounded by timeout_ns and polling rings[0]'s abort word (a failing lane's proxy
// sets it too). status: left alone on success; else, if still kProxyOk, a failure as
// proxy_status(code, host whose signal a failed wait was for, -1 when no single host is to
// blame, the op).
inline constexpr int kProxyMaxHosts = 8;
inline constexpr uint32_t kProxyMaxLanes = 4;
// Bytes of each slot that lane l of `lanes` owns: [l * R, (l + 1) * R), R = ceil(chunk_bytes /
// lanes) rounded up to 16 (the last region may be shorter or empty).
__host__ __device__ inline uint64_t proxy_lane_region(uint64_t chunk_bytes, uint32_t lanes) {
  return ((chunk_bytes + lanes - 1) / lanes + 15) / 16 * 16;
}
__host__ __device__ inline uint32_t proxy_status(uint32_t code, int peer, uint32_t op) {
  return code | static_cast<uint32_t>(peer + 1) << 8 | (op & 0xFF) << 16;
}
__host__ __device__ inline uint32_t proxy_status_code(uint32_t status) { return status & 0xFF; }
__host__ __device__ inline int proxy_status_peer(uint32_t status) {
  return static_cast<int>((status >> 8) & 0xFF) - 1;
}
__host__ __device__ inline uint32_t proxy_status_op(uint32_t status) { return (status >> 16) & 0xFF; }
inline constexpr uint32_t kProxyF32 = 0;  // element codes (CommDtype's, collectives.h)
inline constexpr uint32_t kProxyBF16 = 1;
inline constexpr uint32_t kProxyAllReduce = 0;  // ops
inline constexpr uint32_t kProxyAllGather = 1;
inline constexpr uint32_t kProxyReduceScatter = 2;
inline constexpr uint32_t kProxyAllToAll = 3;
inline const char* proxy_op_name(uint32_t op) {
  switch (op) {
    case kProxyAllReduce: return "allReduce";
    case kProxyAllGather: return "allGather";
    case kProxyReduceScatter: return "reduceScatter";
    case kProxyAllToAll: return "allToAll";
    default: return "?";
  }
}
struct ProxyCollective {
  ProxyRingDevice rings[kProxyMaxLanes];  // lane l's ring; the waits poll rings[0]'s abort word
  uint32_t lanes;                         // 1..kProxyMaxLanes (CTAs), the same on every rank
  uint32_t op;                            // kProxyAllReduce, ..., kProxyAllToAll
  uint32_t dtype;                         // kProxyF32 or kProxyBF16
  int rank, hosts;
  void* blocks[kProxyMaxHosts];    // device memory, one per host (above)
  int64_t counts[kProxyMaxHosts];  // elements, the same on every rank
  void* out;                       // reduceScatter: device memory, counts[rank] elements
  void* recv[kProxyMaxHosts];      // allToAll: device memory, one per source host
  int64_t recv_counts[kProxyMaxHosts];
  uint8_t* outbox;          // device address of this rank's outbox
  const uint8_t* inbox;     // device address of this rank's inbox
  const uint64_t* signals;  // device address of this rank's signal words (base_word 0)
  uint64_t outbox_key;
  uint64_t inbox_keys[kProxyMaxHosts];
  uint64_t signal_keys[kProxyMaxHosts];
  uint64_t base_word;                 // first signal word of this op in every signal region
  uint64_t value_base;                // signal values of this op start above it (no counter)
  unsigned long long* value_counter;  // or null: the value bases, one per lane, kept on the device (above)
  uint64_t chunk_bytes;
  uint32_t depth;  // stages per box, 1..kProxyMaxDepth (above)
  uint64_t timeout_ns;
  uint32_t* status;  // device-visible memory (device, or mapped host)
};
inline constexpr uint32_t kProxyMaxDepth = 8;
cudaError_t launch_proxy_collective(const ProxyCollective& a, cudaStream_t stream);
// An allReduce of `count` elements at x, in place.
inline void proxy_set_all_reduce(ProxyCollective& a, void* x, int64_t count) {
  a.op = kProxyAllReduce;
  a.out = x;
  for (int h = 0; h < kProxyMaxHosts; ++h) {
    a.blocks[h] = x;
    a.counts[h] = count;
  }
}
// Elements of the largest block (sent or received) of an op: the same on every rank.
__host__ __device__ inline int64_t proxy_collective_most(const ProxyCollective& a) {
  int64_t most = 0;
  for (int h = 0; h < a.hosts && h < kProxyMaxHosts; ++h) {
    most = a.counts[h] > most ? a.counts[h] : most;
    most = a.recv_counts[h] > most ? a.recv_counts[h] : most;
  }
  return most;
}
// The chunks (signal values) each of the op's lanes uses.
__host__ __device__ inline uint64_t proxy_collective_chunks(const ProxyCollective& a) {
  const uint64_t per = a.chunk_bytes / (a.dtype == kProxyF32 ? 4 : 2);
  return per == 0 ? 0 : (static_cast<uint64_t>(proxy_collective_most(a)) + per - 1) / per;
}
// The lanes (CTAs) an op runs on: lane 0 alone when every block fits its region (a small op
// then has the latency of one lane: one CTA, one proxy thread, one receiving thread), else all.
// An idle lane's words and value counter stay as they are.
__host__ __device__ inline uint32_t proxy_active_lanes(const ProxyCollective& a) {
  const uint64_t bytes = static_cast<uint64_t>(proxy_collective_most(a)) * (a.dtype == kProxyF32 ? 4 : 2);
  return bytes <= proxy_lane_region(a.chunk_bytes, a.lanes) ? 1u : a.lanes;
}

}  // namespace fusedcomm::kernels
