// The collectives' algorithm selection (collectives.h, CommAlgo): kAuto's choice, and the sizes
// and plans the launcher (collectives.cu) builds its grid from. Host code; every choice is made
// from values every rank shares (op, dtype, count, world, the CommDevice's sizes), except
// in-placeness, which callers keep the same on every rank.
#include <algorithm>
#include <cstdint>

#include "kernels/collectives/collectives.h"
#include "kernels/collectives/detail/select.h"
#include "kernels/collectives/tuning.h"
#include "kernels/common/split.h"

namespace fusedcomm::kernels {

namespace detail {

bool in_place(const CommDevice& d, const CollectiveArgs& a) {
  return a.input == nullptr && a.output != nullptr &&
         static_cast<const uint8_t*>(a.output) == d.base[d.rank] + d.data_offset + a.in_offset;
}

int64_t elem_size(CommDtype t) { return t == CommDtype::kBF16 ? 2 : 4; }

int64_t one_shot_payload(const CollectiveArgs& a, int world) {
  const int64_t es = elem_size(a.dtype);
  if (a.op == CommOp::kAllReduce) return a.count * es;
  return split_count(a.count, world, 0) * es;  // the largest block (rank 0's)
}

int64_t two_phase_bytes(const CollectiveArgs& a, int world, int rank) {
  const int64_t es = elem_size(a.dtype);
  switch (a.op) {
    case CommOp::kAllGather:
    case CommOp::kAllToAll: return a.count * es;
    default: return split_count(a.count, world, rank) * es * world;
  }
}

int two_phase_pull_ctas(int world) {
  return world <= 2 ? tuning::kTwoPhasePullCtasW2 : tuning::kTwoPhasePullCtas;
}

int two_shot_ctas(const CommDevice& d, const CollectiveArgs& a) {
  if (a.num_ctas > 0) return std::min(a.num_ctas, kCommMaxPipeCtas);
  const int64_t slice = split_count(a.count, d.world, 0) * elem_size(a.dtype);
  return static_cast<int>(std::clamp<int64_t>(
      (slice + tuning::kTwoShotBytesPerCta - 1) / tuning::kTwoShotBytesPerCta, 1, tuning::kTwoShotMaxCtas));
}

bool pipe_plan(const CommDevice& d, const CollectiveArgs& a, CommAlgo algo, PipePlan* plan) {
  const int W = d.world;
  const int64_t es = elem_size(a.dtype), epv = kVecBytes / es;
  const bool direct = algo == CommAlgo::kDirect;
  const bool push = algo == CommAlgo::kTwoPhasePush || direct;
  int P = a.num_ctas > 0 ? a.num_ctas
          : direct       ? tuning::kDirectProducers
          : push         ? (W <= 2 ? tuning::kPushProducersW2 : tuning::kPushProducers)
                         : (W <= 2 ? tuning::kPipeProducersW2 : tuning::kPipeProducers);
  P = std::clamp(P, 1, kCommMaxPipeCtas);
  // The chunk: the target rounded to whole copy batches of the data warps (kPipeCopyUnroll
  // vectors per data thread: one NVLink round trip per chunk in pipe_copy), or to vectors for
  // small targets; spread over all producers when the longest slice / block n_0 has fewer
  // chunks than producers; grown if a producer would exceed kCommPipeMaxRounds rounds.
  const int64_t n0 = split_count(a.count, W, 0);
  const int64_t target =
      std::max<int64_t>(epv, (a.chunk_bytes > 0 ? a.chunk_bytes : tuning::kPipeChunkBytes) / es);
  const int64_t batch = int64_t{tuning::kCollectiveThreads - kCtl} * epv;  // a vector per thread
  const int64_t copy_batch = batch * tuning::kPipeCopyUnroll;
  auto round_up = [](int64_t x, int64_t g) { return (x + g - 1) / g * g; };
  int64_t chunk = target >= copy_batch
                      ? std::max(copy_batch, (target + copy_batch / 2) / copy_batch * copy_batch)
                      : round_up(target, epv);
  if (n0 < P * chunk) {
    const int64_t even = (n0 + P - 1) / P;
    chunk = std::max(epv, std::min(chunk, round_up(even, even >= batch ? batch : epv)));
  }
  if ((n0 + chunk - 1) / chunk > P * kCommPipeMaxRounds) {
    chunk = round_up((n0 + P * kCommPipeMaxRounds - 1) / (P * kCommPipeMaxRounds), epv);
  }
  plan->chunk = chunk;
  plan->producers = P;
  plan->consumers = direct ? std::max(1, P * tuning::kDirectReducersPct / 100)
                    : push ? std::max(1, (P + tuning::kPushCopyDiv - 1) / tuning::kPushCopyDiv)
                           : P;
  // A slot holds the longest block after up to 15 bytes of padding (its offset from the
  // 16-byte grid, pipe_kernel's slot_pad): one vector more than the block's vectors.
  plan->slot_stride = (n0 + epv - 1) / epv * epv + epv;
  if (push && W > 1) {
    const uint64_t need = direct ? static_cast<uint64_t>((W - 1) * plan->slot_stride * es)
                          : a.op == CommOp::kAllGather || a.op == CommOp::kAllReduce
                              ? static_cast<uint64_t>(a.count * es)
                          : a.op == CommOp::kReduceScatter || a.op == CommOp::kAllToAll
                              ? static_cast<uint64_t>((W - 1) * plan->slot_stride * es)
                              : 0;
    if (need > d.data_bytes) return false;
  }
  return true;
}

}  // namespace detail

using detail::split_count;

int64_t collective_output_count(CommOp op, int64_t count, int world, int rank) {
  switch (op) {
    case CommOp::kAllGather:
    case CommOp::kAllReduce: return count;
    case CommOp::kReduceScatter: return split_count(count, world, rank);
    case CommOp::kAllToAll: return world * split_count(count, world, rank);
  }
  return 0;
}

int64_t collective_input_count(CommOp op, int64_t count, int world, int rank) {
  return op == CommOp::kAllGather ? split_count(count, world, rank) : count;
}

CommAlgo collective_choose_algo(const CommDevice& dev, const CollectiveArgs& args) {
  if (args.algo != CommAlgo::kAuto) return args.algo;
  if (dev.world == 1) return CommAlgo::kOneShot;
  const int64_t bytes = args.count * detail::elem_size(args.dtype);
  // allReduce at W = 2, medium: two-shot (tuning.h), above the one-shot limit. In-placeness
  // is this rank's own fact, as for direct below.
  if (args.op == CommOp::kAllReduce && dev.world == 2 && bytes > tuning::kOneShotMaxAllReduceBytesW2 &&
      bytes <= (detail::in_place(dev, args) ? tuning::kAutoTwoShotMaxBytesW2
                                            : tuning::kAutoTwoShotMaxOutOfPlaceBytesW2)) {
    return CommAlgo::kTwoShot;
  }
  // allReduce in place, large: the direct variant (only stores cross NVLink), where measured
  // faster (tuning.h). In-placeness is this rank's own fact: callers do it on every rank or on
  // none (a rank that differs gets the launch-mismatch error, not a hang).
  const int64_t direct_min = dev.world <= 2 ? tuning::kAutoDirectMinBytesW2 : tuning::kAutoDirectMinBytes;
  if (args.op == CommOp::kAllReduce && direct_min > 0 && bytes >= direct_min && detail::in_place(dev, args)) {
    detail::PipePlan plan;
    if (detail::pipe_plan(dev, args, CommAlgo::kDirect, &plan)) return CommAlgo::kDirect;
  }
  // allReduce at W = 2, large: the push variant (tuning.h). Its scratch need (the whole tensor)
  // always fits: the input occupies as much of the data area.
  if (args.op == CommOp::kAllReduce && dev.world == 2 && bytes >= tuning::kAutoPushMinBytes) {
    return CommAlgo::kTwoPhasePush;
  }
  const int64_t payload = detail::one_shot_payload(args, dev.world);
  if (payload > static_cast<int64_t>(dev.slot_bytes)) return CommAlgo::kTwoPhase;
  // Crossovers (total message bytes; tuning.h).
  int64_t limit = 0;
  switch (args.op) {
    case CommOp::kAllReduce:
      limit = dev.world <= 2 ? tuning::kOneShotMaxAllReduceBytesW2 : tuning::kOneShotMaxAllReduceBytes;
      break;
    case CommOp::kAllGather:
    case CommOp::kReduceScatter:
    case CommOp::kAllToAll:
      limit = dev.world <= 2 ? tuning::kOneShotMaxBytesW2 : tuning::kOneShotMaxBytes;
      break;
  }
  return bytes <= limit ? CommAlgo::kOneShot : CommAlgo::kTwoPhase;
}

}  // namespace fusedcomm::kernels
