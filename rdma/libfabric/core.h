// The libfabric backend of the transport interface: reliable-datagram endpoints
// (LibfabricOptions::stripes per rail), RMA writes into registered regions, signals ordered
// after their payloads, the socket backend's authentication. Wire format and protocol: wire.h.
//
// This header holds the backend's shared state, private to rdma/libfabric/: a pair's state
// (Peer), a group (GroupState) and the per-transport core (Core: rails, registry, groups,
// progress threads). The files beside it implement them, one concern each:
//   api.cc                    libfabric's exported entry points, through dlopen (api.h)
//   provider.cc               providers, hints, capabilities, the per-provider probe
//   rail.cc                   an endpoint's objects, control buffers and completions (rail.h)
//   core.cc                   Core's construction and shutdown, the progress threads, liveness
//   registry.cc               registered regions (one registration per rail), writes to self
//   handshake.cc              both halves of the handshake, over messages
//   connect.cc                building a group: addresses, dialing, waiting, the timeout text
//   receive.cc                messages and payload arrivals: signals in order, region queries
//   send.cc                   the write path (PeerGroup::write)
//   group.cc                  closing, aborting and releasing a group
//   libfabric_transport.cc    the Transport and PeerGroup classes, make_libfabric_transport
//
// Threads
//   - Each endpoint has a progress thread: it reads the completion queue (which progresses the
//     provider), handles what arrives (handshakes, signals, queries, payload arrivals), sends
//     heartbeats and fails silent peers. Idle, it spins briefly, then sleeps in growing slices
//     (up to 1 ms), on the completion queue's wait fd where the provider has one; a busy-poll
//     window (busy_poll.h) keeps it polling around traffic.
//   - A writer (the proxy) and connect()/close() progress the group's endpoints themselves while
//     they wait, so that a wait does not depend on the progress threads' sleep; between polls
//     they sleep on GroupState::cv, which the progress threads notify.
//   - Lock order: Core::groups_mu_ / streams_mu_ / hs_mu_ (never nested) before
//     GroupState::mu before Rail's mutex; the registry's reg_mu_ before Rail's mutex. Events are
//     handled with no lock held.
//
// Closing (as the socket backend's: kClosed is not an error, kFailed is)
//   - close(): waits (bounded) for this group's posted writes and messages, sends kBye to every
//     peer, waits for every peer's kBye and for everything sent before it, then releases.
//   - kAbort (abort(), a destroyed group) marks the sender kFailed at its peers with "peer rank R
//     at ADDRESS closed the connection"; a killed process is failed by its closed socket (tcp)
//     or by silence (peer_timeout, counted only while this endpoint is read: housekeeping()).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "../socket/handshake.h"
#include "../src/regions.h"
#include "api.h"
#include "fusedcomm/rdma/busy_poll.h"
#include "fusedcomm/rdma/transport.h"
#include "provider.h"
#include "rail.h"
#include "wire.h"

namespace fusedcomm::rdma::libfabric {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// A hello parked for a group that is not connecting here yet, and a challenge waiting for its
// proof, live this long; at most kMaxParked hellos per transport and kChallengesPerPeer
// challenges per (group, rank) are kept (the oldest goes to make room).
constexpr milliseconds kHandshakeTimeout{1500};
constexpr size_t kMaxParked = 128;
constexpr size_t kChallengesPerPeer = 4;
constexpr milliseconds kHelloRetry{250};          // a dialer repeats its hello this often
constexpr milliseconds kHousekeeping{20};         // heartbeats, silence and expiry checks
// An endpoint whose completion queue was not read to empty for this long was not listening
// (its process starved of CPU, a writer driving it descheduled): silence counts from its return.
constexpr milliseconds kDeafGap{100};
constexpr milliseconds kSendStallTimeout{60000};  // a write making no progress this long fails
constexpr int kPollBatch = 64;                    // completions handled per poll
// A write this large or larger is split over the group's endpoints (LibfabricOptions::stripes):
// below it a second endpoint's thread costs more than its copies save.
constexpr uint64_t kStripeMinBytes = uint64_t{4} << 20;
// ... in this many parts at most (the group's first endpoints): more parts cost more threads'
// time than they saved on tcp.
constexpr int kSplitParts = 2;
constexpr int kMaxStripes = 8;

enum class Phase { kConnecting, kLive, kClosing, kDone };

// Where a peer's region lives, from its kRegion answer.
struct RemoteRegion {
  uint64_t addr = 0;  // remote address of the region's first byte (0 with offset addressing)
  uint64_t key = 0;   // remote key on the group's rail
  uint64_t bytes = 0;
};

// One op of a pair in remote-CQ-data mode, until it and every op before it have arrived.
struct RxOp {
  bool need_payload = false, got_payload = false;
  bool need_signal = false, got_signal = false;
  uint64_t key = 0, offset = 0, value = 0;  // the signal
  uint64_t bytes_through = 0;               // bytes the writer had sent through this op
};

// This rank's state of its pair with one peer of a group (GroupState::mu).
struct Peer {
  fi_addr_t addr = FI_ADDR_NOTAVAIL;   // the peer's published endpoint on the group's rail
  std::vector<fi_addr_t> stripe_addr;  // its endpoint on each of GroupState::endpoints
  // Authentication.
  bool up = false;  // both proofs checked: the pair carries data (counted open)
  PeerState state = PeerState::kConnected;
  std::string error;
  uint64_t session = 0;     // the pair's tag (wire.h); set once the proofs are known
  uint32_t out_stream = 0;  // the peer's stream id for our payload writes
  uint32_t in_stream = 0;   // ours for its payload writes
  bool lost = false;        // was up during connect(), then went away
  std::string refused;      // why a dial claiming to be it failed (acceptor side)
  // The dial to a lower rank.
  struct Dial {
    enum Stage { kIdle, kAwaitChallenge, kAwaitAccept, kDone } stage = kIdle;
    auth::Nonce nd{}, na{};
    rdma::wire::WireHandshake hello{};
    Clock::time_point sent_at{};
    std::string last_error = "no answer yet";
  } dial;
  // Challenges sent to a higher rank's hellos, waiting for a proof.
  struct Challenge {
    rdma::wire::WireHandshake hello{}, sent{};
    uint32_t dialer_stream = 0;
    Clock::time_point at{};
  };
  std::vector<Challenge> challenges;
  // Sending.
  uint64_t next_seq = 0;  // last sequence number given (remote CQ data mode)
  uint64_t acked = 0;     // the peer has every op up to this
  uint64_t signals_sent = 0, bytes_sent = 0;
  std::unordered_map<uint64_t, RemoteRegion> regions;  // by the peer's region key
  uint64_t next_query = 0;
  std::unordered_map<uint64_t, std::pair<bool, RemoteRegion>> answers;  // kRegion by request id
  Clock::time_point last_sent{};
  // Receiving.
  uint64_t delivered = 0;  // every op up to this arrived and its signal is applied
  uint64_t ack_sent = 0;
  uint64_t signals_received = 0, bytes_received = 0;
  std::map<uint64_t, RxOp> early;  // ops past `delivered + 1` or incomplete
  Clock::time_point last_heard{};
  bool bye_seen = false;
  uint64_t bye_ops = 0, bye_signals = 0, bye_bytes = 0;
  // Everything the peer sent before its kBye has arrived.
  bool drained() const { return bye_seen && delivered >= bye_ops && signals_received >= bye_signals; }
};

class Core;

// The shared state of one PeerGroup.
struct GroupState : std::enable_shared_from_this<GroupState> {
  std::shared_ptr<Core> core;
  auth::Key key{};  // GroupSpec::key; never sent
  uint64_t comm_id = 0;
  int rank = 0;
  int world = 1;
  // The endpoints (Core::rail()) of NIC GroupSpec::lane % rails, the group's own first: lanes
  // of one NIC start at different endpoints, so that each lane has its own connections and
  // progress thread, as each lane has its own connections on the socket backend. Messages
  // travel on the group's own endpoint `rail`; a large write is split over all of them.
  std::vector<int> endpoints;
  int rail = 0;  // endpoints[0]
  std::vector<std::string> addresses;

  mutable std::mutex mu;
  std::condition_variable cv;
  Phase phase = Phase::kConnecting;  // mu
  std::vector<Peer> peers;           // by rank; mu
  int connected = 0;                 // peers up; mu
  int failed_peer = -1;              // first failure; mu
  std::string failed_msg;            // mu
  int dial_failed = -1;              // a dial that must end connect(); mu
  std::string dial_failure;          // mu
  std::atomic<bool> aborted{false};
  // Writes and counted messages of this group posted but not completed: close() drains them.
  std::atomic<int64_t> outstanding{0};

  std::string who(int r) const {
    return "peer rank " + std::to_string(r) + " at " +
           (r >= 0 && r < static_cast<int>(addresses.size()) ? addresses[r] : std::string("?"));
  }
  std::string self() const { return "rank " + std::to_string(rank) + " of communicator " + hex(comm_id); }
  socket_backend::handshake::Side side() const { return {&key, comm_id, rank, world, &addresses}; }

  // Records a failure of peer r (mu held); the first failure of the group is what check() throws.
  void fail_locked(int r, const std::string& msg);
  // The peer went away while the group is connecting (mu held): its slot is free again.
  void lose_locked(int r);
  void check() const;
  PeerState status(int r) const;

  // A post-handshake message to peer r (header and session filled in here). `counted`: close()
  // waits for its completion. Takes mu.
  void send(int r, wire::Msg m, bool counted);
  void send_locked(int r, wire::Msg m, bool counted);

  void write(const WriteOp& op);
  void close(milliseconds timeout);
  void abort();
  void release();

  // Progresses the group's endpoints (the first `polled` of them; 0: all) until pred() (taking
  // mu) holds, the deadline passes or the group is aborted; true if pred() held. Backs off from
  // spinning to short sleeps. With `drive`, their progress threads stand aside while this one
  // polls (Core::drive); without, they poll beside it (the parts of a split write, each
  // endpoint's thread moving its own socket's bytes).
  template <class Pred>
  bool progress_until(Pred pred, Clock::time_point deadline, int polled = 0, bool drive = true);

 private:
  RemoteRegion remote_region(int peer, const WriteOp& op);
};

class Core : public std::enable_shared_from_this<Core> {
 public:
  explicit Core(const LibfabricOptions& o);
  ~Core();
  void shutdown();

  const std::string& address() const { return address_; }
  std::string describe() const;
  Region register_memory(void* base, uint64_t bytes);
  void deregister_memory(const Region& r);
  std::shared_ptr<GroupState> connect(const GroupSpec& spec);
  TransportStats stats() const;
  void expect_traffic() noexcept;
  void expect_traffic(int i) noexcept;  // endpoint i only (a part of a write was posted there)

  bool running() const { return running_.load(); }
  // Endpoint i: stripe i % stripes() of NIC i / stripes().
  Rail& rail(int i) { return *rails_[i]; }
  int stripes() const { return stripes_; }
  const Caps& caps() const { return caps_; }
  bool cq_data() const { return cq_data_; }
  const wire::CqDataLayout& layout() const { return layout_; }
  const LibfabricOptions& options() const { return options_; }

  // Reads and handles what rail i has ready; returns how many completions it read.
  int progress(int i);
  // A thread in GroupState::progress_until polls endpoint i itself between drive(i) and
  // undrive(i); meanwhile the endpoint's progress thread stands aside (run()), since two
  // pollers of one endpoint only take turns at its lock.
  void drive(int i) noexcept;
  void undrive(int i) noexcept;
  // The source bytes and this rail's descriptor of a local write; throws std::invalid_argument.
  const char* source(uint64_t key, uint64_t offset, uint64_t bytes, int rail, void** desc) const;
  void local_write(const WriteOp& op);

  std::atomic<uint64_t> bytes_sent{0};
  std::atomic<uint64_t> bytes_received{0};
  std::atomic<uint64_t> open_connections{0};

 private:
  friend struct GroupState;
  // A registered region and its registration on each rail.
  struct Registration {
    Region region;
    std::vector<RailMr> mrs;  // by rail
  };
  struct StreamSlot {
    std::weak_ptr<GroupState> group;
    int peer = -1;
    bool used = false;
  };
  struct Parked {
    int rail = 0;
    wire::Msg msg{};
    Clock::time_point at{};
  };

  void run(int rail);  // a rail's progress thread
  // Heartbeats, silent peers, expired handshakes of rail `rail`'s groups; only its thread calls it.
  void housekeeping(int rail, Clock::time_point now);
  void handle(int rail, Event& e);
  // receive.cc
  void on_message(int rail, const wire::Msg& m, size_t bytes);
  void on_payload(int rail, uint64_t data);
  void on_query(GroupState& g, int p, const wire::Msg& m);  // g.mu held
  // Applies a signal from peer p (g.mu held); an invalid word fails the peer.
  void apply_signal(GroupState& g, int p, uint64_t key, uint64_t offset, uint64_t value);
  void advance(GroupState& g, int p);  // remote CQ data mode: delivers ops in order (g.mu held)
  // handshake.cc
  void on_handshake(int rail, const wire::Msg& m);
  void on_hello(const std::shared_ptr<GroupState>& g, const wire::Msg& m);
  void on_proof(GroupState& g, const wire::Msg& m);
  void on_dial_reply(GroupState& g, const wire::Msg& m);
  // A kHandshake message to rank `to` of g (its published address), g.mu held.
  void send_handshake(GroupState& g, int to, const rdma::wire::WireHandshake& hs, const auth::Nonce& nd,
                      const auth::Nonce& na, uint32_t stream);
  void park(int rail, const wire::Msg& m);
  std::vector<wire::Msg> unpark(int rail, uint64_t comm_id);
  // connect.cc
  void start_dial(GroupState& g, int to);  // g.mu held
  std::string timeout_message(const GroupState& g, const GroupSpec& spec, Clock::time_point start) const;

  std::shared_ptr<GroupState> group(uint64_t comm_id) const;
  void forget_group(const GroupState* g);
  uint32_t alloc_stream(const std::shared_ptr<GroupState>& g, int peer);
  void free_stream(uint32_t id);
  // The endpoint name of rank r's published address on rail `rail`; throws TransportError.
  std::string peer_name(const std::string& address, int r, int rail) const;

  LibfabricOptions options_;
  const FabricApi& api_;
  std::vector<std::unique_ptr<Rail>> rails_;  // NICs × stripes_ endpoints (rail())
  int nics_ = 1;
  int stripes_ = 1;
  bool one_way_ = false;  // LibfabricOptions::one_way_lanes > 0
  Caps caps_;  // rail 0's, with hmem from a second query
  Plan plan_;
  bool cq_data_ = false;
  wire::CqDataLayout layout_;
  std::string address_;
  std::atomic<bool> running_{false};
  // By endpoint: traffic keeps only its own endpoint's thread polling (expect_traffic(), a hint
  // that does not say where, opens them all).
  std::vector<std::unique_ptr<BusyPollWindow>> busy_poll_;
  std::vector<std::thread> threads_;
  std::vector<int> wake_fds_;  // by rail: an eventfd that ends a progress thread's sleep
  std::vector<std::unique_ptr<std::atomic<bool>>> sleeping_;  // by rail
  std::vector<std::unique_ptr<std::atomic<int>>> driven_;     // by rail: threads polling it (drive())
  std::vector<std::unique_ptr<std::atomic<bool>>> aside_;     // by rail: its thread stands aside
  // By rail: when a poll last found its completion queue empty (steady clock ticks), by whichever
  // thread polled it.
  std::vector<std::unique_ptr<std::atomic<int64_t>>> caught_up_;
  // By rail, its thread's own: the last housekeeping, and the last moment it was not listening
  // (kDeafGap); a peer is silent for what it missed after that.
  std::vector<Clock::time_point> housekept_, deaf_until_;

  mutable std::shared_mutex reg_mu_;
  RegionMap regions_;  // what check_write and writes to self read
  std::unordered_map<uint64_t, Registration> registrations_;
  uint64_t key_salt_ = 0;
  uint64_t next_key_ = 1;
  uint64_t registered_bytes_ = 0;

  mutable std::mutex groups_mu_;
  std::unordered_map<uint64_t, std::weak_ptr<GroupState>> groups_;  // by comm id

  std::mutex streams_mu_;
  std::vector<StreamSlot> streams_;  // by stream id; 0 unused
  uint32_t next_stream_ = 1;

  mutable std::mutex hs_mu_;
  std::deque<Parked> parked_;
};

// ----------------------------------------------------------------------------------------------

template <class Pred>
bool GroupState::progress_until(Pred pred, Clock::time_point deadline, int polled, bool drive) {
  const int n_polled =
      polled > 0 && polled < static_cast<int>(endpoints.size()) ? polled : static_cast<int>(endpoints.size());
  // While this thread polls, the endpoints' progress threads stand aside (Core::drive); it
  // hands them back before it sleeps, and when it returns.
  struct Driving {
    Core& core;
    const std::vector<int>& eps;
    int n;
    bool on = false;
    void set(bool v) {
      if (v == on) return;
      on = v;
      for (int i = 0; i < n; ++i) v ? core.drive(eps[i]) : core.undrive(eps[i]);
    }
    ~Driving() { set(false); }
  } driving{*core, endpoints, n_polled};
  uint32_t idle = 0;
  while (true) {
    {
      std::unique_lock<std::mutex> l(mu);
      if (pred()) return true;
    }
    if (aborted || !core->running() || Clock::now() >= deadline) return false;
    driving.set(drive);
    int n = 0;
    for (int i = 0; i < n_polled; ++i) n += core->progress(endpoints[i]);
    if (n > 0) {
      idle = 0;
      continue;
    }
    // Spin a little (a completion is usually microseconds away), then sleep in short slices:
    // a peer that is slow to drain must not cost a core. The sleep ends early when a progress
    // thread handles what we wait for (every change of the group's state notifies cv).
    if (++idle < 64) continue;
    driving.set(false);
    std::unique_lock<std::mutex> l(mu);
    if (pred()) return true;
    cv.wait_for(l, std::chrono::microseconds(idle < 256 ? 10 : idle < 1024 ? 50 : 200));
  }
}

}  // namespace fusedcomm::rdma::libfabric
