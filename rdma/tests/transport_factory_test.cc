// The transport factory: make_transport builds the socket backend, which then works like one
// from make_socket_transport; the libfabric backend where its probe says it can run (and the
// probe's reason where not); every other kind unavailable with the probe's reason.
#include <signal.h>

#include <atomic>
#include <cstdio>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "fusedcomm/rdma/transport.h"
#include "test_util.h"

using namespace fusedcomm::rdma;
using namespace std::chrono_literals;

namespace {

std::unique_ptr<Transport> loopback() {
  TransportOptions o;
  o.socket.bind_host = "127.0.0.1";
  return make_transport(TransportKind::kSocket, o);
}

GroupSpec spec(int rank, const std::vector<std::string>& addrs) {
  GroupSpec s;
  s.comm_id = 0xFAC;
  s.key = auth::derive_comm_key(0x5EED, s.comm_id, {});
  s.rank = rank;
  s.world = 2;
  s.addresses = addrs;
  s.connect_timeout = 5000ms;
  return s;
}

void test_kind_names() {
  std::vector<std::string> names;
  for (TransportKind k : kTransportKinds) names.push_back(transport_kind_name(k));
  FC_CHECK((names == std::vector<std::string>{"socket", "ibverbs", "efa", "libfabric"}), "kind names");
}

void test_socket_through_the_factory() {
  auto t0 = loopback();
  auto t1 = loopback();
  FC_CHECK(std::string(t0->name()) == transport_kind_name(TransportKind::kSocket), "name");
  FC_CHECK(t0->api_version() == kTransportApiVersion, "api version");
  FC_CHECK(t0->address().rfind("127.0.0.1:", 0) == 0, "bound as the options say: " + t0->address());

  // One signalled write from rank 1 to rank 0: the factory's transport is a working one.
  uint64_t words[2] = {0, 0};
  uint64_t payload = 0x1234;
  Region dst = t0->register_memory(words, sizeof words);
  Region src = t1->register_memory(&payload, sizeof payload);
  const std::vector<std::string> addrs = {t0->address(), t1->address()};
  auto f = std::async(std::launch::async, [&] { return t1->connect(spec(1, addrs)); });
  auto g0 = t0->connect(spec(0, addrs));
  auto g1 = f.get();
  WriteOp w;
  w.peer = 0;
  w.src_key = src.key;
  w.dst_key = dst.key;
  w.bytes = 8;
  w.signal_key = dst.key;
  w.signal_offset = 8;
  w.signal_value = 1;
  g1->write(w);
  const bool arrived = fctest::wait_for(
      [&] { return std::atomic_ref<uint64_t>(words[1]).load(std::memory_order_acquire) == 1; }, 5000ms);
  FC_CHECK(arrived && words[0] == 0x1234, "write and signal arrived");
  auto closing = std::async(std::launch::async, [&] { g1->close(5000ms); });
  g0->close(5000ms);
  closing.get();
  FC_CHECK(t0->stats().open_connections == 0 && t1->stats().open_connections == 0, "closed");
}

void test_libfabric_through_the_factory() {
  const Availability a = probe(TransportKind::kLibfabric);
  std::printf("  libfabric: %s\n", a.reason.c_str());
  FC_CHECK(!a.reason.empty(), "a reason either way");
  if (!a.available) {
    FC_EXPECT_THROW(TransportError, make_transport(TransportKind::kLibfabric, TransportOptions{}), e, {
      const std::string what = e.what();
      FC_CHECK(what.rfind("libfabric transport is unavailable: ", 0) == 0, what);
      FC_CHECK(e.peer() == -1, "no peer at fault");
    });
    return;
  }
  // A library that is not there: refused with the reason, as on a host without libfabric.
  TransportOptions missing;
  missing.libfabric.library = "libfabric-not-installed.so.1";
  FC_EXPECT_THROW(TransportError, make_transport(TransportKind::kLibfabric, missing), e, {
    const std::string what = e.what();
    FC_CHECK(what.rfind("libfabric transport is unavailable: libfabric-not-installed.so.1 not found", 0) == 0,
             what);
  });
  const Availability m = probe_libfabric(LibfabricProvider::kTcp, "libfabric-not-installed.so.1");
  FC_CHECK(!m.available && m.reason.find("not found") != std::string::npos, m.reason);
}

// Loading libfabric loads provider libraries that install signal handlers of their own
// (libinfinipath); a JVM's SIGSEGV handler must survive the probe and a transport.
void on_signal(int) {}
void test_libfabric_keeps_signal_handlers() {
  const int signals[] = {SIGSEGV, SIGBUS, SIGILL, SIGINT, SIGTERM, SIGABRT};
  struct sigaction mine {};
  mine.sa_handler = on_signal;
  struct sigaction before[6];
  for (int i = 0; i < 6; ++i) {
    sigaction(signals[i], nullptr, &before[i]);
    sigaction(signals[i], &mine, nullptr);
  }
  const Availability a = probe(TransportKind::kLibfabric);
  if (a.available) {
    for (LibfabricProvider p : {LibfabricProvider::kTcp, LibfabricProvider::kShm}) {
      if (!probe_libfabric(p).available) continue;
      TransportOptions o;
      o.libfabric.provider = p;
      o.libfabric.bind_host = "127.0.0.1";
      auto t = make_transport(TransportKind::kLibfabric, o);
      FC_CHECK(!t->address().empty(), "a transport");
    }
  }
  for (int i = 0; i < 6; ++i) {
    struct sigaction now {};
    sigaction(signals[i], nullptr, &now);
    FC_CHECK(now.sa_handler == on_signal, "signal " + std::to_string(signals[i]) + " keeps its handler");
    sigaction(signals[i], &before[i], nullptr);
  }
}

void test_other_kinds_are_unavailable() {
  for (TransportKind k : kTransportKinds) {
    if (k == TransportKind::kSocket || k == TransportKind::kLibfabric) continue;
    const std::string name = transport_kind_name(k);
    const Availability a = probe(k);
    std::printf("  %s: %s\n", name.c_str(), a.reason.c_str());
    FC_CHECK(!a.available && !a.reason.empty(), name + " is unavailable with a reason");
    FC_EXPECT_THROW(TransportError, make_transport(k, TransportOptions{}), e, {
      const std::string what = e.what();
      FC_CHECK(what == name + " transport is unavailable: " + a.reason, what);
      FC_CHECK(e.peer() == -1, "no peer at fault");
    });
  }
  FC_CHECK(probe(TransportKind::kSocket).available, "socket available");
}

}  // namespace

int main() {
  // First: the library is loaded (and its providers' libraries with it) inside this case.
  fctest::run_case("libfabric leaves the process's signal handlers alone",
                   test_libfabric_keeps_signal_handlers);
  fctest::run_case("transport kinds and their names", test_kind_names);
  fctest::run_case("make_transport(kSocket) is a working socket transport", test_socket_through_the_factory);
  fctest::run_case("libfabric: made where the probe says it runs, refused with its reason",
                   test_libfabric_through_the_factory);
  fctest::run_case("other kinds: unavailable, with the probe's reason", test_other_kinds_are_unavailable);
  return fctest::finish();
}
