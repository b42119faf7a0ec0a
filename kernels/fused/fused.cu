// Host side of fused.h: argument checks, workspace sizes, the algorithm choice, the SM split
// table, the chunk geometry of the fused kernels (detail/fused_gemm.cuh) and their launch, the
// decomposed paths (launch_gemm + launch_collective), and the test reference GEMM.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <utility>
#include <vector>

#include "kernels/collectives/collectives.h"
#include "kernels/collectives/copy_segments.h"
#include "kernels/fused/detail/fused_gemm.cuh"
#include "kernels/fused/fused.h"
#include "kernels/gemm/gemm.h"

#include <cudaTypedefs.h>

#include <cstddef>

#include "kernels/common/driver_entry.h"

namespace fusedcomm::kernels {
namespace {

using detail::AgParams;
using detail::RsParams;
using detail::split_count;
using detail::split_offset;

// ---- tuning (model values; bench/fused reports both algorithms and the split to tune them) ------
//
// kAuto (allGatherGemm, W = 2 and 4): decomposed below this exchanged size, fused from it. Model
// (H200, DESIGN.md §7: ~790 TFLOP/s GEMM, ~330 GB/s NVLink pulls): the fused kernel hides the
// exchange, bytes * (W-1)/W / 330 GB/s, but costs a fixed ~10-20 us (chunk flags, SMs that
// start on communication, the first chunks' latency), which a small exchange does not repay.
// Measured, W = 2 (2 x H200 on a 4-GPU host, 2026-11-27, bench/fused/NOTES.md "Run 10", two
// runs): fused 0.85-0.93x the decomposed time from a 16 MiB gathered A (8B M=2048, 70B M=1024
// included: the own-first sweep removed run 4's loss at M = 1024), 1.055-1.059x at 8 MiB (8B
// M=1024). W = 4 (4 x H200): with the register-load pulls fused took 0.80-0.96x from 8 MiB
// (run 11; 8B M=1024 0.88-0.89x; 0.987x sustained in run 14); with the bulk-copy pulls of run
// 16, 1.045-1.053x at 8 MiB (8B M=1024, three rounds on two hosts) and 0.97-1.005x at 16 MiB
// (70B M=1024), so the W = 2 bar serves both.
constexpr uint64_t kAgFusedMinBytes = 16ull << 20;  // M*K*2: the gathered A
// The bar for world W, or 0 where fused is not measured (W = 3, W >= 5): decomposed there.
constexpr uint64_t ag_fused_min_bytes(int world) {
  return world == 2 || world == 4 ? kAgFusedMinBytes : 0;
}

// SM split of allGatherGemm: CTAs that pull first, by world size and the GEMM's FLOPs per
// exchanged byte (N_r). First row with world <= max_world and dim >= min_dim wins. Model (H200:
// ~790 TFLOP/s, ~330 GB/s of NVLink pulls per GPU; one pulling CTA keeps 128 KiB of bulk copies
// in flight, fused_protocol.cuh FusedBulkCopier):
// - allGatherGemm: the GEMM consumes the peers' rows at (W-1)/W * 790e12 / N_r B/s (N_r =
//   8192, W = 2: 48 GB/s; N_r = 2048, W = 4: 290 GB/s, the NVLink ceiling), but its first wave
//   already needs peers' rows when this rank's shard is under a raster group (8 M-blocks), so
//   the pull should run near the link's speed from the start. Pulling CTAs join the GEMM when
//   their chunks are done, so a few too many cost little (P SMs idle from the GEMM for the
//   pull time only).
// (gemmReduceScatter has no split: every CTA runs the GEMM, its epilogue pushes and reduces.)
// Measured with the bulk-copy pulls, fused time per count, sustained protocol, one round
// (4 x H200, run 16, bench/fused/NOTES.md "Run 16"; a round's noise is about +-2 %):
// - W = 4 (rows max_world 8): N_r = 2048 (square 8192) 24 CTAs 0.524 ms, 16 0.541, 48 0.658,
//   8 0.788; N_r = 4096 (square 16384) 16 best, 8 +0.7 %, 24 +1.4 %; N_r = 7168 (8B) 8 = 16
//   best, 24 +0.7 %; N_r = 14336 (70B M = 2048) 8 to 24 within 0.6 %. The register-load pulls
//   (until run 16), at their best count of the same sweep, were 1-5 % slower at each shape.
// - W = 2: every count from 4 to 20 within the round's noise (N_r = 4096: 20 best; 8192 and
//   up: 4-16 within 2.5 %): the rows of runs 10-11 stay. The rows below N_r = 2048 and W = 3 follow
//   the model unmeasured. bench/fused reports the split of each row (fused_bench --ctas
//   overrides it).
struct SplitRow {
  int max_world;
  int min_dim;
  int ctas;
};
constexpr SplitRow kAgSplit[] = {
    {2, 8192, 16}, {2, 4096, 20}, {2, 2048, 24}, {2, 0, 32},
    {8, 8192, 8}, {8, 4096, 16}, {8, 2048, 24}, {8, 0, 32},
};
template <size_t N>
int split_ctas(const SplitRow (&rows)[N], int world, int dim) {
  for (const SplitRow& row : rows) {
    if (world <= row.max_world && dim >= row.min_dim) return row.ctas;
  }
  return rows[N - 1].ctas;
}

// allGatherGemm: one pull work item moves about this much (a slice of a chunk).
constexpr int64_t kAgSliceBytes = 128 << 10;
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
uint64_t round_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }
bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

int device_sms(const CommDevice& d) {
  if (d.sm_count > 0) return d.sm_count;
  int dev = 0, n = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return 132;
  if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) return 132;
  return n;
}

bool valid_device(const CommDevice& d) {
  if (d.world < 1 || d.world > kCommMaxRanks || d.rank < 0 || d.rank >= d.world) return false;
  for (int p = 0; p < d.world; ++p) {
    if (d.base[p] == nullptr) return false;
  }
  return d.error != nullptr;
}

bool valid_shape(int M, int N, int K) {
  return M >= 1 && N >= 8 && K >= 8 && N % 8 == 0 && K % 8 == 0;
}

uint8_t* scratch_of(const CommDevice& d) { return d.base[d.rank] + d.scratch_offset; }

// ---- algorithm choice ---------------------------------------------------------------------------
// Every input of a rule must be the same on every rank (M, N or K as shared, W, the SM count),
// never K_r or N_r: ranks that chose differently would wait for each other until the timeout.
// From the measurements (bench/fused/NOTES.md, 2 x H200, run 3):
// - allGatherGemm: with the own rows moved by the copy engine, fused was faster than
//   decomposed at all five shapes measured at W = 2 (0.94-0.98 of its time, 0.90 at 70B
//   M=8192). Fused at W = 2 and 4 from kAgFusedMinBytes; W = 3
//   and W >= 5 are not measured for speed: decomposed.
// - gemmReduceScatter (2 x H200, run 9, the pusher warps; bench/fused/NOTES.md): fused took
//   0.87-0.96 of the decomposed time at every shape with M*N >= 2^24 for both partial
//   precisions (at 2^24: bf16 0.96 / 0.97, fp32 0.97 / 0.96 for 8B M=4096 / 70B M=2048), and
//   lost below (M*N = 2^22-2^23: 1.02-1.13; fp32 8B M=1024 2.1x). (Run 8, with the TMA pushes,
//   had needed 2^25, and N >= 8192 with bf16 partials.) M, N, W are rank-uniform (K_r is not).
//   At W = 4 (4 x H200, 2026-11-27, run 10) the crossover was the same, for bf16, fp32 and
//   fp32-any-order partials: fused 0.75-0.98x the decomposed time at every shape with
//   M*N >= 2^24 (8B M=4096 and 70B M=2048 included), 1.11-2.03x below. W = 3, between two
//   measured worlds with one threshold, takes it too (correct on separate GPUs, speed not
//   measured); W >= 5 is not measured: decomposed. Since run 17 also at least 1024 rows per
//   owner (kRsFusedMinOwnerRows: the sustained runs had 70B M=2048 at W = 4 slower fused).
bool rs_fused_fits(const CommDevice& d, const RsParams& p);
FusedAlgo choose_ag(const CommDevice& d, const AgGemmArgs& a) {
  if (a.algo != FusedAlgo::kAuto) return a.algo;
  const uint64_t min_bytes = ag_fused_min_bytes(d.world);
  if (min_bytes == 0) return FusedAlgo::kDecomposed;
  // Run 4 had fused at 1.3-2.7x the decomposed time at W = 2, M = 1024: the GEMM's first
  // raster group (8 M-blocks) held peers' rows, and half the first wave waited on slow pulls.
  // Since 95f0f3d the sweep takes the own blocks first (AgSchedule::coord); 70B M=1024 ran
  // faster fused at W = 2 (run 10: 0.89-0.91x) and at W = 4 (run 11: 0.92-0.95x), so only the
  // byte bar is left.
  const uint64_t bytes = static_cast<uint64_t>(a.M) * a.K * 2;
  return bytes >= min_bytes ? FusedAlgo::kFused : FusedAlgo::kDecomposed;
}
constexpr uint64_t kRsFusedMinElems = uint64_t{1} << 24;  // M*N of the partial product
// And at least 1024 rows (eight M-blocks) per owner. Under the sustained protocol (runs 14, 16
// and 17 on 4 x H200, several hosts) 70B M = 2048 at W = 4 (512 rows per owner) took 1.030,
// 1.011 and 1.027 x the decomposed time fused, while 8B M = 4096, the same M*N with 1024 rows
// per owner, took 0.954, 0.949 and 0.952 x; run 10's 0.75-0.98 x at every shape from 2^24 came
// from the round-robin protocol that favoured the fused kernel (NOTES.md "Run 14"). At W = 2
// every shape from 2^24 has 1024 rows per owner or more (70B M = 2048 fused: 0.94 x in run 17).
// W = 3 (not measured for speed) takes the same rows bar: fused from M = 3072.
constexpr int64_t kRsFusedMinOwnerRows = 1024;
// p: rs_geometry(d, a) (computed once per launch). kF32AnyOrder is kF32 at W = 2.
FusedAlgo choose_rs(const CommDevice& d, const GemmRsArgs& a, const RsParams& p) {
  if (a.algo != FusedAlgo::kAuto) return a.algo;
  if (d.world < 2 || d.world > 4) return FusedAlgo::kDecomposed;
  const uint64_t elems = static_cast<uint64_t>(a.M) * static_cast<uint64_t>(a.N);
  if (elems < kRsFusedMinElems || a.M / d.world < kRsFusedMinOwnerRows || !rs_fused_fits(d, p)) {
    return FusedAlgo::kDecomposed;
  }
  return FusedAlgo::kFused;
}

// The gathered A's bytes (M rows of K bf16), which both of allGatherGemm's size rules read.
int64_t ag_gathered_bytes(int M, int K) { return int64_t{M} * K * 2; }

// How the fused allGatherGemm's GEMM stores the own rows into the gathered A (AgParams::store_own):
// spread over every tile of an own M-block where the gathered A is large, else by the column-0
// tile. Measured (bench/fused/NOTES.md, run 26, two rounds each): the spread took 0.977-0.992 ×
// the fused time with M·K·2 >= 256 MiB (70B M = 16384, square 16384) at W = 1 and 2, and
// 1.001-1.013 × with 128 MiB (70B M = 8192, square 8192). W >= 3 keeps the column-0 tile
// (not measured there).
int ag_store_own(bool gathered, int world, int M, int K) {
  if (!gathered) return 0;
#ifdef FUSEDCOMM_AG_SPREAD_ANY_W
  world = 1;  // bench build: the rule at every W, for the W = 4 A/B (w4_owed.sh)
#endif
  const bool spread = world <= 2 && ag_gathered_bytes(M, K) >= (int64_t{256} << 20);
  return spread ? detail::kAgStoreSpread : 1;
}

// The fused kernels' raster group height: the GEMM's default (gemm.h GemmArgs::group_m: 16 on
// 256-wide tiles, 8 on 128-wide) up to W = 2, where it was measured; 8 from W = 3, as every
// W = 4 table so far ran. A taller group there asks for more peers' rows before the first wave
// of the peers' part (allGatherGemm) and changes which owners the first waves' pushes go to
// (gemmReduceScatter): not taken before a 4-GPU host measures it.
int fused_group_m(int world) {
#ifdef FUSEDCOMM_FUSED_TALL_GROUPS
  return 0;  // bench build: the GEMM's default at every W, for the W = 4 A/B owed (docs/gpu-runs-owed.md)
#endif
  return world <= 2 ? 0 : 8;
}

// ---- allGatherGemm geometry ---------------------------------------------------------------------
struct AgGeometry {
  int gemm_ctas, comm_ctas, m_block_start;
  AgParams p;
};

// kAuto's copy-engine exchange (AgExchange): at W = 2 up to this N_r. Run 17 (2 x H200, the
// copy-engine build against the SM pulls, two rounds): 0.926 x the time at square 8192 (N_r =
// 4096, whose exchange is the largest against its GEMM: 64 MiB beside 0.82 ms), 0.995-1.016 x
// at the eleven wider shapes. At W = 4 one stream per peer pulled 200-232 GB/s into each GPU and
// lost 1.07-1.46 x at the narrow shapes (run 18): not taken there.
constexpr int kAgCeMaxN = 4096;
// ... and from this much gathered A (M·K·2) at any N_r. Run 33 (2 x H200, f3181c4, two rounds in
// alternating order, slowest rank): 0.982-0.998 x the SM pulls' time at 8B M = 16384 and 70B
// M = 4096, 8192 and 16384 (64-256 MiB; 8 of 8 rounds faster), square 16384 0.990 and 1.002;
// run 20 had 1.004-1.011 x at 32 MiB (70B M = 2048, 8B M = 4096), where the pulls stay.
constexpr int64_t kAgCeMinGatheredBytes = int64_t{64} << 20;
// The copy engines' copies merge consecutive rows of a peer up to this many bytes
// (ag_ce_steps): a 2 MiB chunk alone is a few microseconds of copy engine, about what a copy
// costs to start (run 17 tried 32 MiB: no better).
constexpr int64_t kAgCeCopyBytes = int64_t{8} << 20;

// Whether this rank's fused allGatherGemm moves the peers' rows with the copy engines.
bool ag_uses_ce(const CommDevice& d, const AgGemmArgs& a) {
#ifdef FUSEDCOMM_PHANTOM_PEER
  return false;  // bench build: no peer process, so no start barrier kernel to pass
#endif
  if (d.world < 2 || a.side == nullptr || a.exchange == AgExchange::kSmPulls) return false;
  if (a.exchange == AgExchange::kCopyEngines) return true;
  return a.side->usable() && d.world == 2 &&
         (a.N <= kAgCeMaxN || ag_gathered_bytes(a.M, a.K) >= kAgCeMinGatheredBytes);
}

// Fills everything but the device handle, pointers and tile width dependent parts.
AgGeometry ag_geometry(const CommDevice& d, const AgGemmArgs& a) {
  const int W = d.world, r = d.rank, sms = device_sms(d);
  AgGeometry g{};
  AgParams& p = g.p;
  p.M = a.M;
  p.K = a.K;
  p.store_own = ag_store_own(a.gathered != nullptr, W, a.M, a.K);
  const int mb = static_cast<int>(ceil_div(a.M, detail::kTileM));
  p.mg = static_cast<int>(ceil_div(mb, kFusedMaxChunks));
  p.chunks = static_cast<int>(ceil_div(mb, p.mg));
  const int chunk_rows = p.mg * detail::kTileM;
  const int64_t chunk_bytes = static_cast<int64_t>(chunk_rows) * a.K * 2;
  int slices = static_cast<int>(std::clamp<int64_t>(chunk_bytes / kAgSliceBytes, 1, chunk_rows));
  p.slice_rows = static_cast<int>(ceil_div(chunk_rows, slices));
  p.slices = static_cast<int>(ceil_div(chunk_rows, p.slice_rows));
  // The GEMM starts at the first M-block made only of this rank's rows (no wait at all), else
  // at the block holding its first row.
  const int64_t off = split_offset(a.M, W, r), cnt = split_count(a.M, W, r);
  int sb = 0;
  if (cnt > 0) {
    const int64_t fb = ceil_div(off, detail::kTileM);
    const bool full = fb < mb && fb * detail::kTileM + detail::kTileM <= off + cnt;
    sb = static_cast<int>(full ? fb : off / detail::kTileM);
  }
  g.m_block_start = sb;
  p.c_start = sb / p.mg;
  // The M-blocks made only of this rank's rows (read from A_r directly: AgParams::tm_own).
  p.own_row0 = static_cast<int>(off);
  p.own_b0 = static_cast<int>(ceil_div(off, detail::kTileM));
  p.own_b1 = std::max(p.own_b0, static_cast<int>((off + cnt) / detail::kTileM));
  p.ce = ag_uses_ce(d, a) ? 1 : 0;
  // The peers' chunks in turn (detail::ag_sweep_chunk) where a chunk is one M-block and there
  // are two peers or more; by default with the copy engines only (their streams pull every
  // peer at once).
  const int interleave = a.interleave_peers >= 0 ? a.interleave_peers : p.ce;
  p.interleave = interleave > 0 && p.mg == 1 && W >= 3 ? W - 1 : 0;
  const int items = p.chunks * p.slices;
  int comm = a.comm_ctas > 0 ? a.comm_ctas : split_ctas(kAgSplit, W, a.N);
  comm = std::clamp(comm, 1, std::max(1, std::min(items, sms / 2)));
  if (p.ce) comm = 1;  // one CTA turns the side streams' progress into chunk flags
  g.comm_ctas = comm;
  g.gemm_ctas = std::max(1, sms - comm);
  return g;
}

// allGatherGemm's copy-engine exchange (AgExchange::kCopyEngines; fused_gemm.cuh
// ag_ce_role): the steps of the side stream that pulls peer `from`'s rows, after the start
// barrier. One stream per peer: at W = 4 one stream pulling peer after peer moved 105-144 GB/s
// into each GPU, one per peer 200-232 (ce_gemm_probe, bench/fused/NOTES.md "Run 17"). Its
// positions are the chunks in the sweep's order (detail::ag_sweep_chunk; none made only of
// blocks read from A_r) that hold rows of `from`; their rows of `from` go into copies, and
// consecutive rows merge up to `copy_bytes` (a 2 MiB chunk alone is a few microseconds of copy
// engine, about what a copy costs to start). A mark n follows the copy that holds the last rows of
// `from` in the chunk at position n (so every chunk at a position <= n then has them); the
// last step is the end mark, positions + 1. `position_rows`, if not null, gets each
// position's chunk rows [r0, r1) (for the test).
std::vector<AgCeStep> ag_ce_steps(const AgParams& p, int W, int r, int from, int64_t copy_bytes,
                                  std::vector<std::pair<int64_t, int64_t>>* position_rows) {
  std::vector<AgCeStep> steps;
  if (from < 0 || from >= W || from == r) return steps;
  const int64_t chunk_rows = int64_t{p.mg} * detail::kTileM;
  const int64_t row_bytes = static_cast<int64_t>(p.K) * 2;
  AgCeStep run{-1, 0, 0, 0};
  uint64_t pos = 0, marked = 0;
  auto flush = [&](uint64_t complete) {  // issue the run; positions <= complete are then done
    if (run.peer >= 0) steps.push_back(run);
    run.peer = -1;
    if (complete > marked) {
      steps.push_back({-1, 0, 0, complete});
      marked = complete;
    }
  };
  for (int k = 0; k < p.chunks; ++k) {
    const int c = detail::ag_sweep_chunk(p, k);
    if (detail::ag_chunk_is_own(p, c)) continue;  // the same chunks as ag_ce_role's
    int64_t a, b;
    detail::ag_chunk_rows_of(p, W, c, from, &a, &b);
    if (a >= b) continue;  // no rows of `from`: not a position of this stream
    ++pos;
    if (position_rows != nullptr) {
      position_rows->push_back({c * chunk_rows, std::min<int64_t>((c + 1) * chunk_rows, p.M)});
    }
    if (run.peer >= 0 && run.row1 == a && (b - run.row0) * row_bytes <= copy_bytes) {
      run.row1 = b;
      continue;
    }
    flush(pos - 1);  // the run holds every earlier position's remaining rows
    run = {from, a, b, 0};
  }
  flush(pos);
  steps.push_back({-1, 0, 0, pos + 1});  // the end mark
  return steps;
}

// ---- gemmReduceScatter geometry -----------------------------------------------------------------
// Bytes per element of gemmReduceScatter's partial products.
int partial_bytes(const GemmRsArgs& a) { return a.partials == RsPartials::kBF16 ? 2 : 4; }
// Whether the fused kernel's sources add into one slot per owner (fused_gemm.cuh, "Receive
// slots"): any order allowed, W >= 3. Not at W = 2: one source gains nothing from it and pays
// the zeroing and the reduce-adds (1.02-1.11 x on 2 x H200, NOTES.md "Run 8").
bool rs_accumulates(int world, const GemmRsArgs& a) {
  return world >= 3 && a.partials == RsPartials::kF32AnyOrder;
}

// Pacing of the pusher warps' NVLink stores (RsParams::push_pace_ns). Their stores in flight slow
// the GEMM's main loops on the same SM: on 2 x H200 at W = 2 the main loops took 1.06-1.20 x
// the GEMM alone's cycles per tile at the mid shapes, and 1.03-1.07 x with the same stores into
// local memory (bench/fused/NOTES.md "Run 13"). So the pusher spreads a handoff over a share of
// the next tile's main loop (estimated from K at ~1.5 GHz: BN * K / 24 ns) instead of issuing
// it at once: a sleep after every 2 KiB. A/B with bf16 partials, a quarter of the main loop
// against no pacing, at the shapes kAuto runs fused: 0.92-1.00 x the time on 2 x H200 (W = 2,
// geomean 0.98), 0.93-1.01 x on 4 x H200 (W = 4); up to 2.3 x slower at one- and two-wave
// shapes, where the own tiles wait for the pushes: so only from 3 waves of tiles. No new wait:
// a paced pusher is only a slower one, which the deadlock argument (fused_gemm.cuh) and
// rs_protocol_model.py's random schedules already allow. Bench switches:
// FUSEDCOMM_RS_PUSH_SPREAD_PCT (0: off), FUSEDCOMM_RS_PUSH_PACE_NS (a fixed sleep).
#ifndef FUSEDCOMM_RS_PUSH_PACE_NS
#define FUSEDCOMM_RS_PUSH_PACE_NS 0
#endif
#ifndef FUSEDCOMM_RS_PUSH_SPREAD_PCT
#define FUSEDCOMM_RS_PUSH_SPREAD_PCT 25
#endif
uint32_t rs_push_pace_ns(const CommDevice& d, const GemmRsArgs& a, const RsParams& p) {
  // bf16 partials only: a half-tile is one handoff there, so the consumer never waits for the
  // pusher within a tile (with fp32 partials it does, and a fixed pace measured 1.00-1.07 x
  // slower at W = 2).
  if (d.world < 2 || !p.bf16_partials) return 0;
  const int64_t tiles = static_cast<int64_t>(ceil_div(a.M, detail::kTileM)) * p.n_blocks;
  if (tiles < 3 * static_cast<int64_t>(device_sms(d))) return 0;
  if (FUSEDCOMM_RS_PUSH_PACE_NS > 0) return FUSEDCOMM_RS_PUSH_PACE_NS;
  if (FUSEDCOMM_RS_PUSH_SPREAD_PCT <= 0) return 0;
  const double tile_ns = static_cast<double>(p.tile_n) * a.K / 24.0;
  const int chunks = p.tile_n / 16;  // 2 KiB pieces of a 64-row bf16 half-tile
  return static_cast<uint32_t>(tile_ns * FUSEDCOMM_RS_PUSH_SPREAD_PCT / 100.0 / chunks);
}

// The fused kernel's geometry (detail/fused_gemm.cuh, gemmReduceScatter), all but the device
// handle, pointers and tensor maps. The tile width comes from M, N and the SM count only (never
// K_r): every rank must sweep the same tile grid, since flags are per half-tile and tile column
// (the width is part of the launch signature, so a rank that differs fails the launch).
RsParams rs_geometry(const CommDevice& d, const GemmRsArgs& a) {
  const int W = d.world, r = d.rank;
  RsParams p{};
  p.M = a.M;
  p.N = a.N;
  const GemmTileGrid tg = gemm_tile_grid(a.M, a.N, 0, device_sms(d));
  p.n_blocks = tg.n_blocks;
  p.tile_n = tg.tile_n;
  const int64_t ceil_rows = ceil_div(a.M, W);
  p.slot_elems = static_cast<uint64_t>(ceil_rows + kFusedRsSlotPadRows) * static_cast<uint64_t>(a.N);
  p.halves = static_cast<int>(ceil_div(ceil_rows, 64)) + 1;
  const int64_t off = split_offset(a.M, W, r), cnt = split_count(a.M, W, r);
  p.own_b0 = cnt > 0 ? static_cast<int>(off / detail::kTileM) : 0;
  p.own_nb = cnt > 0 ? static_cast<int>((off + cnt - 1) / detail::kTileM) - p.own_b0 + 1 : 0;
  p.bf16_partials = a.partials == RsPartials::kBF16 ? 1 : 0;
  p.accumulate = rs_accumulates(W, a) ? 1 : 0;
  // One received slot of bf16 partials, which the staging buffer holds (the pusher warps' two
  // rounds) or half of (the TMA pushes' one): detail/fused_gemm.cuh, "Early fetch".
  p.prefetch = W == 2 && p.bf16_partials && cnt > 0 ? 1 : 0;
  p.push_pace_ns = rs_push_pace_ns(d, a, p);
#ifdef FUSEDCOMM_RS_SPREAD  // bench switch (detail/fused_gemm.cuh, rs_spread_coord)
  p.spread = W >= 2 && a.M % (W * detail::kTileM) == 0 ? 1 : 0;
#endif
  return p;
}

// Half-tile flags per owner that the fused kernel needs (FusedFlags::rs_tile).
int64_t rs_flags_needed(const CommDevice& d, const RsParams& p) {
  return int64_t{d.world - 1} * p.halves * p.n_blocks;
}
bool rs_fused_fits(const CommDevice& d, const RsParams& p) {
  return rs_flags_needed(d, p) <= kFusedRsTileFlags;
}

// ---- launch helpers -----------------------------------------------------------------------------
// Cooperative: the driver refuses a grid that cannot be resident at once (every CTA of the
// fused kernels waits for others) instead of letting it hang until a timeout.
template <typename... Exp, typename... Act>
cudaError_t launch_cooperative(void (*kernel)(Exp...), int grid, size_t smem,
                               cudaStream_t stream, Act&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(grid));
  cfg.blockDim = dim3(detail::kGemmThreads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeCooperative;
  attr[0].val.cooperative = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Act>(args)...);
}

// One instance of a fused kernel (its tile width and B layout fixed): the shared-memory opt-in
// (once per device and kernel), then the cooperative launch with the GEMM plan's arguments
// followed by `extra` (the AG kernel's epilogue) and the op's parameters.
template <typename Kernel, typename... Extra>
cudaError_t launch_fused_instance(Kernel kernel, size_t smem, std::atomic<uint64_t>& opted,
                                  const detail::GemmPlan& plan, int grid, cudaStream_t stream,
                                  const Extra&... extra) {
  if (cudaError_t e = detail::gemm_opt_in_smem(reinterpret_cast<const void*>(kernel), smem, opted);
      e != cudaSuccess) {
    return e;
  }
  return launch_cooperative(kernel, grid, smem, stream, plan.ta, plan.tb, plan.tc, plan.prob,
                            extra...);
}

template <int BN, bool kBKN>
cudaError_t launch_ag_instance(const detail::GemmPlan& plan, const AgParams& p,
                               cudaStream_t stream) {
  static std::atomic<uint64_t> opted{0};
  return launch_fused_instance(detail::ag_gemm_kernel<BN, kBKN>,
                               detail::GemmTileConfig<BN, detail::DefaultEpilogue::kStagingRounds>::kSmemBytes,
                               opted, plan, p.gemm_ctas + p.comm_ctas, stream, plan.epi, p);
}

template <int BN, bool kBKN>
cudaError_t launch_rs_instance(const detail::GemmPlan& plan, const RsParams& p, int grid,
                               cudaStream_t stream) {
  static std::atomic<uint64_t> opted{0};
  return launch_fused_instance(
      detail::rs_gemm_kernel<BN, kBKN>,
      detail::GemmTileConfig<BN, detail::RsEpilogue::kStagingRounds>::kSmemBytes, opted, plan,
      grid, stream,
                               p);
}

// Rows [0, W*ceil) of a "padded" layout (block p of ceil rows at p*ceil, rank p's
// split_count rows first in it) <-> the compact layout (rank p's rows at split_offset).
// Ranks p < M%W have ceil rows at the same offset in both: one copy; the rest one each.
cudaError_t copy_rows_layout(uint8_t* dst, const uint8_t* src, int64_t M, int W, int64_t row_bytes,
                             bool to_padded, cudaStream_t stream) {
  const int64_t ceil_rows = ceil_div(M, W), rem = M % W;
  if (rem > 0) {
    if (cudaError_t e = cudaMemcpyAsync(dst, src, rem * ceil_rows * row_bytes,
                                        cudaMemcpyDeviceToDevice, stream);
        e != cudaSuccess) {
      return e;
    }
  }
  for (int p = static_cast<int>(rem); p < W; ++p) {
    const int64_t rows = split_count(M, W, p);
    if (rows == 0) continue;
    const int64_t padded = p * ceil_rows, compact = split_offset(M, W, p);
    const int64_t d = to_padded ? padded : compact, s = to_padded ? compact : padded;
    if (cudaError_t e = cudaMemcpyAsync(dst + d * row_bytes, src + s * row_bytes, rows * row_bytes,
                                        cudaMemcpyDeviceToDevice, stream);
        e != cudaSuccess) {
      return e;
    }
  }
  return cudaSuccess;
}

// The host-side plans' arguments (all_gather_gemm_sweep, all_gather_gemm_ce_plan): a valid
// shape on a rank of a valid world (no pointers, unlike ag_args_ok).
bool ag_plan_args_ok(const CommDevice& d, const AgGemmArgs& a) {
  return valid_shape(a.M, a.N, a.K) && d.world >= 1 && d.world <= kCommMaxRanks && d.rank >= 0 &&
         d.rank < d.world;
}

bool ag_args_ok(const CommDevice& d, const AgGemmArgs& a) {
  if (!valid_device(d) || !valid_shape(a.M, a.N, a.K)) return false;
  if (a.B == nullptr || a.C == nullptr || !aligned16(a.B) || !aligned16(a.C) ||
      !aligned16(a.gathered) || a.in_offset % 16 != 0) {
    return false;
  }
  if (a.exchange != AgExchange::kAuto && a.exchange != AgExchange::kSmPulls &&
      a.exchange != AgExchange::kCopyEngines) {
    return false;
  }
  // The copy engines need their streams (at W = 1 there is nothing to move).
  if (a.exchange == AgExchange::kCopyEngines && a.side == nullptr && d.world > 1) return false;
  const FusedWorkspace ws = all_gather_gemm_workspace(a, d.world);
  return ws.data_bytes <= d.data_bytes && ws.scratch_bytes <= d.data_bytes;
}

bool rs_args_ok(const CommDevice& d, const GemmRsArgs& a) {
  if (!valid_device(d) || !valid_shape(a.M, a.N, a.K)) return false;
  if (a.A == nullptr || a.B == nullptr || !aligned16(a.A) || !aligned16(a.B) ||
      !aligned16(a.out) || a.ws_offset % 16 != 0) {
    return false;
  }
  if (a.partials != RsPartials::kF32 && a.partials != RsPartials::kBF16 &&
      a.partials != RsPartials::kF32AnyOrder) {
    return false;
  }
  if (a.out == nullptr && split_count(a.M, d.world, d.rank) > 0) return false;
  // (A forced fused launch whose half-tile flags would not fit FusedFlags is refused by the
  // launch, which has the geometry; kAuto picks the decomposed path there.)
  const FusedWorkspace ws = gemm_reduce_scatter_workspace(a, d.world);
  return ws.data_bytes <= d.data_bytes && ws.scratch_bytes <= d.data_bytes;
}

GemmArgs base_gemm_args(int M, int N, int K, const __nv_bfloat16* A, const __nv_bfloat16* B,
                        GemmLayoutB layout) {
  GemmArgs g;
  g.A = A;
  g.lda = K;
  g.B = B;
  g.ldb = layout == GemmLayoutB::kKN ? N : K;
  g.ldc = N;
  g.M = M;
  g.N = N;
  g.K = K;
  g.b_layout = layout;
  return g;
}

}  // namespace

// ---- workspace ----------------------------------------------------------------------------------
FusedWorkspace all_gather_gemm_workspace(const AgGemmArgs& a, int world) {
  const int W = std::max(1, world);
  const uint64_t row = static_cast<uint64_t>(std::max(0, a.K)) * 2;
  const uint64_t M = static_cast<uint64_t>(std::max(0, a.M));
  const uint64_t ceil_rows = (M + W - 1) / W;
  FusedWorkspace ws{};
  ws.data_bytes = a.in_offset + ceil_rows * row;
  // Gathered A in scratch when the caller gives none; the decomposed path with W not dividing
  // M gathers W blocks of ceil(M/W) rows after it and unpacks them.
  const uint64_t own = a.gathered == nullptr ? round_up(M * row, 256) : 0;
  ws.scratch_bytes = own + (M % W != 0 ? W * ceil_rows * row : 0);
  return ws;
}

namespace {
// gemmReduceScatter's workspace per path. Decomposed: W blocks of ceil(M/W) rows in the data
// area; with W not dividing M, the compact partial before it is padded, then the reduce-scatter
// output block (ceil(M/W) rows) before its real rows are copied out, in the scratch area.
// Fused: W-1 padded receive slots, or one where the sources add into it (rs_accumulates).
FusedWorkspace rs_workspace(const GemmRsArgs& a, int world, FusedAlgo path) {
  const int W = std::max(1, world);
  const uint64_t row = static_cast<uint64_t>(std::max(0, a.N)) * partial_bytes(a);
  const uint64_t M = static_cast<uint64_t>(std::max(0, a.M));
  const uint64_t ceil_rows = (M + W - 1) / W;
  if (path == FusedAlgo::kFused) {
    const uint64_t nslots = rs_accumulates(W, a) ? 1 : W - 1;
    const uint64_t slots = W > 1 ? nslots * (ceil_rows + kFusedRsSlotPadRows) : 0;
    return {a.ws_offset + slots * row, 0};
  }
  return {a.ws_offset + W * ceil_rows * row, (M % W != 0 ? M : ceil_rows) * row};
}
FusedWorkspace larger(FusedWorkspace x, FusedWorkspace y) {
  return {std::max(x.data_bytes, y.data_bytes), std::max(x.scratch_bytes, y.scratch_bytes)};
}
}  // namespace

FusedWorkspace gemm_reduce_scatter_workspace(const GemmRsArgs& a, int world) {
  return larger(rs_workspace(a, world, FusedAlgo::kFused), rs_workspace(a, world, FusedAlgo::kDecomposed));
}

// ---- info ---------------------------------------------------------------------------------------
FusedLaunchInfo all_gather_gemm_info(const CommDevice& d, const AgGemmArgs& a) {
  FusedLaunchInfo info{};
  info.algo = choose_ag(d, a);
  if (info.algo == FusedAlgo::kFused && valid_shape(a.M, a.N, a.K) && d.world >= 1) {
    const AgGeometry g = ag_geometry(d, a);
    info.gemm_ctas = g.gemm_ctas;
    info.comm_ctas = g.comm_ctas;
    info.chunks = g.p.chunks;
    info.copy_engines = g.p.ce;
    info.spread_stores = g.p.store_own == detail::kAgStoreSpread ? 1 : 0;
    info.tile_n = gemm_tile_grid(a.M, a.N, 0, g.gemm_ctas).tile_n;
  } else if (valid_shape(a.M, a.N, a.K)) {
    info.tile_n = gemm_tile_grid(a.M, a.N, 0, device_sms(d)).tile_n;
  }
  return info;
}

std::vector<int> all_gather_gemm_sweep(const CommDevice& d, const AgGemmArgs& a) {
  if (!ag_plan_args_ok(d, a)) return {};
  const AgParams p = ag_geometry(d, a).p;
  std::vector<int> order(p.chunks);
  for (int k = 0; k < p.chunks; ++k) order[k] = detail::ag_sweep_chunk(p, k);
  return order;
}

std::vector<std::pair<int, int>> gemm_reduce_scatter_spread_sweep(int world, int rank,
                                                                  int blocks_per_rank,
                                                                  int n_blocks, int group) {
  if (world < 2 || world > kCommMaxRanks || rank < 0 || rank >= world || blocks_per_rank < 1 ||
      n_blocks < 1 || group < 1) {
    return {};
  }
  const int tiles = world * blocks_per_rank * n_blocks;
  std::vector<std::pair<int, int>> out(tiles);
  for (int t = 0; t < tiles; ++t) {
    const detail::TileCoord tc =
        detail::rs_spread_coord(t, world, rank, blocks_per_rank, n_blocks, group);
    out[t] = {tc.m, tc.n};
  }
  return out;
}

std::vector<AgCeStep> all_gather_gemm_ce_plan(
    const CommDevice& d, const AgGemmArgs& a, int from, int64_t copy_bytes,
    std::vector<std::pair<int64_t, int64_t>>* position_rows) {
  if (!ag_plan_args_ok(d, a)) return {};
  return ag_ce_steps(ag_geometry(d, a).p, d.world, d.rank, from, copy_bytes, position_rows);
}

FusedLaunchInfo gemm_reduce_scatter_info(const CommDevice& d, const GemmRsArgs& a) {
  FusedLaunchInfo info{};
  if (!valid_shape(a.M, a.N, a.K) || d.world < 1) {
    info.algo = a.algo == FusedAlgo::kAuto ? FusedAlgo::kDecomposed : a.algo;
    return info;
  }
  const RsParams p = rs_geometry(d, a);
  info.algo = choose_rs(d, a, p);
  info.tile_n = p.tile_n;
  if (info.algo == FusedAlgo::kFused) {
    // As the launch: every CTA runs the GEMM, never more than the tiles.
    const int64_t tiles = ceil_div(a.M, detail::kTileM) * p.n_blocks;
    info.gemm_ctas = static_cast<int>(std::min<int64_t>(device_sms(d), tiles));
    info.comm_ctas = 0;
    info.chunks = static_cast<int>(rs_flags_needed(d, p));
    info.push_pace_ns = p.push_pace_ns;
  }
  return info;
}

// ---- allGatherGemm's copy-engine exchange ----------------------------------------------------
FusedSideStreams::~FusedSideStreams() {
  // Called with the communicator's device current or not: stream and event destruction need
  // no current device, and a stream with queued copies is released once they are done.
  for (int i = 0; i + 1 < kCommMaxRanks; ++i) {
    if (joins_[i] != nullptr) cudaEventDestroy(joins_[i]);
    if (streams_[i] != nullptr) cudaStreamDestroy(streams_[i]);
  }
  if (fork_ != nullptr) cudaEventDestroy(fork_);
}

// The host half of fused_gemm.cuh ag_ce_role (which says why). The progress writes are stream
// memory operations, through the runtime's driver entry point (no link against libcuda).
cudaError_t FusedSideStreams::prepare(int world) {
  const cudaError_t e = make(world);
  failed_ = e != cudaSuccess;
  return e;
}

cudaError_t FusedSideStreams::make(int world) {
  int dev = 0;
  if (cudaError_t e = cudaGetDevice(&dev); e != cudaSuccess) return e;
  if (device_ >= 0 && device_ != dev) return cudaErrorInvalidDevice;
  device_ = dev;
  // Looked up before the kernels' launch: a kernel launched without its side streams would
  // wait for its chunks until the timeout.
  if (write_value_ == nullptr) {
    write_value_ = reinterpret_cast<void*>(
        detail::driver_entry<PFN_cuStreamWriteValue64_v11070>("cuStreamWriteValue64", 11070));
    if (write_value_ == nullptr) return cudaErrorNotSupported;
  }
  if (fork_ == nullptr && cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming) != cudaSuccess) {
    fork_ = nullptr;
    return cudaErrorMemoryAllocation;
  }
  for (int i = 0; i + 1 < world && i + 1 < kCommMaxRanks; ++i) {
    if (streams_[i] != nullptr) continue;
    if (cudaError_t e = cudaStreamCreateWithFlags(&streams_[i], cudaStreamNonBlocking);
        e != cudaSuccess) {
      streams_[i] = nullptr;
      return e;
    }
    if (cudaEventCreateWithFlags(&joins_[i], cudaEventDisableTiming) != cudaSuccess) {
      joins_[i] = nullptr;
      cudaStreamDestroy(streams_[i]);
      streams_[i] = nullptr;
      return cudaErrorMemoryAllocation;
    }
  }
  return cudaSuccess;
}

namespace {

// After the fused kernel's launch: on each peer's side stream, after side.fork (recorded on
// `stream` after ag_ce_barrier_kernel, before the fused kernel), the copies and progress marks
// of ag_ce_steps for that peer; then `stream` waits for every side stream.
cudaError_t ag_ce_exchange(const CommDevice& d, const AgParams& p, const FusedSideStreams& side,
                           cudaStream_t stream) {
  const auto write_value = reinterpret_cast<PFN_cuStreamWriteValue64_v11070>(side.write_value());
  const int W = d.world, r = d.rank;
  uint8_t* flags = d.base[r] + kFusedFlagsOffset;
  const int64_t row_bytes = static_cast<int64_t>(p.K) * 2;
  for (int i = 0; i + 1 < W; ++i) {
    const int from = (r + 1 + i) % W;
    cudaStream_t st = side.stream(i);
    if (cudaError_t e = cudaStreamWaitEvent(st, side.fork(), 0); e != cudaSuccess) return e;
    const auto progress = reinterpret_cast<CUdeviceptr>(
        flags + offsetof(FusedFlags, ce_progress) + i * sizeof(uint64_t));
    const int64_t off = split_offset(p.M, W, from);
    for (const AgCeStep& step :
         ag_ce_steps(p, W, r, from, kAgCeCopyBytes, nullptr)) {
      if (step.peer < 0) {
        if (write_value(reinterpret_cast<CUstream>(st), progress, step.progress,
                             CU_STREAM_WRITE_VALUE_DEFAULT) != CUDA_SUCCESS) {
          return cudaErrorUnknown;
        }
        continue;
      }
      const uint8_t* src = d.base[from] + d.data_offset + p.in_offset + (step.row0 - off) * row_bytes;
      uint8_t* dst = reinterpret_cast<uint8_t*>(p.gathered) + step.row0 * row_bytes;
      if (cudaError_t e = cudaMemcpyAsync(dst, src, (step.row1 - step.row0) * row_bytes,
                                          cudaMemcpyDeviceToDevice, st);
          e != cudaSuccess) {
        return e;
      }
    }
    if (cudaError_t e = cudaEventRecord(side.join(i), st); e != cudaSuccess) return e;
    if (cudaError_t e = cudaStreamWaitEvent(stream, side.join(i), 0); e != cudaSuccess) return e;
  }
  return cudaSuccess;
}
}  // namespace

// ---- allGatherGemm ------------------------------------------------------------------------------
cudaError_t launch_all_gather_gemm(const CommDevice& dev, const AgGemmArgs& args,
                                   cudaStream_t stream) {
  if (!ag_args_ok(dev, args)) return cudaErrorInvalidValue;
  const int W = dev.world;
  // The copy engines' streams and driver entry point, before anything is enqueued. Where they
  // cannot be had, kAuto falls back to the SM pulls (a rank-local choice); a forced exchange
  // returns the error.
  AgGemmArgs a = args;
  const FusedAlgo algo = choose_ag(dev, a);  // from sizes and world only: side plays no part
  if (algo == FusedAlgo::kFused && ag_uses_ce(dev, a)) {
    if (cudaError_t e = a.side->prepare(W); e != cudaSuccess) {
      if (a.exchange == AgExchange::kCopyEngines) return e;
      cudaGetLastError();
      a.side = nullptr;
    }
  }
  __nv_bfloat16* gathered =
      a.gathered != nullptr ? a.gathered : reinterpret_cast<__nv_bfloat16*>(scratch_of(dev));
  // Both paths carry the op's signature (its collective too): the rank-uniform M, K, offset.
  CommDevice d = dev;
  d.launch_sig = comm_launch_signature(kFusedOpAllGatherGemm, static_cast<uint32_t>(CommDtype::kBF16),
                                       static_cast<uint32_t>(algo),
                                       comm_sig_hash(static_cast<uint64_t>(a.M),
                                                     static_cast<uint64_t>(a.K), a.in_offset));

  if (algo == FusedAlgo::kDecomposed && W == 1) {
    // Alone, the gathered A is A_r: the GEMM reads it in place, and it is copied out only when
    // asked for (no allGather launch, which would copy it anyway).
    const auto* own =
        reinterpret_cast<const __nv_bfloat16*>(d.base[0] + d.data_offset + a.in_offset);
    if (a.gathered != nullptr) {
      if (cudaError_t e = cudaMemcpyAsync(a.gathered, own, static_cast<size_t>(a.M) * a.K * 2,
                                          cudaMemcpyDeviceToDevice, stream);
          e != cudaSuccess) {
        return e;
      }
    }
    GemmArgs g = base_gemm_args(a.M, a.N, a.K, own, a.B, a.b_layout);
    g.C = a.C;
    use_workspace(g, a.gemm_ws);
    return launch_gemm(g, stream);
  }
  if (algo == FusedAlgo::kDecomposed) {
    const int64_t row_bytes = static_cast<int64_t>(a.K) * 2;
    CollectiveArgs c;
    c.op = CommOp::kAllGather;
    c.dtype = CommDtype::kBF16;
    c.in_offset = a.in_offset;
    if (a.M % W == 0) {
      c.count = static_cast<int64_t>(a.M) * a.K;
      c.output = gathered;
      if (cudaError_t e = launch_collective(d, c, stream); e != cudaSuccess) return e;
    } else {
      // The collective splits elements, not rows: move W blocks of ceil(M/W) rows, then unpack.
      const uint64_t own = static_cast<uint64_t>(a.M) * row_bytes;
      uint8_t* padded = scratch_of(d) + (a.gathered == nullptr ? round_up(own, 256) : 0);
      c.count = W * ceil_div(a.M, W) * a.K;
      c.output = padded;
      if (cudaError_t e = launch_collective(d, c, stream); e != cudaSuccess) return e;
      if (cudaError_t e = copy_rows_layout(reinterpret_cast<uint8_t*>(gathered), padded, a.M, W,
                                           row_bytes, false, stream);
          e != cudaSuccess) {
        return e;
      }
    }
    GemmArgs g = base_gemm_args(a.M, a.N, a.K, gathered, a.B, a.b_layout);
    g.C = a.C;
    use_workspace(g, a.gemm_ws);
    return launch_gemm(g, stream);
  }
  if (algo != FusedAlgo::kFused) return cudaErrorInvalidValue;

  AgGeometry geo = ag_geometry(d, a);
  GemmArgs g = base_gemm_args(a.M, a.N, a.K, gathered, a.B, a.b_layout);
  g.C = a.C;
  g.num_ctas = geo.gemm_ctas;  // the tile width is chosen for the CTAs that start on the GEMM
  g.m_block_start = geo.m_block_start;
  g.cluster = 1;  // the fused kernel's GEMM CTAs claim tiles one by one (no CTA pairs)
  g.group_m = fused_group_m(W);
  detail::GemmPlan plan;
  if (cudaError_t e = detail::gemm_plan(g, &plan); e != cudaSuccess) return e;
  // The own rows: the GEMM reads the M-blocks made only of them from A_r itself (tm_own), and
  // when the caller asked for the gathered A it also stores them there from shared memory
  // (TMA, AgSchedule::stores_a). The rest of them (the blocks shared with a neighbour's rows)
  // go into the gathered buffer by the copy engine, stream-ordered before the kernel: copied
  // by pulling CTAs they took 0.3-1.7 ms on 2 x H200 once the GEMM's first tiles ran
  // (bench/fused/NOTES.md, run 3).
  AgParams& p = geo.p;
  const int64_t own_off = split_offset(a.M, W, d.rank), own_cnt = split_count(a.M, W, d.rank);
  const int64_t row_bytes = static_cast<int64_t>(a.K) * 2;
  const uint8_t* own = d.base[d.rank] + d.data_offset + a.in_offset;
  if (p.own_b1 > p.own_b0 &&
      !detail::encode_a_map(&p.tm_own, reinterpret_cast<const __nv_bfloat16*>(own),
                            static_cast<int>(own_cnt), a.K, a.K)) {
    return cudaErrorInvalidValue;
  }
  auto copy_own = [&](int64_t r0, int64_t r1) {  // gathered rows [r0, r1) from A_r
    if (r1 <= r0) return cudaSuccess;
    return cudaMemcpyAsync(reinterpret_cast<uint8_t*>(gathered) + r0 * row_bytes,
                           own + (r0 - own_off) * row_bytes, (r1 - r0) * row_bytes,
                           cudaMemcpyDeviceToDevice, stream);
  };
  const int64_t direct0 = int64_t{p.own_b0} * detail::kTileM;
  const int64_t direct1 = int64_t{p.own_b1} * detail::kTileM;
  const bool copy_all = p.own_b1 == p.own_b0;  // no block made only of own rows
  if (cudaError_t e = copy_own(own_off, copy_all ? own_off + own_cnt : direct0); e != cudaSuccess) {
    return e;
  }
  if (cudaError_t e = copy_own(copy_all ? own_off + own_cnt : direct1, own_off + own_cnt);
      e != cudaSuccess) {
    return e;
  }
  p.dev = d;
  p.gathered = gathered;
  p.in_offset = a.in_offset;
  p.gemm_ctas = std::min(geo.gemm_ctas, plan.prob.num_tiles);
  p.comm_ctas = geo.comm_ctas;
  if (p.ce) {
    // The start barrier as a kernel of its own, whose completion the side streams wait for
    // (fused_gemm.cuh ag_ce_role); the streams were prepared above.
    detail::ag_ce_barrier_kernel<<<1, 32, 0, stream>>>(d);
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
    if (cudaError_t e = cudaEventRecord(a.side->fork(), stream); e != cudaSuccess) return e;
  }
  cudaError_t launched;
  if (plan.tile_n == 256) {
    launched = plan.kn ? launch_ag_instance<256, true>(plan, p, stream)
                       : launch_ag_instance<256, false>(plan, p, stream);
  } else {
    launched = plan.kn ? launch_ag_instance<128, true>(plan, p, stream)
                       : launch_ag_instance<128, false>(plan, p, stream);
  }
  if (launched == cudaSuccess && p.ce) return ag_ce_exchange(d, p, *a.side, stream);
  return launched;
}

// ---- gemmReduceScatter --------------------------------------------------------------------------
cudaError_t launch_gemm_reduce_scatter(const CommDevice& dev, const GemmRsArgs& a,
                                       cudaStream_t stream) {
  if (!rs_args_ok(dev, a)) return cudaErrorInvalidValue;
  RsParams p = rs_geometry(dev, a);
  if (a.algo == FusedAlgo::kFused && !rs_fused_fits(dev, p)) return cudaErrorInvalidValue;
  const FusedAlgo algo = choose_rs(dev, a, p);
  // Both paths carry the op's signature (its collective too): the rank-uniform M, N, offset,
  // and in its dtype field the partials' code (RsPartials: ranks that disagree on the order
  // would store and add into different slots); the fused kernel's also its tile width (its
  // flags are per tile column: ranks with different widths must fail, not wait).
  const bool bf16 = a.partials == RsPartials::kBF16;
  const uint64_t shape = algo == FusedAlgo::kFused
                             ? comm_sig_hash(a.ws_offset, static_cast<uint64_t>(p.tile_n), 0)
                             : a.ws_offset;
  CommDevice d = dev;
  d.launch_sig = comm_launch_signature(kFusedOpGemmReduceScatter,
                                       static_cast<uint32_t>(a.partials),
                                       static_cast<uint32_t>(algo),
                                       comm_sig_hash(static_cast<uint64_t>(a.M),
                                                     static_cast<uint64_t>(a.N), shape));
  const int W = d.world, r = d.rank;
  uint8_t* ws = d.base[r] + d.data_offset + a.ws_offset;

  if (algo == FusedAlgo::kDecomposed && W == 1) {
    // Alone, the reduceScatter would copy the partials: the GEMM writes the output itself,
    // rounded once from its fp32 accumulators, the numerics of either partial precision at W = 1
    // (as gemmAllReduce at W = 1).
    GemmArgs g = base_gemm_args(a.M, a.N, a.K, a.A, a.B, a.b_layout);
    g.C = a.out;
    g.c_type = GemmOutType::kBF16;
    use_workspace(g, a.gemm_ws);
    return launch_gemm(g, stream);
  }
  if (algo == FusedAlgo::kDecomposed) {
    const int64_t row_bytes = static_cast<int64_t>(a.N) * partial_bytes(a);
    const bool even = a.M % W == 0;
    uint8_t* scratch = scratch_of(d);
    GemmArgs g = base_gemm_args(a.M, a.N, a.K, a.A, a.B, a.b_layout);
    g.C = even ? ws : scratch;
    g.c_type = bf16 ? GemmOutType::kBF16 : GemmOutType::kF32;
    use_workspace(g, a.gemm_ws);
    if (cudaError_t e = launch_gemm(g, stream); e != cudaSuccess) return e;
    if (!even) {
      // The collective splits elements, not rows: W blocks of ceil(M/W) rows (pad rows unused).
      if (cudaError_t e = copy_rows_layout(ws, scratch, a.M, W, row_bytes, true, stream);
          e != cudaSuccess) {
        return e;
      }
    }
    // fp32 partials: the sums are rounded to bf16 by the collective itself (out_bf16); bf16
    // partials: a bf16 reduceScatter (fp32 sums, rounded once). Its block holds ceil(M/W) rows;
    // with W dividing M that is exactly this rank's output, else the block goes to the scratch
    // area and its first split_count rows (the real ones) are copied out.
    CollectiveArgs c;
    c.op = CommOp::kReduceScatter;
    c.dtype = bf16 ? CommDtype::kBF16 : CommDtype::kF32;
    c.out_bf16 = !bf16;
    c.count = W * ceil_div(a.M, W) * a.N;
    c.in_offset = a.ws_offset;
    c.output = even ? static_cast<void*>(a.out) : static_cast<void*>(scratch);
    if (cudaError_t e = launch_collective(d, c, stream); e != cudaSuccess) return e;
    if (even) return cudaSuccess;
    return cudaMemcpyAsync(a.out, scratch, split_count(a.M, W, r) * a.N * 2,
                           cudaMemcpyDeviceToDevice, stream);
  }
  if (algo != FusedAlgo::kFused) return cudaErrorInvalidValue;

  GemmArgs g = base_gemm_args(a.M, a.N, a.K, a.A, a.B, a.b_layout);
  g.C = ws;  // checked as C; the kernel's epilogue (RsEpilogue) writes the receive slots
  g.c_type = bf16 ? GemmOutType::kBF16 : GemmOutType::kF32;
  g.tile_n = p.tile_n;  // shared by every rank (rs_geometry)
  g.cluster = 1;        // dynamic claims, no CTA pairs
  g.group_m = fused_group_m(W);
  detail::GemmPlan plan;
  if (cudaError_t e = detail::gemm_plan(g, &plan); e != cudaSuccess) return e;
  plan.prob.c_tma = 0;  // RsEpilogue stores every half-tile itself (kOwnsTile)
  // Tensor maps: each peer owner's receive slot for this rank (padding + its rows, × N
  // partials), and this rank's output rows. Peers' slots are mapped into this process (CUDA
  // IPC), so the TMA stores go over NVLink.
  const int64_t slot = static_cast<int64_t>(p.slot_elems) * partial_bytes(a);
  for (int o = 0; o < W; ++o) {
    const int64_t rows = split_count(a.M, W, o);
    if (o == r || rows == 0) continue;
    const int64_t slot_index = p.accumulate ? 0 : (r < o ? r : r - 1);
    uint8_t* base = d.base[o] + d.data_offset + a.ws_offset + slot_index * slot;
    if (!detail::encode_store_map(&p.tm_push[o], base,
                                  static_cast<int>(rows) + kFusedRsSlotPadRows, a.N, a.N, !bf16)) {
      return cudaErrorInvalidValue;
    }
  }
  const int64_t own_rows = split_count(a.M, W, r);
  if (own_rows > 0 &&
      !detail::encode_store_map(&p.tm_out, a.out, static_cast<int>(own_rows), a.N, a.N, false)) {
    return cudaErrorInvalidValue;
  }
  // This rank's one receive slot, for the early fetches of its own half-tiles.
  if (p.prefetch &&
      !detail::encode_store_map(&p.tm_recv, ws, static_cast<int>(own_rows) + kFusedRsSlotPadRows,
                                a.N, a.N, false)) {
    return cudaErrorInvalidValue;
  }
  p.dev = d;
  p.out = a.out;
  p.ws_offset = a.ws_offset;
  if (p.accumulate && own_rows > 0) {
    // The peers add into this rank's rows of its slot: zero them first (stream order puts this
    // before the kernel's start barrier; the padding rows are never read).
    uint8_t* rows = ws + static_cast<uint64_t>(kFusedRsSlotPadRows) * a.N * partial_bytes(a);
    if (cudaError_t e = cudaMemsetAsync(rows, 0, own_rows * a.N * partial_bytes(a), stream);
        e != cudaSuccess) {
      return e;
    }
  }
  const int grid = std::min(device_sms(d), plan.prob.num_tiles);
  if (plan.tile_n == 256) {
    return plan.kn ? launch_rs_instance<256, true>(plan, p, grid, stream)
                   : launch_rs_instance<256, false>(plan, p, grid, stream);
  }
  return plan.kn ? launch_rs_instance<128, true>(plan, p, grid, stream)
                 : launch_rs_instance<128, false>(plan, p, grid, stream);
}

#ifdef FUSEDCOMM_RS_TRACE
// Bench and test build: detail/rs_trace.h.
cudaError_t rs_trace_take(unsigned long long* out, int words, cudaStream_t stream) {
  if (words != detail::kRsTraceWords) return cudaErrorInvalidValue;
  const size_t bytes = words * sizeof(unsigned long long);
  if (cudaError_t e = cudaMemcpyFromSymbolAsync(out, detail::g_rs_trace, bytes, 0,
                                                cudaMemcpyDeviceToHost, stream);
      e != cudaSuccess) {
    return e;
  }
  static const unsigned long long zeros[detail::kRsTraceWords] = {};
  return cudaMemcpyToSymbolAsync(detail::g_rs_trace, zeros, bytes, 0, cudaMemcpyHostToDevice, stream);
}
#endif

// ---- gemmAllReduce ------------------------------------------------------------------------------
namespace {
// The gemmReduceScatter that gemmAllReduce's fused path runs (partials: any order is fp32).
GemmRsArgs ar_rs_args(const GemmArArgs& a) {
  GemmRsArgs r;
  r.M = a.M;
  r.N = a.N;
  r.K = a.K;
  r.A = a.A;
  r.B = a.B;
  r.b_layout = a.b_layout;
  r.ws_offset = a.ws_offset;
  r.algo = FusedAlgo::kFused;
  r.partials = a.partials == RsPartials::kBF16 ? RsPartials::kBF16 : RsPartials::kF32;
  return r;
}
// Fused path: where this rank's row block of the sum goes (a byte offset of the data area),
// right after the reduce-scatter's receive slots.
uint64_t ar_block_offset(const GemmArArgs& a, int world) {
  return round_up(rs_workspace(ar_rs_args(a), world, FusedAlgo::kFused).data_bytes, 256);
}
FusedWorkspace ar_workspace(const GemmArArgs& a, int world, FusedAlgo path) {
  const int W = std::max(1, world);
  const uint64_t M = static_cast<uint64_t>(std::max(0, a.M)), N = static_cast<uint64_t>(std::max(0, a.N));
  if (W == 1) return {a.ws_offset, 0};  // the GEMM alone
  if (path == FusedAlgo::kFused) return {ar_block_offset(a, W) + (M + W - 1) / W * N * 2, 0};
  // The partial product at ws_offset; the allReduce's reduced slices in the scratch area.
  const uint64_t bytes = M * N * (a.partials == RsPartials::kBF16 ? 2 : 4);
  return {a.ws_offset + bytes, W > 1 ? bytes : 0};
}
// kAuto: the fused path where gemmReduceScatter's kAuto takes its fused kernel, at W = 2 (bench/
// fused/NOTES.md, run 9), and at W = 4 with bf16 partials from M*N = 2^25: two runs on 4 x H200
// (run 10 at 94c97c8, run 11 at 4b70dcb) had the fused path at 0.84-0.96x the decomposed time
// from 2^25 (8B M=8192, 70B M=4096 and up, both squares) and 1.03-1.70x below. fp32 partials at
// W = 4 and W = 3 are not measured: decomposed.
constexpr uint64_t kArFusedMinElemsW4 = uint64_t{1} << 25;
FusedAlgo choose_ar(const CommDevice& d, const GemmArArgs& a) {
  if (a.algo != FusedAlgo::kAuto) return a.algo;
  if (a.M % d.world != 0) return FusedAlgo::kDecomposed;
  if (d.world == 4) {
    const uint64_t elems = static_cast<uint64_t>(a.M) * static_cast<uint64_t>(a.N);
    if (a.partials != RsPartials::kBF16 || elems < kArFusedMinElemsW4) return FusedAlgo::kDecomposed;
  } else if (d.world != 2) {
    return FusedAlgo::kDecomposed;
  }
  GemmRsArgs rs = ar_rs_args(a);
  rs.algo = FusedAlgo::kAuto;
  const FusedWorkspace ws = ar_workspace(a, d.world, FusedAlgo::kFused);
  return gemm_reduce_scatter_info(d, rs).algo == FusedAlgo::kFused && ws.data_bytes <= d.data_bytes
             ? FusedAlgo::kFused
             : FusedAlgo::kDecomposed;
}
}  // namespace

FusedWorkspace gemm_all_reduce_workspace(const GemmArArgs& a, int world) {
  if (a.algo != FusedAlgo::kAuto) return ar_workspace(a, world, a.algo);
  return larger(ar_workspace(a, world, FusedAlgo::kFused), ar_workspace(a, world, FusedAlgo::kDecomposed));
}

FusedLaunchInfo gemm_all_reduce_info(const CommDevice& d, const GemmArArgs& a) {
  FusedLaunchInfo info{};
  info.algo = choose_ar(d, a);
  if (info.algo == FusedAlgo::kFused) {
    GemmRsArgs rs = ar_rs_args(a);
    info = gemm_reduce_scatter_info(d, rs);
  }
  return info;
}

cudaError_t launch_gemm_all_reduce(const CommDevice& dev, const GemmArArgs& a, cudaStream_t stream) {
  if (!valid_device(dev) || !valid_shape(a.M, a.N, a.K) || a.C == nullptr || !aligned16(a.C) ||
      a.ws_offset % 16 != 0) {
    return cudaErrorInvalidValue;
  }
  const int W = dev.world;
  const FusedAlgo algo = choose_ar(dev, a);
  const FusedWorkspace ws = ar_workspace(a, W, algo);
  if (ws.data_bytes > dev.data_bytes || ws.scratch_bytes > dev.data_bytes) return cudaErrorInvalidValue;
  const int64_t count = static_cast<int64_t>(a.M) * a.N;
  uint8_t* data = dev.base[dev.rank] + dev.data_offset;
  GemmArgs gm = base_gemm_args(a.M, a.N, a.K, a.A, a.B, a.b_layout);
  use_workspace(gm, a.gemm_ws);  // gm runs only on the W = 1 and decomposed paths
  if (W == 1) {  // either path is the GEMM, rounded once
    gm.C = a.C;
    return launch_gemm(gm, stream);
  }
  if (algo == FusedAlgo::kFused) {
    if (a.M % W != 0) return cudaErrorInvalidValue;  // the allGather splits elements, not rows
    const uint64_t block = ar_block_offset(a, W);
    GemmRsArgs rs = ar_rs_args(a);
    rs.out = reinterpret_cast<__nv_bfloat16*>(data + block);
    if (cudaError_t e = launch_gemm_reduce_scatter(dev, rs, stream); e != cudaSuccess) return e;
    CollectiveArgs g;
    g.op = CommOp::kAllGather;
    g.dtype = CommDtype::kBF16;
    g.count = count;
    g.in_offset = block;
    g.output = a.C;
    return launch_collective(dev, g, stream);
  }
  if (algo != FusedAlgo::kDecomposed) return cudaErrorInvalidValue;
  const bool bf16 = a.partials == RsPartials::kBF16;
  if (!bf16 && (a.sums == nullptr || !aligned16(a.sums))) return cudaErrorInvalidValue;
  gm.C = data + a.ws_offset;
  gm.c_type = bf16 ? GemmOutType::kBF16 : GemmOutType::kF32;
  if (cudaError_t e = launch_gemm(gm, stream); e != cudaSuccess) return e;
  CollectiveArgs c;
  c.op = CommOp::kAllReduce;
  c.dtype = bf16 ? CommDtype::kBF16 : CommDtype::kF32;
  c.count = count;
  c.in_offset = a.ws_offset;
  c.output = bf16 ? static_cast<void*>(a.C) : static_cast<void*>(a.sums);
  if (cudaError_t e = launch_collective(dev, c, stream); e != cudaSuccess) return e;
  return bf16 ? cudaSuccess : launch_narrow_to_bf16(a.sums, a.C, count, stream);
}

// ---- test support: reference GEMM ---------------------------------------------------------------
namespace {
__global__ void reference_gemm_kernel(const __nv_bfloat16* A, int64_t lda, const __nv_bfloat16* B,
                                      int64_t ldb, bool kn, int M, int N, int K, float* ref,
                                      float* absdot, bool accumulate) {
  const int n = blockIdx.x * blockDim.x + threadIdx.x;
  if (n >= N) return;
  for (int m = blockIdx.y; m < M; m += gridDim.y) {
    float s = 0.f, sa = 0.f;
    for (int k = 0; k < K; ++k) {
      const float a = __bfloat162float(A[m * lda + k]);
      const float b = __bfloat162float(kn ? B[int64_t(k) * ldb + n] : B[int64_t(n) * ldb + k]);
      s = fmaf(a, b, s);
      sa += fabsf(a * b);
    }
    const int64_t i = int64_t(m) * N + n;
    ref[i] = accumulate ? ref[i] + s : s;
    if (absdot != nullptr) absdot[i] = accumulate ? absdot[i] + sa : sa;
  }
}
}  // namespace

cudaError_t launch_reference_gemm(const __nv_bfloat16* A, int64_t lda, const __nv_bfloat16* B,
                                  int64_t ldb, GemmLayoutB b_layout, int M, int N, int K,
                                  float* ref, float* absdot, bool accumulate,
                                  cudaStream_t stream) {
  if (M < 0 || N < 0 || K < 0) return cudaErrorInvalidValue;
  if (M > 0 && N > 0 && (A == nullptr || B == nullptr || ref == nullptr)) {
    return cudaErrorInvalidValue;
  }
  if (M == 0 || N == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(ceil_div(N, 128)),
                  static_cast<unsigned>(std::min(M, 65535)));
  reference_gemm_kernel<<<grid, 128, 0, stream>>>(A, lda, B, ldb, b_layout == GemmLayoutB::kKN, M,
                                                  N, K, ref, absdot, accumulate);
  return cudaGetLastError();
}

}  // namespace fusedcomm::kernels

#if defined(FC_GEMM_TRACE)
// Bench-only (fused_bench built with -DFC_GEMM_TRACE): the engine's trace points
// (detail/gemm_sm90.cuh, g_gemm_trace) of this file's fused kernels, the first `count`; zeroes
// them where host is null. gemm.cu's fc_gemm_trace_copy reads the plain GEMM's (its own copy
// of the symbol).
extern "C" int fc_fused_gemm_trace_copy(uint64_t* host, size_t count) {
  namespace d = fusedcomm::kernels::detail;
  return d::trace_copy(d::g_gemm_trace, host, count * sizeof(uint64_t));
}
#endif
