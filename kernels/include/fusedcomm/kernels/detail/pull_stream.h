// allGatherGemm's pulls as one continuous stream of bulk copies per pulling CTA (ag_pull_role,
// thread 0): the scheduling half, free of CUDA so that executor-native/tests/pull_stream_test.cc
// runs it on the CPU against a simulated engine that checks every ordering rule below.
//
// Why a stream: the slice copier it replaces (fused_protocol.cuh FusedBulkCopier) drained its
// pipeline at the end of every 128 KiB slice (loads, then every store waited complete, then the
// flag), so a pulling CTA kept its 128 KiB in flight only part of the time. Beside the GEMM a
// pulling CTA moved ~16 GB/s (bench/fused/NOTES.md "Run 16": 4 CTAs took 1.16 ms for W = 2 square
// 8192's 64 MiB), so the SM time the pulls cost (bytes / per-CTA rate) does not fall with fewer
// CTAs. Here the next pieces' loads are issued while earlier pieces are stored, across slice
// (item) boundaries, and an item is published a few pieces later, once its stores are complete.
//
// Engine contract (one thread calls everything, in this order of issue):
//   load(stage, src, bytes)   start copying `bytes` from src into stage `stage` (its own
//                             completion barrier)
//   wait_loaded(stage)        return once that stage's latest load has landed
//   store(stage, dst, bytes)  start storing the stage's first `bytes` to dst: one new store group
//   wait_read<N>()            return once every store group but the N most recent has finished
//                             reading its stage
//   wait_done<N>()            return once every store group but the N most recent is complete
//   publish(item)             the item's bytes are complete at their destinations (the caller's
//                             release follows)
// Rules this class keeps (the CPU test checks each one):
//   - a stage is loaded again only after the store of its previous piece has read it
//     (wait_read<1> with at most kStages - 1 loads in flight: that store is >= 2 groups old);
//   - a piece is stored only after its load landed (wait_loaded, oldest piece first);
//   - an item is published only after the store groups of all its pieces are complete, and
//     exactly once; flush() publishes every item added so far.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define FC_PULL_HD __host__ __device__ __forceinline__
#else
#define FC_PULL_HD inline
#endif

namespace fusedcomm::kernels::detail {

template <class Engine, int kStages, uint32_t kPiece>
class PullStream {
  static_assert(kStages >= 3, "a stage is reloaded two store groups after it was stored");

 public:
  // Items waiting for their stores (a full ring flushes first).
  static constexpr int kMaxPending = 16;
  // An item is published once its last store group is this many groups older than the newest:
  // the wait for it then rarely blocks, while the newer pieces' loads stay in flight.
  static constexpr int kDoneLag = 2;

  FC_PULL_HD explicit PullStream(Engine& engine) : e_(engine) {}

  // Copies `bytes` (a multiple of 16; both addresses 16-byte aligned for the device engine)
  // from src to dst, as part of the current item.
  FC_PULL_HD void add(uint8_t* dst, const uint8_t* src, int64_t bytes) {
    for (int64_t off = 0; off < bytes; off += kPiece) {
      const uint32_t n = static_cast<uint32_t>(bytes - off < int64_t{kPiece} ? bytes - off : kPiece);
      while (loaded_ - stored_ > kStages - 2) retire();
      const int st = static_cast<int>(loaded_ % kStages);
      // The stage's previous piece (loaded_ - kStages <= stored_ - 2) has been read by its store.
      if (loaded_ >= kStages) e_.template wait_read<1>();
      dst_[st] = dst + off;
      len_[st] = n;
      e_.load(st, src + off, n);
      ++loaded_;
    }
  }

  // Ends the current item: `item` is published once every piece added since the previous
  // end_item (none is fine) is complete at its destination.
  FC_PULL_HD void end_item(int item) {
    if (count_ == kMaxPending) flush();
    const int slot = (head_ + count_) % kMaxPending;
    item_[slot] = item;
    last_[slot] = loaded_ - 1;  // pieces [0, loaded_) hold every byte of this item
    ++count_;
    publish_ready(false);
  }

  // Stores every loaded piece, waits for all stores, publishes every pending item. Before the
  // caller blocks on something else (a peer's arrive flag) and at the end.
  FC_PULL_HD void flush() {
    while (stored_ < loaded_) retire();
    e_.template wait_done<0>();
    done_ = stored_;
    publish_ready(false);
  }

  FC_PULL_HD int64_t pieces() const { return loaded_; }

 private:
  // The oldest loaded piece goes to its destination.
  FC_PULL_HD void retire() {
    const int st = static_cast<int>(stored_ % kStages);
    e_.wait_loaded(st);
    e_.store(st, dst_[st], len_[st]);
    ++stored_;
    publish_ready(true);
  }

  // Publishes the pending items whose pieces are known complete (pieces [0, done_)); with
  // `may_wait`, first waits for the pieces older than the kDoneLag newest store groups if the
  // oldest pending item needs them.
  FC_PULL_HD void publish_ready(bool may_wait) {
    if (count_ == 0) return;
    if (last_[head_] >= done_ && may_wait && last_[head_] < stored_ - kDoneLag) {
      e_.template wait_done<kDoneLag>();
      done_ = stored_ - kDoneLag;
    }
    while (count_ > 0 && last_[head_] < done_) {
      e_.publish(item_[head_]);
      head_ = (head_ + 1) % kMaxPending;
      --count_;
    }
  }

  Engine& e_;
  int64_t loaded_ = 0;  // pieces whose load was issued
  int64_t stored_ = 0;  // pieces whose store was issued (one store group each, in order)
  int64_t done_ = 0;    // pieces whose store group is known complete
  uint8_t* dst_[kStages] = {};
  uint32_t len_[kStages] = {};
  int item_[kMaxPending] = {};
  int64_t last_[kMaxPending] = {};  // an item's last piece (-1: none)
  int head_ = 0, count_ = 0;
};

}  // namespace fusedcomm::kernels::detail
