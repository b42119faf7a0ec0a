// attention_bwd_test: launch_attention_bwd against an fp32 CPU reference, every element checked.
//
//   1. shapes: head dims 64 and 128, causal and not, GQA ratios 1, 4, 8 and MQA, lengths that
//      are not multiples of the tiles (1, 77, 1000, 1500), q_len != kv_len, batch 1 and 3,
//      global position offsets (rows that see no key), q, k, v as views of one packed qkv
//      tensor, an explicit scale. o and lse come from launch_attention; the reference recomputes
//      everything in fp32 from the bf16 inputs. Gradients are poisoned (NaN) first; every
//      element must be within max|err| <= 1.2e-2 · max|ref| (and the RMS error within 6e-3).
//   2. accumulate mode: the keys split in two blocks (each at its global position), two kAdd
//      launches into zeroed fp32 accumulators (δ computed by the first, reused by the second),
//      converted to bf16: against the reference and the single launch.
//   3. back-to-back launches and a CUDA graph replayed twice: bit-identical to a direct launch
//      (dq of the paths that add it from the dK/dV pass: within rounding, their fp32 additions
//      come in any order).
// Every check runs every dQ path (attention_bwd.h dq_path: the separate pass, vector reductions,
// TMA reduce-adds).
//
// Exit codes: 0 pass, 1 failure, 77 skipped (no GPU or not Hopper), with the reason printed.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "kernels/attention/attention.h"
#include "kernels/attention/attention_bwd.h"
#include "kernels/common/tests/kernel_test_check.h"

using namespace fusedcomm::kernels;

using fusedcomm::kernels::testing::g_failures;

namespace {

uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

float bf2f(__nv_bfloat16 v) { return __bfloat162float(v); }

struct Case {
  int B, Sq, Sk, Hq, Hkv, D, causal;
  long long qp0 = 0, kp0 = 0;
  bool packed = false;  // q, k, v slices of one (B, S, Hq + 2 Hkv, D) tensor (needs Sq == Sk)
  float scale = 0.0f;
};

// Host copies (bf16 values as floats) and device buffers of one case.
struct Data {
  Case c;
  std::vector<__nv_bfloat16> hq, hk, hv, hdo;  // dense (B, S, H, D)
  __nv_bfloat16 *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr, *d_o = nullptr, *qkv = nullptr;
  __nv_bfloat16 *dq = nullptr, *dk = nullptr, *dv = nullptr;
  float *lse = nullptr, *delta = nullptr, *dq_acc = nullptr;
  AttnTensor tq, tk, tv;
  std::vector<float> rdq, rdk, rdv;  // reference, dense
  ~Data() {
    for (void* p : {(void*)q, (void*)k, (void*)v, (void*)o, (void*)d_o, (void*)qkv, (void*)dq, (void*)dk,
                    (void*)dv, (void*)lse, (void*)delta, (void*)dq_acc})
      if (p != nullptr) cudaFree(p);
  }
};

std::vector<__nv_bfloat16> random_bf16(size_t n, uint64_t seed, float amp) {
  std::vector<__nv_bfloat16> v(n);
  for (size_t i = 0; i < n; ++i) {
    const uint64_t r = mix64(seed ^ mix64(i));
    v[i] = __float2bfloat16((static_cast<float>(r >> 40) * (2.0f / 16777216.0f) - 1.0f) * amp);
  }
  return v;
}

template <typename T>
T* to_device(const std::vector<T>& h) {
  T* d = nullptr;
  CHECK_CUDA(cudaMalloc(&d, std::max<size_t>(h.size(), 1) * sizeof(T)));
  if (!h.empty()) CHECK_CUDA(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

// The fp32 reference of one (b, K/V head): every query head of its group, every visible pair.
void reference_group(const Data& d, int b, int hk, std::vector<float>& dq, std::vector<float>& dk,
                     std::vector<float>& dv) {
  const Case& c = d.c;
  const int D = c.D, group = c.Hq / c.Hkv;
  const float scale = c.scale != 0.0f ? c.scale : 1.0f / std::sqrt(static_cast<float>(D));
  auto at = [&](const std::vector<__nv_bfloat16>& t, int s, int S, int H, int h) {
    return &t[((static_cast<size_t>(b) * S + s) * H + h) * D];
  };
  std::vector<float> kf(static_cast<size_t>(c.Sk) * D), vf(kf.size());
  for (int j = 0; j < c.Sk; ++j)
    for (int x = 0; x < D; ++x) {
      kf[static_cast<size_t>(j) * D + x] = bf2f(at(d.hk, j, c.Sk, c.Hkv, hk)[x]);
      vf[static_cast<size_t>(j) * D + x] = bf2f(at(d.hv, j, c.Sk, c.Hkv, hk)[x]);
    }
  std::vector<float> p(c.Sk), dp(c.Sk), qi(D), gi(D), oi(D);
  for (int g = 0; g < group; ++g) {
    const int h = hk * group + g;
    for (int i = 0; i < c.Sq; ++i) {
      for (int x = 0; x < D; ++x) {
        qi[x] = bf2f(at(d.hq, i, c.Sq, c.Hq, h)[x]);
        gi[x] = bf2f(at(d.hdo, i, c.Sq, c.Hq, h)[x]);
      }
      int n = c.Sk;
      if (c.causal) {
        const long long last = c.qp0 + i - c.kp0;  // last visible key
        n = static_cast<int>(std::min<long long>(c.Sk, std::max<long long>(0, last + 1)));
      }
      if (n == 0) continue;
      float mx = -INFINITY;
      for (int j = 0; j < n; ++j) {
        float s = 0;
        for (int x = 0; x < D; ++x) s += qi[x] * kf[static_cast<size_t>(j) * D + x];
        p[j] = s * scale;
        mx = std::max(mx, p[j]);
      }
      double l = 0;
      for (int j = 0; j < n; ++j) l += std::exp(double(p[j]) - mx);
      std::fill(oi.begin(), oi.end(), 0.0f);
      for (int j = 0; j < n; ++j) {
        p[j] = static_cast<float>(std::exp(double(p[j]) - mx) / l);
        for (int x = 0; x < D; ++x) oi[x] += p[j] * vf[static_cast<size_t>(j) * D + x];
      }
      float delta = 0;
      for (int x = 0; x < D; ++x) delta += gi[x] * oi[x];
      float* dqi = &dq[((static_cast<size_t>(b) * c.Sq + i) * c.Hq + h) * D];
      for (int j = 0; j < n; ++j) {
        float s = 0;
        for (int x = 0; x < D; ++x) s += gi[x] * vf[static_cast<size_t>(j) * D + x];
        const float ds = p[j] * (s - delta);
        float* dkj = &dk[((static_cast<size_t>(b) * c.Sk + j) * c.Hkv + hk) * D];
        float* dvj = &dv[((static_cast<size_t>(b) * c.Sk + j) * c.Hkv + hk) * D];
        for (int x = 0; x < D; ++x) {
          dqi[x] += scale * ds * kf[static_cast<size_t>(j) * D + x];
          dkj[x] += scale * ds * qi[x];
          dvj[x] += p[j] * gi[x];
        }
      }
    }
  }
}

void reference(Data& d) {
  const Case& c = d.c;
  d.rdq.assign(static_cast<size_t>(c.B) * c.Sq * c.Hq * c.D, 0.0f);
  d.rdk.assign(static_cast<size_t>(c.B) * c.Sk * c.Hkv * c.D, 0.0f);
  d.rdv.assign(d.rdk.size(), 0.0f);
  std::vector<std::thread> th;
  for (int b = 0; b < c.B; ++b)
    for (int hk = 0; hk < c.Hkv; ++hk)
      th.emplace_back([&, b, hk] { reference_group(d, b, hk, d.rdq, d.rdk, d.rdv); });
  for (auto& t : th) t.join();
}

void setup(const Case& c, Data& d, uint64_t seed) {
  d.c = c;
  const size_t nq = static_cast<size_t>(c.B) * c.Sq * c.Hq * c.D;
  const size_t nk = static_cast<size_t>(c.B) * c.Sk * c.Hkv * c.D;
  d.hq = random_bf16(nq, seed * 8 + 1, 1.5f);
  d.hk = random_bf16(nk, seed * 8 + 2, 1.5f);
  d.hv = random_bf16(nk, seed * 8 + 3, 1.0f);
  d.hdo = random_bf16(nq, seed * 8 + 4, 1.0f);
  if (c.packed) {
    // (B, S, Hq + 2 Hkv, D): q heads, then k heads, then v heads.
    const int H = c.Hq + 2 * c.Hkv;
    std::vector<__nv_bfloat16> all(static_cast<size_t>(c.B) * c.Sq * H * c.D);
    for (int b = 0; b < c.B; ++b)
      for (int s = 0; s < c.Sq; ++s) {
        const size_t row = (static_cast<size_t>(b) * c.Sq + s) * H * c.D;
        std::memcpy(&all[row], &d.hq[(static_cast<size_t>(b) * c.Sq + s) * c.Hq * c.D], c.Hq * c.D * 2);
        std::memcpy(&all[row + c.Hq * c.D], &d.hk[(static_cast<size_t>(b) * c.Sk + s) * c.Hkv * c.D],
                    c.Hkv * c.D * 2);
        std::memcpy(&all[row + (c.Hq + c.Hkv) * c.D],
                    &d.hv[(static_cast<size_t>(b) * c.Sk + s) * c.Hkv * c.D], c.Hkv * c.D * 2);
      }
    d.qkv = to_device(all);
    auto view = [&](int64_t off) {
      AttnTensor t;
      t.ptr = d.qkv + off;
      t.stride_h = c.D;
      t.stride_s = static_cast<int64_t>(H) * c.D;
      t.stride_b = static_cast<int64_t>(c.Sq) * H * c.D;
      return t;
    };
    d.tq = view(0);
    d.tk = view(static_cast<int64_t>(c.Hq) * c.D);
    d.tv = view(static_cast<int64_t>(c.Hq + c.Hkv) * c.D);
  } else {
    d.q = to_device(d.hq);
    d.k = to_device(d.hk);
    d.v = to_device(d.hv);
    d.tq = attn_dense(d.q, c.Sq, c.Hq, c.D);
    d.tk = attn_dense(d.k, c.Sk, c.Hkv, c.D);
    d.tv = attn_dense(d.v, c.Sk, c.Hkv, c.D);
  }
  d.d_o = to_device(d.hdo);
  CHECK_CUDA(cudaMalloc(&d.o, nq * 2 + 16));
  CHECK_CUDA(cudaMalloc(&d.dq, nq * 2 + 16));
  CHECK_CUDA(cudaMalloc(&d.dk, nk * 2 + 16));
  CHECK_CUDA(cudaMalloc(&d.dv, nk * 2 + 16));
  const size_t nl = static_cast<size_t>(c.B) * c.Hq * c.Sq;
  CHECK_CUDA(cudaMalloc(&d.lse, nl * 4 + 16));
  CHECK_CUDA(cudaMalloc(&d.delta, nl * 4 + 16));
  CHECK_CUDA(cudaMalloc(&d.dq_acc, nq * 4 + 16));
  AttentionArgs a;
  a.q = d.tq;
  a.k = d.tk;
  a.v = d.tv;
  a.o = d.o;
  a.o_stride_h = c.D;
  a.o_stride_s = static_cast<int64_t>(c.Hq) * c.D;
  a.o_stride_b = static_cast<int64_t>(c.Sq) * c.Hq * c.D;
  a.lse = d.lse;
  a.batch = c.B;
  a.q_len = c.Sq;
  a.kv_len = c.Sk;
  a.q_heads = c.Hq;
  a.kv_heads = c.Hkv;
  a.head_dim = c.D;
  a.causal = c.causal != 0;
  a.scale = c.scale;
  a.q_pos0 = c.qp0;
  a.k_pos0 = c.kp0;
  CHECK_CUDA(launch_attention(a, nullptr));
  CHECK_CUDA(cudaDeviceSynchronize());
  reference(d);
}

AttentionBwdArgs bwd_args(const Data& d, int dq_path = 0) {
  const Case& c = d.c;
  AttentionBwdArgs a;
  a.dq_path = dq_path;
  a.dq_acc = d.dq_acc;
  a.q = d.tq;
  a.k = d.tk;
  a.v = d.tv;
  a.o = attn_dense(d.o, c.Sq, c.Hq, c.D);
  a.d_o = attn_dense(d.d_o, c.Sq, c.Hq, c.D);
  a.lse = d.lse;
  a.delta = d.delta;
  a.dq.ptr = d.dq;
  a.dk.ptr = d.dk;
  a.dv.ptr = d.dv;
  a.batch = c.B;
  a.q_len = c.Sq;
  a.kv_len = c.Sk;
  a.q_heads = c.Hq;
  a.kv_heads = c.Hkv;
  a.head_dim = c.D;
  a.causal = c.causal != 0;
  a.scale = c.scale;
  a.q_pos0 = c.qp0;
  a.k_pos0 = c.kp0;
  return a;
}

std::vector<__nv_bfloat16> read_bf16(const __nv_bfloat16* p, size_t n) {
  std::vector<__nv_bfloat16> h(n);
  CHECK_CUDA(cudaMemcpy(h.data(), p, n * 2, cudaMemcpyDeviceToHost));
  return h;
}

void poison(Data& d) {
  const Case& c = d.c;
  CHECK_CUDA(cudaMemset(d.dq, 0xFF, static_cast<size_t>(c.B) * c.Sq * c.Hq * c.D * 2));
  CHECK_CUDA(cudaMemset(d.dk, 0xFF, static_cast<size_t>(c.B) * c.Sk * c.Hkv * c.D * 2));
  CHECK_CUDA(cudaMemset(d.dv, 0xFF, static_cast<size_t>(c.B) * c.Sk * c.Hkv * c.D * 2));
}

struct Grads {
  std::vector<__nv_bfloat16> dq, dk, dv;
};

Grads read_grads(const Data& d) {
  const Case& c = d.c;
  return {read_bf16(d.dq, static_cast<size_t>(c.B) * c.Sq * c.Hq * c.D),
          read_bf16(d.dk, static_cast<size_t>(c.B) * c.Sk * c.Hkv * c.D),
          read_bf16(d.dv, static_cast<size_t>(c.B) * c.Sk * c.Hkv * c.D)};
}

// max|got - ref| <= 1.2e-2 · max|ref| (+ a floor for all-zero references), NaN fails.
void check_one(const char* name, const std::vector<__nv_bfloat16>& got, const std::vector<float>& ref,
               const char* what) {
  double max_ref = 0, max_err = 0, se = 0, sr = 0;
  long nan = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double g = bf2f(got[i]);
    if (std::isnan(g)) ++nan;
    const double e = std::fabs(g - ref[i]);
    max_ref = std::max(max_ref, std::fabs(double(ref[i])));
    if (!(e <= max_err)) max_err = std::isnan(e) ? INFINITY : std::max(max_err, e);
    se += e * e;
    sr += double(ref[i]) * ref[i];
  }
  const double rel = max_err / std::max(max_ref, 1e-6);
  const double rms = std::sqrt(se / std::max(sr, 1e-30));
  std::printf("    %s %s: max|ref|=%.3e max|err|/max|ref|=%.2e rms rel=%.2e\n", what, name, max_ref, rel,
              rms);
  EXPECT(nan == 0, "%s %s: %ld NaN", what, name, nan);
  EXPECT(max_err <= 1.2e-2 * max_ref + 1e-5, "%s %s: max error %.3e against max |ref| %.3e", what, name,
         max_err, max_ref);
  EXPECT(rms <= 6e-3 || sr == 0, "%s %s: rms relative error %.3e", what, name, rms);
}

void check_grads(const Data& d, const Grads& g, const char* what) {
  const Case& c = d.c;
  std::printf("  %-8s B=%d Sq=%d Sk=%d Hq=%d Hkv=%d D=%d causal=%d pos0=(%lld,%lld)%s%s\n", what, c.B, c.Sq,
              c.Sk, c.Hq, c.Hkv, c.D, c.causal, c.qp0, c.kp0, c.packed ? " packed" : "",
              c.scale != 0 ? " scale" : "");
  check_one("dq", g.dq, d.rdq, what);
  check_one("dk", g.dk, d.rdk, what);
  check_one("dv", g.dv, d.rdv, what);
}

const char* kPathName[4] = {"tuned", "dq pass", "dq red", "dq tma"};

// Every dQ path (attention_bwd.h dq_path).
void run_plain(const Case& c, uint64_t seed) {
  Data d;
  setup(c, d, seed);
  for (int path = 1; path <= 3; ++path) {
    poison(d);
    CHECK_CUDA(cudaMemset(d.dq_acc, 0xFF, static_cast<size_t>(c.B) * c.Sq * c.Hq * c.D * 4));
    CHECK_CUDA(launch_attention_bwd(bwd_args(d, path), nullptr));
    CHECK_CUDA(cudaDeviceSynchronize());
    check_grads(d, read_grads(d), kPathName[path]);
  }
}

// The keys in two blocks at their global positions, two kAdd launches into fp32 accumulators.
void run_accumulated(const Case& c, uint64_t seed, int path) {
  Data d;
  setup(c, d, seed);
  poison(d);
  CHECK_CUDA(launch_attention_bwd(bwd_args(d, path), nullptr));
  CHECK_CUDA(cudaDeviceSynchronize());
  const Grads one = read_grads(d);
  const size_t nq = static_cast<size_t>(c.B) * c.Sq * c.Hq * c.D;
  const size_t nk = static_cast<size_t>(c.B) * c.Sk * c.Hkv * c.D;
  float *aq, *ak, *av;
  CHECK_CUDA(cudaMalloc(&aq, nq * 4));
  CHECK_CUDA(cudaMalloc(&ak, nk * 4));
  CHECK_CUDA(cudaMalloc(&av, nk * 4));
  CHECK_CUDA(cudaMemset(aq, 0, nq * 4));
  CHECK_CUDA(cudaMemset(ak, 0, nk * 4));
  CHECK_CUDA(cudaMemset(av, 0, nk * 4));
  CHECK_CUDA(cudaMemset(d.delta, 0xFF, static_cast<size_t>(c.B) * c.Hq * c.Sq * 4));
  const int cut = c.Sk / 2 / 8 * 8;
  const int64_t kstride_s = static_cast<int64_t>(c.Hkv) * c.D;
  for (int blk = 0; blk < 2; ++blk) {
    AttentionBwdArgs a = bwd_args(d, path);
    const int lo = blk == 0 ? 0 : cut, hi = blk == 0 ? cut : c.Sk;
    a.kv_len = hi - lo;
    a.k.ptr += lo * a.k.stride_s;
    a.v.ptr += lo * a.v.stride_s;
    a.k_pos0 = c.kp0 + lo;
    a.mode = AttnGradMode::kAdd;
    a.delta_ready = blk > 0;
    a.dq.ptr = aq;
    a.dk.ptr = ak + lo * kstride_s;
    a.dk.stride_b = static_cast<int64_t>(c.Sk) * kstride_s;
    a.dv.ptr = av + lo * kstride_s;
    a.dv.stride_b = a.dk.stride_b;
    CHECK_CUDA(launch_attention_bwd(a, nullptr));
  }
  poison(d);
  CHECK_CUDA(launch_attention_grad_convert(aq, 0, 0, 0, d.dq, 0, 0, 0, c.B, c.Sq, c.Hq, c.D, nullptr));
  CHECK_CUDA(launch_attention_grad_convert(ak, 0, 0, 0, d.dk, 0, 0, 0, c.B, c.Sk, c.Hkv, c.D, nullptr));
  CHECK_CUDA(launch_attention_grad_convert(av, 0, 0, 0, d.dv, 0, 0, 0, c.B, c.Sk, c.Hkv, c.D, nullptr));
  CHECK_CUDA(cudaDeviceSynchronize());
  const Grads two = read_grads(d);
  const std::string what = std::string("2 blocks, ") + kPathName[path];
  check_grads(d, two, what.c_str());
  // Against the single launch: within a few bf16 ulps (the two sums round differently).
  auto close = [](const std::vector<__nv_bfloat16>& x, const std::vector<__nv_bfloat16>& y) {
    double mx = 0, me = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      mx = std::max(mx, std::fabs(double(bf2f(y[i]))));
      me = std::max(me, std::fabs(double(bf2f(x[i])) - bf2f(y[i])));
    }
    return me <= 1e-2 * mx + 1e-6;
  };
  EXPECT(close(two.dq, one.dq) && close(two.dk, one.dk) && close(two.dv, one.dv),
         "two accumulated blocks differ from the single launch");
  cudaFree(aq);
  cudaFree(ak);
  cudaFree(av);
}

// Back-to-back launches and graph replays give the direct launch's bits (dq with the atomic path:
// the direct launch's values within rounding, the order of its fp32 additions varies).
bool same(const Grads& a, const Grads& b, bool dq_exact) {
  auto eq = [](const std::vector<__nv_bfloat16>& x, const std::vector<__nv_bfloat16>& y) {
    return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * 2) == 0;
  };
  auto close = [](const std::vector<__nv_bfloat16>& x, const std::vector<__nv_bfloat16>& y) {
    double mx = 0, me = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      mx = std::max(mx, std::fabs(double(bf2f(y[i]))));
      me = std::max(me, std::fabs(double(bf2f(x[i])) - bf2f(y[i])));
    }
    return x.size() == y.size() && me <= 1e-2 * mx + 1e-6;
  };
  return eq(a.dk, b.dk) && eq(a.dv, b.dv) && (dq_exact ? eq(a.dq, b.dq) : close(a.dq, b.dq));
}

void run_repeat(const Case& c, uint64_t seed, int path) {
  Data d;
  setup(c, d, seed);
  poison(d);
  const bool exact = path == 1;
  CHECK_CUDA(launch_attention_bwd(bwd_args(d, path), nullptr));
  CHECK_CUDA(cudaDeviceSynchronize());
  const Grads g0 = read_grads(d);
  const std::string what = std::string("repeat, ") + kPathName[path];
  check_grads(d, g0, what.c_str());
  for (int i = 0; i < 3; ++i) CHECK_CUDA(launch_attention_bwd(bwd_args(d, path), nullptr));
  CHECK_CUDA(cudaDeviceSynchronize());
  EXPECT(same(read_grads(d), g0, exact), "back-to-back launches changed the gradients");
  cudaStream_t s;
  CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CHECK_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  CHECK_CUDA(launch_attention_bwd(bwd_args(d, path), s));
  CHECK_CUDA(cudaStreamEndCapture(s, &g));
  CHECK_CUDA(cudaGraphInstantiate(&ge, g, 0));
  for (int r = 0; r < 2; ++r) {
    poison(d);
    CHECK_CUDA(cudaGraphLaunch(ge, s));
    CHECK_CUDA(cudaStreamSynchronize(s));
    EXPECT(same(read_grads(d), g0, exact), "graph replay %d differs from the direct launch", r);
  }
  CHECK_CUDA(cudaGraphExecDestroy(ge));
  CHECK_CUDA(cudaGraphDestroy(g));
  CHECK_CUDA(cudaStreamDestroy(s));
}

}  // namespace

int main() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::printf("SKIP attention_bwd_test: no CUDA device visible\n");
    return 77;
  }
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  if (prop.major != 9) {
    std::printf("SKIP attention_bwd_test: needs a Hopper (sm_90) GPU, found sm_%d%d\n", prop.major,
                prop.minor);
    return 77;
  }
  uint64_t seed = 1;
  if (const char* s = std::getenv("ATTN_TEST_SEED")) seed = std::strtoull(s, nullptr, 10);
  // Argument checks.
  {
    AttentionBwdArgs a;
    a.batch = 1;
    a.q_len = a.kv_len = 8;
    a.q_heads = 3;
    a.kv_heads = 2;
    a.head_dim = 64;
    EXPECT(attention_bwd_check(a) != nullptr, "Hq not a multiple of Hkv accepted");
    EXPECT(launch_attention_bwd(a, nullptr) == cudaErrorInvalidValue, "bad launch not refused");
  }
  std::printf("shapes\n");
  const Case cases[] = {
      {1, 1000, 1000, 4, 4, 128, 0},
      {1, 1000, 1000, 4, 4, 128, 1},
      {3, 77, 77, 4, 1, 64, 1},                 // MQA, batch 3
      {1, 1500, 1500, 8, 2, 64, 0},             // GQA 4
      {1, 1500, 1500, 4, 1, 128, 1},            // MQA
      {1, 500, 500, 16, 2, 64, 1},              // GQA 8
      {1, 1, 1, 2, 2, 128, 1},                  // one row
      {2, 300, 1000, 8, 1, 128, 1, 700, 0},     // Lq < Lk, bottom-right aligned by position
      {1, 1000, 77, 8, 8, 64, 0},               // Lq > Lk
      {1, 200, 300, 4, 2, 64, 1, 0, 100},       // rows 0..99 see no key
      {1, 640, 640, 4, 2, 128, 1, 0, 0, true},  // packed qkv views
      {1, 333, 333, 2, 2, 64, 0, 0, 0, false, 0.3f},
  };
  for (const Case& c : cases) run_plain(c, seed);
  std::printf("accumulate\n");
  for (int path = 1; path <= 3; ++path) {
    run_accumulated({1, 1000, 1000, 8, 2, 128, 1}, seed, path);
    run_accumulated({3, 300, 500, 4, 4, 64, 0}, seed, path);
    run_accumulated({1, 400, 700, 4, 1, 64, 1, 300, 0}, seed, path);
  }
  std::printf("repeat\n");
  for (int path = 1; path <= 3; ++path) run_repeat({2, 700, 700, 4, 2, 128, 1}, seed, path);
  if (g_failures != 0) {
    std::printf("attention_bwd_test: %d FAILED\n", g_failures);
    return 1;
  }
  std::printf("attention_bwd_test: all passed\n");
  return 0;
}
