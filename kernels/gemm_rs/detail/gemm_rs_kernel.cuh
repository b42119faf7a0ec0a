// The fused gemmReduceScatter kernel (gemm_rs.h): partial half-tiles pushed to their owners,
// which sum them in the epilogue of their own tiles, in one persistent grid (one CTA per SM,
// all resident: cooperative launch; 384 threads per CTA). Every CTA runs the GEMM engine of
// gemm_sm90.cuh (gemm_sm90_body) with a dynamic tile schedule (RsSchedule) and its own epilogue
// (RsEpilogue); every CTA reads the launch epoch first (comm_launch_epoch) and ends with
// fused_finish. Host side: gemm_rs.cu (geometry, pacing, launch).
//
// Owner o of rows [off_o, end_o) (the split rule) gets the bf16 sum over ranks s of A_s·W_sᵀ on
// its rows. Every rank computes its whole M×N partial product with the engine, and its
// epilogue works per 64-row half-tile (one consumer warpgroup, rows [h0, h0 + 64)):
// - rows another rank o owns are PUSHED: the consumers stage the half-tile in shared memory
//   and hand it to their pusher warp (below), which stores it over NVLink into o's receive slot
//   for this rank, or, in the accumulating mode, adds it into o's one receive slot (below), and
//   raises the half-tile's flag in o's region (FusedFlags::rs_tile) once the stores are
//   complete;
// - rows this rank owns are REDUCED: after the warpgroup's last handoff is freed, one thread
//   waits for the W-1 peers' flags of the half-tile, then the warpgroup adds the received
//   partials (local loads from its receive slots) and its accumulator, in fp32, and stores the
//   bf16 sums once (TMA). With bf16 partials the accumulator stays fp32: only the terms that
//   travel are rounded (rounding it too, as the decomposed path does, cost 1 % at W = 2;
//   docs/ops.md states the contract).
//   Early fetch (W = 2, bf16 partials; RsParams::prefetch): where the peer's partial of an
//   own half-tile is already flagged early in that tile's main loop (and the staging buffer is
//   already free), the issuing thread TMA-loads it into the staging buffer then (the whole
//   half-tile fits its two rounds), and the epilogue adds it from shared memory. Per-source
//   slots: in rank order, (((0 + P_0) + P_1) + ...). Accumulating: P_r + (the peers'
//   partials, added in the order they arrived).
// A half-tile holding rows of two owners (W not dividing M at a 64-row boundary) is pushed
// whole to each other owner (its rows before that owner's land in the slot's padding), and
// this rank's part of it goes to the output by the register path.
//
// Receive slots: owner o's data area at ws_offset holds slots (below) of each
// kFusedRsSlotPadRows + ceil(M/W) rows × N partials: after the padding, a slot's row i = row
// off_o + i. (A half-tile that begins before off_o is stored from the padding on, and the
// early fetch's TMA box never starts at a negative row.)
// - Per-source slots (the default; always at W = 2): W-1 slots, slot (s < o ? s : s - 1) for
//   source s, written by plain stores.
// - Accumulating (W >= 3 and the caller allows any order, RsPartials::kF32AnyOrder;
//   RsParams::accumulate): one slot, which every source adds into (red.add.v4.f32, atomic per
//   element). The owner's launcher zeroes its own rows of it on the stream before the kernel,
//   so the start barrier (below) orders the zeroing before every peer's first add. The owner
//   then loads one slot instead of W-1 (at W = 8, 1/7 of the loads that dominate the own
//   half-tiles). The price: the fp32 sum's order depends on arrival, so results may differ in
//   the last bits between runs and from the decomposed path.
//
// Pusher warps (RsEpilogue::aux_warp): the consumers only stage a pushed half-tile in shared
// memory (two 16 KiB rounds per handoff, 3 operand stages instead of 4) and hand it to a helper
// warp of the producer warpgroup, which stores it to the owner with st.global (or
// red.add.v4.f32 into an accumulating slot) and raises the flag itself. Neither the consumers
// nor the TMA unit (the GEMM's loads) wait for NVLink (measured faster than TMA stores issued
// by the consumers: docs/performance.md), and a flag does not depend on the warpgroup's later
// progress.
//
// Tile order (RsSchedule::coord): a rank sweeps first the M-blocks holding none of its rows,
// starting after its own blocks and wrapping around (owners r+1, r+2, ...: at any time each
// owner receives from about one source), then its own blocks [own_b0, own_b0 + own_nb).
// Its own blocks were in every peer's first part, so their pushes are long done when it gets
// there; no partial is stored locally and no reduction pass follows the GEMM.
//
// No deadlock: a warpgroup waits only in its own-row half-tiles, and a pusher warp waits only
// for its warpgroup's handoffs and the owners' start flags, so every half-tile handed off is
// flagged without further progress of its warpgroup. Every rank sweeps its first part (pushes
// only, no wait) before its own blocks, and its own blocks in one global order (physical
// M-block raster, columns ascending within a block, so a block shared by two owners is swept
// in the same column order by both). Take the wait on the smallest half-tile in that order
// that never completes: its pushers either claimed it (their warpgroups hand off before any
// wait, and can only be stuck on larger ones, or on their first part, which never waits) or
// will claim it (everything before it in their sweep is a push or a smaller own half-tile).
// Either way it completes: contradiction. The waits stay bounded (a dead peer): the first one
// that gives up records the failure. tests/rs_protocol_model.py searches this protocol for
// deadlocks under random scheduling.
//
// Start barrier: a source writes into o's slots only after o's arrive flag for this launch
// (o's earlier ops on its stream, which may use its data area, are complete, and so is the
// zeroing of an accumulating slot, enqueued just before the kernel). End barrier as
// the other fused ops (fused_finish), which also checks the launch signatures.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/common/fused_protocol.cuh"
#include "kernels/common/fused_schedule.cuh"
#include "kernels/gemm/detail/gemm_sm90.cuh"
#include "kernels/gemm_rs/gemm_rs.h"

namespace fusedcomm::kernels::detail {

struct RsParams {
  // [o]: o's receive slot for this rank, or o's one slot (accumulate) (o != rank, o with rows),
  // as a 2-D tensor: the launch encodes (so checks) each; the pusher warps store with plain
  // addresses (send_rows).
  CUtensorMap tm_push[kCommMaxRanks];
  CUtensorMap tm_out;  // this rank's output rows (split_count × N bf16)
  CommDevice dev;
  __nv_bfloat16* out;
  uint64_t ws_offset;   // the receive slots in every rank's data area
  uint64_t slot_elems;  // (kFusedRsSlotPadRows + ceil(M/W)) * N: a slot, its padding first
  int accumulate;       // 1: every source adds into one slot (see above); 0: per-source slots
  int M, N;
  int tile_n;          // the GEMM's tile width, the same on every rank
  int n_blocks;        // tile columns
  int own_b0, own_nb;  // this rank's M-blocks: those holding any of its rows
  // The pusher warps' sleep after every 2 KiB of stores (0: none): rs_geometry's pacing.
  uint32_t push_pace_ns;
  int halves;         // half-tile rows of one slot's flags (ceil(ceil(M/W) / 64) + 1)
  int bf16_partials;  // 1: the pushed partials are bf16, else fp32
  int reserved;       // 0 (keeps the parameter layout of the kernels)
  // Own half-tiles fetch their one received slot early ("Early fetch" above; W = 2, bf16
  // partials): tm_recv maps this rank's slot (padding + its rows, × N bf16, 64×64 boxes).
  int prefetch;
  CUtensorMap tm_recv;
};

// The flag of half-tile (h, n) pushed by `src` into `owner`'s receive slot, in owner's region.
__device__ __forceinline__ uint64_t* rs_flag(const RsParams& p, int owner, int src, int h, int n) {
  const int W = p.dev.world;
  const int slot = src < owner ? src : src - 1;
  const int h_first = static_cast<int>(split_offset(p.M, W, owner) / 64);
  return &fused_flags(p.dev, owner)->rs_tile[(slot * p.halves + h - h_first) * p.n_blocks + n];
}

// Kernel start, one thread: the signature, then the arrive flags (start barrier, signal side;
// CommFlags::arrive ordering: stream order puts this rank's earlier ops before the kernel).
inline __device__ __noinline__ void rs_start(const CommDevice& d, uint64_t epoch) {
  comm_publish_signature(d, epoch);  // before this thread's first release (CommFlags::launch)
  __threadfence_system();
  comm_signal_peers(
      d, [&](CommFlags* f) { return &f->arrive[d.rank]; }, epoch);
}

// Pusher warps (RsEpilogue::aux_warp): warp 1 + cw of the producer warpgroup sends consumer
// warpgroup cw's pushes. Handoff k: the warpgroup waits until handoff k-1 is `freed`, writes
// the staging buffer (2 rounds: a bf16 half-tile, or half an fp32 one) and this mail, and
// arrives on `staged` (release, CTA scope; the warpgroup's named barrier before puts every
// thread's staging writes before the arrival). The pusher waits on `staged` (acquire), reads
// the staging buffer into st.global stores to each owner's receive slot (NVLink; the TMA unit
// stays with the GEMM's loads), arrives on `freed` once every lane issued its last store (so
// every staging read is done), then each lane fences its stores (fence.sc.sys) and lane 0
// raises the half-tile's flags with st.release.sys (after the half-tile's last handoff).
struct alignas(8) RsPushMail {
  uint64_t staged;  // mbarrier, 1 arrival per handoff (the consumer's thread 0)
  uint64_t freed;   // mbarrier, 1 arrival per handoff (the pusher's lane 0)
  int32_t h0;       // the half-tile's first row; -1: no more handoffs (the pusher returns)
  int32_t col;      // the first column in the staging buffer
  int32_t n;        // tile column (for the flag)
  int32_t bits;     // bit 0: the half-tile's last handoff (raise its flags); bits 1+: the
                    // store rounds staged (1 or 2)
};
static_assert(sizeof(RsPushMail) == 32, "a mail's size (RsEpilogue::kFetchAt)");

// A pusher warp's copy (RsEpilogue::send_rows): rows [row_lo, row_hi) and bytes [0, bytes) of
// each row of the staged rounds (stage_round's swizzled layout: part = round * 2 + box of 8 KiB,
// 64 rows of 128 B, 16-byte chunk c of row i at c ^ (i % 8)) to `at` (row i at at + i * ld),
// 16 bytes per lane and instruction: a warp writes 4 rows × 128 B at a time. add_f32: vector
// fp32 reduce-adds instead of stores (an accumulating slot). Out of line: the producer
// warpgroup's 56 registers (RegisterSplit). pace_ns > 0: a sleep after every 2 KiB
// (RsParams::push_pace_ns).
inline __device__ __noinline__ void push_chunks(uint32_t stage, char* at, int row_lo, int row_hi, int bytes,
                                                int ld, int rounds, bool add_f32, uint32_t pace_ns) {
  const int lane = threadIdx.x % 32;
#pragma unroll 1
  for (int it = 0; it < 32 * rounds; ++it) {
    const int i = it * 32 + lane;
    const int c = i & 7, row = (i >> 3) & 63, part = i >> 9;
    const int byte = part * 128 + c * 16;  // within the row
    if (row < row_lo || row >= row_hi || byte >= bytes) continue;
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "r"(stage + part * 8192 + row * 128 + ((c ^ (row & 7)) << 4)));
    char* g = at + (static_cast<uint32_t>(row) * static_cast<uint32_t>(ld) + byte);
    if (add_f32) {
      asm volatile("red.relaxed.sys.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(g),
                   "f"(__uint_as_float(v.x)), "f"(__uint_as_float(v.y)), "f"(__uint_as_float(v.z)),
                   "f"(__uint_as_float(v.w))
                   : "memory");
    } else {
      asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(g), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
                   : "memory");
    }
    if (pace_ns != 0 && (it & 3) == 3) __nanosleep(pace_ns);
  }
}

// Early fetch of an own half-tile's received partial (RsParams::prefetch): per consumer
// warpgroup, in the engine's aux region (after the two RsPushMail). `bar`
// completes once per fetch (the TMA's bytes); `state` (written by the warpgroup's thread 0 at each
// main_loop_point, read by the warpgroup after the named barrier of its epilogue): 0 = no
// fetch for this tile, else 1 | (the fetch's parity of `bar`) << 1.
struct alignas(8) RsFetch {
  uint64_t bar;
  uint32_t state;
  uint32_t count;  // fetches issued (thread 0's; in shared memory, not in a register)
};

struct RsEpilogue {
  static constexpr bool kOwnsTile = true;
  // Two store rounds per handoff (a bf16 half-tile of BN = 256, or half an fp32 one).
  static constexpr int kStagingRounds = 2;
  // The early fetch: the 64×64 bf16 boxes (8 KiB) of a fetched partial that the staging
  // buffer holds: a whole half-tile (BN = 256).
  static constexpr int kFetchBoxes = 2 * kStagingRounds;
  static constexpr bool kInitAux = true;
  static constexpr bool kAuxWarps = true;  // the pusher warps
  const RsParams* p;
  uint64_t epoch;
  // The issuing thread's state (t == 0 of each consumer warpgroup, or lane 0 of a pusher
  // warp; per thread, in registers):
  mutable uint32_t started = 0;  // owners whose arrive flag this thread has observed
  mutable uint32_t posts = 0;    // handoffs made to the pusher

  // The aux region: the pushers' two mails, then the two warpgroups' RsFetch.
  static constexpr int kFetchAt = 2 * sizeof(RsPushMail);
  static_assert(kFetchAt + 2 * sizeof(RsFetch) <= GemmTileConfig<256, kStagingRounds>::kAuxBytes,
                "the mails and the fetch states fit the engine's aux region");
  __device__ __forceinline__ static void init_aux(uint8_t* aux) {
    auto* mail = reinterpret_cast<RsPushMail*>(aux);
    for (int i = 0; i < 2; ++i) {
      mbar_init(&mail[i].staged, 1);
      mbar_init(&mail[i].freed, 1);
    }
    auto* fetch = reinterpret_cast<RsFetch*>(aux + kFetchAt);
    for (int i = 0; i < 2; ++i) {
      mbar_init(&fetch[i].bar, 1);
      fetch[i].state = 0;
      fetch[i].count = 0;
    }
  }
  // Warpgroup cw's fetch state, in the aux region.
  template <int BN>
  __device__ __forceinline__ static RsFetch* fetch_of(int cw) {
    return reinterpret_cast<RsFetch*>(gemm_aux_smem<BN, kStagingRounds>() + kFetchAt) + cw;
  }
  template <int BN>
  __device__ __forceinline__ static RsPushMail* mail_of(int cw) {
    return reinterpret_cast<RsPushMail*>(gemm_aux_smem<BN, kStagingRounds>()) + cw;
  }
  // Consumer thread 0: every handoff made so far has been freed by the pusher (its staging
  // reads are done; for the last, every flag is raised). posts handoffs complete posts phases
  // of `freed`; the first wait (posts == 0) passes on the fresh barrier's parity.
  __device__ __forceinline__ void wait_freed(RsPushMail* mail) const {
    mbar_wait(&mail->freed, (posts & 1) ^ 1);
  }
  __device__ __forceinline__ void post(RsPushMail* mail, int h0, int col, int n, int last, int rounds) const {
    mail->h0 = h0;
    mail->col = col;
    mail->n = n;
    mail->bits = last | rounds << 1;
    mbar_arrive(&mail->staged);
    ++posts;
  }

  // Issuing thread: o's launch has started (its receive slots may be written).
  __device__ __forceinline__ bool observe_start(int o) const {
    if (started & (1u << o)) return true;
    const CommDevice& d = p->dev;
    if (!fused_wait(d, &comm_flags(d, d.rank)->arrive[o], epoch, kFusedOpGemmReduceScatter, kCommStepArrive,
                    o, 1)) {
      return false;
    }
    fence_proxy_async_global();  // the acquire before any async-proxy access to o's memory
    started |= 1u << o;
    return true;
  }

  // Receive slot `slot` in this rank's region, at this rank's row `row`, column `col`.
  template <class T>
  __device__ __forceinline__ const T* slot_at(int slot, int64_t row, int col) const {
    const CommDevice& d = p->dev;
    const T* base = reinterpret_cast<const T*>(d.base[d.rank] + d.data_offset + p->ws_offset);
    const int64_t i = kFusedRsSlotPadRows + row - split_offset(p->M, d.world, d.rank);
    return base + slot * p->slot_elems + i * p->N + col;
  }
  // kB column groups of slot `slot` at the thread's rows (0 where !lo_ok / !hi_ok), in the
  // fragment's order: v[4b + 0..1] row_lo, v[4b + 2..3] row_lo + 8, columns 8(jb + b) + {0,1}.
  template <class T, int kB>
  __device__ __forceinline__ void load_source(float (&v)[4 * kB], int slot, int64_t row_lo, int col,
                                              bool lo_ok, bool hi_ok) const {
    const T* lo = slot_at<T>(slot, row_lo, col);
    const T* hi = lo + 8 * static_cast<int64_t>(p->N);
#pragma unroll
    for (int b = 0; b < kB; ++b) {
      float2 x = make_float2(0.f, 0.f), y = make_float2(0.f, 0.f);
      // Columns past N (the last tile column) read the next row's values, or past the last
      // slot the rest of the region (data, then scratch, follow it): inside the allocation,
      // and their sums are never stored (TMA clips at N, the register path skips them).
      // ld_cg_l2_256: each row's partial is walked 128 bytes per batch, so a miss also brings
      // the next batch's line.
      if constexpr (sizeof(T) == 4) {
        if (lo_ok) x = ld_cg_l2_256(reinterpret_cast<const float2*>(lo + 8 * b));
        if (hi_ok) y = ld_cg_l2_256(reinterpret_cast<const float2*>(hi + 8 * b));
      } else {
        if (lo_ok) x = __bfloat1622float2(ld_cg_l2_256(reinterpret_cast<const __nv_bfloat162*>(lo + 8 * b)));
        if (hi_ok) y = __bfloat1622float2(ld_cg_l2_256(reinterpret_cast<const __nv_bfloat162*>(hi + 8 * b)));
      }
      v[4 * b + 0] = x.x;
      v[4 * b + 1] = x.y;
      v[4 * b + 2] = y.x;
      v[4 * b + 3] = y.y;
    }
  }
  // Per-source slots: acc := (((0 + P_0) + P_1) + ...) + P_{W-1}, fp32, this rank's P_r being
  // acc; accumulating: acc := P_r + (the one slot). For the thread's rows row_lo, row_lo + 8
  // (where lo_ok / hi_ok) and columns col0 + 8j + {0, 1}. The prefix (slots of sources 0 ..
  // r-1) is summed in batches of kB column groups, then added to acc (a + b == b + a exactly);
  // the later slots are added in place.
  // kJ0: the first column group (the ones before it were added from a fetch).
  template <class T, int kJ0 = 0, int kFrag>
  __device__ __forceinline__ void add_sources(float (&acc)[kFrag], int64_t row_lo, int col0, bool lo_ok,
                                              bool hi_ok) const {
    constexpr int kJ = kFrag / 4, kB = kJ < 8 ? kJ : 8;
    const int W = p->dev.world;
    const int prefix = p->accumulate ? 0 : p->dev.rank;  // slots summed before acc
    const int slots = p->accumulate ? 1 : W - 1;
#pragma unroll
    for (int jb = kJ0; jb < kJ; jb += kB) {
      float sum[4 * kB];
#pragma unroll
      for (int e = 0; e < 4 * kB; ++e) sum[e] = 0.f;
      for (int s = 0; s < prefix; ++s) {
        float v[4 * kB];
        load_source<T, kB>(v, s, row_lo, col0 + 8 * jb, lo_ok, hi_ok);
#pragma unroll
        for (int e = 0; e < 4 * kB; ++e) sum[e] += v[e];
      }
#pragma unroll
      for (int e = 0; e < 4 * kB; ++e) acc[4 * jb + e] = sum[e] + acc[4 * jb + e];
    }
    for (int s = prefix; s < slots; ++s) {
#pragma unroll
      for (int jb = kJ0; jb < kJ; jb += kB) {
        float v[4 * kB];
        load_source<T, kB>(v, s, row_lo, col0 + 8 * jb, lo_ok, hi_ok);
#pragma unroll
        for (int e = 0; e < 4 * kB; ++e) acc[4 * jb + e] += v[e];
      }
    }
  }

  // Issuing thread: waits for the W-1 peers' flags of this rank's half-tile (h, n).
  __device__ __forceinline__ void wait_sources(int h, int n) const {
    const CommDevice& d = p->dev;
    for (int s = 0; s < d.world; ++s) {
      if (s != d.rank && !fused_wait(d, rs_flag(*p, d.rank, s, h, n), epoch, kFusedOpGemmReduceScatter,
                                     kFusedStepPartial, s, 1)) {
        return;  // recorded; the warpgroup sums what is there (the launch has failed)
      }
    }
  }

  template <int BN, int kFrag>
  __device__ __forceinline__ void tile(float (&acc)[kFrag], uint8_t* stage, TileCoord tc, int cw,
                                       const GemmProblem&) const {
    const CommDevice& d = p->dev;
    const int W = d.world, r = d.rank;
    const int t = threadIdx.x % 128, warp = t / 32, lane = t % 32;
    const int h0 = tc.m * kTileM + cw * 64;
    if (h0 >= p->M) return;  // no rows (the last M-block's second half)
    const int h1 = min(h0 + 64, p->M), h = h0 / 64, col = tc.n * BN;
    const int o_lo = split_owner(p->M, W, h0), o_hi = split_owner(p->M, W, h1 - 1);
    // Other owners' rows: handed to the pusher (a half-tile that straddles owners is pushed to
    // each; rows past the owner's are clipped, rows before it land in the slot's padding).
    if (o_lo != r || o_hi != r) hand_off<BN>(acc, stage, cw, h0, col, tc.n);
    if (r < o_lo || r > o_hi) return;
    // This rank's rows: the last handoff freed first (the staging buffer is rewritten below),
    // then the peers' partials, then one TMA store of the bf16 sums (clipped to this rank's
    // rows).
    const int64_t own_off = split_offset(p->M, W, r), own_end = own_off + split_count(p->M, W, r);
    RsFetch* const fetch = fetch_of<BN>(cw);
    if (t == 0) {
      if (o_lo == o_hi) wait_freed(mail_of<BN>(cw));  // the staging buffer is rewritten below
      // A fetched partial: its flag was acquired before the fetch (main_loop_point); its
      // bytes have landed once the fetch's barrier phase completes (published to the
      // warpgroup, like the flags' acquires, by the named barrier below).
      const uint32_t f = fetch->state;
      if (f & 1) {
        mbar_wait(&fetch->bar, f >> 1);
      } else {
        wait_sources(h, tc.n);
      }
    }
    named_barrier_sync(2 + cw, 128);  // observe pattern: thread 0's acquires, then everyone's loads
    const int64_t row_lo = h0 + warp * 16 + lane / 4;
    const int col0 = col + 2 * (lane % 4);
    const bool lo_ok = row_lo >= own_off && row_lo < own_end;
    const bool hi_ok = row_lo + 8 >= own_off && row_lo + 8 < own_end;
    const uint32_t fetched = *reinterpret_cast<volatile uint32_t*>(&fetch->state);
    if (p->bf16_partials) {
      if (fetched & 1) {
        add_fetched(acc, stage);
        // Columns that did not fit the staging buffer: loaded from the slot.
        constexpr int kJ0 = kFetchBoxes * 8;
        if constexpr (kJ0 < kFrag / 4) { add_sources<__nv_bfloat16, kJ0>(acc, row_lo, col0, lo_ok, hi_ok); }
      } else {
        add_sources<__nv_bfloat16>(acc, row_lo, col0, lo_ok, hi_ok);
      }
    } else {
      add_sources<float>(acc, row_lo, col0, lo_ok, hi_ok);
    }
    if (o_lo == o_hi) {
      store_tile_tma<BN, false, kFrag, false, kStagingRounds>(acc, stage, &p->tm_out, cw,
                                                              static_cast<int>(h0 - own_off), col, true);
      return;
    }
    // A half-tile that begins before this rank's rows (the output has no padding): the
    // register path, within this rank's rows and N.
    __nv_bfloat16* lo = p->out + (row_lo - own_off) * p->N + col0;
#pragma unroll
    for (int j = 0; j < kFrag / 4; ++j) {
      if (col0 + 8 * j >= p->N) continue;
      if (lo_ok) DefaultEpilogue::put_bf16(lo + 8 * j, acc[4 * j], acc[4 * j + 1]);
      if (hi_ok) DefaultEpilogue::put_bf16(lo + 8 * p->N + 8 * j, acc[4 * j + 2], acc[4 * j + 3]);
    }
  }

  // Every consumer thread, early in each tile's main loop (the engine's main_loop_point):
  // (p->prefetch) in an own half-tile whose peer's partial is already flagged (one poll, no
  // wait: no new wait in the protocol), the issuing thread TMA-loads that partial into the
  // staging buffer, so that the epilogue adds it from shared memory instead of waiting for
  // global loads while the tensor cores idle.
  template <int BN>
  __device__ __forceinline__ void main_loop_point(TileCoord tc, int cw) const {
    if (threadIdx.x % 128 != 0) return;
    if (p->prefetch) fetch_own<BN>(tc, cw);
  }

  // Issuing thread (p->prefetch: W = 2, bf16 partials, one slot): see
  // main_loop_point. The fetch writes the staging buffer in stage_round's layout (64 rows ×
  // 64 columns per 8 KiB box, 128-B swizzled rows; box b holds columns col + 64 b), so each
  // thread later reads its fragment's partials where it will write its sums.
  template <int BN>
  __device__ __forceinline__ void fetch_own(TileCoord tc, int cw) const {
    RsFetch* fetch = fetch_of<BN>(cw);
    uint8_t* const stage = gemm_staging_smem<BN, kStagingRounds>(cw);
    fetch->state = 0;
    const CommDevice& d = p->dev;
    const int W = d.world, r = d.rank;
    const int h0 = tc.m * kTileM + cw * 64;
    if (h0 >= p->M) return;
    const int h1 = min(h0 + 64, p->M);
    if (split_owner(p->M, W, h0) != r || split_owner(p->M, W, h1 - 1) != r) return;
    for (int s = 0; s < W; ++s) {
      if (s != r && ld_acquire_sys(rs_flag(*p, r, s, h0 / 64, tc.n)) < epoch) return;
    }
    // The pusher's reads of this warpgroup's last handoff are done (one poll: the own tiles
    // come after the pushes, so they nearly always are), then its generic-proxy accesses to
    // the buffer before the TMA's writes.
    if (!mbar_test(&mail_of<BN>(cw)->freed, (posts & 1) ^ 1)) return;
    fence_proxy_async_shared();
    bulk_wait_read_all();        // this warpgroup's earlier stores have read the buffer
    fence_proxy_async_global();  // the acquired partial, then the TMA's reads of it
    const int col = tc.n * BN;
    // Boxes past N are not loaded; those past the buffer's room, by the epilogue.
    const int boxes = min(min(BN, p->N - col + 63) / 64, kFetchBoxes);
    const int row = kFusedRsSlotPadRows + h0 - static_cast<int>(split_offset(p->M, W, r));
    mbar_arrive_expect_tx(&fetch->bar, static_cast<uint32_t>(boxes) * 8192u);
    for (int b = 0; b < boxes; ++b) {
      tma_load_2d(stage + b * 8192, &p->tm_recv, &fetch->bar, col + 64 * b, row);
    }
    const uint32_t c = fetch->count;
    fetch->state = 1u | (c & 1u) << 1;
    fetch->count = c + 1;
  }

  // Every thread of the warpgroup: acc += the fetched bf16 partial at its fragment's places
  // (stage_round's layout; W = 2: one source, so the sum is the same in either order), for
  // the kFetchBoxes * 64 columns the buffer holds. Columns of boxes that were not loaded (past
  // N) add stale values, never stored.
  template <int kFrag>
  __device__ __forceinline__ static void add_fetched(float (&acc)[kFrag], const uint8_t* stage) {
    const int t = threadIdx.x % 128, warp = t / 32, lane = t % 32;
    const int r_lo = warp * 16 + lane / 4;
    const uint32_t q = static_cast<uint32_t>(lane % 4);
    const uint32_t base = smem_u32(stage);
    constexpr int kJ = kFrag / 4 < kFetchBoxes * 8 ? kFrag / 4 : kFetchBoxes * 8;
#pragma unroll
    for (int j = 0; j < kJ; ++j) {
      const float2 lo = __bfloat1622float2(ld_shared_bf16x2(base + staged_bf16_at(j, r_lo, q)));
      const float2 hi = __bfloat1622float2(ld_shared_bf16x2(base + staged_bf16_at(j, r_lo + 8, q)));
      acc[4 * j + 0] += lo.x;
      acc[4 * j + 1] += lo.y;
      acc[4 * j + 2] += hi.x;
      acc[4 * j + 3] += hi.y;
    }
  }

  // Every consumer thread, after its last tile: the pusher is told to return, and has raised
  // every flag once it frees that handoff; every bulk store is complete (shared memory
  // outlives its reads; the outputs are written).
  __device__ __forceinline__ void consumers_end() const {
    if (threadIdx.x % 128 != 0) return;
    const int cw = threadIdx.x / 128 - 1;
    RsPushMail* mail = p->tile_n == 256 ? mail_of<256>(cw) : mail_of<128>(cw);
    wait_freed(mail);
    post(mail, -1, 0, 0, 0, 0);
    wait_freed(mail);
    bulk_wait_all();
  }

  // ---- handoffs to the pusher warps --------------------------------------------------------
  // The warpgroup's half-tile (rows [h0, h0 + 64), columns [col, col + BN)) to the pusher, in
  // handoffs of two store rounds (bf16: one; fp32: BN / 128).
  template <int BN, int kFrag>
  __device__ __forceinline__ void hand_off(const float (&acc)[kFrag], uint8_t* stage, int cw, int h0, int col,
                                           int n) const {
    RsPushMail* mail = mail_of<BN>(cw);
    if (p->bf16_partials) {
      hand_off_rounds<BN, false>(acc, stage, cw, mail, h0, col, n);
    } else {
      hand_off_rounds<BN, true>(acc, stage, cw, mail, h0, col, n);
    }
  }
  template <int BN, bool kF32, int kFrag>
  __device__ __forceinline__ void hand_off_rounds(const float (&acc)[kFrag], uint8_t* stage, int cw,
                                                  RsPushMail* mail, int h0, int col, int n) const {
    constexpr int kRounds = kStoreRounds<BN, kF32>, kCols = kF32 ? 64 : 128;
    const int t = threadIdx.x % 128;
#pragma unroll
    for (int h = 0; h < kRounds; h += 2) {
      if (t == 0) {
        wait_freed(mail);      // the pusher's reads of the previous handoff
        bulk_wait_read_all();  // this warpgroup's own TMA store's reads
      }
      named_barrier_sync(2 + cw, 128);
      stage_round<kF32>(acc, stage, h);
      if (h + 1 < kRounds) stage_round<kF32>(acc, stage + 16384, h + 1);
      // The early fetch later TMA-writes these bytes: every writing thread orders its generic
      // writes before async-proxy accesses (as store_tile_tma does), not thread 0 alone.
      fence_proxy_async_shared();
      named_barrier_sync(2 + cw, 128);
      if (t == 0) post(mail, h0, col + h * kCols, n, h + 2 >= kRounds, min(2, kRounds - h));
    }
  }

  // A pusher warp's whole life (engine hook aux_warp; 56 registers): handoffs until h0 < 0.
  __device__ __forceinline__ void aux_warp(int cw, uint8_t* stage, uint8_t* aux) const {
    RsPushMail* mail = reinterpret_cast<RsPushMail*>(aux) + cw;
    const int lane = threadIdx.x % 32;
    for (uint32_t k = 0;; ++k) {
      mbar_wait(&mail->staged, k & 1);
      const int h0 = mail->h0;
      if (h0 < 0) {
        __syncwarp();
        if (lane == 0) mbar_arrive(&mail->freed);
        return;
      }
      const int col = mail->col, n = mail->n, last = mail->bits & 1, rounds = mail->bits >> 1;
      const CommDevice& d = p->dev;
      const int W = d.world, r = d.rank;
      const int h1 = min(h0 + 64, p->M);
      const int o_lo = split_owner(p->M, W, h0), o_hi = split_owner(p->M, W, h1 - 1);
      uint32_t sent = 0;  // owners whose rows were stored (lane 0's start checks passed)
      for (int o = o_lo; o <= o_hi; ++o) {
        if (o == r) continue;
        const bool ok = __shfl_sync(0xffffffffu, lane == 0 ? observe_start(o) : false, 0);
        // Lane 0's acquire, then every lane's stores into o's slot: a shuffle does not order
        // memory in the PTX model, bar.warp.sync does.
        __syncwarp();
        if (!ok) continue;  // recorded: the launch has failed
        sent |= 1u << o;
        if (p->bf16_partials) {
          send_rows<false>(stage, o, h0, h1, col, rounds);
        } else {
          send_rows<true>(stage, o, h0, h1, col, rounds);
        }
      }
      __syncwarp();  // every lane issued its last store: its staging reads are done
      if (lane == 0) mbar_arrive(&mail->freed);
      if (!last || sent == 0) continue;
      // This lane's stores before lane 0's flag (through the syncwarp). The owner may read them
      // with TMA (the early fetch): the proxy fence covers the writer's side of that too.
      fence_proxy_async_global();
      __threadfence_system();
      __syncwarp();
      if (lane == 0) {
        for (int o = o_lo; o <= o_hi; ++o) {
          if (sent & (1u << o)) st_release_sys(rs_flag(*p, o, r, h0 / 64, n), epoch);
        }
      }
    }
  }

  // One handoff's rows of owner o (rows [max(h0, off_o), min(h1, end_o)), `rounds` store
  // rounds from column col, clipped to N) from the staging buffer to o's receive slot for this
  // rank (slot row i = row off_o + i - padding): push_chunks.
  template <bool kF32>
  __device__ __forceinline__ void send_rows(const uint8_t* stage, int o, int h0, int h1, int col,
                                            int rounds) const {
    const CommDevice& d = p->dev;
    const int W = d.world, r = d.rank;
    const int off = static_cast<int>(split_offset(p->M, W, o));
    const int end = min(off + static_cast<int>(split_count(p->M, W, o)), h1);
    const int64_t slot = p->accumulate ? 0 : (r < o ? r : r - 1);
    constexpr int kESize = kF32 ? 4 : 2, kElems = 16 / kESize;  // elements per 16-byte chunk
    // The handoff's row h0, column col in o's slot (h0 may precede o's rows: never stored).
    char* const at = reinterpret_cast<char*>(d.base[o] + d.data_offset + p->ws_offset) +
                     (slot * static_cast<int64_t>(p->slot_elems) +
                      static_cast<int64_t>(kFusedRsSlotPadRows + h0 - off) * p->N + col) *
                         kESize;
    push_chunks(smem_u32(stage), at, max(off - h0, 0), end - h0,
                min(rounds * 16 * kElems, p->N - col) * kESize, p->N * kESize, rounds, kF32 && p->accumulate,
                p->push_pace_ns);
  }
};

// The GEMM's sweep, here and across hosts (rs_hosts_kernel.cuh): dynamic claims; sweep position
// -> tile as described above (the other ranks' rows first, this rank's M-blocks [own_b0, own_b0 +
// own_nb) last); no readiness waits.
template <class Params>
struct RsSweep : FusedClaims<Params> {
  __device__ __forceinline__ TileCoord coord(const GemmProblem& prob, int t) const {
    return two_part_raster(prob, t, this->p->own_b0, this->p->own_nb, false);
  }
  __device__ __forceinline__ bool has_waits(const GemmProblem&) const { return false; }
  template <int BN>
  __device__ __forceinline__ bool wait(const GemmProblem&, TileCoord) const {
    return true;
  }
};

struct RsSchedule : RsSweep<RsParams> {
  __device__ __forceinline__ void consumers_done() const {
    // Every load of this CTA from its receive slots and every push is complete (consumers_end
    // and this barrier): the end barrier's arrival, then the end of the launch.
    named_barrier_sync(1, 256);
    if (threadIdx.x == 128) {
      fused_role_done(p->dev, epoch, gridDim.x);
      fused_finish(p->dev, epoch, kFusedOpGemmReduceScatter);
    }
  }
};

template <int BN, bool kBKN>
__global__ void __launch_bounds__(kGemmThreads, 1)
    rs_gemm_kernel(const __grid_constant__ CUtensorMap tm_a, const __grid_constant__ CUtensorMap tm_b,
                   const __grid_constant__ CUtensorMap tm_c, const __grid_constant__ GemmProblem prob,
                   const __grid_constant__ RsParams p) {
  const uint64_t epoch = comm_launch_epoch(p.dev);
  if (blockIdx.x == 0 && threadIdx.x == 0 && p.dev.world > 1) rs_start(p.dev, epoch);
  gemm_sm90_body<BN, kBKN>(tm_a, tm_b, tm_c, prob, RsEpilogue{&p, epoch}, RsSchedule{{{&p, epoch}}});
}

}  // namespace fusedcomm::kernels::detail
