// The inter-process transport interface, version 3 (kTransportApiVersion), its backends and
// the factory that makes them.
//
// Model (chosen so that RDMA NICs implement it directly; the socket and libfabric backends are
// built, and raw ibverbs RC and EFA SRD backends have room beside them):
//   - A Transport lives as long as its executor. It owns a listener and a registry of local
//     memory regions. A region is named to peers by its 64-bit key (socket: a registry id;
//     ibverbs: rkey and address packed by the backend).
//   - A PeerGroup is the set of connections of one communicator: `world` ranks, all-to-all.
//     It is built from every rank's listening address (exchanged through Spark's barrier
//     allGather), a communicator id and the group's key (auth.h: derived from the job token and
//     every rank's bootstrap share). Every backend authenticates each connection with the
//     key's challenge-response handshake (auth.h) before it carries anything, talks only to the
//     addresses of the bootstrap, and never sends the key.
//   - The only data operation is a one-sided write into a peer's registered region, optionally
//     followed by a signal: a 64-bit word in a peer region that only grows (the receiver
//     stores max(old, value)) and becomes visible with release ordering after the data. The
//     receiver learns arrival by reading the word with acquire ordering (flag >= expected).
//   - Writes between one pair of ranks are delivered in order: a signal becomes visible after
//     the payload of its own write and of every write the same rank posted to the same peer
//     before it (a backend over an unordered fabric reorders signals, not just payloads).
//     Nothing is acknowledged: protocols build credits out of signals in the other direction.
//   - A peer that dies or closes its connection is reported, naming it, by status()/check()
//     and by any later write() to it; nothing in the transport blocks without a bound.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fusedcomm/rdma/auth.h"
#include "fusedcomm/rdma/errors.h"

namespace fusedcomm::rdma {

// The version of this interface. A backend reports it (Transport::api_version) and the socket
// handshake carries it: peers of different versions reject each other. Bump it when the
// interface's contract or a backend's wire format changes.
inline constexpr uint32_t kTransportApiVersion = 3;

// A registered local region. `key` is what peers put in WriteOp::dst_key.
struct Region {
  void* base = nullptr;
  uint64_t bytes = 0;
  uint64_t key = 0;
};

// One one-sided write. Offsets are in bytes from the start of the named region; both ranges
// must lie inside their regions (the receiver checks and fails the connection otherwise).
struct WriteOp {
  int peer = -1;         // destination rank in the group
  uint64_t src_key = 0;  // local region holding the payload
  uint64_t src_offset = 0;
  uint64_t dst_key = 0;  // peer's region receiving the payload
  uint64_t dst_offset = 0;
  uint64_t bytes = 0;          // may be 0: a signal alone
  uint64_t signal_key = 0;     // 0: no signal; else the peer region holding the 64-bit word
  uint64_t signal_offset = 0;  // 8-byte aligned
  uint64_t signal_value = 0;   // receiver stores max(old, value), after the payload is visible
  // The writer is the signal word's only writer and never lowers it: storing the value as it
  // is then equals the max, so a backend may place it with the payload in one operation (the
  // libfabric backend on a provider that places an operation's bytes in order). A hint: the
  // outcome is the same either way.
  bool signal_sole_writer = false;
};

struct GroupSpec {
  // The group's key (auth.h), the same on every rank: auth::derive_comm_key of the job token,
  // the communicator id and every rank's bootstrap share. Never sent. connect() refuses a group
  // of more than one rank without one (all zero).
  auth::Key key{};
  uint64_t comm_id = 0;  // distinguishes communicators of one job; covered by the handshake
  int rank = 0;
  int world = 1;
  std::vector<std::string> addresses;  // every rank's Transport::address(), by rank
  std::chrono::milliseconds connect_timeout{30000};
  // A hint for spreading receive work: a striped link (several groups between the same ranks,
  // one per lane) gives each group its lane, and a backend with several receiving threads
  // (the socket one) reads lane l's connection to peer p on thread (l + p) % threads; the
  // libfabric one puts lane l on rail l % rails, starting at its endpoint (l / rails) % stripes,
  // or (2 * (l / rails) + direction) % stripes with LibfabricOptions::one_way_lanes.
  // The same on every rank of the group; it changes nothing about delivery.
  uint32_t lane = 0;
  // The other hint, from one_way_pairs.h: 1 for its group of writes to lower ranks, 0
  // otherwise. A libfabric backend made with LibfabricOptions::one_way_lanes starts such a group on
  // another endpoint than the lane's other direction.
  uint32_t direction = 0;
  // Optional: a flag another thread sets to give the connect up (the communicator was
  // aborted). connect() reads it at least every few tens of milliseconds and then throws
  // TransportError, so an abort never waits for connect_timeout.
  const std::atomic<bool>* cancel = nullptr;
};

// kClosed: the peer closed the group politely (close()), or this side closed or aborted it;
// not an error: check() stays quiet, but a write() to that peer throws. kFailed: the
// connection broke (EOF without a polite close, reset, protocol violation); check() throws.
enum class PeerState { kConnected, kClosed, kFailed };

// The connections of one communicator. Thread-safety: write() is called by one thread at a
// time (the proxy); status()/check()/abort() may be called from any thread.
class PeerGroup {
 public:
  virtual ~PeerGroup() = default;
  virtual int rank() const = 0;
  virtual int world() const = 0;
  // Posts the write. Returns once the source bytes may be reused (they were copied or sent),
  // which may mean waiting while the connection's send buffer is full, but never past the point
  // where the peer is known dead; throws TransportError naming the peer then.
  virtual void write(const WriteOp& op) = 0;
  virtual PeerState status(int peer) const = 0;
  // Throws TransportError naming the first failed peer ("peer rank 2 at host:port closed the
  // connection"), if any.
  virtual void check() const = 0;
  // Drains what was posted and closes the connections politely. Bounded by `timeout`.
  virtual void close(std::chrono::milliseconds timeout) = 0;
  // Stops now: shuts the sockets / queue pairs down without waiting for anything.
  virtual void abort() = 0;
};

// Counters for leak checks and the availability report.
struct TransportStats {
  uint64_t open_connections = 0;
  uint64_t registered_regions = 0;
  uint64_t registered_bytes = 0;
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;
  uint64_t handshakes = 0;  // accepted connections still in their handshake (bounded; auth.h)
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual uint32_t api_version() const { return kTransportApiVersion; }
  virtual const char* name() const = 0;
  // One line for the runtime's description and logs: the backend and what it chose (provider,
  // how signals travel, how GPU memory would be registered). Default: name().
  virtual std::string describe() const { return name(); }
  // The address peers connect to ("host:port" for sockets), for the bootstrap blob.
  virtual std::string address() const = 0;
  virtual Region register_memory(void* base, uint64_t bytes) = 0;
  virtual void deregister_memory(const Region& region) = 0;
  // Builds the all-to-all connections of one group. Every rank calls it with the same spec
  // (but its own rank); returns once all world-1 connections are up and authenticated (each
  // side proved the spec's key, auth.h), or throws ConnectTimeout / TransportError naming the
  // missing peer, or the peer that failed authentication.
  virtual std::unique_ptr<PeerGroup> connect(const GroupSpec& spec) = 0;
  virtual TransportStats stats() const = 0;
  // A hint that traffic for this transport's groups is about to arrive (an op between hosts is
  // being enqueued): receiving threads poll without sleeping for the backend's busy-poll
  // window (busy_poll.h). Changes nothing about delivery; a backend may ignore it.
  virtual void expect_traffic() noexcept {}
};

// ---------------------------------------------------------------------------------------------
// Backends and the factory

// The backends this interface knows. kSocket and kLibfabric are built (kLibfabric where the build
// found libfabric's headers); make_transport() and probe() report the others unavailable, with
// the reason.
enum class TransportKind : uint32_t {
  kSocket,     // TCP sockets (rdma/socket/)
  kIbverbs,    // RDMA verbs, reliable-connected queue pairs (InfiniBand, RoCE)
  kEfa,        // AWS EFA, SRD
  kLibfabric,  // libfabric providers: efa, verbs;ofi_rxm, tcp;ofi_rxm, shm (rdma/libfabric/)
};
inline constexpr TransportKind kTransportKinds[] = {TransportKind::kSocket, TransportKind::kIbverbs,
                                                    TransportKind::kEfa, TransportKind::kLibfabric};
// "socket", "ibverbs", "efa", "libfabric": the name Transport::name() and the availability
// report use.
const char* transport_kind_name(TransportKind kind);

// The socket backend's options.
struct SocketOptions {
  // The address the listener binds. Empty: the host's primary address (the host name's first
  // non-loopback address that can be bound, else the first up non-loopback IPv4 interface), and
  // only that one; "0.0.0.0" or "::": every interface (advertising the primary address).
  std::string bind_host;
  uint16_t port = 0;           // 0: ephemeral
  std::string advertise_host;  // empty: bind_host, or the resolved host name
  // Threads reading the data connections (GroupSpec::lane says which reads which). A TCP
  // receive is a copy by the receiving core, so one thread bounds what all of a transport's
  // connections carry in; values below 1 mean 1.
  int receive_threads = 1;
  // How long a receiver polls its sockets without sleeping after expect_traffic() and after
  // each event it handles (busy_poll.h); zero: it sleeps in epoll_wait whenever nothing is
  // ready (a wake-up then costs tens of microseconds per message).
  std::chrono::microseconds busy_poll{0};
};

// The libfabric providers the libfabric backend runs on.
enum class LibfabricProvider : uint32_t {
  kAuto,   // efa where present, else verbs, else tcp (shm only when asked for: one host)
  kEfa,    // "efa": AWS EFA (SRD)
  kVerbs,  // "verbs;ofi_rxm": InfiniBand, RoCE
  kTcp,    // "tcp;ofi_rxm": any network (and the CI machine)
  kShm,    // "shm": ranks of one host
};
// "auto", "efa", "verbs", "tcp", "shm": the names of spark.fusedcomm.libfabric.provider.
const char* libfabric_provider_name(LibfabricProvider p);

// How the libfabric backend orders a signal after its payload (rdma/libfabric/wire.h).
enum class LibfabricSignal : uint32_t {
  kAuto,     // remote CQ data where the provider has it, else messages
  kCqData,   // payload writes carry remote CQ data; the receiver orders the signal messages
  kMessage,  // a write with delivery completion, then the signal message
};

// The libfabric backend's options.
struct LibfabricOptions {
  LibfabricProvider provider = LibfabricProvider::kAuto;
  // NICs (libfabric domains) per transport; a group uses rail GroupSpec::lane % rails. A
  // provider with fewer domains than this refuses to start, naming what it has.
  int rails = 1;
  // Endpoints per rail, each with its own connections and progress thread: lanes
  // (GroupSpec::lane) of one rail start on different endpoints, and a write of 4 MiB or more
  // is split over two of them. 0: the provider's default (tcp: 2, or 2 × one_way_lanes, at most
  // 8, since a TCP stream moves what one core copies at each end; efa, verbs, shm: 1). More
  // than 1 needs a provider that takes the remote keys it is asked for (not FI_MR_PROV_KEY).
  int stripes = 0;
  // The lanes of groups connected as one-way pairs (one_way_pairs.h; the cuda backend's link
  // between hosts), 0 for none: each lane's two directions (GroupSpec::direction) then start on
  // different endpoints, so that over tcp each connection, and the progress thread that copies
  // it, carries one direction (both ways on one connection moved about half as much each way
  // through the GPU proxy: docs/performance.md).
  int one_way_lanes = 0;
  // tcp: the address to bind. Empty: the host's primary address, as the socket backend's.
  std::string bind_host;
  LibfabricSignal signal = LibfabricSignal::kAuto;
  // How long the progress threads poll without sleeping after expect_traffic() and after each
  // event (busy_poll.h); zero: they back off from spinning to sleeping in slices up to 1 ms.
  std::chrono::microseconds busy_poll{0};
  // Liveness: every pair sends a heartbeat this often (at most a fifth of peer_timeout: the
  // transport shortens it), and a peer silent for peer_timeout is failed (a datagram endpoint
  // has no connection whose end would say so). Silence counts only while this endpoint is read:
  // a pause of this process's own does not fail its peers. The timeout covers the peer's pauses
  // (a host starved of CPU, a descheduled progress thread), so it stays seconds long.
  std::chrono::milliseconds heartbeat{100};
  std::chrono::milliseconds peer_timeout{5000};
  // What dlopen is given; tests name a missing library to see the refusal.
  std::string library = "libfabric.so.1";
};

// What make_transport() needs; each backend reads its own part.
struct TransportOptions {
  SocketOptions socket;
  LibfabricOptions libfabric;
};

// A transport of `kind`. Throws TransportError(-1, "<name> transport is unavailable: <reason>")
// for a kind this build or host cannot run (the reason is probe(kind)'s), and what the backend
// throws when it cannot start (e.g. its listener cannot bind).
std::unique_ptr<Transport> make_transport(TransportKind kind, const TransportOptions& options);

// The socket backend: TCP, one connection per peer pair, SocketOptions::receive_threads
// receiver threads per transport; what make_transport(TransportKind::kSocket, ...) returns.
std::unique_ptr<Transport> make_socket_transport(const SocketOptions& options);

// The libfabric backend (rdma/libfabric/): reliable-datagram endpoints, RMA writes into
// registered regions, signals after their payloads; what make_transport(kLibfabric, ...)
// returns. Throws TransportError(-1, "libfabric transport is unavailable: <reason>") where the
// library, the provider or this build's headers are missing.
std::unique_ptr<Transport> make_libfabric_transport(const LibfabricOptions& options);

// Whether a backend can run on this host, and if not, a sentence saying why. Optional system
// libraries are opened with dlopen, never linked: the library loads on any host.
struct Availability {
  bool available = false;
  std::string reason;
};
Availability probe(TransportKind kind);
Availability probe_socket();
Availability probe_ibverbs();    // dlopen("libibverbs.so.1") and at least one device
Availability probe_efa();        // dlopen("libefa.so.1") and an EFA device
// dlopen("libfabric.so.1") and the providers it answers for: available when one of them can
// run the libfabric backend; the reason lists each provider and what it would use.
Availability probe_libfabric();
// One provider (kAuto: the one auto would pick), through `library`.
Availability probe_libfabric(LibfabricProvider provider, const std::string& library = "libfabric.so.1");

}  // namespace fusedcomm::rdma
