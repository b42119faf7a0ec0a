// A communicator's host half: `world` ranks (one per executor task of a barrier stage)
// connected through the executor runtime's transport, and the Exchanger over it that the host
// backend's ops are written against. Both backends own one: HostComm runs its ops on it;
// CudaComm uses it for the bootstrap barriers, finish() and peer-failure detection.
//
// Life cycle (driven by the Comm that owns it): construct with the world size (registers the
// staging region, so that endpoint() can go into the bootstrap blob) -> connect(endpoints of all
// ranks, rank, the communicator id all ranks agreed on, every rank's bootstrap share) -> ops ->
// close(). abort() may be called from any thread at any time, also while connect() waits for its
// peers; waits in flight then fail at once.
//
// Everything a peer writes (chunk headers, flags, op descriptions) is checked before it is used;
// a violation fails the op with an error naming the peer (src/runtime/chunk_wire.h).
//
// Every op calls begin_op(description, fingerprint) first. The fingerprint covers the op's global
// parameters (op, dtype, global shapes); it travels in every chunk header, so a rank whose
// parameters differ is named, with both descriptions, on every rank at the op's first exchange.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "fusedcomm/rdma/proxy.h"
#include "fusedcomm/rdma/transport.h"
#include "fusedcomm/runtime/errors.h"
#include "fusedcomm/runtime/exchange.h"
#include "fusedcomm/runtime/runtime.h"

namespace fusedcomm {

namespace chunk_wire {
struct ChunkHeader;
struct StagingLayout;
}  // namespace chunk_wire

class TransportExchanger final : public Exchanger {
 public:
  TransportExchanger(Runtime& runtime, int world);
  ~TransportExchanger() override;
  TransportExchanger(const TransportExchanger&) = delete;
  TransportExchanger& operator=(const TransportExchanger&) = delete;

  // "host:port#regionKey": what peers need to reach this rank's staging region.
  std::string endpoint() const;
  // Builds the connections; endpoints[i] is rank i's endpoint(), shares[i] the random share rank
  // i published in the bootstrap (one per rank; none for a world of one). The connections are
  // authenticated with the communicator's key, rdma::auth::derive_comm_key(job token, comm_id,
  // shares). Bounded by the connect timeout.
  void connect(const std::vector<std::string>& endpoints, int rank, uint64_t comm_id,
               const std::vector<rdma::auth::Share>& shares);
  // The communicator's key (after connect): the cuda backend's groups between hosts use it too.
  const rdma::auth::Key& key() const { return key_; }
  // Set by abort(): connects that other parts of the communicator make (the cuda backend's links
  // between hosts) poll it, so one abort reaches every connect wait.
  const std::atomic<bool>& aborted_flag() const { return aborted_; }

  int rank() const override { return rank_; }
  int world() const override { return world_; }
  void begin_op(const std::string& description, uint64_t fingerprint);
  void exchange(const std::vector<SendBlock>& send, const std::vector<RecvBlock>& recv,
                const char* step) override;

  // Teardown verbs: finish() drains (a barrier all ranks pass); close() = finish + free
  // (idempotent; after an error or abort it frees without the barrier); abort() stops now.
  void finish();
  void close();
  void abort() noexcept;

 private:
  chunk_wire::StagingLayout layout() const;
  size_t slot_stride() const;
  size_t recv_slot(int src, uint64_t chunk) const;
  size_t send_slot(int dst, uint64_t chunk) const;
  size_t data_flag(int src) const;
  size_t credit_flag(int dst) const;
  uint64_t load_flag(size_t offset) const;
  void check_usable(const char* what) const;
  void post(const rdma::WriteOp& op);
  void barrier(const char* name, const char* step);  // an exchange of empty blocks
  void check_chunk(const chunk_wire::ChunkHeader& h, int peer, uint64_t seq, uint64_t total, uint64_t offset,
                   uint64_t bytes, const char* step, const std::string& where);
  [[noreturn]] void fail_broken(ErrorKind kind, const std::string& message);
  std::string peer_name(int peer) const;

  Runtime& runtime_;
  const uint64_t chunk_bytes_;
  const int world_;
  int rank_ = -1;
  bool connected_ = false, closed_ = false;

  char* staging_ = nullptr;  // registered region, layout in transport_exchanger.cc
  size_t staging_bytes_ = 0;
  rdma::Region region_;
  std::vector<uint64_t> peer_keys_;
  std::vector<std::string> peer_addresses_;
  rdma::auth::Key key_{};
  // Set once by connect(); abort() may read it from another thread meanwhile, so both hold
  // group_mu_ (and close(), which resets it).
  std::mutex group_mu_;
  std::unique_ptr<rdma::PeerGroup> group_;
  void* ring_memory_ = nullptr;
  std::unique_ptr<rdma::Proxy> proxy_;

  // Per-pair chunk counters; they only grow, across exchanges and ops (no resets: a stale flag
  // can never satisfy a wait for a newer chunk).
  std::vector<uint64_t> sent_chunks_;      // [dst] chunks posted to dst
  std::vector<uint64_t> consumed_chunks_;  // [src] chunks from src copied out
  uint64_t exchange_seq_ = 0;

  std::string op_description_ = "(no op)";
  uint64_t op_fingerprint_ = 0;
  std::atomic<bool> aborted_{false};
  std::string broken_;  // first fatal error; the communicator is unusable after it
};

}  // namespace fusedcomm
