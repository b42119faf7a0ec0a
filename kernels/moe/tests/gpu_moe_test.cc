// gpu_moe_test: moeDispatchGemm and moeCombine on the GPU (kernels/moe/moe.h) over
// SymmetricMemory, one forked process per rank, handles exchanged through pipes
// (process_group.h).
//   worlds: 1 (GPU 0), then every world W from 2 to the GPU count (at most 8) on GPUs 0..W-1;
//     FC_TEST_SHARED_GPU=<max world>: every rank on GPU 0 (protocol and numerics only).
//   correctness: random routings from several seeds (uniform; heavily unbalanced: most pairs
//     to expert 0; an expert that receives nothing; every pair to one expert), empty ranks
//     (T_r = 0), tokens that choose the same expert twice (ids drawn with replacement), E < W,
//     E not divisible by W, both weight layouts, hidden not a multiple of 64. Every rank makes
//     every rank's inputs (seeded) and derives the contract's rows (docs/ops.md: by local
//     expert, then source rank, token, slot) on the host: expert offsets, the count matrix,
//     every row's identity and weight, and routed_x bit for bit; out against an fp32
//     reference, |got - ref| <= 8e-3 |ref| + 2e-5 Σ|x·w| + 1e-6 for every element (outputs
//     poisoned with NaN first). The combine sends rows whose values encode their identity
//     home; the weighted sums are checked bit for bit against the contract's arithmetic (fp32
//     products and sums in slot order, rounded once).
//   moeGemmCombine (launch_moe_gemm_combine, h = the dispatch's out, W2 of width = hidden), both
//     paths (kDecomposed, kFused) after every correctness case, bit for bit against
//     launch_grouped_gemm then launch_moe_combine (the contract); the fused kernel also in the
//     back-to-back launches, the graph replays, with a late rank and with a rank that never
//     launches it (a timeout naming its start barrier and that rank); through CudaComm at kAuto.
//   errors: an expert id out of range on one rank, a capacity below the rows of one owner: every
//     rank gets the same status, no row moves, nothing hangs, and the next op works.
//   every section above and below runs with each dispatch path (MoeDispatchArgs::algo:
//     kDecomposed, then kFused, whose persistent kernel gets a 1/W share of the SMs when ranks
//     share a GPU, then the low-latency mode, MoeMode::kLowLatency, for the dispatch and the
//     combine, its grid capped the same way); a rank that launches 0.3 s late (W >= 2);
//     CudaComm's path at kAuto (fused_choice.h: decomposed with the data area's capacity,
//     low-latency at a decode-sized maxRecvRows), and CudaComm with maxRecvRows one below the
//     fullest rank's rows: the same Error(kInvalidArgument) on every rank, then the op at
//     exactly those rows.
//   1,000 back-to-back launches (200 when ranks share a GPU; dispatch and combine of two
//     routings alternating, an allReduce
//     between them every tenth time), no host synchronisation, the last outputs checked; CUDA
//     graph capture of dispatch + combine and 10 replays (outputs poisoned between replays);
//     a rank that never launches: the others time out (1 s) with an error record naming the
//     count exchange (the low-latency kernel's, in that mode) and the dead rank; a fresh
//     SymmetricMemory then works.
// FC_TEST_WORLDS=<w,...>: only those worlds. FC_MOE_TEST_PATHS=<decomposed,fused,low-latency>
// (any of them, comma-separated): only those dispatch paths (default: all three). Exit 77 (skip) with a reason where fewer than 2
// Hopper GPUs with peer access are visible (and the shared-GPU mode is off).
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "fusedcomm/comm/cuda_comm.h"
#include "fusedcomm/runtime/device_gemm.h"
#include "fusedcomm/runtime/errors.h"
#include "fusedcomm/runtime/runtime.h"
#include "fusedcomm/runtime/split.h"
#include "fusedcomm/runtime/symmetric_memory.h"
#include "kernels/collectives/collectives.h"
#include "kernels/common/fused.h"
#include "kernels/common/fused_choice.h"
#include "kernels/moe/moe.h"
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
using fusedcomm::testing::g_failed;
using fusedcomm::testing::g_passed;
using fusedcomm::testing::mix;
using fusedcomm::testing::ProcessGroup;

float bf(__nv_bfloat16 v) { return __bfloat162float(v); }
uint16_t bits(__nv_bfloat16 v) {
  uint16_t b;
  std::memcpy(&b, &v, 2);
  return b;
}
// Uniform in [-1, 1) from a key.
float unit(uint64_t h) { return static_cast<float>(static_cast<double>(h >> 11) * 0x1p-53 * 2.0 - 1.0); }

enum class Routing { kUniform, kSkewed, kNoLastExpert, kOneExpert };
const char* routing_name(Routing r) {
  switch (r) {
    case Routing::kUniform: return "uniform";
    case Routing::kSkewed: return "skewed";
    case Routing::kNoLastExpert: return "last-expert-empty";
    default: return "one-expert";
  }
}

struct Case {
  std::vector<int64_t> tokens;  // per rank
  int H, F, E, topk;
  Routing routing;
  k::GemmLayoutB layout;
  std::string name() const {
    std::string t;
    for (size_t i = 0; i < tokens.size(); ++i) t += (i ? "," : "") + std::to_string(tokens[i]);
    char b[240];
    std::snprintf(b, sizeof b, "W=%zu T=[%s] H=%d F=%d E=%d k=%d %s %s", tokens.size(), t.c_str(), H, F, E,
                  topk, routing_name(routing), layout == k::GemmLayoutB::kNK ? "NK" : "KN");
    return b;
  }
};

// Rank s's inputs under `key` (every rank can make every rank's).
struct Inputs {
  std::vector<__nv_bfloat16> x;  // T × H
  std::vector<int32_t> ids;      // T × topk
  std::vector<float> weights;    // T × topk
};
Inputs make_inputs(const Case& c, uint64_t key, int s) {
  Inputs in;
  const int64_t T = c.tokens[s];
  in.x.resize(static_cast<size_t>(T * c.H));
  for (int64_t i = 0; i < T * c.H; ++i)
    in.x[i] = __float2bfloat16_rn(unit(mix(key ^ mix(0x100 + s) ^ mix(i))));
  in.ids.resize(static_cast<size_t>(T * c.topk));
  in.weights.resize(in.ids.size());
  for (int64_t j = 0; j < T * c.topk; ++j) {
    const uint64_t h = mix(key ^ mix(0x200 + s) ^ mix(j));
    int e = static_cast<int>(h % c.E);
    if (c.routing == Routing::kSkewed && (h >> 40) % 8 != 0) e = 0;  // ~7/8 of the pairs
    if (c.routing == Routing::kNoLastExpert && c.E > 1) e = static_cast<int>(h % (c.E - 1));
    if (c.routing == Routing::kOneExpert) e = c.E / 2;
    in.ids[j] = e;
    in.weights[j] = unit(mix(h)) * 0.5f + 0.75f;
  }
  return in;
}
// Rank p's W1: E_p × F × H (NK) or E_p × H × F (KN), values of element (expert, n, k).
std::vector<__nv_bfloat16> make_w1(const Case& c, uint64_t key, int W, int p) {
  const int64_t El = split_count(c.E, W, p), first = split_offset(c.E, W, p);
  std::vector<__nv_bfloat16> w(static_cast<size_t>(El * c.F * c.H));
  for (int64_t i = 0; i < El; ++i)
    for (int n = 0; n < c.F; ++n)
      for (int kk = 0; kk < c.H; ++kk) {
        const __nv_bfloat16 v =
            __float2bfloat16_rn(unit(mix(key ^ mix(0x300 + first + i) ^ mix(int64_t(n) << 32 | kk))) * 0.25f);
        const int64_t at =
            c.layout == k::GemmLayoutB::kNK ? (i * c.F + n) * c.H + kk : (i * c.H + kk) * c.F + n;
        w[at] = v;
      }
  return w;
}
// The value a combine row carries: a function of its identity and column.
__nv_bfloat16 combine_value(int s, int64_t t, int slot, int col) {
  return __float2bfloat16_rn(unit(mix(uint64_t(s) << 56 ^ uint64_t(t) << 20 ^ uint64_t(slot) << 12 ^ col)));
}

// Rank p's W2 for moeGemmCombine: E_p × width × F (NK) or E_p × F × width (KN), random.
std::vector<__nv_bfloat16> make_w2(const Case& c, uint64_t key, int W, int p, int width) {
  const int64_t n = split_count(c.E, W, p) * width * c.F;
  std::vector<__nv_bfloat16> w(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    w[i] = __float2bfloat16_rn(unit(mix(key ^ mix(0x500 + p) ^ mix(i))) * 0.25f);
  return w;
}
// The MoE kernels take a valid pointer even for an empty buffer (no rows routed here).
constexpr size_t kMinAlloc = 256;
DevBuf dev(size_t n) { return DevBuf(n, kMinAlloc); }
template <typename T>
DevBuf upload(const std::vector<T>& v, cudaStream_t s) {
  return fusedcomm::testing::upload(v, s, kMinAlloc);
}

// One rank's buffers of a case: inputs, outputs, the device layout, the workspace.
struct Run {
  Case c;
  uint64_t key;
  int64_t capacity;
  Inputs in;
  DevBuf x, ids, weights, w1, routed, out, offsets, src_rank, src_token, src_slot, wts, counts, tokens,
      status, ws, expert_out, combined;
  k::MoeDispatchArgs d;
  k::MoeCombineArgs cb;
  int width;
  // moeGemmCombine of the dispatch's out (h: capacity × F) with W2 (width c.H): the reference
  // (grouped GEMM into gc_rows, then the combine into gc_ref) and the op's output.
  DevBuf w2, gc_rows, gc_ref, gc_out, gc_ws, gc_gemm_ws;
  k::MoeGemmCombineArgs gc;
};

struct Rank : fusedcomm::testing::SymmetricRank {
  using SymmetricRank::SymmetricRank;
  // The dispatch's path for every launch of the sections below (rank_main runs them with each).
  k::FusedAlgo algo = k::FusedAlgo::kDecomposed;
  // The low-latency mode (MoeMode::kLowLatency) for the dispatch and the combine instead.
  bool low_latency = false;

  const char* algo_name() const {
    return low_latency ? "low-latency" : algo == k::FusedAlgo::kFused ? "fused" : "decomposed";
  }
  k::MoeMode mode() const { return low_latency ? k::MoeMode::kLowLatency : k::MoeMode::kNormal; }

  std::unique_ptr<Run> prepare(const Case& c, uint64_t key, int64_t capacity = -1) {
    auto run = std::make_unique<Run>();
    Run& R = *run;
    R.c = c;
    R.key = key;
    int64_t all = 0;
    for (int64_t t : c.tokens) all += t * c.topk;
    R.capacity = capacity >= 0 ? capacity : all;
    R.in = make_inputs(c, key, r);
    R.x = upload(R.in.x, stream);
    R.ids = upload(R.in.ids, stream);
    R.weights = upload(R.in.weights, stream);
    R.w1 = upload(make_w1(c, key, W, r), stream);
    const int64_t cap = R.capacity, El = split_count(c.E, W, r);
    R.routed = dev(cap * c.H * 2);
    R.out = dev(cap * c.F * 2);
    R.offsets = dev((El + 1) * 8);
    R.src_rank = dev(cap * 4);
    R.src_token = dev(cap * 4);
    R.src_slot = dev(cap * 4);
    R.wts = dev(cap * 4);
    R.counts = dev(static_cast<size_t>(W) * c.E * 4);
    R.tokens = dev(W * 4);
    R.status = dev(sizeof(k::MoeStatus));
    R.ws = dev(k::moe_dispatch_workspace_bytes(c.tokens[r], c.topk, c.E, W, r, cap));
    k::MoeDispatchArgs& d = R.d;
    d.x = R.x.as<__nv_bfloat16>();
    d.tokens = c.tokens[r];
    d.hidden = c.H;
    d.topk_ids = R.ids.as<int32_t>();
    d.topk_weights = R.weights.as<float>();
    d.topk = c.topk;
    d.num_experts = c.E;
    d.w1 = R.w1.as<__nv_bfloat16>();
    d.ffn = c.F;
    d.w1_layout = c.layout;
    d.capacity = cap;
    d.routed_x = R.routed.as<__nv_bfloat16>();
    d.out = R.out.as<__nv_bfloat16>();
    d.layout = {R.offsets.as<int64_t>(),  R.src_rank.as<int32_t>(),   R.src_token.as<int32_t>(),
                R.src_slot.as<int32_t>(), R.wts.as<float>(),          R.counts.as<int32_t>(),
                R.tokens.as<int32_t>(),   R.status.as<k::MoeStatus>()};
    d.workspace = R.ws.p;
    d.workspace_bytes = R.ws.bytes;
    d.algo = algo;
    d.mode = mode();
    if (fusedcomm::testing::g_shared_gpu && W > 1) {
      // Every rank's persistent kernel on the one GPU at once: a share of its SMs each.
      int dev = 0, sms = 0;
      CUDA_OK(cudaGetDevice(&dev));
      CUDA_OK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
      d.fused_ctas = std::max(2, sms / W);
    }
    R.width = 64;
    R.expert_out = dev(cap * R.width * 2);
    R.combined = dev(c.tokens[r] * R.width * 2);
    k::MoeCombineArgs& cb = R.cb;
    cb.expert_out = R.expert_out.as<__nv_bfloat16>();
    cb.width = R.width;
    cb.layout = d.layout;
    cb.num_experts = c.E;
    cb.topk = c.topk;
    cb.capacity = cap;
    cb.tokens = c.tokens[r];
    cb.topk_weights = R.weights.as<float>();
    cb.out = R.combined.as<__nv_bfloat16>();
    cb.mode = mode();
    cb.ctas = d.fused_ctas;
    R.w2 = upload(make_w2(c, key, W, r, c.H), stream);
    R.gc_rows = dev(cap * c.H * 2);
    R.gc_ref = dev(c.tokens[r] * c.H * 2);
    R.gc_out = dev(c.tokens[r] * c.H * 2);
    R.gc_ws =
        dev(k::moe_gemm_combine_workspace_bytes(cap, static_cast<int>(El), c.H, k::FusedAlgo::kDecomposed));
    R.gc_gemm_ws = dev(k::grouped_gemm_workspace_bytes(cap, static_cast<int>(El)));
    k::MoeGemmCombineArgs& gc = R.gc;
    gc.h = R.out.as<__nv_bfloat16>();
    gc.rows = cap;
    gc.k = c.F;
    gc.w2 = R.w2.as<__nv_bfloat16>();
    gc.w2_layout = c.layout;
    gc.width = c.H;
    gc.layout = d.layout;
    gc.num_experts = c.E;
    gc.topk = c.topk;
    gc.tokens = c.tokens[r];
    gc.topk_weights = R.weights.as<float>();
    gc.out = R.gc_out.as<__nv_bfloat16>();
    gc.workspace = R.gc_ws.p;
    gc.workspace_bytes = R.gc_ws.bytes;
    gc.fused_ctas = d.fused_ctas;
    return run;
  }

  // The reference of moeGemmCombine at this rank: launch_grouped_gemm of h with W2 into rows,
  // then launch_moe_combine of those rows (the contract: moeCombine(groupedGemm(h, w2))).
  void gemm_combine_reference(Run& R) {
    CUDA_OK(cudaMemsetAsync(R.gc_ref.p, 0xFF, R.gc_ref.bytes, stream));
    const int64_t El = split_count(R.c.E, W, r);
    if (El > 0 && R.capacity > 0) {
      k::GroupedGemmArgs g;
      g.A = R.gc.h;
      g.rows_capacity = R.capacity;
      g.offsets = R.d.layout.expert_offsets;
      g.groups = static_cast<int>(El);
      g.B = R.gc.w2;
      g.b_layout = R.gc.w2_layout;
      g.N = R.gc.width;
      g.K = R.gc.k;
      g.C = R.gc_rows.as<__nv_bfloat16>();
      g.workspace = R.gc_gemm_ws.p;
      g.workspace_bytes = R.gc_gemm_ws.bytes;
      CUDA_OK(k::launch_grouped_gemm(g, stream));
    }
    k::MoeCombineArgs cb = R.cb;
    cb.expert_out = R.gc_rows.as<__nv_bfloat16>();
    cb.width = R.gc.width;
    cb.out = R.gc_ref.as<__nv_bfloat16>();
    CUDA_OK(k::launch_moe_combine(sm->device(), cb, stream));
    CUDA_OK(cudaStreamSynchronize(stream));
    sm->raise_if_failed();
  }

  // moeGemmCombine's output and status against the reference, bit for bit.
  void check_gemm_combine(Run& R, const std::string& what) {
    const k::MoeStatus st = status(R);
    check(st.code == k::kMoeOk, what + ": status ok (got " + std::to_string(st.code) + ")");
    const int64_t n = R.c.tokens[r] * R.gc.width;
    const auto want = download<__nv_bfloat16>(R.gc_ref.p, n), got = download<__nv_bfloat16>(R.gc_out.p, n);
    int64_t bad = 0;
    for (int64_t i = 0; i < n; ++i) bad += bits(want[i]) != bits(got[i]);
    check(bad == 0, what + ": bit-exact against groupedGemm then moeCombine (" + std::to_string(bad) +
                        " of " + std::to_string(n) + " elements differ)");
  }

  // Both paths of launch_moe_gemm_combine after a dispatch (its out is h).
  void run_gemm_combine(Run& R, const std::string& what) {
    gemm_combine_reference(R);
    for (const k::FusedAlgo algo : {k::FusedAlgo::kDecomposed, k::FusedAlgo::kFused}) {
      R.gc.algo = algo;
      CUDA_OK(cudaMemsetAsync(R.gc_out.p, 0xFF, R.gc_out.bytes, stream));
      CUDA_OK(k::launch_moe_gemm_combine(sm->device(), R.gc, stream));
      CUDA_OK(cudaStreamSynchronize(stream));
      sm->raise_if_failed();
      check_gemm_combine(R,
                         what + " gemm+combine " + (algo == k::FusedAlgo::kFused ? "fused" : "decomposed"));
    }
  }

  void poison(Run& R) {
    CUDA_OK(cudaMemsetAsync(R.gc_out.p, 0xFF, R.gc_out.bytes, stream));
    CUDA_OK(cudaMemsetAsync(R.routed.p, 0xFF, R.routed.bytes, stream));
    CUDA_OK(cudaMemsetAsync(R.out.p, 0xFF, R.out.bytes, stream));
    CUDA_OK(cudaMemsetAsync(R.combined.p, 0xFF, R.combined.bytes, stream));
  }

  k::MoeStatus status(Run& R) { return download<k::MoeStatus>(R.status.p, 1)[0]; }

  // The expert rows of the combine, from the downloaded identities.
  void write_expert_out(Run& R, int64_t rows) {
    const auto sr = download<int32_t>(R.src_rank.p, rows), st = download<int32_t>(R.src_token.p, rows),
               ss = download<int32_t>(R.src_slot.p, rows);
    std::vector<__nv_bfloat16> eo(static_cast<size_t>(rows * R.width));
    for (int64_t i = 0; i < rows; ++i)
      for (int col = 0; col < R.width; ++col) eo[i * R.width + col] = combine_value(sr[i], st[i], ss[i], col);
    if (rows > 0) {
      CUDA_OK(cudaMemcpyAsync(R.expert_out.p, eo.data(), eo.size() * 2, cudaMemcpyHostToDevice, stream));
      CUDA_OK(cudaStreamSynchronize(stream));
    }
  }

  // What a dispatch gave this rank, on the host.
  struct Got {
    std::vector<int64_t> offsets;
    std::vector<int32_t> src_rank, src_token, src_slot;
    std::vector<float> weight;
    std::vector<__nv_bfloat16> routed, out;
  };

  // Checks this rank's dispatch outputs (kernel launch: on the device) against the contract;
  // returns the row count.
  int64_t check_dispatch(Run& R, const std::string& what) {
    const Case& c = R.c;
    const int64_t El = split_count(c.E, W, r);
    const k::MoeStatus st = status(R);
    check(st.code == k::kMoeOk, what + ": status ok (got " + std::to_string(st.code) + ")");
    std::vector<int32_t> counts(static_cast<size_t>(W) * c.E, 0);
    for (int s = 0; s < W; ++s)
      for (int32_t id : (s == r ? R.in : make_inputs(c, R.key, s)).ids) ++counts[s * c.E + id];
    check(download<int32_t>(R.counts.p, counts.size()) == counts, what + ": count matrix");
    Got g;
    g.offsets = download<int64_t>(R.offsets.p, El + 1);
    const int64_t n = std::min(g.offsets.back(), R.capacity);
    g.src_rank = download<int32_t>(R.src_rank.p, n);
    g.src_token = download<int32_t>(R.src_token.p, n);
    g.src_slot = download<int32_t>(R.src_slot.p, n);
    g.weight = download<float>(R.wts.p, n);
    g.routed = download<__nv_bfloat16>(R.routed.p, n * c.H);
    g.out = download<__nv_bfloat16>(R.out.p, n * c.F);
    return check_rows(c, R.key, R.in, g, what);
  }

  // The contract's rows at this rank against `g`.
  int64_t check_rows(const Case& c, uint64_t key, const Inputs& mine, const Got& g, const std::string& what) {
    const int E = c.E;
    const int64_t El = split_count(E, W, r), first = split_offset(E, W, r);
    std::vector<Inputs> ins;
    for (int s = 0; s < W; ++s) ins.push_back(s == r ? mine : make_inputs(c, key, s));
    struct Row {
      int s;
      int64_t t;
      int slot;
      int64_t e;
    };
    std::vector<Row> rows;
    std::vector<int64_t> offsets(El + 1, 0);
    for (int64_t i = 0; i < El; ++i) {
      offsets[i] = static_cast<int64_t>(rows.size());
      for (int s = 0; s < W; ++s)
        for (int64_t t = 0; t < c.tokens[s]; ++t)
          for (int q = 0; q < c.topk; ++q)
            if (ins[s].ids[t * c.topk + q] == first + i) rows.push_back({s, t, q, first + i});
    }
    offsets[El] = static_cast<int64_t>(rows.size());
    const int64_t n = offsets[El];
    check(g.offsets == offsets, what + ": expert offsets");
    if (g.offsets != offsets || static_cast<int64_t>(g.src_rank.size()) < n) return n;
    const auto w1 = make_w1(c, key, W, r);
    int64_t bad_meta = 0, bad_rows = 0, bad_out = 0;
    double worst = 0;
    for (int64_t i = 0; i < n; ++i) {
      const Row& w = rows[i];
      const int64_t pair = w.t * c.topk + w.slot;
      if (g.src_rank[i] != w.s || g.src_token[i] != w.t || g.src_slot[i] != w.slot ||
          g.weight[i] != ins[w.s].weights[pair]) {
        ++bad_meta;
      }
      for (int h = 0; h < c.H; ++h)
        if (bits(g.routed[i * c.H + h]) != bits(ins[w.s].x[w.t * c.H + h])) {
          ++bad_rows;
          break;
        }
      const int64_t le = w.e - first;
      for (int col = 0; col < c.F; ++col) {
        double ref = 0, mag = 0;
        for (int h = 0; h < c.H; ++h) {
          const int64_t at =
              c.layout == k::GemmLayoutB::kNK ? (le * c.F + col) * c.H + h : (le * c.H + h) * c.F + col;
          const double p = double(bf(ins[w.s].x[w.t * c.H + h])) * bf(w1[at]);
          ref += p;
          mag += std::fabs(p);
        }
        const double got = bf(g.out[i * c.F + col]);
        const double err = std::fabs(got - ref), bound = 8e-3 * std::fabs(ref) + 2e-5 * mag + 1e-6;
        if (!(err <= bound)) ++bad_out;
        if (bound > 0) worst = std::max(worst, std::isnan(err) ? 1e9 : err / bound);
      }
    }
    check(bad_meta == 0, what + ": row identities and weights (" + std::to_string(bad_meta) + " wrong)");
    check(bad_rows == 0, what + ": routed_x bit-exact (" + std::to_string(bad_rows) + " rows differ)");
    check(bad_out == 0, what + ": out within the bound (" + std::to_string(bad_out) +
                            " elements outside; worst " + std::to_string(worst) + " of the bound)");
    return n;
  }

  // The combine's expected sums at this rank, bit for bit.
  int64_t combine_mismatches(const Case& c, const Inputs& mine, int width,
                             const std::vector<__nv_bfloat16>& got) {
    const int64_t T = c.tokens[r];
    int64_t bad = 0;
    for (int64_t t = 0; t < T; ++t)
      for (int col = 0; col < width; ++col) {
        volatile float acc = 0.f;
        for (int q = 0; q < c.topk; ++q) {
          volatile float p = mine.weights[t * c.topk + q] * bf(combine_value(r, t, q, col));
          acc = acc + p;
        }
        if (bits(got[t * width + col]) != bits(__float2bfloat16_rn(acc))) ++bad;
      }
    return bad;
  }

  void check_combine(Run& R, const std::string& what) {
    const k::MoeStatus st = status(R);
    check(st.code == k::kMoeOk, what + ": combine status ok (got " + std::to_string(st.code) + ")");
    const auto got = download<__nv_bfloat16>(R.combined.p, R.c.tokens[r] * R.width);
    const int64_t bad = combine_mismatches(R.c, R.in, R.width, got);
    check(bad == 0, what + ": combine bit-exact (" + std::to_string(bad) + " elements differ)");
  }

  void run_case(const Case& c, uint64_t key) {
    auto R = prepare(c, key);
    const std::string what = c.name() + " " + algo_name();
    poison(*R);
    CUDA_OK(k::launch_moe_dispatch(sm->device(), R->d, stream));
    CUDA_OK(cudaStreamSynchronize(stream));
    sm->raise_if_failed();
    const int64_t rows = check_dispatch(*R, what);
    write_expert_out(*R, std::min(rows, R->capacity));
    CUDA_OK(k::launch_moe_combine(sm->device(), R->cb, stream));
    CUDA_OK(cudaStreamSynchronize(stream));
    sm->raise_if_failed();
    check_combine(*R, what);
    run_gemm_combine(*R, what);
  }

  std::vector<int64_t> tokens_of(std::initializer_list<int64_t> pattern) {
    std::vector<int64_t> t;
    auto it = pattern.begin();
    for (int s = 0; s < W; ++s) {
      t.push_back(*it);
      if (++it == pattern.end()) it = pattern.begin();
    }
    return t;
  }

  void correctness() {
    const auto NK = k::GemmLayoutB::kNK, KN = k::GemmLayoutB::kKN;
    for (int round = 0; round < 3; ++round) {
      const uint64_t key = mix(seed + round);
      run_case({tokens_of({300, 171, 64}), 264, 136, 8, 2, Routing::kUniform, NK}, key);
      run_case({tokens_of({257}), 512, 256, 2 * W + 1, 4, Routing::kSkewed, NK}, mix(key ^ 1));
      run_case({tokens_of({0, 200}), 136, 264, 5, 3, Routing::kNoLastExpert, KN}, mix(key ^ 2));
    }
    run_case({tokens_of({129}), 256, 128, 1, 2, Routing::kUniform, NK}, mix(seed ^ 3));  // E = 1 (< W)
    run_case({tokens_of({100, 7}), 128, 128, 3, 8, Routing::kOneExpert, KN}, mix(seed ^ 4));
    run_case({tokens_of({0}), 128, 128, 4, 2, Routing::kUniform, NK}, mix(seed ^ 5));  // no tokens at all
    run_case({tokens_of({1000}), 1024, 512, 64, 8, Routing::kUniform, NK}, mix(seed ^ 6));
  }

  void errors() {
    const auto NK = k::GemmLayoutB::kNK;
    // An expert id out of range on the last rank: every rank gets the same status.
    {
      const Case c{tokens_of({64}), 128, 128, 6, 2, Routing::kUniform, NK};
      auto R = prepare(c, mix(seed ^ 0xBAD));
      if (r == W - 1) {
        R->in.ids[3 * c.topk + 1] = c.E;
        CUDA_OK(cudaMemcpy(R->ids.p, R->in.ids.data(), R->in.ids.size() * 4, cudaMemcpyHostToDevice));
      }
      CUDA_OK(k::launch_moe_dispatch(sm->device(), R->d, stream));
      CUDA_OK(cudaStreamSynchronize(stream));
      sm->raise_if_failed();
      const k::MoeStatus st = status(*R);
      check(st.code == k::kMoeBadExpert && st.rank == W - 1 && st.a == 3 * c.topk + 1 && st.b == c.E,
            "bad expert id: every rank names rank " + std::to_string(W - 1) + " pair 7 id 6 (got code " +
                std::to_string(st.code) + " rank " + std::to_string(st.rank) + " a " + std::to_string(st.a) +
                " b " + std::to_string(st.b) + ")");
    }
    // A capacity below one owner's rows.
    {
      const Case c{tokens_of({200}), 128, 128, 4, 2, Routing::kSkewed, NK};
      auto R = prepare(c, mix(seed ^ 0xCAB), 16);
      CUDA_OK(k::launch_moe_dispatch(sm->device(), R->d, stream));
      CUDA_OK(cudaStreamSynchronize(stream));
      sm->raise_if_failed();
      const k::MoeStatus st = status(*R);
      check(st.code == k::kMoeOverflow && st.b == 16 && st.a > 16,
            "overflow: every rank gets the same status (got code " + std::to_string(st.code) + " rank " +
                std::to_string(st.rank) + " rows " + std::to_string(st.a) + ")");
      const auto off = download<int64_t>(R->offsets.p, split_count(c.E, W, r) + 1);
      check(off.back() == 0, "overflow: no rows received");
    }
    // The next op works.
    run_case({tokens_of({77}), 128, 128, 4, 2, Routing::kUniform, NK}, mix(seed ^ 0xCAC));
  }

  void back_to_back() {
    const auto NK = k::GemmLayoutB::kNK;
    const Case a{tokens_of({96, 33}), 256, 128, 6, 2, Routing::kUniform, NK};
    const Case b{tokens_of({40, 128}), 256, 128, 6, 3, Routing::kSkewed, NK};
    auto A = prepare(a, mix(seed ^ 0xB2B1)), B = prepare(b, mix(seed ^ 0xB2B2));
    DevBuf ar_in(4096 * 2), ar_out(4096 * 2);
    CUDA_OK(cudaMemsetAsync(ar_in.p, 0, ar_in.bytes, stream));
    // The expert rows: identity-valued rows need the layouts, so run each once first.
    for (Run* R : {A.get(), B.get()}) {
      CUDA_OK(k::launch_moe_dispatch(sm->device(), R->d, stream));
      CUDA_OK(cudaStreamSynchronize(stream));
      sm->raise_if_failed();
      write_expert_out(*R, download<int64_t>(R->offsets.p, split_count(R->c.E, W, r) + 1).back());
    }
    for (Run* R : {A.get(), B.get()}) {
      gemm_combine_reference(*R);
      R->gc.algo = k::FusedAlgo::kFused;
    }
    const int n = fusedcomm::testing::shared_gpu_scale(250);  // x 4 ops, every fifth time x 6
    for (int i = 0; i < n; ++i) {
      for (Run* R : {A.get(), B.get()}) {
        CUDA_OK(k::launch_moe_dispatch(sm->device(), R->d, stream));
        CUDA_OK(k::launch_moe_combine(sm->device(), R->cb, stream));
        if (i % 5 == 0) CUDA_OK(k::launch_moe_gemm_combine(sm->device(), R->gc, stream));
      }
      if (i % 10 == 0) {
        k::CollectiveArgs ar;
        ar.op = k::CommOp::kAllReduce;
        ar.dtype = k::CommDtype::kBF16;
        ar.count = 4096;
        ar.algo = k::CommAlgo::kOneShot;
        ar.input = ar_in.p;
        ar.output = ar_out.p;
        CUDA_OK(k::launch_collective(sm->device(), ar, stream));
      }
    }
    CUDA_OK(cudaStreamSynchronize(stream));
    sm->raise_if_failed();
    const std::string what = std::to_string(4 * n) + " back-to-back launches (" + algo_name() + ")";
    check_dispatch(*A, what + " (a)");
    check_combine(*A, what + " (a)");
    check_dispatch(*B, what + " (b)");
    check_combine(*B, what + " (b)");
    check_gemm_combine(*A, what + " fused gemm+combine (a)");
    check_gemm_combine(*B, what + " fused gemm+combine (b)");
  }

  void graph() {
    const Case c{tokens_of({150, 61}), 256, 128, 5, 2, Routing::kUniform, k::GemmLayoutB::kNK};
    auto R = prepare(c, mix(seed ^ 0x6A));
    CUDA_OK(k::launch_moe_dispatch(sm->device(), R->d, stream));
    CUDA_OK(cudaStreamSynchronize(stream));
    write_expert_out(*R, download<int64_t>(R->offsets.p, split_count(c.E, W, r) + 1).back());
    gemm_combine_reference(*R);
    R->gc.algo = k::FusedAlgo::kFused;
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    CUDA_OK(k::launch_moe_dispatch(sm->device(), R->d, stream));
    CUDA_OK(k::launch_moe_combine(sm->device(), R->cb, stream));
    CUDA_OK(k::launch_moe_gemm_combine(sm->device(), R->gc, stream));
    CUDA_OK(cudaStreamEndCapture(stream, &graph));
    CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    for (int i = 0; i < 10; ++i) {
      poison(*R);
      CUDA_OK(cudaGraphLaunch(exec, stream));
      CUDA_OK(cudaStreamSynchronize(stream));
      sm->raise_if_failed();
      if (i == 0 || i == 9) {
        const std::string what = "graph replay " + std::to_string(i);
        check_dispatch(*R, what);
        check_combine(*R, what);
        check_gemm_combine(*R, what + " fused gemm+combine");
      }
    }
    CUDA_OK(cudaGraphExecDestroy(exec));
    CUDA_OK(cudaGraphDestroy(graph));
  }

  // A rank that launches late (after the others' launch has been waiting for 0.3 s): every
  // result as usual.
  void late_rank() {
    const Case c{tokens_of({200, 90}), 256, 128, 2 * W + 1, 3, Routing::kUniform, k::GemmLayoutB::kNK};
    auto R = prepare(c, mix(seed ^ 0x1A7E));
    poison(*R);
    CUDA_OK(cudaStreamSynchronize(stream));
    g.barrier();
    if (r == W - 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    CUDA_OK(k::launch_moe_dispatch(sm->device(), R->d, stream));
    CUDA_OK(cudaStreamSynchronize(stream));
    sm->raise_if_failed();
    check_dispatch(*R, std::string("late rank ") + algo_name());
    gemm_combine_reference(*R);
    R->gc.algo = k::FusedAlgo::kFused;
    g.barrier();
    if (r == 0) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    CUDA_OK(k::launch_moe_gemm_combine(sm->device(), R->gc, stream));
    CUDA_OK(cudaStreamSynchronize(stream));
    sm->raise_if_failed();
    check_gemm_combine(*R, std::string("late rank, fused gemm+combine, ") + algo_name());
  }

  void dead_rank() {
    SymmetricConfig cfg;
    cfg.data_bytes = 32 << 20;
    cfg.timeout_ns = 1000ull * 1000 * 1000;
    open(cfg);
    const Case c{tokens_of({64}), 128, 128, 4, 2, Routing::kUniform, k::GemmLayoutB::kNK};
    auto R = prepare(c, mix(seed ^ 0xDEAD));
    if (r != W - 1) {
      const auto t0 = std::chrono::steady_clock::now();
      CUDA_OK(k::launch_moe_dispatch(sm->device(), R->d, stream));
      CUDA_OK(cudaStreamSynchronize(stream));
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const std::optional<Error> e = fusedcomm::testing::raised(*sm);
      const k::CommErrorRecord rec = sm->error();
      if (r == 0) std::printf("  dead rank after %.2f s: %s\n", s, e ? e->what() : "(no error)");
      const uint32_t op = low_latency ? k::kMoeOpLowLatency : k::kMoeOpCounts;
      check(e && e->kind() == ErrorKind::kTimeout && rec.op == op && rec.step == k::kMoeStepCounts &&
                rec.peer == static_cast<uint32_t>(W - 1) && s < 5.0,
            std::string("dead rank (") + algo_name() +
                "): a clear timeout naming the count exchange and rank " + std::to_string(W - 1));
    }
    SymmetricConfig fresh;
    fresh.data_bytes = 64 << 20;
    open(fresh);
    run_case({tokens_of({90}), 128, 128, 4, 2, Routing::kUniform, k::GemmLayoutB::kNK}, mix(seed ^ 0xF2));
    if (algo != k::FusedAlgo::kFused) return;
    // The fused moeGemmCombine with a rank that never launches it: the others time out naming
    // its start barrier (arrive) and that rank; a fresh SymmetricMemory then works.
    open(cfg);
    {
      const Case c2{tokens_of({64}), 128, 128, 4, 2, Routing::kUniform, k::GemmLayoutB::kNK};
      auto R2 = prepare(c2, mix(seed ^ 0xDEAF));
      CUDA_OK(k::launch_moe_dispatch(sm->device(), R2->d, stream));
      CUDA_OK(cudaStreamSynchronize(stream));
      sm->raise_if_failed();
      g.barrier();
      if (r != W - 1) {
        R2->gc.algo = k::FusedAlgo::kFused;
        const auto t0 = std::chrono::steady_clock::now();
        CUDA_OK(k::launch_moe_gemm_combine(sm->device(), R2->gc, stream));
        CUDA_OK(cudaStreamSynchronize(stream));
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        const std::optional<Error> e = fusedcomm::testing::raised(*sm);
        const k::CommErrorRecord rec = sm->error();
        if (r == 0)
          std::printf("  dead rank (fused gemm+combine) after %.2f s: %s\n", s, e ? e->what() : "(no error)");
        check(e && e->kind() == ErrorKind::kTimeout && rec.op == k::kMoeOpGemmCombine &&
                  rec.step == k::kCommStepArrive && rec.peer == static_cast<uint32_t>(W - 1) && s < 5.0,
              "dead rank: the fused gemm+combine times out naming its start barrier and rank " +
                  std::to_string(W - 1));
      }
    }
    open(fresh);
    run_case({tokens_of({90}), 128, 128, 4, 2, Routing::kUniform, k::GemmLayoutB::kNK}, mix(seed ^ 0xF3));
  }
};

// The same ops through the runtime objects the C API drives (Runtime, CudaComm), bootstrapped
// as the C API's callers do it: results as the host reads them (the layout copied when the op
// returns, the outputs through MoeDeviceResult::copy), a bad id as Error(kInvalidArgument) on
// every rank, a receive bound (maxRecvRows) one below the fullest rank's rows as the same
// Error(kInvalidArgument) on every rank, and the next op after them (bounded at those rows).
void runtime_path(Rank& R, int gpu) {
  const int W = R.W, r = R.r;
  fusedcomm::Runtime rt(fusedcomm::testing::loopback_cuda_config(gpu, R.seed, 20000, 64 << 20,
                                                                 fusedcomm::testing::g_shared_gpu));
  auto dc = std::make_unique<fusedcomm::CudaComm>(rt, r, W);
  {
    const std::string ep = dc->endpoint();
    const auto eps = R.g.all_gather(std::vector<uint8_t>(ep.begin(), ep.end()));
    fusedcomm::Bootstrap b;
    b.rank = r;
    b.comm_id = 4242;
    b.device_handles = R.g.all_gather(dc->device_handle());
    const fusedcomm::rdma::auth::Share share = fusedcomm::rdma::auth::random_share();
    for (const auto& sh : R.g.all_gather(std::vector<uint8_t>(share.begin(), share.end()))) {
      std::memcpy(b.auth_shares.emplace_back().data(), sh.data(), share.size());
    }
    b.host_ids.assign(W, 0);
    for (const auto& e : eps) b.endpoints.emplace_back(e.begin(), e.end());
    dc->connect(b);
  }
  const Case c{R.tokens_of({300, 0, 77}), 256, 128, 2 * W + 1, 4, Routing::kUniform, k::GemmLayoutB::kNK};
  const uint64_t key = mix(R.seed ^ 0x4C);
  Inputs in = make_inputs(c, key, r);
  DevBuf x = upload(in.x, R.stream), ids = upload(in.ids, R.stream), wts = upload(in.weights, R.stream),
         w1 = upload(make_w1(c, key, W, r), R.stream);
  const fusedcomm::OpDesc desc{"moeDispatchGemm (test)", 0};
  // bound: MoeDispatchOptions::max_recv_rows (0: the data area's capacity).
  auto dispatch = [&](int64_t bound = 0) {
    fusedcomm::host::MoeDispatchOptions options;
    options.max_recv_rows = bound;
    return dc->moe_dispatch_gemm(desc, fusedcomm::DType::kBF16, x.p, c.tokens[r], c.H, ids.as<int32_t>(),
                                 wts.as<float>(), c.topk, c.E, w1.p, c.F, options);
  };
  const std::string what = "CudaComm " + c.name();
  // Round 0 without a bound; round 1 with maxRecvRows = the most rows any rank received in
  // round 0 (outputs sized by it, the fullest rank filling them), after an overflow.
  int64_t most_rows = 0;
  int most_rank = 0;
  for (int round = 0; round < 2; ++round) {
    auto res = dispatch(round == 0 ? 0 : most_rows);
    const fusedcomm::host::MoeLayout& l = res->layout;
    Rank::Got g;
    g.offsets = l.expert_offsets;
    g.src_rank = l.src_rank;
    g.src_token = l.src_token;
    g.src_slot = l.src_slot;
    g.weight = l.weight;
    const int64_t rows = l.rows();
    g.routed.resize(static_cast<size_t>(rows * c.H));
    g.out.resize(static_cast<size_t>(rows * c.F));
    check(res->device != nullptr, what + ": the result stays on the GPU");
    // kAuto: the decomposed path with the data area's capacity; the low-latency one at a bound
    // of decode size (fused_choice.h).
    const bool ll = round == 1 && k::choose_moe_low_latency(k::MoeMode::kAuto, W, most_rows, c.topk);
    const std::string want_path = ll ? "low-latency" : "decomposed";
    if (r == 0)
      std::printf("  moeDispatchGemm through CudaComm, round %d: %s path\n", round, res->path.c_str());
    check(res->path == want_path,
          what + ": kAuto's path is the " + want_path + " one (got '" + res->path + "')");
    res->device->copy(g.out.data(), g.routed.data());
    R.check_rows(c, key, in, g, what + (round ? " (after a failed op)" : ""));
    // Combine: rows that carry their identity, home.
    const int width = 40;
    std::vector<__nv_bfloat16> eo(static_cast<size_t>(rows * width));
    for (int64_t i = 0; i < rows; ++i)
      for (int col = 0; col < width; ++col)
        eo[i * width + col] = combine_value(l.src_rank[i], l.src_token[i], l.src_slot[i], col);
    DevBuf eod = upload(eo, R.stream), outd(static_cast<size_t>(c.tokens[r] * width * 2));
    dc->moe_combine({"moeCombine (test)", 0}, fusedcomm::DType::kBF16, *res, eod.p, width, outd.p);
    const int64_t bad =
        R.combine_mismatches(c, in, width, download<__nv_bfloat16>(outd.p, c.tokens[r] * width));
    check(bad == 0, what + ": combine bit-exact (" + std::to_string(bad) + " elements differ)");
    {
      // moeGemmCombine of the dispatch's out with W2 against groupedGemm then moeCombine.
      const int gw = 136;
      const int64_t El = split_count(c.E, W, r);
      DevBuf hd(static_cast<size_t>(std::max<int64_t>(rows, 1) * c.F * 2)),
          w2 = upload(make_w2(c, key, W, r, gw), R.stream),
          rowsd(static_cast<size_t>(std::max<int64_t>(rows, 1) * gw * 2)),
          refd(static_cast<size_t>(std::max<int64_t>(c.tokens[r], 1) * gw * 2)),
          gotd(static_cast<size_t>(std::max<int64_t>(c.tokens[r], 1) * gw * 2));
      res->device->copy(hd.p, nullptr);
      if (El > 0 && rows > 0) {
        fusedcomm::device_grouped_gemm_bf16(hd.p, w2.p, rowsd.p, l.expert_offsets.data(), El, rows, gw, c.F,
                                            fusedcomm::WeightLayout::kNK);
      }
      dc->moe_combine({"moeCombine (test)", 0}, fusedcomm::DType::kBF16, *res, rowsd.p, gw, refd.p);
      dc->moe_gemm_combine({"moeGemmCombine (test)", 0}, fusedcomm::DType::kBF16, *res, hd.p, c.F, w2.p,
                           fusedcomm::WeightLayout::kNK, gw, gotd.p);
      const auto want = download<__nv_bfloat16>(refd.p, c.tokens[r] * gw),
                 got = download<__nv_bfloat16>(gotd.p, c.tokens[r] * gw);
      int64_t diff = 0;
      for (size_t i = 0; i < want.size(); ++i) diff += bits(want[i]) != bits(got[i]);
      const std::string path = dc->moe_gemm_combine_path();
      const std::string auto_path =
          k::choose_moe_gemm_combine(k::FusedAlgo::kAuto, W) == k::FusedAlgo::kFused ? "fused" : "decomposed";
      if (r == 0 && round == 0) std::printf("  moeGemmCombine through CudaComm: %s path\n", path.c_str());
      check(path == auto_path,
            what + ": moeGemmCombine takes kAuto's path (" + auto_path + ", got '" + path + "')");
      check(diff == 0, what + ": moeGemmCombine bit-exact against groupedGemm then moeCombine (" +
                           std::to_string(diff) + " elements differ)");
    }
    if (round == 0) {
      // A bad id on the last rank: every rank throws, naming it.
      std::vector<int32_t> bad_ids = in.ids;
      int bad_rank = 0;
      for (int q = 0; q < W; ++q)
        if (c.tokens[q] > 0) bad_rank = q;
      if (r == bad_rank) bad_ids[1] = c.E + 5;
      DevBuf saved = std::move(ids);
      ids = upload(bad_ids, R.stream);
      std::string msg;
      bool invalid = false;
      try {
        dispatch();
      } catch (const Error& e) {
        msg = e.what();
        invalid = e.kind() == ErrorKind::kInvalidArgument;
      }
      if (r == 0) std::printf("  bad id through CudaComm: %s\n", msg.c_str());
      check(invalid && msg.find("expert id " + std::to_string(c.E + 5)) != std::string::npos,
            what + ": a bad id is Error(kInvalidArgument) naming it on every rank (got '" + msg + "')");
      ids = std::move(saved);

      // Every rank's rows; a bound one below the most: the fullest rank (the first of them)
      // overflows, every rank throws the same message naming it, its rows and the bound.
      const int64_t mine = rows;
      const auto all = R.g.all_gather(std::vector<uint8_t>(reinterpret_cast<const uint8_t*>(&mine),
                                                           reinterpret_cast<const uint8_t*>(&mine) + 8));
      for (int q = 0; q < W; ++q) {
        int64_t v = 0;
        std::memcpy(&v, all[q].data(), 8);
        if (v > most_rows) most_rows = v, most_rank = q;
      }
      std::string over;
      bool over_invalid = false;
      try {
        dispatch(most_rows - 1);
      } catch (const Error& e) {
        over = e.what();
        over_invalid = e.kind() == ErrorKind::kInvalidArgument;
      }
      if (r == 0) std::printf("  overflow through CudaComm: %s\n", over.c_str());
      const std::string want = "rank " + std::to_string(most_rank) + " would receive " +
                               std::to_string(most_rows) +
                               " routed rows, more than maxRecvRows = " + std::to_string(most_rows - 1);
      check(most_rows >= 2 && over_invalid && over.find(want) != std::string::npos,
            what + ": an overflow is Error(kInvalidArgument) '" + want + "' on every rank (got '" + over +
                "')");
      const auto msgs = R.g.all_gather(std::vector<uint8_t>(over.begin(), over.end()));
      bool same = true;
      for (const auto& m : msgs) same = same && std::string(m.begin(), m.end()) == over;
      check(same, what + ": the overflow's message is the same on every rank");
    }
  }
  dc->close();
}

// The dispatch paths FC_MOE_TEST_PATHS names (0 decomposed, 1 fused, 2 low-latency), all by
// default; an unknown name is an error, never a silently shorter run.
std::vector<int> selected_paths() {
  const char* env = std::getenv("FC_MOE_TEST_PATHS");
  if (env == nullptr || *env == 0) return {0, 1, 2};
  std::vector<int> out;
  std::string list(env);
  for (size_t at = 0; at <= list.size();) {
    const size_t end = std::min(list.find(',', at), list.size());
    const std::string name = list.substr(at, end - at);
    const int path = name == "decomposed" ? 0 : name == "fused" ? 1 : name == "low-latency" ? 2 : -1;
    if (path < 0) throw std::invalid_argument("FC_MOE_TEST_PATHS: unknown path '" + name + "'");
    out.push_back(path);
    at = end + 1;
  }
  return out;
}

int rank_main(ProcessGroup& g, const std::vector<int>& gpus, uint64_t seed) {
  CUDA_OK(cudaSetDevice(gpus[g.rank]));
  Rank R(g, seed);
  CUDA_OK(cudaStreamCreateWithFlags(&R.stream, cudaStreamNonBlocking));
  SymmetricConfig cfg;
  // The largest correctness case (1000 tokens × top-8 from every rank, hidden 1024) at W = 8.
  cfg.data_bytes = g.world > 4 ? size_t{160} << 20 : size_t{64} << 20;
  R.open(cfg);
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
  try {
    for (const int path : selected_paths()) {
      R.algo = path == 1 ? k::FusedAlgo::kFused : k::FusedAlgo::kDecomposed;
      R.low_latency = path == 2;
      if (g.rank == 0) std::printf("  -- %s dispatch\n", R.algo_name());
      R.correctness();
      lap("correctness");
      R.errors();
      lap("errors");
      R.back_to_back();
      lap("back-to-back");
      R.graph();
      lap("graph replay");
      if (g.world > 1) {
        R.late_rank();
        lap("late rank");
        R.dead_rank();
        lap("dead rank");
      }
    }
    runtime_path(R, gpus[g.rank]);
    lap("through CudaComm");
  } catch (const std::exception& e) {
    check(false, std::string("rank ") + std::to_string(g.rank) + " threw: " + e.what());
  }
  return finish();
}

}  // namespace

int main() {
  const int shared = fusedcomm::testing::shared_gpu_world();
  const int n = fusedcomm::testing::peer_gpus_or_skip("gpu_moe_test", shared);
  if (n == 0) return 77;
  const uint64_t seed = fusedcomm::testing::test_seed("gpu_moe_test", n);
  fusedcomm::testing::g_shared_gpu = shared > 0;
  const int max_world = std::min(shared > 0 ? shared : n, k::kCommMaxRanks);
  int failed = 0;
  for (int w = 1; w <= max_world; ++w) {
    if (!fusedcomm::testing::test_world_selected(w)) continue;
    std::vector<int> gpus;
    for (int i = 0; i < w; ++i) gpus.push_back(shared > 0 ? 0 : i);
    std::printf("== world %d%s\n", w, shared > 0 ? " (all ranks on GPU 0)" : "");
    std::fflush(stdout);
    const auto t0 = std::chrono::steady_clock::now();
    const int f = fusedcomm::testing::run_processes(
        w, [&](ProcessGroup& g) { return rank_main(g, gpus, seed); }, 480);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("== world %d: %s (%.1f s)\n", w, f == 0 ? "PASS" : "FAIL", s);
    failed += f;
  }
  std::printf(failed == 0 ? "gpu_moe_test: PASS\n" : "gpu_moe_test: FAIL\n");
  return failed == 0 ? 0 : 1;
}
