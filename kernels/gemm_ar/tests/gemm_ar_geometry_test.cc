// gemm_ar_geometry_test: gemmAllReduce's kAuto as gemm_ar.h reports it (FusedLaunchInfo), for
// a device described by its SM count and data area alone. Host code only: runs everywhere (CI
// included). The choice uses rank-uniform inputs only (the same for any K_r).
#include <cstdint>
#include <cstdio>
#include <string>

#include "kernels/common/tests/geometry_test_support.h"
#include "kernels/gemm_ar/gemm_ar.h"
#include "support/check.h"

namespace {

namespace k = fusedcomm::kernels;

using fusedcomm::testing::check;
using fusedcomm::testing::geometry_device;

// gemmAllReduce's kAuto: the fused path only where W divides M, gemmReduceScatter's kAuto
// takes its fused kernel, and the fused path's workspace fits the data area; at W = 2, or at
// W = 4 with bf16 partials and M*N >= 2^25.
void test_ar() {
  auto algo = [](int W, int M, int N, int K_r, bool bf16, uint64_t data_bytes) {
    k::CommDevice d = geometry_device(W, 0, 132);
    d.data_bytes = data_bytes;
    k::GemmArArgs a;
    a.M = M;
    a.N = N;
    a.K = K_r;
    a.partials = bf16 ? k::RsPartials::kBF16 : k::RsPartials::kF32;
    return k::gemm_all_reduce_info(d, a).algo;
  };
  const uint64_t big = uint64_t{1} << 31;
  for (int K_r : {1024, 7168}) {
    const std::string kr = " (K_r=" + std::to_string(K_r) + ")";
    check(algo(2, 8192, 8192, K_r, false, big) == k::FusedAlgo::kFused,
          "gemmAllReduce kAuto W=2 8192x8192: fused" + kr);
    check(algo(2, 8192, 8192, K_r, true, big) == k::FusedAlgo::kFused,
          "gemmAllReduce kAuto W=2 8192x8192 bf16 partials: fused" + kr);
    check(algo(2, 8191, 8192, K_r, false, big) == k::FusedAlgo::kDecomposed,
          "gemmAllReduce kAuto W=2, W does not divide M: decomposed" + kr);
    check(algo(2, 1024, 4096, K_r, false, big) == k::FusedAlgo::kDecomposed,
          "gemmAllReduce kAuto W=2 1024x4096 (small): decomposed" + kr);
    check(algo(4, 8192, 8192, K_r, false, big) == k::FusedAlgo::kDecomposed,
          "gemmAllReduce kAuto W=4 fp32 partials: decomposed" + kr);
    check(algo(4, 8192, 4096, K_r, true, big) == k::FusedAlgo::kFused,
          "gemmAllReduce kAuto W=4 bf16 partials M*N = 2^25: fused" + kr);
    check(algo(4, 4096, 4096, K_r, true, big) == k::FusedAlgo::kDecomposed,
          "gemmAllReduce kAuto W=4 bf16 partials M*N = 2^24: decomposed" + kr);
    check(algo(3, 8190, 8192, K_r, true, big) == k::FusedAlgo::kDecomposed,
          "gemmAllReduce kAuto W=3: decomposed" + kr);
    check(algo(1, 8192, 8192, K_r, false, big) == k::FusedAlgo::kDecomposed,
          "gemmAllReduce kAuto W=1: decomposed (the GEMM alone)" + kr);
    check(algo(2, 8192, 8192, K_r, false, 64ull << 20) == k::FusedAlgo::kDecomposed,
          "gemmAllReduce kAuto W=2 8192x8192 with a 64 MiB data area: decomposed" + kr);
  }
}
}  // namespace

int main() {
  test_ar();
  return fusedcomm::testing::report("gemm_ar_geometry_test");
}
