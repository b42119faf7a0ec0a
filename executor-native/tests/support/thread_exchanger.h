// An in-process Exchanger for tests: W threads of one process play the W ranks. Every exchange
// is two barriers over a shared mailbox:
//   1. each rank posts its send/recv block lists and step name, then waits for all ranks;
//   2. each rank checks the whole posted matrix (step names, pairwise sizes) and, if it agrees,
//      copies what every peer sends it into its own receive blocks;
//   3. a second barrier, so that no rank returns (and reuses its buffers) while a peer may
//      still read them.
// A mismatch is seen by every rank from the same mailbox, so all ranks throw
// Error(kCommunicator) together, naming the offending pair. Waits are bounded: a rank that does
// not arrive in time makes the waiters throw Error(kTimeout) naming the missing ranks, and
// abort() (called by run_ranks when a rank's body throws) wakes every waiter with
// Error(kCommunicator) instead of letting it hang.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "fusedcomm/runtime/errors.h"
#include "fusedcomm/runtime/exchange.h"

namespace fusedcomm::testing {

class ThreadGroup {
 public:
  explicit ThreadGroup(int world, std::chrono::milliseconds timeout = std::chrono::seconds(30))
      : world_(world), timeout_(timeout), posted_(world), arrived_(world, false) {}

  int world() const { return world_; }

  // Fails every current and later exchange of the group.
  void abort() {
    std::lock_guard<std::mutex> lock(mu_);
    aborted_ = true;
    cv_.notify_all();
  }

  void exchange(int rank, const std::vector<SendBlock>& send, const std::vector<RecvBlock>& recv,
                const char* step) {
    if (static_cast<int>(send.size()) != world_ || static_cast<int>(recv.size()) != world_)
      fail(ErrorKind::kInvalidArgument, where(rank, step) + "expected " + std::to_string(world_) +
                                            " send and recv blocks, got " + std::to_string(send.size()) +
                                            " and " + std::to_string(recv.size()));
    {
      std::unique_lock<std::mutex> lock(mu_);
      posted_[rank] = {&send, &recv, step ? step : "?"};
      barrier(lock, rank, step);
    }
    // Between the two barriers every posted entry is stable and read-only.
    const std::string problem = check(rank);
    if (problem.empty()) {
      for (int p = 0; p < world_; ++p) {
        const SendBlock& from = (*posted_[p].send)[rank];
        if (from.bytes) std::memcpy(recv[p].data, from.data, from.bytes);
      }
    }
    {
      std::unique_lock<std::mutex> lock(mu_);
      barrier(lock, rank, step);
    }
    if (!problem.empty()) fail(ErrorKind::kCommunicator, where(rank, step) + problem);
  }

 private:
  struct Posted {
    const std::vector<SendBlock>* send = nullptr;
    const std::vector<RecvBlock>* recv = nullptr;
    std::string step;
  };

  static std::string where(int rank, const char* step) {
    return "rank " + std::to_string(rank) + ", exchange '" + (step ? step : "?") + "': ";
  }

  // Describes the first disagreement in the posted matrix, preferring one that involves `rank`;
  // empty when every rank agrees.
  std::string check(int rank) const {
    for (int p = 1; p < world_; ++p)
      if (posted_[p].step != posted_[0].step)
        return "ranks disagree on the step: rank 0 is in '" + posted_[0].step + "', rank " +
               std::to_string(p) + " in '" + posted_[p].step + "'";
    std::string other;
    for (int s = 0; s < world_; ++s) {
      for (int d = 0; d < world_; ++d) {
        const uint64_t sent = (*posted_[s].send)[d].bytes;
        const uint64_t expected = (*posted_[d].recv)[s].bytes;
        if (sent == expected) continue;
        const std::string msg = "size mismatch: rank " + std::to_string(s) + " sends " +
                                std::to_string(sent) + " bytes to rank " + std::to_string(d) +
                                ", which expects " + std::to_string(expected);
        if (s == rank || d == rank) return msg;
        if (other.empty()) other = "peer " + msg;
      }
    }
    return other;
  }

  void barrier(std::unique_lock<std::mutex>& lock, int rank, const char* step) {
    if (aborted_) fail(ErrorKind::kCommunicator, where(rank, step) + "aborted by a failed peer");
    const uint64_t generation = generation_;
    arrived_[rank] = true;
    if (++count_ == world_) {
      count_ = 0;
      std::fill(arrived_.begin(), arrived_.end(), false);
      ++generation_;
      cv_.notify_all();
      return;
    }
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    while (generation_ == generation) {
      if (aborted_) fail(ErrorKind::kCommunicator, where(rank, step) + "aborted by a failed peer");
      if (cv_.wait_until(lock, deadline) == std::cv_status::timeout && generation_ == generation) {
        std::string missing;
        for (int p = 0; p < world_; ++p)
          if (!arrived_[p]) missing += (missing.empty() ? "" : ", ") + std::to_string(p);
        aborted_ = true;
        cv_.notify_all();
        fail(ErrorKind::kTimeout, where(rank, step) + "timed out after " + std::to_string(timeout_.count()) +
                                      " ms waiting for rank(s) " + missing);
      }
    }
  }

  const int world_;
  const std::chrono::milliseconds timeout_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Posted> posted_;
  std::vector<bool> arrived_;
  int count_ = 0;
  uint64_t generation_ = 0;
  bool aborted_ = false;
};

// Rank `rank` of a ThreadGroup.
class ThreadExchanger final : public Exchanger {
 public:
  ThreadExchanger(ThreadGroup& group, int rank) : group_(group), rank_(rank) {}
  int rank() const override { return rank_; }
  int world() const override { return group_.world(); }
  void exchange(const std::vector<SendBlock>& send, const std::vector<RecvBlock>& recv,
                const char* step) override {
    group_.exchange(rank_, send, recv, step);
  }

 private:
  ThreadGroup& group_;
  int rank_;
};

// Runs body(exchanger) on `world` threads, one per rank; returns each rank's exception (null
// when it returned normally). A rank that throws aborts the group so the others do not hang.
inline std::vector<std::exception_ptr> run_ranks(
    int world, const std::function<void(Exchanger&)>& body,
    std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
  ThreadGroup group(world, timeout);
  std::vector<std::exception_ptr> errors(world);
  std::vector<std::thread> threads;
  threads.reserve(world);
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      ThreadExchanger ex(group, r);
      try {
        body(ex);
      } catch (...) {
        errors[r] = std::current_exception();
        group.abort();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

}  // namespace fusedcomm::testing
