// gemm_ar_geometry_test: gemmAllReduce's kAuto as gemm_ar.h reports it (FusedLaunchInfo), for
// a device described by its SM count and data area alone. Host code only: runs everywhere (CI
// included). The choice uses rank-uniform inputs only (the same for any K_r).
#include <cstdint>
#include <cstdio>
#include <string>

#include "kernels/common/fused_choice.h"
#include "kernels/common/tests/geometry_test_support.h"
#include "kernels/gemm_ar/gemm_ar.h"
#include "kernels/gemm_ar/tuning.h"
#include "support/check.h"

namespace {

namespace k = fusedcomm::kernels;

using fusedcomm::testing::check;
using fusedcomm::testing::geometry_device;

// gemmAllReduce's kAuto: the one-shot kernel at W = 2 up to kArOneShotMaxM rows where its
// workspace fits; otherwise the fused path only where W divides M, gemmReduceScatter's kAuto
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
    // The one-shot kernel: decode sizes at W = 2 (M <= kArOneShotMaxM), either partials, odd M
    // included; not above the bar, not at unmeasured worlds, not where its slots do not fit.
    for (int M : {1, 3, 8, 33, 64, 65, 127, 128}) {
      const std::string m = " M=" + std::to_string(M) + kr;
      check(algo(2, M, 8192, K_r, false, big) == k::FusedAlgo::kOneShot, "gemmAllReduce kAuto W=2 one-shot" + m);
      check(algo(2, M, 4096, K_r, true, big) == k::FusedAlgo::kOneShot,
            "gemmAllReduce kAuto W=2 one-shot, bf16 partials" + m);
      check(algo(4, M, 8192, K_r, true, big) == k::FusedAlgo::kDecomposed, "gemmAllReduce kAuto W=4: decomposed" + m);
      check(algo(1, M, 8192, K_r, true, big) == k::FusedAlgo::kDecomposed, "gemmAllReduce kAuto W=1: the GEMM" + m);
    }
    check(k::kArOneShotMaxM == 128, "the one-shot bar this test assumes");
    for (int M : {129, 256}) {
      check(algo(2, M, 8192, K_r, false, big) == k::FusedAlgo::kDecomposed,
            "gemmAllReduce kAuto W=2 M=" + std::to_string(M) + " (above the one-shot bar): decomposed" + kr);
    }
    // M = 64, N = 8192: 128 tiles of 64 x 64 fp32 partials = 2 MiB per rank's slot.
    check(algo(2, 64, 8192, K_r, false, 3ull << 20) == k::FusedAlgo::kDecomposed,
          "gemmAllReduce kAuto W=2 M=64 with a 3 MiB data area (the slots need 4 MiB): decomposed" + kr);
  }
}

// The one-shot kernel's geometry as reported (tile grid, K split, grid) and its workspace:
// W receive slots of every tile's BM x BN partials in the data area (mma.sync tiles of 16 or 32
// rows: BN the widest of 128, 64, 32 giving kArFillTiles tiles; wgmma tiles of 64 or 128 rows:
// BN = 128 where that alone gives kArFillTiles tiles, else 64), the split partials (sized for the largest split any rank may pick) in the scratch
// area.
void test_one_shot_geometry() {
  k::CommDevice d = geometry_device(2, 0, 132);
  d.data_bytes = uint64_t{1} << 30;
  auto info = [&](int M, int N, int K, bool bf16) {
    k::GemmArArgs a;
    a.M = M, a.N = N, a.K = K;
    a.partials = bf16 ? k::RsPartials::kBF16 : k::RsPartials::kF32;
    a.algo = k::FusedAlgo::kOneShot;
    return k::gemm_all_reduce_info(d, a);
  };
  check(k::tuning::kArFillTiles == 112, "the fill bar this test assumes");
  // M = 1, N = 4096: 128-wide tiles give 32, 64-wide 64, 32-wide 128 >= 112: one wave, no split.
  k::FusedLaunchInfo i = info(1, 4096, 2048, false);
  check(i.algo == k::FusedAlgo::kOneShot && i.chunks == 128 && i.k_splits == 1 && i.gemm_ctas == 128 &&
            i.tile_n == 32,
        "one-shot M=1 N=4096 K=2048: 128 tiles of 32 columns, no split");
  // N = 8192: 64-wide tiles already give 128.
  i = info(8, 8192, 4096, true);
  check(i.chunks == 128 && i.tile_n == 64 && i.k_splits == 1, "one-shot M=8 N=8192: 128 tiles of 64 columns");
  // N = 16384 at M = 32: 128-wide tiles give 128.
  i = info(32, 16384, 4096, true);
  check(i.chunks == 128 && i.tile_n == 128, "one-shot M=32 N=16384: 128 tiles of 128 columns");
  // Too few tiles even 32 wide (N = 1024: 32): split-K up to 132 / 32 = 4 ways, at least 512
  // of K each: K_r = 2048 -> 4 splits, 1032 -> 2, 512 -> none.
  i = info(1, 1024, 2048, false);
  check(i.chunks == 32 && i.tile_n == 32 && i.k_splits == 4 && i.gemm_ctas == 128, "one-shot M=1 N=1024 K=2048: 4 splits");
  i = info(1, 1024, 1032, false);
  check(i.k_splits == 2 && i.gemm_ctas == 64, "one-shot M=1 N=1024 K=1032: 2 splits");
  i = info(1, 1024, 512, false);
  check(i.k_splits == 1 && i.gemm_ctas == 32, "one-shot M=1 N=1024 K=512: no split");
  // wgmma tiles: M = 128, N = 8192: 64 tiles of 128 columns are too few, 128 of 64 columns, no
  // split; M = 64, N = 4096: 64 tiles of 64 columns, 2 ways; N = 16384: 128 tiles of 128.
  check(k::tuning::kArTileM64MaxM == 64, "the wgmma tile bar this test assumes");
  i = info(128, 8192, 4096, true);
  check(i.chunks == 128 && i.tile_n == 64 && i.k_splits == 1 && i.gemm_ctas == 128,
        "one-shot M=128 N=8192: 128 tiles of 64 columns, no split, 128 CTAs");
  i = info(64, 16384, 4096, true);
  check(i.chunks == 128 && i.tile_n == 128 && i.k_splits == 1, "one-shot M=64 N=16384: 128 tiles of 128 columns");
  i = info(64, 4096, 7168, true);
  check(i.chunks == 64 && i.tile_n == 64 && i.k_splits == 2 && i.gemm_ctas == 128,
        "one-shot M=64 N=4096: 64 tiles of 64 columns, 2 splits");
  i = info(33, 4096, 768, true);
  check(i.chunks == 64 && i.k_splits == 1 && i.gemm_ctas == 64, "one-shot M=33 N=4096 K=768: no split");
  // M = 8192 at N = 136: 64 x 2 tiles of 128 rows, no split.
  i = info(8192, 136, 264, true);
  check(i.chunks == 128 && i.k_splits == 1 && i.gemm_ctas == 128, "one-shot M=8192 N=136: 128 tiles, 128 CTAs");

  k::GemmArArgs a;
  a.M = 1, a.N = 4096, a.K = 2048, a.ws_offset = 4096;
  a.algo = k::FusedAlgo::kOneShot;
  k::FusedWorkspace ws = k::gemm_all_reduce_workspace(a, 2);
  // Slots: 128 tiles x 16 x 32 fp32 = 256 KiB each; splits: min(8, 256 / 128) = 2 x 256 KiB.
  check(ws.data_bytes == 4096 + 2 * (256u << 10) && ws.scratch_bytes == 2 * (256u << 10),
        "one-shot workspace M=1 N=4096 fp32: 2 slots of 256 KiB, 512 KiB of split partials");
  a.partials = k::RsPartials::kBF16;
  a.M = 128, a.N = 8192;
  ws = k::gemm_all_reduce_workspace(a, 2);
  // 128 tiles x 128 x 64 bf16 = 2 MiB per slot; splits up to 256 / 128 = 2: 2 x 128 tiles x
  // 128 x 64 fp32 = 8 MiB of split partials.
  check(ws.data_bytes == 4096 + 2 * (2u << 20) && ws.scratch_bytes == (8u << 20),
        "one-shot workspace M=128 N=8192 bf16: 2 slots of 2 MiB, 8 MiB of split partials");
  // kAuto sizes the larger of every path it may take (the one-shot one included at M <= 64).
  a.M = 64;
  a.algo = k::FusedAlgo::kOneShot;
  ws = k::gemm_all_reduce_workspace(a, 2);
  a.algo = k::FusedAlgo::kAuto;
  const k::FusedWorkspace any = k::gemm_all_reduce_workspace(a, 2);
  check(any.data_bytes >= ws.data_bytes && any.scratch_bytes >= ws.scratch_bytes,
        "kAuto's workspace covers the one-shot kernel's");
}
}  // namespace

int main() {
  test_ar();
  test_one_shot_geometry();
  return fusedcomm::testing::report("gemm_ar_geometry_test");
}
