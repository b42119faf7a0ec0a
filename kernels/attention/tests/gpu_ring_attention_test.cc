// gpu_ring_attention_test: CudaComm's ring attention on the GPU (device_attention.h,
// CudaComm::ring_attention_gpu), one forked process per rank, bootstrapped as the C API's
// callers do it.
//   worlds: 1 (GPU 0), then every W from 2 to the GPU count (at most 4) on GPUs 0..W-1;
//     FC_TEST_SHARED_GPU=<max world>: every rank on GPU 0 (protocol and numerics only).
//   correctness: both layouts (contiguous, zigzag), causal and not, head dims 64 and 128, GQA
//     ratios 1, 4 and MQA, sequences not divisible by W or 2W (uneven blocks; empty chunks
//     where seq < 2W), batch 1, 2 and 4. Every rank makes the whole sequence's q, k, v (seeded),
//     keeps its rows, and checks every element of its o and lse (poisoned first) against an
//     fp32 reference over the whole sequence by global position:
//     |do| <= 6e-3 + 1e-2 |ref|, |dlse| <= 2e-3 + 1e-4 |ref|.
//   k and v not 16-byte aligned in some cases (the ring reads its packed copy at step 0).
//   back-to-back: the op again on the same inputs gives the same bits, and three more times after
//     an allReduce of the same communicator with the ranks skewed (buffers and ring flags
//     reused across epochs).
//   the stream form: the op on a stream of the caller, then captured in a CUDA graph and
//     replayed twice, the same bits as the synchronous run.
//   both forms of the forward ring on every case (kernels/attention/ring_fwd.h: the step
//     pipeline, then the persistent kernel, each through all of the above), the persistent
//     kernel's o and lse bit-identical to the pipeline's.
//   worlds sharing GPU 0 (FC_TEST_SHARED_GPU) up to 8 ranks.
//   a rank that never arrives: the others get Error(kTimeout) within seconds, naming it.
// FC_TEST_HOSTS=<H>: worlds that H divides run as H virtual hosts (rank r on host r * H / W)
// through the cross-host decomposed form (src/comm/cuda_comm_ring_hosts.cc).
// FC_TEST_WORLDS=<w,...>: only those worlds. Exit 77 (skip) with a reason where fewer than 2
// Hopper GPUs with peer access are visible (and the shared-GPU mode is off).
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

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

float unit(uint64_t h) { return static_cast<float>(static_cast<double>(h >> 11) * 0x1p-53 * 2.0 - 1.0); }
float round_bf16(float x) { return __bfloat162float(__float2bfloat16(x)); }

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
};

// One case on this rank: inputs, the op, every element checked.
// shift_kv: k and v 2 bytes past a 16-byte boundary (the ring then reads its packed copy).
// Returns the first run's o and lse (the bits every later run must repeat).
void run_case(fusedcomm::CudaComm& dc, ProcessGroup& g, const RingAttentionShape& s, uint64_t seed,
              bool shift_kv, std::vector<uint16_t>& o_out, std::vector<float>& lse_out) {
  const int W = g.world, r = g.rank;
  const int64_t B = s.batch, S = s.seq, Hq = s.q_heads, Hkv = s.kv_heads, D = s.head_dim;
  // The whole sequence (every rank makes the same), bf16-exact values.
  auto val = [&](int t, int64_t i, float amp) {
    return round_bf16(unit(mix(seed ^ (uint64_t(t) << 60) ^ uint64_t(i))) * amp);
  };
  const fusedcomm::SeqRuns mine = fusedcomm::attention_seq_chunks(S, W, r, s.zigzag);
  std::vector<int64_t> pos;  // this rank's rows' global positions
  for (const SeqRun& c : mine)
    for (int64_t i = 0; i < c.count; ++i) pos.push_back(c.pos + i);
  const int64_t Sr = static_cast<int64_t>(pos.size());
  std::vector<__nv_bfloat16> q(B * Sr * Hq * D), kk(B * Sr * Hkv * D), vv(B * Sr * Hkv * D);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < Sr; ++i) {
      for (int64_t x = 0; x < Hq * D; ++x)
        q[(b * Sr + i) * Hq * D + x] = __float2bfloat16(val(0, (b * S + pos[i]) * Hq * D + x, 2.0f));
      for (int64_t x = 0; x < Hkv * D; ++x) {
        kk[(b * Sr + i) * Hkv * D + x] = __float2bfloat16(val(1, (b * S + pos[i]) * Hkv * D + x, 2.0f));
        vv[(b * Sr + i) * Hkv * D + x] = __float2bfloat16(val(2, (b * S + pos[i]) * Hkv * D + x, 1.0f));
      }
    }
  Dev dq(q.size() * 2), dk(kk.size() * 2 + 16), dv(vv.size() * 2 + 16), dout(q.size() * 2),
      dlse(B * Hq * Sr * 4);
  const size_t shift = shift_kv ? 2 : 0;
  void* pk = static_cast<char*>(dk.p) + shift;
  void* pv = static_cast<char*>(dv.p) + shift;
  CUDA_OK(cudaMemcpy(dq.p, q.data(), q.size() * 2, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(pk, kk.data(), kk.size() * 2, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(pv, vv.data(), vv.size() * 2, cudaMemcpyHostToDevice));
  // stream: null (synchronous) or a stream of the caller, the op then captured in a CUDA graph
  // and replayed twice where `graph`.
  auto run = [&](std::vector<uint16_t>& o, std::vector<float>& lse, cudaStream_t stream = nullptr,
                 bool graph = false) {
    CUDA_OK(cudaMemset(dout.p, 0xFF, q.size() * 2));
    CUDA_OK(cudaMemset(dlse.p, 0xFF, B * Hq * Sr * 4));
    // The poison runs on the legacy stream, which a caller's non-blocking stream does not wait
    // for: it must land before the op's first launch stores lse.
    CUDA_OK(cudaDeviceSynchronize());
    auto op = [&](cudaStream_t st) {
      dc.ring_attention_gpu({"ringAttention (test)", 0}, fusedcomm::DType::kBF16, s, dq.p, pk, pv, dout.p,
                            static_cast<float*>(dlse.p), st);
    };
    if (stream == nullptr) {
      op(nullptr);
    } else {
      CUDA_OK(fusedcomm::testing::run_on_stream(stream, graph, 2, op));
      dc.synchronize();
    }
    o.resize(q.size());
    lse.resize(B * Hq * Sr);
    CUDA_OK(cudaMemcpy(o.data(), dout.p, o.size() * 2, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(lse.data(), dlse.p, lse.size() * 4, cudaMemcpyDeviceToHost));
  };
  std::vector<uint16_t> o, o2;
  std::vector<float> lse, lse2;
  run(o, lse);
  // Reference: the whole sequence's keys, by global position.
  const float scale = s.scale != 0.0f ? s.scale : 1.0f / std::sqrt(static_cast<float>(D));
  const int64_t group = Hq / Hkv;
  std::vector<float> kf(S * Hkv * D), vf(S * Hkv * D), sc(S), acc(D);
  long bad_o = 0, bad_l = 0;
  double max_o = 0, max_l = 0;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t j = 0; j < S; ++j)
      for (int64_t x = 0; x < Hkv * D; ++x) {
        kf[j * Hkv * D + x] = val(1, (b * S + j) * Hkv * D + x, 2.0f);
        vf[j * Hkv * D + x] = val(2, (b * S + j) * Hkv * D + x, 1.0f);
      }
    for (int64_t i = 0; i < Sr; ++i)
      for (int64_t h = 0; h < Hq; ++h) {
        const int64_t hk = h / group;
        const __nv_bfloat16* qr = &q[((b * Sr + i) * Hq + h) * D];
        const int64_t n = s.causal ? pos[i] + 1 : S;
        float mx = -INFINITY;
        for (int64_t j = 0; j < n; ++j) {
          float d = 0;
          for (int64_t c = 0; c < D; ++c) d += __bfloat162float(qr[c]) * kf[(j * Hkv + hk) * D + c];
          sc[j] = d * scale;
          mx = std::max(mx, sc[j]);
        }
        double sum = 0;
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (int64_t j = 0; j < n; ++j) {
          const float e = std::exp(sc[j] - mx);
          sum += e;
          for (int64_t c = 0; c < D; ++c) acc[c] += e * vf[(j * Hkv + hk) * D + c];
        }
        const float want_l = n > 0 ? mx + static_cast<float>(std::log(sum)) : -INFINITY;
        const float got_l = lse[(b * Hq + h) * Sr + i];
        const double el = std::fabs(double(got_l) - want_l);
        if (!(el <= 2e-3 + 1e-4 * std::fabs(want_l)) && !(std::isinf(want_l) && got_l == want_l)) ++bad_l;
        if (!(el <= max_l)) max_l = el;
        for (int64_t c = 0; c < D; ++c) {
          const float want = n > 0 ? static_cast<float>(acc[c] / sum) : 0.0f;
          uint32_t u = static_cast<uint32_t>(o[((b * Sr + i) * Hq + h) * D + c]) << 16;
          float got;
          std::memcpy(&got, &u, 4);
          const double e = std::fabs(double(got) - want);
          if (!(e <= 6e-3 + 1e-2 * std::fabs(want))) ++bad_o;
          if (!(e <= max_o)) max_o = e;
        }
      }
  }
  const std::string path = k::ring_fwd_path_name(dc.ring_forward_path());
  const std::string what = "W=" + std::to_string(W) + " rank " + std::to_string(r) + " " + name(s) +
                           (shift_kv ? " k,v unaligned" : "") + " (" + path + ")";
  if (r == 0)
    std::printf("  %s%s (%s): max|do| %.2e max|dlse| %.2e\n", name(s).c_str(), shift_kv ? " k,v unaligned" : "",
                path.c_str(), max_o, max_l);
  check(bad_o == 0, what + ": o within tolerance (" + std::to_string(bad_o) + " elements off)");
  check(bad_l == 0, what + ": lse within tolerance (" + std::to_string(bad_l) + " elements off)");
  run(o2, lse2);
  check(o2 == o && std::memcmp(lse2.data(), lse.data(), lse.size() * 4) == 0,
        what + ": back-to-back run bit-identical");
  // Buffer and flag reuse across epochs with another op of the communicator in between and the
  // ranks skewed: an allReduce (which shares the epoch counter and the data area), then the
  // ring three more times, rank-dependent delays before each.
  Dev ar(4096 * 4);
  CUDA_OK(cudaMemset(ar.p, 0, 4096 * 4));
  dc.all_reduce({"allReduce (test)", 0}, fusedcomm::DType::kF32, ar.p, ar.p, 4096, nullptr);
  bool same = true;
  for (int i = 0; i < 3; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(((r + i) % W) * 3));
    run(o2, lse2);
    same = same && o2 == o && std::memcmp(lse2.data(), lse.data(), lse.size() * 4) == 0;
  }
  check(same, what + ": three more runs after an allReduce, ranks skewed, bit-identical");
  // The stream form, then captured in a CUDA graph and replayed twice: the same bits.
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  run(o2, lse2, stream, false);
  check(o2 == o && std::memcmp(lse2.data(), lse.data(), lse.size() * 4) == 0,
        what + ": on a caller stream, bit-identical");
  run(o2, lse2, stream, true);
  check(o2 == o && std::memcmp(lse2.data(), lse.data(), lse.size() * 4) == 0,
        what + ": captured in a CUDA graph, replayed twice, bit-identical");
  CUDA_OK(cudaStreamDestroy(stream));
  o_out = o;
  lse_out = lse;
}

int rank_main(ProcessGroup& g, const std::vector<int>& gpus, uint64_t seed) {
  CUDA_OK(cudaSetDevice(gpus[g.rank]));
  const bool shared = fusedcomm::testing::g_shared_gpu;
  try {
    {
      fusedcomm::Runtime rt(
          fusedcomm::testing::loopback_cuda_config(gpus[g.rank], seed, 20000, 64 << 20, shared));
      auto dc = make_cuda_comm(rt, g, 5151, virtual_hosts(g.world));
      const RingAttentionShape cases[] = {
          // B, seq, Hq, Hkv, D, causal, scale, zigzag
          {2, 1000, 4, 4, 64, false, 0.0f, false}, {2, 1000, 4, 4, 64, true, 0.0f, false},
          {2, 1000, 4, 4, 64, false, 0.0f, true},  {2, 1000, 4, 4, 64, true, 0.0f, true},
          {1, 777, 8, 2, 128, true, 0.0f, true},   {1, 777, 8, 2, 128, true, 0.0f, false},
          {1, 333, 8, 1, 64, true, 0.0f, false},   {1, 333, 8, 1, 128, false, 0.3f, true},
          {1, 5, 2, 2, 64, true, 0.0f, true},      {2, 130, 4, 4, 128, false, 0.0f, false},
          {4, 517, 8, 2, 64, true, 0.0f, true},
      };
      // Both forms of the forward ring (kernels/attention/ring_fwd.h), every case: each
      // checked against the reference, and the persistent kernel's bits equal to the step
      // pipeline's (the same tiles, merged in the same order).
      int i = 0;
      for (const RingAttentionShape& s : cases) {
        ++i;
        std::vector<uint16_t> o_steps, o_kernel;
        std::vector<float> lse_steps, lse_kernel;
        dc->set_ring_forward_path(k::RingFwdPath::kSteps);
        run_case(*dc, g, s, mix(seed ^ static_cast<uint64_t>(i)), i % 4 == 0, o_steps, lse_steps);
        dc->set_ring_forward_path(k::RingFwdPath::kPersistent);
        run_case(*dc, g, s, mix(seed ^ static_cast<uint64_t>(i)), i % 4 == 0, o_kernel, lse_kernel);
        check(o_kernel == o_steps && lse_kernel.size() == lse_steps.size() &&
                  std::memcmp(lse_kernel.data(), lse_steps.data(), lse_steps.size() * 4) == 0,
              "W=" + std::to_string(g.world) + " rank " + std::to_string(g.rank) + " " + name(s) +
                  ": the persistent kernel's o and lse bit-identical to the step pipeline's");
        dc->set_ring_forward_path(k::RingFwdPath::kAuto);
      }
      dc->close();
    }
    if (g.world > 1) {
      // A rank that never arrives: the others time out, naming the op.
      fusedcomm::Runtime rt(
          fusedcomm::testing::loopback_cuda_config(gpus[g.rank], seed, 1000, 64 << 20, shared));
      auto dc = make_cuda_comm(rt, g, 5152, virtual_hosts(g.world));
      if (g.rank != g.world - 1) {
        const RingAttentionShape s{1, 256, 2, 2, 64, true, 0.0f, true};
        Dev d(1 << 20);
        fusedcomm::testing::expect_dead_rank_timeout(g, [&] {
          dc->ring_attention_gpu({"ringAttention (test)", 0}, fusedcomm::DType::kBF16, s, d.p, d.p, d.p,
                                 static_cast<char*>(d.p) + (512 << 10), nullptr);
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
  const int n = fusedcomm::testing::peer_gpus_or_skip("gpu_ring_attention_test", shared);
  if (n == 0) return 77;
  const uint64_t seed = fusedcomm::testing::test_seed("gpu_ring_attention_test", n);
  fusedcomm::testing::g_shared_gpu = shared > 0;
  // Up to 4 GPUs; ranks sharing GPU 0 up to the collectives' rank limit (8).
  const int max_world = shared > 0 ? std::min(shared, k::kCommMaxRanks) : std::min(n, 4);
  int failed = 0;
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
    failed += f;
  }
  std::printf(failed == 0 ? "gpu_ring_attention_test: PASS\n" : "gpu_ring_attention_test: FAIL\n");
  return failed == 0 ? 0 : 1;
}
