// Symmetric memory among the processes of one host: every rank allocates one device region of
// the same layout (kernels/collectives.h), exports a CUDA IPC handle, and maps every peer's
// region; kernels then read and write peers' memory over NVLink with plain loads and stores.
//
// Bootstrap: the handles travel as opaque byte blobs through whatever the caller has (the Java
// barrier allGather blob in the product; pipes in tests):
//
//   SymmetricMemory sm(rank, world, config);           // allocates, zeroes flags (current GPU)
//   blobs = allGather(sm.export_handle());             // bytes, one blob per rank, by rank
//   sm.connect(blobs);                                 // opens peers, checks peer access
//   kernels::launch_collective(sm.device(), args, stream);
//   ... stream sync ...; sm.raise_if_failed();         // timeout/abort -> Error(kTimeout)
//   barrier(); sm.close();                             // or the destructor
//
// Lifetime and close order (RAII; close() is idempotent, the destructor calls it):
//   1. the caller makes sure no launch on this memory is still running on any rank (a
//      bootstrap barrier after the ranks' stream syncs); close() synchronises the device too;
//   2. peer mappings are closed (cudaIpcCloseMemHandle), in rank order;
//   3. the local region is freed (cudaFree); peers that still map it keep the physical memory
//      alive until they close their mapping (driver reference count), but must not use it;
//   4. the host-mapped control page (abort word + error record) is freed.
// abort() sets the abort word: every wait of a running launch gives up (kGemmAborted), so a
// communicator can be torn down while a peer is dead. After any failure the flags are
// inconsistent: close this object and build a fresh one (the epochs restart at 0).
//
// Not thread-safe; one stream at a time launches on it (collectives.h contract).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "fusedcomm/kernels/collectives.h"

namespace fusedcomm {

struct SymmetricConfig {
  uint64_t data_bytes = 64ull << 20;  // caller-visible data area per rank (inputs)
  uint64_t slot_bytes = 1ull << 20;   // one-shot staging slot (max one-shot payload)
  uint64_t timeout_ns = 0;            // every device wait; 0: kernels::kDefaultWaitTimeoutNs
};

// What connect() found about one peer.
struct PeerLink {
  int rank = -1;
  std::string pci_bus_id;  // as exported by the peer
  int local_ordinal = -1;  // the peer's GPU as numbered in this process; -1: not visible here
  int can_access = -1;     // cudaDeviceCanAccessPeer: 1 yes, 0 no, -1 unknown (not visible)
};

class SymmetricMemory {
 public:
  // Allocates the region on the calling thread's current device. Throws Error(kInvalidArgument)
  // for a bad rank/world/size, Error(kFatalGpu) if CUDA fails.
  SymmetricMemory(int rank, int world, const SymmetricConfig& config);
  ~SymmetricMemory();
  SymmetricMemory(const SymmetricMemory&) = delete;
  SymmetricMemory& operator=(const SymmetricMemory&) = delete;

  // This rank's blob: format version, rank, world, region size, PCI bus id, the IPC handle.
  std::vector<uint8_t> export_handle() const;
  // `blobs[p]` is rank p's export_handle() (this rank's own included). Validates the blobs
  // (version, ranks, sizes), opens every peer's region and checks peer access; throws
  // Error(kCommunicator) on a mismatch, Error(kUnavailable) if a peer's GPU is not reachable.
  void connect(const std::vector<std::vector<uint8_t>>& blobs);

  // The by-value handle for kernels (valid after connect(), until close()).
  const kernels::CommDevice& device() const { return dev_; }
  int rank() const { return rank_; }
  int world() const { return world_; }
  // This rank's data area (device pointer) and its size: callers place inputs here.
  void* data() const;
  uint64_t data_bytes() const { return config_.data_bytes; }
  const std::vector<PeerLink>& peers() const { return peers_; }
  std::string describe() const;  // one line per peer: rank, bus id, access

  // The host-mapped error record (read after a stream sync; zero code: no failure).
  kernels::CommErrorRecord error() const;
  // Throws Error(kTimeout) (or kCommunicator for an abort) naming rank, peer, op, step and
  // epoch if a launch gave up; marks this object failed.
  void raise_if_failed();
  bool failed() const { return failed_; }

  void abort();  // set the abort word (host-mapped); running waits give up
  void close();

 private:
  int rank_, world_;
  SymmetricConfig config_;
  int device_ = -1;
  uint64_t region_bytes_ = 0;
  uint8_t* local_ = nullptr;              // cudaMalloc'ed region
  std::vector<uint8_t*> mapped_;          // peers' regions opened here (null for self)
  void* host_page_ = nullptr;             // cudaHostAlloc'ed: abort word + error record
  kernels::CommDevice dev_{};
  std::vector<PeerLink> peers_;
  std::string pci_bus_id_;
  std::vector<uint8_t> handle_;  // cudaIpcMemHandle_t bytes
  bool connected_ = false, failed_ = false, closed_ = false;
};

}  // namespace fusedcomm
