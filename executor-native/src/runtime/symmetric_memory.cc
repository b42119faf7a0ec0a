#include "fusedcomm/runtime/symmetric_memory.h"

#include <cuda_runtime_api.h>

#include <cstring>

#include "fusedcomm/runtime/errors.h"

namespace fusedcomm {
namespace {

namespace k = fusedcomm::kernels;

constexpr uint32_t kBlobMagic = 0x46435331;  // "FCS1"
constexpr uint32_t kBlobVersion = 1;
constexpr uint64_t kPage = 4096;

// Blob layout (little-endian host order; all ranks are on one host).
struct BlobHeader {
  uint32_t magic;         // kBlobMagic
  uint32_t version;       // kBlobVersion
  int32_t rank;
  int32_t world;
  uint64_t region_bytes;  // must match on every rank
  uint64_t data_bytes;
  uint64_t slot_bytes;
  char pci_bus_id[32];    // NUL-terminated
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
    fail(ErrorKind::kFatalGpu, what + " failed (" + cudaGetErrorName(e) + ": " +
                                   cudaGetErrorString(e) + ")");
  }
}

}  // namespace

SymmetricMemory::SymmetricMemory(int rank, int world, const SymmetricConfig& config)
    : rank_(rank), world_(world), config_(config) {
  FC_REQUIRE(world >= 1 && world <= k::kCommMaxRanks,
             "symmetric memory: world must be 1.." + std::to_string(k::kCommMaxRanks));
  FC_REQUIRE(rank >= 0 && rank < world, "symmetric memory: rank out of range");
  FC_REQUIRE(config.slot_bytes >= 16 && config.slot_bytes % 16 == 0,
             "symmetric memory: slot_bytes must be a positive multiple of 16");
  check(cudaGetDevice(&device_), "cudaGetDevice");
  int sms = 0;
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device_), "SM count");
  char bus[32] = {};
  check(cudaDeviceGetPCIBusId(bus, sizeof bus, device_), "cudaDeviceGetPCIBusId");
  pci_bus_id_ = bus;

  const uint64_t staging = 2ull * world * config.slot_bytes;
  const uint64_t data_offset = round_up(k::kCommStagingOffset + staging, kPage);
  const uint64_t scratch_offset = round_up(data_offset + config.data_bytes, kPage);
  region_bytes_ = round_up(scratch_offset + config.data_bytes, kPage);

  try {
    check(cudaMalloc(reinterpret_cast<void**>(&local_), region_bytes_), "cudaMalloc of the symmetric region (" +
                                                  std::to_string(region_bytes_) + " bytes)");
    // Flags and control must be zero before any peer can see the region (before the handle
    // leaves this process); the sync makes the memset complete.
    check(cudaMemset(local_, 0, kernels::kCommStagingOffset), "cudaMemset flags");
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    check(cudaHostAlloc(&host_page_, kPage, cudaHostAllocMapped | cudaHostAllocPortable),
          "cudaHostAlloc of the control page");
    std::memset(host_page_, 0, kPage);
    void* dev_page = nullptr;
    check(cudaHostGetDevicePointer(&dev_page, host_page_, 0), "cudaHostGetDevicePointer");
    cudaIpcMemHandle_t h;
    check(cudaIpcGetMemHandle(&h, local_), "cudaIpcGetMemHandle");
    handle_.assign(reinterpret_cast<uint8_t*>(&h), reinterpret_cast<uint8_t*>(&h) + sizeof h);

    dev_.slot_bytes = config.slot_bytes;
    dev_.data_offset = data_offset;
    dev_.data_bytes = config.data_bytes;
    dev_.scratch_offset = scratch_offset;
    dev_.timeout_ns = config.timeout_ns;
    dev_.abort_word = reinterpret_cast<const volatile uint32_t*>(
        static_cast<uint8_t*>(dev_page) + kAbortOffset);
    dev_.error = reinterpret_cast<k::CommErrorRecord*>(static_cast<uint8_t*>(dev_page) + kErrorOffset);
    dev_.rank = rank;
    dev_.world = world;
    dev_.sm_count = sms;
    dev_.base[rank] = local_;
  } catch (...) {
    close();
    throw;
  }
  mapped_.assign(world, nullptr);
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
  b.rank = rank_;
  b.world = world_;
  b.region_bytes = region_bytes_;
  b.data_bytes = config_.data_bytes;
  b.slot_bytes = config_.slot_bytes;
  std::strncpy(b.pci_bus_id, pci_bus_id_.c_str(), sizeof b.pci_bus_id - 1);
  std::memcpy(b.ipc_handle, handle_.data(), sizeof b.ipc_handle);
  const auto* p = reinterpret_cast<const uint8_t*>(&b);
  return std::vector<uint8_t>(p, p + sizeof b);
}

void SymmetricMemory::connect(const std::vector<std::vector<uint8_t>>& blobs) {
  if (closed_ || connected_) fail(ErrorKind::kState, "symmetric memory: connect() on a closed or connected object");
  if (static_cast<int>(blobs.size()) != world_) {
    fail(ErrorKind::kCommunicator, "symmetric memory: got " + std::to_string(blobs.size()) +
                                       " handles for world " + std::to_string(world_));
  }
  check(cudaSetDevice(device_), "cudaSetDevice");
  peers_.clear();
  for (int p = 0; p < world_; ++p) {
    BlobHeader b{};
    if (blobs[p].size() != sizeof b) {
      fail(ErrorKind::kCommunicator, "symmetric memory: rank " + std::to_string(p) +
                                         "'s handle has " + std::to_string(blobs[p].size()) +
                                         " bytes, expected " + std::to_string(sizeof b));
    }
    std::memcpy(&b, blobs[p].data(), sizeof b);
    if (b.magic != kBlobMagic || b.version != kBlobVersion || b.rank != p || b.world != world_ ||
        b.region_bytes != region_bytes_ || b.data_bytes != config_.data_bytes ||
        b.slot_bytes != config_.slot_bytes) {
      fail(ErrorKind::kCommunicator,
           "symmetric memory: rank " + std::to_string(p) + "'s handle does not match rank " +
               std::to_string(rank_) + "'s (version, rank/world or sizes differ: every rank must "
               "use the same SymmetricConfig)");
    }
    PeerLink link;
    link.rank = p;
    link.pci_bus_id = std::string(b.pci_bus_id, strnlen(b.pci_bus_id, sizeof b.pci_bus_id));
    if (p == rank_) {
      link.local_ordinal = device_;
      link.can_access = 1;
      peers_.push_back(link);
      continue;
    }
    int ordinal = -1;
    if (cudaDeviceGetByPCIBusId(&ordinal, link.pci_bus_id.c_str()) == cudaSuccess) {
      link.local_ordinal = ordinal;
      int can = 0;
      check(cudaDeviceCanAccessPeer(&can, device_, ordinal), "cudaDeviceCanAccessPeer");
      link.can_access = can;
      if (ordinal == device_) {
        fail(ErrorKind::kUnavailable, "symmetric memory: ranks " + std::to_string(rank_) + " and " +
                                          std::to_string(p) + " use the same GPU " +
                                          link.pci_bus_id + "; give each executor its own GPU");
      }
      if (!can) {
        fail(ErrorKind::kUnavailable, "symmetric memory: GPU " + pci_bus_id_ + " (rank " +
                                          std::to_string(rank_) + ") cannot access peer GPU " +
                                          link.pci_bus_id + " (rank " + std::to_string(p) +
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
      fail(ErrorKind::kUnavailable, "symmetric memory: rank " + std::to_string(rank_) +
                                        " could not map rank " + std::to_string(p) +
                                        "'s memory (GPU " + link.pci_bus_id + "): " +
                                        cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
    }
    mapped_[p] = static_cast<uint8_t*>(ptr);
    dev_.base[p] = mapped_[p];
    if (link.can_access < 0) link.can_access = 1;  // mapping succeeded
    peers_.push_back(link);
  }
  connected_ = true;
}

void* SymmetricMemory::data() const { return local_ + dev_.data_offset; }

std::string SymmetricMemory::describe() const {
  std::string s = "symmetric memory rank " + std::to_string(rank_) + "/" + std::to_string(world_) +
                  " on " + pci_bus_id_ + ", region " + std::to_string(region_bytes_) + " bytes";
  for (const PeerLink& l : peers_) {
    s += "\n  peer " + std::to_string(l.rank) + ": " + l.pci_bus_id + " ordinal " +
         std::to_string(l.local_ordinal) + " access " +
         (l.can_access == 1 ? "yes" : l.can_access == 0 ? "no" : "unknown");
  }
  return s;
}

kernels::CommErrorRecord SymmetricMemory::error() const {
  k::CommErrorRecord r{};
  if (host_page_ != nullptr) {
    std::memcpy(&r, static_cast<const uint8_t*>(host_page_) + kErrorOffset, sizeof r);
  }
  return r;
}

void SymmetricMemory::raise_if_failed() {
  const k::CommErrorRecord r = error();
  if (r.code == k::kGemmOk) return;
  failed_ = true;
  const std::string where =
      "rank " + std::to_string(r.rank) + " " + k::comm_op_name(r.op) + " (epoch " +
      std::to_string(r.epoch) + ") waiting for peer " + std::to_string(r.peer) + " at step " +
      k::comm_step_name(r.step) + ", CTA " + std::to_string(r.cta) + ", observed " +
      std::to_string(r.observed) + " after " + std::to_string(r.elapsed_ns / 1000000) + " ms";
  if (r.code == k::kGemmAborted) fail(ErrorKind::kCommunicator, "collective aborted: " + where);
  fail(ErrorKind::kTimeout, "collective timed out: " + where +
                                "; this symmetric memory must be closed and rebuilt");
}

void SymmetricMemory::abort() {
  if (host_page_ != nullptr) {
    reinterpret_cast<volatile uint32_t*>(static_cast<uint8_t*>(host_page_) + kAbortOffset)[0] = 1;
  }
}

void SymmetricMemory::close() {
  if (closed_) return;
  closed_ = true;
  if (device_ >= 0) cudaSetDevice(device_);
  cudaDeviceSynchronize();  // no launch of ours may still use the mappings
  for (uint8_t*& p : mapped_) {
    if (p != nullptr) cudaIpcCloseMemHandle(p);
    p = nullptr;
  }
  if (local_ != nullptr) cudaFree(local_);
  local_ = nullptr;
  if (host_page_ != nullptr) cudaFreeHost(host_page_);
  host_page_ = nullptr;
  cudaGetLastError();
  dev_ = {};
}

}  // namespace fusedcomm
