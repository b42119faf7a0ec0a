// Symmetric memory among the processes of one host: every rank allocates one device region of
// the same layout (kernels/collectives/collectives.h), exports a CUDA IPC handle, and maps every peer's
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
//   3. the region (device allocation + host-mapped control page) is freed with this object, or
//      handed back by take_region() for reuse; peers that still map a freed region keep the
//      physical memory alive until they close their mapping (driver reference count), but
//      must not use it.
// abort() sets the abort word: every wait of a running launch gives up (kGemmAborted), so a
// communicator can be torn down while a peer is dead. After any failure the flags are
// inconsistent: close this object and build a fresh one (the epochs restart at 0).
//
// Reuse across communicators: the device allocation lives in a SymmetricRegion, which a
// SymmetricMemory either creates (and frees) itself or borrows from the executor runtime's pool
// (runtime.h). After a clean close(), take_region() hands it back; the next SymmetricMemory
// resets it (flags, control, abort word and error record zeroed) before its handle leaves the
// process, so no stale flag can satisfy a wait of the new communicator. A region whose
// communicator failed or was aborted is freed instead: a peer's abandoned launch may still write
// into it.
//
// Not thread-safe; one stream at a time launches on it (collectives.h contract).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/collectives/collectives.h"

namespace fusedcomm {

struct SymmetricConfig {
  uint64_t data_bytes = 64ull << 20;  // caller-visible data area per rank (inputs)
  uint64_t slot_bytes = 1ull << 20;   // one-shot staging slot (max one-shot payload)
  uint64_t timeout_ns = 0;            // every device wait; 0: kernels::kDefaultWaitTimeoutNs
  // Staging is sized for this many ranks (0: the world). A pooled region uses kCommMaxRanks so
  // that communicators of any world size can reuse it. Must match on every rank.
  int max_world = 0;
  // Tests only: let ranks share one GPU (their processes' kernels then time-slice the GPU, so
  // waits are slow and timings meaningless; protocol and correctness tests run on a 1-GPU
  // host). Off: connect() refuses two ranks on one GPU, as the product must.
  bool allow_shared_gpu = false;
};

// "allReduce (bf16, 4096 elements, one-shot)" / "allGatherGemm (fused, sizes #1a2b...)": what a
// launch signature (kernels/collectives/collectives.h) says, for error messages.
std::string describe_launch(uint64_t signature);
// The message SymmetricMemory::raise_if_failed gives for a kCommLaunchMismatch record.
std::string launch_mismatch_message(const kernels::CommErrorRecord& record);

// One process's device region (layout in kernels/collectives/collectives.h), its CUDA IPC handle and the
// host-mapped control page (abort word + error record). Allocated on the current device.
class SymmetricRegion {
 public:
  // `world` sizes the staging area unless config.max_world is larger.
  SymmetricRegion(int world, const SymmetricConfig& config);
  ~SymmetricRegion();
  SymmetricRegion(const SymmetricRegion&) = delete;
  SymmetricRegion& operator=(const SymmetricRegion&) = delete;

  // Zeroes flags, control, abort word and error record, synchronously. Call only while no
  // process can write into the region (before its handle is exported).
  void reset();
  // True when a communicator of `world` ranks with `config` can use this region.
  bool fits(int world, const SymmetricConfig& config) const;

  const SymmetricConfig& config() const { return config_; }
  int device() const { return device_; }
  int sm_count() const { return sm_count_; }
  const std::string& pci_bus_id() const { return pci_bus_id_; }
  uint8_t* base() const { return base_; }
  uint64_t bytes() const { return bytes_; }
  uint64_t data_offset() const { return data_offset_; }
  uint64_t scratch_offset() const { return scratch_offset_; }
  int staging_ranks() const { return staging_ranks_; }
  const std::vector<uint8_t>& ipc_handle() const { return handle_; }
  void* host_page() const { return host_page_; }
  void* device_page() const { return device_page_; }

 private:
  void free() noexcept;
  SymmetricConfig config_;
  int device_ = -1, sm_count_ = 0, staging_ranks_ = 0;
  std::string pci_bus_id_;
  uint8_t* base_ = nullptr;
  uint64_t bytes_ = 0, data_offset_ = 0, scratch_offset_ = 0;
  std::vector<uint8_t> handle_;
  void* host_page_ = nullptr;
  void* device_page_ = nullptr;
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
  // Uses `region` (from a pool; reset here). A world larger than the region's staging must be
  // narrowed by restrict_to() before connect() (which throws Error(kUnavailable) otherwise).
  SymmetricMemory(int rank, int world, std::unique_ptr<SymmetricRegion> region);
  ~SymmetricMemory();
  SymmetricMemory(const SymmetricMemory&) = delete;
  SymmetricMemory& operator=(const SymmetricMemory&) = delete;

  // This rank's blob: format version, rank, world, region size, PCI bus id, the IPC handle.
  std::vector<uint8_t> export_handle() const;
  // Before connect(), for a communicator that spans several hosts: the memory is shared only
  // with `members`, the global ranks on this rank's host (ascending, this rank among them).
  // export_handle() keeps the global rank and world; connect() still takes every rank's blob
  // but maps only the members'; kernels see the local rank (this rank's index in members) and
  // the local world; error messages name global ranks.
  void restrict_to(const std::vector<int>& members);
  // `blobs[p]` is rank p's export_handle() (this rank's own included). Validates the blobs
  // (version, ranks, sizes), opens every peer's region and checks peer access; throws
  // Error(kCommunicator) on a mismatch, Error(kUnavailable) if a peer's GPU is not reachable.
  void connect(const std::vector<std::vector<uint8_t>>& blobs);

  // The by-value handle for kernels (valid after connect(), until close()).
  const kernels::CommDevice& device() const { return dev_; }
  int rank() const { return rank_; }  // local (see restrict_to)
  int world() const { return world_; }
  // This rank's data area (device pointer) and its size: callers place inputs here.
  void* data() const;
  uint64_t data_bytes() const;
  uint64_t region_bytes() const { return region_ != nullptr ? region_->bytes() : 0; }  // 0 once taken
  const std::vector<PeerLink>& peers() const { return peers_; }
  std::string describe() const;  // one line per peer: rank, bus id, access

  // The host-mapped error record (read after a stream sync; zero code: no failure).
  kernels::CommErrorRecord error() const;
  // Throws Error(kTimeout) (or kCommunicator for an abort or a launch mismatch) naming rank,
  // peer, op, step and epoch if a launch gave up; marks this object failed.
  void raise_if_failed();
  bool failed() const { return failed_; }

  void abort();  // set the abort word (host-mapped); running waits give up
  void close();
  // After close(): the region, for reuse, if this memory never failed nor was aborted; else
  // null (the region is freed).
  std::unique_ptr<SymmetricRegion> take_region();

 private:
  void bind_local(const std::vector<int>& members);  // rank_, world_, members_, dev_ from them
  int rank_, world_;                                 // as the kernels see them (local after restrict_to)
  int global_rank_, global_world_;                   // the communicator's, in the blob
  std::vector<int> members_;                         // global rank of each local rank
  std::unique_ptr<SymmetricRegion> region_;
  std::vector<uint8_t*> mapped_;  // peers' regions opened here (null for self)
  kernels::CommDevice dev_{};
  std::vector<PeerLink> peers_;
  bool connected_ = false, failed_ = false, aborted_ = false, closed_ = false;
};

}  // namespace fusedcomm
