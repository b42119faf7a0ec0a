// launch_signature_test: the launch signatures of collectives.h (how a rank tells that a
// peer launched a different op, size, dtype or algorithm at the same epoch) and the message the
// host gives for a mismatch record. Host code only: runs everywhere (CI included). The device
// side (publication, checks, the error record) is exercised by gpu_collectives_test and
// gpu_fused_test ("launch mismatch" sections).
#include <cstdint>
#include <cstdio>
#include <string>

#include "fusedcomm/runtime/symmetric_memory.h"
#include "kernels/collectives/collectives.h"
#include "kernels/common/fused.h"
#include "kernels/gemm_rs/gemm_rs.h"
#include "support/check.h"

namespace {

namespace k = fusedcomm::kernels;

using fusedcomm::testing::check;
bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

uint32_t u(k::CommOp op) { return static_cast<uint32_t>(op); }
uint32_t u(k::CommDtype t) { return static_cast<uint32_t>(t); }
uint32_t u(k::CommAlgo a) { return static_cast<uint32_t>(a); }
uint32_t u(k::FusedAlgo a) { return static_cast<uint32_t>(a); }

void test_fields() {
  // Every field survives encoding, for every op code the kernels use and extreme sizes.
  const uint32_t ops[] = {u(k::CommOp::kAllGather), u(k::CommOp::kReduceScatter),
                          u(k::CommOp::kAllReduce), u(k::CommOp::kAllToAll),
                          k::kFusedOpAllGatherGemm, k::kFusedOpGemmReduceScatter};
  const uint64_t sizes[] = {0, 1, 4099, (uint64_t{1} << 40) + 12345, k::kSigSizeMask};
  for (uint32_t op : ops) {
    for (uint32_t dt : {u(k::CommDtype::kF32), u(k::CommDtype::kBF16)}) {
      for (uint32_t algo = 0; algo <= 4; ++algo) {
        for (uint64_t size : sizes) {
          const uint64_t body = k::comm_launch_signature(op, dt, algo, size);
          for (uint64_t epoch : {uint64_t{1}, uint64_t{2}, uint64_t{255}, uint64_t{256}, uint64_t{1} << 40}) {
            const uint64_t s = k::comm_signature_at(body, epoch);
            const bool ok = k::comm_sig_op(s) == op && k::comm_sig_dtype(s) == dt &&
                            k::comm_sig_algo(s) == algo && k::comm_sig_size(s) == size &&
                            k::comm_sig_epoch8(s) == (epoch & 0xFF) && (s & k::kSigBodyMask) == body;
            if (!ok) {
              check(false, "round trip op " + std::to_string(op) + " size " + std::to_string(size) +
                               " epoch " + std::to_string(epoch));
              return;
            }
          }
        }
      }
    }
  }
  check(true, "fields round-trip");
  // The launchers leave the epoch byte to the device: a body never has one.
  check((k::comm_launch_signature(31, 3, 7, ~uint64_t{0}) & ~k::kSigBodyMask) == 0,
        "a signature body has no epoch byte");
  // Launches e and e + 2 share a slot (CommFlags::launch[p][e & 1]); their epoch bytes differ,
  // so an older launch's entry never passes for this one's.
  const uint64_t b = k::comm_launch_signature(u(k::CommOp::kAllReduce), 1, 1, 1000);
  for (uint64_t e = 1; e < 1000; ++e) {
    if (k::comm_sig_epoch8(k::comm_signature_at(b, e)) ==
        k::comm_sig_epoch8(k::comm_signature_at(b, e + 2))) {
      check(false, "epoch bytes of launches e and e + 2 differ (e = " + std::to_string(e) + ")");
      return;
    }
  }
  check(true, "epoch bytes of e and e + 2 differ");
}

void test_distinct() {
  // What must agree across ranks changes the signature.
  const uint64_t base = k::comm_launch_signature(u(k::CommOp::kAllReduce), u(k::CommDtype::kBF16),
                                                 u(k::CommAlgo::kTwoPhase), 1 << 20);
  check(base != k::comm_launch_signature(u(k::CommOp::kAllGather), u(k::CommDtype::kBF16),
                                         u(k::CommAlgo::kTwoPhase), 1 << 20),
        "op");
  check(base != k::comm_launch_signature(u(k::CommOp::kAllReduce), u(k::CommDtype::kF32),
                                         u(k::CommAlgo::kTwoPhase), 1 << 20),
        "dtype");
  check(base != k::comm_launch_signature(u(k::CommOp::kAllReduce), u(k::CommDtype::kBF16),
                                         u(k::CommAlgo::kOneShot), 1 << 20),
        "algorithm");
  check(base != k::comm_launch_signature(u(k::CommOp::kAllReduce), u(k::CommDtype::kBF16),
                                         u(k::CommAlgo::kTwoPhase), (1 << 20) + 1),
        "count");
  // The fused ops' size hash separates the shapes of gpu_fused_test's mismatch cases and
  // neighbours of typical shapes (M, K or N, offset).
  const uint64_t h = k::comm_sig_hash(2999, 1032, 0);
  check(h != k::comm_sig_hash(1001, 1032, 0), "hash: M");
  check(h != k::comm_sig_hash(2999, 1040, 0), "hash: K");
  check(h != k::comm_sig_hash(2999, 1032, 16), "hash: offset");
  check(h != k::comm_sig_hash(1032, 2999, 0), "hash: M and K swapped");
  check(h == k::comm_sig_hash(2999, 1032, 0), "hash: deterministic");
  check(h <= k::kSigSizeMask, "hash fits the size field");
  int collisions = 0;
  for (uint64_t m = 1; m <= 64; ++m) {
    for (uint64_t n = 8; n <= 512; n += 8) {
      collisions += k::comm_sig_hash(m * 128, n, 0) == k::comm_sig_hash(m * 128 + 1, n, 0);
    }
  }
  check(collisions == 0, "hash: no collisions between neighbouring M (" + std::to_string(collisions) + ")");
}

void test_messages() {
  const uint64_t mine =
      k::comm_signature_at(k::comm_launch_signature(u(k::CommOp::kAllReduce), u(k::CommDtype::kBF16),
                                                    u(k::CommAlgo::kOneShot), 4096),
                           17);
  const uint64_t theirs =
      k::comm_signature_at(k::comm_launch_signature(u(k::CommOp::kAllGather), u(k::CommDtype::kF32),
                                                    u(k::CommAlgo::kTwoPhase), 8192),
                           17);
  const std::string d = fusedcomm::describe_launch(mine);
  check(d == "allReduce (bf16, 4096 elements, one-shot)", "describe a collective: " + d);
  const std::string f = fusedcomm::describe_launch(
      k::comm_launch_signature(k::kFusedOpGemmReduceScatter, u(k::CommDtype::kBF16),
                               u(k::FusedAlgo::kDecomposed), k::comm_sig_hash(4100, 2056, 0)));
  check(contains(f, "gemmReduceScatter (bf16 partials, decomposed, sizes #"), "describe a fused op: " + f);
  // gemmReduceScatter's dtype field is the partials' code: fp32 in rank order and in any order
  // are different launches, and said so.
  const uint64_t any = k::comm_launch_signature(k::kFusedOpGemmReduceScatter,
                                                static_cast<uint32_t>(k::RsPartials::kF32AnyOrder),
                                                u(k::FusedAlgo::kFused), k::comm_sig_hash(4100, 2056, 0));
  const uint64_t ordered =
      k::comm_launch_signature(k::kFusedOpGemmReduceScatter, static_cast<uint32_t>(k::RsPartials::kF32),
                               u(k::FusedAlgo::kFused), k::comm_sig_hash(4100, 2056, 0));
  check(any != ordered, "any-order partials change the signature");
  const std::string fa = fusedcomm::describe_launch(any);
  check(contains(fa, "gemmReduceScatter (fp32 partials, any order, fused, sizes #"),
        "describe any-order partials: " + fa);
  check(contains(fusedcomm::describe_launch(ordered), "(fp32 partials, fused,"),
        "describe rank-order partials: " + fusedcomm::describe_launch(ordered));

  k::CommErrorRecord r{};
  r.code = k::kCommLaunchMismatch;
  r.rank = 0;
  r.peer = 1;
  r.op = u(k::CommOp::kAllReduce);
  r.step = k::kCommStepReady;
  r.epoch = 17;
  r.launch_sig = mine;
  r.observed = theirs;
  const std::string m = fusedcomm::launch_mismatch_message(r);
  check(contains(m, "launch mismatch at launch 17") &&
            contains(m, "rank 0 launched allReduce (bf16, 4096 elements, one-shot)") &&
            contains(m, "rank 1 launched allGather (fp32, 8192 elements, two-phase)") &&
            contains(m, "same ops in the same order with the same sizes"),
        "mismatch message: " + m);

  // Same fused op, other sizes: the hint names the sizes that must agree.
  r.op = k::kFusedOpAllGatherGemm;
  r.launch_sig =
      k::comm_signature_at(k::comm_launch_signature(k::kFusedOpAllGatherGemm, u(k::CommDtype::kBF16),
                                                    u(k::FusedAlgo::kFused), k::comm_sig_hash(2999, 1032, 0)),
                           3);
  r.observed =
      k::comm_signature_at(k::comm_launch_signature(k::kFusedOpAllGatherGemm, u(k::CommDtype::kBF16),
                                                    u(k::FusedAlgo::kFused), k::comm_sig_hash(1001, 1032, 0)),
                           3);
  const std::string mf = fusedcomm::launch_mismatch_message(r);
  check(contains(mf, "allGatherGemm (bf16, fused, sizes #") && contains(mf, "M and K"),
        "fused mismatch message: " + mf);
  std::printf("  e.g. %s\n", m.c_str());
}

}  // namespace

int main() {
  test_fields();
  test_distinct();
  test_messages();
  return fusedcomm::testing::report("launch_signature_test");
}
