#include "fusedcomm/runtime/symmetric_memory.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <numeric>

#include "kernels/common/fused.h"
#include "kernels/gemm_rs/gemm_rs.h"

#include "fusedcomm/runtime/errors.h"

namespace fusedcomm {
namespace {

namespace k = fusedcomm::kernels;

constexpr uint32_t kBlobMagic = 0x46435331;  // "FCS1"
constexpr uint32_t kBlobVersion = 2;         // 2: CommFlags::launch (launch signatures)
constexpr uint64_t kPage = 4096;

// Blob layout (little-endian host order; all ranks are on one host).
struct BlobHeader {
  uint32_t magic;    // kBlobMagic
  uint32_t version;  // kBlobVersion
  int32_t rank;
  int32_t world;
  uint64_t region_bytes;  // must match on every rank
  uint64_t data_bytes;
  uint64_t slot_bytes;
  char pci_bus_id[32];  // NUL-terminated
  uint8_t ipc_handle[CUDA_IPC_HANDLE_SIZE];
};
static_assert(sizeof(BlobHeader) == 24 + 16 + 32 + CUDA_IPC_HANDLE_SIZE, "blob layout");

// Host-mapped page: abort word at 0, error record at 64.
constexpr size_t kAbortOffset = 0;
constexpr size_t kErrorOffset = 64;

uint64_t round_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

void check(cudaError_t e, const std::string& what) {
  if (e != cudaSuccess) {
    cudaGetLastError();
    fail(ErrorKind::kFatalGpu, what + " failed (" + cudaGetErrorName(e) + ": " + cudaGetErrorString(e) + ")");
  }
}

const char* algo_name(uint32_t op, uint32_t algo) {
  if (op >= k::kFusedOpAllGatherGemm) {
    switch (static_cast<k::FusedAlgo>(algo)) {
      case k::FusedAlgo::kFused: return "fused";
      case k::FusedAlgo::kDecomposed: return "decomposed";
      case k::FusedAlgo::kOneShot: return "one-shot";
      default: return "?";
    }
  }
  switch (static_cast<k::CommAlgo>(algo)) {
    case k::CommAlgo::kOneShot: return "one-shot";
    case k::CommAlgo::kTwoPhase: return "two-phase";
    case k::CommAlgo::kTwoPhasePush: return "two-phase push";
    case k::CommAlgo::kPipelined: return "pipelined";
    case k::CommAlgo::kDirect: return "direct (in place)";
    case k::CommAlgo::kTwoShot: return "two-shot";
    default: return algo == k::kSigAlgoTwoShotInPlace ? "two-shot (in place)" : "?";
  }
}

}  // namespace

std::string describe_launch(uint64_t sig) {
  const uint32_t op = k::comm_sig_op(sig), algo = k::comm_sig_algo(sig);
  const char* dtype = k::comm_sig_dtype(sig) == static_cast<uint32_t>(k::CommDtype::kBF16) ? "bf16" : "fp32";
  char buf[160];
  if (op >= k::kFusedOpAllGatherGemm) {
    // gemmReduceScatter's dtype field is its partials' code (kernels/gemm_rs/gemm_rs.h,
    // RsPartials), gemmAllReduce's one-shot kernel's too (1: bf16).
    const bool rs = op == k::kFusedOpGemmReduceScatter || op == k::kFusedOpGemmAllReduce;
    const bool any_order = rs && k::comm_sig_dtype(sig) == static_cast<uint32_t>(k::RsPartials::kF32AnyOrder);
    std::snprintf(buf, sizeof buf, "%s (%s%s, %s, sizes #%011llx)", k::fused_op_name(op), dtype,
                  any_order ? " partials, any order"
                  : rs      ? " partials"
                            : "",
                  algo_name(op, algo), static_cast<unsigned long long>(k::comm_sig_size(sig)));
  } else {
    std::snprintf(buf, sizeof buf, "%s (%s, %llu elements, %s)", k::fused_op_name(op), dtype,
                  static_cast<unsigned long long>(k::comm_sig_size(sig)), algo_name(op, algo));
  }
  return buf;
}

std::string launch_mismatch_message(const k::CommErrorRecord& r) {
  const bool same_op = k::comm_sig_op(r.launch_sig) == k::comm_sig_op(r.observed);
  const bool fused = k::comm_sig_op(r.launch_sig) >= k::kFusedOpAllGatherGemm;
  std::string hint = "every rank must launch the same ops in the same order with the same sizes";
  if (same_op && fused) {
    hint =
        "the ranks disagree on the sizes every rank must share (M and K for allGatherGemm, "
        "M and N for gemmReduceScatter and gemmAllReduce), on the algorithm or on gemmReduceScatter's "
        "partials";
  }
  return "launch mismatch at launch " + std::to_string(r.epoch) + ": rank " + std::to_string(r.rank) +
         " launched " + describe_launch(r.launch_sig) + " but rank " + std::to_string(r.peer) + " launched " +
         describe_launch(r.observed) + "; " + hint + "; this symmetric memory must be closed and rebuilt";
}

// ---- SymmetricRegion ----------------------------------------------------------------------

SymmetricRegion::SymmetricRegion(int world, const SymmetricConfig& config) : config_(config) {
  FC_REQUIRE(world >= 1 && world <= k::kCommMaxRanks && config.max_world <= k::kCommMaxRanks,
             "symmetric memory: world must be 1.." + std::to_string(k::kCommMaxRanks));
  FC_REQUIRE(config.slot_bytes >= 16 && config.slot_bytes % 16 == 0,
             "symmetric memory: slot_bytes must be a positive multiple of 16");
  FC_REQUIRE(config.data_bytes % 16 == 0, "symmetric memory: data_bytes must be a multiple of 16");
  check(cudaGetDevice(&device_), "cudaGetDevice");
  check(cudaDeviceGetAttribute(&sm_count_, cudaDevAttrMultiProcessorCount, device_), "SM count");
  char bus[32] = {};
  check(cudaDeviceGetPCIBusId(bus, sizeof bus, device_), "cudaDeviceGetPCIBusId");
  pci_bus_id_ = bus;

  staging_ranks_ = std::max(world, config.max_world);
  const uint64_t staging = 2ull * staging_ranks_ * config.slot_bytes;
  data_offset_ = round_up(k::kCommStagingOffset + staging, kPage);
  scratch_offset_ = round_up(data_offset_ + config.data_bytes, kPage);
  bytes_ = round_up(scratch_offset_ + config.data_bytes, kPage);
  try {
    check(cudaMalloc(reinterpret_cast<void**>(&base_), bytes_),
          "cudaMalloc of the symmetric region (" + std::to_string(bytes_) + " bytes)");
    check(cudaHostAlloc(&host_page_, kPage, cudaHostAllocMapped | cudaHostAllocPortable),
          "cudaHostAlloc of the control page");
    check(cudaHostGetDevicePointer(&device_page_, host_page_, 0), "cudaHostGetDevicePointer");
    cudaIpcMemHandle_t h;
    check(cudaIpcGetMemHandle(&h, base_), "cudaIpcGetMemHandle");
    handle_.assign(reinterpret_cast<uint8_t*>(&h), reinterpret_cast<uint8_t*>(&h) + sizeof h);
    reset();
  } catch (...) {
    free();
    throw;
  }
}

SymmetricRegion::~SymmetricRegion() { free(); }

void SymmetricRegion::reset() {
  // Flags and control must be zero before any peer can see the region (before the handle
  // leaves this process); the sync makes the memset complete.
  check(cudaSetDevice(device_), "cudaSetDevice");
  check(cudaMemset(base_, 0, kernels::kCommStagingOffset), "cudaMemset flags");
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  std::memset(host_page_, 0, kPage);
}

bool SymmetricRegion::fits(int world, const SymmetricConfig& c) const {
  return world <= staging_ranks_ && c.data_bytes == config_.data_bytes &&
         c.slot_bytes == config_.slot_bytes && c.max_world == config_.max_world;
}

void SymmetricRegion::free() noexcept {
  if (device_ >= 0) cudaSetDevice(device_);
  if (base_ != nullptr) cudaFree(base_);
  base_ = nullptr;
  if (host_page_ != nullptr) cudaFreeHost(host_page_);
  host_page_ = nullptr;
  cudaGetLastError();
}

// ---- SymmetricMemory ------------------------------------------------------------------------

SymmetricMemory::SymmetricMemory(int rank, int world, const SymmetricConfig& config)
    : SymmetricMemory(rank, world, std::make_unique<SymmetricRegion>(world, config)) {}

SymmetricMemory::SymmetricMemory(int rank, int world, std::unique_ptr<SymmetricRegion> region)
    : rank_(rank), world_(world), global_rank_(rank), global_world_(world), region_(std::move(region)) {
  FC_REQUIRE(region_ != nullptr, "symmetric memory: no region");
  FC_REQUIRE(world >= 1 && rank >= 0 && rank < world, "symmetric memory: rank out of range");
  region_->reset();
  const SymmetricRegion& r = *region_;
  dev_.slot_bytes = r.config().slot_bytes;
  dev_.data_offset = r.data_offset();
  dev_.data_bytes = r.config().data_bytes;
  dev_.scratch_offset = r.scratch_offset();
  dev_.timeout_ns = r.config().timeout_ns;
  auto* page = static_cast<uint8_t*>(r.device_page());
  dev_.abort_word = reinterpret_cast<const volatile uint32_t*>(page + kAbortOffset);
  dev_.error = reinterpret_cast<k::CommErrorRecord*>(page + kErrorOffset);
  dev_.sm_count = r.sm_count();
  // A world larger than the staging holds can only be used through restrict_to() (a
  // communicator across hosts whose hosts each fit); connect() checks.
  std::vector<int> everyone(world);
  std::iota(everyone.begin(), everyone.end(), 0);
  bind_local(everyone);
}

void SymmetricMemory::bind_local(const std::vector<int>& members) {
  const auto me = std::find(members.begin(), members.end(), global_rank_);
  FC_REQUIRE(me != members.end(), "symmetric memory: this rank is not among the members");
  if (rank_ < k::kCommMaxRanks) dev_.base[rank_] = nullptr;
  members_ = members;
  rank_ = static_cast<int>(me - members.begin());
  world_ = static_cast<int>(members.size());
  dev_.rank = rank_;
  dev_.world = world_;
  if (rank_ < k::kCommMaxRanks) dev_.base[rank_] = region_->base();
  mapped_.assign(world_, nullptr);
}

void SymmetricMemory::restrict_to(const std::vector<int>& members) {
  FC_REQUIRE(!connected_ && !closed_, "symmetric memory: restrict_to() after connect() or close()");
  FC_REQUIRE(!members.empty() && std::is_sorted(members.begin(), members.end()) &&
                 std::adjacent_find(members.begin(), members.end()) == members.end() &&
                 members.front() >= 0 && members.back() < global_world_,
             "symmetric memory: members must be distinct ascending ranks of the world");
  bind_local(members);
}

SymmetricMemory::~SymmetricMemory() {
  try {
    close();
  } catch (...) {
    // Destructors never throw; close() reports through exceptions only when called directly.
  }
}

std::vector<uint8_t> SymmetricMemory::export_handle() const {
  FC_REQUIRE(!closed_, "symmetric memory is closed");
  BlobHeader b{};
  b.magic = kBlobMagic;
  b.version = kBlobVersion;
  b.rank = global_rank_;
  b.world = global_world_;
  b.region_bytes = region_->bytes();
  b.data_bytes = region_->config().data_bytes;
  b.slot_bytes = region_->config().slot_bytes;
  std::strncpy(b.pci_bus_id, region_->pci_bus_id().c_str(), sizeof b.pci_bus_id - 1);
  std::memcpy(b.ipc_handle, region_->ipc_handle().data(), sizeof b.ipc_handle);
  const auto* p = reinterpret_cast<const uint8_t*>(&b);
  return std::vector<uint8_t>(p, p + sizeof b);
}

void SymmetricMemory::connect(const std::vector<std::vector<uint8_t>>& blobs) {
  if (closed_ || connected_)
    fail(ErrorKind::kState, "symmetric memory: connect() on a closed or connected object");
  if (world_ > region_->staging_ranks()) {
    fail(ErrorKind::kUnavailable,
         "symmetric memory: " + std::to_string(world_) + " ranks share it, more than the " +
             std::to_string(region_->staging_ranks()) + " its region is staged for (one host holds at most " +
             std::to_string(k::kCommMaxRanks) + " ranks of a communicator)");
  }
  if (static_cast<int>(blobs.size()) != global_world_) {
    fail(ErrorKind::kCommunicator, "symmetric memory: got " + std::to_string(blobs.size()) +
                                       " handles for world " + std::to_string(global_world_));
  }
  const int device = region_->device();
  const std::string& bus_id = region_->pci_bus_id();
  check(cudaSetDevice(device), "cudaSetDevice");
  peers_.clear();
  const std::string me = std::to_string(global_rank_);
  for (int p = 0; p < world_; ++p) {  // p: local rank; q: its global rank (names in messages)
    const int q = members_[p];
    const std::string peer = std::to_string(q);
    BlobHeader b{};
    if (blobs[q].size() != sizeof b) {
      fail(ErrorKind::kCommunicator, "symmetric memory: rank " + peer + "'s handle has " +
                                         std::to_string(blobs[q].size()) + " bytes, expected " +
                                         std::to_string(sizeof b));
    }
    std::memcpy(&b, blobs[q].data(), sizeof b);
    if (b.magic != kBlobMagic || b.version != kBlobVersion || b.rank != q || b.world != global_world_ ||
        b.region_bytes != region_->bytes() || b.data_bytes != region_->config().data_bytes ||
        b.slot_bytes != region_->config().slot_bytes) {
      fail(ErrorKind::kCommunicator, "symmetric memory: rank " + peer + "'s handle does not match rank " +
                                         me +
                                         "'s (version, rank/world or sizes differ: every rank must "
                                         "use the same SymmetricConfig)");
    }
    PeerLink link;
    link.rank = q;
    link.pci_bus_id = std::string(b.pci_bus_id, strnlen(b.pci_bus_id, sizeof b.pci_bus_id));
    if (p == rank_) {
      link.local_ordinal = device;
      link.can_access = 1;
      peers_.push_back(link);
      continue;
    }
    int ordinal = -1;
    if (cudaDeviceGetByPCIBusId(&ordinal, link.pci_bus_id.c_str()) == cudaSuccess) {
      link.local_ordinal = ordinal;
      int can = 1;  // a GPU reaches its own memory (the tests' shared-GPU mode)
      if (ordinal != device) {
        check(cudaDeviceCanAccessPeer(&can, device, ordinal), "cudaDeviceCanAccessPeer");
      }
      link.can_access = can;
      if (ordinal == device && !region_->config().allow_shared_gpu) {
        fail(ErrorKind::kUnavailable, "symmetric memory: ranks " + me + " and " + peer +
                                          " use the same GPU " + link.pci_bus_id +
                                          "; give each executor its own GPU");
      }
      if (!can) {
        fail(ErrorKind::kUnavailable, "symmetric memory: GPU " + bus_id + " (rank " + me +
                                          ") cannot access peer GPU " + link.pci_bus_id + " (rank " + peer +
                                          "); NVLink/P2P is required between same-host ranks");
      }
    } else {
      cudaGetLastError();  // not visible here (CUDA_VISIBLE_DEVICES); IPC may still work
    }
    cudaIpcMemHandle_t h;
    std::memcpy(&h, b.ipc_handle, sizeof h);
    void* ptr = nullptr;
    const cudaError_t e = cudaIpcOpenMemHandle(&ptr, h, cudaIpcMemLazyEnablePeerAccess);
    if (e != cudaSuccess) {
      cudaGetLastError();
      fail(ErrorKind::kUnavailable, "symmetric memory: rank " + me + " could not map rank " + peer +
                                        "'s memory (GPU " + link.pci_bus_id + "): " + cudaGetErrorName(e) +
                                        ": " + cudaGetErrorString(e));
    }
    mapped_[p] = static_cast<uint8_t*>(ptr);
    dev_.base[p] = mapped_[p];
    if (link.can_access < 0) link.can_access = 1;  // mapping succeeded
    peers_.push_back(link);
  }
  connected_ = true;
}

void* SymmetricMemory::data() const { return region_->base() + region_->data_offset(); }

uint64_t SymmetricMemory::data_bytes() const { return region_->config().data_bytes; }

std::string SymmetricMemory::describe() const {
  std::string s = "symmetric memory rank " + std::to_string(rank_) + "/" + std::to_string(world_) + " on " +
                  region_->pci_bus_id() + ", region " + std::to_string(region_->bytes()) + " bytes";
  for (const PeerLink& l : peers_) {
    s += "\n  peer " + std::to_string(l.rank) + ": " + l.pci_bus_id + " ordinal " +
         std::to_string(l.local_ordinal) + " access " +
         (l.can_access == 1   ? "yes"
          : l.can_access == 0 ? "no"
                              : "unknown");
  }
  return s;
}

kernels::CommErrorRecord SymmetricMemory::error() const {
  k::CommErrorRecord r{};
  if (region_ != nullptr) {
    std::memcpy(&r, static_cast<const uint8_t*>(region_->host_page()) + kErrorOffset, sizeof r);
  }
  return r;
}

void SymmetricMemory::raise_if_failed() {
  const k::CommErrorRecord r = error();
  if (r.code == k::kGemmOk) return;
  failed_ = true;
  // The record names local ranks; messages name the communicator's.
  auto global_rank = [&](uint32_t local) {
    return local < members_.size() ? static_cast<uint32_t>(members_[local]) : local;
  };
  auto global = [&](uint32_t local) { return std::to_string(global_rank(local)); };
  if (r.code == k::kCommLaunchMismatch) {
    k::CommErrorRecord named = r;
    named.rank = global_rank(r.rank);
    named.peer = global_rank(r.peer);
    fail(ErrorKind::kCommunicator, launch_mismatch_message(named));
  }
  const std::string where = "rank " + global(r.rank) + " " + k::fused_op_name(r.op) + " (epoch " +
                            std::to_string(r.epoch) + ") waiting for peer " + global(r.peer) + " at step " +
                            k::fused_step_name(r.step) + ", CTA " + std::to_string(r.cta) + ", observed " +
                            std::to_string(r.observed) + " after " + std::to_string(r.elapsed_ns / 1000000) +
                            " ms";
  if (r.code == k::kGemmAborted) fail(ErrorKind::kCommunicator, "collective aborted: " + where);
  if (r.code == k::kCommHostsFailed) {
    fail(ErrorKind::kTimeout,
         "rank " + global(r.rank) +
             ": a step between hosts failed (the link's error names the rank); this symmetric "
             "memory must be closed and rebuilt");
  }
  if (r.code == k::kCommPeerFailed) {
    // The peer's own error (a timeout, an abort, a failed step between hosts) names the cause.
    const uint32_t why = static_cast<uint32_t>(r.observed);
    const bool aborted = why == k::kGemmAborted;
    fail(aborted || why == k::kCommLaunchMismatch ? ErrorKind::kCommunicator : ErrorKind::kTimeout,
         std::string("collective failed: rank ") + global(r.rank) + " " + k::fused_op_name(r.op) +
             " (epoch " + std::to_string(r.epoch) + ") at step " + k::fused_step_name(r.step) + ": peer " +
             global(r.peer) + " had given up first (" +
             (aborted                         ? "aborted"
              : why == k::kCommLaunchMismatch ? "a launch mismatch"
              : why == k::kCommHostsFailed    ? "its step between hosts failed"
              : why == k::kCommPeerFailed     ? "its own peer had given up"
                                              : "a timeout") +
             "; its error names the cause); this symmetric memory must be closed and rebuilt");
  }
  fail(ErrorKind::kTimeout,
       "collective timed out: " + where + "; this symmetric memory must be closed and rebuilt");
}

void SymmetricMemory::abort() {
  aborted_ = true;
  if (region_ != nullptr) {
    reinterpret_cast<volatile uint32_t*>(static_cast<uint8_t*>(region_->host_page()) + kAbortOffset)[0] = 1;
  }
}

void SymmetricMemory::close() {
  if (closed_) return;
  closed_ = true;
  if (region_ == nullptr) return;
  cudaSetDevice(region_->device());
  cudaDeviceSynchronize();  // no launch of ours may still use the mappings
  for (uint8_t*& p : mapped_) {
    if (p != nullptr) cudaIpcCloseMemHandle(p);
    p = nullptr;
  }
  cudaGetLastError();
  if (error().code != k::kGemmOk) failed_ = true;
  dev_ = {};
}

std::unique_ptr<SymmetricRegion> SymmetricMemory::take_region() {
  FC_REQUIRE(closed_, "symmetric memory: take_region() before close()");
  std::unique_ptr<SymmetricRegion> r = std::move(region_);
  if (failed_ || aborted_) r.reset();  // a peer's abandoned launch may still write into it
  return r;
}

}  // namespace fusedcomm
