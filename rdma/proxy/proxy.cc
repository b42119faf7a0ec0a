// ProxyRing (host-side producer) and Proxy (the consumer thread). The protocol, and the
// ordering argument for every word, is in proxy.h; this file keeps to it.
#include "fusedcomm/rdma/proxy.h"

#include <stdexcept>

#include "../src/thread_name.h"

namespace fusedcomm::rdma {
namespace {

using Clock = std::chrono::steady_clock;

std::atomic_ref<uint64_t> word(uint64_t& w) { return std::atomic_ref<uint64_t>(w); }

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Spin briefly, then yield, then sleep (20 us, and 200 us once idle for long, through
// `sleep`): a waiting thread costs little CPU on a shared host but picks up a burst of
// commands within microseconds.
template <class Sleep>
void ladder(uint32_t& idle, Sleep&& sleep) {
  ++idle;
  if (idle < 256) {
    cpu_relax();
  } else if (idle < 512) {
    std::this_thread::yield();
  } else {
    sleep(std::chrono::microseconds(idle < 4096 ? 20 : 200));
  }
}

void backoff(uint32_t& idle) {
  ladder(idle, [](std::chrono::microseconds d) { std::this_thread::sleep_for(d); });
}

}  // namespace

size_t ProxyRing::bytes_for(uint32_t capacity) {
  return sizeof(RingHeader) + sizeof(ProxyCommand) * static_cast<size_t>(capacity);
}

ProxyRing::ProxyRing(void* memory, uint32_t capacity)
    : header_(static_cast<RingHeader*>(memory)),
      slots_(reinterpret_cast<ProxyCommand*>(static_cast<char*>(memory) + sizeof(RingHeader))),
      capacity_(capacity) {
  if (!memory) throw std::invalid_argument("ProxyRing: null memory");
  if (reinterpret_cast<uintptr_t>(memory) % alignof(ProxyCommand) != 0) {
    throw std::invalid_argument("ProxyRing: memory must be 128-byte aligned");
  }
  if (capacity == 0 || (capacity & (capacity - 1)) != 0) {
    throw std::invalid_argument("ProxyRing: capacity " + std::to_string(capacity) + " is not a power of two");
  }
}

uint64_t ProxyRing::post(const WriteOp& op, std::chrono::milliseconds timeout) {
  auto reserved = word(header_->reserved);
  auto consumed = word(header_->consumed);
  auto aborted = word(header_->abort);
  const auto deadline = Clock::now() + timeout;
  uint32_t idle = 0;
  uint64_t slot;
  while (true) {
    if (aborted.load(std::memory_order_acquire)) {
      throw TransportError(
          -1, "proxy ring was aborted; the write to rank " + std::to_string(op.peer) + " was not posted");
    }
    // consumed is read first: it never passes reserved, so slot - cons cannot wrap.
    const uint64_t cons = consumed.load(std::memory_order_acquire);
    slot = reserved.load(std::memory_order_acquire);
    if (slot - cons < capacity_) {
      if (reserved.compare_exchange_strong(slot, slot + 1, std::memory_order_acq_rel,
                                           std::memory_order_relaxed)) {
        break;
      }
      continue;
    }
    if (Clock::now() >= deadline) {
      throw TransportError(-1, "proxy ring stayed full for " + std::to_string(timeout.count()) + " ms (" +
                                   std::to_string(capacity_) +
                                   " commands outstanding; is the proxy running?)");
    }
    backoff(idle);
  }
  ProxyCommand& c = slots_[slot & (capacity_ - 1)];
  fill_command(c, op);
  // Publishes the fields above: the consumer's acquire load of seq sees them.
  word(c.seq).store(slot + 1, std::memory_order_release);
  return slot + 1;
}

void fill_command(ProxyCommand& c, const WriteOp& op) {
  c.op = static_cast<uint32_t>(ProxyOp::kWrite);
  c.peer = op.peer;
  c.src_key = op.src_key;
  c.src_offset = op.src_offset;
  c.dst_key = op.dst_key;
  c.dst_offset = op.dst_offset;
  c.bytes = op.bytes;
  c.signal_key = op.signal_key;
  c.signal_offset = op.signal_offset;
  c.signal_value = op.signal_value;
}

Proxy::Proxy(ProxyRing ring, PeerGroup& group, uint64_t* also_abort, std::chrono::microseconds busy_poll,
             bool signals_sole_writer)
    : ring_(ring), group_(group), also_abort_(also_abort), sole_writer_(signals_sole_writer), window_(busy_poll) {
  thread_ = std::thread([this] {
    name_this_thread("fc-proxy");
    run();
  });
}

void Proxy::expect_commands() noexcept {
  if (!window_.enabled()) return;
  window_.open();
  // sleeping_ is published before the sleeper's last look at the window, and read here after
  // the window was opened (both seq_cst): either the sleeper sees the window open and does not
  // sleep, or this sees it asleep and wakes it (under the lock, so the notify cannot fall
  // between its look and its wait).
  if (sleeping_.load(std::memory_order_seq_cst)) {
    std::lock_guard<std::mutex> l(sleep_mu_);
    sleep_cv_.notify_one();
  }
}

// backoff()'s ladder, but a sleep can be cut short by expect_commands(), and an open busy-poll
// window keeps the thread polling (and its ladder at the bottom). Polling yields: on a host
// with fewer free cores than polling threads, a thread that only paused would hold its core
// for a whole time slice while the one with work waits (milliseconds, measured on 2 cores).
void Proxy::idle(uint32_t& spins) {
  if (window_.is_open()) {
    std::this_thread::yield();
    spins = 0;
    return;
  }
  ladder(spins, [this](std::chrono::microseconds d) {
    std::unique_lock<std::mutex> l(sleep_mu_);
    sleeping_.store(true, std::memory_order_seq_cst);
    if (!window_.is_open() && !stop_.load(std::memory_order_acquire)) sleep_cv_.wait_for(l, d);
    sleeping_.store(false, std::memory_order_relaxed);
  });
}

Proxy::~Proxy() { stop(false, std::chrono::milliseconds(0)); }

std::string Proxy::error() const {
  std::lock_guard<std::mutex> l(error_mu_);
  return error_;
}

int Proxy::failed_peer() const { return failed_peer_.load(std::memory_order_acquire); }

void Proxy::fail(int peer, const std::string& msg) {
  {
    std::lock_guard<std::mutex> l(error_mu_);
    if (!error_.empty()) return;
    error_ = msg;
    failed_peer_.store(peer, std::memory_order_release);
  }
  // Producers waiting for space (and GPU waits that poll the abort word) give up now.
  word(ring_.header()->abort).store(1, std::memory_order_release);
  if (also_abort_ != nullptr) word(*also_abort_).store(1, std::memory_order_release);
}

void Proxy::run() {
  RingHeader* h = ring_.header();
  const uint64_t mask = ring_.capacity() - 1;
  uint64_t slot = word(h->consumed).load(std::memory_order_acquire);
  uint32_t spins = 0;
  while (!stop_.load(std::memory_order_acquire)) {
    if (word(h->abort).load(std::memory_order_acquire)) break;
    ProxyCommand& c = ring_.slots()[slot & mask];
    if (word(c.seq).load(std::memory_order_acquire) != slot + 1) {
      idle(spins);
      continue;
    }
    spins = 0;
    window_.open();  // the next command of this op is likely close behind
    const uint32_t opcode = c.op;
    WriteOp op;
    op.peer = c.peer;
    op.src_key = c.src_key;
    op.src_offset = c.src_offset;
    op.dst_key = c.dst_key;
    op.dst_offset = c.dst_offset;
    op.bytes = c.bytes;
    op.signal_key = c.signal_key;
    op.signal_offset = c.signal_offset;
    op.signal_value = c.signal_value;
    op.signal_sole_writer = sole_writer_;
    // The command is copied out: the slot may be refilled from here on.
    word(h->consumed).store(slot + 1, std::memory_order_release);
    const std::string where = " (proxy command " + std::to_string(slot + 1) + ")";
    if (opcode != static_cast<uint32_t>(ProxyOp::kWrite)) {
      fail(-1, "proxy: unknown op " + std::to_string(opcode) + where);
      break;
    }
    try {
      group_.write(op);
    } catch (const TransportError& e) {
      // A peer that closed the group politely has finished its protocol (the communicator's
      // finish barrier): nothing it needs is still to come from us, only credits it will never
      // read. Such writes are dropped; any other failure stops the proxy.
      if (group_.status(op.peer) != PeerState::kClosed) {
        fail(e.peer(), e.what() + where);
        break;
      }
    } catch (const std::exception& e) {
      fail(-1, std::string("proxy: invalid write: ") + e.what() + where);
      break;
    }
    // write() returned: the payload is in the transport's hands (socket: copied to the kernel).
    word(h->completed).store(slot + 1, std::memory_order_release);
    ++slot;
  }
}

void Proxy::stop(bool drain, std::chrono::milliseconds timeout) {
  if (!thread_.joinable()) return;
  RingHeader* h = ring_.header();
  if (drain) {
    const auto deadline = Clock::now() + timeout;
    uint32_t idle = 0;
    while (true) {
      const uint64_t done = word(h->completed).load(std::memory_order_acquire);
      const uint64_t reserved = word(h->reserved).load(std::memory_order_acquire);
      if (done >= reserved || failed_peer_.load() != -2 || word(h->abort).load(std::memory_order_acquire)) {
        break;
      }
      if (Clock::now() >= deadline) {
        fail(-1, "proxy: stop gave up draining after " + std::to_string(timeout.count()) + " ms with " +
                     std::to_string(reserved - done) + " command(s) not handed to the transport");
        break;
      }
      backoff(idle);
    }
  } else {
    word(h->abort).store(1, std::memory_order_release);
  }
  stop_.store(true, std::memory_order_release);
  {
    std::lock_guard<std::mutex> l(sleep_mu_);
    sleep_cv_.notify_all();
  }
  thread_.join();
}

}  // namespace fusedcomm::rdma
