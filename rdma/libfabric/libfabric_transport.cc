// The libfabric backend's Transport and PeerGroup: thin classes over Core and GroupState
// (core.h), make_libfabric_transport, and the libfabric probe.
#include "core.h"

namespace fusedcomm::rdma {
namespace {

using libfabric::Core;
using libfabric::GroupState;
using libfabric::Phase;
using std::chrono::milliseconds;

class LibfabricPeerGroup final : public PeerGroup {
 public:
  explicit LibfabricPeerGroup(std::shared_ptr<GroupState> g) : g_(std::move(g)) {}
  ~LibfabricPeerGroup() override { g_->abort(); }  // a no-op after close(): the peers were told
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

class LibfabricTransport final : public Transport {
 public:
  explicit LibfabricTransport(const LibfabricOptions& o) : core_(std::make_shared<Core>(o)) {}
  ~LibfabricTransport() override { core_->shutdown(); }
  const char* name() const override { return "libfabric"; }
  std::string describe() const override { return core_->describe(); }
  std::string address() const override { return core_->address(); }
  Region register_memory(void* base, uint64_t bytes) override { return core_->register_memory(base, bytes); }
  void deregister_memory(const Region& region) override { core_->deregister_memory(region); }
  std::unique_ptr<PeerGroup> connect(const GroupSpec& spec) override {
    return std::make_unique<LibfabricPeerGroup>(core_->connect(spec));
  }
  TransportStats stats() const override { return core_->stats(); }
  void expect_traffic() noexcept override { core_->expect_traffic(); }

 private:
  std::shared_ptr<Core> core_;
};

}  // namespace

std::unique_ptr<Transport> make_libfabric_transport(const LibfabricOptions& options) {
  return std::make_unique<LibfabricTransport>(options);
}

Availability probe_libfabric(LibfabricProvider provider, const std::string& library) {
  return libfabric::probe_provider(provider, library);
}

Availability probe_libfabric() {
  const libfabric::FabricApi& api = libfabric::FabricApi::get("libfabric.so.1");
  if (!api.ok()) return {false, api.error};
  Availability a;
  a.reason = "libfabric " + libfabric::FabricApi::version_text(api.version()) + ": ";
  bool first = true;
  for (LibfabricProvider p : {LibfabricProvider::kEfa, LibfabricProvider::kVerbs, LibfabricProvider::kTcp,
                              LibfabricProvider::kShm}) {
    const Availability one = libfabric::probe_provider(p, api.library);
    a.available = a.available || one.available;
    a.reason += std::string(first ? "" : "; ") + libfabric_provider_name(p) + ": " +
                (one.available ? one.reason : "no (" + one.reason + ")");
    first = false;
  }
  return a;
}

}  // namespace fusedcomm::rdma
