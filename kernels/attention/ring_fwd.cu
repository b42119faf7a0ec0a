// The ring attention forward's persistent kernel and its launcher (ring_fwd.h has the order of
// the work and the waits).
#include "kernels/attention/ring_fwd.h"

#include <algorithm>
#include <cmath>

#include "kernels/attention/detail/bshd_map.h"
#include "kernels/attention/detail/flash_fwd.cuh"
#include "kernels/attention/detail/ring_sync.cuh"
#include "kernels/attention/tuning.h"
#include "kernels/common/comm_protocol.cuh"
#include "kernels/common/fused_launch.cuh"

namespace fusedcomm::kernels {

namespace detail {

// A run of work items: a pull (pair < 0) or the tiles of one pair.
struct RingSeg {
  int pair, step, begin, end;
};
// What a tile item needs beyond its FlashParams.
struct RingTile {
  int step, q_row0, k_row0, merge, tile_base;
};

// counters: [0] the item counter, [1] CTAs finished, [2 + s] pull(s)'s chunks done,
// [2 + kCommMaxRanks + s] step s's tiles done, [2 + 2 kCommMaxRanks + s] tag(s + 1) published
// (s = 0: the start tag), then one merge counter per query tile.
inline constexpr int kRingCtrPulled = 2;
inline constexpr int kRingCtrComputed = 2 + kCommMaxRanks;
inline constexpr int kRingCtrPublished = 2 + 2 * kCommMaxRanks;
inline constexpr int kRingCtrTiles = 2 + 3 * kCommMaxRanks;

struct RingFwdKParams {
  CUtensorMap tm_q;
  CUtensorMap tm_k[kCommMaxRanks];
  CUtensorMap tm_v[kCommMaxRanks];
  FlashParams fp[kRingFwdMaxPairs];
  RingTile tile[kRingFwdMaxPairs];
  RingSeg seg[kCommMaxRanks + kRingFwdMaxPairs];
  const uint8_t* pull_src[kCommMaxRanks];
  uint8_t* pull_dst[kCommMaxRanks];
  uint64_t pull_bytes[kCommMaxRanks];
  uint64_t chunk_bytes[kCommMaxRanks];
  uint32_t chunks[kCommMaxRanks];      // pull(s)'s chunks (at least 1 for s >= 1)
  uint32_t step_tiles[kCommMaxRanks];  // step s's tile items
  CommDevice dev;
  uint64_t* ctr;
  int n_segs, n_items, q_heads;
};

// The item a CTA runs next, broadcast through shared memory.
struct RingItem {
  int kind;  // kRingItemEnd, kRingItemPull or kRingItemTile
  int a;     // pull: the step; tile: the pair
  int chunk, m_tile, h, b;
};
inline constexpr int kRingItemEnd = -1, kRingItemPull = 0, kRingItemTile = 1;
// Named barriers: every item (all threads), the consumers alone. The consumer loop's turns take
// 2 .. 2 + kWG - 1 (flash_consume_tile).
inline constexpr uint32_t kRingBarItem = 1, kRingBarConsumers = 8;

__device__ __forceinline__ uint64_t ring_tag(uint64_t epoch, uint32_t j) {
  return (epoch << kCommPipeRoundBits) | j;
}

// One thread: takes the next item and makes its waits. kRingItemEnd past the last item or
// after a failure of this rank (recorded by whichever wait gave up first).
template <int kBM>
__device__ __forceinline__ void ring_next_item(const RingFwdKParams& P, uint64_t epoch, bool causal,
                                               RingItem& out, FlashParams& fp_out) {
  const CommDevice& d = P.dev;
  out.kind = kRingItemEnd;
  const int idx = static_cast<int>(atomicAdd(reinterpret_cast<unsigned long long*>(&P.ctr[0]), 1ull));
  if (idx >= P.n_items || comm_failed(d)) return;
  int g = 0;
  while (idx >= P.seg[g].end) ++g;
  const RingSeg seg = P.seg[g];
  const int local = idx - seg.begin;
  if (seg.pair < 0) {
    const int s = seg.step;
    const int pred = (d.rank + d.world - 1) % d.world, succ = (d.rank + 1) % d.world;
    const CommFlags* mine = comm_flags(d, d.rank);
    // Tags go out in order: tag(s + 1), which this pull publishes, means to its readers that
    // every earlier pull is done too, so tag(s) must be out first (pulls of consecutive steps
    // need nothing else from each other and could finish in either order).
    if (!comm_wait_flag_inline(d, &P.ctr[kRingCtrPublished + s - 1], 1, kRingOp, kRingStepBlock, d.rank,
                               kRingTimeoutScale, true)) {
      return;
    }
    if (s >= 2 && !comm_wait_flag_inline(d, &P.ctr[kRingCtrComputed + s - 2], P.step_tiles[s - 2], kRingOp,
                                         kRingStepBlock, d.rank, kRingTimeoutScale, true)) {
      return;
    }
    if (!comm_wait_flag_inline(d, &mine->ring[pred], ring_tag(epoch, s), kRingOp, kRingStepBlock, pred,
                               kRingTimeoutScale) ||
        !comm_wait_flag_inline(d, &mine->ring[succ], ring_tag(epoch, s), kRingOp, kRingStepBlock, succ,
                               kRingTimeoutScale)) {
      ring_name_absent_rank(d, ring_tag(epoch, 1));
      return;
    }
    out.kind = kRingItemPull;
    out.a = s;
    out.chunk = local;
    return;
  }
  const RingTile& t = P.tile[seg.pair];
  if (t.step >= 1 && !comm_wait_flag_inline(d, &P.ctr[kRingCtrPulled + t.step], P.chunks[t.step], kRingOp,
                                            kRingStepBlock, d.rank, kRingTimeoutScale, true)) {
    return;
  }
  const FlashParams& fp = P.fp[seg.pair];
  const int mt = local % fp.m_tiles;
  const int rest = local / fp.m_tiles;
  out.kind = kRingItemTile;
  out.a = seg.pair;
  out.m_tile = causal ? fp.m_tiles - 1 - mt : mt;
  out.h = rest % P.q_heads;
  out.b = rest / P.q_heads;
  fp_out = fp;
}

template <int D, int kWG, int kLoop>
__global__ void __launch_bounds__(128 * (kWG + 1), 1)
    ring_fwd_kernel(const __grid_constant__ RingFwdKParams P) {
  using C = FlashCfg<D, kWG>;
  constexpr int kBM = C::kBM, kBN = C::kBN;
  constexpr int kConsumers = 128 * kWG;
  extern __shared__ __align__(128) uint8_t smem_raw[];
  const FlashSmem<D, kWG> sm(smem_raw);
  __shared__ RingItem s_item[2];
  __shared__ FlashParams s_fp[2];
  const CommDevice& d = P.dev;
  const uint64_t epoch = comm_launch_epoch(d);  // CommControl::epoch + 1 (a CTA barrier inside)
  const bool causal = P.fp[0].causal != 0;
  if (threadIdx.x == 0) {
    sm.init();
    if (blockIdx.x == 0 && d.world > 1 && !comm_failed(d)) {
      // Buffer 0 holds this rank's block (packed before the launch, stream order): the start
      // tag to every peer, after the launch signature (ring.h "start").
      comm_publish_signature(d, epoch);
      __threadfence_system();
      for (int i = 1; i < d.world; ++i) {
        st_release_sys(&comm_flags(d, (d.rank + i) % d.world)->ring[d.rank], ring_tag(epoch, 1));
      }
      st_release_gpu(&P.ctr[kRingCtrPublished], 1);
    }
  } else if (threadIdx.x == 32) {
    tma_prefetch_desc(&P.tm_q);
  }
  __syncthreads();

  // Each role has its own loop (the register split of setmaxnreg holds per code path); both
  // meet at the CTA barrier of every item (kRingBarItem, all threads).
  const int wg = threadIdx.x / 128;
  const int t = threadIdx.x % 128;
  const int lane = t % 32;
  FlashRing ring;
  if (wg == 0) {
    // ---------------- producer warpgroup: thread 0 loads the tiles' Q, K and V ----------------
    setmaxnreg_dec<C::kProducerRegs>();
    for (int it = 0;; ++it) {
      named_barrier_sync(kRingBarItem, C::kThreads);
      const volatile RingItem* vi = &s_item[it & 1];
      const int kind = vi->kind;
      if (kind == kRingItemEnd) break;
      if (kind != kRingItemTile || threadIdx.x != 0) continue;
      const FlashParams& p = s_fp[it & 1];
      const int m0 = vi->m_tile * kBM;
      const int n_blocks = (flash_tile_keys(p, m0, kBM) + kBN - 1) / kBN;
      if (n_blocks == 0) continue;
      const RingTile& tl = P.tile[vi->a];
      // The block was stored by this GPU's generic proxy (a pull); TMA reads it.
      if (tl.step >= 1) fence_proxy_async_global();
      const int h = vi->h;
      flash_load_tile<D, kWG>(sm, &P.tm_q, &P.tm_k[tl.step], &P.tm_v[tl.step], tl.q_row0 + m0, tl.k_row0, h,
                              h / p.group, vi->b, n_blocks, ring);
    }
    return;
  }
  // ---------------- consumer warpgroups: the tiles' math, the pulls' copies ----------------
  setmaxnreg_inc<C::kConsumerRegs>();
  uint32_t q_phase = 0;
  for (int it = 0;; ++it) {
    const int slot = it & 1;
    // The consumers' first thread takes the next item (registers to spare, unlike the
    // producer's); slot it & 1 is free: everyone read it before the previous barrier.
    if (threadIdx.x == 128) ring_next_item<kBM>(P, epoch, causal, s_item[slot], s_fp[slot]);
    named_barrier_sync(kRingBarItem, C::kThreads);
    const volatile RingItem* vi = &s_item[slot];
    const int kind = vi->kind;
    if (kind == kRingItemEnd) break;
    if (kind == kRingItemPull) {
      const int s = vi->a;
      const uint64_t begin = static_cast<uint64_t>(vi->chunk) * P.chunk_bytes[s];
      const uint64_t end = min(begin + P.chunk_bytes[s], P.pull_bytes[s]);
      const uint4* src = reinterpret_cast<const uint4*>(P.pull_src[s]);
      uint4* dst = reinterpret_cast<uint4*>(P.pull_dst[s]);
      constexpr int kUnroll = 4;
      uint64_t i = begin / 16 + (threadIdx.x - 128);
      const uint64_t n = end > begin ? end / 16 : 0;
      for (; i + (kUnroll - 1) * kConsumers < n; i += kUnroll * kConsumers) {
        uint4 v[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) v[u] = __ldcg(src + i + u * kConsumers);
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) __stcg(dst + i + u * kConsumers, v[u]);
      }
      for (; i < n; i += kConsumers) __stcg(dst + i, __ldcg(src + i));
      named_barrier_sync(kRingBarConsumers, kConsumers);
      if (threadIdx.x == 128) {
        // comm_protocol.cuh's grid-level publish: every chunk's CTA fences after its stores,
        // the chunk that completes the pull fences again and releases the flag.
        __threadfence_system();
        const uint64_t done =
            atomicAdd(reinterpret_cast<unsigned long long*>(&P.ctr[kRingCtrPulled + s]), 1ull);
        if (done + 1 == P.chunks[s] && !comm_failed(d)) {
          __threadfence_system();
          const int pred = (d.rank + d.world - 1) % d.world, succ = (d.rank + 1) % d.world;
          st_release_sys(&comm_flags(d, pred)->ring[d.rank], ring_tag(epoch, s + 1));
          if (succ != pred) st_release_sys(&comm_flags(d, succ)->ring[d.rank], ring_tag(epoch, s + 1));
          st_release_gpu(&P.ctr[kRingCtrPublished + s], 1);
        }
      }
      continue;
    }
    // A tile. Only what the consumer loop needs stays in registers across it; the rest is
    // read again from shared memory afterwards (it stays there until the next item barrier).
    const FlashParams& p = s_fp[slot];
    int m0 = vi->m_tile * kBM;
    const int n_blocks = (flash_tile_keys(p, m0, kBM) + kBN - 1) / kBN;
    float o[D / 2];
    float mx[2], l[2];
    flash_consume_tile<D, kWG, kLoop>(p, sm, m0, m0 + (wg - 1) * 64 + (t / 32) * 16 + lane / 4, n_blocks,
                                      q_phase, ring, o, mx, l);
    if (n_blocks > 0) q_phase ^= 1;
    const int pair = vi->a, ib = vi->b, ih = vi->h, imt = vi->m_tile;
    const RingTile& tl = P.tile[pair];
    uint64_t* merged =
        p.acc != 0 ? &P.ctr[kRingCtrTiles + tl.tile_base + (ib * P.q_heads + ih) * p.m_tiles + imt] : nullptr;
    bool ok = true;
    if (merged != nullptr && tl.merge > 0) {
      // The previous pair of this query tile has merged (ring order); each thread acquires it.
      if (lane == 0) {
        ok = comm_wait_flag_inline(d, merged, static_cast<uint64_t>(tl.merge), kRingOp, kRingStepBlock,
                                   d.rank, kRingTimeoutScale, true);
      }
      ok = __shfl_sync(0xffffffffu, ok ? 1 : 0, 0) != 0;
      if (ok) (void)ld_acquire_gpu(merged);
    }
    const int row0 = imt * kBM + (wg - 1) * 64 + (t / 32) * 16 + lane / 4;  // and row0 + 8
    if (ok) flash_epilogue<D>(p, o, mx, l, ib, ih, row0, lane);
    named_barrier_sync(kRingBarConsumers, kConsumers);
    if (threadIdx.x == 128) {
      __threadfence();
      if (merged != nullptr) st_release_gpu(merged, static_cast<uint64_t>(tl.merge + 1));
      atomicAdd(reinterpret_cast<unsigned long long*>(&P.ctr[kRingCtrComputed + tl.step]), 1ull);
    }
  }
  // The last CTA to finish: the end barrier (succ's last pull from this rank's buffers), then
  // the epoch. Every CTA read the epoch at its start, before it counted itself here.
  if (threadIdx.x == 128) {
    __threadfence();
    const uint64_t done = atomicAdd(reinterpret_cast<unsigned long long*>(&P.ctr[1]), 1ull);
    if (done + 1 == gridDim.x && d.world > 1) {
      if (!comm_failed(d)) {
        const int succ = (d.rank + 1) % d.world;
        if (!comm_wait_flag_inline(d, &comm_flags(d, d.rank)->ring[succ], ring_tag(epoch, d.world), kRingOp,
                                   kCommStepDone, succ, kRingTimeoutScale)) {
          ring_name_absent_rank(d, ring_tag(epoch, 1));
        }
      }
      *reinterpret_cast<volatile uint64_t*>(&comm_control(d)->epoch) = epoch;
    }
  }
}

template <int D, int kWG, int kLoop>
cudaError_t launch_ring_cfg(const CommDevice& dev, const RingFwdArgs& a, cudaStream_t stream) {
  using C = FlashCfg<D, kWG>;
  const int W = dev.world;
  RingFwdKParams P{};
  P.dev = dev;
  P.dev.launch_sig = comm_launch_signature(kRingOp, static_cast<uint32_t>(CommDtype::kBF16), 0, a.sig_size);
  P.ctr = a.counters;
  P.q_heads = static_cast<int>(a.q_heads);
  const int64_t Hq = a.q_heads, Hkv = a.kv_heads, B = a.batch, S = a.rows;
  // A rank without query rows has no tiles (its q may be null) but still relays the blocks.
  if (S > 0 && !encode_bshd(&P.tm_q, attn_dense(a.q, S, Hq, D), B, S, Hq, D, C::kBM))
    return cudaErrorInvalidValue;
  for (int s = 0; s < W; ++s) {
    const RingFwdStep& st = a.steps[s];
    if (!aligned16(st.k) || !aligned16(st.v) || st.pull_bytes % 16 != 0) return cudaErrorInvalidValue;
    if (!encode_bshd(&P.tm_k[s], attn_dense(st.k, st.rows, Hkv, D), B, st.rows, Hkv, D) ||
        !encode_bshd(&P.tm_v[s], attn_dense(st.v, st.rows, Hkv, D), B, st.rows, Hkv, D)) {
      return cudaErrorInvalidValue;
    }
  }
  const float scale = a.scale != 0.0f ? a.scale : 1.0f / std::sqrt(static_cast<float>(D));
  // Merge counters: one run per query chunk (pairs with the same q_row0), (B, Hq, m_tiles).
  int tile_words = 0;
  for (int i = 0; i < a.n_pairs; ++i) {
    const RingFwdPair& r = a.pairs[i];
    FlashParams& p = P.fp[i];
    p.o = r.writes_o ? a.o + r.q_row0 * Hq * D : nullptr;
    p.o_sh = D;
    p.o_ss = Hq * D;
    p.o_sb = S * Hq * D;
    p.lse = a.lse + r.q_row0;
    p.lse_sh = S;
    p.lse_sb = Hq * S;
    p.o_acc = a.o_acc + r.q_row0 * Hq * D;
    p.acc_sb = S * Hq * D;
    p.acc = r.k_count == 0 ? 0 : (r.merge == 0 ? 1 : 2);
    p.q_len = static_cast<int>(r.q_count);
    p.kv_len = static_cast<int>(r.k_count);
    p.q_heads = static_cast<int>(Hq);
    p.group = static_cast<int>(Hq / Hkv);
    p.m_tiles = static_cast<int>((r.q_count + C::kBM - 1) / C::kBM);
    p.causal = a.causal ? 1 : 0;
    p.delta = flash_causal_delta(r.q_pos, r.k_pos, r.q_count, r.k_count);
    p.scale_log2 = scale * 1.4426950408889634f;
    RingTile& t = P.tile[i];
    t.step = r.step;
    t.q_row0 = static_cast<int>(r.q_row0);
    t.k_row0 = static_cast<int>(r.k_row0);
    t.merge = r.merge;
    t.tile_base = -1;
    for (int j = 0; j < i; ++j) {
      if (a.pairs[j].q_row0 == r.q_row0) t.tile_base = P.tile[j].tile_base;
    }
    if (t.tile_base < 0) {
      t.tile_base = tile_words;
      tile_words += static_cast<int>(B * Hq * p.m_tiles);
    }
  }
  // The work list (ring_fwd.h): per step, the next step's pull, then the step's tiles.
  const int sms = device_sms(dev);
  int n = 0, segs = 0;
  for (int s = 0; s < W; ++s) {
    if (s + 1 < W) {
      const int q = s + 1;
      const uint64_t bytes = a.steps[q].pull_bytes;
      // Chunks of at least 64 KiB, at most tuning::kRingPullChunks (and one per SM).
      const uint64_t parts = static_cast<uint64_t>(std::min(sms, tuning::kRingPullChunks));
      uint64_t chunk = (bytes + parts - 1) / parts;
      chunk = (std::max<uint64_t>(chunk, 64 << 10) + 15) / 16 * 16;
      P.pull_src[q] = static_cast<const uint8_t*>(a.steps[q].pull_src);
      P.pull_dst[q] = static_cast<uint8_t*>(a.steps[q].pull_dst);
      P.pull_bytes[q] = bytes;
      P.chunk_bytes[q] = chunk;
      P.chunks[q] = static_cast<uint32_t>(std::max<uint64_t>(1, (bytes + chunk - 1) / chunk));
      P.seg[segs++] = RingSeg{-1, q, n, n + static_cast<int>(P.chunks[q])};
      n += static_cast<int>(P.chunks[q]);
    }
    for (int i = 0; i < a.n_pairs; ++i) {
      if (a.pairs[i].step != s) continue;
      const int items = static_cast<int>(P.fp[i].m_tiles * B * Hq);
      if (items == 0) continue;
      P.seg[segs++] = RingSeg{i, s, n, n + items};
      P.step_tiles[s] += static_cast<uint32_t>(items);
      n += items;
    }
  }
  P.n_segs = segs;
  P.n_items = n;
  if (n == 0) return cudaSuccess;
  if (cudaError_t e = cudaMemsetAsync(a.counters, 0, ring_fwd_counter_words(a) * 8, stream);
      e != cudaSuccess) {
    return e;
  }
  auto kernel = ring_fwd_kernel<D, kWG, kLoop>;
  if (cudaError_t e =
          cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmemBytes);
      e != cudaSuccess) {
    return e;
  }
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(std::min(sms, n)));
  cfg.blockDim = dim3(C::kThreads);
  cfg.dynamicSmemBytes = C::kSmemBytes;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeCooperative;  // every CTA resident: they wait for each other
  attr[0].val.cooperative = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, kernel, P);
}

}  // namespace detail

uint64_t ring_fwd_counter_words(const RingFwdArgs& a) {
  // Merge counters: at most one per (query chunk, 64-row tile, head, batch) at any tile height.
  const uint64_t tiles = static_cast<uint64_t>((a.rows + 63) / 64 + 2) * a.q_heads * a.batch;
  return detail::kRingCtrTiles + tiles;
}

int ring_fwd_grid(const CommDevice& dev, const RingFwdArgs&) { return detail::device_sms(dev); }

cudaError_t launch_ring_fwd(const CommDevice& dev, const RingFwdArgs& a, cudaStream_t stream) {
  if (a.head_dim != 64 && a.head_dim != 128) return cudaErrorInvalidValue;
  if (a.n_pairs < 0 || a.n_pairs > kRingFwdMaxPairs || dev.world < 1 || dev.world > kCommMaxRanks)
    return cudaErrorInvalidValue;
  if (a.q_heads <= 0 || a.kv_heads <= 0 || a.q_heads % a.kv_heads != 0 || a.counters == nullptr ||
      a.lse == nullptr || a.o_acc == nullptr || !detail::aligned16(a.q) || !detail::aligned16(a.o)) {
    return cudaErrorInvalidValue;
  }
  // No work anywhere (batch is the same on every rank). A rank without rows of its own still
  // launches at W >= 2: its neighbours' blocks pass through its buffers.
  if (a.batch == 0 || (a.rows == 0 && dev.world == 1)) return cudaSuccess;
  if (a.head_dim == 128) {
    return detail::launch_ring_cfg<128, tuning::kAttnWarpgroups128, tuning::kAttnLoop128>(dev, a, stream);
  }
  return detail::launch_ring_cfg<64, tuning::kAttnWarpgroups64, tuning::kAttnLoop64>(dev, a, stream);
}

}  // namespace fusedcomm::kernels
