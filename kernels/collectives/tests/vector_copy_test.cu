// vector_copy_test: the collectives' CTA-wide copy and reductions (detail/collective_kernel.cuh:
// cta_copy, cta_reduce, cta_reduce_small) at every offset from the 16-byte grid that a rank's
// segment can have when the count per rank does not split into 16-byte pieces: sources and
// destinations at the same and at different offsets, element counts 0, 1, 7, 8, 9, 1023 and
// 1000003, fp32, bf16 and fp32 sums stored as bf16, one to eight sources, with and without the
// second destination (allReduce's scratch). Every element is checked bit for bit against the
// host (fp32 sums in source order, rounded once), and the bytes around each destination must be
// untouched. One GPU, one CTA per launch; exit 77 without a Hopper GPU.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/collectives/detail/collective_kernel.cuh"
#include "kernels/common/tests/kernel_test_check.h"

namespace fk = fusedcomm::kernels;
using fusedcomm::kernels::testing::g_failures;

namespace {

constexpr int kMaxSrc = 8;
constexpr int64_t kGuard = 64;  // bytes checked on each side of a destination
constexpr uint8_t kPoison = 0xA5;

template <typename T>
struct Srcs {
  const T* p[kMaxSrc];
};

template <typename T, int kUnroll>
__global__ void copy_kernel(T* dst, const T* src, int64_t n) {
  fk::cta_copy<T, kUnroll>(dst, src, n);
}

template <typename T, typename Out>
__global__ void reduce_kernel(Out* dst, T* dst2, Srcs<T> s, int nsrc, int64_t n, bool small) {
  if (small) {
    fk::cta_reduce_small<T, Out>(dst, dst2, s.p, nsrc, n);
  } else {
    fk::cta_reduce<T, 2, Out>(dst, dst2, s.p, nsrc, n);
  }
}

float bf16_to_float(uint16_t b) {
  uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint16_t float_to_bf16(float f) {  // round to nearest even (no NaNs here)
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

template <typename T>
float load_host(const uint8_t* p, int64_t i) {
  if constexpr (sizeof(T) == 4) {
    float f;
    std::memcpy(&f, p + i * 4, 4);
    return f;
  } else {
    uint16_t b;
    std::memcpy(&b, p + i * 2, 2);
    return bf16_to_float(b);
  }
}
template <typename T>
void store_host(uint8_t* p, int64_t i, float v) {
  if constexpr (sizeof(T) == 4) {
    std::memcpy(p + i * 4, &v, 4);
  } else {
    const uint16_t b = float_to_bf16(v);
    std::memcpy(p + i * 2, &b, 2);
  }
}

// Device buffers: kMaxSrc sources, two destinations, each with room for the largest count, the
// largest offset and the guards.
struct Buffers {
  int64_t bytes;
  uint8_t* src[kMaxSrc];
  uint8_t* dst;
  uint8_t* dst2;
  std::vector<uint8_t> host_src[kMaxSrc];
};

bool guards_intact(const std::vector<uint8_t>& h, int64_t begin, int64_t end) {
  for (int64_t i = begin - kGuard; i < begin; ++i)
    if (h[i] != kPoison) return false;
  for (int64_t i = end; i < end + kGuard; ++i)
    if (h[i] != kPoison) return false;
  return true;
}

// cta_copy of n elements from src + so to dst + dof (element offsets).
template <typename T, int kUnroll>
bool check_copy(Buffers& b, int64_t n, int so, int dof) {
  const int64_t es = sizeof(T), d0 = kGuard + dof * es;
  CHECK_CUDA(cudaMemset(b.dst, kPoison, b.bytes));
  copy_kernel<T, kUnroll><<<1, fk::tuning::kCollectiveThreads>>>(
      reinterpret_cast<T*>(b.dst + d0), reinterpret_cast<const T*>(b.src[0]) + so, n);
  CHECK_CUDA(cudaGetLastError());
  CHECK_CUDA(cudaDeviceSynchronize());
  std::vector<uint8_t> h(b.bytes);
  CHECK_CUDA(cudaMemcpy(h.data(), b.dst, b.bytes, cudaMemcpyDeviceToHost));
  const bool ok = std::memcmp(h.data() + d0, b.host_src[0].data() + so * es, n * es) == 0 &&
                  guards_intact(h, d0, d0 + n * es);
  if (!ok)
    std::printf("  copy %zu-byte n=%lld src+%d dst+%d unroll %d: mismatch\n", sizeof(T), (long long)n, so,
                dof, kUnroll);
  return ok;
}

// Reduction of nsrc sources (source s at offset so + (s == 1 ? skew : 0)) into dst + dof and,
// with d2, dst2 + d2off.
template <typename T, typename Out>
bool check_reduce(Buffers& b, int64_t n, int nsrc, int so, int skew, int dof, bool d2, int d2off,
                  bool small) {
  const int64_t es = sizeof(T), eo = sizeof(Out);
  const int64_t d0 = kGuard + dof * eo, e0 = kGuard + d2off * es;
  CHECK_CUDA(cudaMemset(b.dst, kPoison, b.bytes));
  CHECK_CUDA(cudaMemset(b.dst2, kPoison, b.bytes));
  Srcs<T> s{};
  int off[kMaxSrc];
  for (int k = 0; k < nsrc; ++k) {
    off[k] = so + (k == 1 ? skew : 0);
    s.p[k] = reinterpret_cast<const T*>(b.src[k]) + off[k];
  }
  reduce_kernel<T, Out><<<1, fk::tuning::kCollectiveThreads>>>(
      reinterpret_cast<Out*>(b.dst + d0), d2 ? reinterpret_cast<T*>(b.dst2 + e0) : nullptr, s, nsrc, n,
      small);
  CHECK_CUDA(cudaGetLastError());
  CHECK_CUDA(cudaDeviceSynchronize());
  std::vector<uint8_t> h(b.bytes), h2(b.bytes);
  CHECK_CUDA(cudaMemcpy(h.data(), b.dst, b.bytes, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(h2.data(), b.dst2, b.bytes, cudaMemcpyDeviceToHost));
  std::vector<uint8_t> want(n * eo), want2(n * es);
  for (int64_t i = 0; i < n; ++i) {
    float acc = 0.f;
    for (int k = 0; k < nsrc; ++k) acc += load_host<T>(b.host_src[k].data(), off[k] + i);
    store_host<Out>(want.data(), i, acc);
    store_host<T>(want2.data(), i, acc);
  }
  bool ok = std::memcmp(h.data() + d0, want.data(), n * eo) == 0 && guards_intact(h, d0, d0 + n * eo);
  if (d2) {
    ok = ok && std::memcmp(h2.data() + e0, want2.data(), n * es) == 0 && guards_intact(h2, e0, e0 + n * es);
  } else {
    ok = ok && guards_intact(h2, kGuard, kGuard);  // untouched
  }
  if (!ok) {
    std::printf("  reduce %zu->%zu-byte n=%lld nsrc=%d src+%d skew %d dst+%d dst2 %s+%d %s: mismatch\n",
                sizeof(T), sizeof(Out), (long long)n, nsrc, so, skew, dof, d2 ? "on" : "off", d2off,
                small ? "small" : "");
  }
  return ok;
}

}  // namespace

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("SKIP: vector_copy_test needs a CUDA GPU; none is visible here\n");
    return 77;
  }
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  if (prop.major != 9) {
    std::printf("SKIP: vector_copy_test needs a Hopper GPU (sm_90a); found %s\n", prop.name);
    return 77;
  }
  const int64_t counts[] = {0, 1, 7, 8, 9, 1023, 1000003};
  const int64_t max_n = 1000003;
  Buffers b{};
  b.bytes = 2 * kGuard + (max_n + 16) * 4;
  std::mt19937_64 rng(20261129);
  std::uniform_real_distribution<float> val(-4.f, 4.f);
  for (int k = 0; k < kMaxSrc; ++k) {
    // Values exact in bf16 and fp32 (bf16 read as fp32 for the fp32 runs): sums differ per path
    // only if the order or rounding differs.
    b.host_src[k].resize(b.bytes);
    for (int64_t i = 0; i < b.bytes / 4; ++i) {
      const float f = bf16_to_float(float_to_bf16(val(rng)));
      std::memcpy(b.host_src[k].data() + i * 4, &f, 4);
    }
    CHECK_CUDA(cudaMalloc(&b.src[k], b.bytes));
    CHECK_CUDA(cudaMemcpy(b.src[k], b.host_src[k].data(), b.bytes, cudaMemcpyHostToDevice));
  }
  CHECK_CUDA(cudaMalloc(&b.dst, b.bytes));
  CHECK_CUDA(cudaMalloc(&b.dst2, b.bytes));

  int passed = 0, total = 0;
  auto count = [&](bool ok) {
    passed += ok;
    ++total;
    if (!ok) ++g_failures;
  };
  // Copies: source and destination offsets in elements (bf16: 0..7, fp32: 0..3 from the grid).
  const int pairs[][2] = {{0, 0}, {1, 1}, {3, 3}, {1, 0}, {0, 1}, {3, 6}, {7, 2}, {5, 7}};
  for (int64_t n : counts) {
    for (const auto& pr : pairs) {
      count(check_copy<__nv_bfloat16, 8>(b, n, pr[0], pr[1]));
      count(check_copy<__nv_bfloat16, 4>(b, n, pr[0], pr[1]));
      count(check_copy<float, 8>(b, n, pr[0] % 4, pr[1] % 4));
    }
  }
  // Reductions: (source offset, skew of source 1, dst offset, dst2 offset).
  const int cases[][4] = {{0, 0, 0, 0}, {3, 0, 3, 3}, {3, 0, 0, 3}, {1, 0, 6, 1}, {5, 2, 5, 5}, {2, 0, 1, 2}};
  const int nsrcs[] = {1, 2, 3, 8};
  for (int64_t n : counts) {
    for (const auto& c : cases) {
      for (int nsrc : nsrcs) {
        if (nsrc == 1 && c[1] != 0) continue;
        for (int d2 = 0; d2 < 2; ++d2) {
          for (int small = 0; small < 2; ++small) {
            count(check_reduce<__nv_bfloat16, __nv_bfloat16>(b, n, nsrc, c[0], c[1], c[2], d2, c[3], small));
            count(check_reduce<float, float>(b, n, nsrc, c[0] % 4, c[1] % 4, c[2] % 4, d2, c[3] % 4, small));
            count(check_reduce<float, __nv_bfloat16>(b, n, nsrc, c[0] % 4, c[1] % 4, c[2], d2, c[3] % 4,
                                                     small));
          }
        }
      }
    }
  }
  for (int k = 0; k < kMaxSrc; ++k) cudaFree(b.src[k]);
  cudaFree(b.dst);
  cudaFree(b.dst2);
  std::printf("[vector copy] %d/%d copies and reductions bit for bit\n", passed, total);
  std::printf("%s: %d failure(s)\n", g_failures ? "FAILED" : "PASSED", g_failures);
  return g_failures ? 1 : 0;
}
