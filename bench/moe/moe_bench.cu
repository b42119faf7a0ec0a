// moe_bench: the MoE layer's communicating ops on the GPUs of one host, one process per GPU
// (bench/README.md, family moe): moeDispatchGemm (routing, the rows to their experts' ranks,
// the grouped GEMM with each expert's W1) and moeCombine (the expert rows home, the weighted sum
// per token), through the kernels the cuda backend runs (kernels/moe/moe.h) over the runtime's
// symmetric memory. torch_moe_dist.py times the torch baseline on the same routing.
//
// Impls per (op, shape):
//   fusedcomm                  moeDispatchGemm as users get it (launch_moe_dispatch with the GEMM,
//                              FusedAlgo::kAuto: fused_choice.h's path); moeCombine
//                              (launch_moe_combine)
//   fusedcomm_fused            moeDispatchGemm with the fused kernel (the rows and the grouped GEMM
//                              in one persistent kernel, FusedAlgo::kFused)
//   fusedcomm_decomposed       moeDispatchGemm's separate launches (FusedAlgo::kDecomposed)
//   fusedcomm_fused_p<P>       with --dispatch-ctas P,...: the fused kernel with P dispatch CTAs
//                              (the SM split's measurement)
//   fusedcomm_dispatch_only    moeDispatchGemm's routing and rows without the GEMM (part; the
//                              normal path)
//   fusedcomm_low_latency      moeDispatchGemm in the low-latency mode (MoeMode::kLowLatency: the
//                              routing and the rows in one launch, then the grouped GEMM)
//   fusedcomm_ll_dispatch_only the low-latency kernel alone, without the GEMM (part)
//   fusedcomm_gemm_only        the grouped GEMM alone on the received rows (part)
// moeCombine: fusedcomm (kAuto: fused_choice.h's mode), fusedcomm_normal (the rows kernel
// then the sum kernel), fusedcomm_low_latency (one launch).
// --share-gpu: every rank on GPU 0 (protocol cost, not NVLink; the kernels that wait for every
// rank get a 1/W share of the SMs).
// moeGemmCombine (h = the dispatch's out, W2 = local experts × hidden × ffn, out = T × hidden):
//   fusedcomm                  launch_moe_gemm_combine at kAuto (fused_choice.h's path)
//   fusedcomm_fused            the fused kernel (each tile stored into its rows' home slots, the
//                              weighted sums in the same kernel)
//   fusedcomm_decomposed       the grouped GEMM, then the combine
//   fusedcomm_gemm_only        the grouped GEMM h · W2ᵀ alone (part)
//   fusedcomm_combine_only     the combine of its rows alone (part)
// Routing (the same in torch_moe_dist.py): token t of rank s picks the k experts
// (b + q · ⌊E / k⌋) mod E, q < k, for a base b = splitmix64(seed, s, t) mod E (uniform), or mod
// ⌈E / 4⌉ (skewed: the first quarter of the experts takes every base); weight of slot q:
// (q + 1) / (k (k + 1) / 2).
//
// Checks before timing, on every rank: the status; the expert offsets against the routing's
// counts; every received row's identity (its expert is its segment's, rows in the contract's
// order: source rank, token, slot within an expert) and its values bit for bit against the
// source's x (every rank rebuilds every rank's x from its seed); out against an fp32 reference
// per expert (bench/common/check.h's bound); the combine of the dispatch's rows sent back
// unchanged (expert_out = routed_x), bit for bit against x_t · Σ_q w_q summed in fp32 in slot
// order, rounded once; moeGemmCombine's fused path bit for bit against the decomposed one.
// --ops picks what is timed (dispatch, combine, gemm_combine; all by default).
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "bench/common/bench_util.h"
#include "bench/common/check.h"
#include "bench/common/ranks.h"
#include "fusedcomm/runtime/symmetric_memory.h"
#include "kernels/moe/moe.h"

namespace b = fusedcomm::bench;
namespace k = fusedcomm::kernels;

namespace {

const char* kUsage =
    "usage: moe_bench --world W --shapes FILE [--out ROWS.jsonl] [--batch-ms 25] [--batches 7]\n"
    "                 [--sustain-ms 500] [--seed S] [--dispatch-ctas P,...]\n"
    "                 [--ops dispatch,combine,gemm_combine] [--share-gpu]\n"
    "  FILE: \"<label> <hidden> <ffn> <experts> <topk> <tokens per rank> <uniform|skewed>\" per line\n"
    "  (bench/shapes/moe_layer.txt). hidden and ffn multiples of 8.\n"
    "  Rows go to --out as JSON lines (rank 0).\n"
    "  Exit 0: every check passed; 1: a mismatch or an error; 77: fewer than W GPUs.\n";

struct Shape {
  std::string label, routing;
  int H, F, E, topk;
  int64_t T;
};

struct Options {
  int world = 0;
  std::string shapes, out;
  double batch_ms = 25, sustain_ms = 500;
  int batches = 7;
  uint64_t seed = 12345;
  std::vector<int> dispatch_ctas;                     // fused kernel variants (the SM split)
  std::string ops = "dispatch,combine,gemm_combine";  // what is timed
  bool share_gpu = false;                             // every rank on GPU 0
  bool times(const char* op) const {
    return ("," + ops + ",").find("," + std::string(op) + ",") != std::string::npos;
  }
};

std::vector<Shape> read_shapes(const std::string& path) {
  std::vector<Shape> v;
  for (const auto& w : b::read_shape_lines(path)) {
    if (w.size() != 7 || (w[6] != "uniform" && w[6] != "skewed")) {
      throw std::runtime_error(path +
                               ": expected '<label> <hidden> <ffn> <experts> <topk> <tokens> "
                               "<uniform|skewed>'");
    }
    Shape s{w[0], w[6], std::stoi(w[1]), std::stoi(w[2]), std::stoi(w[3]), std::stoi(w[4]), std::stoll(w[5])};
    if (s.H < 8 || s.F < 8 || s.H % 8 || s.F % 8 || s.E < 1 || s.E > k::kMoeMaxExperts || s.topk < 1 ||
        s.topk > std::min(s.E, k::kMoeMaxTopk) || s.T < 0) {
      throw std::runtime_error(path + ": " + s.label + ": sizes outside the op's contract");
    }
    v.push_back(s);
  }
  return v;
}

int64_t split_count(int64_t n, int w, int r) { return n / w + (r < n % w ? 1 : 0); }
int64_t split_offset(int64_t n, int w, int r) { return r * (n / w) + (r < n % w ? r : n % w); }

uint64_t splitmix(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
// Rank s's routing (topk ids and weights, T × k), as torch_moe_dist.py builds it.
void routing(const Shape& sh, uint64_t seed, int s, std::vector<int32_t>& ids, std::vector<float>& wts) {
  ids.resize(static_cast<size_t>(sh.T * sh.topk));
  wts.resize(ids.size());
  const int step = std::max(1, sh.E / sh.topk);
  const int64_t bases = sh.routing == "skewed" ? (sh.E + 3) / 4 : sh.E;
  for (int64_t t = 0; t < sh.T; ++t) {
    const uint64_t h = splitmix(splitmix(splitmix(seed) ^ uint64_t(s)) ^ uint64_t(t));
    const int64_t base = static_cast<int64_t>(h % uint64_t(bases));
    for (int q = 0; q < sh.topk; ++q) {
      ids[t * sh.topk + q] = static_cast<int32_t>((base + int64_t(q) * step) % sh.E);
      wts[t * sh.topk + q] = float(q + 1) / float(sh.topk * (sh.topk + 1) / 2);
    }
  }
}
uint64_t x_seed(uint64_t seed, int s) { return splitmix(seed ^ 0x7800 ^ uint64_t(s)); }
uint64_t w_seed(uint64_t seed, int s) { return splitmix(seed ^ 0x5700 ^ uint64_t(s)); }

// dst row i = src row idx[i] (rows of `cols` bf16), for the check's expected received rows.
__global__ void gather_rows(__nv_bfloat16* dst, const __nv_bfloat16* src, const int64_t* idx, int64_t rows,
                            int cols) {
  for (int64_t i = blockIdx.x; i < rows; i += gridDim.x) {
    const __nv_bfloat16* s = src + idx[i] * cols;
    __nv_bfloat16* d = dst + i * cols;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) d[c] = s[c];
  }
}

template <typename T>
T* device_alloc(size_t n) {
  void* p = nullptr;
  FC_BENCH_CUDA(cudaMalloc(&p, std::max<size_t>(n * sizeof(T), 256)));
  return static_cast<T*>(p);
}
template <typename T>
std::vector<T> download(const void* p, size_t n) {
  std::vector<T> v(n);
  if (n) FC_BENCH_CUDA(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
  return v;
}
template <typename T>
void upload(void* p, const std::vector<T>& v) {
  if (!v.empty()) FC_BENCH_CUDA(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
}
float bf(__nv_bfloat16 v) { return __bfloat162float(v); }

int bench(fusedcomm::testing::ProcessGroup& g, const Options& o) {
  const int W = g.world, r = g.rank;
  FC_BENCH_CUDA(cudaSetDevice(o.share_gpu ? 0 : r));
  const std::vector<Shape> list = read_shapes(o.shapes);

  // Every buffer at the largest need over the shapes (products taken per shape: the largest
  // capacity and the widest ffn belong to different shapes). Capacity: every routed row of every
  // rank (no shape can overflow, whatever its routing).
  int64_t th_max = 0, wth_max = 0, tk_max = 0, ch_max = 0, cf_max = 0, cap_max = 0, wl_max = 0;
  uint64_t data_need = 0;
  size_t ws_max = 0, gg_ws_max = 0, gc_ws_max = 0;
  for (const Shape& s : list) {
    const int64_t cap = s.T * s.topk * W, El = split_count(s.E, W, r);
    th_max = std::max(th_max, s.T * s.H), wth_max = std::max(wth_max, W * s.T * s.H);
    tk_max = std::max(tk_max, s.T * s.topk), cap_max = std::max(cap_max, cap);
    ch_max = std::max(ch_max, cap * s.H), cf_max = std::max(cf_max, cap * s.F);
    wl_max = std::max(wl_max, El * s.F * s.H);
    data_need = std::max(
        {data_need, k::moe_dispatch_data_bytes(cap, s.H), k::moe_combine_data_bytes(s.T, s.topk, s.H)});
    ws_max = std::max(ws_max, k::moe_dispatch_workspace_bytes(s.T, s.topk, s.E, W, r, cap));
    gg_ws_max = std::max(gg_ws_max, k::grouped_gemm_workspace_bytes(cap, static_cast<int>(El)));
    gc_ws_max = std::max(gc_ws_max, k::moe_gemm_combine_workspace_bytes(cap, static_cast<int>(El), s.H,
                                                                        k::FusedAlgo::kDecomposed));
  }
  fusedcomm::SymmetricConfig cfg;
  cfg.data_bytes = (data_need + 4095) / 4096 * 4096;
  cfg.allow_shared_gpu = o.share_gpu;
  int cta_cap = 0;  // the waiting kernels' grid with ranks sharing the GPU
  if (o.share_gpu && W > 1) {
    int sms = 0;
    FC_BENCH_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    cta_cap = std::max(2, sms / W);
  }
  auto sm = std::make_unique<fusedcomm::SymmetricMemory>(r, W, cfg);
  sm->connect(g.all_gather(sm->export_handle()));
  const k::CommDevice& dev = sm->device();

  auto* x = device_alloc<__nv_bfloat16>(th_max);
  auto* all_x = device_alloc<__nv_bfloat16>(wth_max);  // the check: every rank's x
  auto* ids = device_alloc<int32_t>(tk_max);
  auto* wts = device_alloc<float>(tk_max);
  auto* w1 = device_alloc<__nv_bfloat16>(wl_max);
  auto* routed = device_alloc<__nv_bfloat16>(ch_max);
  auto* want = device_alloc<__nv_bfloat16>(ch_max);
  auto* out = device_alloc<__nv_bfloat16>(cf_max);
  auto* combined = device_alloc<__nv_bfloat16>(th_max);
  auto* w2 = device_alloc<__nv_bfloat16>(wl_max);
  auto* gc_out = device_alloc<__nv_bfloat16>(th_max);
  void* gc_ws = device_alloc<uint8_t>(gc_ws_max);
  auto* offsets = device_alloc<int64_t>(k::kMoeMaxExperts + 1);
  auto* src_rank = device_alloc<int32_t>(cap_max);
  auto* src_token = device_alloc<int32_t>(cap_max);
  auto* src_slot = device_alloc<int32_t>(cap_max);
  auto* row_w = device_alloc<float>(cap_max);
  auto* counts = device_alloc<int32_t>(W * k::kMoeMaxExperts);
  auto* tokens = device_alloc<int32_t>(W);
  auto* status = device_alloc<k::MoeStatus>(1);
  auto* idx = device_alloc<int64_t>(cap_max);
  void* ws = device_alloc<uint8_t>(ws_max);
  void* gg_ws = device_alloc<uint8_t>(gg_ws_max);
  float* ref = device_alloc<float>(cf_max);
  float* absdot = device_alloc<float>(cf_max);

  cudaStream_t st;
  FC_BENCH_CUDA(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cudaEvent_t e0, e1;
  FC_BENCH_CUDA(cudaEventCreate(&e0));
  FC_BENCH_CUDA(cudaEventCreate(&e1));
  b::RowWriter rows_out(r == 0 ? o.out : "");

  // The batches of fused_bench.cc: rank 0's time of one call sizes them for every rank; each
  // impl runs back to back for sustain_ms, then `batches` batches; the median of the per-call
  // batch means.
  auto time_ops = [&](const std::vector<std::function<void()>>& launches) {
    const size_t n = launches.size();
    std::vector<double> med(n);
    for (size_t i = 0; i < n; ++i) {
      g.barrier();
      for (int w = 0; w < 2; ++w) launches[i]();
      FC_BENCH_CUDA(cudaStreamSynchronize(st));
      g.barrier();
      FC_BENCH_CUDA(cudaEventRecord(e0, st));
      launches[i]();
      FC_BENCH_CUDA(cudaEventRecord(e1, st));
      FC_BENCH_CUDA(cudaEventSynchronize(e1));
      float one = 0;
      FC_BENCH_CUDA(cudaEventElapsedTime(&one, e0, e1));
      std::vector<uint8_t> mine(sizeof one);
      std::memcpy(mine.data(), &one, sizeof one);
      std::memcpy(&one, g.all_gather(mine)[0].data(), sizeof one);
      one = std::max(one, 1e-3f);
      const int iters = std::clamp(static_cast<int>(o.batch_ms / one), 1, 200);
      const int sustain = static_cast<int>(o.sustain_ms / one) + 1;
      FC_BENCH_CUDA(cudaStreamSynchronize(st));
      g.barrier();
      for (int j = 0; j < sustain; ++j) launches[i]();
      std::vector<double> per;
      for (int j = 0; j < o.batches; ++j) {
        FC_BENCH_CUDA(cudaStreamSynchronize(st));
        g.barrier();
        FC_BENCH_CUDA(cudaEventRecord(e0, st));
        for (int q = 0; q < iters; ++q) launches[i]();
        FC_BENCH_CUDA(cudaEventRecord(e1, st));
        FC_BENCH_CUDA(cudaEventSynchronize(e1));
        float ms = 0;
        FC_BENCH_CUDA(cudaEventElapsedTime(&ms, e0, e1));
        per.push_back(ms / iters);
        sm->raise_if_failed();
      }
      med[i] = b::median(per);
    }
    return med;
  };

  int failed = 0;
  for (const Shape& s : list) {
    const int64_t cap = s.T * s.topk * W, El = split_count(s.E, W, r), first = split_offset(s.E, W, r);
    std::vector<std::vector<int32_t>> all_ids(W);
    std::vector<std::vector<float>> all_wts(W);
    for (int p = 0; p < W; ++p) routing(s, o.seed, p, all_ids[p], all_wts[p]);
    b::fill_uniform(x, s.T * s.H, x_seed(o.seed, r), st);
    b::fill_uniform(w1, El * s.F * s.H, w_seed(o.seed, r), st);
    b::fill_uniform(w2, El * s.F * s.H, w_seed(o.seed, r) ^ 0x2, st);
    for (int p = 0; p < W; ++p) b::fill_uniform(all_x + p * s.T * s.H, s.T * s.H, x_seed(o.seed, p), st);
    upload(ids, all_ids[r]);
    upload(wts, all_wts[r]);
    FC_BENCH_CUDA(cudaStreamSynchronize(st));

    k::MoeDispatchArgs d;
    d.x = x, d.tokens = s.T, d.hidden = s.H, d.topk_ids = ids, d.topk_weights = wts, d.topk = s.topk;
    d.num_experts = s.E, d.w1 = w1, d.ffn = s.F, d.w1_layout = k::GemmLayoutB::kNK, d.capacity = cap;
    d.routed_x = routed, d.out = out;
    d.layout = {offsets, src_rank, src_token, src_slot, row_w, counts, tokens, status};
    d.workspace = ws, d.workspace_bytes = ws_max;
    d.fused_ctas = cta_cap;
    k::MoeDispatchArgs d_only = d;
    d_only.out = nullptr;
    d_only.algo = k::FusedAlgo::kDecomposed;
    d_only.mode = k::MoeMode::kNormal;
    k::MoeDispatchArgs d_fused = d, d_dec = d, d_ll = d;
    d_fused.algo = k::FusedAlgo::kFused;
    d_dec.algo = k::FusedAlgo::kDecomposed;
    d_fused.mode = d_dec.mode = k::MoeMode::kNormal;
    d_ll.mode = k::MoeMode::kLowLatency;
    k::MoeDispatchArgs d_ll_only = d_ll;
    d_ll_only.out = nullptr;
    std::vector<k::MoeDispatchArgs> d_split;
    for (int p : o.dispatch_ctas) {
      d_split.push_back(d_fused);
      d_split.back().dispatch_ctas = p;
    }
    k::GroupedGemmArgs gg;
    gg.A = routed, gg.rows_capacity = cap, gg.offsets = offsets, gg.groups = static_cast<int>(El);
    gg.B = w1, gg.N = s.F, gg.K = s.H, gg.C = out, gg.workspace = gg_ws, gg.workspace_bytes = gg_ws_max;
    k::MoeCombineArgs cb;
    cb.expert_out = routed, cb.width = s.H, cb.layout = d.layout, cb.num_experts = s.E, cb.topk = s.topk;
    cb.capacity = cap, cb.tokens = s.T, cb.topk_weights = wts, cb.out = combined;
    cb.ctas = cta_cap;
    k::MoeCombineArgs cb_n = cb, cb_ll = cb;
    cb_n.mode = k::MoeMode::kNormal;
    cb_ll.mode = k::MoeMode::kLowLatency;
    k::MoeGemmCombineArgs gc;
    gc.h = out, gc.rows = cap, gc.k = s.F, gc.w2 = w2, gc.width = s.H, gc.layout = d.layout;
    gc.num_experts = s.E, gc.topk = s.topk, gc.tokens = s.T, gc.topk_weights = wts, gc.out = gc_out;
    gc.workspace = gc_ws, gc.workspace_bytes = gc_ws_max;
    gc.fused_ctas = cta_cap;
    k::MoeGemmCombineArgs gc_fused = gc, gc_dec = gc;
    gc_fused.algo = k::FusedAlgo::kFused;
    gc_dec.algo = k::FusedAlgo::kDecomposed;
    // The parts: the grouped GEMM h · W2ᵀ into `want` (rows × hidden), the combine of those rows.
    k::GroupedGemmArgs gg2;
    gg2.A = out, gg2.rows_capacity = cap, gg2.offsets = offsets, gg2.groups = static_cast<int>(El);
    gg2.B = w2, gg2.N = s.H, gg2.K = s.F, gg2.C = want, gg2.workspace = gg_ws,
    gg2.workspace_bytes = gg_ws_max;
    k::MoeCombineArgs cb2 = cb;
    cb2.expert_out = want;

    // ---- the checks (each dispatch path; the combine after the last) ----
    std::string why;
    std::vector<int64_t> want_off(El + 1, 0);
    for (int p = 0; p < W; ++p)
      for (int32_t e : all_ids[p])
        if (e >= first && e < first + El) ++want_off[e - first + 1];
    for (int64_t i = 0; i < El; ++i) want_off[i + 1] += want_off[i];
    const int64_t n = want_off[El];
    for (const k::MoeDispatchArgs* dv : {&d_dec, &d_fused, &d_ll}) {
      if (!why.empty()) break;
      const char* path = dv == &d_fused ? "fused: " : dv == &d_ll ? "low-latency: " : "decomposed: ";
      FC_BENCH_CUDA(cudaMemsetAsync(routed, 0xFF, cap * s.H * 2, st));
      FC_BENCH_CUDA(cudaMemsetAsync(out, 0xFF, cap * s.F * 2, st));
      FC_BENCH_CUDA(k::launch_moe_dispatch(dev, *dv, st));
      FC_BENCH_CUDA(cudaStreamSynchronize(st));
      sm->raise_if_failed();
      const k::MoeStatus stat = download<k::MoeStatus>(status, 1)[0];
      const auto got_off = download<int64_t>(offsets, El + 1);
      if (stat.code != k::kMoeOk) why = std::string("status ") + k::moe_status_name(stat.code);
      if (why.empty() && got_off != want_off) why = "expert offsets differ from the routing's counts";
      if (why.empty()) {
        // Identities in the contract's order, each row's expert its segment's.
        const auto sr = download<int32_t>(src_rank, n), tk = download<int32_t>(src_token, n),
                   sl = download<int32_t>(src_slot, n);
        std::vector<int64_t> at(n);
        for (int64_t i = 0, e = 0; i < n && why.empty(); ++i) {
          while (want_off[e + 1] <= i) ++e;
          const bool in_range =
              sr[i] >= 0 && sr[i] < W && tk[i] >= 0 && tk[i] < s.T && sl[i] >= 0 && sl[i] < s.topk;
          if (!in_range || all_ids[sr[i]][tk[i] * s.topk + sl[i]] != first + e) {
            why = "row " + std::to_string(i) + ": identity not of expert " + std::to_string(first + e);
          } else if (i > want_off[e] && std::make_tuple(sr[i - 1], tk[i - 1], sl[i - 1]) >=
                                            std::make_tuple(sr[i], tk[i], sl[i])) {
            why = "row " + std::to_string(i) + ": out of the contract's order";
          }
          at[i] = int64_t{sr[i]} * s.T + tk[i];
        }
        if (why.empty() && n > 0) {
          upload(idx, at);
          gather_rows<<<1024, 256, 0, st>>>(want, all_x, idx, n, s.H);
          FC_BENCH_CUDA(cudaGetLastError());
          const b::Mismatch m = b::compare_exact(routed, want, n * s.H, st);
          if (m.count) why = "routed_x: " + std::to_string(m.count) + " elements differ";
        }
        for (int64_t e = 0; e < El && why.empty(); ++e) {
          const int64_t lo = want_off[e], rows = want_off[e + 1] - lo;
          if (rows == 0) continue;
          b::reference_gemm(routed + lo * s.H, s.H, w1 + e * s.F * s.H, s.H, false, static_cast<int>(rows),
                            s.F, s.H, ref + lo * s.F, absdot + lo * s.F, false, st);
        }
        if (why.empty() && n > 0) {
          const b::Mismatch m = b::compare_gemm(out, s.F, ref, absdot, static_cast<int>(n), s.F, 0.f, st);
          if (m.count) {
            why = "out: " + std::to_string(m.count) + " elements outside the bound (first at " +
                  std::to_string(m.index) + ": " + std::to_string(m.got) + ", want " +
                  std::to_string(m.want) + ")";
          }
        }
      }
      if (!why.empty()) why = path + why;
    }
    // The combine of the rows sent back unchanged: x_t · Σ_q w_q in fp32, slot order, rounded once
    // (both modes).
    for (const k::MoeCombineArgs* cv : {&cb_n, &cb_ll}) {
      if (!why.empty()) break;
      FC_BENCH_CUDA(cudaMemsetAsync(combined, 0xFF, s.T * s.H * 2, st));
      FC_BENCH_CUDA(k::launch_moe_combine(dev, *cv, st));
      FC_BENCH_CUDA(cudaStreamSynchronize(st));
      sm->raise_if_failed();
      if (why.empty()) {
        const auto xs = download<__nv_bfloat16>(x, s.T * s.H),
                   got = download<__nv_bfloat16>(combined, s.T * s.H);
        int64_t bad = 0;
        for (int64_t t = 0; t < s.T; ++t)
          for (int c = 0; c < s.H; ++c) {
            volatile float acc = 0.f;
            for (int q = 0; q < s.topk; ++q) {
              volatile float p = all_wts[r][t * s.topk + q] * bf(xs[t * s.H + c]);
              acc = acc + p;
            }
            const __nv_bfloat16 e = __float2bfloat16_rn(acc);
            if (std::memcmp(&e, &got[t * s.H + c], 2) != 0) ++bad;
          }
        if (bad) {
          why = std::string(cv == &cb_ll ? "low-latency " : "") + "combine: " + std::to_string(bad) +
                " elements differ";
        }
      }
    }
    // moeGemmCombine: the fused kernel bit for bit against the grouped GEMM then the combine.
    if (why.empty()) {
      std::vector<__nv_bfloat16> ref;
      for (const k::MoeGemmCombineArgs* a : {&gc_dec, &gc_fused}) {
        FC_BENCH_CUDA(cudaMemsetAsync(gc_out, 0xFF, s.T * s.H * 2, st));
        FC_BENCH_CUDA(k::launch_moe_gemm_combine(dev, *a, st));
        FC_BENCH_CUDA(cudaStreamSynchronize(st));
        sm->raise_if_failed();
        const k::MoeStatus mst = download<k::MoeStatus>(status, 1)[0];
        if (mst.code != k::kMoeOk) why = "gemm+combine: status " + std::to_string(mst.code);
        auto got = download<__nv_bfloat16>(gc_out, s.T * s.H);
        if (a == &gc_dec) {
          ref = std::move(got);
        } else if (why.empty()) {
          int64_t bad = 0;
          for (int64_t i = 0; i < s.T * s.H; ++i) bad += std::memcmp(&ref[i], &got[i], 2) != 0;
          if (bad)
            why = "gemm+combine fused: " + std::to_string(bad) + " elements differ from the decomposed path";
        }
      }
    }
    // Every rank's verdict.
    std::vector<uint8_t> mine(why.begin(), why.end());
    const auto all = g.all_gather(mine);
    bool ok = true;
    for (int p = 0; p < W; ++p) {
      if (all[p].empty()) continue;
      ok = false;
      if (r == 0) {
        std::printf("%s: rank %d FAILED its check: %s\n", s.label.c_str(), p,
                    std::string(all[p].begin(), all[p].end()).c_str());
      }
    }
    if (!ok) {
      ++failed;
      continue;
    }

    // ---- the timing ----
    std::vector<std::function<void()>> dispatch_impls = {
        [&] { FC_BENCH_CUDA(k::launch_moe_dispatch(dev, d, st)); },
        [&] { FC_BENCH_CUDA(k::launch_moe_dispatch(dev, d_only, st)); },
        [&] { FC_BENCH_CUDA(k::launch_grouped_gemm(gg, st)); },
        [&] { FC_BENCH_CUDA(k::launch_moe_dispatch(dev, d_fused, st)); },
        [&] { FC_BENCH_CUDA(k::launch_moe_dispatch(dev, d_dec, st)); },
        [&] { FC_BENCH_CUDA(k::launch_moe_dispatch(dev, d_ll, st)); },
        [&] { FC_BENCH_CUDA(k::launch_moe_dispatch(dev, d_ll_only, st)); },
    };
    for (const k::MoeDispatchArgs& dv : d_split)
      dispatch_impls.push_back([&] { FC_BENCH_CUDA(k::launch_moe_dispatch(dev, dv, st)); });
    const std::vector<double> td = o.times("dispatch") ? time_ops(dispatch_impls) : std::vector<double>{};
    const std::vector<double> tc =
        o.times("combine") ? time_ops({[&] { FC_BENCH_CUDA(k::launch_moe_combine(dev, cb, st)); },
                                       [&] { FC_BENCH_CUDA(k::launch_moe_combine(dev, cb_n, st)); },
                                       [&] { FC_BENCH_CUDA(k::launch_moe_combine(dev, cb_ll, st)); }})
                           : std::vector<double>{};
    // The dispatch leaves the layout the gemm+combine reads (every dispatch impl above rewrites
    // it the same way).
    const std::vector<double> tg =
        o.times("gemm_combine")
            ? time_ops({[&] { FC_BENCH_CUDA(k::launch_moe_gemm_combine(dev, gc, st)); },
                        [&] { FC_BENCH_CUDA(k::launch_moe_gemm_combine(dev, gc_fused, st)); },
                        [&] { FC_BENCH_CUDA(k::launch_moe_gemm_combine(dev, gc_dec, st)); },
                        [&] { FC_BENCH_CUDA(k::launch_grouped_gemm(gg2, st)); },
                        [&] { FC_BENCH_CUDA(k::launch_moe_combine(dev, cb2, st)); }})
            : std::vector<double>{};
    // Rank 0's rows: FLOPs and bytes of this rank (the routed rows it received, the rows it sent).
    const double sent_bytes = double(s.T) * s.topk * s.H * 2;
    const double gemm_flops = 2.0 * n * s.F * s.H;
    std::vector<std::string> names = {"fusedcomm",
                                      "fusedcomm_dispatch_only",
                                      "fusedcomm_gemm_only",
                                      "fusedcomm_fused",
                                      "fusedcomm_decomposed",
                                      "fusedcomm_low_latency",
                                      "fusedcomm_ll_dispatch_only"};
    for (int p : o.dispatch_ctas) names.push_back("fusedcomm_fused_p" + std::to_string(p));
    auto row = [&](const char* op, const char* impl, double ms, double flops) {
      b::Row sh;
      sh.integer("tokens", s.T).integer("hidden", s.H).integer("ffn", s.F).integer("experts", s.E);
      sh.integer("topk", s.topk).str("routing", s.routing).integer("rows", n);
      b::Row rw;
      rw.str("family", "moe").str("op", op).str("impl", impl).integer("world", W).obj("shape", sh);
      rw.str("dtype", "bf16").num("ms_median", ms);
      if (flops > 0) {
        rw.num("tflops", flops / (ms * 1e-3) / 1e12);
      } else {
        rw.null("tflops");
      }
      rw.num("gbps", sent_bytes / (ms * 1e-3) / 1e9).str("label", s.label);
      rows_out.write(rw);
      if (r == 0) std::printf("%-22s W=%d %-16s %-26s %8.4f ms\n", s.label.c_str(), W, op, impl, ms);
    };
    for (size_t i = 0; i < td.size(); ++i)
      row("moeDispatchGemm", names[i].c_str(), td[i], i == 1 || i == 6 ? 0.0 : gemm_flops);
    if (r == 0 && !td.empty()) {
      const k::MoeLaunchInfo fi = k::moe_dispatch_info(dev, d_fused);
      std::printf(
          "%-22s W=%d fused split: %d GEMM + %d dispatch CTAs, %d rows per item; auto: %s; "
          "fused / max(parts) %.3f, fused / sum(parts) %.3f; low-latency / normal: dispatch only %.3f, "
          "with the GEMM %.3f\n",
          s.label.c_str(), W, fi.gemm_ctas, fi.dispatch_ctas, fi.item_rows,
          k::moe_dispatch_info(dev, d).low_latency                    ? "low-latency"
          : k::moe_dispatch_info(dev, d).algo == k::FusedAlgo::kFused ? "fused"
                                                                      : "decomposed",
          td[3] / std::max(td[1], td[2]), td[3] / (td[1] + td[2]), td[6] / td[1], td[5] / td[4]);
    }
    if (!tc.empty()) {
      row("moeCombine", "fusedcomm", tc[0], 0.0);
      row("moeCombine", "fusedcomm_normal", tc[1], 0.0);
      row("moeCombine", "fusedcomm_low_latency", tc[2], 0.0);
      if (r == 0) {
        std::printf("%-22s W=%d combine auto: %s; low-latency / normal %.3f\n", s.label.c_str(), W,
                    k::moe_combine_low_latency(dev, cb) ? "low-latency" : "normal", tc[2] / tc[1]);
      }
    }
    if (!tg.empty()) {
      const char* gc_names[] = {"fusedcomm", "fusedcomm_fused", "fusedcomm_decomposed", "fusedcomm_gemm_only",
                                "fusedcomm_combine_only"};
      for (size_t i = 0; i < tg.size(); ++i)
        row("moeGemmCombine", gc_names[i], tg[i], i == 4 ? 0.0 : gemm_flops);
      if (r == 0) {
        std::printf("%-22s W=%d gemm+combine auto: %s; fused / decomposed %.3f, fused / max(parts) %.3f\n",
                    s.label.c_str(), W,
                    k::moe_gemm_combine_algo(dev, gc) == k::FusedAlgo::kFused ? "fused" : "decomposed",
                    tg[1] / tg[2], tg[1] / std::max(tg[3], tg[4]));
      }
    }
    std::fflush(stdout);
  }
  FC_BENCH_CUDA(cudaStreamSynchronize(st));
  sm.reset();
  return failed == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  b::Args a(argc, argv, kUsage);
  Options o;
  o.world = static_cast<int>(a.num("world", 0));
  o.shapes = a.str("shapes", "");
  o.out = a.str("out", "");
  o.batch_ms = a.num("batch-ms", 25);
  o.batches = static_cast<int>(a.num("batches", 7));
  o.sustain_ms = a.num("sustain-ms", 500);
  o.seed = static_cast<uint64_t>(a.num("seed", 12345));
  o.ops = a.str("ops", o.ops);
  o.share_gpu = a.flag("share-gpu");
  {
    std::string list = a.str("dispatch-ctas", "");
    for (size_t at = 0; at < list.size();) {
      const size_t comma = std::min(list.find(',', at), list.size());
      o.dispatch_ctas.push_back(std::stoi(list.substr(at, comma - at)));
      at = comma + 1;
    }
  }
  a.done();
  if (o.world < 1 || o.shapes.empty()) a.fail("--world and --shapes are required");
  try {
    read_shapes(o.shapes);  // refused before any rank starts
  } catch (const std::exception& e) { a.fail(e.what()); }
  return b::run_ranks(o.world, 1800, o.share_gpu ? 1 : o.world, [&](fusedcomm::testing::ProcessGroup& g) {
    try {
      return bench(g, o);
    } catch (const std::exception& e) {
      std::printf("rank %d: %s\n", g.rank, e.what());
      return 1;
    }
  });
}
