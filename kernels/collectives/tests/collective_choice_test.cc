// collective_choice_test: the collectives' kAuto (collective_choose_algo) for a device described
// by its world, rank, SM count and region sizes alone. Host code only: runs everywhere (CI
// included).
#include <cstdint>
#include <cstdio>
#include <string>

#include "kernels/collectives/collectives.h"
#include "kernels/common/tests/geometry_test_support.h"
#include "support/check.h"

namespace {

namespace k = fusedcomm::kernels;

using fusedcomm::testing::check;
using fusedcomm::testing::geometry_device;

// The collectives' kAuto: one-shot for small messages, two-phase for large ones, two-shot for a
// medium allReduce at W = 2, and the push allReduce at W = 2 from 256 MiB (collective_choose_algo).
void test_collective_choice() {
  auto algo = [](k::CommOp op, k::CommDtype dt, int W, int64_t bytes) {
    k::CommDevice d = geometry_device(W, 0, 132);
    d.slot_bytes = 1 << 20;
    d.data_bytes = uint64_t{2} << 30;
    k::CollectiveArgs a;
    a.op = op;
    a.dtype = dt;
    a.count = bytes / (dt == k::CommDtype::kBF16 ? 2 : 4);
    return k::collective_choose_algo(d, a);
  };
  const auto AR = k::CommOp::kAllReduce, AG = k::CommOp::kAllGather, RS = k::CommOp::kReduceScatter;
  const auto B = k::CommDtype::kBF16, F = k::CommDtype::kF32;
  const int64_t MiB = 1 << 20;
  check(algo(AR, B, 2, 4096) == k::CommAlgo::kOneShot, "allReduce W=2 4 KiB: one-shot");
  check(algo(AR, B, 2, 512 << 10) == k::CommAlgo::kOneShot, "allReduce W=2 512 KiB: one-shot");
  check(algo(AR, B, 2, (512 << 10) + 2) == k::CommAlgo::kTwoShot, "allReduce W=2 512 KiB + 2 B: two-shot");
  check(algo(AR, F, 2, 8 * MiB) == k::CommAlgo::kTwoShot, "allReduce W=2 8 MiB out of place: two-shot");
  check(algo(AR, B, 2, 8 * MiB + 2) == k::CommAlgo::kTwoPhase,
        "allReduce W=2 8 MiB + 2 B out of place: two-phase");
  check(algo(AR, B, 4, 1 * MiB) == k::CommAlgo::kTwoPhase,
        "allReduce W=4 1 MiB: two-phase (two-shot: W = 2)");
  check(algo(AR, B, 2, 64 * MiB) == k::CommAlgo::kTwoPhase, "allReduce W=2 64 MiB: two-phase");
  check(algo(AR, B, 2, 256 * MiB - 2) == k::CommAlgo::kTwoPhase, "allReduce W=2 256 MiB - 2 B: two-phase");
  check(algo(AR, B, 2, 256 * MiB) == k::CommAlgo::kTwoPhasePush, "allReduce W=2 256 MiB bf16: push");
  check(algo(AR, F, 2, 1024 * MiB) == k::CommAlgo::kTwoPhasePush, "allReduce W=2 1 GiB fp32: push");
  check(algo(AR, B, 4, 1024 * MiB) == k::CommAlgo::kTwoPhase, "allReduce W=4 1 GiB: two-phase");
  check(algo(AR, B, 1, 1024 * MiB) == k::CommAlgo::kOneShot, "allReduce W=1: one-shot (a copy)");
  check(algo(AG, B, 2, 1024 * MiB) == k::CommAlgo::kTwoPhase, "allGather W=2 1 GiB: two-phase");
  check(algo(RS, B, 2, 1024 * MiB) == k::CommAlgo::kTwoPhase, "reduceScatter W=2 1 GiB: two-phase");
  // In place (output = the input's place in the data area): direct from 6.5 MiB at W = 2 and
  // from 64 MiB at W = 4;
  // not out of place, not for other ops.
  auto in_place = [](k::CommOp op, int W, int64_t bytes, bool place) {
    k::CommDevice d = geometry_device(W, 1, 132);
    static uint8_t fake[1];  // addresses only: nothing is dereferenced
    for (int p = 0; p < W; ++p) d.base[p] = fake + p;
    d.slot_bytes = 1 << 20;
    d.data_offset = 4 << 20;
    d.data_bytes = uint64_t{2} << 30;
    k::CollectiveArgs a;
    a.op = op;
    a.count = bytes / 2;
    a.in_offset = 4096;
    a.output = place ? d.base[1] + d.data_offset + a.in_offset : d.base[1];
    return k::collective_choose_algo(d, a);
  };
  check(in_place(AR, 2, 64 * MiB, true) == k::CommAlgo::kDirect, "allReduce W=2 64 MiB in place: direct");
  check(in_place(AR, 2, 1024 * MiB, true) == k::CommAlgo::kDirect, "allReduce W=2 1 GiB in place: direct");
  check(in_place(AR, 2, 16 * MiB + 2, true) == k::CommAlgo::kDirect,
        "allReduce W=2 16 MiB + 2 B in place: direct");
  check(in_place(AR, 2, 16 * MiB, true) == k::CommAlgo::kTwoShot, "allReduce W=2 16 MiB in place: two-shot");
  check(in_place(AR, 2, 13 * MiB / 2, true) == k::CommAlgo::kTwoShot,
        "allReduce W=2 6.5 MiB in place: two-shot");
  check(in_place(AR, 2, 16 * MiB, false) == k::CommAlgo::kTwoPhase,
        "allReduce W=2 16 MiB out of place: two-phase");
  check(in_place(AR, 2, 1024 * MiB, false) == k::CommAlgo::kTwoPhasePush,
        "allReduce W=2 1 GiB out of place: push");
  check(in_place(AR, 4, 1024 * MiB, true) == k::CommAlgo::kDirect, "allReduce W=4 1 GiB in place: direct");
  check(in_place(AR, 4, 64 * MiB - 2, true) == k::CommAlgo::kTwoPhase,
        "allReduce W=4 64 MiB - 2 B in place: two-phase");
  check(in_place(AG, 2, 1024 * MiB, true) == k::CommAlgo::kTwoPhase,
        "allGather W=2 1 GiB 'in place': two-phase");
  k::CommDevice d = geometry_device(2, 0, 132);
  d.slot_bytes = 1 << 20;
  k::CollectiveArgs forced;
  forced.count = 512 * MiB;
  forced.algo = k::CommAlgo::kTwoPhase;
  check(k::collective_choose_algo(d, forced) == k::CommAlgo::kTwoPhase, "a forced algorithm is kept");
}

}  // namespace

int main() {
  test_collective_choice();
  return fusedcomm::testing::report("collective_choice_test");
}
