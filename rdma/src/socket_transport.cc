// The socket backend of the transport interface: TCP, one connection per pair of ranks, and
// SocketOptions::receive_threads receiver threads per Transport. Wire format: socket_wire.h.
//
// Threads and ownership
//   - Receiver 0 owns the listener, its epoll set and every connection that is still in its
//     handshake (accepted but not yet matched to a group). Every receiver reads the data
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
#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <random>
#include <shared_mutex>
#include <sstream>
#include <stdexcept>
#include <system_error>
#include <thread>
#include <unordered_map>

#include "fusedcomm/rdma/busy_poll.h"
#include "fusedcomm/rdma/transport.h"
#include "socket_wire.h"

namespace fusedcomm::rdma {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr milliseconds kParkTimeout{60000};      // a matched-later dial waits this long at most
constexpr milliseconds kHelloTimeout{10000};     // an accepted socket must say hello by then
constexpr milliseconds kSendStallTimeout{60000};  // a write making no progress this long fails
constexpr milliseconds kDetachWait{5000};        // close/destroy wait for the receiver this long
constexpr int kPollSliceMs = 50;                  // writers re-check peer state this often
constexpr size_t kMaxConns = 65536;            // accepted sockets the receiver keeps at most
constexpr size_t kRecvChunk = size_t{4} << 20;
constexpr uint64_t kRecvBudget = uint64_t{16} << 20;  // bytes per connection per wakeup

std::string errno_text(int e) { return std::error_code(e, std::generic_category()).message(); }

[[noreturn]] void throw_sys(const std::string& what, int e) {
  throw TransportError(-1, "socket transport: " + what + ": " + errno_text(e));
}

std::string hex(uint64_t v) {
  std::ostringstream s;
  s << "0x" << std::hex << v;
  return s.str();
}

bool split_host_port(const std::string& a, std::string* host, std::string* port) {
  if (!a.empty() && a[0] == '[') {
    size_t close = a.find(']');
    if (close == std::string::npos || close + 1 >= a.size() || a[close + 1] != ':') return false;
    *host = a.substr(1, close - 1);
    *port = a.substr(close + 2);
  } else {
    size_t colon = a.rfind(':');
    if (colon == std::string::npos || colon == 0) return false;
    *host = a.substr(0, colon);
    *port = a.substr(colon + 1);
  }
  return !port->empty();
}

std::string join_host_port(const std::string& host, int port) {
  if (host.find(':') != std::string::npos) return "[" + host + "]:" + std::to_string(port);
  return host + ":" + std::to_string(port);
}

std::string numeric_host(const sockaddr* sa, socklen_t len) {
  char buf[NI_MAXHOST];
  if (getnameinfo(sa, len, buf, sizeof buf, nullptr, 0, NI_NUMERICHOST) != 0) return "?";
  return buf;
}

bool is_loopback(const sockaddr* sa) {
  if (sa->sa_family == AF_INET) {
    return (ntohl(reinterpret_cast<const sockaddr_in*>(sa)->sin_addr.s_addr) >> 24) == 127;
  }
  if (sa->sa_family == AF_INET6) {
    return IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr);
  }
  return false;
}

// The address peers should use when the options name none: the host name's first
// non-loopback address, else the first up, non-loopback IPv4 interface, else the host name.
std::string primary_host_address() {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) == 0) {
    addrinfo hints{};
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    if (getaddrinfo(name, nullptr, &hints, &res) == 0) {
      std::string found;
      for (addrinfo* p = res; p && found.empty(); p = p->ai_next) {
        if (!is_loopback(p->ai_addr)) found = numeric_host(p->ai_addr, p->ai_addrlen);
      }
      freeaddrinfo(res);
      if (!found.empty()) return found;
    }
  }
  ifaddrs* ifs = nullptr;
  if (getifaddrs(&ifs) == 0) {
    std::string found;
    for (ifaddrs* p = ifs; p && found.empty(); p = p->ifa_next) {
      if (p->ifa_addr && p->ifa_addr->sa_family == AF_INET && (p->ifa_flags & IFF_UP) &&
          !(p->ifa_flags & IFF_LOOPBACK)) {
        found = numeric_host(p->ifa_addr, sizeof(sockaddr_in));
      }
    }
    freeifaddrs(ifs);
    if (!found.empty()) return found;
  }
  return name[0] ? std::string(name) : std::string("127.0.0.1");
}

void set_nodelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

// Sends all of [p, p+n) on a non-blocking socket without waiting; false if it would block or
// fails. Only used for handshake replies (48 bytes on an idle socket).
bool send_now(int fd, const void* p, size_t n) {
  ssize_t r = ::send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
  return r == static_cast<ssize_t>(n);
}

struct GroupState;
class Core;

// One TCP connection: pending (handshake) or a data connection of a group.
struct Conn {
  Conn(int fd_in, uint64_t id_in, std::atomic<uint64_t>* open_counter_in)
      : fd(fd_in), id(id_in), open_counter(open_counter_in) {}
  ~Conn() {
    if (fd >= 0) ::close(fd);
    if (counted) open_counter->fetch_sub(1, std::memory_order_relaxed);
  }
  Conn(const Conn&) = delete;
  Conn& operator=(const Conn&) = delete;

  // Marks this a data connection of a group (counted in stats until the socket closes).
  void make_data(int peer_rank, const std::string& addr, const std::shared_ptr<GroupState>& g) {
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
  bool is_data = false;   // set before the receiver reads it as data (adoption or attach)
  std::atomic<PeerState> state{PeerState::kConnected};
  std::string error;      // failure message; guarded by the group's mutex
  std::atomic<bool> with_receiver{false};  // attach queued or in the epoll set
  std::atomic<int> reader{0};  // the receiver that owns it; set before it is handed over
  std::mutex send_mu;     // one message at a time on the wire
  std::atomic<uint64_t>* open_counter;
  bool counted = false;

  // Receiver-thread-only state.
  Clock::time_point since;
  wire::WireHello hello{};
  size_t hello_got = 0;
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
  uint64_t job_token = 0;
  uint64_t comm_id = 0;
  int rank = 0;
  int world = 1;
  uint32_t lane = 0;  // GroupSpec::lane: picks the receivers of the group's connections
  std::vector<std::string> addresses;

  mutable std::mutex mu;
  std::condition_variable cv;
  Phase phase = Phase::kConnecting;            // guarded by mu
  std::vector<std::shared_ptr<Conn>> peers;    // by rank; null for self and missing; mu
  int connected = 0;                           // non-null entries of peers; mu
  std::vector<bool> lost;                      // connected during connect(), then went away; mu
  int failed_peer = -1;                        // first failure; mu
  std::string failed_msg;                      // mu
  std::atomic<bool> aborted{false};

  std::string who(int r) const {
    return "peer rank " + std::to_string(r) + " at " +
           (r >= 0 && r < static_cast<int>(addresses.size()) ? addresses[r] : std::string("?"));
  }
  std::string self() const {
    return "rank " + std::to_string(rank) + " of communicator " + hex(comm_id);
  }

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
    std::deque<Command> commands;  // cmd_mu
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
  void accept_all();
  // The receivers' functions take Conn*: the owning receiver's conns holds its only reference,
  // so that drop() can release it before it tells a waiting group (whose reference is then the
  // last, and whose release closes the socket deterministically). After drop(c), c is not
  // touched. Handshakes (accept_all, read_hello, try_match, reject, expire_pending) run on
  // receiver 0 only; drop() and the data path on the connection's owner.
  void on_readable(Conn* c);
  void read_hello(Conn* c);
  enum class Match { kAdopted, kParked, kDropped };
  Match try_match(Conn* c);
  void reject(Conn* c, uint32_t reason);
  void read_data(Conn* c);
  // Receiver: a data connection ended or broke; `protocol_error` also cuts it both ways.
  void end_data_conn(Conn* c, const std::string& msg, bool protocol_error);
  bool validate(const wire::WireHeader& h, std::string* why) const;
  void apply_signal(const wire::WireHeader& h);
  void drop(Conn* c);
  void expire_pending();
  void close_fds();

  int listen_fd_ = -1;
  std::string address_;
  std::vector<std::unique_ptr<Receiver>> receivers_;  // [0] also accepts; fixed after construction
  std::atomic<bool> running_{false};
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

// ---------------------------------------------------------------------------------------------
// Core: construction, registry

Core::Core(const SocketOptions& o) : busy_poll_(o.busy_poll) {
  std::random_device rd;
  key_salt_ = (static_cast<uint64_t>(rd()) & 0xffffffull) << 40;

  std::string bind_host = o.bind_host;
  const bool wildcard = bind_host.empty() || bind_host == "0.0.0.0" || bind_host == "::";
  addrinfo hints{};
  hints.ai_family = bind_host.empty() ? AF_INET : AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  std::string port = std::to_string(o.port);
  int rc = getaddrinfo(bind_host.empty() ? nullptr : bind_host.c_str(), port.c_str(), &hints, &res);
  if (rc != 0) {
    throw TransportError(-1, "socket transport: cannot resolve bind host '" + bind_host +
                                 "': " + gai_strerror(rc));
  }
  int err = 0;
  for (addrinfo* p = res; p; p = p->ai_next) {
    int fd = ::socket(p->ai_family, p->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      err = errno;
      continue;
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, p->ai_addr, p->ai_addrlen) == 0 && ::listen(fd, 1024) == 0) {
      listen_fd_ = fd;
      break;
    }
    err = errno;
    ::close(fd);
  }
  freeaddrinfo(res);
  if (listen_fd_ < 0) throw_sys("cannot listen on '" + bind_host + ":" + port + "'", err);

  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&ss), &len);
  int bound_port = ss.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port)
                                            : ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  std::string host = o.advertise_host;
  if (host.empty()) host = wildcard ? primary_host_address() : bind_host;
  address_ = join_host_port(host, bound_port);

  const int receivers = std::max(1, o.receive_threads);
  for (int i = 0; i < receivers; ++i) {
    receivers_.push_back(std::make_unique<Receiver>());
    Receiver& r = *receivers_.back();
    r.index = i;
    r.event_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    r.epoll_fd = epoll_create1(EPOLL_CLOEXEC);
    if (r.event_fd < 0 || r.epoll_fd < 0) {
      const int e = errno;
      close_fds();
      throw_sys("eventfd/epoll", e);
    }
    epoll_event ev{};
    ev.events = EPOLLIN;
    if (i == 0) {
      ev.data.u64 = 0;
      epoll_ctl(r.epoll_fd, EPOLL_CTL_ADD, listen_fd_, &ev);
    }
    ev.data.u64 = 1;
    epoll_ctl(r.epoll_fd, EPOLL_CTL_ADD, r.event_fd, &ev);
  }
  running_ = true;
  for (auto& r : receivers_) {
    Receiver* rp = r.get();
    r->thread = std::thread([this, rp] { run(*rp); });
  }
}

void Core::close_fds() {
  for (auto& r : receivers_) {
    for (int* fd : {&r->epoll_fd, &r->event_fd}) {
      if (*fd >= 0) ::close(*fd);
      *fd = -1;
    }
  }
  if (listen_fd_ >= 0) ::close(listen_fd_);
  listen_fd_ = -1;
}

Core::~Core() { shutdown(); }

void Core::shutdown() {
  for (auto& r : receivers_) {
    if (r->thread.joinable()) {
      post(r->index, {Command::kStop, nullptr});
      r->thread.join();
    }
  }
  running_ = false;
  for (auto& r : receivers_) r->conns.clear();
  {
    std::lock_guard<std::mutex> l(detach_mu_);
  }
  detach_cv_.notify_all();
  std::vector<std::shared_ptr<GroupState>> live;
  {
    std::lock_guard<std::mutex> l(groups_mu_);
    for (auto& [id, w] : groups_) {
      if (auto g = w.lock()) live.push_back(g);
    }
  }
  for (auto& g : live) g->abort();
  close_fds();
}

Region Core::register_memory(void* base, uint64_t bytes) {
  if (!base && bytes) throw std::invalid_argument("register_memory: null base");
  std::unique_lock<std::shared_mutex> l(reg_mu_);
  Region r{base, bytes, key_salt_ | next_key_++};
  regions_.emplace(r.key, r);
  registered_bytes_ += bytes;
  return r;
}

void Core::deregister_memory(const Region& r) {
  std::unique_lock<std::shared_mutex> l(reg_mu_);
  auto it = regions_.find(r.key);
  if (it == regions_.end()) return;
  registered_bytes_ -= it->second.bytes;
  regions_.erase(it);
}

TransportStats Core::stats() const {
  TransportStats s;
  {
    std::shared_lock<std::shared_mutex> l(reg_mu_);
    s.registered_regions = regions_.size();
    s.registered_bytes = registered_bytes_;
  }
  s.open_connections = open_connections.load();
  s.bytes_sent = bytes_sent.load();
  s.bytes_received = bytes_received.load();
  return s;
}

bool in_range(const Region& r, uint64_t offset, uint64_t bytes) {
  return offset <= r.bytes && bytes <= r.bytes - offset;
}

const char* Core::source(uint64_t key, uint64_t offset, uint64_t bytes) const {
  std::shared_lock<std::shared_mutex> l(reg_mu_);
  auto it = regions_.find(key);
  if (it == regions_.end()) {
    throw std::invalid_argument("write: source region " + hex(key) + " is not registered");
  }
  if (!in_range(it->second, offset, bytes)) {
    throw std::invalid_argument("write: source range [" + std::to_string(offset) + ", +" +
                                std::to_string(bytes) + ") exceeds region " + hex(key) + " of " +
                                std::to_string(it->second.bytes) + " bytes");
  }
  return static_cast<const char*>(it->second.base) + offset;
}

void store_max_release(void* word, uint64_t value) {
  std::atomic_ref<uint64_t> w(*static_cast<uint64_t*>(word));
  uint64_t old = w.load(std::memory_order_relaxed);
  while (old < value &&
         !w.compare_exchange_weak(old, value, std::memory_order_release, std::memory_order_relaxed)) {
  }
}

void Core::local_write(const WriteOp& op) {
  std::shared_lock<std::shared_mutex> l(reg_mu_);
  auto find = [&](uint64_t key, uint64_t off, uint64_t n, const char* what) -> char* {
    auto it = regions_.find(key);
    if (it == regions_.end() || !in_range(it->second, off, n)) {
      throw std::invalid_argument(std::string("write to self: ") + what + " range is invalid");
    }
    return static_cast<char*>(it->second.base) + off;
  };
  if (op.bytes) {
    const char* src = find(op.src_key, op.src_offset, op.bytes, "source");
    char* dst = find(op.dst_key, op.dst_offset, op.bytes, "destination");
    std::memmove(dst, src, op.bytes);
  }
  if (op.signal_key) {
    if (op.signal_offset % 8) throw std::invalid_argument("write to self: unaligned signal");
    store_max_release(find(op.signal_key, op.signal_offset, 8, "signal"), op.signal_value);
  }
}

// ---------------------------------------------------------------------------------------------
// Core: receiver thread

void Core::post(int receiver, Command c) {
  Receiver& r = *receivers_[receiver];
  {
    std::lock_guard<std::mutex> l(r.cmd_mu);
    r.commands.push_back(std::move(c));
  }
  wake(r);
}

void Core::wake(Receiver& r) {
  uint64_t one = 1;
  ssize_t w = ::write(r.event_fd, &one, sizeof one);
  (void)w;
}

void Core::expect_traffic() noexcept {
  if (!busy_poll_.enabled() || !running_) return;
  busy_poll_.open();
  // The window is opened before `sleeping` is read, and a receiver publishes `sleeping` before
  // its last look at the window (both seq_cst): a receiver that goes to sleep anyway is seen
  // here and woken.
  for (auto& r : receivers_) {
    if (r->sleeping.load(std::memory_order_seq_cst)) wake(*r);
  }
}

void Core::attach(const std::shared_ptr<Conn>& c, uint32_t lane) {
  if (!running_) return;
  c->with_receiver = true;
  c->reader = reader_for(lane, c->peer);
  post(c->reader, {Command::kAttach, c});
}

void Core::detach(const std::vector<std::shared_ptr<Conn>>& conns, bool wait) {
  if (!running_) return;
  for (auto& c : conns) {
    if (c) post(c->reader, {Command::kDetach, nullptr, c->id});
  }
  if (!wait) return;
  std::unique_lock<std::mutex> l(detach_mu_);
  detach_cv_.wait_until(l, Clock::now() + kDetachWait, [&] {
    if (!running_) return true;
    for (auto& c : conns) {
      if (c && c->with_receiver) return false;
    }
    return true;
  });
}

void Core::forget_group(const GroupState* g) {
  std::lock_guard<std::mutex> l(groups_mu_);
  auto it = groups_.find(g->comm_id);
  if (it == groups_.end()) return;
  auto cur = it->second.lock();
  if (!cur || cur.get() == g) groups_.erase(it);
}

void Core::drop(Conn* c) {
  Receiver& r = *receivers_[c->reader];
  epoll_ctl(r.epoll_fd, EPOLL_CTL_DEL, c->fd, nullptr);
  auto node = r.conns.extract(c->id);
  {
    // Waiters test with_receiver under detach_mu_, so they see it false only once our
    // reference is gone too (releasing it closes pending sockets).
    std::lock_guard<std::mutex> l(detach_mu_);
    c->with_receiver = false;
    node = {};
  }
  detach_cv_.notify_all();
}

void Core::run(Receiver& r) {
  epoll_event events[64];
  auto last_sweep = Clock::now();
  bool stop = false;
  while (!stop) {
    // Inside the busy-poll window the receiver polls (epoll_wait with no timeout) instead of
    // sleeping: a message then lands within a syscall's time instead of a wake-up's.
    int timeout_ms = 200;
    if (busy_poll_.is_open()) {
      timeout_ms = 0;
    } else if (busy_poll_.enabled()) {
      r.sleeping.store(true, std::memory_order_seq_cst);
      if (busy_poll_.is_open()) timeout_ms = 0;
    }
    int n = epoll_wait(r.epoll_fd, events, 64, timeout_ms);
    r.sleeping.store(false, std::memory_order_relaxed);
    if (n > 0) {
      busy_poll_.open();  // the rest of this op's traffic is likely close behind
    } else if (timeout_ms == 0) {
      sched_yield();  // polling must not hold a core that a thread with work is waiting for
    }
    for (int i = 0; i < n && !stop; ++i) {
      uint64_t id = events[i].data.u64;
      if (id == 0) {
        accept_all();
      } else if (id == 1) {
        process_commands(r, &stop);
      } else {
        auto it = r.conns.find(id);
        if (it == r.conns.end()) continue;
        on_readable(it->second.get());
      }
    }
    if (r.index == 0 && Clock::now() - last_sweep > milliseconds(200)) {
      expire_pending();
      last_sweep = Clock::now();
    }
  }
}

void Core::process_commands(Receiver& r, bool* stop) {
  uint64_t v;
  while (::read(r.event_fd, &v, sizeof v) > 0) {
  }
  std::deque<Command> batch;
  {
    std::lock_guard<std::mutex> l(r.cmd_mu);
    batch.swap(r.commands);
  }
  for (auto& cmd : batch) {
    switch (cmd.kind) {
      case Command::kAttach: {
        std::shared_ptr<Conn> c = std::move(cmd.conn);
        c->since = Clock::now();
        epoll_event ev{};
        ev.events = EPOLLIN | EPOLLRDHUP;
        ev.data.u64 = c->id;
        if (epoll_ctl(r.epoll_fd, EPOLL_CTL_ADD, c->fd, &ev) == 0) {
          r.conns.emplace(c->id, std::move(c));
        } else {
          {
            std::lock_guard<std::mutex> l(detach_mu_);
            c->with_receiver = false;
            c.reset();
          }
          detach_cv_.notify_all();
        }
        break;
      }
      case Command::kDetach: {
        auto it = r.conns.find(cmd.conn_id);
        if (it != r.conns.end()) drop(it->second.get());
        break;
      }
      case Command::kRescan: {
        std::vector<Conn*> parked;
        for (auto& [id, c] : r.conns) {
          if (!c->is_data && c->hello_got == sizeof(wire::WireHello)) parked.push_back(c.get());
        }
        for (auto& c : parked) try_match(c);
        break;
      }
      case Command::kStop:
        *stop = true;
        break;
    }
  }
}

void Core::accept_all() {
  while (true) {
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    int fd = accept4(listen_fd_, reinterpret_cast<sockaddr*>(&ss), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;  // EAGAIN, or a transient error (EMFILE, ECONNABORTED): retried later
    set_nodelay(fd);
    auto c = std::make_shared<Conn>(fd, new_conn_id(), &open_connections);
    c->peer_addr = numeric_host(reinterpret_cast<sockaddr*>(&ss), len);
    c->since = Clock::now();
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.u64 = c->id;
    Receiver& r0 = *receivers_[0];
    if (r0.conns.size() >= kMaxConns || epoll_ctl(r0.epoll_fd, EPOLL_CTL_ADD, fd, &ev) != 0) {
      continue;  // ~Conn closes it
    }
    c->with_receiver = true;
    r0.conns.emplace(c->id, c);
  }
}

void Core::expire_pending() {
  auto now = Clock::now();
  std::vector<Conn*> expired;
  for (auto& [id, c] : receivers_[0]->conns) {
    if (c->is_data) continue;
    auto limit = c->hello_got == sizeof(wire::WireHello) ? kParkTimeout : kHelloTimeout;
    if (now - c->since > limit) expired.push_back(c.get());
  }
  for (auto& c : expired) drop(c);
}

void Core::on_readable(Conn* c) {
  if (c->is_data) {
    read_data(c);
  } else {
    read_hello(c);
  }
}

void Core::read_hello(Conn* c) {
  const size_t want = sizeof(wire::WireHello) - c->hello_got;
  if (want == 0) {
    // Parked: the dialer must wait for our reply, so anything readable is EOF or a violation.
    char b;
    ssize_t r = ::recv(c->fd, &b, 1, MSG_DONTWAIT);
    if (r < 0 && (errno == EAGAIN || errno == EINTR)) return;
    drop(c);
    return;
  }
  ssize_t r = ::recv(c->fd, reinterpret_cast<char*>(&c->hello) + c->hello_got, want, MSG_DONTWAIT);
  if (r < 0 && (errno == EAGAIN || errno == EINTR)) return;
  if (r <= 0) {
    drop(c);
    return;
  }
  c->hello_got += static_cast<size_t>(r);
  if (c->hello_got < sizeof(wire::WireHello)) return;
  if (c->hello.magic != wire::kHelloMagic || c->hello.kind != wire::kHello) {
    drop(c);  // not one of us: no reply
    return;
  }
  if (c->hello.version != kTransportApiVersion) {
    reject(c, wire::kBadVersion);
    return;
  }
  c->since = Clock::now();  // the park timeout starts now
  try_match(c);
}

void Core::reject(Conn* c, uint32_t reason) {
  wire::WireHello reply{};
  reply.magic = wire::kHelloMagic;
  reply.version = kTransportApiVersion;
  reply.kind = wire::kReject;
  reply.comm_id = c->hello.comm_id;
  reply.rank = c->hello.target_rank;
  reply.world = c->hello.world;
  reply.target_rank = c->hello.rank;
  reply.reason = reason;
  send_now(c->fd, &reply, sizeof reply);
  drop(c);
}

Core::Match Core::try_match(Conn* c) {
  const wire::WireHello& h = c->hello;
  std::shared_ptr<GroupState> g;
  {
    std::lock_guard<std::mutex> l(groups_mu_);
    auto it = groups_.find(h.comm_id);
    if (it != groups_.end()) g = it->second.lock();
  }
  if (!g) return Match::kParked;  // that rank has not called connect() yet
  std::unique_lock<std::mutex> l(g->mu);
  // Maybe a later group reuses the id. An aborted group is still kConnecting until release()
  // empties it; a connection adopted in between would outlive the group, open and counted.
  if (g->phase != Phase::kConnecting || g->aborted) return Match::kParked;
  uint32_t reason = wire::kNoReason;
  if (h.job_token != g->job_token) {
    reason = wire::kBadToken;
  } else if (h.world != g->world) {
    reason = wire::kBadWorld;
  } else if (h.target_rank != g->rank || h.rank <= g->rank || h.rank >= g->world) {
    reason = wire::kBadRank;
  } else if (g->peers[h.rank]) {
    reason = wire::kDuplicate;
  }
  if (reason != wire::kNoReason) {
    l.unlock();
    reject(c, reason);
    return Match::kDropped;
  }
  wire::WireHello reply{};
  reply.magic = wire::kHelloMagic;
  reply.version = kTransportApiVersion;
  reply.kind = wire::kAccept;
  reply.job_token = g->job_token;
  reply.comm_id = g->comm_id;
  reply.rank = g->rank;
  reply.world = g->world;
  reply.target_rank = h.rank;
  if (!send_now(c->fd, &reply, sizeof reply)) {
    l.unlock();
    drop(c);
    return Match::kDropped;
  }
  c->make_data(h.rank, g->addresses[h.rank], g);
  Receiver& r0 = *receivers_[0];
  const int reader = reader_for(g->lane, h.rank);
  std::shared_ptr<Conn> adopted = r0.conns.at(c->id);
  g->peers[h.rank] = adopted;
  g->lost[h.rank] = false;
  g->connected++;
  if (reader != 0) {
    // Moves to its reader, still under the group's lock: an abort() that finds it in peers
    // sends the detach to that reader, after this attach. Nothing was read past the hello, and
    // the new epoll set reports what is already queued on the socket (level-triggered).
    epoll_ctl(r0.epoll_fd, EPOLL_CTL_DEL, c->fd, nullptr);
    r0.conns.erase(c->id);
    attach(adopted, g->lane);
  }
  g->cv.notify_all();
  return Match::kAdopted;
}

bool Core::validate(const wire::WireHeader& h, std::string* why) const {
  std::shared_lock<std::shared_mutex> l(reg_mu_);
  if (h.bytes) {
    auto it = regions_.find(h.dst_key);
    if (it == regions_.end()) {
      *why = "wrote " + std::to_string(h.bytes) + " bytes to unknown region key " + hex(h.dst_key);
      return false;
    }
    if (!in_range(it->second, h.dst_offset, h.bytes)) {
      *why = "wrote out of range: offset " + std::to_string(h.dst_offset) + " + " +
             std::to_string(h.bytes) + " bytes exceeds region " + hex(h.dst_key) + " of " +
             std::to_string(it->second.bytes) + " bytes";
      return false;
    }
  }
  if (h.signal_key) {
    auto it = regions_.find(h.signal_key);
    if (it == regions_.end()) {
      *why = "signalled unknown region key " + hex(h.signal_key);
      return false;
    }
    const uintptr_t addr = reinterpret_cast<uintptr_t>(it->second.base) + h.signal_offset;
    if (!in_range(it->second, h.signal_offset, 8) || addr % 8 != 0) {
      *why = "signalled an invalid word: offset " + std::to_string(h.signal_offset) +
             " in region " + hex(h.signal_key) + " of " + std::to_string(it->second.bytes) +
             " bytes (must be in range and 8-byte aligned)";
      return false;
    }
  }
  return true;
}

void Core::apply_signal(const wire::WireHeader& h) {
  if (!h.signal_key) return;
  std::shared_lock<std::shared_mutex> l(reg_mu_);
  auto it = regions_.find(h.signal_key);
  if (it == regions_.end()) return;  // deregistered meanwhile: nobody is waiting on it
  store_max_release(static_cast<char*>(it->second.base) + h.signal_offset, h.signal_value);
}

void Core::end_data_conn(Conn* c, const std::string& msg, bool protocol_error) {
  auto g = c->group.lock();
  if (!g) {
    if (protocol_error) ::shutdown(c->fd, SHUT_RDWR);
    drop(c);
    return;
  }
  // drop() runs under the group's lock: a connect() that finds the slot freed below (and
  // so does not wait for this connection) must also find its socket closed and uncounted.
  std::lock_guard<std::mutex> l(g->mu);
  if (g->phase == Phase::kConnecting) {
    // Not part of a live group yet: free the slot so that the rank may dial again.
    if (g->peers[c->peer].get() == c) {
      g->peers[c->peer].reset();
      g->connected--;
      g->lost[c->peer] = true;
    }
    c->state = PeerState::kClosed;
  } else if (g->aborted || g->phase == Phase::kDone || c->bye_seen) {
    if (c->state == PeerState::kConnected) c->state = PeerState::kClosed;
  } else {
    g->fail_locked(*c, msg);
  }
  if (protocol_error) ::shutdown(c->fd, SHUT_RDWR);  // after the failure is recorded: writers report it
  drop(c);
  g->cv.notify_all();
}

void Core::read_data(Conn* c) {
  auto who = [&] {
    auto g = c->group.lock();
    return g ? g->who(c->peer) : "peer rank " + std::to_string(c->peer) + " at " + c->peer_addr;
  };
  uint64_t budget = kRecvBudget;
  while (budget > 0) {
    ssize_t r;
    if (!c->in_payload) {
      r = ::recv(c->fd, reinterpret_cast<char*>(&c->hdr) + c->hdr_got, sizeof(wire::WireHeader) - c->hdr_got,
                 MSG_DONTWAIT);
    } else {
      std::shared_lock<std::shared_mutex> l(reg_mu_);
      auto it = regions_.find(c->hdr.dst_key);
      if (it == regions_.end()) {
        l.unlock();
        end_data_conn(c, who() + " wrote to region " + hex(c->hdr.dst_key) +
                             ", which was deregistered during the write", true);
        return;
      }
      char* dst = static_cast<char*>(it->second.base) + c->hdr.dst_offset + c->payload_got;
      size_t want = static_cast<size_t>(std::min<uint64_t>(c->hdr.bytes - c->payload_got, kRecvChunk));
      r = ::recv(c->fd, dst, want, MSG_DONTWAIT);
    }
    if (r < 0) {
      int e = errno;
      if (e == EAGAIN || e == EWOULDBLOCK || e == EINTR) return;
      if (e == ECONNRESET) {
        end_data_conn(c, who() + " reset the connection", false);
      } else {
        end_data_conn(c, who() + ": receive failed: " + errno_text(e), false);
      }
      return;
    }
    if (r == 0) {
      if (c->in_payload || c->hdr_got) {
        end_data_conn(c, who() + " closed the connection in the middle of a message", false);
      } else {
        end_data_conn(c, who() + " closed the connection", false);
      }
      return;
    }
    budget -= std::min<uint64_t>(budget, static_cast<uint64_t>(r));
    if (c->in_payload) {
      c->payload_got += static_cast<uint64_t>(r);
      bytes_received.fetch_add(static_cast<uint64_t>(r), std::memory_order_relaxed);
      if (c->payload_got == c->hdr.bytes) {
        c->in_payload = false;
        apply_signal(c->hdr);
      }
      continue;
    }
    c->hdr_got += static_cast<size_t>(r);
    if (c->hdr_got < sizeof(wire::WireHeader)) continue;
    c->hdr_got = 0;
    const wire::WireHeader& h = c->hdr;
    if (h.magic != wire::kDataMagic || (h.kind != wire::kData && h.kind != wire::kBye)) {
      end_data_conn(c, who() + " broke the protocol (bad message header)", true);
      return;
    }
    if (c->bye_seen) {
      end_data_conn(c, who() + " sent data after closing the group", true);
      return;
    }
    if (h.kind == wire::kBye) {
      c->bye_seen = true;
      if (auto g = c->group.lock()) {
        std::lock_guard<std::mutex> l(g->mu);
        if (c->state == PeerState::kConnected) c->state = PeerState::kClosed;
        g->cv.notify_all();
      }
      continue;
    }
    std::string why;
    if (!validate(h, &why)) {
      end_data_conn(c, who() + " " + why, true);
      return;
    }
    if (h.bytes == 0) {
      apply_signal(h);
    } else {
      c->in_payload = true;
      c->payload_got = 0;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Groups

void GroupState::send_message(Conn& c, const wire::WireHeader& h, const char* payload) {
  iovec iov[2];
  iov[0].iov_base = const_cast<wire::WireHeader*>(&h);
  iov[0].iov_len = sizeof h;
  iov[1].iov_base = const_cast<char*>(payload);
  iov[1].iov_len = h.bytes;
  int iovcnt = h.bytes ? 2 : 1;
  int first = 0;
  auto last_progress = Clock::now();
  auto fail = [&](const std::string& msg) {
    std::string text;
    {
      std::lock_guard<std::mutex> l(mu);
      fail_locked(c, msg);
      text = c.error.empty() ? msg : c.error;
    }
    ::shutdown(c.fd, SHUT_RDWR);  // the stream may be cut mid-message: nothing more is valid
    throw TransportError(c.peer, text);
  };
  while (first < iovcnt) {
    msghdr m{};
    m.msg_iov = iov + first;
    m.msg_iovlen = static_cast<size_t>(iovcnt - first);
    ssize_t r = ::sendmsg(c.fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (r > 0) {
      last_progress = Clock::now();
      size_t left = static_cast<size_t>(r);
      while (first < iovcnt && left >= iov[first].iov_len) {
        left -= iov[first].iov_len;
        ++first;
      }
      if (first < iovcnt) {
        iov[first].iov_base = static_cast<char*>(iov[first].iov_base) + left;
        iov[first].iov_len -= left;
      }
      continue;
    }
    int e = r < 0 ? errno : EPIPE;
    if (e == EINTR) continue;
    if (e != EAGAIN && e != EWOULDBLOCK) {
      if (aborted) throw TransportError(-1, self() + ": the group was aborted");
      fail(who(c.peer) + (e == EPIPE || e == ECONNRESET ? " closed the connection"
                                                          : ": send failed: " + errno_text(e)));
    }
    pollfd p{c.fd, POLLOUT, 0};
    ::poll(&p, 1, kPollSliceMs);
    if (aborted) throw TransportError(-1, self() + ": the group was aborted");
    PeerState st = c.state.load();
    if (st != PeerState::kConnected) {
      std::string text;
      {
        std::lock_guard<std::mutex> l(mu);
        text = c.error.empty() ? who(c.peer) + " has closed the group" : c.error;
      }
      ::shutdown(c.fd, SHUT_RDWR);
      throw TransportError(c.peer, text);
    }
    if (Clock::now() - last_progress > kSendStallTimeout) {
      fail("sending to " + who(c.peer) + " made no progress for " +
           std::to_string(kSendStallTimeout.count()) + " ms");
    }
  }
}

void GroupState::write(const WriteOp& op) {
  if (aborted) throw TransportError(-1, self() + ": the group was aborted");
  if (op.peer < 0 || op.peer >= world) {
    throw std::invalid_argument("write: peer " + std::to_string(op.peer) + " is not in [0, " +
                                std::to_string(world) + ")");
  }
  if (op.signal_key && op.signal_offset % 8) {
    throw std::invalid_argument("write: signal_offset must be 8-byte aligned");
  }
  if (op.peer == rank) {
    core->local_write(op);
    return;
  }
  std::shared_ptr<Conn> c;
  {
    std::lock_guard<std::mutex> l(mu);
    if (phase != Phase::kLive) throw TransportError(-1, self() + ": the group is closed");
    c = peers[op.peer];
    if (!c) throw TransportError(op.peer, who(op.peer) + " is not connected");
    if (c->state.load() != PeerState::kConnected) {
      throw TransportError(op.peer, c->error.empty() ? who(op.peer) + " has closed the group" : c->error);
    }
  }
  const char* src = op.bytes ? core->source(op.src_key, op.src_offset, op.bytes) : nullptr;
  wire::WireHeader h{};
  h.magic = wire::kDataMagic;
  h.kind = wire::kData;
  h.dst_key = op.dst_key;
  h.dst_offset = op.dst_offset;
  h.bytes = op.bytes;
  h.signal_key = op.signal_key;
  h.signal_offset = op.signal_offset;
  h.signal_value = op.signal_value;
  std::lock_guard<std::mutex> sl(c->send_mu);
  send_message(*c, h, src);
  core->bytes_sent.fetch_add(op.bytes, std::memory_order_relaxed);
}

void GroupState::close(milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  std::vector<std::shared_ptr<Conn>> conns;
  {
    std::lock_guard<std::mutex> l(mu);
    if (phase == Phase::kDone) return;
    if (aborted) {
      // abort() already cut the sockets; just release them.
    } else {
      phase = Phase::kClosing;
      conns = peers;
    }
  }
  for (auto& c : conns) {
    // A peer that already said kBye (kClosed) still waits for ours; only a broken one is skipped.
    if (!c || c->state.load() == PeerState::kFailed) continue;
    std::unique_lock<std::mutex> sl(c->send_mu, std::try_to_lock);
    while (!sl.owns_lock() && Clock::now() < deadline) {  // a writer on another thread: bounded
      std::this_thread::sleep_for(milliseconds(1));
      sl.try_lock();
    }
    if (!sl.owns_lock()) continue;
    wire::WireHeader bye{};
    bye.magic = wire::kDataMagic;
    bye.kind = wire::kBye;
    const char* p = reinterpret_cast<const char*>(&bye);
    size_t left = sizeof bye;
    while (left > 0 && Clock::now() < deadline && !aborted) {
      ssize_t r = ::send(c->fd, p, left, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (r > 0) {
        p += r;
        left -= static_cast<size_t>(r);
      } else if (r < 0 && (errno == EAGAIN || errno == EINTR)) {
        pollfd pf{c->fd, POLLOUT, 0};
        ::poll(&pf, 1, kPollSliceMs);
      } else {
        break;
      }
    }
    ::shutdown(c->fd, SHUT_WR);
  }
  {
    // Every peer's kBye (or EOF) tells us that nothing more will arrive from it.
    std::unique_lock<std::mutex> l(mu);
    cv.wait_until(l, deadline, [&] {
      if (aborted) return true;
      for (auto& c : conns) {
        if (c && c->state.load() == PeerState::kConnected && c->with_receiver) return false;
      }
      return true;
    });
  }
  release(true);
}

void GroupState::abort() {
  aborted = true;
  std::vector<std::shared_ptr<Conn>> conns;
  {
    std::lock_guard<std::mutex> l(mu);
    conns = peers;
    for (auto& c : conns) {
      if (c && c->state.load() == PeerState::kConnected) c->state = PeerState::kClosed;
    }
    cv.notify_all();
  }
  for (auto& c : conns) {
    if (c) ::shutdown(c->fd, SHUT_RDWR);
  }
  core->detach(conns, false);
}

// Detaches every connection from the receiver and drops the group's references, which closes
// the sockets (a writer still inside write() holds its own reference until it returns).
void GroupState::release(bool wait_for_receiver) {
  std::vector<std::shared_ptr<Conn>> conns;
  {
    std::lock_guard<std::mutex> l(mu);
    if (phase == Phase::kDone) return;
    conns = peers;
  }
  core->detach(conns, wait_for_receiver);
  {
    std::lock_guard<std::mutex> l(mu);
    phase = Phase::kDone;
    for (auto& c : peers) {
      if (c && c->state.load() == PeerState::kConnected) c->state = PeerState::kClosed;
    }
    peers.assign(peers.size(), nullptr);
    connected = 0;
    cv.notify_all();
  }
  core->forget_group(this);
}

class SocketPeerGroup final : public PeerGroup {
 public:
  explicit SocketPeerGroup(std::shared_ptr<GroupState> g) : g_(std::move(g)) {}
  ~SocketPeerGroup() override {
    bool done;
    {
      std::lock_guard<std::mutex> l(g_->mu);
      done = g_->phase == Phase::kDone;
    }
    if (!done) {
      g_->abort();
      g_->release(true);
    }
  }
  int rank() const override { return g_->rank; }
  int world() const override { return g_->world; }
  void write(const WriteOp& op) override { g_->write(op); }
  PeerState status(int peer) const override { return g_->status(peer); }
  void check() const override { g_->check(); }
  void close(milliseconds timeout) override { g_->close(timeout); }
  void abort() override { g_->abort(); }

 private:
  std::shared_ptr<GroupState> g_;
};

// ---------------------------------------------------------------------------------------------
// connect(): dial the lower ranks, wait for the higher ranks' dials

struct Dial {
  int peer = -1;
  int fd = -1;
  enum State { kIdle, kConnecting, kAwaitReply, kDone } state = kIdle;
  Clock::time_point retry_at;
  milliseconds backoff{10};
  wire::WireHello reply{};
  size_t got = 0;
  std::string last_error = "no answer yet";
  std::vector<sockaddr_storage> addrs;
  std::vector<socklen_t> lens;
  size_t next_addr = 0;

  void close_fd() {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
  void retry(const std::string& why, Clock::time_point now) {
    close_fd();
    last_error = why;
    state = kIdle;
    retry_at = now + backoff;
    backoff = std::min(backoff * 2, milliseconds(500));
  }
};

bool resolve(const std::string& address, Dial* d, std::string* err) {
  std::string host, port;
  if (!split_host_port(address, &host, &port)) {
    *err = "malformed address '" + address + "' (want host:port)";
    return false;
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &res);
  if (rc != 0) {
    *err = "cannot resolve '" + host + "': " + gai_strerror(rc);
    return false;
  }
  d->addrs.clear();
  d->lens.clear();
  for (addrinfo* p = res; p; p = p->ai_next) {
    sockaddr_storage ss{};
    std::memcpy(&ss, p->ai_addr, p->ai_addrlen);
    d->addrs.push_back(ss);
    d->lens.push_back(p->ai_addrlen);
  }
  freeaddrinfo(res);
  return !d->addrs.empty();
}

std::shared_ptr<GroupState> Core::connect(const GroupSpec& spec) {
  if (spec.world < 1 || spec.rank < 0 || spec.rank >= spec.world) {
    throw std::invalid_argument("connect: rank " + std::to_string(spec.rank) + " is not in [0, " +
                                std::to_string(spec.world) + ")");
  }
  if (spec.world > 1 && spec.addresses.size() != static_cast<size_t>(spec.world)) {
    throw std::invalid_argument("connect: " + std::to_string(spec.addresses.size()) +
                                " addresses for a world of " + std::to_string(spec.world));
  }
  auto g = std::make_shared<GroupState>();
  g->core = shared_from_this();
  g->job_token = spec.job_token;
  g->comm_id = spec.comm_id;
  g->rank = spec.rank;
  g->world = spec.world;
  g->lane = spec.lane;
  g->addresses = spec.addresses;
  g->addresses.resize(spec.world);
  g->peers.assign(spec.world, nullptr);
  g->lost.assign(spec.world, false);
  if (spec.world == 1) {
    g->phase = Phase::kLive;
    return g;
  }
  if (!running_) throw TransportError(-1, "socket transport is shut down");
  {
    std::lock_guard<std::mutex> l(groups_mu_);
    auto it = groups_.find(spec.comm_id);
    if (it != groups_.end() && !it->second.expired()) {
      throw TransportError(-1, "connect: communicator " + hex(spec.comm_id) +
                                   " is already open on this transport");
    }
    groups_[spec.comm_id] = g;
  }
  post(0, {Command::kRescan, nullptr});  // dials that arrived before this call

  std::vector<Dial> dials(spec.rank);
  for (int j = 0; j < spec.rank; ++j) dials[j].peer = j;
  bool ok = false;
  // Undo everything if we leave by an exception.
  struct Cleanup {
    GroupState* g;
    std::vector<Dial>* dials;
    bool* ok;
    ~Cleanup() {
      for (auto& d : *dials) d.close_fd();
      if (*ok) return;
      g->abort();
      g->release(true);
    }
  } cleanup{g.get(), &dials, &ok};

  wire::WireHello hello{};
  hello.magic = wire::kHelloMagic;
  hello.version = kTransportApiVersion;
  hello.kind = wire::kHello;
  hello.job_token = spec.job_token;
  hello.comm_id = spec.comm_id;
  hello.rank = spec.rank;
  hello.world = spec.world;

  const auto start = Clock::now();
  const auto deadline = start + spec.connect_timeout;
  auto all_connected = [&] { return g->connected == spec.world - 1; };
  while (true) {
    if (g->aborted) throw TransportError(-1, g->self() + ": connect was aborted");
    auto now = Clock::now();
    std::vector<pollfd> pfds;
    std::vector<Dial*> polled;
    Clock::time_point wake = deadline;
    for (auto& d : dials) {
      if (d.state == Dial::kIdle && now >= d.retry_at) {
        std::string err;
        if (d.addrs.empty() && !resolve(spec.addresses[d.peer], &d, &err)) {
          d.retry(err, now);
        } else {
          const auto& ss = d.addrs[d.next_addr++ % d.addrs.size()];
          const socklen_t len = d.lens[(d.next_addr - 1) % d.lens.size()];
          d.fd = ::socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
          if (d.fd < 0) {
            d.retry("socket: " + errno_text(errno), now);
          } else {
            set_nodelay(d.fd);
            int r = ::connect(d.fd, reinterpret_cast<const sockaddr*>(&ss), len);
            if (r == 0 || errno == EINPROGRESS) {
              d.state = Dial::kConnecting;
            } else {
              d.retry(errno_text(errno), now);
            }
          }
        }
      }
      if (d.state == Dial::kConnecting) {
        pfds.push_back({d.fd, POLLOUT, 0});
        polled.push_back(&d);
      } else if (d.state == Dial::kAwaitReply) {
        pfds.push_back({d.fd, POLLIN, 0});
        polled.push_back(&d);
      } else if (d.state == Dial::kIdle) {
        wake = std::min(wake, d.retry_at);
      }
    }
    {
      std::unique_lock<std::mutex> l(g->mu);
      if (all_connected()) break;
      if (now >= deadline) break;
      if (pfds.empty()) {
        // Nothing to dial now: wait for the higher ranks (or the next retry).
        g->cv.wait_until(l, wake, [&] { return all_connected() || g->aborted.load(); });
        continue;
      }
    }
    auto ms = std::chrono::duration_cast<milliseconds>(wake - now).count();
    int slice = static_cast<int>(std::clamp<int64_t>(ms, 0, kPollSliceMs));
    int n = ::poll(pfds.data(), pfds.size(), slice);
    if (n <= 0) continue;
    now = Clock::now();
    for (size_t i = 0; i < pfds.size(); ++i) {
      if (!pfds[i].revents) continue;
      Dial& d = *polled[i];
      if (d.state == Dial::kConnecting) {
        int err = 0;
        socklen_t len = sizeof err;
        getsockopt(d.fd, SOL_SOCKET, SO_ERROR, &err, &len);
        if (err) {
          d.retry(errno_text(err), now);
          continue;
        }
        hello.target_rank = d.peer;
        if (!send_now(d.fd, &hello, sizeof hello)) {
          d.retry("could not send the handshake", now);
          continue;
        }
        d.state = Dial::kAwaitReply;
        d.got = 0;
        d.last_error = "connected, but it has not accepted the handshake (has it called connect?)";
      } else {
        ssize_t r = ::recv(d.fd, reinterpret_cast<char*>(&d.reply) + d.got, sizeof d.reply - d.got,
                           MSG_DONTWAIT);
        if (r < 0 && (errno == EAGAIN || errno == EINTR)) continue;
        if (r <= 0) {
          d.retry(r == 0 ? "closed the connection during the handshake" : errno_text(errno), now);
          continue;
        }
        d.got += static_cast<size_t>(r);
        if (d.got < sizeof d.reply) continue;
        const wire::WireHello& rep = d.reply;
        if (rep.magic != wire::kHelloMagic) {
          d.retry("answered with something that is not a fusedcomm handshake", now);
          continue;
        }
        if (rep.kind == wire::kReject) {
          throw TransportError(d.peer, g->self() + ": " + g->who(d.peer) +
                                           " rejected the handshake: " + wire::reject_text(rep.reason));
        }
        if (rep.kind != wire::kAccept || rep.version != kTransportApiVersion ||
            rep.comm_id != spec.comm_id || rep.job_token != spec.job_token || rep.rank != d.peer ||
            rep.world != spec.world) {
          d.retry("answered the handshake for a different group", now);
          continue;
        }
        auto c = std::make_shared<Conn>(d.fd, new_conn_id(), &open_connections);
        d.fd = -1;  // now owned by c
        d.state = Dial::kDone;
        c->make_data(d.peer, spec.addresses[d.peer], g);
        {
          // Attach under the group lock so that an abort() sees the connection only after
          // its attach command is queued (its detach then follows the attach).
          std::lock_guard<std::mutex> l(g->mu);
          g->peers[d.peer] = c;
          g->connected++;
          attach(c, spec.lane);
        }
      }
    }
  }

  std::unique_lock<std::mutex> l(g->mu);
  if (!all_connected()) {
    // Ranks that never connected come first: a rank that did connect and then left has most
    // likely given up on the same missing ranks.
    std::string missing, lost;
    int first = -1, first_lost = -1;
    for (int r = 0; r < spec.world; ++r) {
      if (r == spec.rank || g->peers[r]) continue;
      const std::string who = "rank " + std::to_string(r) + " at " + spec.addresses[r];
      if (g->lost[r]) {
        if (first_lost < 0) first_lost = r;
        lost += "; " + who + " (connected, then closed the connection; did it time out too?)";
        continue;
      }
      if (first < 0) first = r;
      missing += missing.empty() ? "" : "; ";
      missing += who + " (" +
                 (r < spec.rank ? dials[r].last_error : std::string("it never connected to us")) + ")";
    }
    if (first < 0) {
      first = first_lost;
      missing = lost.substr(2);
    } else {
      missing += lost;
    }
    auto ms = std::chrono::duration_cast<milliseconds>(Clock::now() - start).count();
    l.unlock();
    throw ConnectTimeout(first, g->self() + " (world " + std::to_string(spec.world) +
                                    "): connect timed out after " + std::to_string(ms) +
                                    " ms; missing " + missing);
  }
  g->phase = Phase::kLive;
  ok = true;
  return g;
}

class SocketTransport final : public Transport {
 public:
  explicit SocketTransport(const SocketOptions& o) : core_(std::make_shared<Core>(o)) {}
  ~SocketTransport() override { core_->shutdown(); }
  const char* name() const override { return "socket"; }
  std::string address() const override { return core_->address(); }
  Region register_memory(void* base, uint64_t bytes) override {
    return core_->register_memory(base, bytes);
  }
  void deregister_memory(const Region& region) override { core_->deregister_memory(region); }
  std::unique_ptr<PeerGroup> connect(const GroupSpec& spec) override {
    return std::make_unique<SocketPeerGroup>(core_->connect(spec));
  }
  TransportStats stats() const override { return core_->stats(); }
  void expect_traffic() noexcept override { core_->expect_traffic(); }

 private:
  std::shared_ptr<Core> core_;
};

}  // namespace

std::unique_ptr<Transport> make_socket_transport(const SocketOptions& options) {
  return std::make_unique<SocketTransport>(options);
}

}  // namespace fusedcomm::rdma
