// What the bench drivers share on the device side: seeded inputs, an fp32 reference GEMM and
// the per-element comparisons that every driver runs on an op's output before timing it.
// Plain host functions over device pointers (check.cu), so that the .cc drivers need no nvcc.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

namespace fusedcomm::bench {

// n bf16 values uniform in [-1, 1), element i a hash of (seed, i): any rank can rebuild another
// rank's input from its seed. Never zeros: a GEMM of zeros draws less power and runs faster.
void fill_uniform(__nv_bfloat16* p, int64_t n, uint64_t seed, cudaStream_t stream);

// The collectives' check values: element i (the index in the op's full, unsplit tensor) of
// rank r is the small integer ((7 i + 13 r + 5) mod 31) - 15, so that a sum over up to 8 ranks
// is exact in bf16 whatever the order. nccl_bench.py builds the same values.
void fill_pattern(__nv_bfloat16* p, int64_t n, int64_t first_index, int rank, cudaStream_t stream);

// ref (+)= A · op(B) in fp32 (op(B) = Bᵀ for B: N×K, `kn` false; B for K×N, `kn` true), and
// absdot (+)= |A| · |op(B)|, which scales the tolerance; row-major, leading dimensions in
// elements; accumulate into the existing values or overwrite them.
void reference_gemm(const __nv_bfloat16* A, int64_t lda, const __nv_bfloat16* B, int64_t ldb, bool kn, int M,
                    int N, int K, float* ref, float* absdot, bool accumulate, cudaStream_t stream);

// The first mismatch of a comparison, and how many there were (0: the output passed).
struct Mismatch {
  int64_t count = 0;
  int64_t index = -1;
  float got = 0, want = 0;
};

// A bf16 output (M×N, leading dimension ldo) against the reference: element-wise
// |got - want| <= 8e-3 |want| + (2e-5 + partial_rel) absdot + 1e-6 (the output's bf16 rounding,
// the summation order, and partial_rel per unit of absdot for partials rounded before their
// sum). NaN, the poison, always fails. Synchronises `stream`.
Mismatch compare_gemm(const __nv_bfloat16* out, int64_t ldo, const float* ref, const float* absdot, int M,
                      int N, float partial_rel, cudaStream_t stream);

// Every rank's result of one check, gathered through the drivers' process group (`all_gather`
// of byte vectors): the ranks whose check failed, with their first mismatch, the same list on
// every rank.
template <typename Group>
std::vector<std::pair<int, Mismatch>> failed_ranks(Group& g, const Mismatch& mine) {
  std::vector<uint8_t> bytes(sizeof mine);
  std::memcpy(bytes.data(), &mine, sizeof mine);
  const auto all = g.all_gather(bytes);
  std::vector<std::pair<int, Mismatch>> failed;
  for (int p = 0; p < static_cast<int>(all.size()); ++p) {
    Mismatch q;
    std::memcpy(&q, all[p].data(), sizeof q);
    if (q.count != 0) failed.emplace_back(p, q);
  }
  return failed;
}

// Two bf16 arrays bit for bit. Synchronises `stream`.
Mismatch compare_exact(const __nv_bfloat16* got, const __nv_bfloat16* want, int64_t n, cudaStream_t stream);

// A collective's output on rank `rank` of `world` against the values fill_pattern gave every
// rank's input (op: collectives.h's CommOp values 1-4; `count` as CollectiveArgs::count; the
// split rule of collectives.h). Reductions must match exactly. Synchronises `stream`.
Mismatch check_collective(int op, const __nv_bfloat16* out, int64_t count, int world, int rank,
                          cudaStream_t stream);

}  // namespace fusedcomm::bench
