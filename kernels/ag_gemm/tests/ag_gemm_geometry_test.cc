// ag_gemm_geometry_test: allGatherGemm's launch geometry as ag_gemm.h reports it
// (FusedLaunchInfo, the sweep, the copy-engine plan), for a device described by its SM count
// alone. Host code only: runs everywhere (CI included). What every launch relies on:
// - the SM split stays in range: 1 <= pulling CTAs <= SMs / 2, GEMM CTAs + pulling CTAs <= SMs
//   (a cooperative launch larger than the device would fail);
// - kAuto's choice uses rank-uniform inputs only (the same for any N_r);
// - the sweep, the pulls and the copy-engine streams agree on the chunks and their order.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include <cuda_runtime.h>

#include "fusedcomm/runtime/split.h"
#include "kernels/ag_gemm/ag_gemm.h"
#include "kernels/collectives/collectives.h"
#include "kernels/common/tests/geometry_test_support.h"
#include "support/check.h"

namespace {

namespace k = fusedcomm::kernels;
// The documented split rule (docs/ops.md): the rows each rank holds.
using fusedcomm::split_count;
using fusedcomm::split_offset;

using fusedcomm::testing::check;
using fusedcomm::testing::geometry_device;

void test_ag() {
  for (int sms : {132, 78})
    for (int W = 1; W <= 8; ++W)
      for (int M : {3, 1001, 2048, 8192})
        for (int N : {64, 2048, 14336})
          for (int K : {64, 4096}) {
            k::AgGemmArgs a;
            a.M = M;
            a.N = N;
            a.K = K;
            a.algo = k::FusedAlgo::kFused;
            const k::FusedLaunchInfo info = k::all_gather_gemm_info(geometry_device(W, 0, sms), a);
            const std::string what = "allGatherGemm W=" + std::to_string(W) + " sms=" + std::to_string(sms) +
                                     " M=" + std::to_string(M) + " N=" + std::to_string(N) +
                                     " K=" + std::to_string(K);
            check(info.comm_ctas >= 1 && info.comm_ctas <= std::max(1, sms / 2),
                  what + ": pulling CTAs within [1, SMs/2]");
            check(info.gemm_ctas >= 1 && info.gemm_ctas + info.comm_ctas <= sms,
                  what + ": GEMM CTAs + pulling CTAs fit the SMs");
          }
}

// allGatherGemm's kAuto (fused_choice.h, choose_all_gather_gemm): fused from a gathered A of 16 MiB at W = 2 and
// W = 4 (no row minimum); decomposed at every other world. Whatever N_r (which may differ by
// rank).
void test_ag_auto() {
  auto algo = [](int W, int M, int N_r, int K) {
    k::AgGemmArgs a;
    a.M = M;
    a.N = N_r;
    a.K = K;
    a.algo = k::FusedAlgo::kAuto;
    return k::all_gather_gemm_info(geometry_device(W, 0, 132), a).algo;
  };
  for (int N_r : {2048, 7168, 14336}) {
    const std::string n = " N_r=" + std::to_string(N_r);
    check(algo(2, 2048, N_r, 4096) == k::FusedAlgo::kFused,
          "allGatherGemm kAuto W=2 M=2048 K=4096: fused" + n);
    check(algo(2, 1024, N_r, 8192) == k::FusedAlgo::kFused,
          "allGatherGemm kAuto W=2 M=1024 K=8192: fused" + n);
    check(algo(2, 1024, N_r, 4096) == k::FusedAlgo::kDecomposed,
          "allGatherGemm kAuto W=2 8 MiB: decomposed" + n);
    check(algo(2, 4096, N_r, 1024) == k::FusedAlgo::kDecomposed,
          "allGatherGemm kAuto W=2 M=4096 K=1024: decomposed" + n);
    check(algo(4, 1024, N_r, 4096) == k::FusedAlgo::kDecomposed,
          "allGatherGemm kAuto W=4 M=1024 K=4096 (8 MiB): decomposed" + n);
    check(algo(4, 1024, N_r, 8192) == k::FusedAlgo::kFused,
          "allGatherGemm kAuto W=4 M=1024 K=8192: fused" + n);
    check(algo(4, 16384, N_r, 4096) == k::FusedAlgo::kFused, "allGatherGemm kAuto W=4 128 MiB: fused" + n);
    check(algo(4, 1024, N_r, 2048) == k::FusedAlgo::kDecomposed,
          "allGatherGemm kAuto W=4 4 MiB: decomposed" + n);
    check(algo(4, 512, N_r, 8192) == k::FusedAlgo::kDecomposed,
          "allGatherGemm kAuto W=4 M=512 K=8192 (8 MiB): decomposed" + n);
    check(algo(4, 512, N_r, 16384) == k::FusedAlgo::kFused,
          "allGatherGemm kAuto W=4 M=512 K=16384 (16 MiB): fused" + n);
    for (int W : {1, 3, 5, 8})
      check(algo(W, 16384, N_r, 16384) == k::FusedAlgo::kDecomposed,
            "allGatherGemm kAuto W=" + std::to_string(W) + ": decomposed" + n);
  }
}

// allGatherGemm's exchange (ag_gemm.h AgExchange): kAuto takes the copy engines at W = 2 up to N_r =
// 4096 or from 64 MiB of gathered A (M·K·2) when side streams are given, never without them or at
// other worlds; forced, they are taken at every W >= 2 (with streams) and SM pulls never move to
// them. With the copy engines one CTA raises the chunk flags (the others run the GEMM), and the
// sweep interleaves the peers by default (W >= 3, one M-block per chunk). No CUDA call: the streams
// are made at the first launch.
void test_ag_exchange() {
  k::FusedSideStreams side;
  for (int W = 1; W <= 8; ++W) {
    for (int N_r : {2048, 4096, 4104, 14336}) {
      for (int M : {2048, 4096, 16384}) {  // gathered A of 32, 64 and 256 MiB at K = 8192
        for (auto x : {k::AgExchange::kAuto, k::AgExchange::kSmPulls, k::AgExchange::kCopyEngines}) {
          for (bool with_side : {false, true}) {
            k::AgGemmArgs a;
            a.M = M;
            a.N = N_r;
            a.K = 8192;
            a.algo = k::FusedAlgo::kFused;
            a.exchange = x;
            a.side = with_side ? &side : nullptr;
            const bool large = int64_t{M} * a.K * 2 >= (int64_t{64} << 20);
            const bool ce = with_side && W >= 2 &&
                            (x == k::AgExchange::kCopyEngines ||
                             (x == k::AgExchange::kAuto && W == 2 && (N_r <= 4096 || large)));
            const std::string what = "allGatherGemm exchange W=" + std::to_string(W) +
                                     " M=" + std::to_string(M) + " N_r=" + std::to_string(N_r) +
                                     " exchange=" + std::to_string(static_cast<int>(x)) +
                                     (with_side ? " with" : " without") + " side streams";
            const k::FusedLaunchInfo info = k::all_gather_gemm_info(geometry_device(W, 0, 132), a);
            check(info.copy_engines == (ce ? 1 : 0), what + ": copy engines " + (ce ? "taken" : "not taken"));
            if (ce)
              check(info.comm_ctas == 1 && info.gemm_ctas == 131, what + ": one flag CTA, 131 GEMM CTAs");
            if (ce && W >= 3) {
              // Interleaved by default: the first peer chunk after the own ones is not peer r+1's
              // whole run (its second position holds another peer's block).
              const std::vector<int> order = k::all_gather_gemm_sweep(geometry_device(W, 0, 132), a);
              const int own = M / 128 / W;
              check(order.size() > static_cast<size_t>(own + 1) && order[own + 1] - order[own] != 1,
                    what + ": the peers' blocks in turn");
            }
          }
        }
      }
    }
  }
}

// allGatherGemm's own-row stores (fused.h FusedLaunchInfo::spread_stores): spread over the tiles
// of an own M-block only with the gathered A asked for, at W <= 2, from M·K·2 = 256 MiB.
void test_ag_spread_stores() {
  for (int W = 1; W <= 4; ++W) {
    for (int M : {8192, 16384}) {
      for (int K : {8192, 16384}) {
        for (bool gathered : {false, true}) {
          k::AgGemmArgs a;
          a.M = M;
          a.N = 8192;
          a.K = K;
          a.algo = k::FusedAlgo::kFused;
          a.exchange = k::AgExchange::kSmPulls;
          if (gathered) a.gathered = reinterpret_cast<__nv_bfloat16*>(uintptr_t{256});
          const bool spread = gathered && W <= 2 && int64_t{M} * K * 2 >= (int64_t{256} << 20);
          const k::FusedLaunchInfo info = k::all_gather_gemm_info(geometry_device(W, 0, 132), a);
          check(info.spread_stores == (spread ? 1 : 0),
                "allGatherGemm W=" + std::to_string(W) + " M=" + std::to_string(M) + " K=" +
                    std::to_string(K) + (gathered ? " gathered" : " not gathered") + ": own rows stored " +
                    (spread ? "by every tile" : "by the column-0 tile (or not at all)"));
        }
      }
    }
  }
}

// kAuto's fallback when the side streams cannot be made (ag_gemm.h FusedSideStreams::usable): a
// failed prepare turns kAuto to the SM pulls for that object's later launches, and the info says
// so; a forced kCopyEngines still asks for the streams. The one CUDA call here is prepare: on a
// machine without a GPU it fails (the fallback is checked), on a GPU host it makes the streams
// (the copy engines stay taken). Either way the outcome is printed.
void test_ag_exchange_fallback() {
  k::FusedSideStreams side;
  check(side.usable(), "allGatherGemm side streams: usable before any prepare");
  k::AgGemmArgs a;
  a.M = 16384;
  a.N = 4096;
  a.K = 8192;
  a.algo = k::FusedAlgo::kFused;
  a.side = &side;
  const k::CommDevice d = geometry_device(2, 0, 132);
  check(k::all_gather_gemm_info(d, a).copy_engines == 1,
        "allGatherGemm kAuto W=2 N_r=4096: copy engines before prepare");
  k::AgGemmArgs pulls = a;
  pulls.side = nullptr;
  const k::FusedLaunchInfo sm = k::all_gather_gemm_info(d, pulls);
  const cudaError_t e = side.prepare(2);
  cudaGetLastError();
  std::printf(
      "ag_gemm_geometry_test: FusedSideStreams::prepare(2) returned %s (%s)\n", cudaGetErrorName(e),
      e == cudaSuccess ? "a GPU: the copy engines stay taken" : "no streams: the fallback is checked");
  check(side.usable() == (e == cudaSuccess),
        "allGatherGemm side streams: usable exactly when prepare succeeded");
  const k::FusedLaunchInfo info = k::all_gather_gemm_info(d, a);
  if (e == cudaSuccess) {
    check(info.copy_engines == 1 && info.comm_ctas == 1,
          "allGatherGemm kAuto W=2: copy engines after a good prepare");
  } else {
    check(info.copy_engines == 0, "allGatherGemm kAuto W=2: SM pulls after a failed prepare");
    check(info.comm_ctas == sm.comm_ctas && info.gemm_ctas == sm.gemm_ctas && sm.comm_ctas > 1,
          "allGatherGemm kAuto W=2 after a failed prepare: the SM pulls' split, as without side streams");
    k::AgGemmArgs forced = a;
    forced.exchange = k::AgExchange::kCopyEngines;
    check(k::all_gather_gemm_info(d, forced).copy_engines == 1,
          "allGatherGemm forced copy engines: still taken after a failed prepare (the launch asks again)");
  }
}

// allGatherGemm's exchange on the copy engines (AgExchange::kCopyEngines; ag_gemm.h
// all_gather_gemm_ce_plan), one side stream per peer: together the streams copy every peer row
// exactly once and no row of this rank; a stream copies only its peer's rows, each copy within
// the merge size (or one chunk); its positions are distinct chunks, each holding rows of its
// peer, and every chunk with rows of that peer is one of them; its progress marks rise, and
// mark n comes only after copies holding its peer's rows of the chunks at positions <= n (the
// kernel's pulling CTA then raises a chunk's flag once every peer in it has marked it); the
// end mark, the position count + 1, comes last. The stream for this rank itself has no steps.
// The plans are checked with the sweep in either order (AgGemmArgs::interleave_peers), and
// each stream's positions must come in the sweep's order (all_gather_gemm_sweep).
void test_ag_ce_plan() {
  for (int W = 1; W <= 8; ++W)
    for (int r : {0, W / 2, W - 1})
      for (int M : {3, 1001, 2048, 8200})
        for (int K : {64, 4096})
          for (int64_t cap : {int64_t{1}, int64_t{2} << 20, int64_t{8} << 20, int64_t{1} << 40})
            for (int interleave : {0, 1}) {
              k::AgGemmArgs a;
              a.M = M;
              a.N = 2048;
              a.K = K;
              a.algo = k::FusedAlgo::kFused;
              a.interleave_peers = interleave;
              const std::string what = "allGatherGemm copy-engine plan W=" + std::to_string(W) +
                                       " r=" + std::to_string(r) + " M=" + std::to_string(M) +
                                       " K=" + std::to_string(K) + " cap=" + std::to_string(cap) +
                                       " interleave=" + std::to_string(interleave);
              // Sweep position of each chunk (a chunk is one M-block at these M).
              const std::vector<int> sweep = k::all_gather_gemm_sweep(geometry_device(W, r, 132), a);
              std::vector<int> at(sweep.size(), -1);
              for (size_t i = 0; i < sweep.size(); ++i) at[sweep[i]] = static_cast<int>(i);
              bool in_order = sweep.size() == static_cast<size_t>((M + 127) / 128);
              auto owner = [&](int64_t i) {
                int o = 0;
                while (o + 1 < W && i >= split_offset(M, W, o + 1)) ++o;
                return o;
              };
              std::vector<char> covered(M, 0);
              bool own_empty = k::all_gather_gemm_ce_plan(geometry_device(W, r, 132), a, r, cap).empty();
              bool in_range = true, once = true, sized = true, rising = true, ready = true;
              bool ends = true, distinct = true, holds = true, every = true;
              for (int from = 0; from < W; ++from) {
                if (from == r) continue;
                std::vector<std::pair<int64_t, int64_t>> rows;
                const std::vector<k::AgCeStep> steps =
                    k::all_gather_gemm_ce_plan(geometry_device(W, r, 132), a, from, cap, &rows);
                uint64_t mark = 0;
                bool ended = false, after_end = false;
                for (const k::AgCeStep& st : steps) {
                  after_end = after_end || ended;
                  if (st.peer >= 0) {
                    in_range = in_range && st.peer == from && st.row0 < st.row1 &&
                               st.row0 >= split_offset(M, W, from) &&
                               st.row1 <= split_offset(M, W, from) + split_count(M, W, from);
                    sized = sized && ((st.row1 - st.row0) * K * 2 <= cap || st.row1 - st.row0 <= 128);
                    for (int64_t i = std::max<int64_t>(0, st.row0); i < std::min<int64_t>(M, st.row1); ++i) {
                      once = once && !covered[i];
                      covered[i] = 1;
                    }
                    continue;
                  }
                  rising = rising && st.progress > mark;
                  if (st.progress == rows.size() + 1) {
                    ended = true;
                  } else {
                    for (uint64_t q = mark; q < std::min<uint64_t>(st.progress, rows.size()); ++q)
                      for (int64_t i = rows[q].first; i < rows[q].second; ++i)
                        ready = ready && (owner(i) != from || covered[i]);
                  }
                  mark = st.progress;
                }
                ends = ends && !steps.empty() && ended && !after_end;
                // Positions: distinct chunks, each with rows of `from`; together every such chunk.
                std::vector<std::pair<int64_t, int64_t>> sorted = rows;
                std::sort(sorted.begin(), sorted.end());
                distinct = distinct && std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end();
                for (size_t q = 0; in_order && q < rows.size(); ++q) {
                  const int c = static_cast<int>(rows[q].first / 128);
                  in_order =
                      c < static_cast<int>(at.size()) && (q == 0 || at[c] > at[rows[q - 1].first / 128]);
                }
                int64_t rows_of_from = 0;
                for (const auto& [r0, r1] : rows) {
                  bool has = false;
                  for (int64_t i = r0; i < r1; ++i) has = has || owner(i) == from;
                  holds = holds && has;
                  for (int64_t i = r0; i < r1; ++i) rows_of_from += owner(i) == from ? 1 : 0;
                }
                every = every && rows_of_from == split_count(M, W, from);
              }
              bool all = true;
              for (int64_t i = 0; i < M; ++i) all = all && (covered[i] != 0) == (owner(i) != r);
              check(own_empty, what + ": no stream for this rank's own rows");
              check(ends, what + ": each stream ends with its end mark");
              check(in_range, what + ": each stream copies only its peer's rows");
              check(once, what + ": no row copied twice");
              check(all, what + ": every peer row copied, no own row");
              check(sized, what + ": copies within the merge size or one chunk");
              check(rising, what + ": marks rise");
              check(ready, what + ": a mark only after its chunks' copies");
              check(distinct && holds, what + ": positions are distinct chunks with the peer's rows");
              check(every, what + ": every chunk with the peer's rows is a position");
              check(in_order, what + ": a stream's positions in the sweep's order");
            }
}

// allGatherGemm's sweep (all_gather_gemm_sweep; ag_gemm_kernel.cuh ag_sweep_chunk), which the GEMM,
// the pulls and the copy-engine streams share: every flag chunk once; this rank's own chunks
// (M-blocks made only of its rows) first (two blocks per chunk: from the chunk of the first);
// sequential: consecutive chunks from the first,
// wrapping around; interleaved (W >= 3, one M-block per chunk): where the peers' rows are whole
// blocks of equal count, position own + i holds a block of peer (r + 1 + i % (W - 1)) % W, each
// peer's blocks in rising order; at M > 128 * kFusedMaxChunks (two blocks per chunk) the order
// stays sequential.
void test_ag_sweep() {
  for (int W = 1; W <= 8; ++W)
    for (int r = 0; r < W; ++r)
      for (int M : {3, 1001, 2048, 8200, 3 * 4096, 16384, 128 * k::kFusedMaxChunks + 128 * 8})
        for (int interleave : {0, 1}) {
          k::AgGemmArgs a;
          a.M = M;
          a.N = 2048;
          a.K = 4096;
          a.algo = k::FusedAlgo::kFused;
          a.interleave_peers = interleave;
          const std::string what = "allGatherGemm sweep W=" + std::to_string(W) + " r=" + std::to_string(r) +
                                   " M=" + std::to_string(M) + " interleave=" + std::to_string(interleave);
          const std::vector<int> sweep = k::all_gather_gemm_sweep(geometry_device(W, r, 132), a);
          const int mb = (M + 127) / 128;
          const int mg = (mb + k::kFusedMaxChunks - 1) / k::kFusedMaxChunks;
          const int chunks = (mb + mg - 1) / mg;
          std::vector<int> seen(chunks, 0);
          bool perm = static_cast<int>(sweep.size()) == chunks;
          for (int c : sweep) perm = perm && c >= 0 && c < chunks && seen[c]++ == 0;
          check(perm, what + ": every chunk once");
          if (!perm) continue;
          const int64_t off = split_offset(M, W, r), cnt = split_offset(M, W, r + 1) - off;
          const int own_b0 = static_cast<int>((off + 127) / 128);
          const int own_b1 = std::max(own_b0, static_cast<int>((off + cnt) / 128));
          auto own = [&](int c) { return c * mg >= own_b0 && std::min((c + 1) * mg, mb) <= own_b1; };
          int nown = 0;
          bool own_first = true;
          for (int i = 0; i < chunks; ++i) {
            if (own(sweep[i])) own_first = own_first && i == nown++;
          }
          // Two blocks per chunk: the sweep starts at the chunk of the first own block (or of
          // the first own row), which may hold a peer's block too.
          const int first_block = own_b1 > own_b0 ? own_b0 : static_cast<int>(off / 128);
          check(mg == 1 ? own_first : sweep[0] == first_block / mg,
                what + (mg == 1 ? ": the own chunks first" : ": from the chunk of the first own block"));
          const bool interleaved = interleave == 1 && W >= 3 && mg == 1;
          if (!interleaved) {
            bool seq = true;
            for (int i = 0; i < chunks; ++i) seq = seq && sweep[i] == (sweep[0] + i) % chunks;
            check(seq, what + ": sequential from the first chunk");
            continue;
          }
          if (M % (128 * W) != 0) continue;  // uneven runs: the permutation checks above
          bool turns = true;
          std::vector<int> last(W, -1);
          for (int i = nown; i < chunks; ++i) {
            const int peer = (r + 1 + (i - nown) % (W - 1)) % W;
            const int64_t row = int64_t{sweep[i]} * 128;
            turns = turns && row >= split_offset(M, W, peer) && row < split_offset(M, W, peer + 1) &&
                    sweep[i] > last[peer];
            last[peer] = sweep[i];
          }
          check(turns, what + ": the peers' blocks in turn, each peer's rising");
        }
}
}  // namespace

int main() {
  test_ag();
  test_ag_auto();
  test_ag_exchange();
  test_ag_spread_stores();
  test_ag_exchange_fallback();
  test_ag_ce_plan();
  test_ag_sweep();
  return fusedcomm::testing::report("ag_gemm_geometry_test");
}
