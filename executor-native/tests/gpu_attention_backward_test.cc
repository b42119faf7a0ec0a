// gpu_attention_backward_test: cuda_attention_backward_local (fc_attention_backward's cuda
// backend) on one GPU against the kernel launcher it wraps (whose gradients
// kernels/attention/tests/attention_bwd_test checks against an fp32 reference): the same
// gradients on the legacy stream (synchronous), on a stream of its own, from two threads on two
// streams at once (each call with its own workspace), back to back, and captured in a CUDA graph
// replayed twice; with no query rows, dk and dv are zeros. dk and dv bit for bit; dq too with
// `deterministic` (dQ in its own pass) or where tuning.h computes it there (else within rounding:
// fp32 additions in any order); both settings' dq agree within rounding.
// Exit 77 (skipped) without a Hopper GPU.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "fusedcomm/runtime/device_attention.h"
#include "fusedcomm/runtime/errors.h"
#include "kernels/attention/attention.h"
#include "kernels/attention/attention_bwd.h"
#include "kernels/attention/tuning.h"
#include "support/check.h"

namespace {

using fusedcomm::testing::check;
namespace k = fusedcomm::kernels;

#define CUDA_OK(x)                                                                             \
  do {                                                                                         \
    cudaError_t e_ = (x);                                                                      \
    if (e_ != cudaSuccess) {                                                                   \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                            \
    }                                                                                          \
  } while (0)

uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

void* device_random(size_t n, uint64_t seed, float amp) {
  std::vector<__nv_bfloat16> h(n);
  for (size_t i = 0; i < n; ++i) {
    const uint64_t r = mix64(seed ^ mix64(i));
    h[i] = __float2bfloat16((static_cast<float>(r >> 40) * (2.0f / 16777216.0f) - 1.0f) * amp);
  }
  void* d = nullptr;
  CUDA_OK(cudaMalloc(&d, n * 2 + 16));
  CUDA_OK(cudaMemcpy(d, h.data(), n * 2, cudaMemcpyHostToDevice));
  return d;
}

std::vector<uint16_t> read(const void* p, size_t n) {
  std::vector<uint16_t> h(n);
  if (n > 0) CUDA_OK(cudaMemcpy(h.data(), p, n * 2, cudaMemcpyDeviceToHost));
  return h;
}

float bf(uint16_t u) {
  const uint32_t x = static_cast<uint32_t>(u) << 16;
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

// Within rounding of the reference: max |a - b| <= 1e-2 · max |b|.
bool close(const std::vector<uint16_t>& a, const std::vector<uint16_t>& b) {
  double mx = 0, me = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    mx = std::fmax(mx, std::fabs(double(bf(b[i]))));
    me = std::fmax(me, std::fabs(double(bf(a[i])) - bf(b[i])));
  }
  return a.size() == b.size() && me <= 1e-2 * mx + 1e-6;
}

struct Grads {
  void *dq = nullptr, *dk = nullptr, *dv = nullptr;
};

struct Case {
  fc_attention_local_t s{};
  size_t nq = 0, nk = 0;
  void *q = nullptr, *kk = nullptr, *v = nullptr, *o = nullptr, *d_o = nullptr;
  float* lse = nullptr;
  std::vector<uint16_t> want_dq, want_dk, want_dv;

  Grads alloc() const {
    Grads g;
    CUDA_OK(cudaMalloc(&g.dq, nq * 2 + 16));
    CUDA_OK(cudaMalloc(&g.dk, nk * 2 + 16));
    CUDA_OK(cudaMalloc(&g.dv, nk * 2 + 16));
    return g;
  }
  void poison(const Grads& g, cudaStream_t st) const {
    CUDA_OK(cudaMemsetAsync(g.dq, 0xFF, nq * 2, st));
    CUDA_OK(cudaMemsetAsync(g.dk, 0xFF, nk * 2, st));
    CUDA_OK(cudaMemsetAsync(g.dv, 0xFF, nk * 2, st));
  }
  void call(const Grads& g, cudaStream_t st) const {
    fusedcomm::cuda_attention_backward_local(s, fusedcomm::DType::kBF16, q, kk, v, o, lse, d_o, g.dq, g.dk,
                                             g.dv, st);
  }
  bool same(const Grads& g) const {
    const bool dq_exact =
        s.deterministic != 0 || (s.head_dim == 128 ? k::tuning::kAttnBwdDq128 : k::tuning::kAttnBwdDq64) == 0;
    const std::vector<uint16_t> dq = read(g.dq, nq);
    return read(g.dk, nk) == want_dk && read(g.dv, nk) == want_dv &&
           (dq_exact ? dq == want_dq : close(dq, want_dq));
  }
};

// Inputs, the forward's o and lse, and the launcher's gradients (the expected ones).
Case make_case(int64_t batch, int64_t q_len, int64_t kv_len, int64_t hq, int64_t hkv, int64_t d, int causal,
               uint64_t seed, int deterministic = 0) {
  Case c;
  c.s.deterministic = deterministic;
  c.s.batch = batch;
  c.s.q_len = q_len;
  c.s.kv_len = kv_len;
  c.s.q_heads = hq;
  c.s.kv_heads = hkv;
  c.s.head_dim = d;
  c.s.causal = causal;
  c.nq = static_cast<size_t>(batch * q_len * hq * d);
  c.nk = static_cast<size_t>(batch * kv_len * hkv * d);
  c.q = device_random(c.nq, seed * 8 + 1, 1.5f);
  c.kk = device_random(c.nk, seed * 8 + 2, 1.5f);
  c.v = device_random(c.nk, seed * 8 + 3, 1.0f);
  c.d_o = device_random(c.nq, seed * 8 + 4, 1.0f);
  CUDA_OK(cudaMalloc(&c.o, c.nq * 2 + 16));
  CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&c.lse), static_cast<size_t>(batch * hq * q_len) * 4 + 16));
  if (q_len > 0) {
    k::AttentionArgs f;
    f.q = k::attn_dense(c.q, q_len, hq, d);
    f.k = k::attn_dense(c.kk, kv_len, hkv, d);
    f.v = k::attn_dense(c.v, kv_len, hkv, d);
    f.o = static_cast<__nv_bfloat16*>(c.o);
    f.o_stride_h = d;
    f.o_stride_s = hq * d;
    f.o_stride_b = q_len * hq * d;
    f.lse = c.lse;
    f.batch = batch;
    f.q_len = q_len;
    f.kv_len = kv_len;
    f.q_heads = hq;
    f.kv_heads = hkv;
    f.head_dim = d;
    f.causal = causal != 0;
    CUDA_OK(k::launch_attention(f, nullptr));
  }
  k::AttentionBwdArgs a;
  a.q = k::attn_dense(c.q, q_len, hq, d);
  a.k = k::attn_dense(c.kk, kv_len, hkv, d);
  a.v = k::attn_dense(c.v, kv_len, hkv, d);
  a.o = k::attn_dense(c.o, q_len, hq, d);
  a.d_o = k::attn_dense(c.d_o, q_len, hq, d);
  a.lse = c.lse;
  const Grads g = c.alloc();
  a.dq.ptr = g.dq;
  a.dk.ptr = g.dk;
  a.dv.ptr = g.dv;
  a.batch = batch;
  a.q_len = q_len;
  a.kv_len = kv_len;
  a.q_heads = hq;
  a.kv_heads = hkv;
  a.head_dim = d;
  a.causal = causal != 0;
  a.dq_path = deterministic != 0 ? 1 : 0;  // the separate dQ pass, as the op's deterministic setting
  float* ws = nullptr;
  CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&ws),
                     static_cast<size_t>(batch * hq * q_len) * 4 + k::attention_bwd_dq_acc_bytes(a) + 256));
  a.delta = ws;
  a.dq_acc = ws + (batch * hq * q_len + 63) / 64 * 64;
  CUDA_OK(k::launch_attention_bwd(a, nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  c.want_dq = read(g.dq, c.nq);
  c.want_dk = read(g.dk, c.nk);
  c.want_dv = read(g.dv, c.nk);
  cudaFree(ws);
  return c;
}

void run(const Case& c, const std::string& name) {
  // The legacy stream: synchronous.
  const Grads g = c.alloc();
  c.poison(g, nullptr);
  c.call(g, nullptr);
  check(c.same(g), name + ": legacy stream, the launcher's gradients");
  // A stream of its own, back to back.
  cudaStream_t st;
  CUDA_OK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  c.poison(g, st);
  for (int i = 0; i < 3; ++i) c.call(g, st);
  CUDA_OK(cudaStreamSynchronize(st));
  check(c.same(g), name + ": own stream, back to back");
  // Two threads, two streams, at once.
  const Grads g2 = c.alloc();
  cudaStream_t st2;
  CUDA_OK(cudaStreamCreateWithFlags(&st2, cudaStreamNonBlocking));
  c.poison(g, st);
  c.poison(g2, st2);
  CUDA_OK(cudaDeviceSynchronize());
  bool threw = false;
  auto worker = [&](const Grads& out, cudaStream_t s) {
    try {
      for (int i = 0; i < 4; ++i) c.call(out, s);
      CUDA_OK(cudaStreamSynchronize(s));
    } catch (const fusedcomm::Error&) { threw = true; }
  };
  std::thread t1(worker, std::cref(g), st);
  std::thread t2(worker, std::cref(g2), st2);
  t1.join();
  t2.join();
  check(!threw, name + ": concurrent calls raised no error");
  check(c.same(g) && c.same(g2), name + ": two threads on two streams");
  // Captured in a graph, replayed twice.
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CUDA_OK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  c.call(g, st);
  CUDA_OK(cudaStreamEndCapture(st, &graph));
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  for (int r = 0; r < 2; ++r) {
    c.poison(g, st);
    CUDA_OK(cudaGraphLaunch(exec, st));
    CUDA_OK(cudaStreamSynchronize(st));
    check(c.same(g), name + ": graph replay " + std::to_string(r));
  }
  CUDA_OK(cudaGraphExecDestroy(exec));
  CUDA_OK(cudaGraphDestroy(graph));
  CUDA_OK(cudaStreamDestroy(st));
  CUDA_OK(cudaStreamDestroy(st2));
}

}  // namespace

int main() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::printf("SKIP gpu_attention_backward_test: no CUDA device visible\n");
    return 77;
  }
  cudaDeviceProp prop;
  CUDA_OK(cudaGetDeviceProperties(&prop, 0));
  if (prop.major != 9) {
    std::printf("SKIP gpu_attention_backward_test: needs a Hopper (sm_90) GPU, found sm_%d%d\n", prop.major,
                prop.minor);
    return 77;
  }
  for (int det = 0; det < 2; ++det) {
    const std::string tag = det != 0 ? ", deterministic" : "";
    run(make_case(2, 700, 700, 4, 2, 128, 1, 1, det), "B=2 S=700 Hq=4 Hkv=2 D=128 causal" + tag);
    run(make_case(1, 300, 500, 8, 1, 64, 0, 2, det), "B=1 Sq=300 Sk=500 Hq=8 Hkv=1 D=64" + tag);
  }
  // Both settings compute the same gradients: dk and dv bit for bit, dq within rounding.
  for (int d : {64, 128}) {
    const Case fast = make_case(2, 333, 333, 4, 1, d, 1, 4, 0);
    Case det = fast;
    det.s.deterministic = 1;
    const Grads g = det.alloc();
    det.call(g, nullptr);
    check(read(g.dk, det.nk) == fast.want_dk && read(g.dv, det.nk) == fast.want_dv &&
              close(read(g.dq, det.nq), fast.want_dq),
          "D=" + std::to_string(d) + ": deterministic and default gradients agree");
    const Grads g2 = det.alloc();
    det.call(g2, nullptr);
    check(read(g2.dq, det.nq) == read(g.dq, det.nq),
          "D=" + std::to_string(d) + ": deterministic dq bit for bit");
  }
  // No query rows: dk and dv are zeros.
  {
    Case c = make_case(1, 0, 200, 2, 2, 64, 0, 3);
    const Grads g = c.alloc();
    c.poison(g, nullptr);
    c.call(g, nullptr);
    const std::vector<uint16_t> zeros(c.nk, 0);
    check(read(g.dk, c.nk) == zeros && read(g.dv, c.nk) == zeros, "q_len 0: dk and dv are zeros");
  }
  return fusedcomm::testing::report("gpu_attention_backward_test");
}
