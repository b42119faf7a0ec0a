// The proxy: a ring of write commands in host memory and a thread that drains it into a
// PeerGroup. Producers are host threads (the host backend) or GPU kernels (the cuda backend
// maps the same ring into device address space), so the ring is plain memory with a fixed
// layout and no pointers.
//
// Ring layout (one allocation of ProxyRing::bytes_for(capacity) bytes, 128-byte aligned):
//   [0, 128)                  RingHeader
//   [128, 128 + 128*capacity) ProxyCommand slots, capacity a power of two; slot s lives at
//                             index s & (capacity - 1)
//
// Protocol (multi-producer, single consumer):
//   producer: slot = atomicAdd(header.reserved, 1); wait (bounded) until
//             slot - header.consumed < capacity; fill command fields; store command.seq =
//             slot + 1 with release (system scope when the producer is a GPU).
//             A producer that gives up after its atomicAdd leaves a hole the consumer would
//             wait on forever, so it must set header.abort. The host producer (post) avoids
//             that: it reserves with a compare-and-swap only once slot - consumed < capacity,
//             so its timeout leaves nothing behind. GPU producers (kernels/proxy/) take
//             their slots from a counter in device memory instead of header.reserved (PCIe
//             atomics on host memory are not portable), so one ring has GPU producers or host
//             producers, never both.
//   consumer: for slot = header.consumed: wait until cmd.seq == slot + 1 (acquire); copy the
//             command out; store header.consumed = slot + 1 (release: the slot may be reused);
//             hand the write to the transport; store header.completed = slot + 1 (release:
//             the payload's source bytes may be reused).
//   abort:    nonzero header.abort stops the consumer and fails producers' waits. The host sets
//             it on Proxy::stop(abort) and the proxy sets it when a transport error stops it,
//             so that producers waiting for space give up at once.
// seq is never reset, so a stale command from an earlier lap is never mistaken for a new one.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "fusedcomm/rdma/busy_poll.h"
#include "fusedcomm/rdma/proxy_ring.h"
#include "fusedcomm/rdma/transport.h"

namespace fusedcomm::rdma {

// A host producer's command fields for `op` (all but seq, which publishes them).
void fill_command(ProxyCommand& c, const WriteOp& op);

class ProxyRing {
 public:
  // bytes needed for `capacity` slots (capacity: power of two)
  static size_t bytes_for(uint32_t capacity);
  // Lays a ring over caller-owned, zeroed memory of bytes_for(capacity) bytes.
  ProxyRing(void* memory, uint32_t capacity);
  RingHeader* header() const { return header_; }
  ProxyCommand* slots() const { return slots_; }
  uint32_t capacity() const { return capacity_; }
  // Host-side producer. Blocks (bounded by `timeout`) while the ring is full; throws
  // TransportError if the ring was aborted. Returns the command's sequence number (slot + 1).
  uint64_t post(const WriteOp& op, std::chrono::milliseconds timeout);

 private:
  RingHeader* header_;
  ProxyCommand* slots_;
  uint32_t capacity_;
};

// Drains one ring into one PeerGroup on its own thread. A transport error stops the proxy and
// is kept: error() returns it (the runtime rethrows it on the op's thread). A write to a peer
// that has closed the group politely (PeerState::kClosed) is dropped instead: peers close
// politely only once their protocol needs nothing more from this side.
class Proxy {
 public:
  // also_abort: a second abort word (another ring's, which the producers' waits poll) that a
  // failure of this proxy sets too; null: none. busy_poll: how long the thread polls its ring
  // without sleeping after expect_commands() and after each command (busy_poll.h); zero: it
  // spins briefly, yields, then sleeps in slices of 20 us, and of 200 us once idle for long.
  // signals_sole_writer: every signal word the commands name is written by this ring's commands
  // alone and only grows (the GPU link's protocol, kernels/proxy/proxy.h), so each write says so
  // (WriteOp::signal_sole_writer).
  Proxy(ProxyRing ring, PeerGroup& group, uint64_t* also_abort = nullptr,
        std::chrono::microseconds busy_poll = std::chrono::microseconds(0), bool signals_sole_writer = false);
  ~Proxy();  // stops the thread
  Proxy(const Proxy&) = delete;
  Proxy& operator=(const Proxy&) = delete;
  ProxyRing& ring() { return ring_; }
  // A hint from the producer's side that commands are coming (a kernel that posts to this ring
  // is being enqueued): the thread polls without sleeping for the busy-poll window, woken now
  // if it sleeps. Any thread; cheap when the thread is already polling.
  void expect_commands() noexcept;
  // Empty while healthy; otherwise the first failure's message. `failed_peer()` names the
  // peer: -2 while healthy, -1 for a failure no single peer caused (a malformed command, an
  // undrained stop), else the rank.
  std::string error() const;
  int failed_peer() const;
  // Stops the thread after the ring is drained (bounded) or at once (abort). A drain that runs
  // past `timeout` stops anyway and records an error. Idempotent.
  void stop(bool drain, std::chrono::milliseconds timeout);

 private:
  void run();
  void idle(uint32_t& spins);  // one step of waiting for the next command
  void fail(int peer, const std::string& msg);
  ProxyRing ring_;
  PeerGroup& group_;
  uint64_t* also_abort_;
  bool sole_writer_;
  BusyPollWindow window_;
  std::mutex sleep_mu_;  // with sleep_cv_: expect_commands() wakes a sleeping thread
  std::condition_variable sleep_cv_;
  std::atomic<bool> sleeping_{false};
  std::atomic<bool> stop_{false};
  mutable std::atomic<int> failed_peer_{-2};
  mutable std::mutex error_mu_;  // guards error_
  std::string error_;
  std::thread thread_;
};

}  // namespace fusedcomm::rdma
