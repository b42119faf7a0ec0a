// exchanger_peer_input_test: a TransportExchanger (the host backend's transport + Exchanger)
// fed chunk headers and flags that no honest rank sends, by a peer the test plays over the real
// socket transport (support/fake_peer.h): wrapping offsets, oversize and wrapping lengths, a
// block size other than agreed, unterminated and non-UTF-8 op names, a chunk of another
// exchange, a bad magic, a data flag far ahead, credits for chunks never sent; and endpoints
// that do not parse. Each must fail the op with an Error of the right kind naming the peer (with
// a message that is valid UTF-8, as Java needs it), leave the communicator unusable, and never
// touch memory outside the receive block; honest chunks through the same fake peer arrive
// intact, so the fake speaks the protocol. Host code only: runs everywhere.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
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
using fusedcomm::testing::check;
using fusedcomm::testing::test_shares;
using fusedcomm::testing::FakePeer;
using Header = FakePeer::Header;

constexpr uint64_t kChunk = 4096;
constexpr uint64_t kToken = 0x7e57'0c0d'e000'0001ull;
constexpr uint64_t kFingerprint = 0x1234'5678'9abc'def0ull;
constexpr const char* kOp = "peer_input_test op";
constexpr const char* kStep = "peer_input_test step";
constexpr uint64_t kSeq = 2;  // the first op's exchange; the connect barrier was 1
uint64_t g_comm_id = 5000;

RuntimeConfig config() {
  RuntimeConfig c;
  c.backend = Backend::kHost;
  c.bind_host = "127.0.0.1";
  c.transport = TransportChoice::kSocket;  // the socket backend's wire, which these peers speak
  c.chunk_bytes = kChunk;
  c.timeout_ms = 3000;
  c.connect_timeout_ms = 10000;
  c.transport_streams = 1;
  c.busy_poll_us = 0;
  c.job_token = kToken;
  return c;
}

// Whether `s` is well-formed UTF-8 (what a Java exception message must be).
bool valid_utf8(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (len == 0 || i + len > s.size()) return false;
    for (size_t k = 1; k < len; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) & 0xc0) != 0x80) return false;
    }
    i += len;
  }
  return true;
}

// An exchanger (rank 0) connected to a fake peer (rank 1) under a fresh communicator id.
struct Pair {
  TransportExchanger ex;
  FakePeer peer;

  Pair(Runtime& rt, rdma::Transport& fake_transport) : ex(rt, 2), peer(fake_transport, kChunk) {
    const uint64_t id = ++g_comm_id;
    std::exception_ptr error;
    std::thread connecting([&] {
      try {
        ex.connect({ex.endpoint(), peer.endpoint()}, 0, id, test_shares(2));
      } catch (...) { error = std::current_exception(); }
    });
    try {
      peer.connect(ex.endpoint(), kToken, id);
    } catch (...) {
      ex.abort();
      connecting.join();
      throw;
    }
    connecting.join();
    if (error) std::rethrow_exception(error);
  }
  ~Pair() {
    peer.abort();
    ex.abort();
    try {
      ex.close();
    } catch (...) {}
  }
};

// One op on the exchanger: it sends `send_bytes` to the peer and receives `recv_bytes` from it
// into `out`, while `feed` (on another thread) makes the peer send what it sends. Returns what
// the op threw (null: it succeeded).
std::exception_ptr run_op(Pair& p, uint64_t send_bytes, uint64_t recv_bytes, std::vector<uint8_t>* out,
                          const std::function<void(FakePeer&)>& feed) {
  // Guard bands around the receive block: nothing may be written outside it.
  out->assign(recv_bytes + 128, 0xA5);
  std::vector<uint8_t> payload(send_bytes, 0x3C);
  std::vector<SendBlock> send(2);
  std::vector<RecvBlock> recv(2);
  send[1] = {payload.data(), send_bytes};
  recv[1] = {out->data() + 64, recv_bytes};
  p.ex.begin_op(kOp, kFingerprint);
  std::thread feeder([&] {
    try {
      feed(p.peer);
    } catch (const std::exception& e) {
      // A fake peer left waiting for credits the failed op never gives is expected.
      std::fprintf(stderr, "  (fake peer: %s)\n", e.what());
    }
  });
  std::exception_ptr error;
  try {
    p.ex.exchange(send, recv, kStep);
  } catch (...) { error = std::current_exception(); }
  p.peer.abort();  // ends a feeder still waiting for credits
  feeder.join();
  return error;
}

bool guard_bands_intact(const std::vector<uint8_t>& out) {
  for (size_t i = 0; i < 64; ++i) {
    if (out[i] != 0xA5 || out[out.size() - 1 - i] != 0xA5) return false;
  }
  return true;
}

// The op failed with an Error of `kind` whose message names the peer and contains `text`; the
// communicator is unusable afterwards.
void expect_failure(Pair& p, const std::exception_ptr& error, ErrorKind kind, const std::string& text,
                    const std::string& what) {
  std::string message = "no error";
  ErrorKind got = ErrorKind::kInvalidArgument;
  bool is_error = false;
  if (error) {
    try {
      std::rethrow_exception(error);
    } catch (const Error& e) {
      is_error = true;
      got = e.kind();
      message = e.what();
    } catch (const std::exception& e) { message = std::string("not an Error: ") + e.what(); }
  }
  std::printf("  %s: %s\n", what.c_str(), message.c_str());
  check(is_error && got == kind, what + ": kind " + std::to_string(static_cast<int>(got)) + ": " + message);
  check(message.find(text) != std::string::npos, what + ": message lacks '" + text + "': " + message);
  check(message.find("rank 1 at 127.0.0.1:") != std::string::npos,
        what + ": the peer is not named: " + message);
  check(valid_utf8(message), what + ": the message is not valid UTF-8");
  bool refused = false;
  try {
    p.ex.begin_op("after the failure", 1);
  } catch (const Error& e) {
    refused = e.kind() == ErrorKind::kCommunicator &&
              std::string(e.what()).find("unusable after an earlier error") != std::string::npos;
  }
  check(refused, what + ": the communicator is still usable after a peer's violation");
}

// Runs a case on a fresh pair: the peer sends what `feed` makes it send; the op must fail.
void violation(Runtime& rt, rdma::Transport& t, const std::string& what, uint64_t send_bytes,
               uint64_t recv_bytes, ErrorKind kind, const std::string& text,
               const std::function<void(FakePeer&)>& feed) {
  Pair p(rt, t);
  std::vector<uint8_t> out;
  const std::exception_ptr error = run_op(p, send_bytes, recv_bytes, &out, feed);
  expect_failure(p, error, kind, text, what);
  check(guard_bands_intact(out), what + ": bytes outside the receive block were written");
}

std::vector<uint8_t> pattern(uint64_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (uint64_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + i * 7);
  return v;
}

void honest_chunks(Runtime& rt, rdma::Transport& t) {
  for (const uint64_t n : {uint64_t{0}, uint64_t{100}, 2 * kChunk + 100}) {
    Pair p(rt, t);
    const std::vector<uint8_t> data = pattern(n, 11);
    std::vector<uint8_t> out;
    const std::exception_ptr error = run_op(p, 0, n, &out, [&](FakePeer& peer) {
      for (uint64_t off = 0; off < std::max<uint64_t>(n, 1); off += kChunk) {
        const uint64_t bytes = std::min(kChunk, n - off);
        peer.send(FakePeer::header(kSeq, kFingerprint, n, off, bytes, kOp, kStep), data.data() + off, bytes);
      }
    });
    check(!error, "honest block of " + std::to_string(n) + " bytes failed");
    check(std::equal(data.begin(), data.end(), out.begin() + 64) && guard_bands_intact(out),
          "honest block of " + std::to_string(n) + " bytes arrived intact");
  }
}

void lengths_and_offsets(Runtime& rt, rdma::Transport& t) {
  const std::vector<uint8_t> data = pattern(kChunk, 3);
  // offset + bytes wraps to a small number: a check written as `offset + bytes > size` passes.
  violation(rt, t, "wrapping offset", 0, 256, ErrorKind::kTransport, "chunk out of range",
            [&](FakePeer& peer) {
              peer.send(FakePeer::header(kSeq, kFingerprint, 256, UINT64_MAX - 63, 128, kOp, kStep),
                        data.data(), 128);
            });
  violation(rt, t, "offset inside the block, not the chunk's", 0, 256, ErrorKind::kTransport, "at offset 200",
            [&](FakePeer& peer) {
              peer.send(FakePeer::header(kSeq, kFingerprint, 256, 200, 56, kOp, kStep), data.data(), 56);
            });
  violation(rt, t, "length over a chunk", 0, 2 * kChunk, ErrorKind::kTransport, "chunk out of range",
            [&](FakePeer& peer) {
              peer.send(FakePeer::header(kSeq, kFingerprint, 2 * kChunk, 0, kChunk + 1, kOp, kStep),
                        data.data(), kChunk);
            });
  violation(
      rt, t, "wrapping length", 0, 256, ErrorKind::kTransport, "chunk out of range", [&](FakePeer& peer) {
        peer.send(FakePeer::header(kSeq, kFingerprint, 256, 1, UINT64_MAX, kOp, kStep), data.data(), 255);
      });
  violation(rt, t, "second chunk at the first one's offset", 0, 2 * kChunk, ErrorKind::kTransport,
            "chunk out of range", [&](FakePeer& peer) {
              peer.send(FakePeer::header(kSeq, kFingerprint, 2 * kChunk, 0, kChunk, kOp, kStep), data.data(),
                        kChunk);
              peer.send(FakePeer::header(kSeq, kFingerprint, 2 * kChunk, 0, kChunk, kOp, kStep), data.data(),
                        kChunk);
            });
  violation(rt, t, "block size other than agreed", 0, 256, ErrorKind::kCommunicator,
            "shapes inconsistent across ranks", [&](FakePeer& peer) {
              peer.send(FakePeer::header(kSeq, kFingerprint, UINT64_MAX, 0, 256, kOp, kStep), data.data(),
                        256);
            });
}

void names_and_headers(Runtime& rt, rdma::Transport& t) {
  violation(rt, t, "unterminated op description", 0, 64, ErrorKind::kTransport,
            "op description is not NUL-terminated within its 320-byte field", [&](FakePeer& peer) {
              Header h = FakePeer::header(kSeq, kFingerprint, 64, 0, 64, kOp, kStep);
              std::memset(h.op, 'x', sizeof h.op);
              peer.send(h, nullptr);
            });
  violation(rt, t, "unterminated step name", 0, 64, ErrorKind::kTransport,
            "step name is not NUL-terminated within its 128-byte field", [&](FakePeer& peer) {
              Header h = FakePeer::header(kSeq, kFingerprint, 64, 0, 64, kOp, kStep);
              std::memset(h.step, 'y', sizeof h.step);
              peer.send(h, nullptr);
            });
  // A different op whose name is not UTF-8: named, with the odd bytes escaped.
  violation(rt, t, "op description that is not UTF-8", 0, 64, ErrorKind::kCommunicator,
            "called evil\\xff\\xfe\\x01op \xc3\xa9", [&](FakePeer& peer) {
              peer.send(
                  FakePeer::header(kSeq, kFingerprint + 1, 64, 0, 64, "evil\xff\xfe\x01op \xc3\xa9", kStep),
                  nullptr);
            });
  violation(rt, t, "chunk of another exchange", 0, 64, ErrorKind::kCommunicator, "differ across ranks",
            [&](FakePeer& peer) {
              peer.send(FakePeer::header(kSeq + 5, kFingerprint, 64, 0, 64, kOp, kStep), nullptr);
            });
  violation(rt, t, "bad magic", 0, 64, ErrorKind::kTransport, "bad magic", [&](FakePeer& peer) {
    Header h = FakePeer::header(kSeq, kFingerprint, 64, 0, 64, kOp, kStep);
    h.magic = 0;
    peer.send(h, nullptr);
  });
}

void flags(Runtime& rt, rdma::Transport& t) {
  // The connect barrier delivered 1 chunk; a flag of 9 claims 8 more, 2 at most may be in flight.
  violation(rt, t, "data flag far ahead", 0, 64, ErrorKind::kTransport, "at most 2 may be in flight",
            [&](FakePeer& peer) { peer.signal_data(9); });
  // The exchanger sends 3 chunks and waits for a credit before the third: it sees the bogus one.
  violation(rt, t, "credit for chunks never sent", 2 * kChunk + 1, 0, ErrorKind::kTransport,
            "credited 1000 chunks but only", [&](FakePeer& peer) { peer.signal_credit(1000); });
}

void endpoints(Runtime& rt) {
  for (const std::string bad : {"127.0.0.1:1#12ab", "127.0.0.1:1#", "127.0.0.1:1", "#5",
                                "127.0.0.1:1#99999999999999999999999", "127.0.0.1:1#-3"}) {
    TransportExchanger ex(rt, 2);
    std::string message = "no error";
    bool refused = false;
    try {
      ex.connect({ex.endpoint(), bad}, 0, ++g_comm_id, test_shares(2));
    } catch (const Error& e) {
      message = e.what();
      refused = e.kind() == ErrorKind::kInvalidArgument &&
                message.find("endpoint of rank 1") != std::string::npos &&
                message.find("malformed") != std::string::npos;
    }
    check(refused, "endpoint '" + bad + "' refused: " + message);
    ex.close();
  }
}

}  // namespace

int main() {
  Runtime rt(config());
  rdma::SocketOptions o;
  o.bind_host = "127.0.0.1";
  auto fake_transport = rdma::make_socket_transport(o);
  const auto start = std::chrono::steady_clock::now();
  try {
    honest_chunks(rt, *fake_transport);
    lengths_and_offsets(rt, *fake_transport);
    names_and_headers(rt, *fake_transport);
    flags(rt, *fake_transport);
    endpoints(rt);
  } catch (const std::exception& e) { check(false, std::string("uncaught: ") + e.what()); }
  // Every violation is caught at the chunk that carries it, long before the op's timeout.
  const auto seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  check(seconds < 30, "the cases took " + std::to_string(seconds) + " s");
  return fusedcomm::testing::report("exchanger_peer_input_test");
}
