// gpu_ring_attention_bwd_test: CudaComm's ring attention backward on the GPU
// (CudaComm::ring_attention_backward_gpu), one forked process per rank, bootstrapped as the C
// API's callers do it.
//   worlds: 1 (GPU 0), then every W from 2 to the GPU count (at most 4) on GPUs 0..W-1;
//     FC_TEST_SHARED_GPU=<max world>: every rank on GPU 0 (protocol and numerics only).
//   correctness: both layouts (contiguous, zigzag), causal and not, head dims 64 and 128, GQA
//     ratios 1, 4 and MQA, sequences not divisible by W or 2W (uneven blocks; empty chunks
//     where seq < 2W), batch 1 and 2. Every rank makes the whole sequence's q, k, v and dO
//     (seeded), runs the single-GPU forward (o, lse) and backward (cuda_attention_backward_local)
//     over the whole sequence as the reference, keeps its rows of q, k, v, o, lse, dO, and checks
//     every element of its dq, dk, dv (poisoned first) against the reference's rows:
//     |d| <= 4e-3 max|ref| + 1e-2 |ref| per tensor (the two differ in the order of fp32 sums).
//   k and v not 16-byte aligned in some cases (the ring packs its own block first).
//   back-to-back: the op again on the same inputs gives the same bits, and twice more after an
//     allReduce and a forward ring of the same communicator with the ranks skewed (buffers and
//     ring flags reused across epochs and ops).
//   the stream form: the op on a stream of the caller, then captured in a CUDA graph and
//     replayed twice, the same bits as the synchronous run.
//   a rank that never arrives: the others get Error(kTimeout) within seconds, naming it.
// FC_TEST_HOSTS=<H>: worlds that H divides run as H virtual hosts (rank r on host r * H / W)
// through the cross-host decomposed form (src/comm/cuda_comm_ring_hosts.cc).
// FC_TEST_WORLDS=<w,...>: only those worlds. Exit 77 (skip) with a reason where fewer than 2
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
#include <string>
#include <thread>
#include <vector>

#include "fusedcomm/comm/cuda_comm.h"
#include "fusedcomm/runtime/device_attention.h"
#include "fusedcomm/runtime/errors.h"
#include "fusedcomm/runtime/runtime.h"
#include "kernels/collectives/collectives.h"
#include "support/cuda_comm_support.h"
#include "support/gpu_test_support.h"
#include "support/process_group.h"

namespace {

namespace k = fusedcomm::kernels;
using fusedcomm::Error;
using fusedcomm::ErrorKind;
using fusedcomm::RingAttentionShape;
using fusedcomm::SeqRun;
using fusedcomm::testing::check;
using fusedcomm::testing::g_failed;
using fusedcomm::testing::g_passed;
using fusedcomm::testing::host_count;
using fusedcomm::testing::make_cuda_comm;
using fusedcomm::testing::mix;
using fusedcomm::testing::ProcessGroup;
using fusedcomm::testing::virtual_hosts;
using Bf16 = __nv_bfloat16;

float unit(uint64_t h) { return static_cast<float>(static_cast<double>(h >> 11) * 0x1p-53 * 2.0 - 1.0); }
float to_f(Bf16 x) { return __bfloat162float(x); }

std::string name(const RingAttentionShape& s) {
  return "B=" + std::to_string(s.batch) + " seq=" + std::to_string(s.seq) +
         " Hq=" + std::to_string(s.q_heads) + " Hkv=" + std::to_string(s.kv_heads) +
         " D=" + std::to_string(s.head_dim) + (s.causal ? " causal" : "") +
         (s.zigzag ? " zigzag" : " contiguous");
}

struct Dev {
  void* p = nullptr;
  explicit Dev(size_t bytes) { CUDA_OK(cudaMalloc(&p, bytes > 0 ? bytes : 16)); }
  ~Dev() { cudaFree(p); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
};

template <typename T>
void upload(void* dst, const std::vector<T>& h) {
  if (!h.empty()) CUDA_OK(cudaMemcpy(dst, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
}
template <typename T>
std::vector<T> download(const void* src, size_t n) {
  std::vector<T> h(n);
  if (n > 0) CUDA_OK(cudaMemcpy(h.data(), src, n * sizeof(T), cudaMemcpyDeviceToHost));
  return h;
}

// Rows `pos` (global positions) of a (B, S, H·D) tensor: (B, |pos|, H·D).
std::vector<Bf16> rows_of(const std::vector<Bf16>& full, int64_t B, int64_t S, int64_t width,
                          const std::vector<int64_t>& pos) {
  const int64_t n = static_cast<int64_t>(pos.size());
  std::vector<Bf16> out(B * n * width);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < n; ++i)
      std::copy_n(&full[(b * S + pos[i]) * width], width, &out[(b * n + i) * width]);
  return out;
}

// Elements of got outside |got - ref| <= 4e-3 max|ref| + 1e-2 |ref|; the largest error over max|ref|.
long count_off(const std::vector<Bf16>& got, const std::vector<Bf16>& ref, double* rel_max) {
  double mx = 0;
  for (Bf16 x : ref) mx = std::max(mx, std::fabs(double(to_f(x))));
  long bad = 0;
  double worst = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double r = to_f(ref[i]), e = std::fabs(double(to_f(got[i])) - r);
    if (!(e <= 4e-3 * mx + 1e-2 * std::fabs(r))) ++bad;
    if (!(e <= worst)) worst = e;
  }
  *rel_max = mx > 0 ? worst / mx : worst;
  return bad;
}

bool same_bits(const std::vector<Bf16>& a, const std::vector<Bf16>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * 2) == 0);
}

// One case on this rank: inputs, the reference, the op, every element checked.
void run_case(fusedcomm::CudaComm& dc, ProcessGroup& g, const RingAttentionShape& s, uint64_t seed,
              bool shift_kv) {
  const int W = g.world, r = g.rank;
  const int64_t B = s.batch, S = s.seq, Hq = s.q_heads, Hkv = s.kv_heads, D = s.head_dim;
  auto make = [&](int t, int64_t n, float amp) {
    std::vector<Bf16> x(n);
    for (int64_t i = 0; i < n; ++i)
      x[i] = __float2bfloat16(unit(mix(seed ^ (uint64_t(t) << 60) ^ uint64_t(i))) * amp);
    return x;
  };
  const std::vector<Bf16> q = make(0, B * S * Hq * D, 2.0f), kk = make(1, B * S * Hkv * D, 2.0f),
                          vv = make(2, B * S * Hkv * D, 1.0f), dout = make(3, B * S * Hq * D, 1.0f);
  // The reference over the whole sequence on this rank's GPU.
  Dev fq(q.size() * 2), fk(kk.size() * 2), fv(vv.size() * 2), fo(q.size() * 2), fdo(q.size() * 2),
      flse(B * Hq * S * 4), fdq(q.size() * 2), fdk(kk.size() * 2), fdv(vv.size() * 2);
  upload(fq.p, q);
  upload(fk.p, kk);
  upload(fv.p, vv);
  upload(fdo.p, dout);
  const fc_attention_local_t full{B, S, S, Hq, Hkv, D, s.causal ? 1 : 0, s.scale, 0};
  fusedcomm::cuda_attention_local(full, fusedcomm::DType::kBF16, fq.p, fk.p, fv.p, fo.p,
                                  static_cast<float*>(flse.p), nullptr);
  fusedcomm::cuda_attention_backward_local(full, fusedcomm::DType::kBF16, fq.p, fk.p, fv.p, fo.p,
                                           static_cast<const float*>(flse.p), fdo.p, fdq.p, fdk.p, fdv.p,
                                           nullptr);
  const auto o_full = download<Bf16>(fo.p, q.size());
  const auto lse_full = download<float>(flse.p, B * Hq * S);
  const auto dq_full = download<Bf16>(fdq.p, q.size());
  const auto dk_full = download<Bf16>(fdk.p, kk.size());
  const auto dv_full = download<Bf16>(fdv.p, vv.size());
  // This rank's rows.
  std::vector<int64_t> pos;
  for (const SeqRun& c : fusedcomm::attention_seq_chunks(S, W, r, s.zigzag))
    for (int64_t i = 0; i < c.count; ++i) pos.push_back(c.pos + i);
  const int64_t Sr = static_cast<int64_t>(pos.size());
  const auto q_r = rows_of(q, B, S, Hq * D, pos), k_r = rows_of(kk, B, S, Hkv * D, pos),
             v_r = rows_of(vv, B, S, Hkv * D, pos), o_r = rows_of(o_full, B, S, Hq * D, pos),
             do_r = rows_of(dout, B, S, Hq * D, pos), dq_ref = rows_of(dq_full, B, S, Hq * D, pos),
             dk_ref = rows_of(dk_full, B, S, Hkv * D, pos), dv_ref = rows_of(dv_full, B, S, Hkv * D, pos);
  std::vector<float> lse_r(B * Hq * Sr);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hq; ++h)
      for (int64_t i = 0; i < Sr; ++i) lse_r[(b * Hq + h) * Sr + i] = lse_full[(b * Hq + h) * S + pos[i]];
  Dev dq_in(q_r.size() * 2), dk_in(k_r.size() * 2 + 16), dv_in(v_r.size() * 2 + 16), d_o(q_r.size() * 2),
      d_do(q_r.size() * 2), d_lse(lse_r.size() * 4), g_q(q_r.size() * 2), g_k(k_r.size() * 2),
      g_v(v_r.size() * 2);
  const size_t shift = shift_kv ? 2 : 0;
  void* pk = static_cast<char*>(dk_in.p) + shift;
  void* pv = static_cast<char*>(dv_in.p) + shift;
  upload(dq_in.p, q_r);
  upload(pk, k_r);
  upload(pv, v_r);
  upload(d_o.p, o_r);
  upload(d_do.p, do_r);
  upload(d_lse.p, lse_r);
  std::vector<Bf16> gq, gk, gv;
  // stream: null (synchronous) or a stream of the caller, the op then captured in a CUDA graph
  // and replayed twice where `graph`.
  auto run = [&](cudaStream_t stream = nullptr, bool graph = false) {
    CUDA_OK(cudaMemset(g_q.p, 0xFF, q_r.size() * 2));
    CUDA_OK(cudaMemset(g_k.p, 0xFF, k_r.size() * 2));
    CUDA_OK(cudaMemset(g_v.p, 0xFF, v_r.size() * 2));
    CUDA_OK(cudaDeviceSynchronize());  // before the op, whichever stream it runs on
    auto op = [&](cudaStream_t st) {
      dc.ring_attention_backward_gpu({"ringAttentionBackward (test)", 0}, fusedcomm::DType::kBF16, s, dq_in.p,
                                     pk, pv, d_o.p, static_cast<const float*>(d_lse.p), d_do.p, g_q.p, g_k.p,
                                     g_v.p, st);
    };
    if (stream == nullptr) {
      op(nullptr);
    } else {
      CUDA_OK(fusedcomm::testing::run_on_stream(stream, graph, 2, op));
      dc.synchronize();
    }
    gq = download<Bf16>(g_q.p, q_r.size());
    gk = download<Bf16>(g_k.p, k_r.size());
    gv = download<Bf16>(g_v.p, v_r.size());
  };
  run();
  double eq = 0, ek = 0, ev = 0;
  const long bq = count_off(gq, dq_ref, &eq), bk = count_off(gk, dk_ref, &ek),
             bv = count_off(gv, dv_ref, &ev);
  const std::string what = "W=" + std::to_string(W) + " rank " + std::to_string(r) + " " + name(s) +
                           (shift_kv ? " k,v unaligned" : "");
  std::printf("  rank %d %s%s: max|d|/max|ref| dq %.2e dk %.2e dv %.2e\n", r, name(s).c_str(),
              shift_kv ? " k,v unaligned" : "", eq, ek, ev);
  check(bq == 0, what + ": dq within tolerance (" + std::to_string(bq) + " elements off)");
  check(bk == 0, what + ": dk within tolerance (" + std::to_string(bk) + " elements off)");
  check(bv == 0, what + ": dv within tolerance (" + std::to_string(bv) + " elements off)");
  const auto gq0 = gq, gk0 = gk, gv0 = gv;
  run();
  check(same_bits(gq, gq0) && same_bits(gk, gk0) && same_bits(gv, gv0),
        what + ": back-to-back run bit-identical");
  // Buffers and flags reused across epochs and ops: an allReduce and a forward ring (which share
  // the epoch counter, the data area and the ring flags), then the backward twice more, ranks
  // skewed.
  Dev ar(4096 * 4), fwd_o(q_r.size() * 2), fwd_lse(lse_r.size() * 4 + 16);
  CUDA_OK(cudaMemset(ar.p, 0, 4096 * 4));
  dc.all_reduce({"allReduce (test)", 0}, fusedcomm::DType::kF32, ar.p, ar.p, 4096, nullptr);
  dc.ring_attention_gpu({"ringAttention (test)", 0}, fusedcomm::DType::kBF16, s, dq_in.p, pk, pv, fwd_o.p,
                        static_cast<float*>(fwd_lse.p));
  bool same = true;
  for (int i = 0; i < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(((r + i) % W) * 3));
    run();
    same = same && same_bits(gq, gq0) && same_bits(gk, gk0) && same_bits(gv, gv0);
  }
  check(same, what + ": two more runs after an allReduce and a forward ring, ranks skewed, bit-identical");
  // The stream form, then captured in a CUDA graph and replayed twice: the same bits.
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  run(stream, false);
  check(same_bits(gq, gq0) && same_bits(gk, gk0) && same_bits(gv, gv0),
        what + ": on a caller stream, bit-identical");
  run(stream, true);
  check(same_bits(gq, gq0) && same_bits(gk, gk0) && same_bits(gv, gv0),
        what + ": captured in a CUDA graph, replayed twice, bit-identical");
  CUDA_OK(cudaStreamDestroy(stream));
}

int rank_main(ProcessGroup& g, const std::vector<int>& gpus, uint64_t seed) {
  CUDA_OK(cudaSetDevice(gpus[g.rank]));
  const bool shared = fusedcomm::testing::g_shared_gpu;
  try {
    {
      fusedcomm::Runtime rt(
          fusedcomm::testing::loopback_cuda_config(gpus[g.rank], seed, 20000, 64 << 20, shared));
      auto dc = make_cuda_comm(rt, g, 5161, virtual_hosts(g.world));
      const RingAttentionShape cases[] = {
          // B, seq, Hq, Hkv, D, causal, scale, zigzag
          {2, 1000, 4, 4, 64, false, 0.0f, false}, {2, 1000, 4, 4, 64, true, 0.0f, false},
          {2, 1000, 4, 4, 64, false, 0.0f, true},  {2, 1000, 4, 4, 64, true, 0.0f, true},
          {1, 777, 8, 2, 128, true, 0.0f, true},   {1, 777, 8, 2, 128, false, 0.0f, false},
          {1, 333, 8, 1, 64, true, 0.0f, false},   {1, 333, 8, 1, 128, false, 0.3f, true},
          {1, 5, 2, 2, 64, true, 0.0f, true},      {2, 130, 4, 4, 128, true, 0.0f, false},
      };
      int i = 0;
      for (const RingAttentionShape& s : cases) {
        ++i;
        run_case(*dc, g, s, mix(seed ^ static_cast<uint64_t>(i)), i % 4 == 0);
      }
      dc->close();
    }
    if (g.world > 1) {
      // A rank that never arrives: the others time out, naming it.
      fusedcomm::Runtime rt(
          fusedcomm::testing::loopback_cuda_config(gpus[g.rank], seed, 1000, 64 << 20, shared));
      auto dc = make_cuda_comm(rt, g, 5162, virtual_hosts(g.world));
      if (g.rank != g.world - 1) {
        const RingAttentionShape s{1, 256, 2, 2, 64, true, 0.0f, true};
        Dev d(1 << 20);
        char* p = static_cast<char*>(d.p);
        fusedcomm::testing::expect_dead_rank_timeout(g, [&] {
          dc->ring_attention_backward_gpu({"ringAttentionBackward (test)", 0}, fusedcomm::DType::kBF16, s, p,
                                          p, p, p, reinterpret_cast<const float*>(p + (256 << 10)), p,
                                          p + (512 << 10), p + (640 << 10), p + (768 << 10));
        });
        dc->abort();
      }
      g.barrier();
    }
  } catch (const std::exception& e) {
    check(false, std::string("rank ") + std::to_string(g.rank) + " threw: " + e.what());
  }
  std::printf("  rank %d: %d passed, %d failed\n", g.rank, g_passed, g_failed);
  return g_failed == 0 ? 0 : 1;
}

}  // namespace

int main() {
  const int shared = fusedcomm::testing::shared_gpu_world();
  const int n = fusedcomm::testing::peer_gpus_or_skip("gpu_ring_attention_bwd_test", shared);
  if (n == 0) return 77;
  const uint64_t seed = fusedcomm::testing::test_seed("gpu_ring_attention_bwd_test", n);
  fusedcomm::testing::g_shared_gpu = shared > 0;
  const int max_world = shared > 0 ? std::min(shared, k::kCommMaxRanks) : std::min(n, 4);
  int failed = 0;
  std::vector<std::string> table;
  for (int w = 1; w <= max_world; ++w) {
    if (!fusedcomm::testing::test_world_selected(w)) continue;
    std::vector<int> gpus;
    for (int i = 0; i < w; ++i) gpus.push_back(shared > 0 ? 0 : i);
    std::printf("== world %d%s, %d host(s)\n", w, shared > 0 ? " (all ranks on GPU 0)" : "",
                fusedcomm::testing::host_count(fusedcomm::testing::virtual_hosts(w)));
    std::fflush(stdout);
    const auto t0 = std::chrono::steady_clock::now();
    const int f = fusedcomm::testing::run_processes(
        w, [&](ProcessGroup& g) { return rank_main(g, gpus, seed); }, 240);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("== world %d: %s (%.1f s)\n", w, f == 0 ? "PASS" : "FAIL", s);
    char line[96];
    std::snprintf(line, sizeof(line), "  W=%d %s %.1f s", w, f == 0 ? "PASS" : "FAIL", s);
    table.emplace_back(line);
    failed += f;
  }
  std::printf("gpu_ring_attention_bwd_test summary:\n");
  for (const std::string& l : table) std::printf("%s\n", l.c_str());
  std::printf(failed == 0 ? "gpu_ring_attention_bwd_test: PASS\n" : "gpu_ring_attention_bwd_test: FAIL\n");
  return failed == 0 ? 0 : 1;
}
