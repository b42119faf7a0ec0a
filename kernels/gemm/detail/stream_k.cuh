// Stream-K (gemm.h): which (tile, K slice) iterations each CTA computes after the whole waves,
// the partials each segment stores, and the last arriver's sum of a split tile.
#pragma once

#include <cstdint>

#include "kernels/common/sm90_primitives.cuh"
#include "kernels/gemm/detail/gemm_config.cuh"

namespace fusedcomm::kernels::detail {

// float4s of one consumer warpgroup's fragment at BN = 256 (64 × 256 fp32), the slot stride.
inline constexpr int kSkHalfF4 = 64 * 256 / 4;
// Stream-K iterations [sk_bound(c), sk_bound(c + 1)) are CTA c's, for c < G = sk_ctas(): every
// such range is non-empty, so the segments of a tile are CTAs first..last (sk_cta_of), all of
// them (counting CTAs with empty ranges once left tiles without a last segment).
__host__ __device__ __forceinline__ int sk_ctas(int total, int grid) { return min(total, grid); }
__host__ __device__ __forceinline__ int sk_bound(int total, int c, int G) {
  return static_cast<int>(static_cast<int64_t>(total) * c / G);
}
// The CTA whose range holds iteration x: the largest c with sk_bound(c) <= x.
__host__ __device__ __forceinline__ int sk_cta_of(int total, int x, int G) {
  return static_cast<int>((static_cast<int64_t>(x + 1) * G - 1) / total);
}
// Partial slot of CTA c's segment of stream-K tile ts: 2c for the segment holding the CTA's
// first iteration, 2c + 1 for the one after it (a range spans at most two tiles).
__device__ __forceinline__ int sk_slot(int total, int kb, int c, int G, int ts) {
  return 2 * c + (sk_bound(total, c, G) >= ts * kb ? 0 : 1);
}

// CTA c's run of stream-K iterations, [it, end), of G CTAs sharing them (empty for c >= G);
// the producer and the consumers walk the same run, one segment (segment()) at a time.
struct SkRun {
  int it, end, G;
};
__device__ __forceinline__ SkRun sk_run(const GemmProblem& p, int c, int grid) {
  const int total = p.sk_tiles * p.k_blocks, G = sk_ctas(total, grid);
  return c < G ? SkRun{sk_bound(total, c, G), sk_bound(total, c + 1, G), G} : SkRun{0, 0, G};
}
// The segment starting at iteration it (< end): stream-K tile ts, K slices [kb0, kb1).
struct SkSegment {
  int ts, kb0, kb1;
};
__device__ __forceinline__ SkSegment sk_segment(const GemmProblem& p, int it, int end) {
  const int kb = p.k_blocks, ts = it / kb, kb0 = it - ts * kb;
  return {ts, kb0, min(kb, kb0 + (end - it))};
}
// The CTAs whose segments make up stream-K tile ts: first..last, in K order.
__device__ __forceinline__ int sk_first_cta(const GemmProblem& p, int ts, int G) {
  return sk_cta_of(p.sk_tiles * p.k_blocks, ts * p.k_blocks, G);
}
__device__ __forceinline__ int sk_last_cta(const GemmProblem& p, int ts, int G) {
  return sk_cta_of(p.sk_tiles * p.k_blocks, ts * p.k_blocks + p.k_blocks - 1, G);
}
// Consumer thread t of warpgroup cw: its first float4 in CTA c's partial of stream-K tile ts
// (layout [float4 k][thread]: acc[4k..4k+3] of thread t at k * 128 + t, coalesced).
__device__ __forceinline__ float4* sk_partial(const GemmProblem& p, int c, int G, int ts, int cw, int t) {
  const int kb = p.k_blocks;
  return p.sk_partials + (static_cast<size_t>(sk_slot(p.sk_tiles * kb, kb, c, G, ts)) * 2 + cw) * kSkHalfF4 +
         t;
}

// Consumer warpgroup cw of CTA c (of G) has finished its segment of stream-K tile ts in acc,
// whose first `rows` rows are inside M (> 0; warps whose 16 rows are all past M move no data):
// it stores the partial (sk_partial's layout) and counts itself in the tile's counter. Returns
// true for the segment that arrives last (no CTA ever waits, so residency does not matter),
// which resets the counter and must store the tile (sk_sum). Ordering: the
// warpgroup's stores, its named barrier, then thread 0's fence.acq_rel.gpu and relaxed
// atomicAdd (release); the last arriver's atomicAdd reads every earlier one, and its fence
// (acquire) and the barrier order the warpgroup's later loads (sk_sum) after them.
template <int BN>
__device__ __forceinline__ bool sk_arrive(const float (&acc)[BN / 2], const GemmProblem& p, int ts, int c,
                                          int G, int cw, int rows, uint8_t* aux) {
  const int t = threadIdx.x % 128;
  float4* mine = sk_partial(p, c, G, ts, cw, t);
  if ((t / 32) * 16 < rows) {
#pragma unroll
    for (int k = 0; k < BN / 8; ++k) {
      __stcg(mine + k * 128, make_float4(acc[4 * k], acc[4 * k + 1], acc[4 * k + 2], acc[4 * k + 3]));
    }
  }
  const int first = sk_first_cta(p, ts, G), last = sk_last_cta(p, ts, G);
  volatile uint32_t* verdict = reinterpret_cast<volatile uint32_t*>(aux) + cw;
  named_barrier_sync(2 + cw, 128);
  if (t == 0) {
    uint32_t* counter = p.sk_counters + 2 * ts + cw;
    fence_acq_rel_gpu();
    const bool is_last = atomicAdd(counter, 1u) == static_cast<uint32_t>(last - first);
    if (is_last) {
      fence_acq_rel_gpu();
      *counter = 0;  // every segment has counted itself: the next launch starts from zero
    }
    *verdict = is_last ? 1u : 0u;
  }
  named_barrier_sync(2 + cw, 128);
  return *verdict != 0;
}

// The sum reads the partials in units of kSkUnitF4 float4s per thread (32 fp32 of the fragment,
// 16 KiB per warpgroup), copied into a ring of kDepth units per thread in the consumer
// warpgroup's half of the (idle) A/B ring, so that kDepth units per thread are in flight: the
// sum through registers (one unit in flight) was a latency-bound chain of L2 round trips
// (1-7 % of the launch, measured on H200).
inline constexpr int kSkUnitF4 = 8;
inline constexpr uint32_t kSkUnitBytes = kSkUnitF4 * 128 * 16;  // one unit, whole warpgroup
template <class Cfg>
inline constexpr int sk_sum_depth() {
  constexpr uint32_t fit = Cfg::kStages * Cfg::kStageBytes / 2 / kSkUnitBytes;
  return static_cast<int>(fit < 8 ? fit : 8);
}

// The sum's copies: unit v (chunk v / n of segment v % n) into ring slot v % kDepth. Segment
// q > 0 is the first of CTA first + q (slot 2(first + q)); segment 0 may be the first CTA's
// second (slot0 = sk_slot of the first CTA): no division in the loop.
struct SkCopier {
  const float4* part;  // this thread's float4 in partial slot 0 of its warpgroup
  uint32_t ring0;      // this thread's first byte of the ring
  int first, slot0, n, units;
  int v = 0, q = 0, c = 0, fill = 0;  // the next unit to copy: index, segment, chunk, ring slot
  template <int kDepth>
  __device__ __forceinline__ void next() {
    if (v < units) {
      const int slot = q == 0 ? slot0 : 2 * (first + q);
      const float4* src = part + static_cast<size_t>(slot) * 2 * kSkHalfF4 + c * kSkUnitF4 * 128;
      const uint32_t dst = ring0 + fill * kSkUnitBytes;
#pragma unroll
      for (int k = 0; k < kSkUnitF4; ++k) cp_async_cg16(dst + k * 128 * 16, src + k * 128);
      if (++q == n) q = 0, ++c;
      ++v;
    }
    cp_async_commit();  // empty groups keep the count of groups behind each unit fixed
    fill = fill + 1 == kDepth ? 0 : fill + 1;
  }
};

// The last arriver's sum of stream-K tile ts into acc: the segments' partials in K order, so
// the result does not depend on which segment came last and repeats bit for bit. Called after
// the CTA's last wgmma (writing acc between wgmma stages would make ptxas serialise them), and
// after both consumer warpgroups have finished with the A/B ring: `ring` is this warpgroup's
// half of it (kDepth units). Unit v is chunk v / n of segment first + v % n (n segments): each
// thread copies its own unit slots and reads back only those, so no barrier is needed; a slot
// is refilled after the adds that consumed its registers.
template <int BN, int kDepth>
__device__ __forceinline__ void sk_sum(float (&acc)[BN / 2], const GemmProblem& p, int ts, int G, int cw,
                                       int rows, uint8_t* ring) {
  static_assert(kDepth >= 2 && (BN / 2) % (4 * kSkUnitF4) == 0, "sum ring");
  constexpr int kChunks = BN / 2 / (4 * kSkUnitF4);
  const int t = threadIdx.x % 128;
  const int first = sk_first_cta(p, ts, G);
  // Warps whose rows are all past M sum nothing (nothing of theirs is stored).
  const int n = (t / 32) * 16 < rows ? sk_last_cta(p, ts, G) - first + 1 : 0;
  const uint32_t ring0 = smem_u32(ring) + t * 16;
  const int kb = p.k_blocks;
  SkCopier cp{p.sk_partials + cw * kSkHalfF4 + t,         ring0, first,
              sk_slot(p.sk_tiles * kb, kb, first, G, ts), n,     kChunks * n};
#pragma unroll 1
  for (int d = 0; d < kDepth; ++d) cp.next<kDepth>();
  int take = 0;  // slot of the unit to add next
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
#pragma unroll
    for (int i = 0; i < 4 * kSkUnitF4; ++i) acc[c * 4 * kSkUnitF4 + i] = 0.f;
#pragma unroll 1
    for (int q = 0; q < n; ++q) {
      cp_async_wait_keep<kDepth - 1>();
      const uint32_t src = ring0 + take * kSkUnitBytes;
#pragma unroll
      for (int k = 0; k < kSkUnitF4; ++k) {
        const float4 v = lds_f4(src + k * 128 * 16);
        float* a = acc + c * 4 * kSkUnitF4 + 4 * k;
        a[0] += v.x, a[1] += v.y, a[2] += v.z, a[3] += v.w;
      }
      take = take + 1 == kDepth ? 0 : take + 1;
      cp.next<kDepth>();
    }
  }
  cp_async_wait_keep<0>();  // no copy may land in the ring after the sum
}

}  // namespace fusedcomm::kernels::detail
