// ring_bench: the forward ring attention (CudaComm::ring_attention_gpu) in both of its forms on
// one host, the persistent kernel and the step pipeline (kernels/attention/ring_fwd.h), at the
// same shapes in one process group, one rank per GPU or every rank on GPU 0.
//   ring_bench [--worlds 1,2] [--shared] [--iters N]
// Per world and shape, each form twice in alternating order: two warm-up calls, then N calls on a
// caller stream, each timed with events; rank 0 prints each form's median (ms) and TF/s per rank (the ring's useful flops over W
// ranks: causal counts the visible half). --shared puts every rank on GPU 0: the ranks then
// take turns on one GPU, so a time there says what the launches and the protocol cost, never
// what NVLink would. Rows: "ring W=<w> <shape> <form> <ms> <TF/s>". Before its rows, each shape's
// o and lse of the two forms are compared bit for bit (exit status 1 if they differ).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "fusedcomm/comm/cuda_comm.h"
#include "fusedcomm/runtime/device_attention.h"
#include "fusedcomm/runtime/runtime.h"
#include "support/cuda_comm_support.h"
#include "support/gpu_test_support.h"
#include "support/process_group.h"

namespace {

namespace k = fusedcomm::kernels;
using fusedcomm::RingAttentionShape;
using fusedcomm::testing::ProcessGroup;

struct Buf {
  void* p = nullptr;
  explicit Buf(size_t n) {
    if (cudaMalloc(&p, n > 0 ? n : 16) != cudaSuccess) std::abort();
    // Seeded non-zero values (timing on zeros runs faster than on real data).
    std::vector<uint16_t> h((n + 1) / 2);
    uint32_t x = static_cast<uint32_t>(n) * 2654435761u + 1;
    for (auto& v : h) {
      x = x * 1664525u + 1013904223u;
      v = static_cast<uint16_t>(0x3c00 | ((x >> 16) & 0x3ff)) ^ static_cast<uint16_t>((x >> 8) & 0x8000);
    }
    cudaMemcpy(p, h.data(), n, cudaMemcpyHostToDevice);
  }
  ~Buf() { cudaFree(p); }
};

double flops(const RingAttentionShape& s) {
  const double f = 4.0 * s.batch * s.q_heads * s.head_dim * static_cast<double>(s.seq) * s.seq;
  return s.causal ? f / 2 : f;
}

int rank_main(ProcessGroup& g, bool shared, int iters) {
  cudaSetDevice(shared ? 0 : g.rank);
  fusedcomm::Runtime rt(
      fusedcomm::testing::loopback_cuda_config(shared ? 0 : g.rank, 1, 60000, 1536ll << 20, shared));
  auto dc = fusedcomm::testing::make_cuda_comm(rt, g, 7171, std::vector<int>(g.world, 0));
  const int W = g.world;
  int failed = 0;
  // B, seq (total), Hq, Hkv, D, causal, scale, zigzag
  const RingAttentionShape shapes[] = {
      {1, 16384, 16, 16, 128, false, 0.0f, false}, {1, 16384, 16, 16, 128, true, 0.0f, true},
      {1, 32768, 16, 16, 128, false, 0.0f, false}, {1, 32768, 16, 16, 128, true, 0.0f, true},
      {1, 16384, 16, 16, 64, false, 0.0f, false},  {1, 32768, 32, 4, 128, true, 0.0f, true},
      {4, 4096, 16, 16, 128, true, 0.0f, true},
  };
  cudaStream_t st;
  cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  for (const RingAttentionShape& s : shapes) {
    const int64_t rows = fusedcomm::ring_block_rows(s, W, g.rank);
    Buf q(s.batch * rows * s.q_heads * s.head_dim * 2), kk(s.batch * rows * s.kv_heads * s.head_dim * 2),
        vv(s.batch * rows * s.kv_heads * s.head_dim * 2), o(s.batch * rows * s.q_heads * s.head_dim * 2),
        lse(s.batch * rows * s.q_heads * 4);
    // Two rounds in alternating order (steps, persistent, persistent, steps): a GPU warms through
    // a run and its clock drops, so whoever runs first would get the cooler GPU.
    std::vector<float> ms[2];
    std::vector<uint8_t> outs[2];
    const size_t o_bytes = s.batch * rows * s.q_heads * s.head_dim * 2,
                 lse_bytes = s.batch * rows * s.q_heads * 4;
    for (k::RingFwdPath path : {k::RingFwdPath::kSteps, k::RingFwdPath::kPersistent,
                                k::RingFwdPath::kPersistent, k::RingFwdPath::kSteps}) {
      dc->set_ring_forward_path(path);
      std::vector<float>& m = ms[path == k::RingFwdPath::kPersistent ? 1 : 0];
      for (int i = 0; i < iters + 2; ++i) {
        g.barrier();
        cudaEventRecord(e0, st);
        dc->ring_attention_gpu({"ringAttention (bench)", 0}, fusedcomm::DType::kBF16, s, q.p, kk.p, vv.p, o.p,
                               static_cast<float*>(lse.p), st);
        cudaEventRecord(e1, st);
        cudaStreamSynchronize(st);
        float t = 0;
        cudaEventElapsedTime(&t, e0, e1);
        if (i >= 2) m.push_back(t);
      }
      // Each form's o and lse (the step pipeline is checked against an fp32 reference in
      // gpu_ring_attention_test; the persistent kernel must give its bits).
      std::vector<uint8_t>& out = outs[path == k::RingFwdPath::kPersistent ? 1 : 0];
      out.resize(o_bytes + lse_bytes);
      cudaMemcpy(out.data(), o.p, o_bytes, cudaMemcpyDeviceToHost);
      cudaMemcpy(out.data() + o_bytes, lse.p, lse_bytes, cudaMemcpyDeviceToHost);
    }
    if (outs[0] != outs[1]) {
      std::printf(
          "FAIL: W=%d rank %d seq=%lld: the persistent kernel's o and lse differ from the step pipeline's\n",
          W, g.rank, static_cast<long long>(s.seq));
      failed = 1;
    }
    for (int i = 0; i < 2; ++i) {
      std::sort(ms[i].begin(), ms[i].end());
      const double med = ms[i][ms[i].size() / 2];
      if (g.rank == 0) {
        std::printf(
            "ring W=%d B=%lld seq=%lld Hq=%lld Hkv=%lld D=%lld%s%s %s %.3f %.1f (min %.3f max %.3f)\n", W,
            static_cast<long long>(s.batch), static_cast<long long>(s.seq), static_cast<long long>(s.q_heads),
            static_cast<long long>(s.kv_heads), static_cast<long long>(s.head_dim), s.causal ? " causal" : "",
            s.zigzag ? " zigzag" : "",
            k::ring_fwd_path_name(i == 1 ? k::RingFwdPath::kPersistent : k::RingFwdPath::kSteps), med,
            flops(s) / W / (med * 1e-3) / 1e12, ms[i].front(), ms[i].back());
        std::fflush(stdout);
      }
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
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--shared")) {
      shared = true;
    } else if (!std::strcmp(argv[i], "--iters") && i + 1 < argc) {
      iters = std::atoi(argv[++i]);
    } else if (!std::strcmp(argv[i], "--worlds") && i + 1 < argc) {
      worlds.clear();
      for (const char* p = argv[++i]; *p;) {
        worlds.push_back(std::atoi(p));
        while (*p && *p != ',') ++p;
        if (*p == ',') ++p;
      }
    } else {
      std::fprintf(stderr, "usage: ring_bench [--worlds 1,2] [--shared] [--iters N]\n");
      return 2;
    }
  }
  fusedcomm::testing::g_shared_gpu = shared;
  int failed = 0;
  for (int w : worlds) {
    failed += fusedcomm::testing::run_processes(
        w, [&](ProcessGroup& g) { return rank_main(g, shared, iters); }, 500);
  }
  return failed == 0 ? 0 : 1;
}
