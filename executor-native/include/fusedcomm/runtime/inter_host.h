// The cuda backend's path between hosts (docs/architecture.md): one rank's link to its counterparts,
// the ranks with the same local index on the other hosts. Kernels post one-sided writes into a
// proxy ring in mapped host memory (kernels/proxy/proxy.h); a proxy thread drains it into a peer
// group of the executor's transport; payloads and signal words arrive in mapped host memory
// that the kernels poll.
//
// Life cycle (CudaComm's CrossHostPaths drives it; every counterpart the same):
//   InterHostLink link(runtime, host, hosts, chunk_bytes);   // regions registered
//   blobs = exchange(link.blob());                           // over the host communicator
//   link.connect(counterparts' blobs, comm_id, key);         // peer group + proxy thread
//   link.all_reduce(x, count, dtype, stream) ...             // or all_gather, reduce_scatter,
//                                                            // all_to_all:
//                                                            // enqueued, stream-ordered
//   link.raise_if_failed()                                    // after the stream's work is done
//   link.close(drain)                                         // after a barrier of all ranks
//
// Lanes: the link stripes each chunk over `lanes` (RuntimeConfig::transport_streams) peer
// groups, each with its own proxy ring and thread and its own connections (which the socket
// transport's receiver threads read in parallel), because a TCP stream's throughput is bounded
// by the one core that copies it (kernels/proxy/proxy.h, "Lanes").
//
// Memory (pinned, mapped for the GPU; registered with the transport): an outbox and an inbox
// of 2 stages x `hosts` chunk slots each (two chunks in flight per counterpart), a page of
// signal words; and, not registered, a ring per lane, their device-side slot counters and a
// status word. Signal words only grow (each op's values start
// above the previous op's, from a counter on the device), so no word is reset between ops and
// every op, replayed in a CUDA graph or not, gets fresh values.
//
// Not thread-safe (CudaComm serialises its ops); abort() may come from any thread.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fusedcomm/rdma/proxy.h"
#include "fusedcomm/runtime/mapped_host.h"
#include "fusedcomm/runtime/runtime.h"
#include "kernels/collectives/collectives.h"
#include "kernels/proxy/proxy.h"

namespace fusedcomm {

class InterHostLink {
 public:
  // What a counterpart needs to reach this rank: its transport address and region keys.
  struct Blob {
    // Transport::address(), NUL-terminated: a libfabric address names each rail's endpoint
    // in hex (EFA: about 70 characters a rail, up to 8 rails).
    char address[640];
    uint64_t inbox_key, signal_key;
    // This rank's chunk and lanes: both shape the protocol's slots, so connect() refuses
    // counterparts that differ in either.
    uint64_t chunk_bytes;
    uint32_t lanes;
    uint32_t reserved;
  };

  // `host` of `hosts` (2..kProxyMaxHosts); chunk_bytes: a positive multiple of 16; lanes:
  // 1..kProxyMaxLanes, the same on every counterpart.
  InterHostLink(Runtime& runtime, int host, int hosts, uint64_t chunk_bytes, int lanes);
  // The chunk a runtime's link uses: spark.fusedcomm.host.chunkBytes for each of its
  // transport_streams lanes, because a lane's part below ~1 MiB leaves too little in flight (on
  // 1 x H100, 2 streams moved 5.0 GB/s per end with 512 KiB parts, 7.5 with 1 MiB; 4 streams 7.0
  // with 256 KiB, 10.4 with 1 MiB).
  static uint64_t chunk_bytes_for(const RuntimeConfig& config);
  ~InterHostLink();
  InterHostLink(const InterHostLink&) = delete;
  InterHostLink& operator=(const InterHostLink&) = delete;

  Blob blob() const;
  uint64_t chunk_bytes() const { return chunk_bytes_; }
  // blobs[h]: host h's counterpart (this rank's own at `host`). names[h]: how messages name it
  // ("rank 5 (host 1)"). comm_id: unique among the groups of this job on these transports.
  // key: authenticates the connections (rdma/auth.h; the communicator's key: the handshake
  // covers comm_id, so groups sharing it stay apart). Bounded by the runtime's connect timeout;
  // `cancel` (may be null), once set from another thread, ends the wait at once with
  // Error(kCommunicator).
  void connect(const std::vector<Blob>& blobs, const std::vector<std::string>& names, uint64_t comm_id,
               const rdma::auth::Key& key, const std::atomic<bool>* cancel = nullptr);

  // The ops (kernels/proxy/proxy.h, ProxyCollective), enqueued on `stream`; device memory; every
  // counterpart calls the same op with the same counts and dtype. Sums are in fp32, in host
  // order, rounded once.
  // allReduce: the sum over hosts of `count` elements at x, in place.
  void all_reduce(void* x, int64_t count, kernels::CommDtype dtype, cudaStream_t stream);
  // allGather: blocks[h] (counts[h] elements) gets host h's block; blocks[host] holds this one's.
  void all_gather(const std::vector<void*>& blocks, const std::vector<int64_t>& counts,
                  kernels::CommDtype dtype, cudaStream_t stream);
  // reduceScatter: contributions[h] (counts[h] elements) is this rank's part of host h's block;
  // out (counts[host] elements; may be contributions[host]) gets the sum of this host's block.
  void reduce_scatter(const std::vector<void*>& contributions, const std::vector<int64_t>& counts, void* out,
                      kernels::CommDtype dtype, cudaStream_t stream);
  // allToAll: sends[h] (send_counts[h] elements) goes to host h's counterpart; recvs[s]
  // (recv_counts[s]) gets what host s's counterpart sent. The own entries are not touched.
  void all_to_all(const std::vector<void*>& sends, const std::vector<int64_t>& send_counts,
                  const std::vector<void*>& recvs, const std::vector<int64_t>& recv_counts,
                  kernels::CommDtype dtype, cudaStream_t stream);
  // For a kernel that runs the link's protocol itself (kernels/ag_gemm's allGatherGemm across
  // hosts): fills a's link fields (rings, lanes, rank, boxes, keys, signal words, value counters,
  // chunk, depth, timeout, status) and wakes the link's threads as an op does; the caller sets
  // op, dtype, blocks and counts and launches, on the stream of the link's other ops.
  void prepare(kernels::ProxyCollective& a, kernels::CommDtype dtype);
  // Throws, naming the op that gave up and this rank, if an enqueued step gave up:
  // Error(kTimeout) for a counterpart that never arrived, Error(kTransport) for a broken
  // connection (the proxy's error names the peer), Error(kCommunicator) after abort(). Reads a
  // host-mapped word: call it after the stream's work is done for a definite answer.
  void raise_if_failed();
  bool failed() const;
  // The status word raise_if_failed reads (device address; 0 while every step succeeded), for
  // a stream-ordered check after a step (kernels/collectives launch_comm_fail_if).
  const uint32_t* status_device() const { return status_dev_; }

  void abort() noexcept;  // waits in flight give up, the proxy and the connections stop
  // drain: the proxy hands over what was posted and the group closes politely (bounded);
  // else both stop at once. Idempotent; the caller has synchronised this rank's stream work.
  void close(bool drain) noexcept;

 private:
  kernels::ProxyCollective per_host(uint32_t op, const std::vector<void*>& blocks,
                                    const std::vector<int64_t>& counts) const;
  void launch(kernels::ProxyCollective& a, kernels::CommDtype dtype, cudaStream_t stream);
  void* ring(int lane, bool device) const;  // lane's ring in ring_memory_ (host or device address)

  Runtime& runtime_;
  const int host_, hosts_;
  const uint64_t chunk_bytes_;
  const int lanes_;
  std::unique_ptr<MappedHostMemory> outbox_, inbox_, signals_, ring_memory_;
  std::vector<rdma::Region> regions_;        // outbox, inbox, signals
  unsigned long long* next_slot_ = nullptr;  // device memory: each lane's ring's next slot,
                                             // then each lane's signal value base (kernels/proxy/proxy.h)
  volatile uint32_t* status_ = nullptr;      // in ring_memory_, after the rings (host address)
  uint32_t* status_dev_ = nullptr;           // the same word, device address
  kernels::ProxyRingDevice ring_devices_[kernels::kProxyMaxLanes]{};
  std::vector<Blob> peers_;
  std::vector<std::string> names_;
  std::vector<std::unique_ptr<rdma::PeerGroup>> groups_;  // by lane
  std::vector<std::unique_ptr<rdma::Proxy>> proxies_;     // by lane
  bool closed_ = false, aborted_ = false;
};

}  // namespace fusedcomm
