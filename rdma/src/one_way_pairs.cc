#include "fusedcomm/rdma/one_way_pairs.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>

namespace fusedcomm::rdma {
namespace {

class OneWayPairsGroup final : public PeerGroup {
 public:
  OneWayPairsGroup(std::unique_ptr<PeerGroup> up, std::unique_ptr<PeerGroup> down)
      : up_(std::move(up)), down_(std::move(down)) {}
  ~OneWayPairsGroup() override = default;  // the groups' own destructors abort what is open

  int rank() const override { return up_->rank(); }
  int world() const override { return up_->world(); }
  void write(const WriteOp& op) override { to(op.peer).write(op); }
  PeerState status(int peer) const override { return to(peer).status(peer); }
  void check() const override {
    up_->check();
    down_->check();
  }
  void close(std::chrono::milliseconds timeout) override {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    up_->close(timeout);
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    down_->close(std::max(left, std::chrono::milliseconds(0)));
  }
  void abort() override {
    up_->abort();
    down_->abort();
  }

 private:
  // The group carrying this rank's writes to `peer` (writes to itself: either, `up`).
  PeerGroup& to(int peer) const { return peer >= up_->rank() ? *up_ : *down_; }

  std::unique_ptr<PeerGroup> up_, down_;
};

}  // namespace

std::unique_ptr<PeerGroup> connect_one_way_pairs(Transport& transport, const GroupSpec& spec) {
  std::unique_ptr<PeerGroup> up = transport.connect(spec);
  GroupSpec down_spec = spec;
  // Distinct from spec.comm_id and, like it, unique among the job's groups in practice.
  down_spec.comm_id = (spec.comm_id ^ 0x646f776e77617264ull) * 0x9E3779B97F4A7C15ull + 1;
  down_spec.direction = 1;
  std::unique_ptr<PeerGroup> down;
  try {
    down = transport.connect(down_spec);
  } catch (...) {
    up->abort();
    throw;
  }
  return std::make_unique<OneWayPairsGroup>(std::move(up), std::move(down));
}

}  // namespace fusedcomm::rdma
