// The flash-attention forward kernel (attention.h is the contract).
//
// CTA = a producer warpgroup and kWG consumer warpgroups of 64 query rows (2 at head dim 128,
// 3 at 64: tuning.h), one CTA per SM, one query tile of one (batch, head):
//   producer: one thread loads the Q tile once and then, per 128-key block, K and V into a ring
//     of kStages shared-memory stages (TMA, 128-byte swizzle; out-of-bounds rows arrive as
//     zeros). K and V complete on separate barriers, so S = Q·Kᵀ starts before V lands.
//   consumers: per key block, S = Q·Kᵀ (wgmma, both operands in shared memory), the online
//     softmax in fp32 registers (row max over the thread's quad, exp2 with the scale folded in),
//     P rounded to bf16 and kept in registers as wgmma's A operand, O = O·α + P·V (wgmma,
//     V N-major), then the stage is released. The loop (FlashLoop, tuning.h) is pipelined within
//     each warpgroup (S of block n and P·V of block n-1 issued together, the softmax of n under
//     P·V of n-1) with the warpgroups taking turns issuing their matmuls (named barriers), so
//     one's softmax overlaps the others' matmuls.
// Causal: the key blocks past the tile's last visible key are never loaded; masks are applied
// only where a block crosses the diagonal or the key tail (a separate softmax instantiation, so
// the others pay nothing). Tiles are issued longest first.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/attention/detail/wgmma_rs.cuh"
#include "kernels/common/sm90_primitives.cuh"
#include "kernels/common/wgmma_ops.cuh"

namespace fusedcomm::kernels::detail {

// Shared memory, from a 1024-byte aligned base (the 128-byte swizzle repeats every 1024 B):
//   Q            kPanels × kQPanelBytes (kBM rows × 128 B per 64-column panel)
//   K ring       kStages × kKVBytes    (stage s: kPanels panels of 128 keys)
//   V ring       kStages × kKVBytes
//   barriers     q_full, k_full[kStages], v_full[kStages], empty[kStages] (8 B each)
// kWG consumer warpgroups of 64 query rows each (2, or 3 at head dim 64) and a producer
// warpgroup; the register split between them is set with setmaxnreg.
template <int D, int kWG = 2>
struct FlashCfg {
  static_assert(D == 64 || D == 128, "head_dim 64 or 128");
  static_assert(kWG == 2 || (kWG == 3 && D == 64), "3 consumer warpgroups only at head dim 64");
  static constexpr int kThreads = 128 * (kWG + 1);
  static constexpr int kBM = 64 * kWG;            // query rows per CTA
  static constexpr int kBN = 128;                 // keys per block
  static constexpr int kPanels = D / 64;          // 64-column (128-byte) swizzle panels of a row
  static constexpr int kPanelBytes = 128 * 128;   // one K or V panel: 128 keys × 128 B
  static constexpr int kQPanelBytes = kBM * 128;  // one Q panel: kBM rows × 128 B
  static constexpr int kQBytes = kPanels * kQPanelBytes;
  static constexpr int kKVBytes = kPanels * kPanelBytes;  // one of K or V per stage
  static constexpr int kStages = D == 128 ? 3 : 4;
  static constexpr int kBarrierBytes = 8 * (1 + 3 * kStages);
  static constexpr int kSmemBytes = 1024 + kQBytes + 2 * kStages * kKVBytes + kBarrierBytes;
  static constexpr int kProducerRegs = kWG == 2 ? 40 : 32;
  static constexpr int kConsumerRegs = kWG == 2 ? 232 : 160;
  static_assert(128 * kProducerRegs + 128 * kWG * kConsumerRegs <= 65536, "register file over-committed");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory");
};

// The kernel's scalar arguments (by value; the launcher fills them from AttentionArgs).
struct FlashParams {
  __nv_bfloat16* o;          // bf16 output, or null (accumulation without the final rounding)
  int64_t o_sb, o_ss, o_sh;  // o's batch, row and head strides (elements)
  float* lse;                // (natural-log) log-sum-exp, or null with acc == kNone
  float* o_acc;              // running fp32 output (acc != kNone)
  int64_t lse_sb, lse_sh;    // lse's batch and head strides (row stride 1)
  int64_t acc_sb;            // o_acc's batch stride (row stride q_heads · D)
  int acc;                   // AttnAccum
  int q_len, kv_len, q_heads;
  int group;    // q_heads / kv_heads
  int m_tiles;  // query tiles (kBM rows) per (batch, head)
  int causal;
  int delta;  // q_pos0 - k_pos0, clamped to [-(q_len + 1), kv_len + 1]: key j visible to row i iff j <= i + delta
  float scale_log2;  // scale · log2(e)
};
static_assert(sizeof(FlashParams) == 112, "kernel argument layout");

// FlashParams::delta (and the backward's dpos) from a block pair's global positions: q_pos - k_pos
// clamped to [-(q_len + 1), kv_len + 1], where every row sees every key or none, so that it fits
// an int whatever the positions.
inline int flash_causal_delta(int64_t q_pos, int64_t k_pos, int64_t q_len, int64_t kv_len) {
  int64_t delta = q_pos - k_pos;
  if (delta > kv_len + 1) delta = kv_len + 1;
  if (delta < -(q_len + 1)) delta = -(q_len + 1);
  return static_cast<int>(delta);
}

__device__ __forceinline__ void tma_load_4d(void* dst, const CUtensorMap* map, uint64_t* bar, int32_t c0,
                                            int32_t c1, int32_t c2, int32_t c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5, %6}], [%2];" ::"r"(smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_u32(bar)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}

// Arrival on a named barrier without waiting (the bar.sync side waits for `threads` in all).
__device__ __forceinline__ void named_barrier_arrive(uint32_t id, uint32_t threads) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// The keys (from key 0) that query tile m0 needs: all, or up to the last row's diagonal.
__device__ __forceinline__ int flash_tile_keys(const FlashParams& p, int m0, int bm) {
  if (!p.causal) return p.kv_len;
  const int64_t last = static_cast<int64_t>(m0) + bm - 1 + p.delta;  // last visible key of the tile
  return static_cast<int>(last < 0 ? 0 : (last + 1 < p.kv_len ? last + 1 : p.kv_len));
}

// The finished rows of one consumer thread (rows r and r + 8 of its warp's 16) to o / lse, or
// merged into o_acc / lse (attention.h "Accumulation").
template <int D>
__device__ __forceinline__ void flash_epilogue(const FlashParams& p, float (&o)[D / 2], const float (&mx)[2],
                                               const float (&l)[2], int b, int h, int row0, int lane) {
  const int col0 = 2 * (lane % 4);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = row0 + 8 * half;
    const float inv = l[half] > 0.0f ? 1.0f / l[half] : 0.0f;
    // natural-log lse: mx · scale + ln(l) = (mx · scale_log2 + log2(l)) · ln 2
    const float lse_blk =
        l[half] > 0.0f ? (mx[half] * p.scale_log2 + __log2f(l[half])) * 0.69314718055994531f : -INFINITY;
    if (r >= p.q_len) continue;
    const int64_t lse_idx = b * p.lse_sb + h * p.lse_sh + r;
    __nv_bfloat16* orow = p.o == nullptr ? nullptr : p.o + b * p.o_sb + r * p.o_ss + h * p.o_sh;
    if (p.acc == 0) {
      if (orow != nullptr) {
#pragma unroll
        for (int j = 0; j < D / 8; ++j) {
          *reinterpret_cast<uint32_t*>(orow + 8 * j + col0) =
              pack_bf16(o[4 * j + 2 * half] * inv, o[4 * j + 2 * half + 1] * inv);
        }
      }
      if (p.lse != nullptr && lane % 4 == 0) p.lse[lse_idx] = lse_blk;
      continue;
    }
    float* arow = p.o_acc + b * p.acc_sb + (static_cast<int64_t>(r) * p.q_heads + h) * D;
    float w_run = 0.0f, w_blk = 1.0f, lse_new = lse_blk;
    if (p.acc == 2) {
      const float lse_run = p.lse[lse_idx];
      const float m = fmaxf(lse_run, lse_blk);
      if (m == -INFINITY) {
        w_blk = 0.0f;
        lse_new = -INFINITY;
      } else {
        lse_new = m + __logf(__expf(lse_run - m) + __expf(lse_blk - m));
        w_run = __expf(lse_run - lse_new);
        w_blk = __expf(lse_blk - lse_new);
      }
    }
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
      float2 v;
      v.x = w_blk * (o[4 * j + 2 * half] * inv);
      v.y = w_blk * (o[4 * j + 2 * half + 1] * inv);
      float2* ap = reinterpret_cast<float2*>(arow + 8 * j + col0);
      if (p.acc == 2 && w_run != 0.0f) {
        const float2 run = *ap;
        v.x += w_run * run.x;
        v.y += w_run * run.y;
      }
      *ap = v;
      if (orow != nullptr) *reinterpret_cast<uint32_t*>(orow + 8 * j + col0) = pack_bf16(v.x, v.y);
    }
    // The quad's reads of lse[lse_idx] before its write. A quad shares its row, so its four lanes
    // all get here or all skipped the row above.
    __syncwarp(0xFu << (lane & ~3));
    if (lane % 4 == 0) p.lse[lse_idx] = lse_new;
  }
}

// The consumer loop (tuning.h says which one runs where):
//   kLoopPlain      each warpgroup: S, softmax, P·V in turn; the warpgroups overlap only as the
//                   warp schedulers interleave them.
//   kLoopTwoP       pipelined within each warpgroup (S of block n and P·V of block n-1 issued
//                   together, the softmax of n under P·V of n-1), P of consecutive blocks in two
//                   register sets, and the warpgroups taking turns issuing their matmuls (named
//                   barriers), so one's softmax overlaps the others' matmuls.
//   kLoopOneP       the same pipeline with one P: the softmax leaves its exponentials in S's
//                   registers and P is packed from them once P·V of block n-1 has landed (32 fewer
//                   registers, which 3 consumer warpgroups need, at the cost of the packing after
//                   the wait).
enum FlashLoop : int { kLoopPlain = 0, kLoopTwoP = 1, kLoopOneP = 2 };

// The online softmax of one block's S (complete) for rows row0 (s[4j + 0..1]) and row0 + 8
// (s[4j + 2..3]): the new row maxima, alpha (the factor for O and l) and the exponentials,
// packed into pn (kInPlace: false) or left in s (true). kMasked: keys past lim[half] (n0: the
// block's first key) read as -inf through a select, never written back, so that s is not written
// before its maxima are known (a write to a wgmma accumulator while a P·V is in flight can
// serialise the wgmmas); the unmasked version pays nothing for it.
template <int kBN, bool kMasked, bool kInPlace>
__device__ __forceinline__ void flash_softmax(float (&s)[kBN / 2], uint32_t (&pn)[kBN / 16][4],
                                              float (&mx)[2], float (&l)[2], float (&alpha)[2], int n0,
                                              const int (&lim)[2], float sl2, int lane) {
  auto sv = [&](int j, int e, int half) {
    const float x = s[4 * j + 2 * half + e];
    if (!kMasked) return x;
    const int col = n0 + 8 * j + 2 * (lane % 4) + e;
    return col > lim[half] ? -INFINITY : x;
  };
  float mnew[2] = {mx[0], mx[1]};
#pragma unroll
  for (int j = 0; j < kBN / 8; ++j) {
    mnew[0] = fmaxf(mnew[0], fmaxf(sv(j, 0, 0), sv(j, 1, 0)));
    mnew[1] = fmaxf(mnew[1], fmaxf(sv(j, 0, 1), sv(j, 1, 1)));
  }
  float mu[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    mnew[half] = fmaxf(mnew[half], __shfl_xor_sync(0xffffffffu, mnew[half], 1));
    mnew[half] = fmaxf(mnew[half], __shfl_xor_sync(0xffffffffu, mnew[half], 2));
    mu[half] = mnew[half] == -INFINITY ? 0.0f : mnew[half] * sl2;
    alpha[half] = fast_exp2(mx[half] * sl2 - mu[half]);
    mx[half] = mnew[half];
    l[half] *= alpha[half];
  }
#pragma unroll
  for (int j = 0; j < kBN / 8; ++j) {
    const float p0 = fast_exp2(fmaf(sv(j, 0, 0), sl2, -mu[0]));
    const float p1 = fast_exp2(fmaf(sv(j, 1, 0), sl2, -mu[0]));
    const float p2 = fast_exp2(fmaf(sv(j, 0, 1), sl2, -mu[1]));
    const float p3 = fast_exp2(fmaf(sv(j, 1, 1), sl2, -mu[1]));
    l[0] += p0 + p1;
    l[1] += p2 + p3;
    if constexpr (kInPlace) {
      s[4 * j] = p0;
      s[4 * j + 1] = p1;
      s[4 * j + 2] = p2;
      s[4 * j + 3] = p3;
    } else {
      // 16 keys per k-step: chunk 2kk is A's columns 0-7 (regs 0, 1), chunk 2kk+1 columns 8-15.
      pn[j / 2][(j % 2) * 2 + 0] = pack_bf16(p0, p1);
      pn[j / 2][(j % 2) * 2 + 1] = pack_bf16(p2, p3);
    }
  }
}

// The shared memory of one CTA (FlashCfg's layout) and its barriers.
template <int D, int kWG>
struct FlashSmem {
  using C = FlashCfg<D, kWG>;
  uint8_t* sq;
  uint8_t* sk;
  uint8_t* sv;
  uint64_t* q_full;
  uint64_t* k_full;
  uint64_t* v_full;
  uint64_t* empty;
  __device__ __forceinline__ explicit FlashSmem(uint8_t* smem_raw) {
    uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) &
                                               ~static_cast<uintptr_t>(1023));
    sq = smem;
    sk = sq + C::kQBytes;
    sv = sk + C::kStages * C::kKVBytes;
    q_full = reinterpret_cast<uint64_t*>(sv + C::kStages * C::kKVBytes);
    k_full = q_full + 1;
    v_full = k_full + C::kStages;
    empty = v_full + C::kStages;
  }
  // One thread, before the CTA's first tile (then a CTA barrier).
  __device__ __forceinline__ void init() const {
    mbar_init(q_full, 1);
    for (int s = 0; s < C::kStages; ++s) {
      mbar_init(&k_full[s], 1);
      mbar_init(&v_full[s], 1);
      mbar_init(&empty[s], 4 * kWG);  // the consumer warps
    }
    mbar_init_fence();
  }
};

// Where the K/V ring stands: the stage and phase of the next key block. A CTA that runs several
// tiles (the ring's persistent kernel) carries it from one tile to the next, on the producer
// and on the consumers alike (both walk the same blocks).
struct FlashRing {
  int stage = 0;
  uint32_t phase = 0;
  __device__ __forceinline__ void advance(int stages) {
    if (++stage == stages) {
      stage = 0;
      phase ^= 1;
    }
  }
};

// The producer thread's loads of one tile: Q (rows q_row0.., once), then n_blocks blocks of K
// and V from key row k_row0 into the ring. Q's stage must be free (its consumers done with the
// previous tile), q_full's phase is the consumers' business.
template <int D, int kWG>
__device__ __forceinline__ void flash_load_tile(const FlashSmem<D, kWG>& sm, const CUtensorMap* tm_q,
                                                const CUtensorMap* tm_k, const CUtensorMap* tm_v, int q_row0,
                                                int k_row0, int h, int hk, int b, int n_blocks, FlashRing& ring) {
  using C = FlashCfg<D, kWG>;
  mbar_arrive_expect_tx(sm.q_full, C::kQBytes);
#pragma unroll
  for (int pn = 0; pn < C::kPanels; ++pn)
    tma_load_4d(sm.sq + pn * C::kQPanelBytes, tm_q, sm.q_full, pn * 64, h, q_row0, b);
  for (int nb = 0; nb < n_blocks; ++nb) {
    const int stage = ring.stage;
    mbar_wait(&sm.empty[stage], ring.phase ^ 1);
    mbar_arrive_expect_tx(&sm.k_full[stage], C::kKVBytes);
#pragma unroll
    for (int pn = 0; pn < C::kPanels; ++pn) {
      tma_load_4d(sm.sk + stage * C::kKVBytes + pn * C::kPanelBytes, tm_k, &sm.k_full[stage], pn * 64, hk,
                  k_row0 + nb * C::kBN, b);
    }
    mbar_arrive_expect_tx(&sm.v_full[stage], C::kKVBytes);
#pragma unroll
    for (int pn = 0; pn < C::kPanels; ++pn) {
      tma_load_4d(sm.sv + stage * C::kKVBytes + pn * C::kPanelBytes, tm_v, &sm.v_full[stage], pn * 64, hk,
                  k_row0 + nb * C::kBN, b);
    }
    ring.advance(C::kStages);
  }
}

// One consumer thread's part of one tile (rows m0.. of p's query rows, n_blocks key blocks):
// o, mx, l as the epilogue takes them (l summed over the quad). q_phase: q_full's phase for
// this tile (tiles with n_blocks == 0 load nothing and do not count).
template <int D, int kWG, int kLoop>
__device__ __forceinline__ void flash_consume_tile(const FlashParams& p, const FlashSmem<D, kWG>& sm, int m0,
                                                   int row0, int n_blocks, uint32_t q_phase, FlashRing& ring,
                                                   float (&o)[D / 2], float (&mx)[2], float (&l)[2]) {
  using C = FlashCfg<D, kWG>;
  constexpr int kBN = C::kBN, kStages = C::kStages;
  const int wg = threadIdx.x / 128;
  const int cw = wg - 1;
  const int t = threadIdx.x % 128;
  const int lane = t % 32;
#pragma unroll
  for (int i = 0; i < D / 2; ++i) o[i] = 0.0f;
  mx[0] = mx[1] = -INFINITY;
  l[0] = l[1] = 0.0f;

  if (n_blocks > 0) {
    uint64_t* const k_full = sm.k_full;
    uint64_t* const v_full = sm.v_full;
    uint64_t* const empty = sm.empty;
    mbar_wait(sm.q_full, q_phase);
    const uint32_t q_base = smem_u32(sm.sq) + cw * 64 * 128;
    const uint32_t k_base = smem_u32(sm.sk);
    const uint32_t v_base = smem_u32(sm.sv);
    // The rows' last visible keys (inclusive), relative to key 0.
    int lim[2];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int64_t d = p.causal ? static_cast<int64_t>(row0 + 8 * half) + p.delta : INT32_MAX;
      lim[half] = static_cast<int>(d < p.kv_len - 1 ? d : p.kv_len - 1);
    }
    const float sl2 = p.scale_log2;
    float s[kBN / 2];
    float alpha[2];

    // S = Q·K(stage)ᵀ, issued (one wgmma group), not waited for.
    auto issue_s = [&](int stage) {
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        const uint32_t koff = (kk / 4) * C::kPanelBytes + (kk % 4) * 32;
        const uint32_t qoff = (kk / 4) * C::kQPanelBytes + (kk % 4) * 32;
        const uint64_t da = smem_desc_sw128(q_base + qoff, 16, 1024);
        const uint64_t db = smem_desc_sw128(k_base + stage * C::kKVBytes + koff, 16, 1024);
        wgmma_m64n128k16<0>(s, da, db, kk > 0 ? 1 : 0);
      }
      wgmma_commit();
    };
    // O += P·V(stage), issued (one wgmma group), not waited for.
    auto issue_pv = [&](int stage, const uint32_t(&pp)[kBN / 16][4]) {
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kBN / 16; ++kk) {
        // V N-major: 64-column slabs kPanelBytes apart (LBO), 8-key groups 1024 B apart (SBO),
        // 16 keys = 2048 B per k-step.
        const uint64_t db = smem_desc_sw128(v_base + stage * C::kKVBytes + kk * 2048, C::kPanelBytes, 1024);
        if constexpr (D == 128) {
          wgmma_m64n128k16_rs_tn(o, pp[kk], db, 1);
        } else {
          wgmma_m64n64k16_rs_tn(o, pp[kk], db, 1);
        }
      }
      wgmma_commit();
    };
    // The softmax of block nb's S (flash_softmax), masked only where the block crosses the
    // diagonal or the key tail: P packed into pn (softmax) or the exponentials left in s
    // (softmax_kept).
    auto block_masked = [&](int n0) {
      return n0 + kBN > p.kv_len ||
             (p.causal && static_cast<int64_t>(n0) + kBN - 1 > static_cast<int64_t>(m0) + p.delta);
    };
    auto softmax = [&](int nb, uint32_t(&pn)[kBN / 16][4]) {
      reg_fence(s);
      const int n0 = nb * kBN;
      if (block_masked(n0)) {
        flash_softmax<kBN, true, false>(s, pn, mx, l, alpha, n0, lim, sl2, lane);
      } else {
        flash_softmax<kBN, false, false>(s, pn, mx, l, alpha, n0, lim, sl2, lane);
      }
    };
    auto softmax_kept = [&](int nb, uint32_t(&unused)[kBN / 16][4]) {
      reg_fence(s);
      const int n0 = nb * kBN;
      if (block_masked(n0)) {
        flash_softmax<kBN, true, true>(s, unused, mx, l, alpha, n0, lim, sl2, lane);
      } else {
        flash_softmax<kBN, false, true>(s, unused, mx, l, alpha, n0, lim, sl2, lane);
      }
    };
    // P from the exponentials left in s (kLoopOneP).
    auto pack_p = [&](uint32_t(&pn)[kBN / 16][4]) {
#pragma unroll
      for (int j = 0; j < kBN / 8; ++j) {
        pn[j / 2][(j % 2) * 2 + 0] = pack_bf16(s[4 * j], s[4 * j + 1]);
        pn[j / 2][(j % 2) * 2 + 1] = pack_bf16(s[4 * j + 2], s[4 * j + 3]);
      }
    };
    auto rescale_o = [&] {
#pragma unroll
      for (int j = 0; j < D / 8; ++j) {
        o[4 * j] *= alpha[0];
        o[4 * j + 1] *= alpha[0];
        o[4 * j + 2] *= alpha[1];
        o[4 * j + 3] *= alpha[1];
      }
    };

    if constexpr (kLoop == kLoopPlain) {
      uint32_t pa[kBN / 16][4];
      int stage = ring.stage;
      uint32_t phase = ring.phase;
      for (int nb = 0; nb < n_blocks; ++nb) {
        mbar_wait(&k_full[stage], phase);
        issue_s(stage);
        wgmma_wait<0>();
        softmax(nb, pa);
        rescale_o();
        mbar_wait(&v_full[stage], phase);
        issue_pv(stage, pa);
        wgmma_wait<0>();
        reg_fence(o);
        if (lane == 0) mbar_arrive(&empty[stage]);
        if (++stage == kStages) {
          stage = 0;
          phase ^= 1;
        }
      }
      ring.stage = stage;
      ring.phase = phase;
    } else {
      // Turns on the tensor cores: warpgroup c waits at named barrier 2 + c for the previous
      // one's arrival and hands on to the next (2 + (c + 1) mod kWG); the last warpgroup gives
      // warpgroup 0 its first turn.
      const uint32_t my_turn = 2 + cw;
      const uint32_t next_turn = 2 + (cw + 1 == kWG ? 0 : cw + 1);
      // Software pipeline (per warpgroup): block nb's S = Q·Kᵀ and block nb-1's O += P·V are in
      // flight together; the softmax of S(nb) runs while P·V(nb-1) still occupies the tensor
      // cores. O is rescaled by block nb's alpha only after P·V(nb-1) has landed.
      uint32_t pa[kBN / 16][4];
      uint32_t pb[kLoop == kLoopTwoP ? kBN / 16 : 1][4];
      int stage = ring.stage;  // block nb - 1's stage
      uint32_t phase = ring.phase;
      auto step = [&](int nb, const uint32_t(&p_prev)[kBN / 16][4], uint32_t(&p_this)[kBN / 16][4]) {
        const int next = stage + 1 == kStages ? 0 : stage + 1;
        const uint32_t next_phase = next == 0 ? phase ^ 1 : phase;
        mbar_wait(&k_full[next], next_phase);
        named_barrier_sync(my_turn, 256);  // this warpgroup's turn
        issue_s(next);
        mbar_wait(&v_full[stage], phase);
        issue_pv(stage, p_prev);
        named_barrier_arrive(next_turn, 256);  // the next one's turn
        wgmma_wait<1>();                       // S(nb) complete; P·V(nb-1) may still run
        if constexpr (kLoop == kLoopTwoP) {
          softmax(nb, p_this);
        } else {
          softmax_kept(nb, p_this);
        }
        wgmma_wait<0>();  // P·V(nb-1) complete: stage free, O ready to rescale
        reg_fence(o);
        if (lane == 0) mbar_arrive(&empty[stage]);
        if constexpr (kLoop == kLoopOneP) pack_p(p_this);
        rescale_o();
        stage = next;
        phase = next_phase;
      };
      mbar_wait(&k_full[stage], phase);
      issue_s(stage);
      wgmma_wait<0>();
      softmax(0, pa);
      if (cw == kWG - 1) named_barrier_arrive(2, 256);  // warpgroup 0 starts
      int nb = 1;
      bool in_pb = false;  // the latest P is in pb (kLoopTwoP)
      if constexpr (kLoop == kLoopTwoP) {
        for (; nb + 1 < n_blocks; nb += 2) {
          step(nb, pa, pb);
          step(nb + 1, pb, pa);
        }
        in_pb = nb < n_blocks;  // one block left: its P ends in pb
        if (in_pb) step(nb, pa, pb);
      } else {
        for (; nb < n_blocks; ++nb) step(nb, pa, pa);
      }
      mbar_wait(&v_full[stage], phase);
      named_barrier_sync(my_turn, 256);
      if constexpr (kLoop == kLoopTwoP) {
        if (in_pb) {
          issue_pv(stage, pb);
        } else {
          issue_pv(stage, pa);
        }
      } else {
        issue_pv(stage, pa);
      }
      // The last warpgroup's last turn hands nothing on: every sync above has its arrival.
      if (cw != kWG - 1) named_barrier_arrive(next_turn, 256);
      wgmma_wait<0>();
      reg_fence(o);
      if (lane == 0) mbar_arrive(&empty[stage]);
      ring.stage = stage;
      ring.phase = phase;
      ring.advance(kStages);
    }
  }
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    l[half] += __shfl_xor_sync(0xffffffffu, l[half], 1);
    l[half] += __shfl_xor_sync(0xffffffffu, l[half], 2);
  }
}

// kWG consumer warpgroups (FlashCfg), kLoop the consumer loop (FlashLoop).
template <int D, int kWG, int kLoop>
__global__ void __launch_bounds__(128 * (kWG + 1), 1)
    flash_fwd_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                     const __grid_constant__ CUtensorMap tm_v, const FlashParams p) {
  using C = FlashCfg<D, kWG>;
  constexpr int kBM = C::kBM, kBN = C::kBN;
  extern __shared__ __align__(128) uint8_t smem_raw[];
  const FlashSmem<D, kWG> sm(smem_raw);

  const int m_tile = p.causal ? p.m_tiles - 1 - static_cast<int>(blockIdx.x) : static_cast<int>(blockIdx.x);
  const int h = blockIdx.y;
  const int b = blockIdx.z;
  const int hk = h / p.group;
  const int m0 = m_tile * kBM;
  const int n_keys = flash_tile_keys(p, m0, kBM);
  const int n_blocks = (n_keys + kBN - 1) / kBN;

  if (threadIdx.x == 0) {
    sm.init();
  } else if (threadIdx.x == 32) {
    tma_prefetch_desc(&tm_q);
    tma_prefetch_desc(&tm_k);
    tma_prefetch_desc(&tm_v);
  }
  __syncthreads();

  const int wg = threadIdx.x / 128;
  FlashRing ring;
  if (wg == 0) {
    // ---------------- producer ----------------
    setmaxnreg_dec<C::kProducerRegs>();
    if (threadIdx.x != 0 || n_blocks == 0) return;
    flash_load_tile<D, kWG>(sm, &tm_q, &tm_k, &tm_v, m0, 0, h, hk, b, n_blocks, ring);
    return;
  }

  // ---------------- consumers ----------------
  setmaxnreg_inc<C::kConsumerRegs>();
  const int cw = wg - 1;
  const int t = threadIdx.x % 128;
  const int warp = t / 32;
  const int lane = t % 32;
  const int row0 = m0 + cw * 64 + warp * 16 + lane / 4;  // and row0 + 8
  float o[D / 2];
  float mx[2], l[2];
  flash_consume_tile<D, kWG, kLoop>(p, sm, m0, row0, n_blocks, 0, ring, o, mx, l);
  flash_epilogue<D>(p, o, mx, l, b, h, row0, lane);
}

}  // namespace fusedcomm::kernels::detail
