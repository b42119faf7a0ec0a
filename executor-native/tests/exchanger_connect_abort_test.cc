// exchanger_connect_abort_test: TransportExchanger::abort() from another thread at random
// moments of connect(): before it starts, while the transport waits for a peer that never comes
// (as the lowest rank, which only listens, and as a higher rank, which dials), and while two real
// ranks connect to each other. abort() must be safe at any moment (no crash, no use of a group
// being built or freed) and must reach the connect wait: the aborted connect ends at once with
// an Error naming the abort, far below the connect timeout. Afterwards the runtimes' transports
// hold no connections and fresh communicators connect. Host code only: runs everywhere.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "fusedcomm/rdma/transport.h"
#include "fusedcomm/runtime/errors.h"
#include "fusedcomm/runtime/runtime.h"
#include "fusedcomm/runtime/transport_exchanger.h"
#include "support/check.h"
#include "support/fake_peer.h"

namespace {

using namespace fusedcomm;
using Clock = std::chrono::steady_clock;
using fusedcomm::testing::check;
using fusedcomm::testing::test_shares;
using std::chrono::milliseconds;

constexpr uint64_t kToken = 0xab07'0c0d'e000'0002ull;
constexpr int64_t kConnectTimeoutMs = 20000;
// An aborted connect must end within this of the abort (the transport polls the flag every
// 50 ms; the rest is thread scheduling on a loaded machine).
constexpr int64_t kAbortReachMs = 1500;
uint64_t g_comm_id = 9000;
std::mt19937 g_rng(53);

RuntimeConfig config() {
  RuntimeConfig c;
  c.backend = Backend::kHost;
  c.bind_host = "127.0.0.1";
  c.transport = TransportChoice::kSocket;  // the socket backend's wire, which these peers speak
  c.chunk_bytes = 4096;
  c.timeout_ms = 5000;
  c.connect_timeout_ms = kConnectTimeoutMs;
  c.transport_streams = 1;
  c.busy_poll_us = 0;
  c.job_token = kToken;
  return c;
}

int64_t ms_since(Clock::time_point t) {
  return std::chrono::duration_cast<milliseconds>(Clock::now() - t).count();
}

struct Outcome {
  bool connected = false;
  bool aborted_error = false;  // an Error(kCommunicator) saying the connect was aborted
  std::string message;
  int64_t ended_ms = 0;  // since the start of the case
};

// Connects `ex` as `rank`, recording how it ended.
void connect_into(TransportExchanger& ex, const std::vector<std::string>& endpoints, int rank, uint64_t id,
                  Clock::time_point start, Outcome* o) {
  try {
    ex.connect(endpoints, rank, id, test_shares(endpoints.size()));
    o->connected = true;
  } catch (const Error& e) {
    o->message = e.what();
    o->aborted_error =
        e.kind() == ErrorKind::kCommunicator && o->message.find("aborted") != std::string::npos;
  } catch (const std::exception& e) { o->message = std::string("not an Error: ") + e.what(); }
  o->ended_ms = ms_since(start);
}

// A peer that never connects: the fake peer's listener is real, its group is never built.
void absent_peer(Runtime& rt, rdma::Transport& fake_transport, int rank, int rounds) {
  int64_t worst = 0;
  for (int i = 0; i < rounds; ++i) {
    TransportExchanger ex(rt, 2);
    testing::FakePeer never(fake_transport, 4096);
    std::vector<std::string> endpoints(2);
    endpoints[rank] = ex.endpoint();
    endpoints[1 - rank] = never.endpoint();
    const int delay_ms = std::uniform_int_distribution<int>(0, 60)(g_rng);
    const auto start = Clock::now();
    Outcome o;
    std::thread connecting([&] { connect_into(ex, endpoints, rank, ++g_comm_id, start, &o); });
    std::this_thread::sleep_for(milliseconds(delay_ms));
    const int64_t aborted_at = ms_since(start);
    ex.abort();
    ex.abort();  // idempotent
    connecting.join();
    worst = std::max(worst, o.ended_ms - aborted_at);
    const std::string what =
        "rank " + std::to_string(rank) + ", abort after " + std::to_string(delay_ms) + " ms";
    check(!o.connected && o.aborted_error, what + ": " + (o.connected ? "connected" : o.message));
    check(o.ended_ms - aborted_at < kAbortReachMs,
          what + ": connect ended " + std::to_string(o.ended_ms - aborted_at) + " ms after the abort");
    ex.close();
  }
  std::printf("absent peer, rank %d: %d aborted connects, the slowest ended %lld ms after its abort\n", rank,
              rounds, static_cast<long long>(worst));
}

void abort_before_connect(Runtime& rt, rdma::Transport& fake_transport) {
  TransportExchanger ex(rt, 2);
  testing::FakePeer never(fake_transport, 4096);
  ex.abort();
  Outcome o;
  connect_into(ex, {ex.endpoint(), never.endpoint()}, 0, ++g_comm_id, Clock::now(), &o);
  check(!o.connected && o.aborted_error && o.ended_ms < 100, "abort before connect: " + o.message);
  std::printf("abort before connect: %s\n", o.message.c_str());
  ex.close();
}

// Two real ranks connect; one is aborted at a random moment (before, during or after its
// connect). The other then ends by itself when the aborted rank had got far enough (it sees the
// rank leave), else it is aborted too, as Spark kills every task of a failed barrier stage.
void two_ranks(Runtime& rt0, Runtime& rt1, int rounds) {
  int aborted_connected = 0, aborted_stopped = 0, other_stopped_alone = 0;
  for (int i = 0; i < rounds; ++i) {
    TransportExchanger ex0(rt0, 2), ex1(rt1, 2);
    TransportExchanger* ex[2] = {&ex0, &ex1};
    const std::vector<std::string> endpoints = {ex0.endpoint(), ex1.endpoint()};
    const uint64_t id = ++g_comm_id;
    const int victim = std::uniform_int_distribution<int>(0, 1)(g_rng);
    // The other rank starts late by up to 20 ms, so that aborts land before, inside and after
    // the victim's transport connect and its connect barrier.
    const int stagger_us = std::uniform_int_distribution<int>(0, 20000)(g_rng);
    const int delay_us = std::uniform_int_distribution<int>(0, 25000)(g_rng);
    const auto start = Clock::now();
    Outcome o[2];
    const auto run = [&](int r) {
      if (r != victim) std::this_thread::sleep_for(std::chrono::microseconds(stagger_us));
      connect_into(*ex[r], endpoints, r, id, start, &o[r]);
    };
    std::thread t0(run, 0), t1(run, 1);
    std::this_thread::sleep_for(std::chrono::microseconds(delay_us));
    const int64_t aborted_at = ms_since(start);
    ex[victim]->abort();
    (victim == 0 ? t0 : t1).join();
    const Outcome& v = o[victim];
    const std::string what = "two ranks, rank " + std::to_string(victim) + " aborted after " +
                             std::to_string(delay_us) + " us, the other started after " +
                             std::to_string(stagger_us) + " us";
    check(v.connected || v.aborted_error, what + ": " + v.message);
    check(v.ended_ms - aborted_at < kAbortReachMs,
          what + ": its connect ended " + std::to_string(v.ended_ms - aborted_at) + " ms after the abort");
    (v.connected ? aborted_connected : aborted_stopped)++;
    // The other rank: give it a moment to notice by itself, then stop it as Spark would.
    std::this_thread::sleep_for(milliseconds(100));
    const int other = 1 - victim;
    const int64_t other_aborted_at = ms_since(start);
    ex[other]->abort();
    (other == 0 ? t0 : t1).join();
    if (!o[other].connected && o[other].ended_ms < other_aborted_at) other_stopped_alone++;
    check(o[other].connected || o[other].ended_ms - other_aborted_at < kAbortReachMs,
          what + ": the other rank's connect ended " + std::to_string(o[other].ended_ms) + " ms in");
    for (TransportExchanger* e : ex) {
      try {
        e->close();
      } catch (const std::exception& e2) { check(false, what + ": close threw " + e2.what()); }
    }
  }
  std::printf(
      "two ranks: %d rounds; the aborted rank had connected in %d, stopped in %d; the other stopped "
      "by itself in %d\n",
      rounds, aborted_connected, aborted_stopped, other_stopped_alone);
}

// After all that, a fresh pair connects, runs its barrier and closes cleanly.
void fresh_pair(Runtime& rt0, Runtime& rt1) {
  TransportExchanger ex0(rt0, 2), ex1(rt1, 2);
  const std::vector<std::string> endpoints = {ex0.endpoint(), ex1.endpoint()};
  const uint64_t id = ++g_comm_id;
  Outcome o[2];
  const auto start = Clock::now();
  std::thread t0([&] {
    connect_into(ex0, endpoints, 0, id, start, &o[0]);
    if (o[0].connected) ex0.close();
  });
  std::thread t1([&] {
    connect_into(ex1, endpoints, 1, id, start, &o[1]);
    if (o[1].connected) ex1.close();
  });
  t0.join();
  t1.join();
  check(o[0].connected && o[1].connected, "a fresh pair connects: " + o[0].message + " / " + o[1].message);
}

bool no_connections(Runtime& rt0, Runtime& rt1) {
  for (int i = 0; i < 100; ++i) {
    if (rt0.transport().stats().open_connections == 0 && rt1.transport().stats().open_connections == 0)
      return true;
    std::this_thread::sleep_for(milliseconds(50));
  }
  return false;
}

}  // namespace

int main() {
  Runtime rt0(config()), rt1(config());
  rdma::SocketOptions o;
  o.bind_host = "127.0.0.1";
  auto fake_transport = rdma::make_socket_transport(o);
  const auto start = Clock::now();
  try {
    abort_before_connect(rt0, *fake_transport);
    absent_peer(rt0, *fake_transport, 0, 20);
    absent_peer(rt0, *fake_transport, 1, 20);
    two_ranks(rt0, rt1, 60);
    fresh_pair(rt0, rt1);
  } catch (const std::exception& e) { check(false, std::string("uncaught: ") + e.what()); }
  check(no_connections(rt0, rt1),
        "connections left open: " + std::to_string(rt0.transport().stats().open_connections) + " and " +
            std::to_string(rt1.transport().stats().open_connections));
  // 100 connects, none waiting for the 20 s connect timeout.
  const int64_t total = ms_since(start);
  check(total < kConnectTimeoutMs, "the cases took " + std::to_string(total) + " ms");
  return fusedcomm::testing::report("exchanger_connect_abort_test");
}
