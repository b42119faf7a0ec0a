// gemmAllReduce's one-shot kernel (gemm_ar.h, FusedAlgo::kOneShot): one persistent launch per
// rank for small M (tensor-parallel decode), in which every CTA first computes GEMM work units
// and pushes each finished tile to every rank, then sums the tiles it is assigned from every
// rank's partial. Host side: gemm_ar.cu (geometry, workspace, launch).
//
// Tiles: BM × BN (BM = 16 or 32 from M, BN = 128, 64 or 32, the widest that still gives about
// one tile per SM; or, with wgmma (ar_oneshot_wgmma.cuh), BM = 64 or 128 and BN = 128 or 64) of
// the M×N product, numbered t = m-block · tiles_n + n-block; the grid
// is the same on every rank (from M and N only). Work units: tile t, K split s (u = s · tiles +
// t; the split factor S comes from this rank's K_r and SM count, and is 1 unless the narrowest
// tiles are still too few: it only changes which CTAs of this rank compute which part). A unit
// of the mma.sync instances runs the tensor cores with mma.sync m16n8k16 (bf16 in, fp32 accumulators) over a cp.async
// pipeline of long K slices (A: BM rows, W_r: BN columns; rows and K past the operands are
// zero-filled). All 8 warps compute the whole BM × BN tile, each over its own k16 steps of every
// slice, and their accumulators are summed in warp order through shared memory at the end:
// small M is bound by reading W_r, so every byte of a slice is read from shared memory once,
// and narrow tiles keep every SM streaming W_r without split-K's pass through global memory.
//
// Partials (ArParams): at S > 1 each unit stores its fp32 partial into this rank's split
// workspace (scratch area) and the last of the tile's S units (arrival counter
// FusedFlags::chunk_count[t]) sums them in split order, so the rank's partial of a tile does
// not depend on which CTA finished last. The rank's partial (fp32, or rounded to bf16 with
// bf16 partials) is then PUSHED into every rank's receive slot for this rank (its own
// included): rank q's data area at ws_offset holds W slots (slot s: rank s's partials), each
// `tiles` tiles of BM × BN partials, tile-major, rows past M never written nor read. Once a
// tile's stores are complete the pushing CTA raises its flag in every rank's region,
// FusedFlags::rs_tile[t · W + r] = epoch (publish: stores, bar.sync, then thread 0's
// fence.acq_rel.sys and a relaxed system-scope store per rank, a release pattern; the barrier
// orders every thread's stores before the fence, which is cumulative, so no fence.sc.sys: at
// decode sizes each system fence is microseconds on the critical path, docs/performance.md).
//
// Sums: after its last unit a CTA takes tiles t = blockIdx.x, + gridDim.x, ... (or, where the
// tiles are fewer than the CTAs, row ranges of them, ar_sum_tiles): one thread waits
// for the W flags of the tile in this rank's region (ld.acquire.sys), then the CTA loads the W
// partials from the local slots and adds them in rank order 0..W-1 in fp32, rounds once to bf16
// and stores C. Every rank adds the same W values in the same order: the same bits on every
// rank, whatever K_r and split each rank had.
//
// No deadlock: the only waits before a CTA's last push are the start barrier's (every rank
// raises its arrive flags at its kernel start, unconditionally), and the split counters never
// wait; so every rank pushes every tile, and the sums' waits (after the pushes) complete.
// Every wait is bounded (ar_wait): the first to give up records rank, peer, op
// (kFusedOpGemmAllReduce) and step (kCommStepArrive or kFusedStepTile); the others see the
// record and stop.
//
// Start barrier: a rank stores into q's slots only after q's arrive flag for this launch (q's
// earlier ops, which may still read its slots or data area, are complete). The end (ar_end)
// raises this rank's done flag without waiting for the peers' (it says why), compares the launch
// signatures and publishes the epoch for the next launch (the split counters are reset by their
// last arrival), so back-to-back launches and graph replay need no host work.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/common/fused.h"
#include "kernels/common/fused_protocol.cuh"
#include "kernels/common/sm90_primitives.cuh"
#include "kernels/common/tuning.h"

namespace fusedcomm::kernels::detail {

inline constexpr int kArThreads = 256;
inline constexpr int kArWarps = kArThreads / 32;

// The pipeline of the mma.sync instance with tile BM × BN (BM = 16 or 32): K slice per stage
// (about 32 KiB of W_r per stage, 512 contiguous bytes or more of each W_r row) and stages
// (~200 KiB in flight per SM). The wgmma instances (BM = 64 or 128, ar_oneshot_wgmma.cuh) take
// slices of 64 (one 128-byte swizzle row).
__host__ __device__ constexpr int ar_bk(int bm, int bn) {
  return bm >= 64 ? 64 : bn >= 64 ? (bn >= 128 ? 128 : 256) : 512;
}
__host__ __device__ constexpr int ar_stage_bytes(int bm, int bn) { return (bm + bn) * ar_bk(bm, bn) * 2; }
__host__ __device__ constexpr int ar_stages(int bm, int bn) {
  return (200 << 10) / ar_stage_bytes(bm, bn) < 6 ? (200 << 10) / ar_stage_bytes(bm, bn) : 6;
}
__host__ __device__ constexpr int ar_cs_stride(int bn) { return bn + 4; }  // fp32 tile rows in shared memory
// Shared memory of the instance: the pipeline's stages; the epilogue's per-warp fp32 tiles
// (then their sum) reuse them.
__host__ __device__ constexpr int ar_smem_bytes(int bm, int bn) { return ar_stages(bm, bn) * ar_stage_bytes(bm, bn); }
__host__ __device__ constexpr bool ar_instance_fits(int bm, int bn) {
  return ar_stages(bm, bn) >= 2 && ar_smem_bytes(bm, bn) <= 227 * 1024 &&
         kArWarps * bm * ar_cs_stride(bn) * 4 <= ar_smem_bytes(bm, bn) && ar_bk(bm, bn) / 16 >= kArWarps;
}
static_assert(ar_instance_fits(16, 32) && ar_instance_fits(16, 64) && ar_instance_fits(16, 128) &&
                  ar_instance_fits(32, 32) && ar_instance_fits(32, 64) && ar_instance_fits(32, 128),
              "every instance's pipeline and epilogue fit a CTA's shared memory");

struct ArParams {
  CommDevice dev;
  const __nv_bfloat16* A;  // M×K_r, row-major
  const __nv_bfloat16* B;  // W_r: N×K_r (kNK) or K_r×N (kKN), row-major
  __nv_bfloat16* C;        // M×N
  float* split_ws;         // splits × tiles × BM × BN fp32 (this rank's scratch; splits > 1)
  uint64_t ws_offset;      // the receive slots in every rank's data area
  uint64_t slot_bytes;     // one source's slot: tiles × BM × BN partials
  int M, N, K;
  int tiles_n, tiles;  // tile columns; tiles in all
  int splits;          // K splits of every tile (this rank's)
  int k_tiles;         // ceil(K_r / ar_bk(BM, BN))
  int bf16_partials;   // 1: the pushed partials are bf16, else fp32
};

__device__ __forceinline__ void ar_cp_async16(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst),
               "l"(__cvta_generic_to_global(src)), "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void ar_ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ar_ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ar_mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ uint32_t ar_pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}
// kKN slices: row k of a slice holds BN columns (kChunks 16-byte chunks); chunk c is stored at
// c ^ ar_kn_swizzle(k), so that ldmatrix.trans's 8 rows (consecutive k, one chunk) fall into 8
// distinct 16-byte bank groups whatever the row length.
template <int kChunks>
__device__ __forceinline__ int ar_kn_swizzle(int k) {
  return kChunks >= 8 ? (k & 7) : (k >> 1) & (kChunks - 1);
}
// 8 partials (fp32, or bf16 widened) at element `i` of a slot.
__device__ __forceinline__ void ar_load8(const uint8_t* slot, uint64_t i, bool bf16, float (&v)[8]) {
  if (bf16) {
    const uint4 u = __ldcg(reinterpret_cast<const uint4*>(slot + i * 2));
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w[j]));
      v[2 * j] = f.x;
      v[2 * j + 1] = f.y;
    }
  } else {
    const float4 a = __ldcg(reinterpret_cast<const float4*>(slot + i * 4));
    const float4 b = __ldcg(reinterpret_cast<const float4*>(slot + i * 4 + 16));
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
  }
}

// A bounded wait (fused_wait's record on failure) with the collectives' short sleeps between
// polls: the kernel's waits are on its critical path, microseconds each at decode sizes.
__device__ __forceinline__ bool ar_wait(const CommDevice& d, const uint64_t* flag, uint64_t epoch, uint32_t step,
                                        int peer) {
  return comm_wait_flag_inline(d, flag, epoch, kFusedOpGemmAllReduce, step, peer, 1, false,
                               tuning::kCommPollSleepNs);
}

// The end, one thread per CTA once the CTA is done (after a bar.sync that follows its last load
// of the receive slots and its last push). The last CTA of this rank (grid-level counter,
// comm_arrive_last: no fence, since what follows is read only by this rank's next launches)
// compares the launch signatures (each peer's arrive flag, acquired here, was released after its
// signature) and publishes the epoch for the next launch. It neither raises its done flags nor
// waits for the peers', the end barrier of the other ops, since nothing here needs it:
// - input lifetime: no peer reads this rank's memory; peers only store into its receive slots,
//   and every such store of this launch completed before this rank's sums read the tile's flag;
// - at most one launch ahead (what the collectives' slot reuse needs, collectives.h
//   CommFlags::ready): this launch completes on a rank only after its sums have read every
//   peer's tiles of this launch, so only after every peer has started it, i.e. completed its
//   previous launch; a rank therefore reaches launch e+2 only after every peer finished e;
// - CommFlags::done[p] = e says that p finished reading this rank's memory in launch e; the
//   other ops' end barriers wait for it in their own launch (done only grows), never for an
//   earlier launch's, so this launch owes none.
// Each of those steps is a system-scope fence or a round trip between the GPUs on the path to
// the kernel's end, which decode-sized launches feel (docs/performance.md).
inline __device__ __noinline__ void ar_end(const CommDevice& d, uint64_t epoch) {
  if (!comm_arrive_last(&comm_control(d)->exit_count)) return;
  CommFlags* mine = comm_flags(d, d.rank);
  bool ok = true;
  for (int i = 1; i < d.world && ok; ++i) {
    const int p = (d.rank + i) % d.world;
    ok = ar_wait(d, &mine->arrive[p], epoch, kCommStepArrive, p);
  }
  if (ok) comm_check_signatures(d, epoch, kFusedOpGemmAllReduce, kCommStepArrive);
  *reinterpret_cast<volatile uint64_t*>(&comm_control(d)->epoch) = epoch;
}

// The kernel's start, one thread: the signature, then the arrive flags (start barrier, signal
// side; stream order puts this rank's earlier ops before the kernel). Each arrive flag's release
// orders the signature's stores before it.
inline __device__ void ar_start(const CommDevice& d, uint64_t epoch) {
  comm_publish_signature(d, epoch);  // before this thread's first release (CommFlags::launch)
  comm_signal_peers(
      d, [&](CommFlags* f) { return &f->arrive[d.rank]; }, epoch);
}

// Thread 0's verdicts, shared by the CTA, one variable per use (a thread may still read one when
// the next is set).
struct ArVerdicts {
  int last, started, ready;
};

// A unit's partial, in shared memory (fp32, rows of ar_cs_stride(BN), rows of the operands only),
// to its rank's receive slots (every CTA thread calls it, kThreads of them): at S > 1 through the
// split workspace and the tile's arrival counter (the last of its units pushes the splits' sum in
// split order), then pushed into every rank's slot for this rank and flagged there.
// `epoch`: the launch's (comm_launch_epoch at the kernel's start); `started`, `failed`: this
// CTA's start wait (see the header).
template <int BM, int BN, int kThreads>
__device__ __forceinline__ void ar_publish_unit(const ArParams& p, uint64_t epoch, const float* cs, int t, int s,
                                                int m0, bool& started, bool& failed, ArVerdicts& sh) {
  constexpr int kGroups = BN / 8;  // 8-element groups per tile row
  constexpr int kCs = ar_cs_stride(BN);
  const CommDevice& d = p.dev;
  const int W = d.world, r = d.rank, tid = threadIdx.x;
  const bool bf16 = p.bf16_partials != 0;
  const int esize = bf16 ? 2 : 4;
  const int rows = min(BM, p.M - m0), groups = rows * kGroups;
  const uint64_t tile_elem = static_cast<uint64_t>(t) * BM * BN;
  bool push = true;
  if (p.splits > 1) {
    float* mine = p.split_ws + (static_cast<uint64_t>(s) * p.tiles * BM * BN + tile_elem);
    for (int g = tid; g < groups; g += kThreads) {
      const int row = g / kGroups, c8 = g % kGroups;
      const float* src = cs + row * kCs + c8 * 8;
      __stcg(reinterpret_cast<float4*>(mine + row * BN + c8 * 8), *reinterpret_cast<const float4*>(src));
      __stcg(reinterpret_cast<float4*>(mine + row * BN + c8 * 8 + 4), *reinterpret_cast<const float4*>(src + 4));
    }
    __syncthreads();
    if (tid == 0) {
      __threadfence();  // this CTA's stores, then its arrival (release)
      sh.last = fused_last_of(&fused_flags(d, r)->chunk_count[t], static_cast<uint32_t>(p.splits)) ? 1 : 0;
    }
    __syncthreads();
    push = sh.last != 0;
  }
  if (push) {
    if (!started && !failed) {
      if (tid == 0) {
        int ok = 1;
        for (int i = 1; i < W && ok; ++i) {
          const int q = (r + i) % W;
          ok = ar_wait(d, &comm_flags(d, r)->arrive[q], epoch, kCommStepArrive, q);
        }
        sh.started = ok;
      }
      __syncthreads();
      started = true;
      failed = sh.started == 0;
    }
    // After a failed start wait (recorded) the tile still goes to this rank's own slot, with
    // its flag: no CTA of this rank then waits for its own tiles until the timeout, and the
    // record keeps naming the peer that never arrived.
    {
      for (int g = tid; g < groups; g += kThreads) {
        const int row = g / kGroups, c8 = g % kGroups;
        float v[8];
        if (p.splits > 1) {
          // The tile's partial: its splits' in split order (the same whichever unit came last).
          for (int sp = 0; sp < p.splits; ++sp) {
            const float* src =
                p.split_ws + (static_cast<uint64_t>(sp) * p.tiles * BM * BN + tile_elem + row * BN + c8 * 8);
            const float4 x = __ldcg(reinterpret_cast<const float4*>(src));
            const float4 y = __ldcg(reinterpret_cast<const float4*>(src + 4));
            const float w8[8] = {x.x, x.y, x.z, x.w, y.x, y.y, y.z, y.w};
#pragma unroll
            for (int j = 0; j < 8; ++j) v[j] = sp == 0 ? w8[j] : v[j] + w8[j];
          }
        } else {
          const float* src = cs + row * kCs + c8 * 8;
#pragma unroll
          for (int j = 0; j < 8; ++j) v[j] = src[j];
        }
        const uint64_t at = p.ws_offset + static_cast<uint64_t>(r) * p.slot_bytes +
                            (tile_elem + static_cast<uint64_t>(row) * BN + c8 * 8) * esize;
        if (bf16) {
          const uint4 w4 = make_uint4(ar_pack_bf16(v[0], v[1]), ar_pack_bf16(v[2], v[3]),
                                      ar_pack_bf16(v[4], v[5]), ar_pack_bf16(v[6], v[7]));
          for (int i = failed ? W - 1 : 0; i < W; ++i) {
            const int q = (r + 1 + i) % W;  // peers first, own slot last
            *reinterpret_cast<uint4*>(d.base[q] + d.data_offset + at) = w4;
          }
        } else {
          const float4 x = make_float4(v[0], v[1], v[2], v[3]), y = make_float4(v[4], v[5], v[6], v[7]);
          for (int i = failed ? W - 1 : 0; i < W; ++i) {
            const int q = (r + 1 + i) % W;
            float4* dst = reinterpret_cast<float4*>(d.base[q] + d.data_offset + at);
            dst[0] = x;
            dst[1] = y;
          }
        }
      }
      __syncthreads();  // every thread's stores before thread 0's fence (publish)
      if (tid == 0) {
        // One release fence, then the W flags: a release store per flag would add a round
        // trip between the GPUs per flag after the first (each waits for the previous flag).
        fence_acq_rel_sys();
        for (int i = failed ? W - 1 : 0; i < W; ++i) {
          const int q = (r + 1 + i) % W;
          st_relaxed_sys(&fused_flags(d, q)->rs_tile[t * W + r], epoch);
        }
      }
    }
  }
}

// The sums (every CTA thread, kThreads of them, after its last unit): work items i = blockIdx.x,
// + gridDim.x, ..., each a range of rows of tile i % tiles (part i / tiles of `parts`, as many
// as the grid holds per tile, so that every CTA sums where the tiles are fewer than the CTAs):
// the W partials of each element from this rank's slots, added in rank order by one thread,
// rounded once into C; then the end.
template <int BM, int BN, int kThreads>
__device__ __forceinline__ void ar_sum_tiles(const ArParams& p, uint64_t epoch, bool started, bool failed,
                                             ArVerdicts& sh) {
  constexpr int kGroups = BN / 8;
  const CommDevice& d = p.dev;
  const int W = d.world, r = d.rank, tid = threadIdx.x;
  const bool bf16 = p.bf16_partials != 0;
  // ---- sums --------------------------------------------------------------------------------
  const uint8_t* slots = d.base[r] + d.data_offset + p.ws_offset;
  // thread 0's: every peer's arrive flag acquired (a CTA that pushed already did, unless it failed)
  bool arrivals_seen = started && !failed;
  const int parts = max(1, static_cast<int>(gridDim.x) / p.tiles);
  const int part_rows = (BM + parts - 1) / parts;
  for (int item = blockIdx.x; item < p.tiles * parts; item += gridDim.x) {
    const int t = item % p.tiles, m0 = (t / p.tiles_n) * BM;
    const int r0 = (item / p.tiles) * part_rows, r1 = min(min(BM, p.M - m0), r0 + part_rows);
    if (r0 >= r1) continue;  // rows past M only (never part 0: each tile's flags are waited for)
    if (tid == 0) {
      // Every peer's arrival first (once per CTA), then the peers' tile flags (from r + 1 on),
      // this rank's own last. A live peer pushes its tiles only after its own start wait, which
      // a dead rank holds up for the whole timeout; waiting for a live peer's tiles would then
      // race that timeout and could blame the live peer. Waiting for the arrivals first makes a
      // timeout here name the rank that never arrived.
      int ok = 1;
      for (int i = 1; i < W && ok && !arrivals_seen; ++i) {
        const int q = (r + i) % W;
        ok = ar_wait(d, &comm_flags(d, r)->arrive[q], epoch, kCommStepArrive, q);
      }
      arrivals_seen = true;
      for (int i = 1; i <= W && ok; ++i) {
        const int src = (r + i) % W;
        ok = ar_wait(d, &fused_flags(d, r)->rs_tile[t * W + src], epoch, kFusedStepTile, src);
      }
      sh.ready = ok;
    }
    __syncthreads();  // observe pattern: thread 0's acquires, then every thread's loads
    if (sh.ready != 0) {
      const int n0 = (t % p.tiles_n) * BN;
      const uint64_t tile_elem = static_cast<uint64_t>(t) * BM * BN;
      for (int g = tid; g < (r1 - r0) * kGroups; g += kThreads) {
        const int row = r0 + g / kGroups, c8 = g % kGroups, col = n0 + c8 * 8;
        if (col >= p.N) continue;
        const uint64_t i = tile_elem + static_cast<uint64_t>(row) * BN + c8 * 8;
        float v[8], x[8];
        ar_load8(slots, i, bf16, v);
        for (int src = 1; src < W; ++src) {
          ar_load8(slots + static_cast<uint64_t>(src) * p.slot_bytes, i, bf16, x);
#pragma unroll
          for (int j = 0; j < 8; ++j) v[j] += x[j];
        }
        *reinterpret_cast<uint4*>(p.C + static_cast<int64_t>(m0 + row) * p.N + col) =
            make_uint4(ar_pack_bf16(v[0], v[1]), ar_pack_bf16(v[2], v[3]), ar_pack_bf16(v[4], v[5]),
                       ar_pack_bf16(v[6], v[7]));
      }
    }
    __syncthreads();
  }

  // ---- end barrier -------------------------------------------------------------------------
  __syncthreads();
  if (tid == 0) {
    ar_end(d, epoch);
  }
}

template <int BM, int BN, bool kKN>
__global__ void __launch_bounds__(kArThreads, 1) ar_oneshot_kernel(const __grid_constant__ ArParams p) {
  constexpr int kMF = BM / 16, kNF = BN / 8, kNP = BN / 16;
  constexpr int kBK = ar_bk(BM, BN), kStages = ar_stages(BM, BN), kRow = kBK * 2, kChunks = kBK / 8;
  constexpr int kABytes = BM * kRow, kStageBytes = ar_stage_bytes(BM, BN);
  constexpr int kBRow = BN * 2, kBChunks = BN / 8;  // kKN: a slice row of W_r (BN columns)
  constexpr int kCs = ar_cs_stride(BN);
  constexpr int kKSteps = kBK / 16 / kArWarps;      // k16 steps of each warp per slice
  static_assert(ar_instance_fits(BM, BN), "instance fits");
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ ArVerdicts sh;

  const CommDevice& d = p.dev;
  const int W = d.world;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const uint64_t epoch = comm_launch_epoch(d);
  const uint32_t smem0 = smem_u32(smem);
  bool started = W == 1;  // this CTA has observed every peer's arrive flag
  bool failed = false;    // a wait of this CTA gave up (recorded): no more pushes

  // ---- GEMM units and pushes ---------------------------------------------------------------
  const int units = p.tiles * p.splits;
  const int per_split = (p.k_tiles + p.splits - 1) / p.splits;
  for (int u = blockIdx.x; u < units; u += gridDim.x) {
    const int t = u % p.tiles, s = u / p.tiles;
    const int m0 = (t / p.tiles_n) * BM, n0 = (t % p.tiles_n) * BN;
    const int kt0 = s * per_split, kt1 = min(p.k_tiles, kt0 + per_split);
    const int nk = max(0, kt1 - kt0);

    auto load = [&](int kt, int stage) {
      const uint32_t as = smem0 + stage * kStageBytes, bs = as + kABytes;
      const int k0 = kt * kBK;
#pragma unroll
      for (int i = tid; i < BM * kChunks; i += kArThreads) {
        const int row = i / kChunks, c = i % kChunks, gm = m0 + row, gk = k0 + c * 8;
        const bool ok = gm < p.M && gk < p.K;
        ar_cp_async16(as + row * kRow + ((c ^ (row & 7)) << 4), ok ? p.A + static_cast<int64_t>(gm) * p.K + gk : p.A,
                      ok);
      }
      if constexpr (!kKN) {
#pragma unroll
        for (int i = tid; i < BN * kChunks; i += kArThreads) {
          const int n = i / kChunks, c = i % kChunks, gn = n0 + n, gk = k0 + c * 8;
          const bool ok = gn < p.N && gk < p.K;
          ar_cp_async16(bs + n * kRow + ((c ^ (n & 7)) << 4), ok ? p.B + static_cast<int64_t>(gn) * p.K + gk : p.B,
                        ok);
        }
      } else {
#pragma unroll
        for (int i = tid; i < kBK * kBChunks; i += kArThreads) {
          const int k = i / kBChunks, c = i % kBChunks, gk = k0 + k, gn = n0 + c * 8;
          const bool ok = gk < p.K && gn < p.N;
          ar_cp_async16(bs + k * kBRow + ((c ^ ar_kn_swizzle<kBChunks>(k)) << 4),
                        ok ? p.B + static_cast<int64_t>(gk) * p.N + gn : p.B, ok);
        }
      }
    };

    float acc[kMF][kNF][4];
#pragma unroll
    for (int i = 0; i < kMF; ++i)
#pragma unroll
      for (int j = 0; j < kNF; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;

#pragma unroll
    for (int st = 0; st < kStages - 1; ++st) {
      if (st < nk) load(kt0 + st, st);
      cp_async_commit();
    }
    // The start barrier's signal, once the first unit's loads are in flight (CTA 0's first
    // unit is u = 0: the grid never exceeds the units).
    if (u == 0 && tid == 0 && W > 1) ar_start(d, epoch);
#pragma unroll 1
    for (int kt = 0; kt < nk; ++kt) {
      cp_async_wait_keep<kStages - 2>();
      __syncthreads();  // slice kt landed for every thread; slice kt-1's stage is free
      if (kt + kStages - 1 < nk) load(kt0 + kt + kStages - 1, (kt + kStages - 1) % kStages);
      cp_async_commit();
      const uint32_t as = smem0 + (kt % kStages) * kStageBytes, bs = as + kABytes;
#pragma unroll
      for (int j = 0; j < kKSteps; ++j) {
        const int kk = j * kArWarps + warp;  // this warp's k16 step of the slice
        uint32_t a[kMF][4], b[kNF][2];
#pragma unroll
        for (int mf = 0; mf < kMF; ++mf) {
          const int row = mf * 16 + (lane % 8) + ((lane / 8) & 1) * 8;
          const int c = kk * 2 + (lane / 8) / 2;
          ar_ldmatrix_x4(a[mf], as + row * kRow + ((c ^ (row & 7)) << 4));
        }
#pragma unroll
        for (int np = 0; np < kNP; ++np) {
          uint32_t q[4];
          if constexpr (!kKN) {
            const int n = np * 16 + (lane % 8) + ((lane / 8) / 2) * 8;
            const int c = kk * 2 + ((lane / 8) & 1);
            ar_ldmatrix_x4(q, bs + n * kRow + ((c ^ (n & 7)) << 4));
          } else {
            const int k = kk * 16 + (lane % 8) + ((lane / 8) & 1) * 8;
            const int c = np * 2 + (lane / 8) / 2;
            ar_ldmatrix_x4_trans(q, bs + k * kBRow + ((c ^ ar_kn_swizzle<kBChunks>(k)) << 4));
          }
          b[2 * np][0] = q[0], b[2 * np][1] = q[1], b[2 * np + 1][0] = q[2], b[2 * np + 1][1] = q[3];
        }
#pragma unroll
        for (int mf = 0; mf < kMF; ++mf)
#pragma unroll
          for (int nf = 0; nf < kNF; ++nf) ar_mma(acc[mf][nf], a[mf], b[nf][0], b[nf][1]);
      }
    }
    cp_async_wait_keep<0>();
    __syncthreads();  // every stage read: the epilogue's tiles reuse the buffers

    // Each warp's partial into its own fp32 tile in shared memory, then their sum in warp order
    // (rows of the operands only) into warp 0's tile: the unit's partial, rows of kCs.
    const int rows = min(BM, p.M - m0);
    float* cs = reinterpret_cast<float*>(smem);
    {
      float* mine = cs + warp * (BM * kCs);
#pragma unroll
      for (int mf = 0; mf < kMF; ++mf)
#pragma unroll
        for (int nf = 0; nf < kNF; ++nf) {
          const int row = mf * 16 + lane / 4, col = nf * 8 + 2 * (lane % 4);
          *reinterpret_cast<float2*>(mine + row * kCs + col) = make_float2(acc[mf][nf][0], acc[mf][nf][1]);
          *reinterpret_cast<float2*>(mine + (row + 8) * kCs + col) = make_float2(acc[mf][nf][2], acc[mf][nf][3]);
        }
      __syncthreads();
      for (int i = tid; i < rows * (BN / 4); i += kArThreads) {
        const int at = (i / (BN / 4)) * kCs + (i % (BN / 4)) * 4;
        float4 v = *reinterpret_cast<const float4*>(cs + at);
#pragma unroll
        for (int w = 1; w < kArWarps; ++w) {
          const float4 x = *reinterpret_cast<const float4*>(cs + w * (BM * kCs) + at);
          v.x += x.x, v.y += x.y, v.z += x.z, v.w += x.w;
        }
        *reinterpret_cast<float4*>(cs + at) = v;
      }
    }
    __syncthreads();
    ar_publish_unit<BM, BN, kArThreads>(p, epoch, cs, t, s, m0, started, failed, sh);
    __syncthreads();  // the tile in shared memory is read: the next unit's loads may overwrite it
  }

  ar_sum_tiles<BM, BN, kArThreads>(p, epoch, started, failed, sh);
}

}  // namespace fusedcomm::kernels::detail
