// gemm_rs_geometry_test: gemmReduceScatter's launch geometry as gemm_rs.h reports it
// (FusedLaunchInfo), for a device described by its SM count alone. Host code only: runs
// everywhere (CI included). What every launch relies on:
// - the tile width and flag count depend only on values every rank shares (M, N, the world, the
//   SM count), never on the rank, K_r or the partials' precision, which may differ by rank (its
//   flags are per half-tile and tile column: ranks with different tile grids would wait on
//   flags never raised);
// - its grid is every SM (at most one CTA per tile), and its flags fit FusedFlags wherever the
//   fused kernel is chosen;
// - kAuto's choice uses rank-uniform inputs only (the same for any K_r).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include <cuda_runtime.h>

#include "kernels/collectives/collectives.h"
#include "kernels/common/tests/geometry_test_support.h"
#include "kernels/gemm_rs/gemm_rs.h"
#include "support/check.h"

namespace {

namespace k = fusedcomm::kernels;

using fusedcomm::testing::check;
using fusedcomm::testing::geometry_device;

k::GemmRsArgs rs_args(int M, int N, int K_r, bool bf16) {
  k::GemmRsArgs a;
  a.M = M;
  a.N = N;
  a.K = K_r;
  a.algo = k::FusedAlgo::kFused;
  a.partials = bf16 ? k::RsPartials::kBF16 : k::RsPartials::kF32;
  return a;
}

std::string shape(int W, int sms, int M, int N, int K_r, bool bf16) {
  return "W=" + std::to_string(W) + " sms=" + std::to_string(sms) + " M=" + std::to_string(M) +
         " N=" + std::to_string(N) + " K_r=" + std::to_string(K_r) + (bf16 ? " bf16" : " f32");
}

int ceil_div(int a, int b) { return (a + b - 1) / b; }

void test_rs() {
  const int sms_list[] = {132, 114, 78};
  const int Ms[] = {3, 1001, 1024, 4096, 8192, 16384};
  const int Ns[] = {64, 4096, 8192, 16384};
  const int Ks[] = {64, 1024, 3584, 7168, 14336};
  for (int sms : sms_list)
    for (int W = 1; W <= 8; ++W)
      for (int M : Ms)
        for (int N : Ns) {
          const k::FusedLaunchInfo ref =
              k::gemm_reduce_scatter_info(geometry_device(W, 0, sms), rs_args(M, N, Ks[0], false));
          for (int rank = 0; rank < W; ++rank)
            for (int K_r : Ks)
              for (bool bf16 : {false, true}) {
                const std::string what = shape(W, sms, M, N, K_r, bf16) + " rank " + std::to_string(rank);
                const k::FusedLaunchInfo info =
                    k::gemm_reduce_scatter_info(geometry_device(W, rank, sms), rs_args(M, N, K_r, bf16));
                check(info.algo == k::FusedAlgo::kFused, what + ": fused as asked");
                check(info.tile_n == ref.tile_n && info.chunks == ref.chunks,
                      what + ": tile width and flags do not depend on the rank, K_r or the partials");
                const int tiles = ceil_div(M, 128) * ceil_div(N, info.tile_n);
                check(info.comm_ctas == 0 && info.gemm_ctas == std::min(sms, tiles),
                      what + ": every CTA runs the GEMM, one per SM and at most one per tile (" +
                          std::to_string(info.gemm_ctas) + ")");
                // (W-1) slots x half-tile rows of a slot (ceil(ceil(M/W) / 64) + 1) x columns.
                const int halves = ceil_div(ceil_div(M, W), 64) + 1;
                check(info.chunks == (W - 1) * halves * ceil_div(N, info.tile_n) &&
                          info.chunks <= k::kFusedRsTileFlags,
                      what + ": half-tile flags " + std::to_string(info.chunks) + " fit");
                // The pusher's pacing (gemm_rs.cu, rs_push_pace_ns; gemm_rs/tuning.h): bf16 partials at W >= 2 from
                // three waves of tiles, a quarter of the next tile's estimated main loop
                // (tile_n * K_r / 24 ns) over the tile_n / 16 pieces of 2 KiB of a half-tile.
                const bool paced = W >= 2 && bf16 && tiles >= 3 * sms;
                const uint32_t pace = paced ? static_cast<uint32_t>(double(info.tile_n) * K_r / 24.0 * 25 /
                                                                    100.0 / (info.tile_n / 16))
                                            : 0u;
                check(info.push_pace_ns == pace, what + ": pusher pace " + std::to_string(info.push_pace_ns) +
                                                     " ns, expected " + std::to_string(pace));
              }
        }
  // kAuto (fused_choice.h, choose_gemm_reduce_scatter): fused at W = 2-4 from M*N = 2^24 with at least 1024 rows per
  // owner (M / W), any partial precision, else decomposed; the same choice whatever K_r (which
  // may differ by rank).
  auto auto_algo = [](int W, int M, int N, int K_r, bool bf16) {
    k::GemmRsArgs a = rs_args(M, N, K_r, bf16);
    a.algo = k::FusedAlgo::kAuto;
    return k::gemm_reduce_scatter_info(geometry_device(W, 0, 132), a).algo;
  };
  for (int K_r : {64, 7168, 14336}) {
    const std::string kr = " K_r=" + std::to_string(K_r);
    check(auto_algo(2, 4096, 4096, K_r, false) == k::FusedAlgo::kFused,
          "kAuto W=2 4096x4096 f32: fused" + kr);
    check(auto_algo(2, 2048, 4096, K_r, false) == k::FusedAlgo::kDecomposed,
          "kAuto W=2 2048x4096 f32: decomposed" + kr);
    check(auto_algo(2, 2048, 8192, K_r, true) == k::FusedAlgo::kFused,
          "kAuto W=2 2048x8192 bf16 partials: fused" + kr);
    check(auto_algo(2, 1024, 8192, K_r, true) == k::FusedAlgo::kDecomposed,
          "kAuto W=2 1024x8192 bf16 partials: decomposed" + kr);
    check(auto_algo(2, 16384, 4096, K_r, true) == k::FusedAlgo::kFused,
          "kAuto W=2 16384x4096 bf16 partials: fused" + kr);
    // W = 3-4: the W = 2 threshold (measured at W = 4 too) and the rows per owner (70B M = 2048
    // at W = 4 was slower fused); W >= 5: decomposed.
    for (int W : {3, 4}) {
      const std::string w = " W=" + std::to_string(W);
      check(auto_algo(W, 8192, 8192, K_r, false) == k::FusedAlgo::kFused,
            "kAuto 8192x8192 f32: fused" + w + kr);
      check(auto_algo(W, 4096, 4096, K_r, true) == k::FusedAlgo::kFused,
            "kAuto 4096x4096 bf16 partials: fused" + w + kr);
      check(auto_algo(W, 2048, 8192, K_r, true) == k::FusedAlgo::kDecomposed,
            "kAuto 2048x8192 bf16 partials (under 1024 rows per owner): decomposed" + w + kr);
      check(auto_algo(W, 1024, 8192, K_r, true) == k::FusedAlgo::kDecomposed,
            "kAuto 1024x8192 bf16 partials: decomposed" + w + kr);
    }
    check(auto_algo(3, 3072, 8192, K_r, true) == k::FusedAlgo::kFused,
          "kAuto W=3 3072x8192 bf16 partials (1024 rows per owner): fused" + kr);
    check(auto_algo(4, 4092, 8192, K_r, true) == k::FusedAlgo::kDecomposed,
          "kAuto W=4 4092x8192 bf16 partials (1023 rows per owner): decomposed" + kr);
    check(auto_algo(5, 8192, 8192, K_r, false) == k::FusedAlgo::kDecomposed, "kAuto W=5: decomposed" + kr);
    check(auto_algo(8, 16384, 8192, K_r, false) == k::FusedAlgo::kDecomposed, "kAuto W=8: decomposed" + kr);
    check(auto_algo(1, 8192, 8192, K_r, false) == k::FusedAlgo::kDecomposed, "kAuto W=1: decomposed" + kr);
    // Half-tile flags beyond FusedFlags (W = 2: 1 slot x 1025 half-tile rows x 512 columns):
    check(auto_algo(2, 131072, 131072, K_r, false) == k::FusedAlgo::kDecomposed,
          "kAuto W=2 131072x131072: decomposed (its half-tile flags would not fit)" + kr);
  }
}
}  // namespace

int main() {
  test_rs();
  return fusedcomm::testing::report("gemm_rs_geometry_test");
}
