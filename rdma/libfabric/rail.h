// One endpoint of the libfabric backend (a rail, a NIC, has LibfabricOptions::stripes of them):
// its own fabric, domain, address vector, completion queue and reliable-datagram endpoint on the
// NIC, the control buffers its messages travel in,
// and the queue of messages waiting for a send slot. Every libfabric call on a rail's objects
// holds Rail::mu (the hints ask for FI_THREAD_DOMAIN); the rail knows nothing of groups: the
// operations it posts carry an Op context that the core (core.h) reads back from completions.
#pragma once

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_rma.h>

#include <chrono>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "api.h"
#include "provider.h"
#include "wire.h"

namespace fusedcomm::rdma::libfabric {

struct GroupState;

// What a writer waits on: the local completions of its payload writes.
struct WriteWait {
  std::atomic<int> left{0};  // writes not completed yet
  std::atomic<bool> failed{false};
  std::mutex mu;
  std::string error;  // the first failure (mu)
};

// The context of one posted operation; libfabric hands it back in the completion.
struct Op {
  fi_context2 ctx;  // first: the provider's scratch space (FI_CONTEXT / FI_CONTEXT2 modes)
  enum Kind : uint8_t { kRecv, kSend, kWrite } kind = kRecv;
  uint32_t buffer = 0;              // kRecv, kSend: control buffer index
  std::weak_ptr<GroupState> group;  // kSend, kWrite: whose outstanding count it is in
  int peer = -1;                    // kSend, kWrite: the destination rank
  bool counted = false;             // kSend: in the group's outstanding count
  std::shared_ptr<WriteWait> wait;  // kWrite
  uint64_t signal_value = 0;        // kWrite with a signal iov: the word's source until completion
};

// What a completion says, for the core to act on.
struct Event {
  enum Kind { kMessage, kPayload, kSendDone, kWriteDone } kind = kMessage;
  wire::Msg msg{};                  // kMessage: a copy (the buffer is posted again at once)
  size_t msg_bytes = 0;             // kMessage: how many bytes arrived
  uint64_t data = 0;                // kPayload: the remote CQ data
  Op* op = nullptr;                 // kSendDone, kWriteDone (kWriteDone: the core deletes it)
  std::weak_ptr<GroupState> group;  // kSendDone
  int peer = -1;                    // kSendDone
  bool counted = false;             // kSendDone: in the group's outstanding count
  int error = 0;                    // kSendDone, kWriteDone: 0, or the provider's error code
  std::string error_text;           // with error: fi_cq_strerror's text
};

// A registration of one region on one rail.
struct RailMr {
  fid_mr* mr = nullptr;
  void* desc = nullptr;  // for local buffers (FI_MR_LOCAL)
  uint64_t key = 0;      // what peers name it by in their writes
};

class Rail {
 public:
  // Opens fabric, domain, address vector, completion queue (with a wait fd where the provider
  // has one) and endpoint for `info` (not kept), posts the receives. Throws TransportError.
  Rail(const FabricApi& api, const fi_info& info, int index);
  ~Rail();
  Rail(const Rail&) = delete;
  Rail& operator=(const Rail&) = delete;

  int index() const { return index_; }
  const Caps& caps() const { return caps_; }
  const std::string& name() const { return name_; }  // the endpoint's raw address
  int wait_fd() const { return wait_fd_; }           // -1: none (poll with back-off)

  // The address-vector entry of a peer's raw endpoint name, inserted on first use and kept for
  // the rail's life (executors are few and long-lived). Throws TransportError.
  fi_addr_t insert(const std::string& raw_name);

  // Queues a message to `dest` and sends what the send slots allow; `group`/`peer` name the
  // pair, `counted` whether it is in the group's outstanding count (the caller incremented
  // it). False if the rail is closed.
  bool send(fi_addr_t dest, const wire::Msg& m, std::weak_ptr<GroupState> group, int peer, bool counted);
  // Whether messages wait in the outbox (poll() sends them as slots free up).
  bool has_backlog();

  // Posts one RMA write (fi_writedata with `data` when cq_data, else fi_writemsg with
  // FI_DELIVERY_COMPLETE). Returns 0, -FI_EAGAIN (try again after progress), or another
  // negative code. `op` is the rail's until its completion comes back.
  int post_write(Op* op, const void* src, size_t bytes, void* desc, fi_addr_t dest, uint64_t remote_addr,
                 uint64_t remote_key, bool cq_data, uint64_t data);
  // The same write (cq_data mode) with op->signal_value as a second iov into the signal word at
  // (signal_addr, signal_key): one operation placing the payload, then the word (Caps::ordered_iovs).
  int post_write_with_signal(Op* op, const void* src, size_t bytes, void* desc, fi_addr_t dest,
                             uint64_t remote_addr, uint64_t remote_key, uint64_t signal_addr,
                             uint64_t signal_key, uint64_t data);

  // Reads up to `max` completions (progressing the provider) into *events; reposts receive
  // buffers. Returns how many completions it read.
  int poll(std::vector<Event>* events, int max);
  // Blocks until the wait fd (or `wake_fd`) is readable or `timeout` passes, when the provider
  // says nothing is pending (fi_trywait); returns at once otherwise.
  void wait(int wake_fd, std::chrono::nanoseconds timeout);

  // Registers [base, base + bytes) for local writes and remote writes, under a fresh random
  // remote key, or under `key` where one is given (a provider that takes requested keys):
  // throws KeyTaken where that key is in use on this domain. Throws TransportError.
  struct KeyTaken {};
  RailMr register_memory(void* base, uint64_t bytes, uint64_t key = 0);
  void deregister(const RailMr& mr);

  // Closes the endpoint and everything under it; later calls fail or do nothing. Idempotent.
  void close();

 private:
  void post_recv(uint32_t buffer);  // mu held
  // The Op a completion names, if it is one this rail posted (mu held); null otherwise.
  Op* ours(void* context);
  // Sends queued messages while slots and the provider allow; failed posts become kSendDone
  // events with the error (mu held).
  void flush_locked(std::vector<Event>* failed);
  char* buffer(uint32_t i) { return slab_.data() + size_t{i} * sizeof(wire::Msg); }
  uint64_t fresh_key();

  const FabricApi& api_;
  const int index_;
  Caps caps_;
  std::mutex mu_;
  bool open_ = false;
  fid_fabric* fabric_ = nullptr;
  fid_domain* domain_ = nullptr;
  fid_av* av_ = nullptr;
  fid_cq* cq_ = nullptr;
  fid_ep* ep_ = nullptr;
  int wait_fd_ = -1;
  std::string name_;
  std::unordered_map<std::string, fi_addr_t> av_index_;
  // Control buffers: [0, kRecvBuffers) posted receives, then the send slots.
  std::vector<char> slab_;
  RailMr slab_mr_;
  std::vector<Op> ops_;  // one per buffer
  std::vector<uint32_t> free_send_;
  std::vector<uint32_t> unposted_;  // receive buffers whose fi_recv failed (posted again by poll)
  struct Queued {
    fi_addr_t dest;
    wire::Msg msg;
    std::weak_ptr<GroupState> group;
    int peer;
    bool counted;
    std::chrono::steady_clock::time_point queued;
  };
  std::deque<Queued> outbox_;
  std::vector<Event> failed_;       // sends that failed in send(); poll() reports them
  std::unordered_set<Op*> writes_;  // posted writes whose completion has not come back
};

}  // namespace fusedcomm::rdma::libfabric
