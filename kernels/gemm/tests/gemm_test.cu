// gemm_test: launch_gemm against an fp32 reference on the GPU, every element checked.
//
//   1. sweep: >= 200 random shapes (M in [1, 16384], N, K multiples of 8 with tails), both B
//      layouts, bf16 and fp32 C, padded leading dimensions, random tile width / grid size /
//      raster group / M rotation. Outputs are poisoned (NaN) first; every element of C must be
//      within tolerance, padding columns and guard rows below C must still hold the poison.
//      About 80 % of the shapes get a stream-K workspace, with stream-K chosen, off or forced
//      (wherever the last wave is partial); the workspace's counters must be zero after every
//      launch, and a forced stream-K launch must repeat bit for bit.
//   2. hooks: readiness flags published late by a kernel on another stream (twice, with a new
//      epoch: back-to-back launches); a flag never set (timeout reported, no hang); the abort
//      word; a tile sink that atomically adds into / stores to other buffers and sets tile flags.
//
// Exit codes: 0 pass, 1 failure, 77 skipped (no GPU or not Hopper), with the reason printed.
// GEMM_TEST_SEED=<n> reproduces a run; GEMM_TEST_SHAPES=<n> changes the sweep size.
#include "kernels/common/selftest.h"
#include "kernels/common/tests/kernel_test_check.h"
#include "kernels/gemm/gemm.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

using namespace fusedcomm::kernels;

using fusedcomm::kernels::testing::g_failures;

namespace {

// ---- device helpers -----------------------------------------------------------------------
__device__ __forceinline__ uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Uniform in [-1, 1) as bf16, over rows × ld (padding included).
__global__ void fill_random(__nv_bfloat16* p, size_t n, uint64_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const uint64_t r = mix64(seed ^ mix64(i));
    p[i] = __float2bfloat16(static_cast<float>(r >> 40) * (2.0f / 16777216.0f) - 1.0f);
  }
}

__global__ void to_f32(const __nv_bfloat16* in, float* out, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    out[i] = __bfloat162float(in[i]);
  }
}

__global__ void fill_f32(float* p, size_t n, uint64_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    p[i] = static_cast<float>(mix64(seed ^ mix64(i)) >> 40) * (8.0f / 16777216.0f) - 4.0f;
  }
}

// The obviously-correct reference: one thread per output, fp32 sum over k in order, plus the
// sum of |a*b| that scales the tolerance.
__global__ void reference_gemm(const __nv_bfloat16* A, int64_t lda, const __nv_bfloat16* B, int64_t ldb,
                               bool kn, int M, int N, int K, float* ref, float* absdot) {
  const int n = blockIdx.x * blockDim.x + threadIdx.x;
  const int m = blockIdx.y;
  if (n >= N || m >= M) return;
  float s = 0.f, sa = 0.f;
  for (int k = 0; k < K; ++k) {
    const float a = __bfloat162float(A[m * lda + k]);
    const float b = __bfloat162float(kn ? B[int64_t(k) * ldb + n] : B[int64_t(n) * ldb + k]);
    s = fmaf(a, b, s);
    sa += fabsf(a * b);
  }
  ref[int64_t(m) * N + n] = s;
  absdot[int64_t(m) * N + n] = sa;
}

struct CompareResult {
  unsigned long long bad;
  unsigned long long first_bad;  // linear index (row * ld + col) of the smallest bad element
  float got, want;
};

// Checks rows [0, rows_total) × [0, ld) of out: inside M×N against ref (+ base when given),
// outside (padding columns, guard rows) for the untouched poison pattern.
__global__ void compare(const void* out, bool out_f32, int64_t ld, int M, int N, int rows_total,
                        const float* ref, const float* absdot, const float* base, float rtol, float atol_rel,
                        CompareResult* res) {
  const int64_t total = int64_t(rows_total) * ld;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int r = static_cast<int>(i / ld);
    const int c = static_cast<int>(i % ld);
    bool ok;
    float got = 0.f, want = 0.f;
    if (r < M && c < N) {
      got = out_f32 ? static_cast<const float*>(out)[i]
                    : __bfloat162float(static_cast<const __nv_bfloat16*>(out)[i]);
      const int64_t j = int64_t(r) * N + c;
      want = ref[j] + (base ? base[i] : 0.f);
      const float tol = rtol * fabsf(want) + atol_rel * absdot[j] + 1e-6f;
      ok = fabsf(got - want) <= tol;  // NaN fails
    } else if (base == nullptr) {
      ok = out_f32 ? static_cast<const uint32_t*>(out)[i] == 0xFFFFFFFFu
                   : static_cast<const uint16_t*>(out)[i] == 0xFFFFu;
    } else {
      ok = true;  // sink buffers are pre-filled, not poisoned, outside M×N
    }
    if (!ok) {
      atomicAdd(&res->bad, 1ull);
      if (atomicMin(&res->first_bad, static_cast<unsigned long long>(i)) >
          static_cast<unsigned long long>(i)) {
        res->got = got;  // best effort (racy) detail for the report
        res->want = want;
      }
    }
  }
}

// Publishes chunks of `dst` (copied from `src`) in reverse order, `delay_ns` apart, each
// followed by a release store of its flag: the writer side of hook 1.
__global__ void publish_chunks(__nv_bfloat16* dst, const __nv_bfloat16* src, int64_t ld, int rows,
                               int chunk_rows, uint64_t* flags, uint64_t epoch, uint64_t delay_ns) {
  const int chunks = (rows + chunk_rows - 1) / chunk_rows;
  for (int c = chunks - 1; c >= 0; --c) {
    if (threadIdx.x == 0) {
      uint64_t t0, t;
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
      do {
        __nanosleep(1000);
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
      } while (t - t0 < delay_ns);
    }
    __syncthreads();
    const int r0 = c * chunk_rows, r1 = min(rows, r0 + chunk_rows);
    for (int64_t i = int64_t(r0) * ld + threadIdx.x; i < int64_t(r1) * ld; i += blockDim.x) {
      dst[i] = src[i];
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(flags + c), "l"(epoch) : "memory");
    }
  }
}

__global__ void set_u64(uint64_t* p, int n, uint64_t v) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) p[i] = v;
}

// ---- host helpers -------------------------------------------------------------------------
struct Shape {
  int M, N, K;
  GemmLayoutB layout;
  GemmOutType out;
  int pad_a, pad_b, pad_c;
  int tile_n, num_ctas, group_m, m_block_start;
  int cluster;          // GemmArgs::cluster: 0 chosen, 1 single CTAs, 2 CTA pairs
  int stream_k = -1;    // -1: no workspace; else GemmArgs::stream_k with the shared workspace
  int pingpong = 0;     // GemmArgs::pingpong: 0 chosen, 1 off, 2 wherever allowed
  bool staged = false;  // through launch_gemm_staged (lda, ldb may be off the multiple of 8)
};

// The stream-K workspace every launch of the sweep shares (stream-ordered, as gemm.h asks).
void* g_workspace = nullptr;
size_t g_workspace_bytes = 0;

int g_sms = 0;

// gemm.h: the counters at the start of the workspace are zero after every launch. A launch
// that leaves one set is reported (and the counters cleared, so that later shapes are judged
// on their own).
bool workspace_counters_zero() {
  std::vector<uint32_t> c(2 * g_sms);
  CHECK_CUDA(cudaMemcpy(c.data(), g_workspace, c.size() * 4, cudaMemcpyDeviceToHost));
  int set = 0;
  for (size_t i = 0; i < c.size(); ++i) {
    if (c[i] != 0 && set++ < 4) std::printf("  counter %zu left at %u\n", i, c[i]);
  }
  if (set != 0) CHECK_CUDA(cudaMemset(g_workspace, 0, c.size() * 4));
  return set == 0;
}

std::string describe(const Shape& s) {
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "M=%d N=%d K=%d %s C=%s pads=%d/%d/%d tile_n=%d ctas=%d group=%d mstart=%d "
                "cluster=%d stream_k=%d pingpong=%d%s",
                s.M, s.N, s.K, s.layout == GemmLayoutB::kNK ? "NK" : "KN",
                s.out == GemmOutType::kBF16 ? "bf16" : "f32", s.pad_a, s.pad_b, s.pad_c, s.tile_n, s.num_ctas,
                s.group_m, s.m_block_start, s.cluster, s.stream_k, s.pingpong, s.staged ? " staged" : "");
  return buf;
}

struct Operands {
  __nv_bfloat16 *A = nullptr, *B = nullptr;
  int64_t lda = 0, ldb = 0;
  size_t a_elems = 0, b_elems = 0;
};

int64_t lda_of(const Shape& s) { return s.K + s.pad_a; }
int64_t ldb_of(const Shape& s) { return (s.layout == GemmLayoutB::kNK ? s.K : s.N) + s.pad_b; }
int64_t ldc_of(const Shape& s) { return s.N + s.pad_c; }

Operands make_operands(const Shape& s, uint64_t seed) {
  Operands o;
  o.lda = lda_of(s);
  o.ldb = ldb_of(s);
  o.a_elems = size_t(s.M) * o.lda;
  o.b_elems = size_t(s.layout == GemmLayoutB::kNK ? s.N : s.K) * o.ldb;
  CHECK_CUDA(cudaMalloc(&o.A, o.a_elems * 2));
  CHECK_CUDA(cudaMalloc(&o.B, o.b_elems * 2));
  fill_random<<<1024, 256>>>(o.A, o.a_elems, seed * 2 + 1);
  fill_random<<<1024, 256>>>(o.B, o.b_elems, seed * 2 + 2);
  CHECK_CUDA(cudaGetLastError());
  return o;
}

void free_operands(Operands& o) {
  cudaFree(o.A);
  cudaFree(o.B);
}

struct Reference {
  float *ref = nullptr, *absdot = nullptr;
};

Reference make_reference(const Shape& s, const Operands& o) {
  Reference r;
  CHECK_CUDA(cudaMalloc(&r.ref, size_t(s.M) * s.N * 4));
  CHECK_CUDA(cudaMalloc(&r.absdot, size_t(s.M) * s.N * 4));
  dim3 grid((s.N + 127) / 128, s.M);
  reference_gemm<<<grid, 128>>>(o.A, o.lda, o.B, o.ldb, s.layout == GemmLayoutB::kKN, s.M, s.N, s.K, r.ref,
                                r.absdot);
  CHECK_CUDA(cudaGetLastError());
  return r;
}

void free_reference(Reference& r) {
  cudaFree(r.ref);
  cudaFree(r.absdot);
}

// atol_rel: the absolute tolerance per element as a fraction of its sum of |a*b|.
CompareResult check_output(const void* out, bool f32, int64_t ld, int M, int N, int rows_total,
                           const Reference& r, const float* base, float atol_rel = 2e-5f) {
  CompareResult* d;
  CHECK_CUDA(cudaMalloc(&d, sizeof(CompareResult)));
  CompareResult init{0, ~0ull, 0.f, 0.f};
  CHECK_CUDA(cudaMemcpy(d, &init, sizeof init, cudaMemcpyHostToDevice));
  const float rtol = f32 ? 1e-5f : 8e-3f;
  compare<<<1024, 256>>>(out, f32, ld, M, N, rows_total, r.ref, r.absdot, base, rtol, atol_rel, d);
  CHECK_CUDA(cudaGetLastError());
  CompareResult h;
  CHECK_CUDA(cudaMemcpy(&h, d, sizeof h, cudaMemcpyDeviceToHost));
  cudaFree(d);
  return h;
}

constexpr int kGuardRows = 16;

// The launch arguments of shape s on operands A, B and output C (the shared workspace where s
// asks for stream-K).
GemmArgs shape_args(const Shape& s, const __nv_bfloat16* A, const __nv_bfloat16* B, void* C) {
  GemmArgs a;
  a.A = A;
  a.lda = lda_of(s);
  a.B = B;
  a.ldb = ldb_of(s);
  a.C = C;
  a.ldc = ldc_of(s);
  a.M = s.M;
  a.N = s.N;
  a.K = s.K;
  a.b_layout = s.layout;
  a.c_type = s.out;
  a.tile_n = s.tile_n;
  a.num_ctas = s.num_ctas;
  a.group_m = s.group_m;
  a.m_block_start = s.m_block_start;
  a.cluster = s.cluster;
  a.pingpong = s.pingpong;
  if (s.stream_k >= 0) {
    a.workspace = g_workspace;
    a.workspace_bytes = g_workspace_bytes;
    a.stream_k = s.stream_k;
  }
  return a;
}

// The launch arguments of shape s on stand-in pointers, for plans only (gemm_launch_plan: the
// plan depends on the arguments, not on the data).
GemmArgs plan_args(const Shape& s) {
  auto* fake = reinterpret_cast<__nv_bfloat16*>(uintptr_t{1} << 20);
  return shape_args(s, fake, fake, fake);
}

// What launch_gemm would run for shape s (ctas 0: refused).
GemmLaunchPlan plan_of(const Shape& s) {
  GemmLaunchPlan plan{};
  if (gemm_launch_plan(plan_args(s), &plan) != cudaSuccess) plan.ctas = 0;
  return plan;
}

// Launches s into C (poisoned first) and checks every element; `out` (optional) keeps a copy
// of C's bytes.
bool run_shape(const Shape& s, uint64_t seed, std::vector<uint8_t>* out = nullptr) {
  Operands o = make_operands(s, seed);
  Reference r = make_reference(s, o);
  const int64_t ldc = ldc_of(s);
  const size_t esz = s.out == GemmOutType::kF32 ? 4 : 2;
  void* C;
  const size_t c_bytes = size_t(s.M + kGuardRows) * ldc * esz;
  CHECK_CUDA(cudaMalloc(&C, c_bytes));
  CHECK_CUDA(cudaMemset(C, 0xFF, c_bytes));  // NaN in bf16 and fp32

  void* staging = nullptr;
  cudaError_t e;
  if (s.staged) {
    const GemmArgs a = shape_args(s, o.A, o.B, C);
    const size_t bytes = gemm_staging_bytes(a);
    if (bytes > 0) CHECK_CUDA(cudaMalloc(&staging, bytes));
    e = launch_gemm_staged(a, staging, bytes, nullptr);
  } else {
    e = launch_gemm(shape_args(s, o.A, o.B, C), nullptr);
  }
  bool ok = e == cudaSuccess;
  if (!ok) std::printf("  launch error %s\n", cudaGetErrorString(e));
  e = cudaDeviceSynchronize();
  if (e != cudaSuccess) {
    std::printf("  FATAL: %s after %s\n", cudaGetErrorString(e), describe(s).c_str());
    std::exit(1);
  }
  if (ok) {
    CompareResult c =
        check_output(C, s.out == GemmOutType::kF32, ldc, s.M, s.N, s.M + kGuardRows, r, nullptr);
    if (c.bad != 0) {
      ok = false;
      std::printf("  %llu bad elements; first at row %lld col %lld: got %g want %g\n", c.bad,
                  (long long)(c.first_bad / ldc), (long long)(c.first_bad % ldc), c.got, c.want);
    }
  }
  if (s.stream_k >= 0 && !workspace_counters_zero()) ok = false;
  cudaFree(staging);
  if (out != nullptr) {
    out->resize(c_bytes);
    CHECK_CUDA(cudaMemcpy(out->data(), C, c_bytes, cudaMemcpyDeviceToHost));
  }
  cudaFree(C);
  free_reference(r);
  free_operands(o);
  return ok;
}

int round8(int x) { return std::max(8, (x + 7) / 8 * 8); }

std::vector<Shape> make_sweep(std::mt19937_64& rng, int count, int sms) {
  std::vector<Shape> v;
  auto base = [&](int M, int N, int K, GemmLayoutB l) {
    Shape s{M, N, K, l, GemmOutType::kBF16, 0, 0, 0, 0, 0, 0, 0};
    return s;
  };
  // Fixed corners first.
  for (auto l : {GemmLayoutB::kNK, GemmLayoutB::kKN}) {
    v.push_back(base(1, 8, 8, l));
    v.push_back(base(1, 8192, 8192, l));
    v.push_back(base(7, 520, 72, l));
    v.push_back(base(128, 256, 64, l));
    v.push_back(base(129, 264, 72, l));
    v.push_back(base(16384, 256, 64, l));
    v.push_back(base(2048, 2048, 2048, l));
    v.push_back(base(16384, 1032, 4104, l));
    // N and K off the multiple of 8: strides padded to it, C at odd strides, or staged.
    v.push_back(base(1000, 4104, 2056, l));
    Shape t = base(1, 1, 1, l);
    t.pad_a = t.pad_b = 7;
    v.push_back(t);
    t = base(129, 263, 75, l);
    t.pad_a = 5;
    t.pad_b = l == GemmLayoutB::kNK ? 5 : 1;
    t.pad_c = 2;
    v.push_back(t);
    t = base(300, 1001, 3001, l);
    t.staged = true;
    v.push_back(t);
    t = base(5, 3, 7, l);
    t.staged = true;
    t.pad_c = 3;
    v.push_back(t);
  }
  auto logu = [&](double lo, double hi) {
    std::uniform_real_distribution<double> d(std::log(lo), std::log(hi));
    return std::exp(d(rng));
  };
  std::uniform_int_distribution<int> coin(0, 99);
  while (static_cast<int>(v.size()) < count) {
    Shape s{};
    const int band = coin(rng) % 4;
    const double mlo[4] = {1, 65, 513, 4097}, mhi[4] = {64, 512, 4096, 16384};
    s.M = static_cast<int>(logu(mlo[band], mhi[band] + 1));
    // A third of the shapes with N and K anywhere, not only on multiples of 8.
    const bool off8 = coin(rng) < 33;
    s.N = off8 ? static_cast<int>(logu(1, 6000)) : round8(static_cast<int>(logu(8, 6000)));
    s.K = off8 ? static_cast<int>(logu(1, 9000)) : round8(static_cast<int>(logu(8, 9000)));
    while (double(s.M) * s.N * s.K > 3e10) s.K = off8 ? std::max(1, s.K / 2) : round8(s.K / 2);
    s.layout = coin(rng) < 50 ? GemmLayoutB::kNK : GemmLayoutB::kKN;
    s.out = coin(rng) < 80 ? GemmOutType::kBF16 : GemmOutType::kF32;
    s.pad_a = coin(rng) < 30 ? 8 * (1 + coin(rng) % 8) : 0;
    s.pad_b = coin(rng) < 30 ? 8 * (1 + coin(rng) % 8) : 0;
    s.pad_c = coin(rng) < 30 ? 8 * (1 + coin(rng) % 8) : 0;
    const int t = coin(rng);
    s.tile_n = t < 60 ? 0 : (t < 73 ? 128 : (t < 86 ? 192 : 256));
    const int g = coin(rng);
    s.num_ctas = g < 70 ? 0 : (g < 80 ? 1 : (g < 90 ? 1 + coin(rng) % sms : sms - 8));
    const int groups[5] = {0, 1, 3, 8, 16};
    s.group_m = groups[coin(rng) % 5];
    s.m_block_start = coin(rng) < 30 ? coin(rng) * 7 : 0;
    // Forced CTA pairs also where the choice would not take them (one M-block, odd counts,
    // odd CTA counts); a single CTA cannot pair.
    const int c = coin(rng);
    s.cluster = c < 50 ? 0 : (c < 70 || s.num_ctas == 1 || s.tile_n == 192 ? 1 : 2);
    const int k = coin(rng);
    s.stream_k = k < 20 ? -1 : (k < 45 ? 0 : (k < 55 ? 1 : 2));
    const int p = coin(rng);
    s.pingpong = p < 40 ? 0 : (p < 55 ? 1 : 2);
    if (off8) {
      // Row strides of A and B up to a multiple of 8 (launch_gemm), or dense and staged; C at
      // any stride.
      const int b_row = s.layout == GemmLayoutB::kNK ? s.K : s.N;
      s.staged = coin(rng) < 50;
      s.pad_a = s.staged ? 0 : round8(s.K) - s.K + s.pad_a;
      s.pad_b = s.staged ? 0 : round8(b_row) - b_row + s.pad_b;
      s.pad_c = coin(rng) < 50 ? coin(rng) % 9 : 0;
      if (s.staged && s.cluster == 2) s.cluster = 1;
    }
    v.push_back(s);
  }
  return v;
}

// ---- hook tests ---------------------------------------------------------------------------
struct HookFixture {
  Shape s;
  Operands final_ops;  // the data the publisher delivers
  Operands gemm_ops;   // what the GEMM reads: poisoned until published
  Reference ref;
};

HookFixture make_hook_fixture(int M, int N, int K, uint64_t seed) {
  HookFixture f;
  f.s = Shape{M, N, K, GemmLayoutB::kNK, GemmOutType::kBF16, 0, 0, 0, 0, 0, 0, 0};
  f.final_ops = make_operands(f.s, seed);
  f.gemm_ops = make_operands(f.s, seed + 99);
  f.ref = make_reference(f.s, f.final_ops);
  return f;
}

void free_hook_fixture(HookFixture& f) {
  free_operands(f.final_ops);
  free_operands(f.gemm_ops);
  free_reference(f.ref);
}

// Hook 1: flags published late by another stream; two rounds (epochs 7 and 8) on the same
// flags. Also hook 3 (fewer CTAs) and hook 4 (M rotation).
void test_late_flags(int sms, uint64_t seed) {
  std::printf("[hooks] late readiness flags (A and B), 2 epochs\n");
  const int M = 2088, N = 1536, K = 1032, a_chunk = 384, b_chunk = 512;
  HookFixture f = make_hook_fixture(M, N, K, seed);
  const int a_chunks = (M + a_chunk - 1) / a_chunk, b_chunks = (N + b_chunk - 1) / b_chunk;
  uint64_t *a_flags, *b_flags;
  GemmErrorRecord* err;
  CHECK_CUDA(cudaMalloc(&a_flags, a_chunks * 8));
  CHECK_CUDA(cudaMalloc(&b_flags, b_chunks * 8));
  CHECK_CUDA(cudaMallocHost(&err, sizeof(GemmErrorRecord)));
  set_u64<<<1, 64>>>(a_flags, a_chunks, 6);
  set_u64<<<1, 64>>>(b_flags, b_chunks, 6);
  __nv_bfloat16* C;
  CHECK_CUDA(cudaMalloc(&C, size_t(M + kGuardRows) * N * 2));
  cudaStream_t s1, s2, s3;
  CHECK_CUDA(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
  CHECK_CUDA(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
  CHECK_CUDA(cudaStreamCreateWithFlags(&s3, cudaStreamNonBlocking));
  // CUDA loads modules lazily: a kernel's first launch can wait for the running GEMM, which
  // waits for that kernel. Load the publisher before the GEMM starts (one empty launch).
  publish_chunks<<<1, 32, 0, s2>>>(nullptr, nullptr, 0, 0, 1, nullptr, 0, 0);
  CHECK_CUDA(cudaDeviceSynchronize());
  for (uint64_t epoch : {7ull, 8ull}) {
    // Stale data: poison the GEMM's operands, then publish chunk by chunk.
    CHECK_CUDA(cudaMemset(f.gemm_ops.A, 0xFF, f.gemm_ops.a_elems * 2));
    CHECK_CUDA(cudaMemset(f.gemm_ops.B, 0xFF, f.gemm_ops.b_elems * 2));
    CHECK_CUDA(cudaMemset(C, 0xFF, size_t(M + kGuardRows) * N * 2));
    std::memset(err, 0, sizeof *err);
    CHECK_CUDA(cudaDeviceSynchronize());
    GemmArgs a = shape_args(f.s, f.gemm_ops.A, f.gemm_ops.B, C);
    a.num_ctas = sms - 6;
    a.m_block_start = 5;
    a.wait.a = {a_flags, static_cast<uint32_t>(a_chunk), static_cast<uint32_t>(a_chunks)};
    a.wait.b = {b_flags, static_cast<uint32_t>(b_chunk), static_cast<uint32_t>(b_chunks)};
    a.wait.epoch = epoch;
    a.wait.timeout_ns = 5'000'000'000ull;
    a.wait.error = err;
    CHECK_CUDA(launch_gemm(a, s1));
    publish_chunks<<<1, 256, 0, s2>>>(f.gemm_ops.A, f.final_ops.A, K, M, a_chunk, a_flags, epoch, 300'000);
    publish_chunks<<<1, 256, 0, s3>>>(f.gemm_ops.B, f.final_ops.B, K, N, b_chunk, b_flags, epoch, 500'000);
    CHECK_CUDA(cudaGetLastError());
    CHECK_CUDA(cudaDeviceSynchronize());
    EXPECT(err->code == kGemmOk, "epoch %llu: error code %u (chunk %u)", (unsigned long long)epoch, err->code,
           err->chunk);
    CompareResult c = check_output(C, false, N, M, N, M + kGuardRows, f.ref, nullptr);
    EXPECT(c.bad == 0, "epoch %llu: %llu bad elements, first row %llu col %llu got %g want %g",
           (unsigned long long)epoch, c.bad, c.first_bad / N, c.first_bad % N, c.got, c.want);
  }
  cudaStreamDestroy(s1);
  cudaStreamDestroy(s2);
  cudaStreamDestroy(s3);
  cudaFree(C);
  cudaFree(a_flags);
  cudaFree(b_flags);
  cudaFreeHost(err);
  free_hook_fixture(f);
}

// Hook 1, failure paths: a flag that is never set (timeout) and the abort word.
void test_timeout_and_abort(uint64_t seed) {
  const int M = 1000, N = 512, K = 256, chunk = 256, chunks = 4;
  HookFixture f = make_hook_fixture(M, N, K, seed);
  uint64_t* flags;
  CHECK_CUDA(cudaMalloc(&flags, chunks * 8));
  GemmErrorRecord* err;
  uint32_t* abort_word;
  CHECK_CUDA(cudaHostAlloc(&err, sizeof(GemmErrorRecord), cudaHostAllocMapped));
  CHECK_CUDA(cudaHostAlloc(&abort_word, 4, cudaHostAllocMapped));
  GemmErrorRecord* err_dev;
  uint32_t* abort_dev;
  CHECK_CUDA(cudaHostGetDevicePointer(&err_dev, err, 0));
  CHECK_CUDA(cudaHostGetDevicePointer(&abort_dev, abort_word, 0));
  __nv_bfloat16* C;
  CHECK_CUDA(cudaMalloc(&C, size_t(M) * N * 2));

  for (int mode = 0; mode < 2; ++mode) {
    std::printf("[hooks] %s\n", mode == 0 ? "flag never set: timeout" : "abort word");
    set_u64<<<1, 64>>>(flags, chunks, 3);
    set_u64<<<1, 1>>>(flags + 2, 1, 2);  // chunk 2 never reaches epoch 3
    std::memset(err, 0, sizeof *err);
    *reinterpret_cast<volatile uint32_t*>(abort_word) = 0;
    CHECK_CUDA(cudaDeviceSynchronize());
    GemmArgs a = shape_args(f.s, f.final_ops.A, f.final_ops.B, C);
    a.wait.a = {flags, static_cast<uint32_t>(chunk), static_cast<uint32_t>(chunks)};
    a.wait.epoch = 3;
    a.wait.timeout_ns = mode == 0 ? 50'000'000ull : 20'000'000'000ull;
    a.wait.abort_word = abort_dev;
    a.wait.error = err_dev;
    const auto t0 = std::chrono::steady_clock::now();
    CHECK_CUDA(launch_gemm(a, nullptr));
    if (mode == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
      *reinterpret_cast<volatile uint32_t*>(abort_word) = 1;
    }
    const cudaError_t e = cudaDeviceSynchronize();
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf(
        "  returned %s after %.3f s; code %u operand %u chunk %u cta %u tile (%u,%u) "
        "observed %llu waited %.1f ms\n",
        cudaGetErrorString(e), secs, err->code, err->operand, err->chunk, err->cta, err->tile_m, err->tile_n,
        (unsigned long long)err->observed, err->elapsed_ns / 1e6);
    EXPECT(e == cudaSuccess, "kernel must exit cleanly, got %s", cudaGetErrorString(e));
    EXPECT(secs < 3.0, "took %.3f s", secs);
    const uint32_t want = mode == 0 ? kGemmWaitTimeout : kGemmAborted;
    EXPECT(err->code == want, "code %u want %u", err->code, want);
    EXPECT(err->operand == 0 && err->chunk == 2, "operand %u chunk %u", err->operand, err->chunk);
    EXPECT(err->observed == 2, "observed %llu", (unsigned long long)err->observed);
  }
  // The device is still usable afterwards.
  Shape s{300, 264, 136, GemmLayoutB::kKN, GemmOutType::kBF16, 0, 0, 0, 0, 0, 0, 0};
  EXPECT(run_shape(s, seed + 5), "GEMM after a timeout");
  cudaFree(C);
  cudaFree(flags);
  cudaFreeHost(err);
  cudaFreeHost(abort_word);
  free_hook_fixture(f);
}

// Hook 2: tile sink. (a) fp32 atomic add into two destinations (rows routed by 200) plus the
// local C store plus tile flags; (b) bf16 store into the sink only (C = null), KN layout;
// (c) bf16x2 atomic add into two destinations, C = null.
void test_tile_sink(uint64_t seed) {
  std::printf("[hooks] tile sink: atomic add to 2 destinations + C + tile flags\n");
  const int M = 400, N = 776, K = 520, rows_per_dest = 200, ld = 784;
  HookFixture f = make_hook_fixture(M, N, K, seed);
  float *dst, *base;
  CHECK_CUDA(cudaMalloc(&dst, size_t(M) * ld * 4));
  CHECK_CUDA(cudaMalloc(&base, size_t(M) * ld * 4));
  fill_f32<<<256, 256>>>(base, size_t(M) * ld, seed + 7);
  CHECK_CUDA(cudaMemcpy(dst, base, size_t(M) * ld * 4, cudaMemcpyDeviceToDevice));
  __nv_bfloat16* C;
  CHECK_CUDA(cudaMalloc(&C, size_t(M + kGuardRows) * N * 2));
  CHECK_CUDA(cudaMemset(C, 0xFF, size_t(M + kGuardRows) * N * 2));
  const GemmTileGrid g = gemm_tile_grid(M, N, 128, 0);
  const int tiles = g.m_blocks * g.n_blocks;
  uint64_t* tile_flags;
  CHECK_CUDA(cudaMalloc(&tile_flags, tiles * 8));
  CHECK_CUDA(cudaMemset(tile_flags, 0, tiles * 8));

  GemmArgs a = shape_args(f.s, f.final_ops.A, f.final_ops.B, C);
  a.tile_n = 128;
  a.sink.mode = GemmSinkMode::kAtomicAddF32;
  a.sink.num_dests = 2;
  a.sink.rows_per_dest = rows_per_dest;
  a.sink.ld = ld;
  a.sink.dest[0] = dst;
  a.sink.dest[1] = dst + size_t(rows_per_dest) * ld;
  a.sink.tile_flags = tile_flags;
  a.sink.epoch = 3;
  CHECK_CUDA(launch_gemm(a, nullptr));
  CHECK_CUDA(cudaDeviceSynchronize());
  CompareResult c = check_output(C, false, N, M, N, M + kGuardRows, f.ref, nullptr);
  EXPECT(c.bad == 0, "local C: %llu bad", c.bad);
  c = check_output(dst, true, ld, M, N, M, f.ref, base);
  EXPECT(c.bad == 0, "sink: %llu bad, first row %llu col %llu got %g want %g", c.bad, c.first_bad / ld,
         c.first_bad % ld, c.got, c.want);
  std::vector<uint64_t> h(tiles);
  CHECK_CUDA(cudaMemcpy(h.data(), tile_flags, tiles * 8, cudaMemcpyDeviceToHost));
  int unset = 0;
  for (uint64_t v : h) unset += v != 3;
  EXPECT(unset == 0, "%d of %d tile flags not set", unset, tiles);

  std::printf("[hooks] tile sink: bf16 store elsewhere, C = null, KN layout\n");
  HookFixture fk = make_hook_fixture(M, N, K, seed + 11);
  fk.s.layout = GemmLayoutB::kKN;
  free_reference(fk.ref);
  free_operands(fk.final_ops);
  fk.final_ops = make_operands(fk.s, seed + 12);
  fk.ref = make_reference(fk.s, fk.final_ops);
  __nv_bfloat16* dst16;
  CHECK_CUDA(cudaMalloc(&dst16, size_t(M + kGuardRows) * ld * 2));
  CHECK_CUDA(cudaMemset(dst16, 0xFF, size_t(M + kGuardRows) * ld * 2));
  GemmArgs b = a;
  b.A = fk.final_ops.A;
  b.B = fk.final_ops.B;
  b.ldb = N;
  b.b_layout = GemmLayoutB::kKN;
  b.C = nullptr;
  b.tile_n = 0;
  b.sink.mode = GemmSinkMode::kStoreBF16;
  b.sink.num_dests = 1;
  b.sink.rows_per_dest = 0;
  b.sink.dest[0] = dst16;
  b.sink.dest[1] = nullptr;
  b.sink.tile_flags = nullptr;
  CHECK_CUDA(launch_gemm(b, nullptr));
  CHECK_CUDA(cudaDeviceSynchronize());
  c = check_output(dst16, false, ld, M, N, M + kGuardRows, fk.ref, nullptr);
  EXPECT(c.bad == 0, "bf16 sink: %llu bad, first row %llu col %llu got %g want %g", c.bad, c.first_bad / ld,
         c.first_bad % ld, c.got, c.want);

  // (c) bf16x2 atomic add into two pre-filled bf16 destinations, C = null. Each element is
  // base + bf16(acc) rounded to bf16: besides the bf16 output bound, up to 2^-8 of |acc|
  // (which the sum of |a*b| bounds).
  std::printf("[hooks] tile sink: bf16x2 atomic add to 2 destinations, C = null\n");
  __nv_bfloat16* add16;
  float* base16;
  CHECK_CUDA(cudaMalloc(&add16, size_t(M) * ld * 2));
  CHECK_CUDA(cudaMalloc(&base16, size_t(M) * ld * 4));
  fill_random<<<256, 256>>>(add16, size_t(M) * ld, seed + 13);
  to_f32<<<256, 256>>>(add16, base16, size_t(M) * ld);
  GemmArgs c16 = a;
  c16.C = nullptr;
  c16.sink.mode = GemmSinkMode::kAtomicAddBF16;
  c16.sink.dest[0] = add16;
  c16.sink.dest[1] = add16 + size_t(rows_per_dest) * ld;
  c16.sink.tile_flags = nullptr;
  CHECK_CUDA(launch_gemm(c16, nullptr));
  CHECK_CUDA(cudaDeviceSynchronize());
  c = check_output(add16, false, ld, M, N, M, f.ref, base16, 0x1p-8f);
  EXPECT(c.bad == 0, "bf16 atomic sink: %llu bad, first row %llu col %llu got %g want %g", c.bad,
         c.first_bad / ld, c.first_bad % ld, c.got, c.want);

  cudaFree(add16);
  cudaFree(base16);
  cudaFree(dst16);
  free_hook_fixture(fk);
  cudaFree(tile_flags);
  cudaFree(C);
  cudaFree(dst);
  cudaFree(base);
  free_hook_fixture(f);
}

void test_bad_args() {
  std::printf("[args] contract violations are rejected\n");
  GemmArgs a;
  a.M = 16;
  a.N = 12;
  a.K = 64;
  EXPECT(launch_gemm(a, nullptr) == cudaErrorInvalidValue, "null operands accepted");
  // CTA pairs: a bad value, one CTA, and hooks 1-2 (pairs run in lockstep) are refused.
  __nv_bfloat16* buf;
  CHECK_CUDA(cudaMalloc(&buf, 3 * 256 * 64 * 2));
  uint64_t* flags;
  CHECK_CUDA(cudaMalloc(&flags, 64));
  {
    // Row strides of A and B off the multiple of 8 (TMA) need the staged launch, which refuses
    // a staging buffer that is missing or too small; a tile sink needs N % 8 == 0.
    GemmArgs u;
    u.M = 16;
    u.N = 12;
    u.K = 60;
    u.A = buf;
    u.B = buf + 256 * 64;
    u.C = buf + 2 * 256 * 64;
    u.lda = 64;
    u.ldb = 64;
    u.ldc = 13;
    EXPECT(launch_gemm(u, nullptr) == cudaSuccess, "N = 12, K = 60, ldc = 13 refused");
    CHECK_CUDA(cudaDeviceSynchronize());
    u.lda = 61;
    EXPECT(launch_gemm(u, nullptr) == cudaErrorInvalidValue, "lda %% 8 != 0 accepted by launch_gemm");
    EXPECT(gemm_staging_bytes(u) >= size_t(16) * 64 * 2, "staging bytes too few for A");
    EXPECT(launch_gemm_staged(u, nullptr, 0, nullptr) == cudaErrorInvalidValue, "staging missing accepted");
    // Operands whose rows are off the 128-byte lines are copied where the cost model says it
    // pays (tuning.h kStage*, kOffLine*): at 8192 x 8192 x 8200 not with CTA pairs left to the
    // launch (pairs on the rows in place), both with pairs off; small GEMMs and strides on the
    // lines never.
    GemmArgs big = u;
    big.M = big.N = 8192;
    big.K = big.lda = big.ldb = 8200;
    big.ldc = 8192;
    EXPECT(gemm_staging_bytes(big) == 0, "8192 x 8192 x 8200 staged where pairs may run in place");
    big.cluster = 1;
    EXPECT(gemm_staging_bytes(big) >= size_t(2) * 8192 * 8256 * 2,
           "8192 x 8192 x 8200 not staged, pairs off");
    big.cluster = 0;
    big.K = big.lda = big.ldb = 8192;
    EXPECT(gemm_staging_bytes(big) == 0, "8192^3 staged");
    big.M = big.N = 16;
    big.K = big.lda = big.ldb = 72;
    EXPECT(gemm_staging_bytes(big) == 0, "16 x 16 x 72 staged");
    u.lda = 64;
    u.sink.mode = GemmSinkMode::kStoreBF16;
    u.sink.num_dests = 1;
    u.sink.ld = 16;
    u.sink.dest[0] = buf;
    EXPECT(launch_gemm(u, nullptr) == cudaErrorInvalidValue, "a tile sink with N %% 8 != 0 accepted");
  }
  GemmArgs p;
  p.M = 256;
  p.N = 64;
  p.K = 64;
  p.A = buf;
  p.B = buf + 256 * 64;
  p.C = buf + 2 * 256 * 64;
  p.lda = p.ldb = p.ldc = 64;
  p.cluster = 2;
  EXPECT(launch_gemm(p, nullptr) == cudaSuccess, "forced CTA pairs refused on a valid shape");
  CHECK_CUDA(cudaDeviceSynchronize());
  GemmArgs q = p;
  q.cluster = 3;
  EXPECT(launch_gemm(q, nullptr) == cudaErrorInvalidValue, "cluster = 3 accepted");
  q = p;
  q.num_ctas = 1;
  EXPECT(launch_gemm(q, nullptr) == cudaErrorInvalidValue, "CTA pairs with one CTA accepted");
  q = p;
  q.sink.tile_flags = flags;
  q.sink.epoch = 1;
  EXPECT(launch_gemm(q, nullptr) == cudaErrorInvalidValue, "CTA pairs with tile flags accepted");
  cudaFree(flags);
  cudaFree(buf);
  cudaGetLastError();
}

// Stream-K: forced on shapes with one partial wave, few tiles (fewer than the CTAs), K slices
// fewer than the CTAs' share (empty runs) and long K; each run twice, bit for bit the same, the
// counters back at zero (run_shape checks them after every launch with a workspace).
void test_stream_k(uint64_t seed) {
  const int shapes[][3] = {{1024, 14336, 4096}, {300, 1000, 72}, {64, 2048, 8192},
                           {2048, 4096, 128},   {129, 264, 8},   {4000, 7168, 4104}};
  int passed = 0, total = 0;
  for (const auto& d : shapes) {
    for (auto l : {GemmLayoutB::kNK, GemmLayoutB::kKN}) {
      Shape s{d[0], d[1], d[2], l, GemmOutType::kBF16, 0, 0, 0, 0, 0, 0, 0, 1, 2};
      if (total % 3 == 1) s.out = GemmOutType::kF32;
      if (total % 4 == 2) s.tile_n = 128;
      std::vector<uint8_t> first, second;
      bool ok = run_shape(s, seed + total, &first) && run_shape(s, seed + total, &second);
      ok = ok && first == second;
      EXPECT(ok, "stream-K %s", describe(s).c_str());
      passed += ok;
      ++total;
    }
  }
  // A workspace one byte short: stream-K off, still correct.
  Shape s{1024, 14336, 4096, GemmLayoutB::kNK, GemmOutType::kBF16, 0, 0, 0, 0, 0, 0, 0, 1, 2};
  const size_t bytes = g_workspace_bytes;
  g_workspace_bytes = gemm_workspace_bytes(0) - 1;
  EXPECT(run_shape(s, seed + 99), "stream-K with a short workspace");
  g_workspace_bytes = bytes;
  std::printf("[stream-k] %d/%d forced shapes passed twice, bit for bit\n", passed, total);
}

// 192-wide tiles (plain launches on single CTAs): forced at narrow N and at N, M and K tails,
// both layouts, bf16 C through TMA and through rows (odd ldc), fp32 C, padded and staged
// operands, few CTAs; forced stream-K on them, each run twice, bit for bit the same. Then the
// plans: chosen at N = 376 (two 192-wide N-blocks), refused with CTA pairs or hooks, and never
// taken by a launch that asks for 128 or 256.
void test_wide192(uint64_t seed) {
  struct W {
    int M, N, K, ctas, pad, sk;
    bool f32, staged;
  };
  const W cases[] = {{1300, 376, 2120, 0, 0, -1, false, false}, {129, 200, 72, 3, 8, -1, true, false},
                     {700, 1000, 1000, 0, 0, -1, false, true},  {4000, 376, 8200, 0, 0, 2, false, false},
                     {64, 5000, 8192, 0, 0, 2, true, false},    {1, 190, 64, 0, 0, -1, false, false},
                     {300, 576, 4104, 5, 0, 2, false, false},   {2500, 383, 600, 0, 0, 0, false, false}};
  int passed = 0, total = 0;
  for (const W& c : cases) {
    for (auto l : {GemmLayoutB::kNK, GemmLayoutB::kKN}) {
      Shape s{c.M, c.N, c.K, l, c.f32 ? GemmOutType::kF32 : GemmOutType::kBF16, 0, 0, 0, 192, c.ctas};
      s.stream_k = c.sk;
      s.pad_a = s.pad_b = c.pad;
      if (l == GemmLayoutB::kKN) s.pad_b += round8(c.N) - c.N;  // B's rows: a multiple of 8
      if (total % 4 == 3) s.pad_c = 3;  // bf16 C through rows, fp32 C through registers
      if (c.staged) {
        s.K += 1;  // rows off the multiple of 8: copied by the staged launch
        s.staged = true;
      }
      // (A staged shape's plan is that of its padded rows: checked through its result.)
      const GemmLaunchPlan plan = plan_of(s);
      bool ok = c.staged || (plan.grid.tile_n == 192 && !plan.pairs && !plan.pingpong);
      std::vector<uint8_t> first, second;
      ok = ok && run_shape(s, seed + total, &first);
      if (c.sk == 2) {
        ok = ok && plan.stream_k_tiles > 0 && run_shape(s, seed + total, &second) && first == second;
      }
      EXPECT(ok, "192-wide %s", describe(s).c_str());
      passed += ok;
      ++total;
    }
  }
  // The launch's own choice at N = 376 with rows off the lines (tuning.h kTile192*): two waves
  // of 192-wide tiles against three of 128.
  Shape q{13222, 376, 10824, GemmLayoutB::kNK, GemmOutType::kBF16, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  if (g_sms >= 132) EXPECT(plan_of(q).grid.tile_n == 192, "192-wide tiles not chosen at 13222 x 376 x 10824");
  q.tile_n = 256;
  EXPECT(plan_of(q).grid.tile_n == 256, "forced 256-wide tiles not kept");
  q.tile_n = 192;
  q.cluster = 2;
  EXPECT(plan_of(q).ctas == 0, "192-wide CTA pairs accepted");
  q.cluster = 0;
  q.tile_n = 0;
  q.pingpong = 2;
  q.stream_k = -1;  // no workspace: a chosen stream-K would take precedence over the turns
  EXPECT(plan_of(q).grid.tile_n == 128 && plan_of(q).pingpong, "192-wide tiles over a forced ping-pong");
  q.pingpong = 0;
  q.stream_k = 0;
  q.tile_n = 192;
  GemmArgs h = plan_args(q);
  GemmLaunchPlan plan{};
  uint64_t flag_storage = 0;
  GemmErrorRecord record{};
  h.wait.a = GemmReadyFlags{&flag_storage, 128, 1};
  h.wait.error = &record;
  EXPECT(gemm_launch_plan(h, &plan) == cudaErrorInvalidValue, "192-wide tiles with waits accepted");
  std::printf("[wide192] %d/%d forced shapes passed; plan choices checked\n", passed, total);
}

// Consumers that take turns, forced: one tile per CTA (warpgroup 1 idle), odd and even counts
// of tiles per CTA (one CTA, few CTAs), K of 2, 4 and 6 slices with many tiles per CTA (a
// stage's previous use then belongs to the other warpgroup: every first wait leans on the
// turn), K tails, M tails inside a tile's lower half, fp32 C, both layouts, padded operands,
// M rotation and raster groups. Then which launches take turns: chosen at 128-wide tiles,
// never when off, at forced 256-wide tiles, with CTA pairs, hooks, the sink or stream-K.
void test_pingpong(uint64_t seed) {
  struct P {
    int M, N, K, ctas, group, mstart;
    bool f32;
  };
  const P cases[] = {{128, 128, 64, 0, 0, 0, false},      {300, 1000, 72, 1, 0, 0, false},
                     {129, 264, 8, 3, 0, 0, true},        {1024, 14336, 4096, 0, 0, 0, false},
                     {1000, 2056, 200, 5, 3, 2, false},   {65, 4096, 1024, 0, 0, 0, true},
                     {4000, 1032, 4104, 7, 16, 5, false}, {2048, 2048, 2048, 0, 1, 0, true},
                     {1100, 3000, 384, 3, 0, 0, false},   {700, 1504, 256, 2, 8, 1, true},
                     {900, 2000, 128, 1, 0, 0, false}};
  int passed = 0, total = 0;
  for (const P& c : cases) {
    for (auto l : {GemmLayoutB::kNK, GemmLayoutB::kKN}) {
      Shape s{c.M,     c.N,      c.K, l,  c.f32 ? GemmOutType::kF32 : GemmOutType::kBF16,
              0,       0,        0,   0,  c.ctas,
              c.group, c.mstart, 0,   -1, 2};
      if (total % 3 == 2) s.pad_a = s.pad_b = s.pad_c = 8;
      const bool planned = plan_of(s).pingpong;
      const bool ok = planned && run_shape(s, seed + total);
      EXPECT(ok, "ping-pong %s%s", describe(s).c_str(), planned ? "" : " (not planned)");
      passed += ok;
      ++total;
    }
  }
  // 1024 × 14336 × 4096: the plan's own choice is 128-wide tiles (gemm.cu choose_tile_n).
  Shape q{1024, 14336, 4096, GemmLayoutB::kNK, GemmOutType::kBF16, 0, 0, 0, 0, 0, 0, 0, 0, -1, 0};
  EXPECT(plan_of(q).grid.tile_n == 128 && plan_of(q).pingpong, "ping-pong not chosen at 128-wide tiles");
  q.pingpong = 1;
  EXPECT(plan_of(q).ctas > 0 && !plan_of(q).pingpong, "ping-pong taken while off");
  q.pingpong = 2;
  q.tile_n = 256;
  EXPECT(plan_of(q).ctas > 0 && !plan_of(q).pingpong, "ping-pong at forced 256-wide tiles");
  q.tile_n = 0;
  q.cluster = 2;
  EXPECT(plan_of(q).ctas > 0 && !plan_of(q).pingpong, "ping-pong in CTA pairs");
  q.cluster = 0;
  q.stream_k = 2;  // forced stream-K: 896 tiles leave a partial wave on any GPU under 896 SMs
  EXPECT(plan_of(q).stream_k_tiles > 0 && !plan_of(q).pingpong, "ping-pong under stream-K");
  q.stream_k = -1;
  q.pingpong = 3;
  EXPECT(plan_of(q).ctas == 0, "pingpong = 3 accepted");
  // A short grid of 128-wide tiles with long K: CTA pairs instead (tuning.h kPair*), unless
  // the ping-pong, the tile width or single CTAs are asked for.
  Shape r{1000, 4104, 2056, GemmLayoutB::kNK, GemmOutType::kBF16, 0, 0, 0, 0, 0, 0, 0, 0, -1, 0};
  if (g_sms >= 132) {
    EXPECT(plan_of(r).pairs && !plan_of(r).pingpong && plan_of(r).grid.tile_n == 128,
           "CTA pairs not chosen at 1000 x 4104 x 2056");
  }
  r.pingpong = 2;
  EXPECT(!plan_of(r).pairs && plan_of(r).pingpong, "CTA pairs chosen over a forced ping-pong");
  r.pingpong = 0;
  r.cluster = 1;
  EXPECT(!plan_of(r).pairs, "CTA pairs chosen while off");
  r.cluster = 0;
  r.K = 1024;  // 16 K slices
  EXPECT(!plan_of(r).pairs, "CTA pairs chosen at short K");
  r.K = 2056;
  r.tile_n = 128;
  EXPECT(!plan_of(r).pairs, "CTA pairs chosen at a forced tile width");
  // Hooks and the sink (plans only; their launches are tested below).
  GemmArgs h = plan_args(
      Shape{1024, 14336, 4096, GemmLayoutB::kNK, GemmOutType::kBF16, 0, 0, 0, 0, 0, 0, 0, 0, -1, 2});
  GemmLaunchPlan plan{};
  uint64_t flag_storage = 0;
  GemmErrorRecord record{};
  h.wait.a = GemmReadyFlags{&flag_storage, 128, 1};
  h.wait.error = &record;
  EXPECT(gemm_launch_plan(h, &plan) == cudaSuccess && !plan.pingpong, "ping-pong with waits");
  h.wait = GemmWaitConfig{};
  h.sink.mode = GemmSinkMode::kStoreF32;
  h.sink.num_dests = 1;
  h.sink.ld = h.N;
  h.sink.dest[0] = const_cast<void*>(static_cast<const void*>(h.A));
  EXPECT(gemm_launch_plan(h, &plan) == cudaSuccess && !plan.pingpong, "ping-pong with a sink");
  std::printf("[pingpong] %d/%d forced shapes passed; plan choices checked\n", passed, total);
}

// CTA pairs where rows are off the 128-byte lines (tuning.h kPairOffLine*): dense operands at
// strides off the multiple of 64 through the staged launch, which then copies nothing (an odd
// M-block count: the last pair's second member idle), both layouts, fp32 C too, each checked.
// Then the plans: pairs on 256-wide tiles there, none where they would add a wave (odd M-block
// counts on a one-wave grid), and the copies where the cost model says they pay.
void test_off_line_pairs(uint64_t seed) {
  int passed = 0, total = 0;
  // The staged launch of `s` plans CTA pairs on 256-wide tiles with its rows left in place (no
  // copy; any plan on a GPU with fewer SMs), and the result is right.
  auto expect_pairs_in_place = [&](Shape s) {
    s.staged = true;
    const GemmLaunchPlan plan = plan_of(s);
    const bool planned =
        g_sms < 132 || (plan.pairs && plan.grid.tile_n == 256 && gemm_staging_bytes(plan_args(s)) == 0);
    const bool ok = planned && run_shape(s, seed + total);
    EXPECT(ok, "rows off the lines %s%s", describe(s).c_str(), planned ? "" : " (pairs not planned)");
    passed += ok;
    ++total;
  };
  for (auto l : {GemmLayoutB::kNK, GemmLayoutB::kKN}) {
    for (auto out : {GemmOutType::kBF16, GemmOutType::kF32}) {
      expect_pairs_in_place(Shape{1400, 2504, 1000, l, out, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0});
    }
    // Two waves of pairs over an odd M-block count (17 × 14 tiles of 256, 126 pairs), rows at
    // 40 past the multiple of 64: left in place by the cost model (tuning.h kOffLine*).
    expect_pairs_in_place(Shape{2100, 3496, 1000, l, GemmOutType::kBF16, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0});
  }
  if (g_sms >= 132) {
    // 2683 x 2352 x 14840: 210 tiles of 256, 110 pairs in two waves as single CTAs; the copies
    // (~105 us modelled) pass a fifth of the GEMM's ~267 us.
    Shape q{2683, 2352, 14840, GemmLayoutB::kNK, GemmOutType::kBF16, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    EXPECT(plan_of(q).pairs && plan_of(q).grid.tile_n == 256, "no CTA pairs at 2683 x 2352 x 14840");
    EXPECT(gemm_staging_bytes(plan_args(q)) == 0, "2683 x 2352 x 14840 staged");
    q.cluster = 1;
    EXPECT(!plan_of(q).pairs, "CTA pairs chosen while off, rows off the lines");
    // 5649 x 2448 x 6456: with rows off the lines, 4 waves of 256-wide tiles beat 7 of 128
    // (kTileTime128OffLine); 230 pairs take 4 waves too; no copies.
    Shape w{5649, 2448, 6456, GemmLayoutB::kKN, GemmOutType::kBF16, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    EXPECT(plan_of(w).pairs && plan_of(w).grid.tile_n == 256, "no 256-wide pairs at 5649 x 2448 x 6456");
    EXPECT(gemm_staging_bytes(plan_args(w)) == 0, "5649 x 2448 x 6456 staged");
    w.pad_a = 64 - 6456 % 64;  // A on the lines, B (N = 2448) still off them
    EXPECT(plan_of(w).pairs && plan_of(w).grid.tile_n == 256, "no pairs with B alone off the lines");
    w.pad_b = 64 - 2448 % 64;  // both on the lines: single CTAs (the wave model's width)
    EXPECT(!plan_of(w).pairs && plan_of(w).ctas > 0,
           "CTA pairs with both operands on the lines at 5649 x 2448 x 6456");
    // 339 x 4776 x 5984: 114 tiles of 128 in one wave; 3 M-blocks make 76 pairs, two waves.
    Shape r{339, 4776, 5984, GemmLayoutB::kNK, GemmOutType::kBF16, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    EXPECT(!plan_of(r).pairs && plan_of(r).pingpong, "CTA pairs that add a wave at 339 x 4776 x 5984");
    // 8192 x 8192 x 8200: CTA pairs on the rows in place cost less than the copies (5-10 % of
    // the time); with pairs off, the copies pay (rows at 8 past the multiple of 64 on single
    // CTAs: ~1.5 × the time).
    Shape b{8192, 8192, 8200, GemmLayoutB::kNK, GemmOutType::kBF16, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    EXPECT(gemm_staging_bytes(plan_args(b)) == 0 && plan_of(b).pairs,
           "8192 x 8192 x 8200 not in place with pairs");
    b.cluster = 1;
    EXPECT(gemm_staging_bytes(plan_args(b)) > 0, "8192 x 8192 x 8200 not staged with pairs off");
    // 2768 x 3136 x 2384 KN: A off the lines (16 past the multiple of 64, on the sectors)
    // alone: 3 waves of 192-wide tiles in place beat 3 of 256-wide pairs and the copy of A.
    Shape t{2768, 3136, 2384, GemmLayoutB::kKN, GemmOutType::kBF16, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    EXPECT(gemm_staging_bytes(plan_args(t)) == 0 && plan_of(t).grid.tile_n == 192,
           "2768 x 3136 x 2384 KN: not 192-wide in place");
  }
  std::printf("[off-line pairs] %d/%d shapes passed; plan choices checked\n", passed, total);
}

// Launched early, a GEMM may be scheduled while the stream's previous kernel runs and must not
// touch its operands before that kernel completes. A chain on one non-blocking stream with no
// host sync: poison into every buffer, a slow producer filling A (launch_delayed_copy: it leaves
// most SMs free for the GEMM's CTAs), then four GEMMs each reading the previous one's C as its A
// (256-wide tiles; turns on 128-wide tiles; CTA pairs; forced stream-K), twice. Each C is then
// checked against a reference computed from its (checked) input.
void test_early_launch(uint64_t seed) {
  const int M = 1000;
  const int widths[] = {512, 1024, 768, 2048, 520};  // K of stage 0, then each stage's N
  constexpr int kStages = 4;
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  __nv_bfloat16* act[kStages + 1];  // act[0] = A, act[i + 1] = C of stage i
  __nv_bfloat16* weight[kStages];
  __nv_bfloat16* a_src;
  const size_t a_elems = size_t(M) * widths[0];
  CHECK_CUDA(cudaMalloc(&a_src, a_elems * 2));
  fill_random<<<1024, 256>>>(a_src, a_elems, seed);
  for (int i = 0; i <= kStages; ++i) CHECK_CUDA(cudaMalloc(&act[i], size_t(M) * widths[i] * 2));
  for (int i = 0; i < kStages; ++i) {
    const size_t n = size_t(widths[i + 1]) * widths[i];
    CHECK_CUDA(cudaMalloc(&weight[i], n * 2));
    fill_random<<<1024, 256>>>(weight[i], n, seed + 1 + i);
  }
  CHECK_CUDA(cudaDeviceSynchronize());
  Shape stage[kStages];
  for (int i = 0; i < kStages; ++i) {
    stage[i] = Shape{
        M, widths[i + 1], widths[i], GemmLayoutB::kNK, GemmOutType::kBF16, 0, 0, 0, 0, 0, 0, 0, 1, -1, 1};
  }
  stage[0].tile_n = 256;
  stage[1].pingpong = 2;
  stage[2].cluster = 2;
  stage[3].stream_k = 2;
  bool ok = plan_of(stage[1]).pingpong && plan_of(stage[3]).stream_k_tiles > 0;
  EXPECT(ok, "early launch: the chain's plans are not the ones it tests");
  for (int round = 0; round < 2 && ok; ++round) {
    for (int i = 0; i <= kStages; ++i) {
      CHECK_CUDA(cudaMemsetAsync(act[i], 0xFF, size_t(M) * widths[i] * 2, stream));  // NaN
    }
    CHECK_CUDA(launch_delayed_copy(a_src, act[0], a_elems * 2, 50000, stream));
    for (int i = 0; i < kStages && ok; ++i) {
      const cudaError_t e = launch_gemm(shape_args(stage[i], act[i], weight[i], act[i + 1]), stream);
      ok = e == cudaSuccess;
      EXPECT(ok, "early launch: stage %d launch: %s", i, cudaGetErrorString(e));
    }
    CHECK_CUDA(cudaStreamSynchronize(stream));
    for (int i = 0; i < kStages && ok; ++i) {
      Operands o;
      o.A = act[i];
      o.B = weight[i];
      o.lda = widths[i];
      o.ldb = widths[i];
      Reference r = make_reference(stage[i], o);
      const CompareResult c = check_output(act[i + 1], false, widths[i + 1], M, widths[i + 1], M, r, nullptr);
      free_reference(r);
      ok = c.bad == 0;
      EXPECT(ok, "early launch round %d: stage %d (%s): %llu bad elements, first got %g want %g", round, i,
             describe(stage[i]).c_str(), c.bad, c.got, c.want);
    }
    if (!workspace_counters_zero()) {
      ok = false;
      EXPECT(false, "early launch: stream-K counters left set");
    }
  }
  std::printf("[early-launch] %s: a 4-GEMM chain behind a slow producer, twice\n", ok ? "passed" : "FAILED");
  for (int i = 0; i <= kStages; ++i) cudaFree(act[i]);
  for (int i = 0; i < kStages; ++i) cudaFree(weight[i]);
  cudaFree(a_src);
  cudaStreamDestroy(stream);
}

}  // namespace

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("SKIP: gemm_test needs a CUDA GPU; none is visible here\n");
    return 77;
  }
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  if (prop.major != 9) {
    std::printf("SKIP: gemm_test needs a Hopper GPU (sm_90a); found %s (sm_%d%d)\n", prop.name, prop.major,
                prop.minor);
    return 77;
  }
  uint64_t seed = std::chrono::steady_clock::now().time_since_epoch().count();
  if (const char* e = std::getenv("GEMM_TEST_SEED")) seed = std::strtoull(e, nullptr, 10);
  int count = 240;
  if (const char* e = std::getenv("GEMM_TEST_SHAPES")) count = std::atoi(e);
  std::printf("gemm_test on %s (%d SMs), seed %llu\n", prop.name, prop.multiProcessorCount,
              (unsigned long long)seed);

  test_bad_args();
  g_workspace_bytes = gemm_workspace_bytes(0);
  CHECK_CUDA(cudaMalloc(&g_workspace, g_workspace_bytes));
  CHECK_CUDA(cudaMemset(g_workspace, 0, g_workspace_bytes));
  g_sms = prop.multiProcessorCount;
  test_stream_k(seed + 4);
  test_wide192(seed + 8);
  test_pingpong(seed + 5);
  test_off_line_pairs(seed + 7);
  test_early_launch(seed + 6);
  std::mt19937_64 rng(seed);
  const auto shapes = make_sweep(rng, count, prop.multiProcessorCount);
  int passed = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (size_t i = 0; i < shapes.size(); ++i) {
    const bool ok = run_shape(shapes[i], seed + i * 1000);
    if (ok) {
      ++passed;
    } else {
      ++g_failures;
      std::printf("  FAIL sweep[%zu] %s\n", i, describe(shapes[i]).c_str());
    }
  }
  std::printf("[sweep] %d/%zu shapes passed in %.1f s\n", passed, shapes.size(),
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());

  test_late_flags(prop.multiProcessorCount, seed + 1);
  test_timeout_and_abort(seed + 2);
  test_tile_sink(seed + 3);

  std::printf("%s: %d failure(s)\n", g_failures ? "FAILED" : "PASSED", g_failures);
  return g_failures ? 1 : 0;
}
