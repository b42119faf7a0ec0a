// Ours side of the fused-op benchmark: one forked process per GPU (process_group.h), for every
// shape (shapes below, the same list as torch_baselines.py) and op:
//   ours_fused        the fused kernel (FusedAlgo::kFused)
//   ours_decomposed   launch_gemm + launch_collective (FusedAlgo::kDecomposed)
//   ours_gemm         the rank's GEMM alone (launch_gemm, same local shape)
//   ours_collective   the exchange alone (allGather of A in bf16; reduceScatter of the
//                     partials, what the decomposed path moves; for gemmAllReduce, their
//                     allReduce)
// gemmAllReduce (--ops ar; not in the default ag,rs) runs on gemmReduceScatter's shapes: its
// ours_fused is the fused gemmReduceScatter then an allGather, ours_decomposed our GEMM then
// our allReduce (fused.h, launch_gemm_all_reduce); no phantom peers for it.
// gemmReduceScatter's (and gemmAllReduce's) partials are fp32 unless --rs-partials bf16 (RsPartials::kBF16, the
// baselines' numerics: ours_fused, ours_decomposed, ours_gemm's C and ours_collective all
// switch) or f32any (RsPartials::kF32AnyOrder: fp32, the fused kernel at W >= 3 adds into one
// slot per owner); rows carry "partials". allGatherGemm returns the gathered A (the baselines do too)
// unless --ag-gathered 0 (the forward-only case: the fused kernel then reads the M-blocks made
// only of own rows from A_r and copies just the rest of them); rows carry "ag_gathered".
// Timing, per shape: for each impl 2 warm-up launches and one timed launch to size its batches,
// then `batches` rounds in which every impl runs one batch of `iters` back-to-back launches
// between CUDA events on rank 0 (a process-group barrier and a stream sync before each batch;
// the impls interleaved so that they share the clock's drift); ms_median = median over an
// impl's batches of the per-launch mean; ms_ranks = every rank's own median (its events). One
// JSON object per line to --out (report.py joins it with torch_baselines.py's rows).
// Usage: fused_bench --world W --out ours.jsonl [--quick] [--ops ag,rs,ar] [--ctas N (allGatherGemm)]
//                    [--batch-ms 25] [--batches 7] [--rs-partials f32|bf16|f32any] [--tp T]
//                    [--ag-gathered 1|0] [--shape LABEL_PART] [--alternate] [--phantom-world P]
//                    [--shared-gpu] [--print-batches] [--clocks] [--split-decomposed]
//                    [--sustain-ms MS] [--ag-exchange auto|sm|ce]
// --sustain-ms MS: each impl in turn runs back to back for MS ms, then its batches follow one
// after another (no other impl in between), instead of the batches round robin over the impls:
// every impl is timed at the clock its own power draw sustains on a power-capped GPU (the
// protocol of torch_baselines.py --sustain-ms; kernels/bench/fused/NOTES.md, "Run 14"). With
// --clocks the sustained run's second half is sampled too, so that a long MS (2000+) makes
// NVML's power reading (a ~1 s average) the impl's own: a power probe.
// --clocks: every rank samples its GPU's SM clock and power through NVML while each batch runs
// (gpu_clocks.h) and prints, per shape and impl, the mean clock (min-max), power and
// clock-event reasons: is a fused kernel's time over our GEMM alone a lower clock?
// --split-decomposed: every rank also runs the decomposed path's two launches in its order, back
// to back with events between them, and prints each part's median time inside that sequence.
// --print-batches: every rank prints, per shape and impl, its batches' per-launch times in the
// order they ran (does a process stay in one mode?).
// --shared-gpu: every rank on GPU 0 (a one-GPU host checks the bench's own mechanics at W > 1;
// the ranks time-slice the GPU, so the timings mean nothing).
// --alternate: ours_fused and ours_gemm only, alternating launch by launch with one event pair
// per launch (neither runs right after itself), instead of batches of one impl (time_ops).
// --tp T (default W): the shapes of tensor parallelism T while running at world W. With W = 1
// and T = 2 or 4 the fused kernels run on one GPU with the local shapes of TP T: every cost
// except NVLink (the GEMM role's epilogue, flags, claims), so
// their local overhead is measurable on a one-GPU host; rows carry "tp" (local_run.sh).
// Debug build: -DFUSEDCOMM_AG_TRACE (FC_NVCC_FLAGS of build.sh) prints, per shape and rank, the
// timeline of a fused allGatherGemm launch after a barrier and one after 20 back-to-back launches. Bench build: -DFUSEDCOMM_PHANTOM_PEER makes ours_fused at world
// 1 run either fused kernel as rank 0 of W = P (--phantom-world P, 2..8, default 2) with this
// process as every peer (what W = P costs on the SMs without NVLink; detail/fused_gemm.cuh);
// rows carry "phantom_world" (0 in other builds). Bench build: -DFC_GEMM_TRACE prints, per shape
// and rank, where the GEMM engine's consumers spend a launch of ours_gemm and of ours_fused
// (engine_trace).
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/collectives/collectives.h"
#include "kernels/fused/fused.h"
#include "kernels/gemm/gemm.h"
#include "gpu_clocks.h"
#include "kernels/fused/detail/rs_trace.h"
#include "fusedcomm/runtime/symmetric_memory.h"
#include "process_group.h"

namespace k = fusedcomm::kernels;

namespace {

#define CK(x)                                                                           \
  do {                                                                                  \
    cudaError_t e_ = (x);                                                               \
    if (e_ != cudaSuccess)                                                              \
      throw std::runtime_error(std::string(#x) + ": " + cudaGetErrorString(e_));        \
  } while (0)

#ifdef FUSEDCOMM_PHANTOM_PEER
// Rank 0 of W = world whose peers' memory is this process's own (detail/fused_gemm.cuh).
k::CommDevice phantom_peer(const k::CommDevice& dev, int world) {
  k::CommDevice ph = dev;
  ph.world = world;
  for (int i = 1; i < world; ++i) ph.base[i] = ph.base[0];
  return ph;
}
constexpr bool kPhantomBuild = true;
#else
constexpr bool kPhantomBuild = false;
#endif

// ---- shapes (keep in sync with torch_baselines.py: shapes()) --------------------------------
// Llama MLP layers under tensor parallelism TP = world:
//   allGatherGemm      = the fused gate+up projection: K = hidden, N_r = 2 * ffn / TP
//   gemmReduceScatter  = the down projection: K_r = ffn / TP, N = hidden
// Square: S x S x S split over TP: allGatherGemm M = K = S, N_r = S / TP; gemmReduceScatter
// M = N = S, K_r = S / TP. Quick mode: M in {2048, 8192} and square 8192.
struct Shape {
  std::string label;  // e.g. "llama3-70b M=8192"
  std::string op;     // "allGatherGemm" / "gemmReduceScatter" / "gemmAllReduce"
  int M, N, K;        // N = N_r (AG) or N (RS, AR); K = K (AG) or K_r (RS, AR)
};

std::vector<Shape> shapes(int tp, bool quick) {
  struct Model {
    const char* name;
    int hidden, ffn;
  };
  const Model models[] = {{"llama3-8b", 4096, 14336}, {"llama3-70b", 8192, 28672}};
  std::vector<int> ms = {1024, 2048, 4096, 8192, 16384};
  if (quick) ms = {2048, 8192};
  std::vector<Shape> v;
  for (const Model& m : models) {
    for (int M : ms) {
      const std::string label = std::string(m.name) + " M=" + std::to_string(M);
      v.push_back({label, "allGatherGemm", M, 2 * m.ffn / tp, m.hidden});
      v.push_back({label, "gemmReduceScatter", M, m.hidden, m.ffn / tp});
      v.push_back({label, "gemmAllReduce", M, m.hidden, m.ffn / tp});
    }
  }
  std::vector<int> squares = {8192, 16384};
  if (quick) squares = {8192};
  for (int S : squares) {
    const std::string label = "square S=" + std::to_string(S);
    v.push_back({label, "allGatherGemm", S, S / tp, S});
    v.push_back({label, "gemmReduceScatter", S, S, S / tp});
    v.push_back({label, "gemmAllReduce", S, S, S / tp});
  }
  return v;
}

// Fills n bf16 elements with values from a random pool (uniform [-1, 1)): the GEMM's power
// draw, and so its clock, depends on the data (zeros run faster).
void fill_random(void* dst, size_t n, const std::vector<__nv_bfloat16>& pool) {
  size_t done = 0;
  while (done < n) {
    const size_t c = std::min(pool.size(), n - done);
    CK(cudaMemcpy(static_cast<__nv_bfloat16*>(dst) + done, pool.data(), c * 2, cudaMemcpyHostToDevice));
    done += c;
  }
  CK(cudaDeviceSynchronize());  // the last DMA has landed before any stream reads it
}

struct Options {
  int world = 2;
  int tp = 0;  // 0: the world size
  bool quick = false;
  bool ag = true, rs = true, ar = false;  // --ops: any of ag, rs, ar
  int ctas = 0;
  double batch_ms = 25;
  int batches = 7;
  std::string out = "ours.jsonl";
  std::string rs_partials = "f32";  // --rs-partials f32|bf16|f32any (rows carry it)
  k::RsPartials rs_code = k::RsPartials::kF32;
  bool rs_bf16() const { return rs_code == k::RsPartials::kBF16; }
  bool ag_gathered = true;  // --ag-gathered 0: allGatherGemm without the gathered A output
  // --ag-exchange auto|sm|ce: the fused allGatherGemm's exchange (kernels/fused.h AgExchange;
  // the bench passes side streams, as DeviceComm does, so auto may take the copy engines)
  k::AgExchange ag_exchange = k::AgExchange::kAuto;
  std::string shape;        // --shape S: only the shapes whose label contains S (or a|b|...)
  bool alternate = false;   // --alternate: impls alternate launch by launch (time_ops)
  int phantom_world = 2;    // --phantom-world P: the phantom-peer build's world (2..8)
  bool shared_gpu = false;  // --shared-gpu: every rank on GPU 0 (the bench's mechanics only)
  bool print_batches = false;  // --print-batches: every rank prints each impl's batch times
  bool clocks = false;         // --clocks: NVML samples of the SM clock during each batch
  bool split_decomposed = false;  // --split-decomposed: the decomposed pair with events between
  double sustain_ms = 0;          // --sustain-ms: per impl, a sustained run, then its batches
};

// --shape: "8b M=1024|square" keeps the labels that contain any of the '|'-separated parts.
bool label_matches(const std::string& label, const std::string& filter) {
  size_t b = 0;
  for (;;) {
    const size_t e = std::min(filter.find('|', b), filter.size());
    if (label.find(filter.substr(b, e - b)) != std::string::npos) return true;
    if (e == filter.size()) return false;
    b = e + 1;
  }
}

const char* algo_name(k::FusedAlgo a) {
  return a == k::FusedAlgo::kFused ? "fused" : a == k::FusedAlgo::kDecomposed ? "decomposed" : "auto";
}

#ifdef FUSEDCOMM_AG_TRACE
// Debug builds: three launches (two to warm up), each after a barrier with the timeline zeroed.
void traced_launches(fusedcomm::testing::ProcessGroup& g, cudaStream_t st, void* timeline,
                     size_t bytes, const std::function<void()>& launch) {
  for (int i = 0; i < 3; ++i) {
    CK(cudaStreamSynchronize(st));
    g.barrier();
    CK(cudaMemsetAsync(timeline, 0, bytes, st));
    launch();
  }
  CK(cudaStreamSynchronize(st));
}
#endif

#ifdef FUSEDCOMM_AG_TRACE
// Debug build (-DFUSEDCOMM_AG_TRACE): the fused allGatherGemm's timeline (layout: fused_gemm.cuh,
// ag_trace), twice: "isolated" (two warm-ups, then one launch, each after a barrier) and "b2b"
// (20 launches back to back, the timeline zeroed on the stream, one more launch: the state the
// bench's batches time). Every rank prints its own, in rank order.
void trace_ag(fusedcomm::testing::ProcessGroup& g, const k::CommDevice& dev, k::AgGemmArgs a,
              cudaStream_t st, const std::string& label) {
  a.algo = k::FusedAlgo::kFused;
  const k::FusedLaunchInfo info = k::all_gather_gemm_info(dev, a);
  const int64_t mb = (a.M + 127) / 128, nb = (a.N + info.tile_n - 1) / info.tile_n;
  const int P = info.comm_ctas, C = info.chunks;
  // Layout (fused_gemm.cuh): tile waits, chunk flags, pullers' [start, end), pullers' SM ids,
  // every CTA's entry time.
  const int64_t tiles_words = 2 * mb * 4096, smid_at = tiles_words + C + 2 * P;
  const int64_t words = smid_at + P + info.gemm_ctas + P;
  uint8_t* tr = dev.base[dev.rank] + dev.scratch_offset;
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  for (int mode = 0; mode < 2; ++mode) {
    float launch_ms = 0;
    if (mode == 0) {
      traced_launches(g, st, tr, words * 8, [&] { CK(k::launch_all_gather_gemm(dev, a, st)); });
    } else {
      CK(cudaStreamSynchronize(st));
      g.barrier();
      for (int i = 0; i < 20; ++i) CK(k::launch_all_gather_gemm(dev, a, st));
      CK(cudaMemsetAsync(tr, 0, words * 8, st));
      CK(cudaEventRecord(e0, st));
      CK(k::launch_all_gather_gemm(dev, a, st));
      CK(cudaEventRecord(e1, st));
      CK(cudaStreamSynchronize(st));
      CK(cudaEventElapsedTime(&launch_ms, e0, e1));
    }
    std::vector<uint64_t> t(words);
    CK(cudaMemcpy(t.data(), tr, words * 8, cudaMemcpyDeviceToHost));
    uint64_t t0 = UINT64_MAX, t_end = 0;
    for (int64_t i = 0; i < words; ++i) {
      if (i >= smid_at && i < smid_at + P) continue;  // SM ids, not times
      if (t[i]) t0 = std::min(t0, t[i]), t_end = std::max(t_end, t[i]);
    }
    auto us = [&](uint64_t v) { return v ? (v - t0) / 1000.0 : -1.0; };
    const uint64_t* chunk = t.data() + tiles_words;
    const uint64_t* pull = chunk + C;
    const uint64_t* smid = t.data() + smid_at;
    const uint64_t* entry = smid + P;
    std::string o;
    char buf[256];
    auto add = [&](const char* fmt, auto... v) { std::snprintf(buf, sizeof buf, fmt, v...); o += buf; };
    // The launch may run fewer GEMM CTAs than info.gemm_ctas (never more than the tiles):
    // every CTA writes its entry, and the pulling CTAs are the grid's last P.
    int grid = 0;
    while (grid < info.gemm_ctas + P && entry[grid]) ++grid;
    double gmin = 1e30, gmax = 0, pmin = 1e30, pmax = 0;
    for (int c = 0; c < grid; ++c) {
      double& lo = c < grid - P ? gmin : pmin;
      double& hi = c < grid - P ? gmax : pmax;
      lo = std::min(lo, us(entry[c])), hi = std::max(hi, us(entry[c]));
    }
    double wait_sum = 0, wait_max = 0;
    int waited = 0;
    for (int64_t i = 0; i < mb * nb; ++i) {
      if (t[2 * i] == 0) continue;
      const double w = (t[2 * i + 1] - t[2 * i]) / 1000.0;
      wait_sum += w;
      if (w > 5) ++waited;
      wait_max = std::max(wait_max, w);
    }
    add("ag_trace %s %s rank %d (G %d + P %d, tile_n %d, %d chunks): span %.1f us",
        mode ? "b2b" : "isolated", label.c_str(), g.rank, info.gemm_ctas, P, info.tile_n, C,
        (t_end - t0) / 1000.0);
    if (mode) add(", launch %.1f us (events)", launch_ms * 1000.0);
    add("; entry gemm %.1f-%.1f pull %.1f-%.1f; tiles waiting > 5 us %d, sum %.0f, max %.1f\n",
        gmin, gmax, pmin, pmax, waited, wait_sum, wait_max);
    o += "  pullers start/end us @sm:";
    for (int j = 0; j < P; ++j) add(" %.0f/%.0f@%llu", us(pull[2 * j]), us(pull[2 * j + 1]), (unsigned long long)smid[j]);
    o += "\n  chunk flags us (chunk:t):";
    for (int c = 0; c < C; ++c) add(" %d:%.0f", c, us(chunk[c]));
    o += "\n";
    for (int r = 0; r < g.world; ++r) {
      g.barrier();
      if (r == g.rank) {
        std::fputs(o.c_str(), stdout);
        std::fflush(stdout);
      }
    }
    g.barrier();
  }
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
}
#endif


#ifdef FUSEDCOMM_RS_TRACE
// Bench build (-DFUSEDCOMM_RS_TRACE): the fused gemmReduceScatter's wait counters
// (detail/fused_gemm.cuh, RsTraceWord) over 10 launches after 2 warm-ups, each launch after a
// barrier; rank 0 prints per rank the mean per launch, in µs at the device's rated clock
// (clocks under load may be lower: compare the columns with each other, and the span).
void trace_rs(fusedcomm::testing::ProcessGroup& g, const k::CommDevice& dev, k::GemmRsArgs a,
              cudaStream_t st, const std::string& label) {
  constexpr int kWords = k::detail::kRsTraceWords, kLaunches = 10;
  a.algo = k::FusedAlgo::kFused;
  std::vector<double> sum(kWords, 0.0);
  std::vector<unsigned long long> w(kWords);
  for (int i = -2; i < kLaunches; ++i) {
    CK(cudaStreamSynchronize(st));
    g.barrier();
    CK(k::launch_gemm_reduce_scatter(dev, a, st));
    CK(k::rs_trace_take(w.data(), kWords, st));
    CK(cudaStreamSynchronize(st));
    if (i < 0) continue;
    for (int j = 0; j < kWords; ++j) {
      sum[j] += j == k::detail::kRtEndNs ? static_cast<double>(w[j] - w[k::detail::kRtStartNs])
                                         : static_cast<double>(w[j]);
    }
  }
  std::vector<uint8_t> mine(kWords * sizeof(double));
  std::memcpy(mine.data(), sum.data(), mine.size());
  const auto all = g.all_gather(mine);
  if (g.rank != 0) return;
  int khz = 0, dv = 0;
  CK(cudaGetDevice(&dv));
  CK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, dv));
  for (int r = 0; r < g.world; ++r) {
    std::vector<double> v(kWords);
    std::memcpy(v.data(), all[r].data(), mine.size());
    for (double& x : v) x /= kLaunches;
    namespace d = k::detail;
    auto us = [&](int j) { return v[j] / (khz * 1e-3); };  // cycles -> µs
    std::printf("rs_trace %s rank %d (per launch; waits summed over CTAs, µs at %d MHz): span %.1f us;"
                " handoff waits %.1f (%.0f > 1 us); own: freed %.1f, flags %.1f over %.0f half-tiles"
                " (%.0f > 1 us, max %.1f); pusher: start %.1f, stores %.1f, fence+flags %.1f over"
                " %.0f handoffs; finish max %.1f\n",
                label.c_str(), r, khz / 1000, v[d::kRtEndNs] / 1000.0, us(d::kRtHandoffWait),
                v[d::kRtHandoffWaits], us(d::kRtOwnFreedWait), us(d::kRtOwnWait), v[d::kRtOwnTiles],
                v[d::kRtOwnWaits], us(d::kRtOwnWaitMax), us(d::kRtStartWait), us(d::kRtStores),
                us(d::kRtFenceFlags), v[d::kRtHandoffs], us(d::kRtFinishMax));
  }
  std::fflush(stdout);
}
#endif

#if defined(FC_GEMM_TRACE)
extern "C" int fc_gemm_trace_copy(uint64_t* host, size_t count);        // gemm.cu
extern "C" int fc_fused_gemm_trace_copy(uint64_t* host, size_t count);  // fused.cu
// Bench build (-DFC_GEMM_TRACE): where the GEMM engine's consumers spend one launch (the last of
// 5 back to back after a barrier; detail/gemm_sm90.cuh's trace points, warpgroup 0 of each CTA),
// for ours_gemm and ours_fused of the same shape: does the fused kernel's excess over the GEMM
// alone sit in its tiles' main loops, its epilogues, the waits for a tile's first stage, or a
// tail? Every rank prints its own line: µs from the earliest CTA start; per tile after a CTA's
// first, the mean gap between one tile's last wgmma and the next one's first (its epilogue and
// its first-stage wait inside), and the mean main loop (the rest).
// `before` (optional): a launch enqueued before each traced one (--split-decomposed: the
// collective, so that the GEMM is traced where the decomposed path runs it).
void engine_trace(fusedcomm::testing::ProcessGroup& g, cudaStream_t st, const std::string& what,
                  const std::function<void()>& launch, bool fused,
                  const std::function<void()>& before = {}) {
  // Points per warpgroup: detail::kGemmTraceWords (gemm_sm90.cuh, not included here).
  constexpr int kCtas = 1024, kPoints = 12, kWords = kCtas * 2 * kPoints;
  std::vector<uint64_t> tr(kWords, 0);
  auto copy = [&](uint64_t* h) {
    return static_cast<cudaError_t>(fused ? fc_fused_gemm_trace_copy(h, kWords)
                                          : fc_gemm_trace_copy(h, kWords));
  };
  CK(cudaStreamSynchronize(st));
  g.barrier();
  CK(copy(nullptr));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  for (int i = 0; i < 5; ++i) {
    if (before) before();
    if (i == 4) CK(cudaEventRecord(e0, st));
    launch();
  }
  CK(cudaEventRecord(e1, st));
  CK(cudaStreamSynchronize(st));
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, e0, e1));
  CK(copy(tr.data()));
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  auto at = [&](int c, int point) { return tr[(c * 2) * kPoints + point]; };
  uint64_t t0 = ~0ull;
  int ctas = 0;
  for (int c = 0; c < kCtas; ++c) {
    if (at(c, 0) == 0) continue;
    t0 = std::min(t0, at(c, 0));
    ++ctas;
  }
  if (ctas == 0) {
    std::printf("engine_trace %s rank %d: no trace points\n", what.c_str(), g.rank);
    return;
  }
  std::vector<double> start, whole, end, mhz;
  double gap = 0, epi = 0, wait = 0, gaps = 0;
  for (int c = 0; c < kCtas; ++c) {
    if (at(c, 0) == 0) continue;
    start.push_back((at(c, 0) - t0) * 1e-3);
    whole.push_back((at(c, 1) - t0) * 1e-3);
    end.push_back((at(c, 4) - t0) * 1e-3);
    // Cycles over nanoseconds between points 0 and 1 (points 10 and 11: clock64 there).
    if (at(c, 1) > at(c, 0)) mhz.push_back(1e3 * (at(c, 11) - at(c, 10)) / (at(c, 1) - at(c, 0)));
    gap += at(c, 6), epi += at(c, 8), wait += at(c, 9), gaps += at(c, 7);
  }
  auto q = [](std::vector<double> v, double f) {
    std::sort(v.begin(), v.end());
    return v[std::min(v.size() - 1, static_cast<size_t>(f * v.size()))];
  };
  const double per = gaps > 0 ? 1e-3 / gaps : 0.0;
  // Whole tiles of the median CTA: its time from start to the end of its tiles over its tiles.
  const double tiles = gaps / ctas + 1;
  const double clock = mhz.empty() ? 0.0 : q(mhz, 0.5);
  std::printf("engine_trace %s rank %d: launch %.1f us, %d CTAs, %.2f tiles each, SM clock p50 "
              "%.0f MHz; start p50/max "
              "%.1f/%.1f; tiles done min/p50/max %.1f/%.1f/%.1f; end p50/max %.1f/%.1f; per tile: "
              "gap %.2f us (epilogue %.2f, first-stage wait %.2f), main loop %.2f us\n",
              what.c_str(), g.rank, ms * 1e3, ctas, tiles, clock, q(start, 0.5), q(start, 1.0),
              q(whole, 0.0), q(whole, 0.5), q(whole, 1.0), q(end, 0.5), q(end, 1.0), gap * per,
              epi * per, wait * per, (q(whole, 0.5) - q(start, 0.5)) / tiles - gap * per);
  std::fflush(stdout);
}
#endif

int bench(fusedcomm::testing::ProcessGroup& g, const Options& o) {
  const int W = g.world, r = g.rank;
  // The world the fused launches run at: the phantom build's at world 1, else W.
  const int Wf = kPhantomBuild && W == 1 ? o.phantom_world : W;
  CK(cudaSetDevice(o.shared_gpu ? 0 : r));
  std::vector<Shape> list = shapes(o.tp > 0 ? o.tp : W, o.quick);
  list.erase(std::remove_if(list.begin(), list.end(),
                            [&](const Shape& s) {
                              const bool on = s.op == "allGatherGemm"       ? o.ag
                                              : s.op == "gemmReduceScatter" ? o.rs
                                                                            : o.ar;
                              return !on || !label_matches(s.label, o.shape);
                            }),
             list.end());
  if (list.empty()) throw std::runtime_error("no shape matches --shape " + o.shape);

  // Sizes: the largest of every buffer over the shapes. Data area: the allGatherGemm inputs
  // from offset 0, the gemmReduceScatter fp32 workspace above them (so that the partials never
  // overwrite the bf16 inputs with arbitrary bit patterns).
  uint64_t ag_data = 0, rs_data = 0, scratch = 0;
  size_t a_max = 0, b_max = 0, c_max = 0, g_max = 0, sums_max = 0;
  for (const Shape& s : list) {
    const size_t M = s.M, N = s.N, K = s.K;
    if (s.op == "allGatherGemm") {
      k::AgGemmArgs a;
      a.M = s.M;
      a.N = s.N;
      a.K = s.K;
      // The bench passes its own buffer, unless --ag-gathered 0 (then scratch holds it).
      a.gathered = o.ag_gathered ? reinterpret_cast<__nv_bfloat16*>(16) : nullptr;
      for (int w : {W, Wf}) {  // the world-1 impls and the phantom's fused launch
        const k::FusedWorkspace ws = k::all_gather_gemm_workspace(a, w);
        ag_data = std::max(ag_data, ws.data_bytes);
        scratch = std::max(scratch, ws.scratch_bytes);
      }
      b_max = std::max(b_max, N * K);
      c_max = std::max(c_max, M * N);
      g_max = std::max(g_max, M * K);
    } else if (s.op == "gemmAllReduce") {
      // Its workspace above the allGatherGemm inputs, like gemmReduceScatter's (both paths).
      k::GemmArArgs a;
      a.M = s.M;
      a.N = s.N;
      a.K = s.K;
      a.partials = o.rs_code;
      const k::FusedWorkspace ws = k::gemm_all_reduce_workspace(a, W);
      // ours_gemm and ours_collective use the product's place and the allReduce's scratch at
      // any world (at world 1 the op itself needs neither).
      const uint64_t product = uint64_t{M} * N * (o.rs_bf16() ? 2 : 4);
      rs_data = std::max({rs_data, ws.data_bytes, product});
      scratch = std::max({scratch, ws.scratch_bytes, product});
      a_max = std::max(a_max, M * K);
      b_max = std::max(b_max, N * K);
      c_max = std::max(c_max, M * N);
      sums_max = std::max(sums_max, M * N);
    } else {
      k::GemmRsArgs a;
      a.M = s.M;
      a.N = s.N;
      a.K = s.K;
      for (int w : {W, Wf}) {
        const k::FusedWorkspace ws = k::gemm_reduce_scatter_workspace(a, w);
        rs_data = std::max(rs_data, ws.data_bytes);
        scratch = std::max(scratch, ws.scratch_bytes);
      }
      a_max = std::max(a_max, M * K);
      b_max = std::max(b_max, N * K);
      c_max = std::max(c_max, (M + W - 1) / W * N);
    }
  }
  const uint64_t ws_offset = (ag_data + 4095) / 4096 * 4096;
  const uint64_t data_need = std::max(ws_offset + rs_data, scratch);
  fusedcomm::SymmetricConfig cfg;
  cfg.data_bytes = (data_need + 4095) / 4096 * 4096;
  cfg.allow_shared_gpu = o.shared_gpu;
  auto sm = std::make_unique<fusedcomm::SymmetricMemory>(r, W, cfg);
  k::FusedSideStreams side;  // allGatherGemm's copy-engine exchange (--ag-exchange)
  sm->connect(g.all_gather(sm->export_handle()));
  const k::CommDevice& dev = sm->device();

  void *A, *B, *C, *G, *S = nullptr;
  if (sums_max > 0) CK(cudaMalloc(&S, sums_max * 4));
  CK(cudaMalloc(&A, std::max<size_t>(a_max, 8) * 2));
  CK(cudaMalloc(&B, b_max * 2));
  CK(cudaMalloc(&C, c_max * 2 + 256));
  CK(cudaMalloc(&G, g_max * 2 + 256));
  {
    std::mt19937_64 rng(1234 + r);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    std::vector<__nv_bfloat16> pool(16 << 20);
    for (auto& x : pool) x = __float2bfloat16_rn(u(rng));
    fill_random(A, std::max<size_t>(a_max, 8), pool);
    fill_random(B, b_max, pool);
    fill_random(sm->data(), ws_offset / 2, pool);  // the allGatherGemm inputs
    // ours_gemm of allGatherGemm reads G, which the fused and decomposed ops write only when
    // they return the gathered A: never zeros (a GEMM of zeros draws less power and clocks
    // higher; it ran ~15 % faster on 1 x H200).
    fill_random(G, g_max, pool);
  }
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  FILE* f = r == 0 ? std::fopen(o.out.c_str(), "w") : nullptr;
  char device[256] = {};
  {
    cudaDeviceProp p;
    CK(cudaGetDeviceProperties(&p, o.shared_gpu ? 0 : r));
    std::snprintf(device, sizeof device, "%s", p.name);
  }
  fusedcomm::bench::GpuClocks clocks;
  if (o.clocks) {
    char pci[32] = {};
    CK(cudaDeviceGetPCIBusId(pci, sizeof pci, o.shared_gpu ? 0 : r));
    if (!clocks.open(pci)) std::printf("rank %d: --clocks: NVML not available, no samples\n", r);
  }

  // Times the impls of one shape; every rank runs the same sequence. Each impl: 2 warm-up
  // launches and one timed launch that sizes its batches (rank 0's estimate, shared); then the
  // batches run round robin over the impls, so that every impl sees the same clocks and
  // temperature (the sustained clock drifts by several % while a shape is timed). Returns per
  // impl the median over its batches of the per-launch mean; `iters` gets the batch sizes.
  auto time_ops = [&](const std::vector<std::function<void()>>& launches, std::vector<int>& iters,
                      const std::string& what) {
    const size_t n = launches.size();
    iters.assign(n, 1);
    std::vector<float> one_ms(n, 1.0f);  // rank 0's time of one launch, per impl
    for (size_t i = 0; i < n; ++i) {
      g.barrier();
      for (int w = 0; w < 2; ++w) launches[i]();
      CK(cudaStreamSynchronize(st));
      g.barrier();
      CK(cudaEventRecord(e0, st));
      launches[i]();
      CK(cudaEventRecord(e1, st));
      CK(cudaEventSynchronize(e1));
      float one = 0;
      CK(cudaEventElapsedTime(&one, e0, e1));
      std::vector<uint8_t> mine(sizeof(float));
      std::memcpy(mine.data(), &one, sizeof one);
      const auto all = g.all_gather(mine);
      std::memcpy(&one, all[0].data(), sizeof one);
      one_ms[i] = std::max(one, 1e-3f);
      iters[i] = std::clamp(static_cast<int>(o.batch_ms / one_ms[i]), 1, 200);
    }
    std::vector<std::vector<double>> per(n);
    auto batch = [&](size_t i) {  // one timed batch of impl i
      CK(cudaStreamSynchronize(st));
      g.barrier();
      CK(cudaEventRecord(e0, st));
      for (int k = 0; k < iters[i]; ++k) launches[i]();
      CK(cudaEventRecord(e1, st));
      while (clocks.on() && cudaEventQuery(e1) == cudaErrorNotReady) clocks.sample(i);
      CK(cudaEventSynchronize(e1));
      float ms = 0;
      CK(cudaEventElapsedTime(&ms, e0, e1));
      per[i].push_back(ms / iters[i]);
      sm->raise_if_failed();
    };
    if (o.alternate) {
      // Launch by launch: impl 0, 1, ..., n-1, 0, 1, ... with one event pair per launch and no
      // sync in between, so that every impl follows another kernel. (What runs just before a
      // GEMM changed its time by up to ~10 % on 1 x H200: NOTES.md.) A batch takes the
      // smallest of the impls' batch sizes, which `iters` then reports; per impl its mean
      // per-launch time.
      const int k_iters = *std::min_element(iters.begin(), iters.end());
      iters.assign(n, k_iters);
      std::vector<cudaEvent_t> ev(2 * n * k_iters);
      for (cudaEvent_t& e : ev) CK(cudaEventCreate(&e));
      for (int b = 0; b < o.batches; ++b) {
        CK(cudaStreamSynchronize(st));
        g.barrier();
        for (int k = 0; k < k_iters; ++k) {
          for (size_t i = 0; i < n; ++i) {
            CK(cudaEventRecord(ev[2 * (k * n + i)], st));
            launches[i]();
            CK(cudaEventRecord(ev[2 * (k * n + i) + 1], st));
          }
        }
        CK(cudaStreamSynchronize(st));
        sm->raise_if_failed();
        for (size_t i = 0; i < n; ++i) {
          double sum = 0;
          for (int k = 0; k < k_iters; ++k) {
            float ms = 0;
            CK(cudaEventElapsedTime(&ms, ev[2 * (k * n + i)], ev[2 * (k * n + i) + 1]));
            sum += ms;
          }
          per[i].push_back(sum / k_iters);
        }
      }
      for (cudaEvent_t& e : ev) CK(cudaEventDestroy(e));
    } else if (o.sustain_ms > 0) {  // impl by impl, each after a sustained run of its own
      for (size_t i = 0; i < n; ++i) {
        const int k_sustain = static_cast<int>(o.sustain_ms / one_ms[i]) + 1;
        CK(cudaStreamSynchronize(st));
        g.barrier();
        // With --clocks the second half of the sustained run is sampled too: NVML's power
        // reading averages over about a second, so a long --sustain-ms (2000+) makes it this
        // impl's own.
        for (int k = 0; k < k_sustain / 2; ++k) launches[i]();
        CK(cudaEventRecord(e0, st));
        for (int k = k_sustain / 2; k < k_sustain; ++k) launches[i]();
        CK(cudaEventRecord(e1, st));
        if (clocks.on()) {
          CK(cudaEventSynchronize(e0));
          while (cudaEventQuery(e1) == cudaErrorNotReady) clocks.sample(i);
        }
        for (int b = 0; b < o.batches; ++b) batch(i);
      }
    } else {  // round robin
      for (int b = 0; b < o.batches; ++b) {
        for (size_t i = 0; i < n; ++i) batch(i);
      }
    }
    if (clocks.on()) {  // one line per rank and impl; the samples start afresh per shape
      for (size_t i = 0; i < n; ++i) {
        std::printf("clocks %s impl %zu rank %d: %s\n", what.c_str(), i, r,
                    clocks.summary(i).c_str());
      }
      std::fflush(stdout);
      clocks.reset();
    }
    if (o.print_batches) {  // in batch order, before the sort; one line per rank and impl
      for (size_t i = 0; i < n; ++i) {
        std::string line = "batches " + what + " impl " + std::to_string(i) + " rank " +
                           std::to_string(r) + " ms:";
        char b[32];
        for (double v : per[i]) std::snprintf(b, sizeof b, " %.4f", v), line += b;
        std::printf("%s\n", line.c_str());
      }
      std::fflush(stdout);
    }
    std::vector<double> med(n);
    for (size_t i = 0; i < n; ++i) {
      std::sort(per[i].begin(), per[i].end());
      med[i] = per[i][per[i].size() / 2];
    }
    return med;
  };

  for (const Shape& s : list) {
    const bool is_ag = s.op == "allGatherGemm", is_ar = s.op == "gemmAllReduce";
    const double flops = 2.0 * s.M * s.N * s.K;  // per rank
    // NVLink bytes into this rank: the peers' rows of A (bf16) or of the partials (and for
    // gemmAllReduce, as an allReduce of the partials: their reduce-scatter, then the gather).
    const double partial_bytes = o.rs_bf16() ? 2.0 : 4.0;
    const double wire = is_ag   ? (W - 1.0) / W * s.M * s.K * 2.0
                        : is_ar ? 2.0 * (W - 1.0) / W * s.M * s.N * partial_bytes
                                : (W - 1.0) / W * s.M * s.N * partial_bytes;
    k::AgGemmArgs ag;
    k::GemmRsArgs rs;
    if (is_ag) {
      ag.M = s.M;
      ag.N = s.N;
      ag.K = s.K;
      ag.in_offset = 0;
      ag.B = static_cast<const __nv_bfloat16*>(B);
      ag.C = static_cast<__nv_bfloat16*>(C);
      ag.gathered = o.ag_gathered ? static_cast<__nv_bfloat16*>(G) : nullptr;
      ag.comm_ctas = o.ctas;
      ag.exchange = o.ag_exchange;
      ag.side = o.shared_gpu ? nullptr : &side;  // (a copy within one GPU may need SMs)
    } else {
      rs.M = s.M;
      rs.N = s.N;
      rs.K = s.K;
      rs.A = static_cast<const __nv_bfloat16*>(A);
      rs.B = static_cast<const __nv_bfloat16*>(B);
      rs.ws_offset = ws_offset;
      rs.out = static_cast<__nv_bfloat16*>(C);
      rs.partials = o.rs_code;
    }
    // gemmAllReduce: as gemmReduceScatter, into all of C (and its fp32 sums into S).
    k::GemmArArgs ar;
    ar.M = rs.M;
    ar.N = rs.N;
    ar.K = rs.K;
    ar.A = rs.A;
    ar.B = rs.B;
    ar.ws_offset = rs.ws_offset;
    ar.C = rs.out;
    ar.sums = static_cast<float*>(S);
    ar.partials = rs.partials;
    const k::FusedAlgo auto_algo = is_ag   ? k::all_gather_gemm_info(dev, ag).algo
                                   : is_ar ? k::gemm_all_reduce_info(dev, ar).algo
                                           : k::gemm_reduce_scatter_info(dev, rs).algo;
    struct Impl {
      const char* name;
      std::function<void()> launch;
      k::FusedLaunchInfo info;
    };
    std::vector<Impl> impls;
    // One impl of the op: its launch on device d with args, and what that launch does. The
    // phantom-peer build runs the fused kernel as rank 0 of W = Wf whose peers are this process
    // (detail/fused_gemm.cuh, FUSEDCOMM_PHANTOM_PEER); world 1 only.
    auto add_op = [&](const char* name, auto args, auto launch, auto info) {
      k::CommDevice d = dev;
#ifdef FUSEDCOMM_PHANTOM_PEER
      if (args.algo == k::FusedAlgo::kFused && W == 1) d = phantom_peer(dev, Wf);
#endif
      impls.push_back({name, [&, args, d, launch] { CK(launch(d, args, st)); }, info(d, args)});
    };
    for (k::FusedAlgo algo : {k::FusedAlgo::kFused, k::FusedAlgo::kDecomposed}) {
      const char* name = algo == k::FusedAlgo::kFused ? "ours_fused" : "ours_decomposed";
      if (is_ar) {
        // No phantom peers here: the allGather / allReduce would wait for them. The fused path
        // needs W to divide M (the allGather splits elements).
        if (algo == k::FusedAlgo::kFused && s.M % W != 0) continue;
        k::GemmArArgs a = ar;
        a.algo = algo;
        impls.push_back({name, [&, a] { CK(k::launch_gemm_all_reduce(dev, a, st)); },
                         k::gemm_all_reduce_info(dev, a)});
      } else if (is_ag) {
        k::AgGemmArgs a = ag;
        a.algo = algo;
        add_op(name, a, k::launch_all_gather_gemm, k::all_gather_gemm_info);
      } else {
        k::GemmRsArgs a = rs;
        a.algo = algo;
        add_op(name, a, k::launch_gemm_reduce_scatter, k::gemm_reduce_scatter_info);
      }
    }
    {
      k::GemmArgs gm;
      gm.A = is_ag ? static_cast<const __nv_bfloat16*>(G) : static_cast<const __nv_bfloat16*>(A);
      gm.lda = s.K;
      gm.B = static_cast<const __nv_bfloat16*>(B);
      gm.ldb = s.K;
      gm.M = s.M;
      gm.N = s.N;
      gm.K = s.K;
      if (is_ag) {
        gm.C = C;
        gm.ldc = s.N;
      } else {
        // The partial product as the decomposed path writes it, into the data area.
        gm.C = static_cast<uint8_t*>(sm->data()) + ws_offset;
        gm.ldc = s.N;
        gm.c_type = o.rs_bf16() ? k::GemmOutType::kBF16 : k::GemmOutType::kF32;
      }
      impls.push_back({"ours_gemm", [&, gm] { CK(k::launch_gemm(gm, st)); }, k::FusedLaunchInfo{}});
      k::CollectiveArgs ca;
      ca.op = is_ag ? k::CommOp::kAllGather : is_ar ? k::CommOp::kAllReduce : k::CommOp::kReduceScatter;
      ca.dtype = is_ag || o.rs_bf16() ? k::CommDtype::kBF16 : k::CommDtype::kF32;
      ca.count = static_cast<int64_t>(s.M) * (is_ag ? s.K : s.N);
      ca.in_offset = is_ag ? 0 : ws_offset;
      ca.output = is_ag   ? G
                  : is_ar ? (o.rs_bf16() ? C : S)
                          : reinterpret_cast<uint8_t*>(dev.base[r]) + dev.scratch_offset;
      impls.push_back({"ours_collective", [&, ca] { CK(k::launch_collective(dev, ca, st)); },
                       k::FusedLaunchInfo{}});
    }
#ifdef FUSEDCOMM_AG_TRACE
    if (is_ag) trace_ag(g, dev, ag, st, s.label);
#endif
#ifdef FUSEDCOMM_RS_TRACE
    if (!is_ag && !is_ar) {
      k::CommDevice d = dev;
#ifdef FUSEDCOMM_PHANTOM_PEER
      if (W == 1) d = phantom_peer(dev, Wf);  // a phantom build with the trace: rank 0's waits
#endif
      trace_rs(g, d, rs, st, s.label);
    }
#endif
#if defined(FC_GEMM_TRACE)
    // Twice, in both orders (what ran just before moves the clock).
    for (int round = 0; round < 2; ++round) {
      for (size_t j = 0; j < impls.size(); ++j) {
        const Impl& im = impls[round == 0 ? j : impls.size() - 1 - j];
        const std::string name = im.name;
        if (name == "ours_gemm" || (name == "ours_fused" && !is_ar)) {
          engine_trace(g, st, s.op + " " + s.label + " " + name, im.launch, name == "ours_fused");
        }
      }
    }
#endif
    if (o.alternate) {  // ours_fused and ours_gemm only: each runs right after the other
      impls.erase(std::remove_if(impls.begin(), impls.end(),
                                 [](const Impl& im) {
                                   return std::string(im.name) != "ours_fused" &&
                                          std::string(im.name) != "ours_gemm";
                                 }),
                  impls.end());
    }
    std::vector<std::function<void()>> launches;
    for (const Impl& im : impls) launches.push_back(im.launch);
    std::vector<int> iters_of;
    std::string what = s.op + " " + s.label + " (";
    for (size_t i = 0; i < impls.size(); ++i) what += (i ? "," : "") + std::string(impls[i].name);
    const std::vector<double> ms_of = time_ops(launches, iters_of, what + ")");
    if (o.split_decomposed && !is_ar) {
      // The decomposed path's two launches in its order (allGatherGemm: the allGather, then the
      // GEMM; gemmReduceScatter: the GEMM, then the reduceScatter), back to back, with events
      // between them: each part's time inside the sequence against its time alone.
      const auto find = [&](const char* name) {
        for (const Impl& im : impls) {
          if (std::string(im.name) == name) return im.launch;
        }
        return std::function<void()>{};
      };
      const std::function<void()> first = find(is_ag ? "ours_collective" : "ours_gemm");
      const std::function<void()> second = find(is_ag ? "ours_gemm" : "ours_collective");
      constexpr int kPairs = 40;
      std::vector<cudaEvent_t> ev(3 * kPairs);
      for (cudaEvent_t& e : ev) CK(cudaEventCreate(&e));
      CK(cudaStreamSynchronize(st));
      g.barrier();
      for (int i = 0; i < kPairs; ++i) {
        CK(cudaEventRecord(ev[3 * i], st));
        first();
        CK(cudaEventRecord(ev[3 * i + 1], st));
        second();
        CK(cudaEventRecord(ev[3 * i + 2], st));
      }
      CK(cudaStreamSynchronize(st));
      std::vector<double> a, b, whole;
      for (int i = kPairs / 4; i < kPairs; ++i) {  // the first quarter warms up
        float x = 0, y = 0, z = 0;
        CK(cudaEventElapsedTime(&x, ev[3 * i], ev[3 * i + 1]));
        CK(cudaEventElapsedTime(&y, ev[3 * i + 1], ev[3 * i + 2]));
        if (i + 1 < kPairs) CK(cudaEventElapsedTime(&z, ev[3 * i], ev[3 * (i + 1)]));
        a.push_back(x), b.push_back(y);
        if (i + 1 < kPairs) whole.push_back(z);
      }
      for (cudaEvent_t& e : ev) CK(cudaEventDestroy(e));
      auto median = [](std::vector<double> v) {
        std::sort(v.begin(), v.end());
        return v[v.size() / 2];
      };
      std::printf("split %s %s rank %d: %s %.4f ms, then %s %.4f ms; pair to pair %.4f ms "
                  "(alone: %s %.4f, %s %.4f; decomposed %.4f)\n",
                  s.op.c_str(), s.label.c_str(), r, is_ag ? "allGather" : "GEMM", median(a),
                  is_ag ? "GEMM" : "reduceScatter", median(b), median(whole),
                  is_ag ? "allGather" : "GEMM", ms_of[is_ag ? 3 : 2], is_ag ? "GEMM" : "reduceScatter",
                  ms_of[is_ag ? 2 : 3], ms_of[1]);
#if defined(FC_GEMM_TRACE)
      // The GEMM traced after a collective, as the decomposed path runs it, against alone
      // (the engine_trace lines of ours_gemm above).
      engine_trace(g, st, s.op + " " + s.label + " ours_gemm after collective",
                   find("ours_gemm"), false, find("ours_collective"));
#endif
      std::fflush(stdout);
    }
    // Every rank's own medians too: an impl that waits for its peers (the fused kernels, the
    // collectives) ends on every rank together, but ours_gemm times each GPU alone, and the
    // slowest GPU's GEMM bounds the fused op (report.py's "vs floor, slowest GPU").
    std::vector<uint8_t> mine(ms_of.size() * sizeof(double));
    std::memcpy(mine.data(), ms_of.data(), mine.size());
    const auto ranks_ms = g.all_gather(mine);
    for (size_t i = 0; i < impls.size(); ++i) {
      const Impl& im = impls[i];
      const double ms = ms_of[i];
      const int iters = iters_of[i];
      if (f) {
        std::string per_rank;
        for (const auto& r : ranks_ms) {
          double v = 0;
          std::memcpy(&v, r.data() + i * sizeof(double), sizeof v);
          char buf[32];
          std::snprintf(buf, sizeof buf, "%s%.6f", per_rank.empty() ? "" : ", ", v);
          per_rank += buf;
        }
        std::fprintf(f,
                     "{\"op\": \"%s\", \"impl\": \"%s\", \"world\": %d, \"shape\": \"%s\", \"M\": %d, "
                     "\"N\": %d, \"K\": %d, \"dtype\": \"bf16\", \"ms_median\": %.6f, \"tflops\": %.2f, "
                     "\"gbps\": %.1f, \"algo\": \"%s\", \"auto_algo\": \"%s\", \"gemm_ctas\": %d, "
                     "\"comm_ctas\": %d, \"tile_n\": %d, \"chunks\": %d, \"iters\": %d, "
                     "\"batches\": %d, \"partials\": \"%s\", \"tp\": %d, \"ag_gathered\": %s, "
                     "\"phantom_world\": %d, \"push_pace_ns\": %u, \"ag_copy_engines\": %d, \"ag_spread_stores\": %d, \"sustain_ms\": %g, \"ms_ranks\": [%s], "
                     "\"gpu\": \"%s\"}\n",
                     s.op.c_str(), im.name, W, s.label.c_str(), s.M, s.N, s.K, ms,
                     flops / (ms * 1e-3) / 1e12, wire / (ms * 1e-3) / 1e9,
                     im.info.algo == k::FusedAlgo::kAuto ? "" : algo_name(im.info.algo),
                     algo_name(auto_algo), im.info.gemm_ctas, im.info.comm_ctas, im.info.tile_n,
                     im.info.chunks, iters, o.batches,
                     is_ag ? "" : o.rs_partials.c_str(),
                     o.tp > 0 ? o.tp : W,
                     o.ag_gathered ? "true" : "false", Wf != W ? Wf : 0, im.info.push_pace_ns, im.info.copy_engines, im.info.spread_stores,
                     o.alternate ? 0.0 : o.sustain_ms, per_rank.c_str(), device);
        std::fflush(f);
        std::printf("%-18s W=%d %-20s %-16s %9.4f ms %7.1f TF/s %7.1f GB/s\n", s.op.c_str(), W,
                    s.label.c_str(), im.name, ms, flops / (ms * 1e-3) / 1e12,
                    wire / (ms * 1e-3) / 1e9);
        std::fflush(stdout);
      }
    }
  }
  if (f) std::fclose(f);
  g.barrier();
  cudaFree(A);
  cudaFree(B);
  cudaFree(C);
  cudaFree(G);
  cudaFree(S);
  sm->close();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--world") o.world = std::atoi(next());
    else if (a == "--tp") o.tp = std::atoi(next());
    else if (a == "--out") o.out = next();
    else if (a == "--quick") o.quick = true;
    else if (a == "--ctas") o.ctas = std::atoi(next());
    else if (a == "--batch-ms") o.batch_ms = std::atof(next());
    else if (a == "--batches") o.batches = std::atoi(next());
    else if (a == "--rs-partials") {
      const std::string v = next();
      if (v != "f32" && v != "bf16" && v != "f32any") {
        std::fprintf(stderr, "--rs-partials takes f32, bf16 or f32any\n");
        return 2;
      }
      o.rs_partials = v;
      o.rs_code = v == "bf16"     ? k::RsPartials::kBF16
                  : v == "f32any" ? k::RsPartials::kF32AnyOrder
                                  : k::RsPartials::kF32;
    }
    else if (a == "--ag-gathered") o.ag_gathered = std::string(next()) != "0";
    else if (a == "--ag-exchange") {
      const std::string v = next();
      if (v != "auto" && v != "sm" && v != "ce") {
        std::fprintf(stderr, "--ag-exchange takes auto, sm or ce\n");
        return 2;
      }
      o.ag_exchange = v == "sm"   ? k::AgExchange::kSmPulls
                      : v == "ce" ? k::AgExchange::kCopyEngines
                                  : k::AgExchange::kAuto;
    }
    else if (a == "--shape") o.shape = next();
    else if (a == "--alternate") o.alternate = true;
    else if (a == "--phantom-world") o.phantom_world = std::atoi(next());
    else if (a == "--shared-gpu") o.shared_gpu = true;
    else if (a == "--print-batches") o.print_batches = true;
    else if (a == "--clocks") o.clocks = true;
    else if (a == "--split-decomposed") o.split_decomposed = true;
    else if (a == "--sustain-ms") o.sustain_ms = std::atof(next());
    else if (a == "--ops") {
      const std::string ops = next();
      o.ag = ops.find("ag") != std::string::npos;
      o.rs = ops.find("rs") != std::string::npos;
      o.ar = ops.find("ar") != std::string::npos;
    } else {
      std::fprintf(stderr, "unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  if (o.phantom_world < 2 || o.phantom_world > k::kCommMaxRanks) {
    std::fprintf(stderr, "--phantom-world must be 2..%d\n", k::kCommMaxRanks);
    return 2;
  }
  const int failed = fusedcomm::testing::run_processes(
      o.world, [&](fusedcomm::testing::ProcessGroup& g) { return bench(g, o); }, 600);
  return failed == 0 ? 0 : 1;
}
