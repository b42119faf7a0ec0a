// A busy-poll window: threads that wait for traffic (a proxy for its ring, the socket
// transport's receivers for their sockets) poll without sleeping while it is open.
//
// Why: a thread that has gone to sleep takes tens of microseconds to run again (a timer's
// slack, a wake-up from epoll), and an op between hosts passes through several such threads
// in turn: a small op launched after a quiet spell took ~220 us against ~40 us back to back,
// most of the difference in those wake-ups. Spinning forever would cost a core per thread for
// as long as the executor lives, so the window opens only when traffic is expected or seen:
//   - open() on a hint that traffic is coming (the runtime calls it as it enqueues an op
//     between hosts) and at every bit of traffic the thread handles, so it stays open through
//     an op and for `length` after its last traffic;
//   - a length of zero never opens (the threads' plain spin / yield / sleep ladder).
// It is a hint only: nothing waits on it for correctness, and a thread that misses it wakes on
// its own (the epoll event, the next sleep slice), only later.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace fusedcomm::rdma {

class BusyPollWindow {
 public:
  explicit BusyPollWindow(std::chrono::microseconds length)
      : length_ns_(std::chrono::duration_cast<std::chrono::nanoseconds>(length).count()) {}

  bool enabled() const noexcept { return length_ns_ > 0; }

  // Open until now + length (never shortens a later deadline from another thread by much: the
  // last writer wins, and every writer writes about now + length).
  void open() noexcept {
    if (length_ns_ > 0) until_ns_.store(now_ns() + length_ns_, std::memory_order_seq_cst);
  }
  // seq_cst with open(): a waiter that publishes "I am going to sleep" and then finds the
  // window shut, and an opener that stores the deadline and then reads that flag, cannot both
  // miss each other (the opener then wakes the sleeper).
  bool is_open() const noexcept {
    return length_ns_ > 0 && now_ns() < until_ns_.load(std::memory_order_seq_cst);
  }

 private:
  static int64_t now_ns() noexcept {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  const int64_t length_ns_;
  std::atomic<int64_t> until_ns_{0};
};

}  // namespace fusedcomm::rdma
