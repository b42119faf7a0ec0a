// The engine itself (see gemm_sm90.cuh for its layout and ordering): the producer's TMA loads of
// a K slice, the consumers' wgmma of it, a finished tile handed to the epilogue, and
// gemm_sm90_body, the loop over the CTA's tiles (and its stream-K run) that every kernel of the
// engine calls.
#pragma once

#include <cstdint>

#include "kernels/common/sm90_primitives.cuh"
#include "kernels/common/wgmma_ops.cuh"
#include "kernels/gemm/detail/epilogue.cuh"
#include "kernels/gemm/detail/gemm_config.cuh"
#include "kernels/gemm/detail/stream_k.cuh"
#include "kernels/gemm/detail/tile_scheduler.cuh"

namespace fusedcomm::kernels::detail {

// ---- the engine's steps, shared by its round-robin and stream-K loops ------------------------
// Producer: arms stage `stage` for one K slice and issues its TMA loads (A rows a_row.. of
// a_map; B's N-block n_block, or this CTA's half of it in a CTA pair). b_off: rows of B's tensor
// map to skip (the schedule's b_offset: a grouped GEMM's weight of the tile's group), along N
// (kNK) or K (kKN).
template <int BN, bool kBKN, int kCluster, class Cfg>
__device__ __forceinline__ void load_stage(uint8_t* smem_a, uint8_t* smem_b, uint64_t* full, int stage,
                                           const CUtensorMap* a_map, const CUtensorMap& tm_b, int kb,
                                           int a_row, int n_block, int b_off = 0) {
  mbar_arrive_expect_tx(&full[stage], Cfg::kStageBytes);
  tma_load_2d(smem_a + stage * Cfg::kABytes, a_map, &full[stage], kb * kTileK, a_row);
  uint8_t* b_dst = smem_b + stage * Cfg::kBBytes;
  if constexpr (kCluster > 1) {
    // This CTA's half of B (rows, or 64-column slabs), into both CTAs (mask 0b11). kNK's
    // half starts at a multiple of 1024 B, so the 128-B swizzle pattern is unchanged.
    constexpr uint16_t kBoth = 3;
    const uint32_t crank = cluster_ctarank();  // read here: the producer has 40 registers
    if constexpr (!kBKN) {
      tma_load_2d_multicast(b_dst + crank * (Cfg::kBBytes / 2), &tm_b, &full[stage], kb * kTileK,
                            b_off + n_block * BN + static_cast<int>(crank) * (BN / 2), kBoth);
    } else {
#pragma unroll
      for (int j = 0; j < BN / 128; ++j) {
        const int slab = static_cast<int>(crank) * (BN / 128) + j;
        tma_load_2d_multicast(b_dst + slab * 8192, &tm_b, &full[stage], n_block * BN + slab * 64,
                              b_off + kb * kTileK, kBoth);
      }
    }
  } else if constexpr (!kBKN) {
    tma_load_2d(b_dst, &tm_b, &full[stage], kb * kTileK, b_off + n_block * BN);
  } else {
#pragma unroll
    for (int j = 0; j < BN / 64; ++j) {
      tma_load_2d(b_dst + j * 8192, &tm_b, &full[stage], n_block * BN + j * 64, b_off + kb * kTileK);
    }
  }
}

// Consumer warpgroup: the 4 wgmma (k16) of the K slice in `stage` into acc (accumulate false:
// the slice starts the sum), one wgmma group left in flight.
template <int BN, bool kBKN, class Cfg>
__device__ __forceinline__ void mma_stage(float (&acc)[BN / 2], uint32_t a_base, uint32_t b_base, int stage,
                                          bool accumulate) {
  const uint64_t da = smem_desc_sw128(a_base + stage * Cfg::kABytes, 16, 1024);
  uint64_t db;
  if constexpr (!kBKN) {
    db = smem_desc_sw128(b_base + stage * Cfg::kBBytes, 16, 1024);
  } else {
    db = smem_desc_sw128(b_base + stage * Cfg::kBBytes, 8192, 1024);
  }
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kTileK / 16; ++kk) {
    // K-major: +32 B per k16 inside the swizzled 128-B row; N-major: +16 rows of 128 B.
    const uint64_t dbk = db + (kBKN ? (kk * 2048) >> 4 : (kk * 32) >> 4);
    const uint64_t dak = da + ((kk * 32) >> 4);
    if constexpr (BN == 256) {
      wgmma_m64n256k16<kBKN ? 1 : 0>(acc, dak, dbk, accumulate || kk != 0);
    } else if constexpr (BN == 192) {
      wgmma_m64n192k16<kBKN ? 1 : 0>(acc, dak, dbk, accumulate || kk != 0);
    } else {
      wgmma_m64n128k16<kBKN ? 1 : 0>(acc, dak, dbk, accumulate || kk != 0);
    }
  }
  wgmma_commit();
  wgmma_wait<1>();
}

// Consumer warpgroup cw: a finished tile to C (through TMA when prob.c_tma) and to the
// epilogue (register path, sink, tile flags), for epilogues that do not own the tile.
template <int BN, int kStagingRounds, class Epilogue>
__device__ __forceinline__ void finish_tile(const float (&acc)[BN / 2], uint8_t* staging,
                                            const CUtensorMap& tm_c, TileCoord tc, int cw,
                                            const GemmProblem& prob, const Epilogue& epi) {
  const int warp = (threadIdx.x / 32) % 4;
  const int lane = threadIdx.x % 32;
  const bool rows_in = tc.m * kTileM + cw * 64 < prob.M;
  if (prob.c_tma == kCTmaBF16) {
    store_c_tma<BN, false, kStagingRounds>(acc, staging, &tm_c, tc, cw, rows_in);
  } else if (prob.c_tma == kCTmaF32) {
    store_c_tma<BN, true, kStagingRounds>(acc, staging, &tm_c, tc, cw, rows_in);
  } else if (prob.c_tma == kCRowsBF16) {
    store_c_rows<BN>(acc, staging, tc, cw, prob);
  }
  if (rows_in) {
    const int row0 = tc.m * kTileM + cw * 64 + warp * 16 + lane / 4;
    const int col0 = tc.n * BN + 2 * (lane % 4);
    epi.store(acc, row0, col0, prob);
  }
  if (epi.wants_tile_done()) {
    named_barrier_sync(1, 256);
    if (threadIdx.x == 128) epi.tile_done(tc, prob);
  }
}

// ---- the engine -----------------------------------------------------------------------------
// Every thread of the CTA (384) calls this once; it returns when the CTA has no more tiles (or
// stopped). The CTA's place among the computing CTAs comes from the schedule (cta(),
// num_ctas()). It uses the whole dynamic shared memory (GemmTileConfig<BN,
// Epilogue::kStagingRounds>::kSmemBytes) and named barriers 1..3; the caller may use barrier 0
// (__syncthreads) before the call only.
template <int BN, bool kBKN, class Epilogue, class Schedule>
__device__ __forceinline__ void gemm_sm90_body(const CUtensorMap& tm_a, const CUtensorMap& tm_b,
                                               const CUtensorMap& tm_c, const GemmProblem& prob,
                                               const Epilogue& epi, const Schedule& sched) {
  using Cfg = GemmTileConfig<BN, Epilogue::kStagingRounds>;
  constexpr int kStages = Cfg::kStages;
  constexpr bool kDyn = Schedule::kDynamic;
  constexpr int kCluster = Schedule::kCluster;
  static_assert(kCluster == 1 || (kCluster == 2 && !kDyn), "CTA pairs: static schedules only");
  constexpr bool kStreamK = schedule_stream_k<Schedule>::value;
  static_assert(!kStreamK || (!kDyn && kCluster == 1 && !Schedule::kStoresA && !Epilogue::kOwnsTile &&
                              !Epilogue::kInitAux),
                "stream-K: static single-CTA schedules, epilogues that leave the tile and the "
                "aux region to the engine");
  // 128-byte aligned, as the fused allGatherGemm's pulls stage their bulk copies there (every
  // kernel of a module shares one base): each kernel of the engine sees the same base whichever
  // other kernels its translation unit holds. The ring itself starts at the next 1024 bytes
  // (the 128-byte swizzle's pattern repeats every 1024).
  extern __shared__ __align__(128) uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) &
                                             ~static_cast<uintptr_t>(1023));
  uint8_t* smem_a = smem;
  uint8_t* smem_b = smem + kStages * Cfg::kABytes;
  uint8_t* staging = smem_b + kStages * Cfg::kBBytes;
  uint8_t* aux = staging + 2 * Cfg::kStagingBytes;  // where gemm_aux_smem finds it
  uint64_t* full = reinterpret_cast<uint64_t*>(aux + Cfg::kAuxBytes);
  uint64_t* empty = full + kStages;
  uint64_t* done = empty + kStages;  // CTA pairs: the partner's 8 consumer warps are done
  volatile uint32_t* status = reinterpret_cast<volatile uint32_t*>(done + 1);

  const int wg = threadIdx.x / 128;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], 8 * kCluster);
      status[s] = 0;
    }
    mbar_init(done, 8);
    if constexpr (Epilogue::kInitAux) Epilogue::init_aux(aux);
    mbar_init_fence();
  } else if (threadIdx.x == 32) {
    tma_prefetch_desc(&tm_a);
    tma_prefetch_desc(&tm_b);
    if (prob.c_tma == kCTmaBF16 || prob.c_tma == kCTmaF32) tma_prefetch_desc(&tm_c);
  }
  __syncthreads();
  // The partner's multicasts and arrivals target this CTA's barriers: initialised first.
  if constexpr (kCluster > 1) cluster_sync();
  // The consumers' last act (CTA pairs): tell the partner that this CTA's consumers are done
  // (after their last release, which arrives on the partner's empty barrier), then wait until
  // the partner's are. Then nothing of the partner touches this CTA's shared memory any more:
  // its producer's last multicasts landed before this CTA's consumers saw their full barriers.
  // (A cluster barrier would need the producer threads too; one in the producer's 40-register
  // region made ptxas spill.)
  auto leave_cluster = [done] {
    if constexpr (kCluster > 1) {
      if (threadIdx.x % 32 == 0) {
        mbar_arrive_cluster(mapa_shared(smem_u32(done), cluster_ctarank() ^ 1));
        mbar_wait_cluster(done, 0);
      }
      __syncwarp();
    }
  };

  if (wg == 0) {
    // ---------------- producer ----------------
    setmaxnreg_dec<RegisterSplit<Epilogue>::kProducer>();
    if constexpr (Epilogue::kAuxWarps) {
      const int w = threadIdx.x / 32;
      if (w == 1 || w == 2) {
        epi.aux_warp(w - 1, staging + (w - 1) * Cfg::kStagingBytes, aux);
        return;
      }
    }
    if (threadIdx.x != 0) return;
    const bool waits = sched.has_waits(prob);
    int stage = 0;
    uint32_t phase = 0;
    for (int t = kDyn ? sched.claim() : sched.cta(); t < prob.sweep;
         t = kDyn ? sched.claim() : t + sched.num_ctas()) {
      const TileCoord tc = sched.coord(prob, t);
      if (waits) {
        const bool ok = sched.template wait<BN>(prob, tc);
        if (!ok) {
          // Tell the consumers to stop at this tile: a stage that carries no data.
          mbar_wait(&empty[stage], phase ^ 1);
          status[stage] = kDyn ? kStageStop : 1u;
          mbar_arrive(&full[stage]);
          return;
        }
        fence_proxy_async_global();
      }
      int a_row = 0;
      const CUtensorMap* a_map = sched.a_source(&tm_a, tc, a_row);
      const int b_off = schedule_b_offset(sched, tc);
      for (int kb = 0; kb < prob.k_blocks; ++kb) {
        mbar_wait(&empty[stage], phase ^ 1);
        if (kDyn && kb == 0) status[stage] = static_cast<uint32_t>(t);
        load_stage<BN, kBKN, kCluster, Cfg>(smem_a, smem_b, full, stage, a_map, tm_b, kb, a_row, tc.n, b_off);
        if (++stage == kStages) {
          stage = 0;
          phase ^= 1;
        }
      }
    }
    if constexpr (kStreamK) {
      // The CTA's run of stream-K iterations: segments [kb0, kb1) of one tile each.
      const SkRun run = sk_run(prob, sched.cta(), sched.num_ctas());
      for (int it = run.it; it < run.end;) {
        const SkSegment sg = sk_segment(prob, it, run.end);
        const TileCoord tc = sched.coord(prob, prob.sweep + sg.ts);
        int a_row = 0;
        const CUtensorMap* a_map = sched.a_source(&tm_a, tc, a_row);
        for (int kb = sg.kb0; kb < sg.kb1; ++kb) {
          mbar_wait(&empty[stage], phase ^ 1);
          load_stage<BN, kBKN, 1, Cfg>(smem_a, smem_b, full, stage, a_map, tm_b, kb, a_row, tc.n);
          if (++stage == kStages) {
            stage = 0;
            phase ^= 1;
          }
        }
        it += sg.kb1 - sg.kb0;
      }
    }
    if constexpr (kDyn) {
      // The consumers cannot know the tile count: an empty stage ends their loop.
      mbar_wait(&empty[stage], phase ^ 1);
      status[stage] = kStageEnd;
      mbar_arrive(&full[stage]);
    }
  } else {
    // ---------------- consumers ----------------
    setmaxnreg_inc<RegisterSplit<Epilogue>::kConsumer>();
    const int cw = wg - 1;  // which 64-row half of the tile
    const int lane = threadIdx.x % 32;
    float acc[BN / 2];
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) acc[i] = 0.f;

    const uint32_t a_base = smem_u32(smem_a) + cw * 64 * 128;
    const uint32_t b_base = smem_u32(smem_b);
    // CTA pairs: the partner's producer refills this CTA's stages too, so its empty barrier
    // hears of the release as well. Its address is recomputed at each release (%cluster_ctarank
    // and mapa on lane 0): one more live register in this loop makes ptxas spill.
    auto release = [empty](int s) {
      mbar_arrive(&empty[s]);
      if constexpr (kCluster > 1) {
        mbar_arrive_remote(mapa_shared(smem_u32(&empty[s]), cluster_ctarank() ^ 1));
      }
    };
    int stage = 0;
    uint32_t phase = 0;
    // Schedule::kStoresA: the thread that copies the tile's A slices (see the concept above).
    constexpr bool kStoresA = Schedule::kStoresA;
    for (int t = kDyn ? 0 : sched.cta(); kDyn || t < prob.sweep; t += kDyn ? 0 : sched.num_ctas()) {
      TileCoord tc;
      if constexpr (!kDyn) tc = sched.coord(prob, t);
      int prev = 0;
      // The tile's first slice is waited for here, outside the MMA loop: no wgmma is in flight
      // at this point, so the early exit costs the steady state nothing.
      mbar_wait(&full[stage], phase);
      if constexpr (kDyn) {
        const uint32_t s = status[stage];
        if (s >= kStageEnd) break;  // no more tiles, or the producer stopped: no data
        tc = sched.coord(prob, static_cast<int>(s));
      } else if (status[stage] != 0) {  // the producer stopped (hook 1)
        if (threadIdx.x % 128 == 0) bulk_wait_all();
        sched.consumers_done();
        leave_cluster();
        return;
      }
      const bool store_a = kStoresA && threadIdx.x == 128 && sched.stores_a(tc);
      // The slices this tile stores: kb ≡ a_phase (mod a_stride); a stride of 1 stores all.
      const int a_stride = store_a ? sched.a_store_stride(prob) : 1;
      const int a_phase = tc.n % a_stride;
      bool stored_prev = false;
      for (int kb = 0; kb < prob.k_blocks; ++kb) {
        if (kb > 0) mbar_wait(&full[stage], phase);
        const bool store_slice = store_a && kb % a_stride == a_phase;
        if (store_slice) {
          // The slice landed (full barrier, async proxy); the store reads it in that proxy.
          tma_store_2d(&tm_a, smem_a + stage * Cfg::kABytes, kb * kTileK, tc.m * kTileM);
          bulk_commit();
        }
        mma_stage<BN, kBKN, Cfg>(acc, a_base, b_base, stage, kb != 0);
        if constexpr (Epilogue::kOwnsTile) {
          // Stage kb <= kStages - 1 of a tile is loaded as soon as both warpgroups finished
          // the previous tile's main loop, whatever the other warpgroup does next.
          if (kb == min(prob.k_blocks, kStages) - 1) epi.template main_loop_point<BN>(tc, cw);
        }
        // The previous slice's store has read its stage before the stage is released (all
        // but the store just issued, if any).
        if (stored_prev) {
          if (store_slice) {
            bulk_wait_read_keep<1>();
          } else {
            bulk_wait_read_all();
          }
        }
        stored_prev = store_slice;
        if (kb > 0 && lane == 0) release(prev);
        prev = stage;
        if (++stage == kStages) {
          stage = 0;
          phase ^= 1;
        }
      }
      wgmma_wait<0>();
      reg_fence(acc);
      if (store_a) bulk_wait_read_all();
      if (lane == 0) release(prev);

      if constexpr (Epilogue::kOwnsTile) {
        epi.template tile<BN>(acc, staging + cw * Cfg::kStagingBytes, tc, cw, prob);
      } else {
        finish_tile<BN, Epilogue::kStagingRounds>(acc, staging + cw * Cfg::kStagingBytes, tm_c, tc, cw, prob,
                                                  epi);
      }
    }
    if constexpr (kStreamK) {
      // The same run as the producer's. Each segment's partial goes to the workspace
      // (sk_arrive); the tiles whose last segment this warpgroup computed are summed and
      // stored after its last wgmma (sk_sum).
      const int c = sched.cta();
      const SkRun run = sk_run(prob, c, sched.num_ctas());
      int store0 = -1, store1 = -1;  // tiles whose last segment this warpgroup computed
      for (int it = run.it; it < run.end;) {
        const SkSegment sg = sk_segment(prob, it, run.end);
        const int ts = sg.ts, kb0 = sg.kb0, kb1 = sg.kb1;
        // A fragment per segment, dead after sk_arrive: one that lived on through the next
        // segment's wgmma made ptxas serialise every wgmma of the kernel (C7515).
        float seg[BN / 2];
#pragma unroll
        for (int i = 0; i < BN / 2; ++i) seg[i] = 0.f;
        int prev = 0;
        for (int kb = kb0; kb < kb1; ++kb) {
          mbar_wait(&full[stage], phase);
          mma_stage<BN, kBKN, Cfg>(seg, a_base, b_base, stage, kb != kb0);
          if (kb > kb0 && lane == 0) release(prev);
          prev = stage;
          if (++stage == kStages) {
            stage = 0;
            phase ^= 1;
          }
        }
        wgmma_wait<0>();
        reg_fence(seg);
        if (lane == 0) release(prev);
        // A warpgroup whose rows are all past M has nothing to add or store.
        const int rows = prob.M - (sched.coord(prob, prob.sweep + ts).m * kTileM + cw * 64);
        if (rows > 0 && sk_arrive<BN>(seg, prob, ts, c, run.G, cw, rows, aux)) {
          (store0 < 0 ? store0 : store1) = ts;
        }
        it += kb1 - kb0;
      }
      // The sums copy partials into the A/B ring: both warpgroups' wgmma have finished reading
      // it (each waited for its last), and the producer has no load outstanding (every stage
      // it filled in this run was consumed). Both warpgroups walk the same run, so both reach
      // this barrier, summing or not.
      if (run.it < run.end) named_barrier_sync(1, 256);
#pragma unroll 1
      for (int i = 0; i < 2; ++i) {
        const int ts = i == 0 ? store0 : store1;
        if (ts < 0) break;
        const TileCoord tc = sched.coord(prob, prob.sweep + ts);
        sk_sum<BN, sk_sum_depth<Cfg>()>(acc, prob, ts, run.G, cw, prob.M - (tc.m * kTileM + cw * 64),
                                        smem + (cw == 0 ? 0 : kStages * Cfg::kStageBytes / 2));
        finish_tile<BN, Epilogue::kStagingRounds>(acc, staging + cw * Cfg::kStagingBytes, tm_c, tc, cw, prob,
                                                  epi);
      }
    }
    // Smem must outlive the stores' reads, and the A stores must be complete.
    if ((prob.c_tma || kStoresA) && threadIdx.x % 128 == 0) bulk_wait_all();
    if constexpr (Epilogue::kOwnsTile) epi.consumers_end();
    sched.consumers_done();
    leave_cluster();
  }
}

}  // namespace fusedcomm::kernels::detail
