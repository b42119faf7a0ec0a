// Where the engine's finished tiles go (hook 2 of gemm.h): the epilogue concept, the register
// split between the producer and consumer warpgroups, the default epilogue (C and the tile
// sink), C through shared memory and TMA stores, and where an epilogue finds its staging buffer
// and aux region in the engine's shared memory.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/common/sm90_primitives.cuh"
#include "kernels/gemm/detail/gemm_config.cuh"
#include "kernels/gemm/gemm.h"

namespace fusedcomm::kernels::detail {

// Epilogue concept (what gemm_sm90_kernel calls):
//   template <int kFrag> void store(const float (&acc)[kFrag], int row0, int col0,
//                                   const GemmProblem&) const;
//     called by every consumer thread of a warpgroup whose rows intersect M; the thread owns
//     rows row0 and row0 + 8, columns col0 + 8*j + {0, 1} for j < kFrag/4, with
//     acc[4j + 0..1] at row0 and acc[4j + 2..3] at row0 + 8. Out-of-range rows/columns must be
//     skipped by the epilogue (row < M, col < N; col + 1 < N follows from N % 8 == 0 where a
//     sink or tile flags are set, and DefaultEpilogue guards each column of C otherwise).
//   bool wants_tile_done() const;  uniform over the launch
//   void tile_done(TileCoord, const GemmProblem&) const;
//     called by one thread after all 256 consumer threads have issued the tile's stores.
//   static constexpr bool kOwnsTile;
//     true: instead of the above, every consumer thread calls
//       template <int BN, int kFrag> void tile(float (&acc)[kFrag], uint8_t* staging,
//                                              TileCoord, int cw, const GemmProblem&) const;
//     with its warpgroup's staging buffer (kStagingRounds × 16 KiB, store_tile_tma; named
//     barrier 2 + cw is the warpgroup's), whatever prob.c_tma says, and once after its last tile
//       void consumers_end() const;
//     (before the schedule's consumers_done), where bulk stores it issued must be waited for;
//     and, in every tile's main loop at k-block min(k_blocks, kStages) - 1 (a point that the
//     warpgroup reaches without the other warpgroup's progress, see there), with the tile
//     (its staging buffer: gemm_staging_smem; the previous tile's stores may still read it),
//       template <int BN> void main_loop_point(TileCoord, int cw) const;
//   static constexpr int kStagingRounds;  1 or 2 (GemmTileConfig)
//   static constexpr bool kInitAux;
//     true: thread 0 calls, before the CTA's first barrier,
//       static void init_aux(uint8_t* aux);   (the kAuxBytes region)
//   static constexpr bool kAuxWarps;  (implies kInitAux)
//     true: warps 1 and 2 of the producer warpgroup (56 registers: RegisterSplit) call,
//     instead of returning,
//       void aux_warp(int cw, uint8_t* staging, uint8_t* aux) const;
//     each a helper of consumer warpgroup cw, with that warpgroup's staging buffer. The
//     consumers' side finds the aux region with gemm_aux_smem<BN, kStagingRounds>().
// Registers per thread after setmaxnreg, per warpgroup role. The launch gives every thread 168
// (384 threads, one CTA per SM: the whole register file); what the producer warpgroup gives up,
// the consumers take, so 128 × kProducer + 256 × kConsumer must not exceed 384 × 168, or the
// consumers' setmaxnreg.inc would wait forever. The producer's one issuing thread fits in 40.
// Aux warps (the pusher warps of gemmReduceScatter) run a store loop in the producer warpgroup:
// at 40 ptxas spilled 24-48 bytes there; at 56 nothing spills, and the consumers' 224 leave their
// code unspilled too (no cost beyond the noise, measured on H200).
template <class Epilogue>
struct RegisterSplit {
  static constexpr int kProducer = Epilogue::kAuxWarps ? 56 : 40;
  static constexpr int kConsumer = Epilogue::kAuxWarps ? 224 : 232;
  static_assert(128 * kProducer + 256 * kConsumer <= 384 * 168, "register file over-committed");
  static_assert(kProducer % 8 == 0 && kConsumer % 8 == 0, "setmaxnreg takes multiples of 8");
};

struct DefaultEpilogue {
  static constexpr bool kOwnsTile = false;
  // Two rounds (3 stages at BN = 256) measured 0.987 × the time over 52 GEMM shapes on one
  // H200 but 1.08 × at 8192³ and 1.02-1.03 × at small M; allGatherGemm lost up to 12 %
  // (docs/performance.md): one.
  static constexpr int kStagingRounds = 1;
  static constexpr bool kInitAux = false;
  static constexpr bool kAuxWarps = false;
  void* c;
  int64_t ldc;
  GemmOutType c_type;
  uint32_t reserved;
  GemmTileSink sink;

  // Applies op(T* element, v0, v1) to the thread's in-range column pairs of rows row0 and
  // row0 + 8 (pointers to column 0 of those rows in the destination).
  template <class T, int kFrag, class Op>
  __device__ __forceinline__ static void apply(const float (&acc)[kFrag], T* row_lo, T* row_hi, int row0,
                                               int col0, const GemmProblem& p, Op op) {
    const bool lo_ok = row0 < p.M;
    const bool hi_ok = row0 + 8 < p.M;
#pragma unroll
    for (int j = 0; j < kFrag / 4; ++j) {
      const int col = col0 + 8 * j;
      if (col < p.N) {
        if (lo_ok) op(row_lo + col, acc[4 * j + 0], acc[4 * j + 1]);
        if (hi_ok) op(row_hi + col, acc[4 * j + 2], acc[4 * j + 3]);
      }
    }
  }

  // C at an odd row stride or an odd N (gemm.h: C without TMA): element by element, each
  // column guarded (a pair's second column may lie past N, and a pair may be misaligned).
  template <class T, int kFrag>
  __device__ __forceinline__ static void apply_elements(const float (&acc)[kFrag], T* row_lo, T* row_hi,
                                                        int row0, int col0, const GemmProblem& p) {
    const bool lo_ok = row0 < p.M;
    const bool hi_ok = row0 + 8 < p.M;
#pragma unroll
    for (int j = 0; j < kFrag / 4; ++j) {
      const int col = col0 + 8 * j;
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        if (col + e < p.N) {
          if (lo_ok) row_lo[col + e] = static_cast<T>(acc[4 * j + e]);
          if (hi_ok) row_hi[col + e] = static_cast<T>(acc[4 * j + 2 + e]);
        }
      }
    }
  }

  __device__ __forceinline__ static void put_bf16(__nv_bfloat16* d, float v0, float v1) {
    *reinterpret_cast<__nv_bfloat162*>(d) = __floats2bfloat162_rn(v0, v1);
  }
  __device__ __forceinline__ static void put_f32(float* d, float v0, float v1) {
    *reinterpret_cast<float2*>(d) = make_float2(v0, v1);
  }
  // System scope: a sink's destinations may be peer memory that other GPUs add into too
  // (gemm.h), and only same-scope strong atomics are atomic with each other.
  __device__ __forceinline__ static void add_f32(float* d, float v0, float v1) {
    atomicAdd_system(d, v0);
    atomicAdd_system(d + 1, v1);
  }
  __device__ __forceinline__ static void add_bf16(__nv_bfloat16* d, float v0, float v1) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(v0, v1);
    asm volatile("red.relaxed.sys.global.add.noftz.bf16x2 [%0], %1;" ::"l"(d),
                 "r"(*reinterpret_cast<const uint32_t*>(&v))
                 : "memory");
  }

  // Destination row pointer (as bytes) of C row `row` in the sink.
  __device__ __forceinline__ char* sink_row(int row, int elem_bytes) const {
    const int rpd = static_cast<int>(sink.rows_per_dest);
    const int d = rpd ? min(row / rpd, static_cast<int>(sink.num_dests) - 1) : 0;
    const int64_t local = row - d * rpd;
    return static_cast<char*>(sink.dest[d]) + local * sink.ld * elem_bytes;
  }

  template <int kFrag>
  __device__ __forceinline__ void store(const float (&acc)[kFrag], int row0, int col0,
                                        const GemmProblem& p) const {
    if (c != nullptr && ((ldc | p.N) & 1) != 0) {
      if (c_type == GemmOutType::kBF16) {
        auto* base = static_cast<__nv_bfloat16*>(c);
        apply_elements(acc, base + row0 * ldc, base + (row0 + 8) * ldc, row0, col0, p);
      } else {
        auto* base = static_cast<float*>(c);
        apply_elements(acc, base + row0 * ldc, base + (row0 + 8) * ldc, row0, col0, p);
      }
    } else if (c != nullptr) {
      if (c_type == GemmOutType::kBF16) {
        auto* base = static_cast<__nv_bfloat16*>(c);
        apply(acc, base + row0 * ldc, base + (row0 + 8) * ldc, row0, col0, p, put_bf16);
      } else {
        auto* base = static_cast<float*>(c);
        apply(acc, base + row0 * ldc, base + (row0 + 8) * ldc, row0, col0, p, put_f32);
      }
    }
    switch (sink.mode) {
      case GemmSinkMode::kStoreBF16:
        apply(acc, reinterpret_cast<__nv_bfloat16*>(sink_row(row0, 2)),
              reinterpret_cast<__nv_bfloat16*>(sink_row(row0 + 8, 2)), row0, col0, p, put_bf16);
        break;
      case GemmSinkMode::kStoreF32:
        apply(acc, reinterpret_cast<float*>(sink_row(row0, 4)),
              reinterpret_cast<float*>(sink_row(row0 + 8, 4)), row0, col0, p, put_f32);
        break;
      case GemmSinkMode::kAtomicAddF32:
        apply(acc, reinterpret_cast<float*>(sink_row(row0, 4)),
              reinterpret_cast<float*>(sink_row(row0 + 8, 4)), row0, col0, p, add_f32);
        break;
      case GemmSinkMode::kAtomicAddBF16:
        apply(acc, reinterpret_cast<__nv_bfloat16*>(sink_row(row0, 2)),
              reinterpret_cast<__nv_bfloat16*>(sink_row(row0 + 8, 2)), row0, col0, p, add_bf16);
        break;
      default: break;
    }
  }

  __device__ __forceinline__ bool wants_tile_done() const { return sink.tile_flags != nullptr; }

  __device__ __forceinline__ void tile_done(TileCoord tc, const GemmProblem& p) const {
    // Release at system scope; cumulative over the tile's stores ordered before it by the
    // consumers' named barrier (see gemm.h, hook 2).
    st_release_sys(sink.tile_flags + static_cast<int64_t>(tc.m) * p.n_blocks + tc.n, sink.epoch);
  }
};

// ---- C through shared memory and TMA ------------------------------------------------------
// One consumer warpgroup writes its 64×BN fragment to its 16 KiB staging buffer one round at a
// time, as two boxes of 64 rows × 128 bytes with 128-B swizzled rows (16-byte chunk c of row r
// sits at chunk c ^ (r % 8)): bf16 C 128 columns per round (two 64×64 boxes; the warp's 4-byte
// writes hit 32 distinct banks), fp32 C 64 columns per round (two 64×32 boxes; 8-byte writes,
// two wavefronts per warp instruction, the minimum for 256 bytes). One thread issues the TMA
// stores, which clip at the tensor map's bounds. Before the buffer is rewritten, the previous
// round's stores must have read it (bulk wait_group.read), published to the warpgroup by its
// named barrier. The fragment goes to rows [row, row + 64) and columns [col, col + BN) of `tm`;
// `issue` (thread 0's) false: staged but not stored. One bulk group per round is committed:
// BN / 128 (bf16) or BN / 64 (fp32) groups, rounded up: at BN = 192 bf16 C's last round is
// one box of 64 columns. kBufRounds: the rounds the buffer holds (round h goes to its 16 KiB
// part h % kBufRounds; the read wait comes before parts wrap around).
template <int BN, bool kF32>
inline constexpr int kStoreRounds = (BN + (kF32 ? 64 : 128) - 1) / (kF32 ? 64 : 128);
// Where bf16 column group j (columns 8j + 2q, +1) of staged row `row` lies, in bytes from the
// start of its boxes (64 columns per 8 KiB box, 128-B rows, 16-byte chunk c of row i at
// c ^ (i % 8)): stage_round writes there, and the fused gemmReduceScatter's early fetch
// (gemm_rs_kernel.cuh, add_fetched) reads a TMA-loaded partial from there.
__device__ __forceinline__ uint32_t staged_bf16_at(int j, int row, uint32_t q) {
  return static_cast<uint32_t>((j / 8) * 8192 + row * 128) +
         ((static_cast<uint32_t>(j % 8) ^ static_cast<uint32_t>(row % 8)) << 4) + 4 * q;
}
// Writes round h (columns [h * cols, (h + 1) * cols) of the fragment, cols = 64 fp32 or 128
// bf16, those inside the fragment) of the warpgroup's fragment into the 16 KiB at `part` in the
// layout above. Only the writes: the caller orders them (barriers, proxy fences).
template <bool kF32, int kFrag>
__device__ __forceinline__ void stage_round(const float (&acc)[kFrag], uint8_t* part, int h) {
  constexpr int kColsPerRound = kF32 ? 64 : 128;  // two boxes of 128-byte rows
  constexpr int kJPerRound = kColsPerRound / 8;   // 8-column groups j of the fragment
  constexpr int kJPerBox = kJPerRound / 2;
  const int t = threadIdx.x % 128;
  const int warp = t / 32, lane = t % 32;
  const uint32_t base = smem_u32(part);
  const int r_lo = warp * 16 + lane / 4;
  const uint32_t q = static_cast<uint32_t>(lane % 4);
#pragma unroll
  for (int jj = 0; jj < kJPerRound; ++jj) {
    const int j = h * kJPerRound + jj;
    if (4 * j >= kFrag) break;  // a half round (BN = 192, bf16): its second box is not staged
    if constexpr (kF32) {
      const uint32_t box = base + (jj / kJPerBox) * 8192;
      const uint32_t sw = static_cast<uint32_t>(r_lo % 8);  // the swizzle of rows r_lo, r_lo + 8
      // Columns 8*(jj%4) + 2q, +1 of the box: chunk 2*(jj%4) + q/2, byte 8*(q%2) in it.
      const uint32_t chunk = ((2 * (jj % kJPerBox) + q / 2) ^ sw) << 4, off = 8 * (q % 2);
      st_shared_f32x2(box + r_lo * 128 + chunk + off, acc[4 * j + 0], acc[4 * j + 1]);
      st_shared_f32x2(box + (r_lo + 8) * 128 + chunk + off, acc[4 * j + 2], acc[4 * j + 3]);
    } else {
      __nv_bfloat162 lo = __floats2bfloat162_rn(acc[4 * j + 0], acc[4 * j + 1]);
      __nv_bfloat162 hi = __floats2bfloat162_rn(acc[4 * j + 2], acc[4 * j + 3]);
      st_shared_u32(base + staged_bf16_at(jj, r_lo, q), *reinterpret_cast<uint32_t*>(&lo));
      st_shared_u32(base + staged_bf16_at(jj, r_lo + 8, q), *reinterpret_cast<uint32_t*>(&hi));
    }
  }
}
template <int BN, bool kF32, int kFrag, bool kReduce = false, int kBufRounds = 1>
__device__ __forceinline__ void store_tile_tma(const float (&acc)[kFrag], uint8_t* stage_buf,
                                               const CUtensorMap* tm, int cw, int row, int col, bool issue) {
  constexpr int kColsPerRound = kF32 ? 64 : 128;
  const int t = threadIdx.x % 128;
  const uint32_t bar_id = 2 + cw;
#pragma unroll
  for (int h = 0; h < kStoreRounds<BN, kF32>; ++h) {
    uint8_t* part = stage_buf + (h % kBufRounds) * 16384;
    if (h % kBufRounds == 0) {
      if (t == 0) bulk_wait_read_all();
      named_barrier_sync(bar_id, 128);
    }
    stage_round<kF32>(acc, part, h);
    fence_proxy_async_shared();
    named_barrier_sync(bar_id, 128);
    if (t == 0 && issue) {
      const int c = col + h * kColsPerRound;
      const bool second = (h + 1) * kColsPerRound <= BN;  // else a half round: one box
      if constexpr (kReduce) {
        tma_reduce_add_2d(tm, part, c, row);
        if (second) tma_reduce_add_2d(tm, part + 8192, c + kColsPerRound / 2, row);
      } else {
        tma_store_2d(tm, part, c, row);
        if (second) tma_store_2d(tm, part + 8192, c + kColsPerRound / 2, row);
      }
      bulk_commit();
    }
  }
}
// The engine's own C store: the warpgroup's 64 rows of tile tc.
template <int BN, bool kF32, int kBufRounds, int kFrag>
__device__ __forceinline__ void store_c_tma(const float (&acc)[kFrag], uint8_t* stage_buf,
                                            const CUtensorMap* tm_c, TileCoord tc, int cw, bool rows_in) {
  store_tile_tma<BN, kF32, kFrag, false, kBufRounds>(acc, stage_buf, tm_c, cw, tc.m * kTileM + cw * 64,
                                                     tc.n * BN, rows_in);
}

// Where lane `lane` reads a staged round (stage_round's 128-byte swizzled rows at shared address
// `base`): its 4 bf16 columns of row r are 8 bytes at at + r · 128 + ((chunk ^ r % 8) << 4). The
// swizzle keeps a row's chunks within its 128 bytes. Made once by the caller, before its row loops.
struct StagedLane {
  uint32_t at, chunk;
  __device__ __forceinline__ StagedLane(uint32_t base, int lane)
      : at(base + static_cast<uint32_t>(lane / 16) * 8192 + static_cast<uint32_t>(lane % 2) * 8),
        chunk(static_cast<uint32_t>((lane % 16) / 2)) {}
  // Row r's 4 columns: one 8-byte shared read.
  __device__ __forceinline__ uint2 row(int r) const {
    uint2 v;
    asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];"
                 : "=r"(v.x), "=r"(v.y)
                 : "r"(at + static_cast<uint32_t>(r) * 128 + ((chunk ^ static_cast<uint32_t>(r % 8)) << 4)));
    return v;
  }
};

// bf16 C that TMA cannot store (row stride or N off the multiple of 8, gemm.h): each round is
// staged as above, then the warpgroup copies it out, warp w taking rows w, w + 4, ..., each
// lane 4 consecutive columns (one 8-byte shared read; the swizzle keeps a row's chunks within
// its 128 bytes): a warp's stores cover 256 contiguous bytes of a row, as one 8-byte store per
// lane where the row's address allows, else 4- and 2-byte pieces (the alignment is the same
// for every lane of the row). Elements past M and N are skipped. The next round's (or tile's)
// staging waits at the warpgroup's named barrier for every thread's reads.
template <int BN, int kFrag>
__device__ __forceinline__ void store_c_rows(const float (&acc)[kFrag], uint8_t* stage_buf, TileCoord tc,
                                             int cw, const GemmProblem& p) {
  const int t = threadIdx.x % 128;
  const int warp = t / 32, lane = t % 32;
  const uint32_t bar_id = 2 + cw;
  const int row0 = tc.m * kTileM + cw * 64;
  if (row0 >= p.M) return;
  const int rows = min(64, p.M - row0);
  const StagedLane staged(smem_u32(stage_buf), lane);
#pragma unroll
  for (int h = 0; h < kStoreRounds<BN, false>; ++h) {
    named_barrier_sync(bar_id, 128);  // the previous round's (tile's) reads are done
    stage_round<false>(acc, stage_buf, h);
    named_barrier_sync(bar_id, 128);
    // This lane's columns in range: inside the round (64 in BN = 192's last) and inside N.
    const int n = min(min(128, BN - h * 128), p.N - (tc.n * BN + h * 128)) - 4 * lane;
    uint16_t* row_ptr =
        reinterpret_cast<uint16_t*>(p.c_rows) + int64_t(row0) * p.c_rows_ld + tc.n * BN + h * 128 + 4 * lane;
#pragma unroll 2
    for (int r = warp; r < rows; r += 4) {
      const uint2 q = staged.row(r);
      const uint32_t v0 = q.x, v1 = q.y;
      uint16_t* d = row_ptr + int64_t(r) * p.c_rows_ld;
      const uintptr_t a = reinterpret_cast<uintptr_t>(d);
      if (n >= 4) {
        if ((a & 7) == 0) {
          *reinterpret_cast<uint2*>(d) = make_uint2(v0, v1);
        } else if ((a & 3) == 0) {
          reinterpret_cast<uint32_t*>(d)[0] = v0;
          reinterpret_cast<uint32_t*>(d)[1] = v1;
        } else {
          d[0] = static_cast<uint16_t>(v0);
          *reinterpret_cast<uint32_t*>(d + 1) = (v0 >> 16) | (v1 << 16);
          d[3] = static_cast<uint16_t>(v1 >> 16);
        }
      } else if (n > 0) {
        d[0] = static_cast<uint16_t>(v0);
        if (n > 1) d[1] = static_cast<uint16_t>(v0 >> 16);
        if (n > 2) d[2] = static_cast<uint16_t>(v1);
      }
    }
  }
}

// ---- the engine's shared memory, seen from an epilogue ---------------------------------------
// The dynamic shared memory's aux region (layout above) of an engine with this configuration,
// for the epilogue's consumer side (the engine's own layout below must agree).
template <int BN, int kStagingRounds>
__device__ __forceinline__ uint8_t* gemm_aux_smem() {
  using Cfg = GemmTileConfig<BN, kStagingRounds>;
  extern __shared__ __align__(128) uint8_t smem_raw[];
  const uintptr_t base = (reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023};
  return reinterpret_cast<uint8_t*>(base) + Cfg::kStages * Cfg::kStageBytes + 2 * Cfg::kStagingBytes;
}

// Consumer warpgroup cw's staging buffer (layout above), found the same way: an address derived
// from the shared-memory base, not a register kept live through the main loop.
template <int BN, int kStagingRounds>
__device__ __forceinline__ uint8_t* gemm_staging_smem(int cw) {
  using Cfg = GemmTileConfig<BN, kStagingRounds>;
  return gemm_aux_smem<BN, kStagingRounds>() - (2 - cw) * Cfg::kStagingBytes;
}

}  // namespace fusedcomm::kernels::detail
