// The socket backend's Transport and PeerGroup: thin classes over Core and GroupState (core.h),
// and make_socket_transport.
#include "core.h"

namespace fusedcomm::rdma {
namespace {

using socket_backend::Core;
using socket_backend::GroupState;
using socket_backend::Phase;
using std::chrono::milliseconds;

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

class SocketTransport final : public Transport {
 public:
  explicit SocketTransport(const SocketOptions& o) : core_(std::make_shared<Core>(o)) {}
  ~SocketTransport() override { core_->shutdown(); }
  const char* name() const override { return "socket"; }
  std::string address() const override { return core_->address(); }
  Region register_memory(void* base, uint64_t bytes) override { return core_->register_memory(base, bytes); }
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
