// attention_test: launch_attention against an fp32 reference on the GPU, every element checked.
//
//   1. shapes: head dims 64 and 128, causal and not, GQA ratios 1, 4, 8 and MQA, sequence
//      lengths that are not multiples of the 128-row tile (1, 77, 1000, 4099), q_len != kv_len,
//      batch 1 to 4, global position offsets (rows that see no key: o = 0, lse = -inf), views
//      (q, k, v slices of one packed qkv tensor; o with a padded row stride). Outputs are
//      poisoned (NaN) first; every element of o and lse must be within tolerance.
//   2. accumulation: the keys split in three blocks, run as kStore, kMerge, kMerge (o written
//      by the last), against the whole-sequence reference; causal blocks by global position.
//   3. back-to-back launches and a CUDA graph replayed twice: bit-identical to a direct launch.
//
// Exit codes: 0 pass, 1 failure, 77 skipped (no GPU or not Hopper), with the reason printed.
// ATTN_TEST_SEED=<n> changes the inputs.
#include "kernels/attention/attention.h"
#include "kernels/common/tests/kernel_test_check.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

using namespace fusedcomm::kernels;

using fusedcomm::kernels::testing::g_failures;

namespace {

__device__ __forceinline__ uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Uniform in [-amp, amp) as bf16.
__global__ void fill_random(__nv_bfloat16* p, size_t n, uint64_t seed, float amp) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const uint64_t r = mix64(seed ^ mix64(i));
    p[i] = __float2bfloat16((static_cast<float>(r >> 40) * (2.0f / 16777216.0f) - 1.0f) * amp);
  }
}

struct View {
  const __nv_bfloat16* p;
  int64_t sb, ss, sh;
};

// fp32 reference: one block per (query row, head, batch); scores in shared memory.
__global__ void reference(View q, View k, View v, float* o, float* lse, int q_len, int kv_len, int hq,
                          int group, int d, int causal, long long delta, float scale) {
  extern __shared__ float sm[];
  float* qf = sm;
  float* sc = sm + d;
  __shared__ float red[32];
  const int i = blockIdx.x, h = blockIdx.y, b = blockIdx.z, hk = h / group;
  for (int c = threadIdx.x; c < d; c += blockDim.x)
    qf[c] = __bfloat162float(q.p[b * q.sb + i * q.ss + h * q.sh + c]);
  __syncthreads();
  float mx = -INFINITY;
  for (int j = threadIdx.x; j < kv_len; j += blockDim.x) {
    float s = -INFINITY;
    if (!causal || j <= i + delta) {
      const __nv_bfloat16* kr = k.p + b * k.sb + j * k.ss + hk * k.sh;
      float acc = 0.0f;
      for (int c = 0; c < d; ++c) acc += qf[c] * __bfloat162float(kr[c]);
      s = acc * scale;
    }
    sc[j] = s;
    mx = fmaxf(mx, s);
  }
  for (int off = 16; off > 0; off /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = mx;
  __syncthreads();
  mx = -INFINITY;
  for (int w = 0; w < blockDim.x / 32; ++w) mx = fmaxf(mx, red[w]);
  __syncthreads();
  float sum = 0.0f;
  for (int j = threadIdx.x; j < kv_len; j += blockDim.x) {
    const float e = mx == -INFINITY ? 0.0f : expf(sc[j] - mx);
    sc[j] = e;
    sum += e;
  }
  for (int off = 16; off > 0; off /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = sum;
  __syncthreads();
  sum = 0.0f;
  for (int w = 0; w < blockDim.x / 32; ++w) sum += red[w];
  const int64_t orow = ((static_cast<int64_t>(b) * q_len + i) * hq + h) * d;
  for (int c = threadIdx.x; c < d; c += blockDim.x) {
    float acc = 0.0f;
    for (int j = 0; j < kv_len; ++j) {
      if (sc[j] != 0.0f) acc += sc[j] * __bfloat162float(v.p[b * v.sb + j * v.ss + hk * v.sh + c]);
    }
    o[orow + c] = sum > 0.0f ? acc / sum : 0.0f;
  }
  if (threadIdx.x == 0)
    lse[(static_cast<int64_t>(b) * hq + h) * q_len + i] = sum > 0.0f ? mx + logf(sum) : -INFINITY;
}

struct Case {
  int B, Sq, Sk, Hq, Hkv, D;
  bool causal;
  long long qp0, kp0;
  bool packed;  // q, k, v slices of one (B, S, Hq + 2 Hkv, D) tensor; o row stride padded
};

struct Buffers {
  __nv_bfloat16 *qkv = nullptr, *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr;
  float *ref_o = nullptr, *ref_lse = nullptr, *lse = nullptr, *o_acc = nullptr;
  AttentionArgs args;
  size_t o_elems = 0;
  ~Buffers() {
    for (void* p : {(void*)qkv, (void*)q, (void*)k, (void*)v, (void*)o, (void*)ref_o, (void*)ref_lse,
                    (void*)lse, (void*)o_acc})
      if (p) cudaFree(p);
  }
};

uint64_t g_seed = 1;

void setup(const Case& c, Buffers& bf) {
  AttentionArgs& a = bf.args;
  a = AttentionArgs{};
  a.batch = c.B;
  a.q_len = c.Sq;
  a.kv_len = c.Sk;
  a.q_heads = c.Hq;
  a.kv_heads = c.Hkv;
  a.head_dim = c.D;
  a.causal = c.causal;
  a.q_pos0 = c.qp0;
  a.k_pos0 = c.kp0;
  const int64_t D = c.D;
  auto fill = [](__nv_bfloat16* p, size_t n, float amp) {
    fill_random<<<512, 256>>>(p, n, g_seed++ * 0x1234567ull, amp);
    CHECK_CUDA(cudaGetLastError());
  };
  if (c.packed) {
    const int64_t hs = c.Hq + 2 * c.Hkv;
    const size_t n = static_cast<size_t>(c.B) * c.Sq * hs * D;
    CHECK_CUDA(cudaMalloc(&bf.qkv, n * 2));
    fill(bf.qkv, n, 2.0f);
    for (int t = 0; t < 3; ++t) {
      AttnTensor& x = t == 0 ? a.q : t == 1 ? a.k : a.v;
      x.ptr = bf.qkv + (t == 0 ? 0 : t == 1 ? c.Hq * D : (c.Hq + c.Hkv) * D);
      x.stride_h = D;
      x.stride_s = hs * D;
      x.stride_b = c.Sq * hs * D;
    }
  } else {
    const size_t nq = static_cast<size_t>(c.B) * c.Sq * c.Hq * D,
                 nk = static_cast<size_t>(c.B) * c.Sk * c.Hkv * D;
    CHECK_CUDA(cudaMalloc(&bf.q, nq * 2));
    CHECK_CUDA(cudaMalloc(&bf.k, nk * 2));
    CHECK_CUDA(cudaMalloc(&bf.v, nk * 2));
    fill(bf.q, nq, 2.0f);
    fill(bf.k, nk, 2.0f);
    fill(bf.v, nk, 1.0f);
    a.q = attn_dense(bf.q, c.Sq, c.Hq, D);
    a.k = attn_dense(bf.k, c.Sk, c.Hkv, D);
    a.v = attn_dense(bf.v, c.Sk, c.Hkv, D);
  }
  const int64_t pad = c.packed ? 64 : 0;
  a.o_stride_h = D;
  a.o_stride_s = c.Hq * D + pad;
  a.o_stride_b = c.Sq * a.o_stride_s;
  bf.o_elems = static_cast<size_t>(c.B) * a.o_stride_b;
  CHECK_CUDA(cudaMalloc(&bf.o, bf.o_elems * 2 + 16));
  a.o = bf.o;
  const size_t nlse = static_cast<size_t>(c.B) * c.Hq * c.Sq;
  const size_t nref = static_cast<size_t>(c.B) * c.Sq * c.Hq * D;
  CHECK_CUDA(cudaMalloc(&bf.lse, nlse * 4 + 16));
  CHECK_CUDA(cudaMalloc(&bf.ref_lse, nlse * 4 + 16));
  CHECK_CUDA(cudaMalloc(&bf.ref_o, nref * 4 + 16));
  CHECK_CUDA(cudaMalloc(&bf.o_acc, nref * 4 + 16));
  a.lse = bf.lse;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const dim3 grid(c.Sq, c.Hq, c.B);
  const size_t sm = (c.Sk + D) * sizeof(float);
  CHECK_CUDA(cudaFuncSetAttribute(reference, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024));
  reference<<<grid, 128, sm>>>(View{a.q.ptr, a.q.stride_b, a.q.stride_s, a.q.stride_h},
                               View{a.k.ptr, a.k.stride_b, a.k.stride_s, a.k.stride_h},
                               View{a.v.ptr, a.v.stride_b, a.v.stride_s, a.v.stride_h}, bf.ref_o, bf.ref_lse,
                               c.Sq, c.Sk, c.Hq, c.Hq / c.Hkv, c.D, c.causal ? 1 : 0, c.qp0 - c.kp0, scale);
  CHECK_CUDA(cudaGetLastError());
}

void poison(Buffers& bf) {
  CHECK_CUDA(cudaMemset(bf.o, 0xFF, bf.o_elems * 2));
  CHECK_CUDA(
      cudaMemset(bf.lse, 0xFF, static_cast<size_t>(bf.args.batch) * bf.args.q_heads * bf.args.q_len * 4));
  // cudaMemset is ordered on the legacy stream only: a launch on a non-blocking stream (the
  // graph replay below) must not race it.
  CHECK_CUDA(cudaDeviceSynchronize());
}

std::vector<uint16_t> read_o(const Buffers& bf) {
  std::vector<uint16_t> h(bf.o_elems);
  CHECK_CUDA(cudaMemcpy(h.data(), bf.o, bf.o_elems * 2, cudaMemcpyDeviceToHost));
  return h;
}
std::vector<float> read_lse(const Buffers& bf) {
  std::vector<float> h(static_cast<size_t>(bf.args.batch) * bf.args.q_heads * bf.args.q_len);
  CHECK_CUDA(cudaMemcpy(h.data(), bf.lse, h.size() * 4, cudaMemcpyDeviceToHost));
  return h;
}

float bf2f(uint16_t x) {
  uint32_t u = static_cast<uint32_t>(x) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Every element of o and lse against the reference.
void compare(const Case& c, const Buffers& bf, const char* what) {
  const AttentionArgs& a = bf.args;
  const int64_t D = c.D;
  const size_t nref = static_cast<size_t>(c.B) * c.Sq * c.Hq * D;
  std::vector<float> ro(nref), rl(static_cast<size_t>(c.B) * c.Hq * c.Sq);
  CHECK_CUDA(cudaMemcpy(ro.data(), bf.ref_o, nref * 4, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(rl.data(), bf.ref_lse, rl.size() * 4, cudaMemcpyDeviceToHost));
  const std::vector<uint16_t> o = read_o(bf);
  const std::vector<float> l = read_lse(bf);
  double max_o = 0, max_l = 0;
  long bad_o = 0, bad_l = 0;
  for (int b = 0; b < c.B; ++b)
    for (int i = 0; i < c.Sq; ++i)
      for (int h = 0; h < c.Hq; ++h) {
        const size_t li = (static_cast<size_t>(b) * c.Hq + h) * c.Sq + i;
        const float want_l = rl[li], got_l = l[li];
        if (std::isinf(want_l)) {
          if (!(std::isinf(got_l) && got_l < 0)) ++bad_l;
        } else {
          const double e = std::fabs(double(got_l) - want_l);
          if (!(e <= 2e-3 + 1e-4 * std::fabs(want_l))) ++bad_l;
          if (e > max_l || std::isnan(got_l)) max_l = std::isnan(got_l) ? INFINITY : e;
        }
        for (int d = 0; d < D; ++d) {
          const float want = ro[((static_cast<size_t>(b) * c.Sq + i) * c.Hq + h) * D + d];
          const float got = bf2f(o[b * a.o_stride_b + i * a.o_stride_s + h * a.o_stride_h + d]);
          const double e = std::fabs(double(got) - want);
          if (!(e <= 6e-3 + 1e-2 * std::fabs(want))) ++bad_o;
          if (e > max_o || std::isnan(got)) max_o = std::isnan(got) ? INFINITY : e;
        }
      }
  std::printf(
      "  %-10s B=%d Sq=%d Sk=%d Hq=%d Hkv=%d D=%d causal=%d pos0=(%lld,%lld)%s: max|do|=%.2e "
      "max|dlse|=%.2e\n",
      what, c.B, c.Sq, c.Sk, c.Hq, c.Hkv, c.D, c.causal, c.qp0, c.kp0, c.packed ? " packed" : "", max_o,
      max_l);
  EXPECT(bad_o == 0, "%ld elements of o out of tolerance", bad_o);
  EXPECT(bad_l == 0, "%ld elements of lse out of tolerance", bad_l);
}

void run_plain(const Case& c) {
  Buffers bf;
  setup(c, bf);
  poison(bf);
  CHECK_CUDA(launch_attention(bf.args, nullptr));
  CHECK_CUDA(cudaDeviceSynchronize());
  compare(c, bf, "plain");
}

// Keys in three blocks (each at its global position), folded with kStore, kMerge, kMerge.
void run_accumulated(const Case& c) {
  Buffers bf;
  setup(c, bf);
  poison(bf);
  CHECK_CUDA(cudaMemset(bf.o_acc, 0xFF, static_cast<size_t>(c.B) * c.Sq * c.Hq * c.D * 4));
  const int cuts[4] = {0, c.Sk / 3 / 8 * 8, (2 * c.Sk) / 3 / 8 * 8, c.Sk};
  for (int blk = 0; blk < 3; ++blk) {
    AttentionArgs a = bf.args;
    a.kv_len = cuts[blk + 1] - cuts[blk];
    a.k.ptr += cuts[blk] * a.k.stride_s;
    a.v.ptr += cuts[blk] * a.v.stride_s;
    a.k_pos0 = c.kp0 + cuts[blk];
    a.o_acc = bf.o_acc;
    a.acc = blk == 0 ? AttnAccum::kStore : AttnAccum::kMerge;
    a.o = blk == 2 ? bf.o : nullptr;
    CHECK_CUDA(launch_attention(a, nullptr));
  }
  CHECK_CUDA(cudaDeviceSynchronize());
  compare(c, bf, "merged");
}

// Back-to-back launches and graph replays give the direct launch's bits.
void run_repeat(const Case& c) {
  Buffers bf;
  setup(c, bf);
  poison(bf);
  CHECK_CUDA(launch_attention(bf.args, nullptr));
  CHECK_CUDA(cudaDeviceSynchronize());
  const std::vector<uint16_t> o0 = read_o(bf);
  const std::vector<float> l0 = read_lse(bf);
  for (int i = 0; i < 3; ++i) CHECK_CUDA(launch_attention(bf.args, nullptr));
  CHECK_CUDA(cudaDeviceSynchronize());
  EXPECT(read_o(bf) == o0, "back-to-back launches changed o");
  cudaStream_t s;
  CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CHECK_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  CHECK_CUDA(launch_attention(bf.args, s));
  CHECK_CUDA(cudaStreamEndCapture(s, &g));
  CHECK_CUDA(cudaGraphInstantiate(&ge, g, 0));
  for (int r = 0; r < 2; ++r) {
    poison(bf);
    CHECK_CUDA(cudaGraphLaunch(ge, s));
    CHECK_CUDA(cudaStreamSynchronize(s));
    EXPECT(read_o(bf) == o0, "graph replay %d: o differs from the direct launch", r);
    const std::vector<float> l1 = read_lse(bf);
    EXPECT(std::memcmp(l1.data(), l0.data(), l0.size() * 4) == 0, "graph replay %d: lse differs", r);
  }
  CHECK_CUDA(cudaGraphExecDestroy(ge));
  CHECK_CUDA(cudaGraphDestroy(g));
  CHECK_CUDA(cudaStreamDestroy(s));
  std::printf("  repeat     B=%d Sq=%d Sk=%d D=%d causal=%d: back-to-back and graph replay bit-identical\n",
              c.B, c.Sq, c.Sk, c.D, c.causal);
}

void check_rejects() {
  AttentionArgs a;
  a.batch = 1;
  a.q_len = a.kv_len = 8;
  a.q_heads = 4;
  a.kv_heads = 3;
  a.head_dim = 128;
  EXPECT(attention_check(a) != nullptr, "Hq %% Hkv != 0 accepted");
  a.kv_heads = 2;
  a.head_dim = 96;
  EXPECT(attention_check(a) != nullptr, "head_dim 96 accepted");
  EXPECT(launch_attention(a, nullptr) == cudaErrorInvalidValue, "launch of a rejected shape");
}

}  // namespace

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("SKIP: attention_test needs a CUDA GPU; none is visible\n");
    return 77;
  }
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  if (prop.major != 9) {
    std::printf("SKIP: attention_test needs a Hopper GPU (sm_90a); found %s (sm_%d%d)\n", prop.name,
                prop.major, prop.minor);
    return 77;
  }
  if (const char* s = std::getenv("ATTN_TEST_SEED")) g_seed = std::strtoull(s, nullptr, 10);
  check_rejects();
  // B, Sq, Sk, Hq, Hkv, D, causal, q_pos0, k_pos0, packed
  const Case shapes[] = {
      {1, 1, 1, 4, 4, 0, false, 0, 0, false},       {1, 77, 77, 8, 2, 0, false, 0, 0, false},
      {4, 1000, 1000, 8, 1, 0, false, 0, 0, false}, {1, 4099, 4099, 4, 4, 0, false, 0, 0, false},
      {2, 300, 1000, 16, 2, 0, false, 0, 0, false}, {1, 1000, 300, 8, 8, 0, false, 0, 0, false},
      {1, 200, 700, 4, 1, 0, false, 500, 0, false}, {1, 256, 256, 4, 4, 0, false, 0, 300, false},
      {2, 513, 513, 6, 2, 0, false, 0, 0, true},    {4, 128, 2048, 2, 2, 0, false, 0, 0, false},
  };
  for (int d : {64, 128}) {
    for (bool causal : {false, true}) {
      for (Case c : shapes) {
        c.D = d;
        c.causal = causal;
        run_plain(c);
      }
      run_accumulated(Case{2, 700, 1500, 8, 2, d, causal, 800, 0, false});
      run_accumulated(Case{1, 333, 333, 4, 4, d, causal, 0, 0, false});
      run_repeat(Case{2, 1000, 1000, 8, 2, d, causal, 0, 0, false});
    }
  }
  if (g_failures != 0) {
    std::printf("attention_test: %d FAILURES\n", g_failures);
    return 1;
  }
  std::printf("attention_test: all checks passed\n");
  return 0;
}
