// gpu_fused_test: the fused ops (kernels/common/fused.h: allGatherGemm, gemmReduceScatter,
// gemmAllReduce) and the protocol they share (start and end barriers, FusedFlags, launch
// signatures across ops) over SymmetricMemory, one forked process per GPU, handles exchanged
// through pipes (process_group.h).
//   worlds: 1 (GPU 0; correctness, back-to-back and graph replay only), then every world W
//     from 2 to the GPU count (at most 8) on GPUs 0..W-1.
//   correctness: both ops x {fused, decomposed, auto} x both weight layouts, M not divisible
//     by W and not a multiple of 128 (1001, 2999, 4100), M smaller than W (a rank with no
//     rows), N_r / K_r different on every rank, K not a multiple of 64; fresh random bf16
//     inputs per run (seed printed, FC_TEST_SEED=<n> replays; FC_TEST_ROUNDS=<n> repeats the
//     sweep n times and runs nothing else); outputs (and the optional
//     gathered A) poisoned with NaN first, guard bytes behind them checked; every element
//     checked against an fp32 reference GEMM on the GPU (kernels::launch_reference_gemm) over
//     the fully gathered / summed inputs:  |got - ref| <= 8e-3 |ref| + 2e-5 sum|a*b| + 1e-6
//     (bf16 rounding of the result, fp32 accumulation order; gemmReduceScatter with bf16
//     partials adds 2^-9 sum|a*b|, their own rounding); the gathered A bit-exact;
//     gemmReduceScatter's workspace poisoned too (a partial read before it is stored shows as
//     NaN); the fused ops' counters back at 0 after every launch.
//   allGatherGemm's fused and auto cases run with each exchange (ag_gemm.h AgExchange:
//     SM pulls, copy engines on side streams), then auto cases as chosen; back-to-back, graph
//     replay, the late rank and the dead rank cover both exchanges too.
//   gemmReduceScatter also with bf16 partials and with fp32 partials in any order (W >= 3:
//     the fused kernel's one accumulating slot per owner).
//   gemmAllReduce (the fused gemmReduceScatter + allGather, and GEMM + allReduce): every row
//     checked as above, each partial precision, the same bits on every rank, a forced fused
//     launch refused where W does not divide M.
//   120 back-to-back launches without host sync (fused and decomposed of both ops
//     interleaved, inputs rewritten on the stream from a pool, the AG input by a kernel that
//     lets the next launch start early and writes late; stale flags, early input reuse or an
//     early-launched collective's read before its pdl_wait would show in the last outputs; the fused
//     gemmReduceScatter alternates rank order
//     and any order); CUDA-graph capture + 10 replays (one launch in any order); one rank
//     starting 200 ms late; a rank that never launches: the others time out (1 s) with an
//     error record naming rank, peer, op and step, an abort stops a waiting launch, and a
//     fresh SymmetricMemory on the same processes works; launch mismatch: odd ranks launch
//     another M / another op / the other algorithm / other partials (bf16, or fp32 in any order)
//     than even ranks at the same epoch: every
//     rank gets Error(kCommunicator) naming both launches (kCommLaunchMismatch, a peer of the
//     other parity) within 3 s although the timeout is 10 s.
// FC_TEST_WORLDS=<w,...>: only those worlds (gpu_test_support.h).
// FC_TEST_SHARED_GPU=<max world>: every rank on GPU 0, worlds 1..max (gpu_test_support.h:
// protocol and numerics only; 24 back-to-back launches instead of 120).
// Exit 77 (skip) with a reason where fewer than 2 Hopper GPUs with peer access are visible
// (and the shared-GPU mode is off).
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "fusedcomm/runtime/errors.h"
#include "fusedcomm/runtime/split.h"
#include "fusedcomm/runtime/symmetric_memory.h"
#include "kernels/ag_gemm/ag_gemm.h"
#include "kernels/collectives/collectives.h"
#include "kernels/common/fused.h"
#include "kernels/common/selftest.h"
#include "kernels/gemm/gemm_reference.h"
#include "kernels/gemm_ar/gemm_ar.h"
#include "kernels/gemm_rs/gemm_rs.h"
#include "support/gpu_test_support.h"
#include "support/process_group.h"

namespace {

namespace k = fusedcomm::kernels;
using fusedcomm::Error;
using fusedcomm::ErrorKind;
using fusedcomm::split_count;
using fusedcomm::split_offset;
using fusedcomm::SymmetricConfig;
using fusedcomm::testing::check;
using fusedcomm::testing::DevBuf;
using fusedcomm::testing::download;
using fusedcomm::testing::upload;
using fusedcomm::testing::g_failed;
using fusedcomm::testing::g_passed;
using fusedcomm::testing::mix;
using fusedcomm::testing::ProcessGroup;

// Element i of tensor `tag` of a case: uniform in [-1, 1), a bf16 value. Every rank can make
// every rank's inputs (the reference needs them all).
__nv_bfloat16 value(uint64_t key, uint64_t tag, int64_t i) {
  const uint64_t h = mix(key ^ mix(tag * 0x100000001b3ull + static_cast<uint64_t>(i)));
  const double u = static_cast<double>(h >> 11) * 0x1p-53;  // [0, 1)
  return __float2bfloat16_rn(static_cast<float>(u * 2.0 - 1.0));
}
std::vector<__nv_bfloat16> make_tensor(uint64_t key, uint64_t tag, int64_t first, int64_t n) {
  std::vector<__nv_bfloat16> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = value(key, tag, first + i);
  return v;
}
constexpr uint64_t kTagA = 1, kTagW = 100;  // kTagW + rank: rank's weight; kTagA + 10 + rank

const char* algo_name(k::FusedAlgo a) {
  if (a == k::FusedAlgo::kFused) return "fused";
  if (a == k::FusedAlgo::kOneShot) return "one-shot";
  return a == k::FusedAlgo::kDecomposed ? "decomposed" : "auto";
}
const char* layout_name(k::GemmLayoutB l) { return l == k::GemmLayoutB::kNK ? "NK" : "KN"; }

constexpr size_t kGuard = 256;  // poisoned bytes behind every output, checked untouched

// One allGatherGemm case: M rows, K, this rank's N = n0 + 8 * rank.
struct AgCase {
  int M, n0, K;
  k::GemmLayoutB layout;
  k::FusedAlgo algo;
  bool gathered_out;
  uint64_t in_offset;
  // The fused kernel's exchange (kAuto: copy engines at W = 2 for these N_r <= 4096, since
  // every launch passes side streams; SM pulls elsewhere).
  k::AgExchange exchange = k::AgExchange::kAuto;
  AgCase with(k::AgExchange x) const {
    AgCase c = *this;
    c.exchange = x;
    return c;
  }
  std::string name(int W) const {
    char b[220];
    const char* x = exchange == k::AgExchange::kSmPulls       ? " sm-pulls"
                    : exchange == k::AgExchange::kCopyEngines ? " copy-engines"
                                                              : "";
    std::snprintf(b, sizeof b, "allGatherGemm W=%d M=%d N=%d+8r K=%d %s %s%s%s", W, M, n0, K,
                  layout_name(layout), algo_name(algo), gathered_out ? " +gathered" : "", x);
    return b;
  }
};
// One gemmReduceScatter case: M, N, this rank's K = k0 + 8 * rank.
struct RsCase {
  int M, N, k0;
  k::GemmLayoutB layout;
  k::FusedAlgo algo;
  uint64_t ws_offset;
  bool bf16_partials = false;  // RsPartials::kBF16
  bool any_order = false;      // RsPartials::kF32AnyOrder (fp32 partials)
  std::string name(int W) const {
    char b[200];
    std::snprintf(b, sizeof b, "gemmReduceScatter W=%d M=%d N=%d K=%d+8r %s %s%s", W, M, N, k0,
                  layout_name(layout), algo_name(algo),
                  bf16_partials ? " bf16-partials"
                  : any_order   ? " any-order"
                                : "");
    return b;
  }
  k::RsPartials partials() const {
    return bf16_partials ? k::RsPartials::kBF16
           : any_order   ? k::RsPartials::kF32AnyOrder
                         : k::RsPartials::kF32;
  }
  // The partials' rounding, per unit of Σ|a·b| (gemm_rs.h, RsPartials): 2^-9 for bf16.
  float partial_rel() const { return bf16_partials ? 1.0f / 512 : 0.f; }
};

// Per-element tolerance against the fp32 reference: the output's bf16 rounding (8e-3 of the
// value), the accumulation order (2e-5 of Σ|a·b|), and `partial_rel` of Σ|a·b| for partials
// rounded before their sum.
float tolerance(float ref, float absdot, float partial_rel) {
  return 8e-3f * std::fabs(ref) + (2e-5f + partial_rel) * absdot + 1e-6f;
}

// Compares a downloaded bf16 output with the fp32 reference; returns the mismatch count.
int64_t compare(const std::vector<__nv_bfloat16>& got, const std::vector<float>& ref,
                const std::vector<float>& absdot, int64_t n, const std::string& what, int rank,
                float partial_rel = 0.f) {
  int64_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float g = __bfloat162float(got[i]);
    const float tol = tolerance(ref[i], absdot[i], partial_rel);
    if (!(std::fabs(g - ref[i]) <= tol)) {
      if (bad++ < 3) {
        std::fprintf(stderr, "  rank %d %s: out[%lld] = %.6g, expected %.6g (tol %.3g)\n", rank, what.c_str(),
                     static_cast<long long>(i), g, ref[i], tol);
      }
    }
  }
  return bad;
}

bool guard_intact(const void* dev_end) {
  const std::vector<uint8_t> g = download<uint8_t>(dev_end, kGuard);
  for (uint8_t b : g) {
    if (b != 0xFF) return false;
  }
  return true;
}

struct Rank : fusedcomm::testing::SymmetricRank {
  // A stream-K workspace for the decomposed paths' GEMMs, as CudaComm passes one (kernels'
  // gemm.h; zeroed once, every launch leaves its counters zero): every case runs with it.
  DevBuf gemm_ws;
  k::GemmWorkspace gemm_workspace() {
    if (gemm_ws.p == nullptr) {
      gemm_ws = DevBuf(k::gemm_workspace_bytes(0));
      CUDA_OK(cudaMemset(gemm_ws.p, 0, gemm_ws.bytes));
    }
    return k::GemmWorkspace{gemm_ws.p, gemm_ws.bytes};
  }

  // allGatherGemm's copy-engine exchange streams, passed to every launch as CudaComm does:
  // where the peers are on other GPUs. In the shared-GPU mode none is passed and the copy
  // engines are not forced (a copy within one GPU may need SMs that the fused kernels hold).
  k::FusedSideStreams side;
  static bool copy_engines() { return !fusedcomm::testing::g_shared_gpu; }

  using SymmetricRank::SymmetricRank;

  uint8_t* data() const { return static_cast<uint8_t*>(sm->data()); }

  // ---- allGatherGemm ----
  struct AgOperands {
    AgCase c;
    int N;
    DevBuf w, a_full, ref, absdot, C, gathered;
    std::vector<__nv_bfloat16> a_full_host;
  };

  AgOperands ag_prepare(const AgCase& c, uint64_t key) {
    AgOperands o;
    o.c = c;
    o.N = c.n0 + 8 * r;
    const int64_t M = c.M, K = c.K, N = o.N;
    o.a_full_host = make_tensor(key, kTagA, 0, M * K);
    o.a_full = upload(o.a_full_host, stream);
    o.w = upload(make_tensor(key, kTagW + r, 0, N * K), stream);  // N×K or K×N: same count
    o.ref = DevBuf(M * N * 4);
    o.absdot = DevBuf(M * N * 4);
    CUDA_OK(k::launch_reference_gemm(o.a_full.as<__nv_bfloat16>(), K, o.w.as<__nv_bfloat16>(),
                                     c.layout == k::GemmLayoutB::kNK ? K : N, c.layout, c.M, o.N, c.K,
                                     o.ref.as<float>(), o.absdot.as<float>(), false, stream));
    o.C = DevBuf(M * N * 2 + kGuard);
    if (c.gathered_out) o.gathered = DevBuf(M * K * 2 + kGuard);
    return o;
  }

  // Writes this rank's shard into the data area (stream-ordered copy from device). late: the
  // shard is poisoned (NaN) first, then written by a kernel that lets the next launch start
  // early and copies 20 us later (launch_delayed_copy): a launch that read its input before
  // that kernel completed would compute with NaN.
  void ag_write_input(const AgOperands& o, uint8_t* dst, bool late = false) {
    const int64_t off = split_offset(o.c.M, W, r), cnt = split_count(o.c.M, W, r);
    if (cnt == 0) return;
    const auto* src = o.a_full.as<__nv_bfloat16>() + off * o.c.K;
    const size_t bytes = cnt * o.c.K * 2;
    if (late) {
      CUDA_OK(cudaMemsetAsync(dst, 0xFF, bytes, stream));
      CUDA_OK(k::launch_delayed_copy(src, dst, bytes, 20000, stream));
    } else {
      CUDA_OK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream));
    }
  }
  void ag_poison(const AgOperands& o) {
    CUDA_OK(cudaMemsetAsync(o.C.p, 0xFF, o.C.bytes, stream));
    if (o.gathered.p) CUDA_OK(cudaMemsetAsync(o.gathered.p, 0xFF, o.gathered.bytes, stream));
  }
  k::AgGemmArgs ag_args(const AgOperands& o) {
    k::AgGemmArgs a;
    a.M = o.c.M;
    a.N = o.N;
    a.K = o.c.K;
    a.in_offset = o.c.in_offset;
    a.B = o.w.as<__nv_bfloat16>();
    a.b_layout = o.c.layout;
    a.C = o.C.as<__nv_bfloat16>();
    a.gathered = o.gathered.as<__nv_bfloat16>();
    a.algo = o.c.algo;
    a.exchange = o.c.exchange;
    a.side = copy_engines() ? &side : nullptr;
    a.gemm_ws = gemm_workspace();
    return a;
  }
  int64_t ag_verify(const AgOperands& o, const std::string& what) {
    const int64_t n = static_cast<int64_t>(o.c.M) * o.N;
    const auto got = download<__nv_bfloat16>(o.C.p, n);
    const auto ref = download<float>(o.ref.p, n);
    const auto ad = download<float>(o.absdot.p, n);
    int64_t bad = compare(got, ref, ad, n, what, r);
    if (!guard_intact(o.C.as<uint8_t>() + n * 2)) {
      ++bad;
      std::fprintf(stderr, "  rank %d %s: bytes behind C were written\n", r, what.c_str());
    }
    if (o.gathered.p) {
      const int64_t na = static_cast<int64_t>(o.c.M) * o.c.K;
      const auto ga = download<__nv_bfloat16>(o.gathered.p, na);
      const int64_t diff = std::memcmp(ga.data(), o.a_full_host.data(), na * 2) != 0;
      if (diff) std::fprintf(stderr, "  rank %d %s: gathered A differs\n", r, what.c_str());
      bad += diff;
      if (!guard_intact(o.gathered.as<uint8_t>() + na * 2)) {
        ++bad;
        std::fprintf(stderr, "  rank %d %s: bytes behind the gathered A were written\n", r, what.c_str());
      }
    }
    return bad;
  }

  void run_ag(const AgCase& c, uint64_t key) {
    AgOperands o = ag_prepare(c, key);
    ag_write_input(o, data() + c.in_offset);
    ag_poison(o);
    CUDA_OK(cudaStreamSynchronize(stream));
    g.barrier();
    const k::AgGemmArgs a = ag_args(o);
    CUDA_OK(k::launch_all_gather_gemm(sm->device(), a, stream));
    CUDA_OK(cudaStreamSynchronize(stream));
    sm->raise_if_failed();
    const int64_t bad = ag_verify(o, c.name(W));
    const k::FusedLaunchInfo info = k::all_gather_gemm_info(sm->device(), a);
    check(bad == 0, "rank " + std::to_string(r) + " " + c.name(W) + " (ran " + algo_name(info.algo) +
                        (info.copy_engines ? ", copy engines" : "") + "): " + std::to_string(bad) + " bad");
    // The exchange the launch reports: forced copy engines take them wherever there are peers,
    // forced SM pulls never.
    if (info.algo == k::FusedAlgo::kFused && W > 1 && c.exchange != k::AgExchange::kAuto) {
      check(info.copy_engines == (c.exchange == k::AgExchange::kCopyEngines ? 1 : 0),
            c.name(W) + ": the exchange reported by all_gather_gemm_info");
    }
    check_flags(c.name(W));
  }

  // ---- gemmReduceScatter ----
  struct RsOperands {
    RsCase c;
    uint64_t key;
    int K;
    DevBuf a, w, ref, absdot, out;
  };

  // all_rows (gemmAllReduce): the reference and the output hold every row of the sum.
  RsOperands rs_prepare(const RsCase& c, uint64_t key, bool all_rows = false) {
    RsOperands o;
    o.c = c;
    o.key = key;
    o.K = c.k0 + 8 * r;
    const int64_t M = c.M, N = c.N;
    o.a = upload(make_tensor(key, kTagA + 10 + r, 0, M * o.K), stream);
    o.w = upload(make_tensor(key, kTagW + r, 0, N * o.K), stream);
    // Reference: rows block r (all rows) of the sum over every source rank s of A_s · op(W_s).
    const int64_t off = all_rows ? 0 : split_offset(M, W, r), cnt = all_rows ? M : split_count(M, W, r);
    o.ref = DevBuf(std::max<int64_t>(1, cnt * N) * 4);
    o.absdot = DevBuf(std::max<int64_t>(1, cnt * N) * 4);
    for (int s = 0; s < W && cnt > 0; ++s) {
      const int64_t ks = c.k0 + 8 * s;
      DevBuf as = upload(make_tensor(key, kTagA + 10 + s, off * ks, cnt * ks), stream);
      DevBuf ws = upload(make_tensor(key, kTagW + s, 0, N * ks), stream);
      CUDA_OK(k::launch_reference_gemm(as.as<__nv_bfloat16>(), ks, ws.as<__nv_bfloat16>(),
                                       c.layout == k::GemmLayoutB::kNK ? ks : N, c.layout,
                                       static_cast<int>(cnt), c.N, static_cast<int>(ks), o.ref.as<float>(),
                                       o.absdot.as<float>(), s > 0, stream));
      CUDA_OK(cudaStreamSynchronize(stream));  // `as`, `ws` are freed at scope exit
    }
    o.out = DevBuf(cnt * N * 2 + kGuard);
    return o;
  }
  // The output and the workspace get NaN: a partial read before it is stored (decomposed: a
  // peer's reduceScatter; fused: this rank's epilogue reading a receive slot) then shows NaN
  // instead of a plausible stale value. (Safe: after the previous launch's end barrier no peer
  // reads or writes this workspace, and a peer's fused pushes of the next launch wait for this
  // rank's start flag, which stream order puts after this memset.)
  void rs_poison(const RsOperands& o) {
    CUDA_OK(cudaMemsetAsync(o.out.p, 0xFF, o.out.bytes, stream));
    const uint64_t ws = k::gemm_reduce_scatter_workspace(rs_args(o), W).data_bytes - o.c.ws_offset;
    CUDA_OK(cudaMemsetAsync(data() + o.c.ws_offset, 0xFF, ws, stream));
  }
  k::GemmRsArgs rs_args(const RsOperands& o) {
    k::GemmRsArgs a;
    a.M = o.c.M;
    a.N = o.c.N;
    a.K = o.K;
    a.A = o.a.as<__nv_bfloat16>();
    a.B = o.w.as<__nv_bfloat16>();
    a.b_layout = o.c.layout;
    a.ws_offset = o.c.ws_offset;
    a.out = o.out.as<__nv_bfloat16>();
    a.algo = o.c.algo;
    a.partials = o.c.partials();
    a.gemm_ws = gemm_workspace();
    return a;
  }
  int64_t rs_verify(const RsOperands& o, const std::string& what, bool all_rows = false) {
    const int64_t n = (all_rows ? o.c.M : split_count(o.c.M, W, r)) * o.c.N;
    const auto got = download<__nv_bfloat16>(o.out.p, n);
    const auto ref = download<float>(o.ref.p, n);
    const auto ad = download<float>(o.absdot.p, n);
    int64_t bad = compare(got, ref, ad, n, what, r, o.c.partial_rel());
    if (!guard_intact(o.out.as<uint8_t>() + n * 2)) {
      ++bad;
      std::fprintf(stderr, "  rank %d %s: bytes behind the output were written\n", r, what.c_str());
    }
    return bad;
  }

  // Every rank's FusedLaunchInfo for its arguments `a` (all ranks call this at the same point:
  // it exchanges through the process group); when any rank failed, rank 0 prints them all, so
  // a split / tile width / chunk count that differs between ranks is visible.
  void report_rs_info(const k::GemmRsArgs& a, bool failed, const std::string& what) {
    const k::FusedLaunchInfo info = k::gemm_reduce_scatter_info(sm->device(), a);
    const int32_t m[7] = {
        failed ? 1 : 0, static_cast<int32_t>(info.algo), a.K, info.gemm_ctas, info.comm_ctas, info.tile_n,
        info.chunks};
    std::vector<uint8_t> mine(sizeof m);
    std::memcpy(mine.data(), m, sizeof m);
    const std::vector<std::vector<uint8_t>> all = g.all_gather(mine);
    bool any = false;
    for (const auto& v : all) any |= v.size() == sizeof m && v[0] != 0;
    if (!any || r != 0) return;
    for (int p = 0; p < static_cast<int>(all.size()); ++p) {
      int32_t q[7] = {};
      if (all[p].size() == sizeof q) std::memcpy(q, all[p].data(), sizeof q);
      std::fprintf(stderr,
                   "  info %s: rank %d %s algo %s K=%d gemm_ctas %d comm_ctas %d tile_n %d "
                   "chunks %d\n",
                   what.c_str(), p, q[0] ? "FAILED" : "ok", algo_name(static_cast<k::FusedAlgo>(q[1])), q[2],
                   q[3], q[4], q[5], q[6]);
    }
  }

  void run_rs(const RsCase& c, uint64_t key) {
    RsOperands o = rs_prepare(c, key);
    rs_poison(o);
    CUDA_OK(cudaStreamSynchronize(stream));
    g.barrier();
    const k::GemmRsArgs a = rs_args(o);
    CUDA_OK(k::launch_gemm_reduce_scatter(sm->device(), a, stream));
    CUDA_OK(cudaStreamSynchronize(stream));
    sm->raise_if_failed();
    const int64_t bad = rs_verify(o, c.name(W));
    const k::FusedLaunchInfo info = k::gemm_reduce_scatter_info(sm->device(), a);
    check(bad == 0, "rank " + std::to_string(r) + " " + c.name(W) + " (ran " + algo_name(info.algo) +
                        "): " + std::to_string(bad) + " bad");
    if (bad != 0) rs_diagnose(o);
    check_flags(c.name(W));
    report_rs_info(a, bad != 0, c.name(W));
  }

  // gemmAllReduce's arguments for operands made with rs_prepare(all_rows) (out: all M rows);
  // `sums`: the fp32 sums of the decomposed path with fp32 partials (M×N fp32).
  k::GemmArArgs ar_args(const RsOperands& o, const DevBuf& sums) {
    k::GemmArArgs a;
    a.M = o.c.M;
    a.N = o.c.N;
    a.K = o.K;
    a.A = o.a.as<__nv_bfloat16>();
    a.B = o.w.as<__nv_bfloat16>();
    a.b_layout = o.c.layout;
    a.ws_offset = o.c.ws_offset;
    a.C = o.out.as<__nv_bfloat16>();
    a.sums = sums.as<float>();
    a.gemm_ws = gemm_workspace();
    a.algo = o.c.algo;
    a.partials = o.c.partials();
    return a;
  }
  // Every rank's bytes of an all-rows output equal this rank's (exchanged through the group).
  void check_same_bits(const RsOperands& o, const std::string& what) {
    const std::vector<uint8_t> mine = download<uint8_t>(o.out.p, int64_t{o.c.M} * o.c.N * 2);
    const auto all = g.all_gather(mine);
    for (int p = 0; p < W; ++p) {
      check(all[p] == mine, "rank " + std::to_string(r) + " " + what + ": rank " + std::to_string(p) +
                                "'s result differs in its bits");
    }
  }
  static std::string ar_name(const RsCase& c, int W) {
    return "gemmAllReduce" + c.name(W).substr(std::string("gemmReduceScatter").size());
  }

  // gemmAllReduce (gemm_ar.h) with RsCase's shapes and algorithm: every row of the sum checked as
  // gemmReduceScatter's block (bf16 partials: the same bound), the data area poisoned first, and
  // the same bits on every rank. A forced kFused where W does not divide M is refused
  // (cudaErrorInvalidValue) on every rank before anything runs.
  void run_ar(const RsCase& c, uint64_t key) {
    const std::string what = ar_name(c, W);
    RsOperands o = rs_prepare(c, key, /*all_rows=*/true);
    DevBuf sums(int64_t{c.M} * c.N * 4);
    const k::GemmArArgs a = ar_args(o, sums);
    if (c.algo == k::FusedAlgo::kFused && c.M % W != 0) {
      check(k::launch_gemm_all_reduce(sm->device(), a, stream) == cudaErrorInvalidValue,
            "rank " + std::to_string(r) + " " + what +
                ": a fused launch with W not dividing M was not refused");
      cudaGetLastError();
      return;
    }
    CUDA_OK(cudaMemsetAsync(o.out.p, 0xFF, o.out.bytes, stream));
    const k::FusedWorkspace ws = k::gemm_all_reduce_workspace(a, W);
    CUDA_OK(cudaMemsetAsync(data() + c.ws_offset, 0xFF, ws.data_bytes - c.ws_offset, stream));
    CUDA_OK(cudaStreamSynchronize(stream));
    g.barrier();
    CUDA_OK(k::launch_gemm_all_reduce(sm->device(), a, stream));
    CUDA_OK(cudaStreamSynchronize(stream));
    sm->raise_if_failed();
    const int64_t bad = rs_verify(o, what, /*all_rows=*/true);
    const k::FusedLaunchInfo info = k::gemm_all_reduce_info(sm->device(), a);
    check(bad == 0, "rank " + std::to_string(r) + " " + what + " (ran " + algo_name(info.algo) +
                        "): " + std::to_string(bad) + " bad");
    check_same_bits(o, what);
    check_flags(what);
  }

  // FusedFlags between launches (fused.h): every chunk counter, the tile counter and the role
  // counter are back at 0 once a launch has completed. Returns the number of non-zero counters
  // (the first few printed).
  int flags_dirty(const std::string& what) {
    auto flags = std::make_unique<k::FusedFlags>();  // ~0.9 MiB: not on the stack
    k::FusedFlags& f = *flags;
    CUDA_OK(cudaMemcpy(&f, sm->device().base[r] + k::kFusedFlagsOffset, sizeof f, cudaMemcpyDeviceToHost));
    int n = 0;
    auto report = [&](const char* name, int i, uint32_t v) {
      if (v == 0) return;
      if (n++ < 4) std::fprintf(stderr, "  rank %d after %s: %s[%d] = %u\n", r, what.c_str(), name, i, v);
    };
    for (int c = 0; c < k::kFusedMaxChunks; ++c) report("chunk_count", c, f.chunk_count[c]);
    report("tile_claim", 0, f.tile_claim);
    report("role_exit", 0, f.role_exit);
    return n;
  }
  void check_flags(const std::string& what) {
    check(flags_dirty(what) == 0, "rank " + std::to_string(r) + " counters at 0 after " + what);
  }

  // After a failed gemmReduceScatter, tells the kernel's faults from the test's: for this
  // rank's rows, every source's partial as its workspace holds it now (peers' through their
  // mapping) against a reference of that source alone, then the first bad outputs with both.
  // Output = sum of the partials now but the partials wrong: the GEMM; partials right but the
  // output not their sum: the reduction; output = their sum and both right: the reference.
  // The fused kernel's accumulating mode (W >= 3, fp32 partials) keeps only the peers' sum: it
  // is shown against the sum of their references.
  void rs_diagnose(const RsOperands& o) {
    const int64_t N = o.c.N, off = split_offset(o.c.M, W, r), cnt = split_count(o.c.M, W, r);
    const auto& dev = sm->device();
    const bool fused = k::gemm_reduce_scatter_info(dev, rs_args(o)).algo == k::FusedAlgo::kFused;
    const bool accumulate = fused && W >= 3 && o.c.any_order;
    const int64_t slot_rows = k::kFusedRsSlotPadRows + (o.c.M + W - 1) / W;
    std::vector<std::vector<float>> ref_s, now_s;
    for (int s = 0; s < W; ++s) {
      const int64_t ks = o.c.k0 + 8 * s;
      DevBuf as = upload(make_tensor(o.key, kTagA + 10 + s, off * ks, cnt * ks), stream);
      DevBuf ws = upload(make_tensor(o.key, kTagW + s, 0, N * ks), stream);
      DevBuf ref(cnt * N * 4);
      CUDA_OK(k::launch_reference_gemm(as.as<__nv_bfloat16>(), ks, ws.as<__nv_bfloat16>(),
                                       o.c.layout == k::GemmLayoutB::kNK ? ks : N, o.c.layout,
                                       static_cast<int>(cnt), static_cast<int>(N), static_cast<int>(ks),
                                       ref.as<float>(), nullptr, false, stream));
      CUDA_OK(cudaStreamSynchronize(stream));
      ref_s.push_back(download<float>(ref.p, cnt * N));
      // Decomposed: source s's partial product in s's workspace (rows at their place). Fused:
      // s's partial of these rows in this rank's receive slot for s; this rank's own partial
      // is never stored (it stays in registers): shown as the reference.
      const int64_t pb = o.c.bf16_partials ? 2 : 4;
      const uint8_t* part = dev.base[s] + dev.data_offset + o.c.ws_offset + off * N * pb;
      if (fused) {
        part = dev.base[r] + dev.data_offset + o.c.ws_offset +
               ((s < r ? s : s - 1) * slot_rows + k::kFusedRsSlotPadRows) * N * pb;
      }
      if (fused && (s == r || accumulate)) {
        now_s.push_back(ref_s[s]);
        if (s != r) std::fprintf(stderr, "  diag rank %d: source %d's partial: in the sum below\n", r, s);
        continue;
      } else if (o.c.bf16_partials) {
        const auto h = download<__nv_bfloat16>(part, cnt * N);
        now_s.emplace_back(cnt * N);
        for (int64_t i = 0; i < cnt * N; ++i) now_s[s][i] = __bfloat162float(h[i]);
      } else {
        now_s.push_back(download<float>(part, cnt * N));
      }
      const float rel = o.c.bf16_partials ? 4e-3f : 1e-3f;
      int64_t wrong = 0;
      for (int64_t i = 0; i < cnt * N; ++i) {
        wrong += std::fabs(now_s[s][i] - ref_s[s][i]) <= rel * std::fabs(ref_s[s][i]) + 1e-3f ? 0 : 1;
      }
      std::fprintf(stderr, "  diag rank %d: source %d's partial of my rows: %lld wrong\n", r, s,
                   static_cast<long long>(wrong));
    }
    std::vector<float> sum_now, sum_ref(cnt * N, 0.f);
    if (accumulate) {
      sum_now = download<float>(
          dev.base[r] + dev.data_offset + o.c.ws_offset + k::kFusedRsSlotPadRows * N * 4, cnt * N);
      int64_t wrong = 0;
      for (int64_t i = 0; i < cnt * N; ++i) {
        for (int s = 0; s < W; ++s) sum_ref[i] += s == r ? 0.f : ref_s[s][i];
        wrong += std::fabs(sum_now[i] - sum_ref[i]) <= 1e-3f * std::fabs(sum_ref[i]) + 1e-3f ? 0 : 1;
      }
      std::fprintf(stderr, "  diag rank %d: the peers' summed partials of my rows: %lld wrong\n", r,
                   static_cast<long long>(wrong));
    }
    const auto got = download<__nv_bfloat16>(o.out.p, cnt * N);
    const auto ref = download<float>(o.ref.p, cnt * N);
    const auto ad = download<float>(o.absdot.p, cnt * N);
    for (int64_t i = 0, shown = 0; i < cnt * N && shown < 4; ++i) {
      const float g = __bfloat162float(got[i]);
      if (std::fabs(g - ref[i]) <= tolerance(ref[i], ad[i], o.c.partial_rel())) continue;
      ++shown;
      std::string v;
      for (int s = 0; s < W; ++s) {
        char b[80];
        std::snprintf(b, sizeof b, " P%d now %.5g ref %.5g;", s, now_s[s][i], ref_s[s][i]);
        if (!accumulate || s == r) v += b;
      }
      if (accumulate) {
        char b[80];
        std::snprintf(b, sizeof b, " peers' sum now %.5g ref %.5g;", sum_now[i], sum_ref[i]);
        v += b;
      }
      std::fprintf(stderr, "  diag rank %d row %lld col %lld: out %.5g, reference %.5g;%s\n", r,
                   static_cast<long long>(off + i / N), static_cast<long long>(i % N), g, ref[i], v.c_str());
    }
  }

  // ---- the sweep ----
  void correctness() {
    const auto NK = k::GemmLayoutB::kNK, KN = k::GemmLayoutB::kKN;
    const auto F = k::FusedAlgo::kFused, D = k::FusedAlgo::kDecomposed, A = k::FusedAlgo::kAuto;
    const auto O = k::FusedAlgo::kOneShot;
    const std::vector<AgCase> ag = {
        {1001, 264, 520, NK, F, true, 4096},
        {1001, 264, 520, NK, D, true, 4096},
        {2999, 1032, 1032, KN, F, false, 0},
        {2999, 1032, 1032, KN, D, false, 0},
        {3, 64, 64, NK, F, true, 16},
        {3, 64, 64, KN, A, false, 16},
        {4100, 2048, 2048, NK, F, false, 0},
        {4100, 2048, 2048, NK, A, true, 0},
        {640, 128, 4096, KN, F, true, 1 << 20},
        // No gathered output and an input offset: the GEMM reads the own rows' whole M-blocks
        // from A_r at that offset (AgParams::tm_own), the rest are copied.
        {1001, 264, 520, KN, F, false, 4096},
        // Decode-sized M with long K: the decomposed path's GEMM runs stream-K (gemm_ws).
        {16, 2048, 8192, NK, D, true, 0},
        {40, 1024, 8200, KN, D, false, 0},
    };
    const std::vector<RsCase> rs = {
        {1001, 264, 520, NK, F, 0},
        {1001, 264, 520, NK, D, 0},
        {2999, 1032, 1032, KN, F, 64},
        {2999, 1032, 1032, KN, D, 64},
        {3, 64, 64, NK, F, 0},
        {3, 64, 64, KN, A, 16},
        {4100, 2056, 1024, NK, F, 0},
        {4100, 2056, 1024, KN, A, 0},
        {640, 4096, 128, NK, F, 1 << 20},
        // W = 4: owners change at rows 192 and 576, inside M-blocks but on half-tile bounds: one
        // warpgroup of the tile pushes while the other sums (the fused kernel's deadlock case).
        {768, 520, 1032, KN, F, 0},
        // bf16 partials (RsPartials::kBF16): even and uneven M, both layouts, both algorithms.
        {1001, 264, 520, NK, F, 0, true},
        {1001, 264, 520, NK, D, 0, true},
        {2999, 1032, 1032, KN, F, 64, true},
        {2999, 1032, 1032, KN, D, 64, true},
        {4100, 2056, 1024, NK, A, 0, true},
        {3, 64, 64, NK, F, 16, true},
        // Several waves of tiles, so that at W = 2 the own half-tiles come after the peer's
        // pushes were flagged and fetch their partial early (RsParams::prefetch); the second
        // with a last tile column of 8 (its fetch skips the boxes past N).
        {4096, 2048, 1024, NK, F, 0, true},
        {4096, 1032, 1024, KN, F, 0, true},
        // fp32 partials in any order (RsPartials::kF32AnyOrder): at W >= 3 the fused kernel's
        // peers add into one slot per owner (zeroed before each launch).
        {1001, 264, 520, NK, F, 0, false, true},
        {2999, 1032, 1032, KN, F, 64, false, true},
        {768, 520, 1032, KN, F, 0, false, true},
        {3, 64, 64, NK, F, 16, false, true},
        {4100, 2056, 1024, NK, A, 0, false, true},
        {1001, 264, 520, NK, D, 0, false, true},
        // Decode-sized M with long K: the decomposed path's GEMM runs stream-K (gemm_ws).
        {16, 2048, 8192, NK, D, 0},
        {33, 1024, 8192, KN, D, 64, true},
    };
    // gemmAllReduce: M = 1008 divides by W = 1-4, 6-8 (the fused path), 1001 by none of 2-8;
    // each partial precision; kAuto (decomposed at these sizes).
    const std::vector<RsCase> ar = {
        {1008, 264, 520, NK, F, 0},
        {1008, 264, 520, NK, D, 0},
        {1008, 1032, 1032, KN, F, 64, true},
        {1008, 1032, 1032, KN, D, 64, true},
        {1001, 264, 520, KN, F, 0},
        {1001, 264, 520, KN, A, 16},
        {1008, 520, 264, NK, F, 0, false, true},
        {3, 64, 64, NK, D, 0},
        {16, 2048, 8192, NK, D, 0},
        {24, 1024, 8192, KN, A, 0, true},
        // The one-shot kernel (kOneShot, forced): decode-sized M (mma.sync tile heights 16, 32;
        // wgmma 64, 128; split K where the tiles are few, K_r not a multiple of 64, N not a
        // multiple of the tile width) up to M = 8192, both layouts, each partial precision; then
        // kAuto at decode sizes.
        {1, 4096, 1024, NK, O, 0},
        {1, 1032, 2048, KN, O, 16, true},
        {3, 1032, 2048, KN, O, 64, true},
        {8, 2056, 520, NK, O, 16},
        {32, 1024, 1032, KN, O, 0, false, true},
        {64, 1024, 4096, KN, O, 0},
        {64, 2048, 1024, NK, O, 0, true},
        {40, 2056, 4104, KN, O, 16},
        {96, 1032, 2056, NK, O, 0, true},
        {128, 4096, 2048, KN, O, 0, true},
        {129, 1024, 1032, KN, O, 0},
        {64, 16400, 1032, KN, O, 0},
        {100, 8200, 1032, KN, O, 0, true},
        {127, 520, 1032, NK, O, 0, true},
        {127, 264, 776, KN, O, 0},
        {1000, 264, 520, KN, O, 16},
        {8192, 136, 264, NK, O, 0, true},
        {1, 4096, 2048, NK, A, 0, true},
        {8, 2048, 1024, KN, A, 0},
        {64, 2048, 1024, NK, A, 16, true},
        {127, 1032, 520, KN, A, 0},
    };
    uint64_t id = 0;
    // Every case that may run fused with each exchange (the same inputs), then as listed.
    for (const AgCase& c : ag) {
      const uint64_t key = mix(seed ^ (0xA600 + ++id));
      if (c.algo == k::FusedAlgo::kDecomposed) {
        run_ag(c, key);
        continue;
      }
      run_ag(c.with(k::AgExchange::kSmPulls), key);
      if (copy_engines()) run_ag(c.with(k::AgExchange::kCopyEngines), key);
      if (c.algo == k::FusedAlgo::kAuto) run_ag(c, key);
    }
    for (const RsCase& c : rs) run_rs(c, mix(seed ^ (0x4500 + ++id)));
    for (const RsCase& c : ar) run_ar(c, mix(seed ^ (0xA400 + ++id)));
  }

  // 120 launches, no host sync: allGatherGemm fused / gemmReduceScatter fused / allGatherGemm
  // decomposed / gemmReduceScatter decomposed in turn, each with its own inputs (the AG input
  // is rewritten into the data area on the stream before each of its launches, late: see
  // ag_write_input) and outputs. The decomposed allGatherGemm's collective is launched early
  // (detail/early_launch.h) right behind the late writer: read before its pdl_wait, its input
  // would be NaN.
  void back_to_back() {
    const int kIters = fusedcomm::testing::shared_gpu_scale(120);
    const auto F = k::FusedAlgo::kFused, D = k::FusedAlgo::kDecomposed;
    const uint64_t rs_ws = 16 << 20;  // RS workspace above the AG input
    const auto NK = k::GemmLayoutB::kNK, KN = k::GemmLayoutB::kKN;
    AgOperands ag[2] = {ag_prepare({1001, 264, 520, NK, F, true, 0}, mix(seed ^ 0xB2B0)),
                        ag_prepare({1001, 136, 776, KN, D, false, 0}, mix(seed ^ 0xB2B1))};
    RsOperands rs[2] = {rs_prepare({1001, 264, 520, NK, F, rs_ws}, mix(seed ^ 0xB2B2)),
                        rs_prepare({1001, 392, 264, KN, D, rs_ws}, mix(seed ^ 0xB2B3))};
    for (auto& o : ag) ag_poison(o);
    for (auto& o : rs) rs_poison(o);
    CUDA_OK(cudaStreamSynchronize(stream));
    g.barrier();
    for (int i = 0; i < kIters; ++i) {
      const int j = i % 4;
      if (j % 2 == 0) {
        ag_write_input(ag[j / 2], data(), true);
        // The fused one alternates its exchange: SM pulls, then the copy engines (whose
        // progress slots the pulling CTA leaves at 0 for whichever launch comes next).
        k::AgGemmArgs a = ag_args(ag[j / 2]);
        if (j == 0 && copy_engines()) {
          a.exchange = (i / 4) % 2 == 0 ? k::AgExchange::kSmPulls : k::AgExchange::kCopyEngines;
        }
        CUDA_OK(k::launch_all_gather_gemm(sm->device(), a, stream));
      } else {
        // The fused one alternates fp32 partials in rank order and in any order (one slot per
        // owner at W >= 3, zeroed before each launch: a missed zeroing would double the last
        // output, which is an any-order launch).
        k::GemmRsArgs a = rs_args(rs[j / 2]);
        if (j == 1 && (i / 4) % 2 == 1) a.partials = k::RsPartials::kF32AnyOrder;
        CUDA_OK(k::launch_gemm_reduce_scatter(sm->device(), a, stream));
      }
    }
    CUDA_OK(cudaStreamSynchronize(stream));
    sm->raise_if_failed();
    const std::string who = "rank " + std::to_string(r) + " back-to-back x" + std::to_string(kIters) + " ";
    for (auto& o : ag) check(ag_verify(o, "b2b") == 0, who + o.c.name(W));
    for (auto& o : rs) {
      const bool ok = rs_verify(o, "b2b") == 0;
      check(ok, who + o.c.name(W));
      report_rs_info(rs_args(o), !ok, "b2b " + o.c.name(W));
    }
    check_flags("back-to-back");
  }

  // Capture [write AG input; AG fused; RS fused; AG decomposed (same input)] x2, replay 10x.
  // The first AG fused moves its exchange with the copy engines (their side streams forked and
  // joined inside the graph), the second with SM pulls. The second RS launch sums its partials
  // in any order (its slot's zeroing is in the graph).
  void graph() {
    const auto F = k::FusedAlgo::kFused;
    const auto NK = k::GemmLayoutB::kNK, KN = k::GemmLayoutB::kKN;
    const auto D = k::FusedAlgo::kDecomposed;
    AgOperands ag = ag_prepare({2999, 520, 1032, NK, F, true, 0}, mix(seed ^ 0x6A0));
    AgOperands agd = ag_prepare({2999, 520, 1032, NK, D, false, 0}, mix(seed ^ 0x6A0));
    RsOperands rs = rs_prepare({2999, 1032, 520, KN, F, 16 << 20}, mix(seed ^ 0x6A1));
    CUDA_OK(cudaStreamSynchronize(stream));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    for (int rep = 0; rep < 2; ++rep) {
      ag_write_input(ag, data());
      k::AgGemmArgs x = ag_args(ag);
      x.exchange = rep == 0 && copy_engines() ? k::AgExchange::kCopyEngines : k::AgExchange::kSmPulls;
      CUDA_OK(k::launch_all_gather_gemm(sm->device(), x, stream));
      k::GemmRsArgs a = rs_args(rs);
      if (rep == 1) a.partials = k::RsPartials::kF32AnyOrder;
      CUDA_OK(k::launch_gemm_reduce_scatter(sm->device(), a, stream));
      CUDA_OK(k::launch_all_gather_gemm(sm->device(), ag_args(agd), stream));
    }
    CUDA_OK(cudaStreamEndCapture(stream, &graph));
    CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    ag_poison(ag);
    ag_poison(agd);
    rs_poison(rs);
    CUDA_OK(cudaStreamSynchronize(stream));
    g.barrier();
    for (int i = 0; i < 10; ++i) CUDA_OK(cudaGraphLaunch(exec, stream));
    CUDA_OK(cudaStreamSynchronize(stream));
    sm->raise_if_failed();
    const std::string who = "rank " + std::to_string(r) + " graph replay ";
    check(ag_verify(ag, "graph") == 0, who + ag.c.name(W));
    check(ag_verify(agd, "graph") == 0, who + agd.c.name(W));
    const bool rs_ok = rs_verify(rs, "graph") == 0;
    check(rs_ok, who + rs.c.name(W));
    report_rs_info(rs_args(rs), !rs_ok, "graph " + rs.c.name(W));
    check_flags("graph replay");
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }

  // gemmAllReduce's one-shot kernel, 1,000 launches without host sync (200 with a shared GPU):
  // two one-shot ops in turn (fp32 partials with split K, bf16 partials in the other layout),
  // every 50th launch the decomposed path instead (a collective between them: the launch epoch
  // and the flags are shared). Inputs stay; a stale tile flag or a slot overwritten early would
  // show in the last outputs. Then the same ops captured in a CUDA graph (two of each per
  // replay) and replayed 10 times, outputs poisoned before the replays.
  void one_shot_repeats() {
    const auto O = k::FusedAlgo::kOneShot, D = k::FusedAlgo::kDecomposed;
    const auto NK = k::GemmLayoutB::kNK, KN = k::GemmLayoutB::kKN;
    const int kIters = fusedcomm::testing::shared_gpu_scale(1000);
    RsOperands ops[3] = {rs_prepare({8, 2056, 1024, NK, O, 0}, mix(seed ^ 0x05B0), true),
                         rs_prepare({127, 1032, 520, KN, O, 8 << 20, true}, mix(seed ^ 0x05B1), true),
                         rs_prepare({64, 1024, 520, NK, D, 16 << 20}, mix(seed ^ 0x05B2), true)};
    DevBuf sums(int64_t{64} * 1024 * 4);
    auto poison = [&] {
      for (auto& o : ops) CUDA_OK(cudaMemsetAsync(o.out.p, 0xFF, o.out.bytes, stream));
    };
    auto verify = [&](const std::string& how) {
      for (auto& o : ops) {
        const std::string what = how + " " + ar_name(o.c, W);
        check(rs_verify(o, how, true) == 0, "rank " + std::to_string(r) + " " + what);
        check_same_bits(o, what);
      }
      check_flags(how);
    };
    poison();
    CUDA_OK(cudaStreamSynchronize(stream));
    g.barrier();
    for (int i = 0; i < kIters; ++i) {
      const int j = i % 50 == 49 ? 2 : i % 2;
      CUDA_OK(k::launch_gemm_all_reduce(sm->device(), ar_args(ops[j], sums), stream));
    }
    CUDA_OK(cudaStreamSynchronize(stream));
    sm->raise_if_failed();
    verify("one-shot back-to-back x" + std::to_string(kIters));

    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    for (int rep = 0; rep < 2; ++rep) {
      for (auto& o : ops) CUDA_OK(k::launch_gemm_all_reduce(sm->device(), ar_args(o, sums), stream));
    }
    CUDA_OK(cudaStreamEndCapture(stream, &graph));
    CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    poison();
    CUDA_OK(cudaStreamSynchronize(stream));
    g.barrier();
    for (int i = 0; i < 10; ++i) CUDA_OK(cudaGraphLaunch(exec, stream));
    CUDA_OK(cudaStreamSynchronize(stream));
    sm->raise_if_failed();
    verify("one-shot graph replay");
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }

  // gemmAllReduce's one-shot kernel with the last rank launching 200 ms after the others.
  void late_rank_one_shot() {
    RsOperands o = rs_prepare({64, 2048, 1032, k::GemmLayoutB::kKN, k::FusedAlgo::kOneShot, 0, true},
                              mix(seed ^ 0x1A80), true);
    DevBuf sums;
    CUDA_OK(cudaMemsetAsync(o.out.p, 0xFF, o.out.bytes, stream));
    CUDA_OK(cudaStreamSynchronize(stream));
    g.barrier();
    if (r == W - 1) std::this_thread::sleep_for(std::chrono::milliseconds(200));
    CUDA_OK(k::launch_gemm_all_reduce(sm->device(), ar_args(o, sums), stream));
    CUDA_OK(cudaStreamSynchronize(stream));
    sm->raise_if_failed();
    const std::string what = "late rank " + ar_name(o.c, W);
    check(rs_verify(o, "late", true) == 0, "rank " + std::to_string(r) + " " + what);
    check_same_bits(o, what);
    check_flags(what);
  }

  // The last rank launches 200 ms after the others, once per allGatherGemm exchange.
  void late_rank() {
    for (k::AgExchange x : {k::AgExchange::kCopyEngines, k::AgExchange::kSmPulls}) {
      if (x == k::AgExchange::kSmPulls || copy_engines()) late_rank(x);
    }
  }
  void late_rank(k::AgExchange x) {
    const auto F = k::FusedAlgo::kFused;
    const auto NK = k::GemmLayoutB::kNK, KN = k::GemmLayoutB::kKN;
    AgOperands ag = ag_prepare(AgCase{2999, 520, 1032, KN, F, true, 0}.with(x), mix(seed ^ 0x1A7E));
    RsOperands rs = rs_prepare({2999, 1032, 520, NK, F, 16 << 20}, mix(seed ^ 0x1A7F));
    ag_write_input(ag, data());
    ag_poison(ag);
    rs_poison(rs);
    CUDA_OK(cudaStreamSynchronize(stream));
    g.barrier();
    if (r == W - 1) std::this_thread::sleep_for(std::chrono::milliseconds(200));
    CUDA_OK(k::launch_all_gather_gemm(sm->device(), ag_args(ag), stream));
    CUDA_OK(k::launch_gemm_reduce_scatter(sm->device(), rs_args(rs), stream));
    CUDA_OK(cudaStreamSynchronize(stream));
    sm->raise_if_failed();
    check(ag_verify(ag, "late") == 0, "rank " + std::to_string(r) + " late rank " + ag.c.name(W));
    const bool rs_ok = rs_verify(rs, "late") == 0;
    check(rs_ok, "rank " + std::to_string(r) + " late rank " + rs.c.name(W));
    if (!rs_ok) rs_diagnose(rs);
    check_flags("late rank");
    report_rs_info(rs_args(rs), !rs_ok, "late " + rs.c.name(W));
  }

  // Launches `launch` on every rank but the last, expects a timeout naming the last rank.
  template <typename Launch>
  void expect_timeout(const char* what, uint32_t op, uint32_t step_a, uint32_t step_b, Launch launch) {
    if (r == W - 1) return;
    const auto t0 = std::chrono::steady_clock::now();
    CUDA_OK(launch());
    CUDA_OK(cudaStreamSynchronize(stream));  // returns: the kernel gave up, no hang
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const std::optional<Error> e = fusedcomm::testing::raised(*sm);
    const bool threw = e && e->kind() == ErrorKind::kTimeout;
    const k::CommErrorRecord rec = sm->error();
    if (r == 0) {
      std::printf(
          "  rank 0, %s: timed out after %.2f s: rank %u peer %u op %s step %s "
          "epoch %llu\n",
          what, s, rec.rank, rec.peer, k::fused_op_name(rec.op), k::fused_step_name(rec.step),
          static_cast<unsigned long long>(rec.epoch));
    }
    check(threw, "rank " + std::to_string(r) + " " + what + ": dead peer -> Error(kTimeout)");
    check(rec.code == k::kGemmWaitTimeout && rec.rank == static_cast<uint32_t>(r) &&
              rec.peer == static_cast<uint32_t>(W - 1) && rec.op == op &&
              (rec.step == step_a || rec.step == step_b) && rec.epoch == 1,
          "rank " + std::to_string(r) + " " + what + ": error record names rank/peer/op/step (got rank " +
              std::to_string(rec.rank) + " peer " + std::to_string(rec.peer) + " op " +
              std::to_string(rec.op) + " step " + std::to_string(rec.step) + ")");
    check(s > 0.9 && s < 6.0,
          std::string(what) + ": timeout took " + std::to_string(s) + " s (configured 1 s)");
    check(cudaGetLastError() == cudaSuccess, "the CUDA context survives a timeout");
  }

  // Odd ranks launch something else than even ranks at the same epoch: another M (fused
  // allGatherGemm on both), another op (allGatherGemm vs gemmReduceScatter, fused), the other
  // algorithm (allGatherGemm fused vs decomposed). Every rank must get Error(kCommunicator)
  // naming both launches long before the 10 s timeout.
  void mismatch() {
    SymmetricConfig cfg;
    cfg.data_bytes = 32 << 20;
    cfg.timeout_ns = 10ull * 1000 * 1000 * 1000;
    const auto F = k::FusedAlgo::kFused, D = k::FusedAlgo::kDecomposed;
    const auto NK = k::GemmLayoutB::kNK;
    const bool odd = r % 2 == 1;
    struct Launch {
      bool ag;  // allGatherGemm, else gemmReduceScatter
      int M;
      k::FusedAlgo algo;
      bool bf16_partials = false;  // gemmReduceScatter only
      bool any_order = false;      // gemmReduceScatter only
    };
    struct Pair {
      Launch even, odd;
      const char* what;
    };
    const Pair pairs[] = {
        {{true, 2999, F}, {true, 1001, F}, "M (allGatherGemm fused)"},
        {{true, 2999, F}, {false, 2999, F}, "op (allGatherGemm vs gemmReduceScatter)"},
        {{true, 2999, F}, {true, 2999, D}, "algorithm (allGatherGemm fused vs decomposed)"},
        {{false, 2999, F}, {false, 2999, F, true}, "partials (gemmReduceScatter fp32 vs bf16)"},
        // One rank would store into per-source slots, the other add into one slot.
        {{false, 2999, F},
         {false, 2999, F, false, true},
         "partials (gemmReduceScatter fp32 in rank order vs in any order)"},
    };
    uint64_t id = 0;
    for (const Pair& p : pairs) {
      open(cfg);
      const Launch& mine = odd ? p.odd : p.even;
      const Launch& theirs = odd ? p.even : p.odd;
      std::unique_ptr<AgOperands> ag;
      std::unique_ptr<RsOperands> rs;
      if (mine.ag) {
        ag = std::make_unique<AgOperands>(
            ag_prepare({mine.M, 520, 1032, NK, mine.algo, false, 0}, mix(seed ^ (0x313A + ++id))));
        ag_write_input(*ag, data());
      } else {
        rs = std::make_unique<RsOperands>(
            rs_prepare({mine.M, 1032, 520, NK, mine.algo, 0, mine.bf16_partials, mine.any_order},
                       mix(seed ^ (0x313A + ++id))));
      }
      CUDA_OK(cudaStreamSynchronize(stream));
      g.barrier();
      const auto t0 = std::chrono::steady_clock::now();
      if (ag) {
        CUDA_OK(k::launch_all_gather_gemm(sm->device(), ag_args(*ag), stream));
      } else {
        CUDA_OK(k::launch_gemm_reduce_scatter(sm->device(), rs_args(*rs), stream));
      }
      CUDA_OK(cudaStreamSynchronize(stream));  // returns: no hang
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const std::string who = "rank " + std::to_string(r) + " mismatch " + p.what;
      const k::CommErrorRecord rec = fusedcomm::testing::expect_launch_mismatch(*sm, r, W, who, s, 3.0);
      auto op_of = [](const Launch& l) {
        return l.ag ? k::kFusedOpAllGatherGemm : k::kFusedOpGemmReduceScatter;
      };
      check(k::comm_sig_op(rec.launch_sig) == op_of(mine) &&
                k::comm_sig_algo(rec.launch_sig) == static_cast<uint32_t>(mine.algo) &&
                k::comm_sig_op(rec.observed) == op_of(theirs) &&
                k::comm_sig_algo(rec.observed) == static_cast<uint32_t>(theirs.algo) &&
                rec.launch_sig != rec.observed,
            who + ": record holds both launches' signatures");
    }
  }

  // The last rank never launches: the others time out; an abort; then a fresh memory works.
  void dead_rank() {
    SymmetricConfig cfg;
    cfg.data_bytes = 32 << 20;
    cfg.timeout_ns = 1000ull * 1000 * 1000;  // 1 s
    const auto F = k::FusedAlgo::kFused;
    const auto NK = k::GemmLayoutB::kNK;
    for (k::AgExchange x : {k::AgExchange::kSmPulls, k::AgExchange::kCopyEngines}) {
      if (x == k::AgExchange::kCopyEngines && !copy_engines()) continue;
      // Copy engines: the start barrier kernel's wait gives up first; its record is kept.
      open(cfg);
      AgOperands ag = ag_prepare(AgCase{2999, 520, 1032, NK, F, false, 0}.with(x), mix(seed ^ 0xDEAD));
      ag_write_input(ag, data());
      CUDA_OK(cudaStreamSynchronize(stream));
      expect_timeout(x == k::AgExchange::kSmPulls ? "allGatherGemm, SM pulls" : "allGatherGemm, copy engines",
                     k::kFusedOpAllGatherGemm, k::kCommStepArrive, k::kFusedStepChunk,
                     [&] { return k::launch_all_gather_gemm(sm->device(), ag_args(ag), stream); });
    }
    {
      open(cfg);
      RsOperands rs = rs_prepare({2999, 1032, 520, NK, F, 0}, mix(seed ^ 0xDEAE));
      CUDA_OK(cudaStreamSynchronize(stream));
      // A rank waits for the dead one's start flag before its first push there, and for its
      // partials before summing its own rows: whichever wait gives up first is recorded.
      expect_timeout("gemmReduceScatter", k::kFusedOpGemmReduceScatter, k::kCommStepArrive,
                     k::kFusedStepPartial,
                     [&] { return k::launch_gemm_reduce_scatter(sm->device(), rs_args(rs), stream); });
    }
    {
      open(cfg);
      RsOperands o = rs_prepare({8, 2048, 1024, NK, k::FusedAlgo::kOneShot, 0}, mix(seed ^ 0xDEB0), true);
      DevBuf sums;
      CUDA_OK(cudaStreamSynchronize(stream));
      // A rank waits for the dead one's start flag before its first push, and for its tiles
      // before summing them: whichever wait gives up first is recorded.
      expect_timeout("gemmAllReduce one-shot", k::kFusedOpGemmAllReduce, k::kCommStepArrive, k::kFusedStepTile,
                     [&] { return k::launch_gemm_all_reduce(sm->device(), ar_args(o, sums), stream); });
    }
    {
      // Abort: a fused allGatherGemm waiting for the dead rank is stopped by the abort word.
      cfg.timeout_ns = 0;
      open(cfg);
      AgOperands ag = ag_prepare({2999, 520, 1032, NK, F, false, 0}, mix(seed ^ 0xDEAF));
      ag_write_input(ag, data());
      CUDA_OK(cudaStreamSynchronize(stream));
      if (r != W - 1) {
        const auto t0 = std::chrono::steady_clock::now();
        CUDA_OK(k::launch_all_gather_gemm(sm->device(), ag_args(ag), stream));
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        sm->abort();
        CUDA_OK(cudaStreamSynchronize(stream));
        const auto t1 = std::chrono::steady_clock::now();
        const double s = std::chrono::duration<double>(t1 - t0).count();
        const std::optional<Error> e = fusedcomm::testing::raised(*sm);
        const bool threw = e && e->kind() == ErrorKind::kCommunicator;
        const k::CommErrorRecord rec = sm->error();
        check(threw && rec.code == k::kGemmAborted && rec.op == k::kFusedOpAllGatherGemm && s < 3.0,
              "rank " + std::to_string(r) + ": abort stops a waiting allGatherGemm");
      }
    }
    // A fresh symmetric memory on the same processes works.
    SymmetricConfig fresh;
    fresh.data_bytes = 32 << 20;
    open(fresh);
    run_ag({1001, 264, 520, k::GemmLayoutB::kNK, F, true, 0}, mix(seed ^ 0xF2E5));
    run_rs({1001, 264, 520, k::GemmLayoutB::kKN, F, 0}, mix(seed ^ 0xF2E6));
    run_ar({64, 1032, 520, k::GemmLayoutB::kNK, k::FusedAlgo::kOneShot, 0}, mix(seed ^ 0xF2E7));
  }
};

int rank_main(ProcessGroup& g, const std::vector<int>& gpus, uint64_t seed) {
  CUDA_OK(cudaSetDevice(gpus[g.rank]));
  Rank R(g, seed);
  CUDA_OK(cudaStreamCreateWithFlags(&R.stream, cudaStreamNonBlocking));
  SymmetricConfig cfg;
  cfg.data_bytes = 64 << 20;
  R.open(cfg);
  if (g.rank == 0) std::printf("%s\n", R.sm->describe().c_str());
  auto t0 = std::chrono::steady_clock::now();
  auto lap = [&](const char* what) {
    const auto t1 = std::chrono::steady_clock::now();
    if (g.rank == 0) {
      std::printf("  %-24s %.1f s\n", what, std::chrono::duration<double>(t1 - t0).count());
      std::fflush(stdout);
    }
    t0 = t1;
  };
  auto finish = [&] {
    R.sm.reset();
    std::printf("  rank %d: %d passed, %d failed\n", g.rank, g_passed, g_failed);
    return g_failed == 0 ? 0 : 1;
  };
  // FC_TEST_ROUNDS=n: the correctness sweep n times with fresh data, and nothing else (to
  // measure how often an intermittent failure shows).
  if (const char* n = std::getenv("FC_TEST_ROUNDS")) {
    const int rounds = std::atoi(n);
    for (int i = 0; i < rounds; ++i) {
      R.seed = mix(seed + i);
      R.correctness();
    }
    lap("correctness sweep rounds");
    return finish();
  }
  R.correctness();
  lap("correctness sweep");
  R.back_to_back();
  lap("back-to-back x120");
  R.graph();
  lap("graph replay");
  R.one_shot_repeats();
  lap("one-shot repeats + graph");
  if (g.world == 1) {
    // World 1 (every row this rank's own): no peer to be late, to disagree or to die.
    if (g.rank == 0) std::printf("  late, mismatched and dead ranks need W >= 2: not run\n");
    return finish();
  }
  R.late_rank();
  R.late_rank_one_shot();
  lap("late rank");
  R.mismatch();
  lap("launch mismatch");
  R.dead_rank();
  lap("dead rank + abort");
  return finish();
}

}  // namespace

int main() {
  const int shared = fusedcomm::testing::shared_gpu_world();
  const int n = fusedcomm::testing::peer_gpus_or_skip("gpu_fused_test", shared);
  if (n == 0) return 77;
  const uint64_t seed = fusedcomm::testing::test_seed("gpu_fused_test", n);
  fusedcomm::testing::g_shared_gpu = shared > 0;  // every rank on GPU 0 (time-sliced)
  const int max_world = std::min(shared > 0 ? shared : n, k::kCommMaxRanks);
  int failed = 0;
  for (int w = 1; w <= max_world; ++w) {
    if (!fusedcomm::testing::test_world_selected(w)) continue;  // FC_TEST_WORLDS
    std::vector<int> gpus;
    for (int i = 0; i < w; ++i) gpus.push_back(shared > 0 ? 0 : i);
    std::printf("== world %d%s\n", w, shared > 0 ? " (all ranks on GPU 0)" : "");
    std::fflush(stdout);
    const auto t0 = std::chrono::steady_clock::now();
    const int f = fusedcomm::testing::run_processes(
        w, [&](ProcessGroup& g) { return rank_main(g, gpus, seed); }, 240);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("== world %d: %s (%.1f s)\n", w, f == 0 ? "PASS" : "FAIL", s);
    failed += f;
  }
  std::printf(failed == 0 ? "gpu_fused_test: PASS\n" : "gpu_fused_test: FAIL\n");
  return failed == 0 ? 0 : 1;
}
