// ring_bench: ring attention on one host, forward and backward (CudaComm::ring_attention_gpu,
// ring_attention_backward_gpu), one rank per GPU or every rank on GPU 0, beside our 1-GPU
// backward at the same per-GPU work.
//   ring_bench [--worlds 1,2] [--shapes FILE] [--out ROWS.jsonl] [--shared] [--iters N]
// Shapes: FILE's lines "<label> <batch> <seq> <q_heads> <kv_heads> <head_dim> <causal 0|1>"
// (bench/shapes/ring.txt; seq is the whole sequence; causal shapes in the zigzag layout, the
// others contiguous), else a built-in list.
// Per world and shape:
// - the check, before anything is timed: each rank's inputs are seeded by (tensor, rank); rank 0
//   assembles the whole sequence's q, k, v, dO from every rank's seeds, runs our 1-GPU forward
//   and backward over it (kernels/attention, checked against fp32 in torch_attention.py and the
//   kernel tests) and compares its own rows of the ring's o, dq, dk, dv with them:
//   max |err| <= 2e-2 · max |ref| per tensor (the ring adds its blocks in another order);
// - the forward ring in both of its forms (kernels/attention/ring_fwd.h), in alternating order
//   (steps, persistent, persistent, steps), o and lse compared bit for bit between the forms;
// - the backward ring, and our 1-GPU backward (launch_attention_bwd) at the same per-GPU work:
//   batch B·W at seq S/W, same heads and mask (the ring's FLOPs over W), alternating (ring, 1-GPU,
//   1-GPU, ring).
// Each timed call: every rank at a barrier, then N calls after two warm-up ones, each between
// events on a caller stream; rank 0's medians. TFLOP/s per GPU: 4·B·Hq·S²·D / W / t, halved when
// causal; the backward 2.5 × that. --shared puts every rank on GPU 0 (a time there says what the
// launches and the protocol cost, never what NVLink would). Rows (--out, JSON lines, bench/README.md):
// ringAttention fusedcomm_persistent, fusedcomm_steps and fusedcomm (the form the automatic
// choice takes, its time; algo names it); ringAttentionBackward fusedcomm, fusedcomm_1gpu and
// fusedcomm_1gpu_dq_pass (the 1-GPU backward with dQ in its own pass, as the ring computes it).
// Exit status 1 if a check fails (that shape's rows are then not written).
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench/attention/dense_args.h"
#include "bench/common/bench_util.h"
#include "fusedcomm/comm/cuda_comm.h"
#include "fusedcomm/runtime/device_attention.h"
#include "fusedcomm/runtime/runtime.h"
#include "kernels/attention/attention.h"
#include "kernels/attention/attention_bwd.h"
#include "support/cuda_comm_support.h"
#include "support/gpu_test_support.h"
#include "support/process_group.h"

namespace {

namespace k = fusedcomm::kernels;
namespace b = fusedcomm::bench;
using fusedcomm::RingAttentionShape;
using fusedcomm::testing::ProcessGroup;

struct Buf {
  void* p = nullptr;
  explicit Buf(size_t bytes) { FC_BENCH_CUDA(cudaMalloc(&p, bytes > 0 ? bytes : 16)); }
  ~Buf() { cudaFree(p); }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
  __nv_bfloat16* bf() const { return static_cast<__nv_bfloat16*>(p); }
  float* f() const { return static_cast<float*>(p); }
};

// Seeded non-zero bf16 values (timing on zeros runs faster than on real data): one table on the
// device, the same on every rank; a tensor of seed s is the table read from an offset that s
// picks, wrapping. The table's length is odd, so no two rows of a tensor repeat each other.
class Pool {
 public:
  static constexpr int64_t kElems = (int64_t{1} << 24) + 4099;
  Pool() : buf_(kElems * 2) {
    std::vector<uint16_t> h(kElems);
    uint32_t x = 12345;
    for (auto& v : h) {
      x = x * 1664525u + 1013904223u;  // magnitudes in [1, 2), random signs
      v = static_cast<uint16_t>(0x3f80 | ((x >> 16) & 0x7f)) ^ static_cast<uint16_t>((x >> 8) & 0x8000);
    }
    FC_BENCH_CUDA(cudaMemcpy(buf_.p, h.data(), kElems * 2, cudaMemcpyHostToDevice));
  }
  void fill(void* dst, int64_t elems, uint64_t seed) const {
    int64_t off = static_cast<int64_t>((seed * 0x9E3779B97F4A7C15ull) >> 24) % kElems, done = 0;
    while (done < elems) {
      const int64_t n = std::min(elems - done, kElems - off);
      FC_BENCH_CUDA(cudaMemcpy(static_cast<char*>(dst) + done * 2, static_cast<const char*>(buf_.p) + off * 2,
                               n * 2, cudaMemcpyDeviceToDevice));
      done += n;
      off = 0;
    }
  }

 private:
  Buf buf_;
};

enum Tensor : uint64_t { kQ = 1, kK, kV, kDo };
uint64_t seed_of(Tensor t, int rank) { return t * 1000003ull + static_cast<uint64_t>(rank) * 7919ull + 17; }

struct NamedShape {
  std::string label;
  RingAttentionShape s;
};

double ring_flops(const RingAttentionShape& s) {
  const double f = 4.0 * s.batch * s.q_heads * s.head_dim * static_cast<double>(s.seq) * s.seq;
  return s.causal ? f / 2 : f;
}

// Our 1-GPU attention (kernels/attention) on dense (B, S, H, D) tensors.
k::AttentionArgs fwd_args(const void* q, const void* kk, const void* v, void* o, float* lse, int64_t B,
                          int64_t S, const RingAttentionShape& s) {
  return b::attn_dense_fwd(q, kk, v, o, lse, B, S, S, s.q_heads, s.kv_heads, s.head_dim, s.causal);
}

k::AttentionBwdArgs bwd_args(const void* q, const void* kk, const void* v, const void* o, const float* lse,
                             const void* d_o, void* dq, void* dk, void* dv, float* delta, int64_t B,
                             int64_t S, const RingAttentionShape& s) {
  return b::attn_dense_bwd(q, kk, v, o, lse, d_o, dq, dk, dv, delta, B, S, S, s.q_heads, s.kv_heads,
                           s.head_dim, s.causal);
}

// Copies the rows of rank p's block (B, S_p, H, D) to their positions in the whole sequence's
// (B, S, H, D) tensor (to_block: the other way).
void block_rows(const RingAttentionShape& s, int W, int p, int64_t heads, void* whole, void* block,
                bool to_block) {
  const int64_t row = heads * s.head_dim * 2, s_p = fusedcomm::ring_block_rows(s, W, p);
  int64_t r0 = 0;
  for (const auto& run : fusedcomm::attention_seq_chunks(s.seq, W, p, s.zigzag)) {
    if (run.count > 0) {
      char* w = static_cast<char*>(whole) + run.pos * row;
      char* bl = static_cast<char*>(block) + r0 * row;
      if (to_block) {
        FC_BENCH_CUDA(
            cudaMemcpy2D(bl, s_p * row, w, s.seq * row, run.count * row, s.batch, cudaMemcpyDeviceToDevice));
      } else {
        FC_BENCH_CUDA(
            cudaMemcpy2D(w, s.seq * row, bl, s_p * row, run.count * row, s.batch, cudaMemcpyDeviceToDevice));
      }
    }
    r0 += run.count;
  }
}

std::vector<float> host_floats(const void* d, int64_t n) {
  std::vector<__nv_bfloat16> h(n);
  FC_BENCH_CUDA(cudaMemcpy(h.data(), d, n * 2, cudaMemcpyDeviceToHost));
  std::vector<float> f(n);
  for (int64_t i = 0; i < n; ++i) f[i] = __bfloat162float(h[i]);
  return f;
}

// max |got - ref| / max |ref| over n bf16 elements.
double rel_err(const void* got, const void* ref, int64_t n) {
  const std::vector<float> g = host_floats(got, n), r = host_floats(ref, n);
  double err = 0, mag = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = std::fabs(static_cast<double>(g[i]) - r[i]);
    err = std::isnan(d) ? INFINITY : std::max(err, d);
    mag = std::max(mag, std::fabs(static_cast<double>(r[i])));
  }
  return mag > 0 ? err / mag : INFINITY;
}

std::vector<NamedShape> default_shapes() {
  // B, seq (total), Hq, Hkv, D, causal, scale, zigzag
  return {{"ring-s16k-d128", {1, 16384, 16, 16, 128, false, 0.0f, false}},
          {"ring-s16k-d128-c", {1, 16384, 16, 16, 128, true, 0.0f, true}},
          {"ring-s32k-d128", {1, 32768, 16, 16, 128, false, 0.0f, false}},
          {"ring-s32k-d128-c", {1, 32768, 16, 16, 128, true, 0.0f, true}},
          {"ring-s16k-d64", {1, 16384, 16, 16, 64, false, 0.0f, false}},
          {"ring-s32k-gqa-c", {1, 32768, 32, 4, 128, true, 0.0f, true}},
          {"ring-b4-s4k-c", {4, 4096, 16, 16, 128, true, 0.0f, true}}};
}

std::vector<NamedShape> read_shapes(const std::string& path) {
  std::vector<NamedShape> out;
  for (const auto& w : b::read_shape_lines(path)) {
    if (w.size() != 7)
      throw std::runtime_error(path + ": expected '<label> <B> <S> <Hq> <Hkv> <D> <causal>'");
    NamedShape n;
    n.label = w[0];
    n.s.batch = std::stoll(w[1]);
    n.s.seq = std::stoll(w[2]);
    n.s.q_heads = std::stoll(w[3]);
    n.s.kv_heads = std::stoll(w[4]);
    n.s.head_dim = std::stoll(w[5]);
    n.s.causal = w[6] != "0";
    n.s.zigzag = n.s.causal;
    out.push_back(n);
  }
  return out;
}

struct Timer {
  cudaStream_t st;
  cudaEvent_t e0, e1;
  Timer() {
    FC_BENCH_CUDA(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    FC_BENCH_CUDA(cudaEventCreate(&e0));
    FC_BENCH_CUDA(cudaEventCreate(&e1));
  }
  // Two warm-up calls, then `iters` timed ones, each after a barrier of every rank.
  template <typename F>
  void time(ProcessGroup& g, int iters, std::vector<double>& ms, F&& call) {
    for (int i = 0; i < iters + 2; ++i) {
      g.barrier();
      FC_BENCH_CUDA(cudaEventRecord(e0, st));
      call();
      FC_BENCH_CUDA(cudaEventRecord(e1, st));
      FC_BENCH_CUDA(cudaStreamSynchronize(st));
      float t = 0;
      FC_BENCH_CUDA(cudaEventElapsedTime(&t, e0, e1));
      if (i >= 2) ms.push_back(t);
    }
  }
};

int rank_main(ProcessGroup& g, bool shared, int iters, const std::vector<NamedShape>& shapes,
              const std::string& out_path) {
  FC_BENCH_CUDA(cudaSetDevice(shared ? 0 : g.rank));
  fusedcomm::Runtime rt(
      fusedcomm::testing::loopback_cuda_config(shared ? 0 : g.rank, 1, 60000, 3072ll << 20, shared));
  auto dc = fusedcomm::testing::make_cuda_comm(rt, g, 7171, std::vector<int>(g.world, 0));
  const int W = g.world;
  b::RowWriter rows(g.rank == 0 ? out_path : std::string());
  int failed = 0;
  Pool pool;
  Timer tm;
  const fusedcomm::OpDesc fwd_desc{"ringAttention (bench)", 0}, bwd_desc{"ringAttentionBackward (bench)", 0};
  for (const NamedShape& ns : shapes) {
    const RingAttentionShape& s = ns.s;
    const int64_t B = s.batch, Hq = s.q_heads, Hkv = s.kv_heads, D = s.head_dim;
    const int64_t rows_r = fusedcomm::ring_block_rows(s, W, g.rank);
    const int64_t nq = B * rows_r * Hq * D, nkv = B * rows_r * Hkv * D;
    Buf q(nq * 2), kk(nkv * 2), vv(nkv * 2), o(nq * 2), lse(B * rows_r * Hq * 4), d_o(nq * 2), dq(nq * 2),
        dk(nkv * 2), dv(nkv * 2);
    pool.fill(q.p, nq, seed_of(kQ, g.rank));
    pool.fill(kk.p, nkv, seed_of(kK, g.rank));
    pool.fill(vv.p, nkv, seed_of(kV, g.rank));
    pool.fill(d_o.p, nq, seed_of(kDo, g.rank));
    auto ring_fwd = [&] {
      dc->ring_attention_gpu(fwd_desc, fusedcomm::DType::kBF16, s, q.p, kk.p, vv.p, o.p, lse.f(), tm.st);
    };
    auto ring_bwd = [&] {
      dc->ring_attention_backward_gpu(bwd_desc, fusedcomm::DType::kBF16, s, q.p, kk.p, vv.p, o.p, lse.f(),
                                      d_o.p, dq.p, dk.p, dv.p, tm.st);
    };
    // The whole sequence's tensors (rank 0's check), the same bytes as the 1-GPU backward's
    // (batch B·W at seq S/W), which reuses them.
    const int64_t NQ = B * s.seq * Hq * D, NKV = B * s.seq * Hkv * D;
    Buf gq(NQ * 2), gk(NKV * 2), gv(NKV * 2), go(NQ * 2), glse(B * s.seq * Hq * 4), gdo(NQ * 2), gdq(NQ * 2),
        gdk(NKV * 2), gdv(NKV * 2), gdelta(B * s.seq * Hq * 4);

    // ---- the check ----
    dc->set_ring_forward_path(k::RingFwdPath::kAuto);
    ring_fwd();
    ring_bwd();
    FC_BENCH_CUDA(cudaStreamSynchronize(tm.st));
    dc->synchronize();
    std::vector<uint8_t> verdict(1, 1);
    if (g.rank == 0) {
      for (int p = 0; p < W; ++p) {
        const int64_t rp = fusedcomm::ring_block_rows(s, W, p);
        Buf tq(B * rp * Hq * D * 2), tkv(B * rp * Hkv * D * 2);
        pool.fill(tq.p, B * rp * Hq * D, seed_of(kQ, p));
        block_rows(s, W, p, Hq, gq.p, tq.p, false);
        pool.fill(tq.p, B * rp * Hq * D, seed_of(kDo, p));
        block_rows(s, W, p, Hq, gdo.p, tq.p, false);
        pool.fill(tkv.p, B * rp * Hkv * D, seed_of(kK, p));
        block_rows(s, W, p, Hkv, gk.p, tkv.p, false);
        pool.fill(tkv.p, B * rp * Hkv * D, seed_of(kV, p));
        block_rows(s, W, p, Hkv, gv.p, tkv.p, false);
      }
      FC_BENCH_CUDA(k::launch_attention(fwd_args(gq.p, gk.p, gv.p, go.p, glse.f(), B, s.seq, s), tm.st));
      k::AttentionBwdArgs a =
          bwd_args(gq.p, gk.p, gv.p, go.p, glse.f(), gdo.p, gdq.p, gdk.p, gdv.p, gdelta.f(), B, s.seq, s);
      Buf acc(std::max<size_t>(k::attention_bwd_dq_acc_bytes(a), 16));
      a.dq_acc = acc.f();
      FC_BENCH_CUDA(k::launch_attention_bwd(a, tm.st));
      FC_BENCH_CUDA(cudaStreamSynchronize(tm.st));
      // This rank's rows of the whole sequence's results, then the comparison.
      const struct {
        const char* name;
        Buf& whole;
        Buf& ring;
        int64_t heads;
      } cmp[] = {{"o", go, o, Hq}, {"dq", gdq, dq, Hq}, {"dk", gdk, dk, Hkv}, {"dv", gdv, dv, Hkv}};
      std::string errs;
      for (const auto& c : cmp) {
        const int64_t n = B * rows_r * c.heads * D;
        Buf mine(n * 2);
        block_rows(s, W, 0, c.heads, c.whole.p, mine.p, true);
        const double e = rel_err(c.ring.p, mine.p, n);
        char line[64];
        std::snprintf(line, sizeof line, "%s%s %.2e", errs.empty() ? "" : ", ", c.name, e);
        errs += line;
        if (!(e <= 2e-2)) verdict[0] = 0;
      }
      std::printf(
          "%s W=%d: check against our 1-GPU attention over the whole sequence, max |err| / max |ref|: %s%s\n",
          ns.label.c_str(), W, errs.c_str(), verdict[0] ? "" : "  FAILED");
      std::fflush(stdout);
    }
    if (g.all_gather(verdict)[0][0] == 0) {
      failed = 1;
      continue;
    }
    bool same_forms = true;

    // ---- the forward, both forms ----
    std::vector<double> fwd_ms[2];
    std::vector<uint8_t> outs[2];
    const size_t o_bytes = nq * 2, lse_bytes = B * rows_r * Hq * 4;
    for (k::RingFwdPath path : {k::RingFwdPath::kSteps, k::RingFwdPath::kPersistent,
                                k::RingFwdPath::kPersistent, k::RingFwdPath::kSteps}) {
      const int i = path == k::RingFwdPath::kPersistent ? 1 : 0;
      dc->set_ring_forward_path(path);
      tm.time(g, iters, fwd_ms[i], ring_fwd);
      outs[i].resize(o_bytes + lse_bytes);
      FC_BENCH_CUDA(cudaMemcpy(outs[i].data(), o.p, o_bytes, cudaMemcpyDeviceToHost));
      FC_BENCH_CUDA(cudaMemcpy(outs[i].data() + o_bytes, lse.p, lse_bytes, cudaMemcpyDeviceToHost));
    }
    dc->set_ring_forward_path(k::RingFwdPath::kAuto);
    const k::RingFwdPath chosen = dc->ring_forward_path();
    if (outs[0] != outs[1]) {
      std::printf(
          "FAIL: %s W=%d rank %d: the persistent kernel's o and lse differ from the step pipeline's\n",
          ns.label.c_str(), W, g.rank);
      failed = 1;
      same_forms = false;
    }

    // ---- the backward: the ring and our 1-GPU backward at the same per-GPU work ----
    const int64_t B1 = B * W, S1 = s.seq / W;
    k::AttentionBwdArgs a1 =
        bwd_args(gq.p, gk.p, gv.p, go.p, glse.f(), gdo.p, gdq.p, gdk.p, gdv.p, gdelta.f(), B1, S1, s);
    Buf acc1(std::max<size_t>(k::attention_bwd_dq_acc_bytes(a1), 16));
    a1.dq_acc = acc1.f();
    const bool one_gpu = s.seq % W == 0;
    if (one_gpu) {  // o and lse of its own forward
      FC_BENCH_CUDA(k::launch_attention(fwd_args(gq.p, gk.p, gv.p, go.p, glse.f(), B1, S1, s), tm.st));
      FC_BENCH_CUDA(cudaStreamSynchronize(tm.st));
    }
    // And with its dQ in a separate pass, as the ring's launches take it (reproducible sums).
    k::AttentionBwdArgs a1p = a1;
    a1p.dq_path = 1;
    Buf acc1p(std::max<size_t>(k::attention_bwd_dq_acc_bytes(a1p), 16));
    a1p.dq_acc = acc1p.f();
    std::vector<double> bwd_ms, one_ms, one_pass_ms;
    auto one = [&] { FC_BENCH_CUDA(k::launch_attention_bwd(a1, tm.st)); };
    auto one_pass = [&] { FC_BENCH_CUDA(k::launch_attention_bwd(a1p, tm.st)); };
    tm.time(g, iters, bwd_ms, ring_bwd);
    if (one_gpu) {
      tm.time(g, iters, one_ms, one);
      tm.time(g, iters, one_pass_ms, one_pass);
      tm.time(g, iters, one_pass_ms, one_pass);
      tm.time(g, iters, one_ms, one);
    }
    tm.time(g, iters, bwd_ms, ring_bwd);
    dc->synchronize();

    if (g.rank == 0 && same_forms) {
      const double f = ring_flops(s) / W;
      b::Row shape;
      shape.integer("batch", B)
          .integer("s", s.seq)
          .integer("q_heads", Hq)
          .integer("kv_heads", Hkv)
          .integer("d", D);
      shape.boolean("causal", s.causal).str("layout", s.zigzag ? "zigzag" : "contiguous");
      auto row = [&](const char* op, const std::string& impl, double ms, double flops,
                     const std::string& algo) {
        b::Row r;
        r.str("family", "attention").str("op", op).str("impl", impl).integer("world", W).obj("shape", shape);
        r.str("dtype", "bf16").num("ms_median", ms).num("tflops", flops / (ms * 1e-3) / 1e12).null("gbps");
        r.str("label", ns.label);
        if (!algo.empty()) r.str("algo", algo);
        rows.write(r);
        std::printf("ring W=%d %-18s %-22s %-22s %8.3f ms %6.1f TFLOP/s per GPU%s%s\n", W, ns.label.c_str(),
                    op, impl.c_str(), ms, flops / (ms * 1e-3) / 1e12, algo.empty() ? "" : "  ", algo.c_str());
      };
      const double t_steps = b::median(fwd_ms[0]), t_pers = b::median(fwd_ms[1]);
      row("ringAttention", "fusedcomm_persistent", t_pers, f, "");
      row("ringAttention", "fusedcomm_steps", t_steps, f, "");
      row("ringAttention", "fusedcomm", chosen == k::RingFwdPath::kPersistent ? t_pers : t_steps, f,
          k::ring_fwd_path_name(chosen));
      row("ringAttentionBackward", "fusedcomm", b::median(bwd_ms), 2.5 * f, "");
      if (one_gpu) {
        char as[96];
        std::snprintf(as, sizeof as, "1 GPU: batch %lld, seq %lld", static_cast<long long>(B1),
                      static_cast<long long>(S1));
        row("ringAttentionBackward", "fusedcomm_1gpu", b::median(one_ms), 2.5 * f, as);
        row("ringAttentionBackward", "fusedcomm_1gpu_dq_pass", b::median(one_pass_ms), 2.5 * f, as);
      }
      std::fflush(stdout);
    }
  }
  dc->close();
  return failed;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> worlds = {1, 2};
  bool shared = false;
  int iters = 10;
  std::string shapes_path, out_path;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--shared")) {
      shared = true;
    } else if (!std::strcmp(argv[i], "--iters") && i + 1 < argc) {
      iters = std::atoi(argv[++i]);
    } else if (!std::strcmp(argv[i], "--shapes") && i + 1 < argc) {
      shapes_path = argv[++i];
    } else if (!std::strcmp(argv[i], "--out") && i + 1 < argc) {
      out_path = argv[++i];
    } else if (!std::strcmp(argv[i], "--worlds") && i + 1 < argc) {
      worlds.clear();
      for (const char* p = argv[++i]; *p;) {
        worlds.push_back(std::atoi(p));
        while (*p && *p != ',') ++p;
        if (*p == ',') ++p;
      }
    } else {
      std::fprintf(
          stderr,
          "usage: ring_bench [--worlds 1,2] [--shapes FILE] [--out ROWS.jsonl] [--shared] [--iters N]\n");
      return 2;
    }
  }
  std::vector<NamedShape> shapes;
  try {
    shapes = shapes_path.empty() ? default_shapes() : read_shapes(shapes_path);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ring_bench: %s\n", e.what());
    return 2;
  }
  const int n = b::count_gpus_in_child();
  if (n == 0) {
    std::printf("ring_bench: no GPU\n");
    return 77;
  }
  fusedcomm::testing::g_shared_gpu = shared;
  int failed = 0;
  for (size_t wi = 0; wi < worlds.size(); ++wi) {
    const int w = worlds[wi];
    if (!shared && w > n) {
      std::printf("ring_bench: W=%d needs %d GPUs (%d visible; --shared puts the ranks on one)\n", w, w, n);
      return 77;
    }
    // Rows of every world in one file: the first world writes it, the others append.
    std::string path = out_path;
    if (!out_path.empty() && wi > 0) path = out_path + ".w" + std::to_string(w);
    failed += fusedcomm::testing::run_processes(
        w, [&](ProcessGroup& g) { return rank_main(g, shared, iters, shapes, path); }, 900);
    if (!out_path.empty() && wi > 0) {  // append this world's rows to the file
      FILE* in = std::fopen(path.c_str(), "r");
      FILE* out = std::fopen(out_path.c_str(), "a");
      if (in && out) {
        char buf[4096];
        size_t k;
        while ((k = std::fread(buf, 1, sizeof buf, in)) > 0) std::fwrite(buf, 1, k, out);
      }
      if (in) std::fclose(in);
      if (out) std::fclose(out);
      std::remove(path.c_str());
    }
  }
  return failed == 0 ? 0 : 1;
}
