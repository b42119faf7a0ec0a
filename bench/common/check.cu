// Device side of check.h: seeded fills, the fp32 reference GEMM and the comparisons.
#include "bench/common/check.h"

#include <cmath>
#include <stdexcept>
#include <string>

namespace fusedcomm::bench {
namespace {

void ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

__host__ __device__ inline uint64_t mix(uint64_t x) {  // splitmix64's finaliser
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

__host__ __device__ inline float pattern(int64_t i, int rank) {
  return static_cast<float>(static_cast<int>((7 * i + 13 * rank + 5) % 31) - 15);
}

__host__ __device__ inline int64_t split_count(int64_t n, int w, int r) {
  return n / w + (r < n % w ? 1 : 0);
}
__host__ __device__ inline int64_t split_offset(int64_t n, int w, int r) {
  return r * (n / w) + (r < n % w ? r : n % w);
}

__global__ void fill_uniform_kernel(__nv_bfloat16* p, int64_t n, uint64_t seed) {
  const uint64_t key = mix(seed);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const uint64_t x = mix(key ^ static_cast<uint64_t>(i));
    p[i] = __float2bfloat16(static_cast<float>(x >> 40) * (2.0f / 16777216.0f) - 1.0f);
  }
}

__global__ void fill_pattern_kernel(__nv_bfloat16* p, int64_t n, int64_t first, int rank) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    p[i] = __float2bfloat16(pattern(first + i, rank));
  }
}

// 64×64 output tiles, 256 threads of 4×4 outputs each, 16-deep K slices through shared memory.
constexpr int kTile = 64, kSlice = 16;

__global__ void reference_gemm_kernel(const __nv_bfloat16* A, int64_t lda, const __nv_bfloat16* B,
                                      int64_t ldb, bool kn, int M, int N, int K, float* ref, float* absdot,
                                      bool accumulate) {
  __shared__ float as[kSlice][kTile + 1];  // [k][m]
  __shared__ float bs[kSlice][kTile + 1];  // [k][n]
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const int m0 = blockIdx.y * kTile, n0 = blockIdx.x * kTile;
  float acc[4][4] = {}, mag[4][4] = {};
  for (int k0 = 0; k0 < K; k0 += kSlice) {
    for (int e = threadIdx.x; e < kTile * kSlice; e += blockDim.x) {
      const int mm = e / kSlice, kk = e % kSlice, m = m0 + mm, k = k0 + kk;
      as[kk][mm] = m < M && k < K ? __bfloat162float(A[m * lda + k]) : 0.f;
      int nn, kb;
      if (kn) {
        kb = e / kTile, nn = e % kTile;  // K×N: consecutive threads read along n
      } else {
        nn = e / kSlice, kb = e % kSlice;  // N×K: along k
      }
      const int n = n0 + nn, k2 = k0 + kb;
      bs[kb][nn] = n < N && k2 < K ? __bfloat162float(kn ? B[int64_t(k2) * ldb + n] : B[n * ldb + k2]) : 0.f;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kSlice; ++kk) {
      float a[4], b[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) a[i] = as[kk][ty + 16 * i], b[i] = bs[kk][tx + 16 * i];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const float p = a[i] * b[j];
          acc[i][j] += p;
          mag[i][j] += fabsf(p);
        }
      }
    }
    __syncthreads();
  }
  for (int i = 0; i < 4; ++i) {
    for (int j = 0; j < 4; ++j) {
      const int m = m0 + ty + 16 * i, n = n0 + tx + 16 * j;
      if (m >= M || n >= N) continue;
      const int64_t at = int64_t(m) * N + n;
      ref[at] = accumulate ? ref[at] + acc[i][j] : acc[i][j];
      absdot[at] = accumulate ? absdot[at] + mag[i][j] : mag[i][j];
    }
  }
}

struct DeviceMismatch {
  unsigned long long count;
  unsigned long long first;  // smallest failing index (~0: none)
  float got, want;
};

__device__ inline void record(DeviceMismatch* d, int64_t i) {
  atomicAdd(&d->count, 1ull);
  atomicMin(&d->first, static_cast<unsigned long long>(i));
}

__global__ void compare_gemm_kernel(const __nv_bfloat16* out, int64_t ldo, const float* ref,
                                    const float* absdot, int M, int N, float partial_rel, DeviceMismatch* d) {
  const int64_t n = int64_t(M) * N;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = i / N, col = i % N;
    const float got = __bfloat162float(out[row * ldo + col]), want = ref[i];
    const float tol = 8e-3f * fabsf(want) + (2e-5f + partial_rel) * absdot[i] + 1e-6f;
    if (!(fabsf(got - want) <= tol)) record(d, i);  // NaN fails
  }
}

__global__ void compare_exact_kernel(const __nv_bfloat16* got, const __nv_bfloat16* want, int64_t n,
                                     DeviceMismatch* d) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    if (__bfloat16_as_ushort(got[i]) != __bfloat16_as_ushort(want[i])) record(d, i);
  }
}

__host__ __device__ float collective_expected(int op, int64_t count, int world, int rank, int64_t i) {
  switch (op) {
    case 1: {  // allGather: element i belongs to the rank whose block holds it
      const int64_t q = count / world, rem = count % world;
      const int owner =
          i < rem * (q + 1) ? static_cast<int>(i / (q + 1)) : static_cast<int>(rem + (i - rem * (q + 1)) / q);
      return pattern(i, owner);
    }
    case 2:    // reduceScatter: block `rank` of the sum
    case 3: {  // allReduce: the sum
      const int64_t g = op == 2 ? split_offset(count, world, rank) + i : i;
      float s = 0.f;
      for (int p = 0; p < world; ++p) s += pattern(g, p);
      return s;
    }
    default: {  // allToAll: block p of the output is rank p's input block `rank`
      const int64_t c = split_count(count, world, rank);
      const int p = static_cast<int>(i / c);
      return pattern(split_offset(count, world, rank) + i % c, p);
    }
  }
}

__global__ void check_collective_kernel(int op, const __nv_bfloat16* out, int64_t n, int64_t count, int world,
                                        int rank, DeviceMismatch* d) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    if (__bfloat162float(out[i]) != collective_expected(op, count, world, rank, i)) record(d, i);
  }
}

// Runs `launch` with a fresh device record, synchronises, and returns the host view; `values`
// fills in the first mismatch's values.
template <class Launch, class Values>
Mismatch run_compare(cudaStream_t stream, Launch launch, Values values) {
  DeviceMismatch* d = nullptr;
  ok(cudaMalloc(&d, sizeof(DeviceMismatch)), "cudaMalloc");
  const DeviceMismatch init{0, ~0ull, 0.f, 0.f};
  ok(cudaMemcpyAsync(d, &init, sizeof init, cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync");
  launch(d);
  ok(cudaGetLastError(), "compare launch");
  DeviceMismatch h{};
  ok(cudaMemcpyAsync(&h, d, sizeof h, cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync");
  ok(cudaStreamSynchronize(stream), "compare");
  ok(cudaFree(d), "cudaFree");
  Mismatch m;
  m.count = static_cast<int64_t>(h.count);
  if (m.count > 0) {
    m.index = static_cast<int64_t>(h.first);
    values(m);
  }
  return m;
}

float element(const __nv_bfloat16* p, int64_t i) {
  __nv_bfloat16 v;
  ok(cudaMemcpy(&v, p + i, sizeof v, cudaMemcpyDeviceToHost), "cudaMemcpy");
  return __bfloat162float(v);
}

constexpr int kGrid = 1024, kBlock = 256;

}  // namespace

void fill_uniform(__nv_bfloat16* p, int64_t n, uint64_t seed, cudaStream_t stream) {
  if (n <= 0) return;
  fill_uniform_kernel<<<kGrid, kBlock, 0, stream>>>(p, n, seed);
  ok(cudaGetLastError(), "fill_uniform");
}

void fill_pattern(__nv_bfloat16* p, int64_t n, int64_t first_index, int rank, cudaStream_t stream) {
  if (n <= 0) return;
  fill_pattern_kernel<<<kGrid, kBlock, 0, stream>>>(p, n, first_index, rank);
  ok(cudaGetLastError(), "fill_pattern");
}

void reference_gemm(const __nv_bfloat16* A, int64_t lda, const __nv_bfloat16* B, int64_t ldb, bool kn, int M,
                    int N, int K, float* ref, float* absdot, bool accumulate, cudaStream_t stream) {
  const dim3 grid((N + kTile - 1) / kTile, (M + kTile - 1) / kTile);
  reference_gemm_kernel<<<grid, kBlock, 0, stream>>>(A, lda, B, ldb, kn, M, N, K, ref, absdot, accumulate);
  ok(cudaGetLastError(), "reference_gemm");
}

Mismatch compare_gemm(const __nv_bfloat16* out, int64_t ldo, const float* ref, const float* absdot, int M,
                      int N, float partial_rel, cudaStream_t stream) {
  return run_compare(
      stream,
      [&](DeviceMismatch* d) {
        compare_gemm_kernel<<<kGrid, kBlock, 0, stream>>>(out, ldo, ref, absdot, M, N, partial_rel, d);
      },
      [&](Mismatch& m) {
        m.got = element(out, (m.index / N) * ldo + m.index % N);
        ok(cudaMemcpy(&m.want, ref + m.index, sizeof(float), cudaMemcpyDeviceToHost), "cudaMemcpy");
      });
}

Mismatch compare_exact(const __nv_bfloat16* got, const __nv_bfloat16* want, int64_t n, cudaStream_t stream) {
  return run_compare(
      stream, [&](DeviceMismatch* d) { compare_exact_kernel<<<kGrid, kBlock, 0, stream>>>(got, want, n, d); },
      [&](Mismatch& m) {
        m.got = element(got, m.index);
        m.want = element(want, m.index);
      });
}

Mismatch check_collective(int op, const __nv_bfloat16* out, int64_t count, int world, int rank,
                          cudaStream_t stream) {
  const int64_t per = count / world + (rank < count % world ? 1 : 0);
  const int64_t n = op == 1 || op == 3 ? count : op == 2 ? per : per * world;
  return run_compare(
      stream,
      [&](DeviceMismatch* d) {
        check_collective_kernel<<<kGrid, kBlock, 0, stream>>>(op, out, n, count, world, rank, d);
      },
      [&](Mismatch& m) {
        m.got = element(out, m.index);
        m.want = collective_expected(op, count, world, rank, m.index);
      });
}

}  // namespace fusedcomm::bench
