// The flash-attention backward kernels (attention_bwd.h is the contract).
//
// The dK/dV pass, and dQ either from a second pass or added into fp32 by the first:
//   dK/dV pass: a CTA per 128 keys of one (batch, K/V head). Warpgroup 0 is the producer: one
//     thread loads K and V once and then, per block of kBM queries of each query head of the
//     group, Q and dO into a ring of stages (TMA, 128-byte swizzle); another warp stages the
//     block's lse (as log2) and δ. Warpgroups 1 and 2 own 64 keys each and keep dK, dV in fp32
//     registers: Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ (wgmma, both operands in shared memory, committed
//     apart), Pᵀ = exp2(Sᵀ·scale·log2e - lse2) while dPᵀ is still computed, dSᵀ = Pᵀ·(dPᵀ - δ)
//     in registers, dV += Pᵀ·dO (issued before dSᵀ is computed where the registers allow) and
//     dK += dSᵀ·Q (wgmma with Pᵀ, dSᵀ as register A operands, dO and Q N-major).
//   dQ pass: a CTA per 128 query rows of one (batch, head), keys streamed as in the forward:
//     S = Q·Kᵀ and dP = dO·Vᵀ (wgmma; P from S while dP is computed), dS in registers,
//     dQ += dS·K (register A, K N-major).
//     It recomputes S and dP (7 matmuls in all instead of 5) in exchange for exclusive outputs:
//     no atomics, the same bits every run (the accumulate mode is a read-add-write).
//   dQ in the dK/dV pass (kDqRed, kDqTma): dS stored transposed (stmatrix) into shared memory,
//     the warpgroups meet (dV runs meanwhile), each computes dQ = dS·K for half of the columns
//     over all 128 keys, and adds it into fp32 (dK runs meanwhile): with per-thread vector
//     reductions, or staged in shared memory and added by one thread's TMA reduce-add per
//     64 × 32 box. Atomic per element, in no fixed order.
// Causal: the blocks no row of the tile sees are never loaded; masks only where a block crosses
// the diagonal (and, in the dQ pass, the key tail). Rows past the query tail get lse2 = +inf
// (P = 0); key rows past the tail compute values that are never stored.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/attention/detail/flash_fwd.cuh"
#include "kernels/attention/detail/wgmma_rs.cuh"
#include "kernels/common/sm90_primitives.cuh"
#include "kernels/common/wgmma_ops.cuh"

namespace fusedcomm::kernels::detail {

// D(64×64, fp32) (+)= A(64×16, smem desc, K-major) · B(16×64, smem desc); kTransB = 1: B is N-major.
template <int kTransB = 0>
__device__ __forceinline__ void wgmma_m64n64k16_ss(float (&d)[32], uint64_t desc_a, uint64_t desc_b,
                                                   int scale_d) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, "
      "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "%32, %33, p, 1, 1, 0, %35;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]),
        "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
        "+f"(d[30]), "+f"(d[31])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(kTransB));
}

// D(64×32, fp32) (+)= A(64×16, smem desc, K-major) · B(16×32, smem desc, N-major).
__device__ __forceinline__ void wgmma_m64n32k16_ss_tn(float (&d)[16], uint64_t desc_a, uint64_t desc_b,
                                                      int scale_d) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
      "%16, %17, p, 1, 1, 0, 1;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}

// Four 8×8 bf16 matrices from the mma accumulator fragment (r[i]: matrix i), each stored
// transposed; lane l gives the shared address of row l % 8 of matrix l / 8 (after transposing).
__device__ __forceinline__ void stmatrix_x4_trans(uint32_t addr, const uint32_t (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(addr),
               "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3])
               : "memory");
}

__device__ __forceinline__ void red_add_f32x2(float* p, float a, float b) {
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};" ::"l"(p), "f"(a), "f"(b) : "memory");
}

// A box of shared memory added element-wise into a 4-D fp32 tensor (bulk group; atomic per
// element, no order between operations; parts of the box outside the tensor are dropped).
__device__ __forceinline__ void tma_reduce_add_4d(const CUtensorMap* map, uint32_t src, int32_t c0,
                                                  int32_t c1, int32_t c2, int32_t c3) {
  asm volatile(
      "cp.reduce.async.bulk.tensor.4d.global.shared::cta.add.tile.bulk_group [%0, {%2, %3, %4, %5}], [%1];" ::
          "l"(reinterpret_cast<uint64_t>(map)),
      "r"(src), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}

// Where the dK/dV pass leaves dQ: to the separate dQ pass (kDqPass), or adds it into fp32 itself,
// with per-thread vector reductions (kDqRed) or, staged in shared memory, with a TMA
// reduce-add per 64 rows × 32 columns issued by one thread of each consumer warpgroup (kDqTma).
enum BwdDq : int { kDqPass = 0, kDqRed = 1, kDqTma = 2 };

// D(64×D) += A(64×16 registers) · B(16×D smem, N-major), D = 64 or 128.
template <int D>
__device__ __forceinline__ void wgmma_rs_n(float (&d)[D / 2], const uint32_t (&a)[4], uint64_t desc_b) {
  if constexpr (D == 128) {
    wgmma_m64n128k16_rs_tn(d, a, desc_b, 1);
  } else {
    wgmma_m64n64k16_rs_tn(d, a, desc_b, 1);
  }
}

// D(64×N) = A(64×16 smem, K-major) · B(16×N smem, K-major), N = 64 or 128.
template <int N>
__device__ __forceinline__ void wgmma_ss_n(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, int scale_d) {
  if constexpr (N == 128) {
    wgmma_m64n128k16<0>(d, desc_a, desc_b, scale_d);
  } else {
    wgmma_m64n64k16_ss(d, desc_a, desc_b, scale_d);
  }
}

// The scalar arguments of both passes (by value; the launcher fills them from AttentionBwdArgs).
struct BwdParams {
  void* dq;
  void* dk;
  void* dv;
  int64_t dq_sb, dq_ss, dq_sh;
  int64_t dk_sb, dk_ss, dk_sh;
  int64_t dv_sb, dv_ss, dv_sh;
  const float* lse;
  const float* delta;
  int64_t lse_sb, lse_sh;
  int64_t dl_sb, dl_sh;
  int add;  // AttnGradMode: 0 bf16 store, 1 fp32 add
  int q_len, kv_len, q_heads;
  int group;  // q_heads / kv_heads
  int tiles;  // 128-row tiles of the pass's own rows (dQ: queries, dK/dV: keys)
  int causal;
  int dpos;  // q_pos0 - k_pos0, clamped to [-(q_len + 1), kv_len + 1]: key j visible to row i iff j <= i + dpos
  float scale;
  float scale_log2;  // scale · log2(e)
};

// lse (natural log) as log2, +inf where the row saw no key or is past the tail: P = exp2(x - lse2) = 0.
__device__ __forceinline__ float bwd_lse2(const BwdParams& p, int b, int h, int row) {
  if (row >= p.q_len) return INFINITY;
  const float l = p.lse[b * p.lse_sb + h * p.lse_sh + row];
  return l == -INFINITY ? INFINITY : l * 1.4426950408889634f;
}
__device__ __forceinline__ float bwd_delta(const BwdParams& p, int b, int h, int row) {
  return row < p.q_len ? p.delta[b * p.dl_sb + h * p.dl_sh + row] : 0.0f;
}

// Where the dK/dV pass stages query column c (of kBM) of a step's lse2 and δ: the kBM / 4 columns a
// consumer thread reads (8j + 2·(lane % 4) + e, its accumulator columns) side by side, so that it
// reads them with 16-byte loads (a quad's four threads kBM bytes apart: two of them share banks).
template <int kBM>
__device__ __forceinline__ int bwd_ld_slot(int c) {
  return ((c % 8) / 2) * (kBM / 4) + (c / 8) * 2 + c % 2;
}
// One consumer thread's rows (row0 and row0 + 8 of its warp's 16) of a 64×D fp32 accumulator, times
// `mul`, stored as bf16 or added into fp32 (p.add), at (b, row, h) of a (B, S, H, D) tensor.
template <int D>
__device__ __forceinline__ void bwd_store_rows(void* base, int64_t sb, int64_t ss, int64_t sh, int add,
                                               const float (&acc)[D / 2], float mul, int b, int h, int row0,
                                               int limit, int lane) {
  const int col0 = 2 * (lane % 4);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = row0 + 8 * half;
    if (r >= limit) continue;
    const int64_t off = b * sb + static_cast<int64_t>(r) * ss + h * sh;
    if (add) {
      float* row = static_cast<float*>(base) + off;
#pragma unroll
      for (int j = 0; j < D / 8; ++j) {
        float2* ap = reinterpret_cast<float2*>(row + 8 * j + col0);
        float2 v = *ap;
        v.x += mul * acc[4 * j + 2 * half];
        v.y += mul * acc[4 * j + 2 * half + 1];
        *ap = v;
      }
    } else {
      __nv_bfloat16* row = static_cast<__nv_bfloat16*>(base) + off;
#pragma unroll
      for (int j = 0; j < D / 8; ++j) {
        *reinterpret_cast<uint32_t*>(row + 8 * j + col0) =
            pack_bf16(mul * acc[4 * j + 2 * half], mul * acc[4 * j + 2 * half + 1]);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// dK/dV pass. Shared memory from a 1024-byte aligned base:
//   K, V       kPanels × 16 KiB each (128 keys × 128 B per 64-column panel)
//   Q ring     kStages × kPanels × kBM · 128 B (kBM query rows per panel), dO ring the same
//   dS         (dQ here) 2 buffers × 2 panels of kBM rows × 128 B
//   dQ staging (kDqTma) 2 warpgroups × kDqBoxes × 8 KiB
//   lse2, δ    kStages × kBM floats each
//   barriers   kv_full, q_full[kStages], do_full[kStages], ld_full[kStages], empty[kStages]
template <int D, int kDq>
struct BwdKVCfg {
  static constexpr bool kFusedDq = kDq != kDqPass;
  static_assert(D == 64 || D == 128, "head_dim 64 or 128");
  static constexpr int kBN = 128;  // keys per CTA (2 consumer warpgroups × 64)
  // Query rows per step: 64 at head dim 128 (dK, dV, S and dP fill the registers); 128 at 64,
  // where the registers allow it: twice the matmuls' width (and the exponentials of twice the rows
  // under dPᵀ) ran 1.16-1.17 × as fast as 64 rows (S = 4k-16k). The vector-reduction variant
  // keeps 64 (its dQ is one 64-row block).
  static constexpr int kBM = D == 64 && kDq != kDqRed ? 128 : 64;
  static constexpr int kMH = kBM / 64;  // 64-row halves of a step's dS and dQ
  // dV issued before dS is computed: Pᵀ in bf16 beside Pᵀ and dPᵀ in fp32 fits the registers at
  // 64 query rows, not at 128 (the wgmma would be serialized).
  static constexpr bool kEarlyDv = kBM == 64;
  // lse2 and δ staged in bwd_ld_slot's order and read 16 bytes at a time (64 query rows); at 128 rows
  // the registers do not allow it (spills), and they are read one by one in column order.
  static constexpr bool kLdSlots = kBM == 64;
  // The dQ staging's stores without bank conflicts (kDqTma; see the consumer). Head dim 128 only:
  // at 64 the change spills and did not beat the plain order.
  static constexpr bool kStagePair = D == 128;
  static constexpr int kPanels = D / 64;
  static constexpr int kKPanelBytes = 128 * 128;
  static constexpr int kQPanelBytes = kBM * 128;
  static constexpr int kKBytes = kPanels * kKPanelBytes;
  static constexpr int kQBytes = kPanels * kQPanelBytes;
  // Stages of Q and dO: what shared memory leaves beside dS and the dQ staging.
  static constexpr int kStages = !kFusedDq ? 4 : D == 128 ? 3 : kBM == 128 ? 2 : 4;
  static constexpr int kLdFloats = 2 * kBM;  // lse2 then δ
  // With the dQ in this pass: dS (kBM query rows × 128 keys, two 64-key panels, one per consumer
  // warpgroup), double-buffered.
  static constexpr int kDsBytes = kFusedDq ? 2 * 2 * kQPanelBytes : 0;
  // kDqTma: each warpgroup's kBM rows × D/2 columns of dQ in fp32, as 64-row × 32-column boxes of
  // 8 KiB (128-byte swizzled rows, the TMA map's layout), column boxes first.
  static constexpr int kDqBoxBytes = 64 * 128;
  static constexpr int kDqColBoxes = D / 2 / 32;
  static constexpr int kDqBoxes = kDqColBoxes * kMH;  // per warpgroup
  static constexpr int kDqStageBytes = kDq == kDqTma ? 2 * kDqBoxes * kDqBoxBytes : 0;
  static constexpr int kBarrierBytes = 8 * (1 + 4 * kStages);
  static constexpr int kSmemBytes =
      1024 + 2 * kKBytes + kStages * (2 * kQBytes + kLdFloats * 4) + kDsBytes + kDqStageBytes + kBarrierBytes;
  static constexpr int kProducerRegs = 24;
  static constexpr int kConsumerRegs = 240;
  static_assert(kSmemBytes <= 227 * 1024, "shared memory");
};

template <int D, int kDq>
__global__ void __launch_bounds__(384, 1)
    flash_bwd_dkdv_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                          const __grid_constant__ CUtensorMap tm_v, const __grid_constant__ CUtensorMap tm_do,
                          const __grid_constant__ CUtensorMap tm_dq, const BwdParams p) {
  using C = BwdKVCfg<D, kDq>;
  constexpr bool kFusedDq = C::kFusedDq;
  constexpr int kBM = C::kBM, kStages = C::kStages;
  extern __shared__ __align__(128) uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) &
                                             ~static_cast<uintptr_t>(1023));
  uint8_t* sk = smem;
  uint8_t* sv = sk + C::kKBytes;
  uint8_t* sq = sv + C::kKBytes;
  uint8_t* sdo = sq + kStages * C::kQBytes;
  uint8_t* sds = sdo + kStages * C::kQBytes;  // kFusedDq: dS buffers
  uint8_t* sdq = sds + C::kDsBytes;           // kDqTma: dQ staging, 1024-byte aligned
  float* sld = reinterpret_cast<float*>(sdq + C::kDqStageBytes);
  uint64_t* kv_full = reinterpret_cast<uint64_t*>(sld + kStages * C::kLdFloats);
  uint64_t* q_full = kv_full + 1;
  uint64_t* do_full = q_full + kStages;
  uint64_t* ld_full = do_full + kStages;
  uint64_t* empty = ld_full + kStages;

  const int n_tile = blockIdx.x;
  const int hk = blockIdx.y;
  const int b = blockIdx.z;
  const int n0 = n_tile * C::kBN;
  // The query blocks that see a key of this tile: from the first row whose diagonal reaches n0.
  const int m_blocks = (p.q_len + kBM - 1) / kBM;
  int mb0 = 0;
  if (p.causal) {
    const int first = n0 - p.dpos;  // no overflow: dpos is clamped
    if (first > 0) mb0 = first / kBM;
  }
  const int per_head = mb0 < m_blocks ? m_blocks - mb0 : 0;
  const int iters = per_head * p.group;
  // Step it: query head hk · group + it / per_head, query block from mb0, rotated by the tile so
  // that the tiles of one head do not all add into the same dQ rows at once.
  const int rot = per_head > 0 ? n_tile % per_head : 0;
  auto step_head = [&](int it) { return hk * p.group + it / per_head; };
  auto step_m0 = [&](int it) {
    int r = it % per_head + rot;
    if (r >= per_head) r -= per_head;
    return (mb0 + r) * kBM;
  };

  if (threadIdx.x == 0) {
    mbar_init(kv_full, 1);
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&q_full[s], 1);
      mbar_init(&do_full[s], 1);
      mbar_init(&ld_full[s], 32);
      mbar_init(&empty[s], 8);  // the 8 consumer warps
    }
    mbar_init_fence();
  } else if (threadIdx.x == 32) {
    tma_prefetch_desc(&tm_q);
    tma_prefetch_desc(&tm_k);
    tma_prefetch_desc(&tm_v);
    tma_prefetch_desc(&tm_do);
    if constexpr (kDq == kDqTma) tma_prefetch_desc(&tm_dq);
  }
  __syncthreads();

  const int wg = threadIdx.x / 128;
  if (wg == 0) {
    // ---------------- producer ----------------
    setmaxnreg_dec<C::kProducerRegs>();
    const int warp = threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (iters == 0 || warp > 1 || (warp == 0 && lane != 0)) return;
    if (warp == 0) {
      mbar_arrive_expect_tx(kv_full, 2 * C::kKBytes);
#pragma unroll
      for (int pn = 0; pn < C::kPanels; ++pn) {
        tma_load_4d(sk + pn * C::kKPanelBytes, &tm_k, kv_full, pn * 64, hk, n0, b);
        tma_load_4d(sv + pn * C::kKPanelBytes, &tm_v, kv_full, pn * 64, hk, n0, b);
      }
    }
    int stage = 0;
    uint32_t phase = 0;
    for (int it = 0; it < iters; ++it) {
      const int h = step_head(it);
      const int m0 = step_m0(it);
      mbar_wait(&empty[stage], phase ^ 1);
      if (warp == 0) {
        mbar_arrive_expect_tx(&q_full[stage], C::kQBytes);
#pragma unroll
        for (int pn = 0; pn < C::kPanels; ++pn)
          tma_load_4d(sq + stage * C::kQBytes + pn * C::kQPanelBytes, &tm_q, &q_full[stage], pn * 64, h, m0,
                      b);
        mbar_arrive_expect_tx(&do_full[stage], C::kQBytes);
#pragma unroll
        for (int pn = 0; pn < C::kPanels; ++pn)
          tma_load_4d(sdo + stage * C::kQBytes + pn * C::kQPanelBytes, &tm_do, &do_full[stage], pn * 64, h,
                      m0, b);
      } else {
        float* ld = sld + stage * C::kLdFloats;
        for (int i = lane; i < kBM; i += 32) {
          const int slot = C::kLdSlots ? bwd_ld_slot<kBM>(i) : i;
          ld[slot] = bwd_lse2(p, b, h, m0 + i);
          ld[kBM + slot] = bwd_delta(p, b, h, m0 + i);
        }
        mbar_arrive(&ld_full[stage]);
      }
      if (++stage == kStages) {
        stage = 0;
        phase ^= 1;
      }
    }
    return;
  }

  // ---------------- consumers: 64 keys each ----------------
  setmaxnreg_inc<C::kConsumerRegs>();
  const int cw = wg - 1;
  const int t = threadIdx.x % 128;
  const int warp = t / 32;
  const int lane = t % 32;
  const int key0 = n0 + cw * 64 + warp * 16 + lane / 4;  // and key0 + 8
  float dk[D / 2], dv[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) {
    dk[i] = 0.0f;
    dv[i] = 0.0f;
  }
  if (iters > 0) {
    mbar_wait(kv_full, 0);
    const uint32_t k_base = smem_u32(sk) + cw * 64 * 128;
    const uint32_t v_base = smem_u32(sv) + cw * 64 * 128;
    const float sl2 = p.scale_log2;
    int stage = 0;
    uint32_t phase = 0;
    for (int it = 0; it < iters; ++it) {
      const int h = step_head(it);
      const int m0 = step_m0(it);
      const uint32_t q_st = smem_u32(sq) + stage * C::kQBytes;
      const uint32_t do_st = smem_u32(sdo) + stage * C::kQBytes;
      float s[kBM / 2], dp[kBM / 2];
      mbar_wait(&q_full[stage], phase);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        const uint32_t koff = (kk / 4) * C::kKPanelBytes + (kk % 4) * 32;
        const uint32_t qoff = (kk / 4) * C::kQPanelBytes + (kk % 4) * 32;
        wgmma_ss_n<kBM>(s, smem_desc_sw128(k_base + koff, 16, 1024), smem_desc_sw128(q_st + qoff, 16, 1024),
                        kk > 0 ? 1 : 0);
      }
      wgmma_commit();
      mbar_wait(&do_full[stage], phase);
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        const uint32_t koff = (kk / 4) * C::kKPanelBytes + (kk % 4) * 32;
        const uint32_t qoff = (kk / 4) * C::kQPanelBytes + (kk % 4) * 32;
        wgmma_ss_n<kBM>(dp, smem_desc_sw128(v_base + koff, 16, 1024), smem_desc_sw128(do_st + qoff, 16, 1024),
                        kk > 0 ? 1 : 0);
      }
      wgmma_commit();
      mbar_wait(&ld_full[stage], phase);
      // lse2 then δ of the step's kBM columns. kLdSlots: from this thread's kBM / 4 (bwd_ld_slot),
      // through a pointer the compiler sees into shared memory (smem_raw's: shared-memory loads).
      const float* lse2 = sld + stage * C::kLdFloats;
      const float* dl = lse2 + kBM;
      const float* lse2_at =
          reinterpret_cast<const float*>(smem_raw + (reinterpret_cast<uint8_t*>(sld) - smem_raw)) +
          stage * C::kLdFloats + (lane % 4) * (kBM / 4);
      const float* dl_at = lse2_at + kBM;
      // Pᵀ from Sᵀ while dPᵀ is still on the tensor cores (kept in s, fp32, for dSᵀ).
      wgmma_wait<1>();
      reg_fence(s);
      // Key (row) key0 + 8·half sees query (column) m0 + c iff key <= m0 + c + dpos.
      const bool masked =
          p.causal && static_cast<int64_t>(n0) + C::kBN - 1 > static_cast<int64_t>(m0) + p.dpos;
      float4 l4;
#pragma unroll
      for (int j = 0; j < kBM / 8; ++j) {
        if constexpr (C::kLdSlots) {
          if (j % 2 == 0) l4 = *reinterpret_cast<const float4*>(lse2_at + 2 * j);
        }
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int c = 8 * j + 2 * (lane % 4) + e;
          float l2;
          if constexpr (C::kLdSlots) {
            l2 = j % 2 == 0 ? (e == 0 ? l4.x : l4.y) : (e == 0 ? l4.z : l4.w);
          } else {
            l2 = lse2[c];
          }
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            const int idx = 4 * j + 2 * half + e;
            float pr = fast_exp2(fmaf(s[idx], sl2, -l2));
            if (masked && key0 + 8 * half > m0 + c + p.dpos) pr = 0.0f;
            s[idx] = pr;
          }
        }
      }
      // Pᵀ and dSᵀ as A fragments of keys × queries: 16 queries per k-step, registers
      // {row g, row g+8} per 8 columns.
      uint32_t pp[kBM / 16][4], pds[kBM / 16][4];
      auto pack_p = [&] {
#pragma unroll
        for (int j = 0; j < kBM / 8; ++j) {
          pp[j / 2][(j % 2) * 2 + 0] = pack_bf16(s[4 * j], s[4 * j + 1]);
          pp[j / 2][(j % 2) * 2 + 1] = pack_bf16(s[4 * j + 2], s[4 * j + 3]);
        }
      };
      // dO and Q N-major: 64-column slabs one panel apart (LBO), 8-row groups 1024 B apart (SBO),
      // 16 rows = 2048 B per k-step.
      auto issue_dv = [&] {
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kBM / 16; ++kk) {
          wgmma_rs_n<D>(dv, pp[kk], smem_desc_sw128(do_st + kk * 2048, C::kQPanelBytes, 1024));
        }
        wgmma_commit();
      };
      // kEarlyDv: dV += Pᵀ·dO goes to the tensor cores before dSᵀ is computed (the registers
      // allow it at head dim 128).
      if constexpr (C::kEarlyDv) {
        pack_p();
        issue_dv();
        wgmma_wait<1>();  // dPᵀ done; dV may still run
      } else {
        wgmma_wait<0>();
      }
      reg_fence(dp);
      float4 d4;
#pragma unroll
      for (int j = 0; j < kBM / 8; ++j) {
        float dsv[4];
        if constexpr (C::kLdSlots) {
          if (j % 2 == 0) d4 = *reinterpret_cast<const float4*>(dl_at + 2 * j);
        }
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float d0;
          if constexpr (C::kLdSlots) {
            d0 = j % 2 == 0 ? (e == 0 ? d4.x : d4.y) : (e == 0 ? d4.z : d4.w);
          } else {
            d0 = dl[8 * j + 2 * (lane % 4) + e];
          }
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            const int idx = 4 * j + 2 * half + e;
            dsv[2 * half + e] = s[idx] * (dp[idx] - d0);
          }
        }
        pds[j / 2][(j % 2) * 2 + 0] = pack_bf16(dsv[0], dsv[1]);
        pds[j / 2][(j % 2) * 2 + 1] = pack_bf16(dsv[2], dsv[3]);
      }
      if constexpr (!C::kEarlyDv) {
        pack_p();
        issue_dv();
      }
      if constexpr (kFusedDq) {
        // dS (queries × keys) into this warpgroup's panel of the buffer: each 8×8 block of the
        // dSᵀ fragment stored transposed, rows 128-byte swizzled as wgmma's A operand reads them.
        const uint32_t ds_panel = smem_u32(sds) + (it & 1) * 2 * C::kQPanelBytes + cw * C::kQPanelBytes;
        const int mi = lane / 8;
#pragma unroll
        for (int jj = 0; jj < kBM / 16; ++jj) {
          const int q = 8 * (2 * jj + mi / 2) + lane % 8;
          const int chunk = 2 * warp + mi % 2;  // the 16-byte chunk of keys warp·16 + 8·half ...
          stmatrix_x4_trans(ds_panel + q * 128 + ((chunk ^ (q & 7)) << 4), pds[jj]);
        }
        fence_proxy_async_shared();
        // dV runs on the tensor cores while the warpgroups meet. The staging buffer's last
        // reduction has been read once its issuer passes this barrier.
        if constexpr (kDq == kDqTma) {
          if (t == 0) bulk_wait_read_all();
        }
        named_barrier_sync(1, 256);  // both dS panels written
        // dQ[:, this warpgroup's half of the columns] = dS (64 × 128 keys) · K, K N-major; then
        // dK += dSᵀ·Q behind it, so that dQ leaves while dK is computed.
        float dqp[C::kMH][D / 4];
        const uint32_t ds_buf = smem_u32(sds) + (it & 1) * 2 * C::kQPanelBytes;
        const uint32_t k_cols = D == 128 ? smem_u32(sk) + cw * C::kKPanelBytes : smem_u32(sk) + cw * 64;
        wgmma_fence();
#pragma unroll
        for (int mh = 0; mh < C::kMH; ++mh) {
#pragma unroll
          for (int kk = 0; kk < C::kBN / 16; ++kk) {
            const uint64_t da = smem_desc_sw128(
                ds_buf + (kk / 4) * C::kQPanelBytes + mh * 64 * 128 + (kk % 4) * 32, 16, 1024);
            const uint64_t db = smem_desc_sw128(k_cols + kk * 2048, C::kKPanelBytes, 1024);
            if constexpr (D == 128) {
              wgmma_m64n64k16_ss<1>(dqp[mh], da, db, kk > 0 ? 1 : 0);
            } else {
              wgmma_m64n32k16_ss_tn(dqp[mh], da, db, kk > 0 ? 1 : 0);
            }
          }
        }
        wgmma_commit();
#pragma unroll
        for (int kk = 0; kk < kBM / 16; ++kk) {
          wgmma_rs_n<D>(dk, pds[kk], smem_desc_sw128(q_st + kk * 2048, C::kQPanelBytes, 1024));
        }
        wgmma_commit();
        wgmma_wait<1>();  // dV and dQ done
#pragma unroll
        for (int mh = 0; mh < C::kMH; ++mh) reg_fence(dqp[mh]);
        if constexpr (kDq == kDqTma) {
          // Rows 64·mh + warp·16 + lane/4 (+8), columns 8j + 2·(lane%4) of this warpgroup's half:
          // box (mh, j/4), 16-byte chunk 2·(j%4) + (lane%4)/2 of the row, swizzled by the row.
          // kStagePair: each store takes column group j from the lanes with lane%4 < 2 and j^2 from
          // the others, so that each half-warp's 4 rows fill all 8 chunks of the 128 banks (one
          // wavefront; the same j everywhere puts two rows on each chunk of one half).
          const uint32_t stage_base = smem_u32(sdq) + cw * C::kDqBoxes * C::kDqBoxBytes;
          const int odd = (lane % 4) / 2;
#pragma unroll
          for (int mh = 0; mh < C::kMH; ++mh) {
#pragma unroll
            for (int half = 0; half < 2; ++half) {
              const int r = warp * 16 + lane / 4 + 8 * half;
#pragma unroll
              for (int j = 0; j < D / 16; ++j) {
                const bool swap = C::kStagePair && odd;
                const int jo = C::kStagePair ? j ^ 2 : j;  // same box
                const int chunk = (2 * (j % 4) + odd) ^ (swap ? 4 : 0);
                const float v0 = swap ? dqp[mh][4 * jo + 2 * half] : dqp[mh][4 * j + 2 * half];
                const float v1 = swap ? dqp[mh][4 * jo + 2 * half + 1] : dqp[mh][4 * j + 2 * half + 1];
                st_shared_f32x2(stage_base + (mh * C::kDqColBoxes + j / 4) * C::kDqBoxBytes + r * 128 +
                                    ((chunk ^ (r & 7)) << 4) + (lane % 2) * 8,
                                p.scale * v0, p.scale * v1);
              }
            }
          }
          fence_proxy_async_shared();
          named_barrier_sync(2 + cw, 128);
          if (t == 0) {
#pragma unroll
            for (int bx = 0; bx < C::kDqBoxes; ++bx) {
              tma_reduce_add_4d(&tm_dq, stage_base + bx * C::kDqBoxBytes,
                                cw * (D / 2) + (bx % C::kDqColBoxes) * 32, h, m0 + (bx / C::kDqColBoxes) * 64,
                                b);
            }
            bulk_commit();
          }
        } else {
          const int col0 = cw * (D / 2) + 2 * (lane % 4);
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            const int r = m0 + warp * 16 + lane / 4 + 8 * half;
            if (r >= p.q_len) continue;
            float* row =
                static_cast<float*>(p.dq) + b * p.dq_sb + static_cast<int64_t>(r) * p.dq_ss + h * p.dq_sh;
#pragma unroll
            for (int j = 0; j < D / 16; ++j) {
              red_add_f32x2(row + col0 + 8 * j, p.scale * dqp[0][4 * j + 2 * half],
                            p.scale * dqp[0][4 * j + 2 * half + 1]);
            }
          }
        }
        wgmma_wait<0>();
      } else {
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kBM / 16; ++kk) {
          wgmma_rs_n<D>(dk, pds[kk], smem_desc_sw128(q_st + kk * 2048, C::kQPanelBytes, 1024));
        }
        wgmma_commit();
        wgmma_wait<0>();
      }
      reg_fence(dk);
      reg_fence(dv);
      if (lane == 0) mbar_arrive(&empty[stage]);
      if (++stage == kStages) {
        stage = 0;
        phase ^= 1;
      }
    }
  }
  // The staged dQ reductions finish before the CTA (and its shared memory) does.
  if constexpr (kDq == kDqTma) {
    if (t == 0) bulk_wait_all();
  }
  // A tile no query sees still stores its zeros (kStore); adding zeros is skipped.
  if (iters == 0 && p.add) return;
  bwd_store_rows<D>(p.dk, p.dk_sb, p.dk_ss, p.dk_sh, p.add, dk, p.scale, b, hk, key0, p.kv_len, lane);
  bwd_store_rows<D>(p.dv, p.dv_sb, p.dv_ss, p.dv_sh, p.add, dv, 1.0f, b, hk, key0, p.kv_len, lane);
}

// ---------------------------------------------------------------------------------------------
// dQ pass. Shared memory from a 1024-byte aligned base:
//   Q, dO      kPanels × 16 KiB each (128 rows × 128 B per panel)
//   K ring, V ring  kStages × kPanels × 16 KiB each
//   barriers   qd_full, k_full[kStages], v_full[kStages], empty[kStages]
template <int D>
struct BwdQCfg {
  static_assert(D == 64 || D == 128, "head_dim 64 or 128");
  static constexpr int kBM = 128;
  static constexpr int kBN = 128;
  static constexpr int kPanels = D / 64;
  static constexpr int kPanelBytes = 128 * 128;
  static constexpr int kTileBytes = kPanels * kPanelBytes;
  static constexpr int kStages = D == 128 ? 2 : 4;
  static constexpr int kBarrierBytes = 8 * (1 + 3 * kStages);
  static constexpr int kSmemBytes = 1024 + 2 * kTileBytes + 2 * kStages * kTileBytes + kBarrierBytes;
  static constexpr int kProducerRegs = 40;
  static constexpr int kConsumerRegs = 232;
  static_assert(kSmemBytes <= 227 * 1024, "shared memory");
};

template <int D>
__global__ void __launch_bounds__(384, 1)
    flash_bwd_dq_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                        const __grid_constant__ CUtensorMap tm_v, const __grid_constant__ CUtensorMap tm_do,
                        const BwdParams p) {
  using C = BwdQCfg<D>;
  constexpr int kBM = C::kBM, kBN = C::kBN, kStages = C::kStages;
  extern __shared__ __align__(128) uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) &
                                             ~static_cast<uintptr_t>(1023));
  uint8_t* sq = smem;
  uint8_t* sdo = sq + C::kTileBytes;
  uint8_t* sk = sdo + C::kTileBytes;
  uint8_t* sv = sk + kStages * C::kTileBytes;
  uint64_t* qd_full = reinterpret_cast<uint64_t*>(sv + kStages * C::kTileBytes);
  uint64_t* k_full = qd_full + 1;
  uint64_t* v_full = k_full + kStages;
  uint64_t* empty = v_full + kStages;

  const int m_tile = p.causal ? p.tiles - 1 - static_cast<int>(blockIdx.x) : static_cast<int>(blockIdx.x);
  const int h = blockIdx.y;
  const int b = blockIdx.z;
  const int hk = h / p.group;
  const int m0 = m_tile * kBM;
  int n_keys = p.kv_len;
  if (p.causal) {
    const int64_t last = static_cast<int64_t>(m0) + kBM - 1 + p.dpos;
    n_keys = static_cast<int>(last < 0 ? 0 : (last + 1 < p.kv_len ? last + 1 : p.kv_len));
  }
  const int n_blocks = (n_keys + kBN - 1) / kBN;

  if (threadIdx.x == 0) {
    mbar_init(qd_full, 1);
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&k_full[s], 1);
      mbar_init(&v_full[s], 1);
      mbar_init(&empty[s], 8);
    }
    mbar_init_fence();
  } else if (threadIdx.x == 32) {
    tma_prefetch_desc(&tm_q);
    tma_prefetch_desc(&tm_k);
    tma_prefetch_desc(&tm_v);
    tma_prefetch_desc(&tm_do);
  }
  __syncthreads();

  const int wg = threadIdx.x / 128;
  if (wg == 0) {
    setmaxnreg_dec<C::kProducerRegs>();
    if (threadIdx.x != 0 || n_blocks == 0) return;
    mbar_arrive_expect_tx(qd_full, 2 * C::kTileBytes);
#pragma unroll
    for (int pn = 0; pn < C::kPanels; ++pn) {
      tma_load_4d(sq + pn * C::kPanelBytes, &tm_q, qd_full, pn * 64, h, m0, b);
      tma_load_4d(sdo + pn * C::kPanelBytes, &tm_do, qd_full, pn * 64, h, m0, b);
    }
    int stage = 0;
    uint32_t phase = 0;
    for (int nb = 0; nb < n_blocks; ++nb) {
      mbar_wait(&empty[stage], phase ^ 1);
      mbar_arrive_expect_tx(&k_full[stage], C::kTileBytes);
#pragma unroll
      for (int pn = 0; pn < C::kPanels; ++pn)
        tma_load_4d(sk + stage * C::kTileBytes + pn * C::kPanelBytes, &tm_k, &k_full[stage], pn * 64, hk,
                    nb * kBN, b);
      mbar_arrive_expect_tx(&v_full[stage], C::kTileBytes);
#pragma unroll
      for (int pn = 0; pn < C::kPanels; ++pn)
        tma_load_4d(sv + stage * C::kTileBytes + pn * C::kPanelBytes, &tm_v, &v_full[stage], pn * 64, hk,
                    nb * kBN, b);
      if (++stage == kStages) {
        stage = 0;
        phase ^= 1;
      }
    }
    return;
  }

  setmaxnreg_inc<C::kConsumerRegs>();
  const int cw = wg - 1;
  const int t = threadIdx.x % 128;
  const int warp = t / 32;
  const int lane = t % 32;
  const int row0 = m0 + cw * 64 + warp * 16 + lane / 4;  // and row0 + 8
  float dq[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) dq[i] = 0.0f;
  if (n_blocks > 0) {
    float lse2[2], d0[2];
    int lim[2];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      lse2[half] = bwd_lse2(p, b, h, row0 + 8 * half);
      d0[half] = bwd_delta(p, b, h, row0 + 8 * half);
      const int64_t d = p.causal ? static_cast<int64_t>(row0 + 8 * half) + p.dpos : INT32_MAX;
      lim[half] = static_cast<int>(d < p.kv_len - 1 ? d : p.kv_len - 1);
    }
    mbar_wait(qd_full, 0);
    const uint32_t q_base = smem_u32(sq) + cw * 64 * 128;
    const uint32_t do_base = smem_u32(sdo) + cw * 64 * 128;
    const float sl2 = p.scale_log2;
    int stage = 0;
    uint32_t phase = 0;
    for (int nb = 0; nb < n_blocks; ++nb) {
      const uint32_t k_st = smem_u32(sk) + stage * C::kTileBytes;
      const uint32_t v_st = smem_u32(sv) + stage * C::kTileBytes;
      float s[kBN / 2], dp[kBN / 2];
      mbar_wait(&k_full[stage], phase);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        const uint32_t off = (kk / 4) * C::kPanelBytes + (kk % 4) * 32;
        wgmma_m64n128k16<0>(s, smem_desc_sw128(q_base + off, 16, 1024), smem_desc_sw128(k_st + off, 16, 1024),
                            kk > 0 ? 1 : 0);
      }
      wgmma_commit();
      mbar_wait(&v_full[stage], phase);
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        const uint32_t off = (kk / 4) * C::kPanelBytes + (kk % 4) * 32;
        wgmma_m64n128k16<0>(dp, smem_desc_sw128(do_base + off, 16, 1024),
                            smem_desc_sw128(v_st + off, 16, 1024), kk > 0 ? 1 : 0);
      }
      wgmma_commit();
      // P from S while dP is still on the tensor cores.
      wgmma_wait<1>();
      reg_fence(s);
      const int n0 = nb * kBN;
      const bool masked = n0 + kBN > p.kv_len || (p.causal && static_cast<int64_t>(n0) + kBN - 1 >
                                                                  static_cast<int64_t>(m0) + p.dpos);
#pragma unroll
      for (int j = 0; j < kBN / 8; ++j) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int idx = 4 * j + 2 * half + e;
            float pr = fast_exp2(fmaf(s[idx], sl2, -lse2[half]));
            if (masked && n0 + 8 * j + 2 * (lane % 4) + e > lim[half]) pr = 0.0f;
            s[idx] = pr;
          }
        }
      }
      wgmma_wait<0>();
      reg_fence(dp);
      uint32_t pds[kBN / 16][4];
#pragma unroll
      for (int j = 0; j < kBN / 8; ++j) {
        float dsv[4];
#pragma unroll
        for (int half = 0; half < 2; ++half) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int idx = 4 * j + 2 * half + e;
            dsv[2 * half + e] = s[idx] * (dp[idx] - d0[half]);
          }
        }
        pds[j / 2][(j % 2) * 2 + 0] = pack_bf16(dsv[0], dsv[1]);
        pds[j / 2][(j % 2) * 2 + 1] = pack_bf16(dsv[2], dsv[3]);
      }
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kBN / 16; ++kk) {
        // K N-major, as the forward's V: 16 keys = 2048 B per k-step.
        wgmma_rs_n<D>(dq, pds[kk], smem_desc_sw128(k_st + kk * 2048, C::kPanelBytes, 1024));
      }
      wgmma_commit();
      wgmma_wait<0>();
      reg_fence(dq);
      if (lane == 0) mbar_arrive(&empty[stage]);
      if (++stage == kStages) {
        stage = 0;
        phase ^= 1;
      }
    }
  }
  if (n_blocks == 0 && p.add) return;
  bwd_store_rows<D>(p.dq, p.dq_sb, p.dq_ss, p.dq_sh, p.add, dq, p.scale, b, h, row0, p.q_len, lane);
}

// ---------------------------------------------------------------------------------------------
// δ = rowsum(dO ∘ o): 8 threads per (b, i, h) row, 16-byte loads, fp32 sums. With `zero` (fp32,
// dense (B, q_len, heads, D): dQ's accumulator) the same threads also zero the row's D values.
template <int D>
__global__ void flash_bwd_delta_kernel(const __nv_bfloat16* o, int64_t o_sb, int64_t o_ss, int64_t o_sh,
                                       const __nv_bfloat16* d_o, int64_t g_sb, int64_t g_ss, int64_t g_sh,
                                       float* delta, int64_t dl_sb, int64_t dl_sh, int q_len, int heads,
                                       int64_t rows, float* zero) {
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t row = tid / 8;
  const int sub = static_cast<int>(tid % 8);
  float sum = 0.0f;
  int b = 0, i = 0, h = 0;
  if (row < rows) {
    h = static_cast<int>(row % heads);
    const int64_t bi = row / heads;
    i = static_cast<int>(bi % q_len);
    b = static_cast<int>(bi / q_len);
    const __nv_bfloat16* orow = o + b * o_sb + i * o_ss + h * o_sh;
    const __nv_bfloat16* grow = d_o + b * g_sb + i * g_ss + h * g_sh;
#pragma unroll
    for (int c = 0; c < D / 64; ++c) {
      const int col = (c * 8 + sub) * 8;
      const uint4 ov = *reinterpret_cast<const uint4*>(orow + col);
      const uint4 gv = *reinterpret_cast<const uint4*>(grow + col);
      const __nv_bfloat162* o2 = reinterpret_cast<const __nv_bfloat162*>(&ov);
      const __nv_bfloat162* g2 = reinterpret_cast<const __nv_bfloat162*>(&gv);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float2 a = __bfloat1622float2(o2[e]);
        const float2 g = __bfloat1622float2(g2[e]);
        sum = fmaf(a.x, g.x, sum);
        sum = fmaf(a.y, g.y, sum);
      }
    }
  }
  if (zero != nullptr && row < rows) {
    float4* z = reinterpret_cast<float4*>(zero + row * D);
#pragma unroll
    for (int c = 0; c < D / 32; ++c) z[c * 8 + sub] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
  sum += __shfl_xor_sync(0xffffffffu, sum, 1);
  sum += __shfl_xor_sync(0xffffffffu, sum, 2);
  sum += __shfl_xor_sync(0xffffffffu, sum, 4);
  if (row < rows && sub == 0) delta[b * dl_sb + h * dl_sh + i] = sum;
}

// fp32 -> bf16, eight elements of one row per thread (two 16-byte loads, one 16-byte store), the
// (b, s, h) of a row from 32-bit divisions: rows of head_dim / 8 vectors, row = (b · seq + s) · heads + h.
// Launched where every row starts 16-byte aligned on both sides and vectors < 2^32 (the launcher).
__global__ void flash_bwd_convert8_kernel(const float* src, int64_t s_sb, int64_t s_ss, int64_t s_sh,
                                          __nv_bfloat16* dst, int64_t d_sb, int64_t d_ss, int64_t d_sh,
                                          uint32_t seq, uint32_t heads, uint32_t row_vecs, uint32_t vecs) {
  for (uint32_t t = blockIdx.x * blockDim.x + threadIdx.x; t < vecs; t += gridDim.x * blockDim.x) {
    const uint32_t row = t / row_vecs;
    const uint32_t c = (t - row * row_vecs) * 8;
    const uint32_t bs = row / heads;
    const uint32_t h = row - bs * heads;
    const uint32_t b = bs / seq;
    const uint32_t s = bs - b * seq;
    const float4* sp = reinterpret_cast<const float4*>(src + b * s_sb + s * s_ss + h * s_sh + c);
    const float4 v0 = sp[0];
    const float4 v1 = sp[1];
    const uint4 out = make_uint4(pack_bf16(v0.x, v0.y), pack_bf16(v0.z, v0.w), pack_bf16(v1.x, v1.y),
                                 pack_bf16(v1.z, v1.w));
    *reinterpret_cast<uint4*>(dst + b * d_sb + s * d_ss + h * d_sh + c) = out;
  }
}

// fp32 -> bf16, two elements per thread (any even head_dim, 8-byte aligned rows).
__global__ void flash_bwd_convert_kernel(const float* src, int64_t s_sb, int64_t s_ss, int64_t s_sh,
                                         __nv_bfloat16* dst, int64_t d_sb, int64_t d_ss, int64_t d_sh,
                                         int seq, int heads, int half_d, int64_t pairs) {
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < pairs;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int c = static_cast<int>(t % half_d) * 2;
    const int64_t row = t / half_d;
    const int h = static_cast<int>(row % heads);
    const int64_t bs = row / heads;
    const int s = static_cast<int>(bs % seq);
    const int64_t b = bs / seq;
    const float2 v = *reinterpret_cast<const float2*>(src + b * s_sb + s * s_ss + h * s_sh + c);
    *reinterpret_cast<uint32_t*>(dst + b * d_sb + s * d_ss + h * d_sh + c) = pack_bf16(v.x, v.y);
  }
}

}  // namespace fusedcomm::kernels::detail
