// The socket backend of the transport interface: TCP, one connection per pair of ranks, and
// SocketOptions::receive_threads receiver threads per Transport. Wire format: wire.h.
//
// This header holds the backend's shared state, private to rdma/socket/: a connection (Conn),
// a group (GroupState) and the per-transport core (Core: listener, receiver threads, registry
// of regions). The files beside it implement them, one concern each:
//   net.cc               plain socket helpers (net.h)
//   handshake.cc         the handshake's messages and checks, without sockets (handshake.h)
//   core.cc              Core's construction (listener, receiver threads) and shutdown
//   registry.cc          registered regions; writes to self
//   listener.cc          the listener, accepting (bounded, backing off), the acceptor's half
//                        of the handshake
//   receiver.cc          the receiver threads: event loop, commands, attach/detach
//   receive.cc           reading data connections: checks, payloads, signals, end of stream
//   send.cc              the send path (PeerGroup::write)
//   group.cc             closing and aborting a group
//   connect.cc           building a group: the dialer's half of the handshake
//   socket_transport.cc  the Transport and PeerGroup classes over the above
//
// Threads and ownership
//   - Receiver 0 owns the listener, its epoll set and every connection that is still in its
//     handshake (accepted but not yet authenticated and matched to a group): at most
//     kMaxHandshakes of them (the oldest is closed to make room), each closed unless it
//     completes within kHandshakeTimeout of its accept. When accept() fails for want of
//     resources (EMFILE, ENFILE, ENOBUFS, ENOMEM) the listener leaves the epoll set for a
//     growing pause (kAcceptPauseMin..kAcceptPauseMax), so the receiver never spins on it. Every receiver reads the data
//     connections in its own epoll set and lands payloads straight in registered memory; a
//     group's connection to peer p is read by receiver (GroupSpec::lane + p) % receivers, so
//     that the lanes of a striped link are received in parallel (one receiving copy per core).
//     A matched connection moves from receiver 0 to its reader before anything is read from it.
//     Receivers never block: every socket is non-blocking and commands from other threads
//     arrive through each receiver's eventfd.
//   - connect() runs on the caller's thread: it dials the lower ranks itself and waits for the
//     receiver thread to match the higher ranks' dials to the group.
//   - A Conn is shared by its group (writes), the receiver (reads) and, briefly, a writer; its
//     fd is closed by ~Conn, so no thread ever uses a closed (or reused) fd number.
//
// Closing (documented choice)
//   - close(): sends kBye on every connection, half-closes, waits (bounded) for every peer's
//     kBye or EOF, then releases the sockets. A peer that receives kBye marks us kClosed; that
//     is not a failure: check() stays quiet, only a later write() to that peer throws. Waiting
//     for the peers' kBye means nothing is left unread when the socket closes, so no RST can
//     destroy data still queued at a peer.
//   - EOF without kBye (crash, kill, abort()) or a reset marks the peer kFailed and check()
//     throws "peer rank R at host:port closed the connection".
#pragma once

#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "fusedcomm/rdma/busy_poll.h"
#include "../src/regions.h"
#include "fusedcomm/rdma/transport.h"
#include "handshake.h"
#include "net.h"
#include "wire.h"

namespace fusedcomm::rdma::socket_backend {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// An accepted socket must finish its handshake within this of its accept, or it is closed (a
// dial whose group was not connecting yet hears kNotReady first, and dials again).
constexpr milliseconds kHandshakeTimeout{1500};
constexpr milliseconds kHandshakeSweep{100};      // how often receiver 0 closes expired handshakes
constexpr size_t kMaxHandshakes = 128;            // accepted sockets in their handshake at once
constexpr int kAcceptBatch = 64;                  // accepts per wake-up of receiver 0
constexpr milliseconds kAcceptPauseMin{50};       // after accept() ran out of resources ...
constexpr milliseconds kAcceptPauseMax{1000};     // ... doubling up to this
constexpr milliseconds kSendStallTimeout{60000};  // a write making no progress this long fails
constexpr milliseconds kDetachWait{5000};         // close/destroy wait for the receiver this long
constexpr int kPollSliceMs = 50;                  // writers re-check peer state this often
constexpr size_t kRecvChunk = size_t{4} << 20;
constexpr uint64_t kRecvBudget = uint64_t{16} << 20;  // bytes per connection per wakeup

struct GroupState;
class Core;

// One TCP connection: pending (handshake) or a data connection of a group.
struct Conn {
  Conn(int fd_in, uint64_t id_in, std::atomic<uint64_t>* open_counter_in)
      : fd(fd_in), id(id_in), open_counter(open_counter_in) {}
  ~Conn() {
    if (fd >= 0) ::close(fd);
    if (counted) open_counter->fetch_sub(1, std::memory_order_relaxed);
    if (handshake_counter) handshake_counter->fetch_sub(1, std::memory_order_relaxed);
  }
  Conn(const Conn&) = delete;
  Conn& operator=(const Conn&) = delete;

  // Marks this a data connection of a group (counted in stats until the socket closes).
  void make_data(int peer_rank, const std::string& addr, const std::shared_ptr<GroupState>& g) {
    if (handshake_counter) handshake_counter->fetch_sub(1, std::memory_order_relaxed);
    handshake_counter = nullptr;
    is_data = true;
    peer = peer_rank;
    peer_addr = addr;
    group = g;
    counted = true;
    open_counter->fetch_add(1, std::memory_order_relaxed);
  }

  const int fd;
  const uint64_t id;  // epoll token and receiver map key; never reused
  int peer = -1;
  std::string peer_addr;  // the peer's listener address (data) or its socket address (pending)
  std::weak_ptr<GroupState> group;
  bool is_data = false;  // set before the receiver reads it as data (adoption or attach)
  std::atomic<PeerState> state{PeerState::kConnected};
  std::string error;                       // failure message; guarded by the group's mutex
  std::atomic<bool> with_receiver{false};  // attach queued or in the epoll set
  std::atomic<int> reader{0};              // the receiver that owns it; set before it is handed over
  std::mutex send_mu;                      // one message at a time on the wire
  std::atomic<uint64_t>* open_counter;
  bool counted = false;

  // Counts this accepted socket among the transport's handshakes until it becomes data or closes.
  void start_handshake(std::atomic<uint64_t>* counter) {
    handshake_counter = counter;
    counter->fetch_add(1, std::memory_order_relaxed);
  }
  std::atomic<uint64_t>* handshake_counter = nullptr;

  // Receiver-thread-only state.
  Clock::time_point since;  // accepted at (handshakes); attached at (data)
  // An accepted socket's handshake (wire.h): waiting for the hello; parked (hello read, its
  // group not connecting here yet); challenged (our challenge sent, waiting for the proof).
  enum class Stage { kAwaitHello, kParked, kAwaitProof } stage = Stage::kAwaitHello;
  wire::WireHandshake in{};  // the message being read
  size_t in_got = 0;
  wire::WireHandshake hello{};  // the dialer's hello (parked, challenged)
  wire::WireHandshake sent{};   // our challenge (challenged)
  wire::WireHeader hdr{};
  size_t hdr_got = 0;
  bool in_payload = false;
  uint64_t payload_got = 0;
  bool bye_seen = false;
};

enum class Phase { kConnecting, kLive, kClosing, kDone };

// The shared state of one PeerGroup: what the receiver thread and the group's callers share.
struct GroupState {
  std::shared_ptr<Core> core;
  auth::Key key{};  // GroupSpec::key; never sent
  uint64_t comm_id = 0;
  int rank = 0;
  int world = 1;
  uint32_t lane = 0;  // GroupSpec::lane: picks the receivers of the group's connections
  std::vector<std::string> addresses;

  mutable std::mutex mu;
  std::condition_variable cv;
  Phase phase = Phase::kConnecting;          // guarded by mu
  std::vector<std::shared_ptr<Conn>> peers;  // by rank; null for self and missing; mu
  int connected = 0;                         // non-null entries of peers; mu
  std::vector<bool> lost;                    // connected during connect(), then went away; mu
  std::vector<std::string> refused;          // why a dial claiming that rank was refused; mu
  int failed_peer = -1;                      // first failure; mu
  std::string failed_msg;                    // mu
  std::atomic<bool> aborted{false};

  std::string who(int r) const {
    return "peer rank " + std::to_string(r) + " at " +
           (r >= 0 && r < static_cast<int>(addresses.size()) ? addresses[r] : std::string("?"));
  }
  std::string self() const { return "rank " + std::to_string(rank) + " of communicator " + hex(comm_id); }
  // The group as the handshake sees it (fixed once connect() started: read without mu).
  handshake::Side side() const { return {&key, comm_id, rank, world, &addresses}; }

  // Records a failure of `c` (mu held); the first failure of the group is what check() throws.
  void fail_locked(Conn& c, const std::string& msg) {
    if (c.state.load() != PeerState::kConnected) return;
    c.state.store(PeerState::kFailed);
    c.error = msg;
    if (failed_peer < 0) {
      failed_peer = c.peer;
      failed_msg = msg;
    }
    cv.notify_all();
  }

  void write(const WriteOp& op);
  void close(milliseconds timeout);
  void abort();
  void release(bool wait_for_receiver);
  void check() const {
    std::lock_guard<std::mutex> l(mu);
    if (failed_peer >= 0) throw TransportError(failed_peer, failed_msg);
  }
  PeerState status(int peer) const {
    if (peer < 0 || peer >= world) throw std::invalid_argument("status: peer out of range");
    if (peer == rank) return aborted ? PeerState::kClosed : PeerState::kConnected;
    std::lock_guard<std::mutex> l(mu);
    if (peers.empty() || !peers[peer]) return PeerState::kClosed;
    return peers[peer]->state.load();
  }

 private:
  void send_message(Conn& c, const wire::WireHeader& h, const char* payload);
};

class Core : public std::enable_shared_from_this<Core> {
 public:
  explicit Core(const SocketOptions& o);
  ~Core();
  void shutdown();

  const std::string& address() const { return address_; }
  Region register_memory(void* base, uint64_t bytes);
  void deregister_memory(const Region& r);
  std::shared_ptr<GroupState> connect(const GroupSpec& spec);
  TransportStats stats() const;

  // Source pointer of a local write; throws std::invalid_argument if out of range.
  const char* source(uint64_t key, uint64_t offset, uint64_t bytes) const;
  // Copies within this process (a rank writing to itself) and applies the signal.
  void local_write(const WriteOp& op);
  // Receiver commands.
  // Hands a group's data connection to its receiver, reader_for(lane, c->peer).
  void attach(const std::shared_ptr<Conn>& c, uint32_t lane);
  void detach(const std::vector<std::shared_ptr<Conn>>& conns, bool wait);
  void forget_group(const GroupState* g);
  // Transport::expect_traffic: opens the receivers' busy-poll window, waking those asleep.
  void expect_traffic() noexcept;

  uint64_t new_conn_id() { return next_conn_id_.fetch_add(1, std::memory_order_relaxed); }
  std::atomic<uint64_t> bytes_sent{0};
  std::atomic<uint64_t> bytes_received{0};
  std::atomic<uint64_t> open_connections{0};
  std::atomic<uint64_t> handshakes{0};  // accepted sockets in their handshake (<= kMaxHandshakes)

 private:
  // Commands to a receiver. Only kAttach carries a reference: a queued detach must not keep
  // a connection (and its socket) alive after its group let go of it.
  struct Command {
    enum Kind { kAttach, kDetach, kRescan, kStop } kind;
    std::shared_ptr<Conn> conn;  // kAttach
    uint64_t conn_id = 0;        // kDetach
  };
  // One receiver thread and what only it touches (conns), plus its command queue.
  struct Receiver {
    int index = 0;
    int event_fd = -1;
    int epoll_fd = -1;
    std::thread thread;
    std::mutex cmd_mu;
    std::deque<Command> commands;       // cmd_mu
    std::atomic<bool> sleeping{false};  // in a blocking epoll_wait (see expect_traffic)
    // Receiver-thread-only.
    std::unordered_map<uint64_t, std::shared_ptr<Conn>> conns;
  };
  // The receiver that reads a group's connection to `peer`.
  int reader_for(uint32_t lane, int peer) const {
    return static_cast<int>((lane + static_cast<uint32_t>(peer)) % receivers_.size());
  }
  void post(int receiver, Command c);
  void wake(Receiver& r);  // its epoll_wait returns (an eventfd write; an empty batch is fine)
  void run(Receiver& r);
  void process_commands(Receiver& r, bool* stop);
  // Binds and listens as the options say; sets listen_fd_ and address_.
  void open_listener(const SocketOptions& o);
  void accept_all();
  // accept() ran out of resources: the listener leaves receiver 0's epoll set until
  // accept_resume_ (logged once); resume_accepts() puts it back.
  void pause_accepts(int err);
  void resume_accepts();
  // Closes the oldest connection still in its handshake (the cap is reached).
  void evict_oldest_handshake();
  // The receivers' functions take Conn*: the owning receiver's conns holds its only reference,
  // so that drop() can release it before it tells a waiting group (whose reference is then the
  // last, and whose release closes the socket deterministically). After drop(c), c is not
  // touched. Handshakes (accept_all, read_handshake, try_match, on_proof, adopt, reject,
  // expire_handshakes) run on receiver 0 only; drop() and the data path on the connection's
  // owner.
  void on_readable(Conn* c);
  void read_handshake(Conn* c);
  // A parked hello: challenged once its group is connecting here; else it stays parked.
  void try_match(Conn* c);
  void on_proof(Conn* c);
  void adopt(Conn* c, const std::shared_ptr<GroupState>& g);
  // Answers `to` with kReject(reason) from rank `rank`, then drops c.
  void reject(Conn* c, const wire::WireHandshake& to, int rank, uint32_t reason);
  void read_data(Conn* c);
  // Receiver: a data connection ended or broke; `protocol_error` also cuts it both ways.
  void end_data_conn(Conn* c, const std::string& msg, bool protocol_error);
  bool validate(const wire::WireHeader& h, std::string* why) const;  // check_header on the registry
  void apply_signal(const wire::WireHeader& h);
  void drop(Conn* c);
  void expire_handshakes();
  void close_fds();

  int listen_fd_ = -1;
  std::string address_;
  std::vector<std::unique_ptr<Receiver>> receivers_;  // [0] also accepts; fixed after construction
  std::atomic<bool> running_{false};
  // Receiver 0 only: handshakes in accept order (entries of sockets since matched or closed are
  // skipped when they reach the front), and the listener's pause after accept() failed.
  std::deque<uint64_t> handshake_order_;
  bool accepts_paused_ = false;
  Clock::time_point accept_resume_{};
  milliseconds accept_pause_{kAcceptPauseMin};
  std::atomic<bool> logged_accept_error_{false};
  std::atomic<bool> logged_evictions_{false};
  BusyPollWindow busy_poll_;  // shared by the receivers: one hint serves every group

  mutable std::shared_mutex reg_mu_;
  std::unordered_map<uint64_t, Region> regions_;
  uint64_t key_salt_ = 0;
  uint64_t next_key_ = 1;
  uint64_t registered_bytes_ = 0;

  std::mutex groups_mu_;
  std::unordered_map<uint64_t, std::weak_ptr<GroupState>> groups_;  // by comm id

  std::mutex detach_mu_;
  std::condition_variable detach_cv_;

  std::atomic<uint64_t> next_conn_id_{2};  // 0: listener, 1: eventfd
};

// Whether a peer's data header (magic and kind already checked) may be applied to `regions`:
// check_write (../src/regions.h) of its fields. Pure: the fuzzer calls it directly.
bool check_header(const wire::WireHeader& h, const std::unordered_map<uint64_t, Region>& regions,
                  std::string* why);

}  // namespace fusedcomm::rdma::socket_backend
