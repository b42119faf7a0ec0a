// 1000 connect / write / close cycles of a 2-rank group (two transports in this process) must
// leave the process's fd count and thread count where they were after warm-up, on the backend
// named by the first argument (backends.h).
#include <atomic>
#include <cstdlib>
#include <memory>
#include <thread>
#include <vector>

#include "fusedcomm/rdma/proxy.h"
#include "backends.h"
#include "fusedcomm/rdma/transport.h"
#include "test_util.h"

using namespace fusedcomm::rdma;
using namespace std::chrono_literals;

namespace {

fctest::TestBackend g_backend;

GroupSpec spec(int rank, const std::vector<std::string>& addrs, uint64_t comm) {
  GroupSpec s;
  s.comm_id = comm;
  s.key = auth::derive_comm_key(42, comm, {});
  s.rank = rank;
  s.world = 2;
  s.addresses = addrs;
  s.connect_timeout = 10000ms;
  return s;
}

uint64_t load(const uint64_t& w) {
  return std::atomic_ref<uint64_t>(const_cast<uint64_t&>(w)).load(std::memory_order_acquire);
}

// A cycle's write to `peer`: 8 payload bytes from offset 0 of `src` to offset 16 of the peer's
// `dst`, then the peer's signal word at offset 8 of `dst` raised to `comm`.
WriteOp cycle_write(int peer, const Region& src, const Region& dst, uint64_t comm) {
  WriteOp op;
  op.peer = peer;
  op.src_key = src.key;
  op.src_offset = 0;
  op.dst_key = dst.key;
  op.dst_offset = 16;
  op.bytes = 8;
  op.signal_key = dst.key;
  op.signal_offset = 8;
  op.signal_value = comm;
  return op;
}

// Waits for this rank's signal word (m[1]) to reach `comm`; a check failure if it does not.
void expect_signal(int rank, const std::vector<uint64_t>& m, uint64_t comm) {
  if (!fctest::wait_for([&] { return load(m[1]) >= comm; }, 10000ms)) {
    FC_CHECK(false, "rank " + std::to_string(rank) + ": no signal in cycle " + std::to_string(comm));
  }
}

// One cycle: both ranks connect, exchange a payload with a signal each way, and close.
// Rank 0 writes from a region it registers for the cycle and deregisters after it (registered
// memory must not pile up). Every 50th cycle rank 0 sends through a ring and a Proxy (one more
// thread to clean up), every 7th cycle rank 1 aborts instead of closing.
void cycle(Transport& t0, Transport& t1, uint64_t comm, std::vector<uint64_t>& m0, std::vector<uint64_t>& m1,
           const Region& r0, const Region& r1) {
  const std::vector<std::string> addrs = {t0.address(), t1.address()};
  const bool use_proxy = comm % 50 == 0;
  const bool abort1 = comm % 7 == 0;
  // Rank 1 aborts only once rank 0's write has completed at rank 0 too: a signal can land at rank
  // 1 before rank 0's own completion of that write, and an abort in between fails it by design.
  std::atomic<bool> rank0_written{false};
  std::thread peer([&] {
    try {
      auto g = t1.connect(spec(1, addrs, comm));
      m1[0] = comm * 3;
      g->write(cycle_write(0, r1, r0, comm));
      expect_signal(1, m1, comm);
      if (abort1) {
        FC_CHECK(fctest::wait_for([&] { return rank0_written.load(); }, 10000ms),
                 "rank 1: rank 0 never finished its write, cycle " + std::to_string(comm));
        g->abort();
      } else {
        g->close(5000ms);
      }
    } catch (const std::exception& e) { FC_CHECK(false, std::string("rank 1: ") + e.what()); }
  });
  std::vector<uint64_t> scratch(512, 0);
  scratch[0] = comm * 5;
  const Region rs = t0.register_memory(scratch.data(), scratch.size() * sizeof scratch[0]);
  try {
    auto g = t0.connect(spec(0, addrs, comm));
    const WriteOp op = cycle_write(1, rs, r1, comm);
    if (use_proxy) {
      void* mem = std::aligned_alloc(4096, 4096);
      std::memset(mem, 0, 4096);
      {
        ProxyRing ring(mem, 16);
        Proxy proxy(ring, *g);
        ring.post(op, 5000ms);
        proxy.stop(true, 5000ms);
        FC_CHECK(proxy.error().empty(), proxy.error());
      }
      std::free(mem);
    } else {
      g->write(op);
    }
    expect_signal(0, m0, comm);
    rank0_written = true;
    FC_CHECK(m0[2] == comm * 3, "payload before signal, cycle " + std::to_string(comm));
    g->close(abort1 ? 2000ms : 5000ms);
  } catch (const std::exception& e) { FC_CHECK(false, std::string("rank 0: ") + e.what()); }
  peer.join();
  t0.deregister_memory(rs);
  FC_CHECK(m1[2] == comm * 5, "rank 1 payload, cycle " + std::to_string(comm));
}

void test_no_leaks() {
  auto t0 = g_backend.make();
  auto t1 = g_backend.make();
  std::vector<uint64_t> m0(8, 0), m1(8, 0);
  Region r0 = t0->register_memory(m0.data(), 64);
  Region r1 = t1->register_memory(m1.data(), 64);
  uint64_t comm = 1;
  for (; comm <= 20; ++comm) cycle(*t0, *t1, comm, m0, m1, r0, r1);
  const int fds0 = fctest::open_fds(), threads0 = fctest::live_threads();
  const auto start = std::chrono::steady_clock::now();
  const int failures_before = fctest::g_check_failures.load();
  for (int i = 0; i < 1000 && fctest::g_check_failures.load() == failures_before; ++i, ++comm) {
    cycle(*t0, *t1, comm, m0, m1, r0, r1);
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const int fds1 = fctest::open_fds(), threads1 = fctest::live_threads();
  std::printf("  1000 cycles in %.2f s; fds %d -> %d, threads %d -> %d\n", s, fds0, fds1, threads0, threads1);
  FC_CHECK(fds0 > 0 && fds1 == fds0,
           "fd count flat: " + std::to_string(fds0) + " -> " + std::to_string(fds1));
  FC_CHECK(threads1 == threads0,
           "thread count flat: " + std::to_string(threads0) + " -> " + std::to_string(threads1));
  FC_CHECK(t0->stats().open_connections == 0 && t1->stats().open_connections == 0, "no open connections");
  FC_CHECK(t0->stats().registered_regions == 1 && t0->stats().registered_bytes == 64,
           "registered memory flat: " + std::to_string(t0->stats().registered_regions) + " regions, " +
               std::to_string(t0->stats().registered_bytes) + " bytes");
  t0->deregister_memory(r0);
  t1->deregister_memory(r1);
  FC_CHECK(t0->stats().registered_regions == 0, "regions gone");
}

void test_transport_lifetime() {
  // Transports themselves: create and destroy; their thread and fds go with them.
  const int fds0 = fctest::open_fds(), threads0 = fctest::live_threads();
  for (int i = 0; i < 100; ++i) {
    auto t = g_backend.make();
    FC_CHECK(!t->address().empty(), "address");
  }
  FC_CHECK(fctest::open_fds() == fds0, "fds back to " + std::to_string(fds0));
  FC_CHECK(fctest::live_threads() == threads0, "threads back to " + std::to_string(threads0));
}

}  // namespace

int main(int argc, char** argv) {
  g_backend = fctest::backend_from_args(argc, argv);
  fctest::run_case("1000 connect/close cycles leave fds and threads flat", test_no_leaks);
  fctest::run_case("transport create/destroy leaves fds and threads flat", test_transport_lifetime);
  return fctest::finish();
}
