// The fused kernels of fused.h: allGatherGemm (pull A chunk by chunk while the GEMM consumes
// it) and gemmReduceScatter (fp32 partial tiles + per-chunk flags while owners pull and sum),
// each one persistent grid whose CTAs take roles by blockIdx.x. The GEMM role is the engine of
// gemm_sm90.cuh (gemm_sm90_body) with a dynamic tile schedule; the communication roles are
// below. Host side: kernels/src/fused.cu (geometry, SM split, launch).
//
// Grid (one CTA per SM, all resident: cooperative launch), 384 threads per CTA:
//   allGatherGemm      [0, G)     GEMM from the start
//                      [G, G+P)   pull A's chunks (peers' rows; the GEMM reads the own rows'
//                                 whole M-blocks from A_r, the copy engine copies the rest
//                                 before the launch), then GEMM
//   gemmReduceScatter  [0, G)     GEMM; epilogue writes partial tiles, counts chunks; then
//                                 (consumer threads) reduce, as below
//                      [G, G+R)   reduce this rank's rows chunk by chunk as peers finish them
// Every CTA reads the launch epoch first (comm_launch_epoch) and ends with fused_finish.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "fusedcomm/kernels/detail/fused_protocol.cuh"
#include "fusedcomm/kernels/detail/gemm_sm90.cuh"
#include "fusedcomm/kernels/fused.h"

namespace fusedcomm::kernels::detail {

// ============================================================================================
// allGatherGemm
// ============================================================================================
// Gathered A, row-major M×K in `gathered` (this process's memory): rank p's rows at
// split_offset(M,W,p). Chunk c = rows [c*chunk_rows, (c+1)*chunk_rows), chunk_rows = 128*mg (a
// whole number of GEMM M-blocks, so a tile waits for exactly one flag). Each chunk is pulled
// as `slices` slices of slice_rows rows (one work item each, 64-128 KiB, so that many CTAs
// work on the chunks the GEMM needs next); the slice that completes a chunk raises its flag.
// Work item k = slice k % slices of chunk (c_start + k / slices) % chunks: the order of the
// GEMM's sweep, which starts at this rank's own rows (m_block_start) and wraps around.
struct AgParams {
  // A_r in this rank's data area (split_count(M,W,r) rows × K): the GEMM reads the M-blocks
  // made only of this rank's rows, [own_b0, own_b1), from it directly (AgSchedule::a_source),
  // so they need no copy into the gathered buffer before the launch. Unencoded when empty.
  CUtensorMap tm_own;
  int own_b0, own_b1;  // M-blocks read from tm_own (own_b0 == own_b1: none)
  int own_row0;        // the first row of A_r in the gathered A (split_offset(M,W,r))
  CommDevice dev;
  __nv_bfloat16* gathered;
  uint64_t in_offset;  // A_p in every rank's data area
  int M, K;
  int mg;          // M-blocks per chunk
  int chunks;
  int slices;      // work items per chunk
  int slice_rows;
  int c_start;     // chunk of the GEMM's first M-block
  int gemm_ctas;   // CTAs [0, gemm_ctas) start on the GEMM
  int comm_ctas;   // CTAs [gemm_ctas, gemm_ctas + comm_ctas) pull first
};

#ifdef FUSEDCOMM_AG_TRACE
// Debug build only: a timeline in this rank's scratch area (%globaltimer ns): per GEMM tile
// (m_block * n_blocks + n_block) the producer's wait [start, end); per chunk the flag time;
// per pulling CTA [start, end). Read by fused_bench --trace.
// Layout: 2 words per tile slot (m_blocks x 4096 slots), then one per chunk, then 2 per
// pulling CTA.
__device__ __forceinline__ uint64_t* ag_trace(const AgParams& p) {
  return reinterpret_cast<uint64_t*>(p.dev.base[p.dev.rank] + p.dev.scratch_offset);
}
__device__ __forceinline__ uint64_t* ag_trace_chunks(const AgParams& p) {
  return ag_trace(p) + 2 * (static_cast<int64_t>(p.M + 127) / 128) * 4096;
}
#endif

// What the fused kernels' GEMM schedules share (gemm_sm90.cuh's contract): single CTAs that
// claim sweep positions one at a time from this rank's FusedFlags::tile_claim.
template <class Params>
struct FusedClaims {
  static constexpr int kCluster = 1;
  static constexpr bool kDynamic = true;
  const Params* p;  // the kernel's parameter (grid constant)
  uint64_t epoch;

  __device__ __forceinline__ int cta() const { return 0; }
  __device__ __forceinline__ int num_ctas() const { return 1; }
  __device__ __forceinline__ int claim() const {
    return static_cast<int>(atomicAdd(&fused_flags(p->dev, p->dev.rank)->tile_claim, 1u));
  }
  // A from the plan's tensor map (AgSchedule reads some blocks from A_r instead).
  __device__ __forceinline__ const CUtensorMap* a_source(const CUtensorMap* tm_a, TileCoord tc,
                                                         int& row) const {
    row = tc.m * kTileM;
    return tm_a;
  }
};

// The GEMM role's schedule: dynamic claims in the rotated raster of tile_coord (hook 4), and
// before each tile its chunk's flag (hook 1, from device memory with the launch's epoch).
struct AgSchedule : FusedClaims<AgParams> {
  __device__ __forceinline__ TileCoord coord(const GemmProblem& prob, int t) const {
    return tile_coord(prob, t);
  }
  __device__ __forceinline__ const CUtensorMap* a_source(const CUtensorMap* tm_a, TileCoord tc,
                                                         int& row) const {
    if (tc.m >= p->own_b0 && tc.m < p->own_b1) {
      row = tc.m * kTileM - p->own_row0;
      return &p->tm_own;
    }
    row = tc.m * kTileM;
    return tm_a;
  }
  __device__ __forceinline__ bool has_waits(const GemmProblem&) const { return true; }
  template <int BN>
  __device__ __forceinline__ bool wait(const GemmProblem& prob, TileCoord tc) const {
    // Blocks read from A_r (a_source) are ready before the launch (stream order): no flag.
    if (tc.m >= p->own_b0 && tc.m < p->own_b1) return true;
    const int c = tc.m / p->mg;
    const uint64_t* flag = &fused_flags(p->dev, p->dev.rank)->ag_chunk[c];
#ifdef FUSEDCOMM_AG_TRACE
    uint64_t* tr = ag_trace(*p) + 2 * (tc.m * prob.n_blocks + tc.n);
    tr[0] = globaltimer_ns();
    const bool ok = ld_acquire_gpu(flag) >= epoch ||
                    fused_wait_flag(p->dev, flag, epoch, kFusedOpAllGatherGemm, kFusedStepChunk, 0, 2);
    tr[1] = globaltimer_ns();
    return ok;
#endif
    // gpu scope: this GPU's pulling CTAs raise the flag (FusedFlags::ag_chunk). Up to G
    // producers poll it while the pull runs; .sys polls slowed the pull ~10x (NOTES, run 4).
    if (ld_acquire_gpu(flag) >= epoch) return true;
    // Slow path: name the rank whose rows the chunk waits for (the first one not this rank).
    const int64_t r0 = static_cast<int64_t>(c) * p->mg * kTileM;
    const int64_t r1 = min(static_cast<int64_t>(p->M), r0 + p->mg * kTileM) - 1;
    int peer = split_owner(p->M, p->dev.world, r0);
    if (peer == p->dev.rank) peer = split_owner(p->M, p->dev.world, r1);
    // Twice the timeout: a chunk is late only because a pulling CTA waits for a peer, and that
    // CTA's record (the peer and its start-barrier step) is the one to keep.
    return fused_wait_flag(p->dev, flag, epoch, kFusedOpAllGatherGemm, kFusedStepChunk, peer, 2);
  }
  __device__ __forceinline__ void consumers_done() const {
    named_barrier_sync(1, 256);
    if (threadIdx.x == 128) fused_finish(p->dev, epoch, kFusedOpAllGatherGemm);
  }
};

// The pulling role (all 384 threads of CTA j of the P pulling CTAs). Returns when the CTA's
// items are done (or a wait gave up); the CTA then joins the GEMM. Out of line: role code
// inlined before the engine perturbed ptxas's register allocation of the engine's consumers
// (see fused_wait); as a function of its own it is allocated on its own.
inline __device__ __noinline__ void ag_pull_role(const AgParams& p, uint64_t epoch, int j) {
  const CommDevice& d = p.dev;
  const int W = d.world, r = d.rank;
  FusedFlags* ff = fused_flags(d, r);
  __shared__ int s_ok;
  // Start barrier, signal side (ordering: CommFlags::arrive): stream order puts this rank's
  // input before the kernel; the fence publishes it at system scope.
  if (j == 0 && threadIdx.x == 0 && W > 1) {
    comm_publish_signature(d, epoch);  // before this thread's first release (CommFlags::launch)
    __threadfence_system();
    comm_signal_peers(d, [&](CommFlags* f) { return &f->arrive[r]; }, epoch);
  }
#ifdef FUSEDCOMM_AG_TRACE
  uint64_t* trace = ag_trace_chunks(p) + p.chunks;
  if (threadIdx.x == 0) trace[2 * j] = globaltimer_ns();
#endif
  uint32_t arrived = 1u << r;  // peers whose arrive flag this CTA has observed (uniform)
  bool ok = true;
  const int chunk_rows = p.mg * kTileM;
  const int items = p.chunks * p.slices;
  const size_t row_bytes = static_cast<size_t>(p.K) * 2;
  const int mb = (p.M + kTileM - 1) / kTileM;
  for (int k = j; k < items && ok; k += p.comm_ctas) {
    const int c = (p.c_start + k / p.slices) % p.chunks;
    // A chunk made only of blocks the GEMM reads from A_r needs neither rows nor its flag (no
    // tile waits for it: AgSchedule::wait); skipped before any barrier, so CTA-uniformly.
    if (c * p.mg >= p.own_b0 && min((c + 1) * p.mg, mb) <= p.own_b1) continue;
    const int64_t a = static_cast<int64_t>(c) * chunk_rows +
                      static_cast<int64_t>(k % p.slices) * p.slice_rows;
    const int64_t b = min(min(a + p.slice_rows, static_cast<int64_t>(c + 1) * chunk_rows),
                          static_cast<int64_t>(p.M));
    if (a < b) {
      const int o0 = split_owner(p.M, W, a), o1 = split_owner(p.M, W, b - 1);
      for (int o = o0; o <= o1; ++o) {
        const int64_t off = split_offset(p.M, W, o), cnt = split_count(p.M, W, o);
        const int64_t ra = max(a, off), rb = min(b, off + cnt);
        // This rank's own rows were copied by the copy engine before the launch (fused.cu):
        // local copies here ran at a few GB/s once the GEMM was busy (bench/fused/NOTES.md).
        if (ra >= rb || o == r) continue;
        if ((arrived & (1u << o)) == 0) {
          // Start barrier, wait side: o's input for this epoch is written and o has finished
          // its previous launch. Observe pattern: acquire by thread 0, then bar.sync.
          if (threadIdx.x == 0) {
            s_ok = fused_wait(d, &comm_flags(d, r)->arrive[o], epoch, kFusedOpAllGatherGemm,
                              kCommStepArrive, o, 1);
          }
          __syncthreads();
          ok = s_ok != 0;
          __syncthreads();  // s_ok may be rewritten by the next owner's wait
          if (!ok) break;
          arrived |= 1u << o;
        }
        const uint8_t* src = d.base[o] + d.data_offset + p.in_offset + (ra - off) * row_bytes;
        fused_cta_copy(reinterpret_cast<uint8_t*>(p.gathered) + ra * row_bytes, src,
                       (rb - ra) * static_cast<int64_t>(row_bytes));
      }
    }
    if (!ok) break;
    // Publish the slice; the last slice of the chunk raises its flag (ordering: FusedFlags::
    // ag_chunk). Empty slices (past M) count too: every chunk expects `slices` arrivals.
    __syncthreads();
    if (threadIdx.x == 0) {
      fence_acq_rel_gpu();
      if (fused_last_of(&ff->chunk_count[c], static_cast<uint32_t>(p.slices))) {
        st_release_gpu(&ff->ag_chunk[c], epoch);
#ifdef FUSEDCOMM_AG_TRACE
        ag_trace_chunks(p)[c] = globaltimer_ns();
#endif
      }
    }
  }
  // Every load of a peer's memory by this CTA is complete (its values were stored).
  __syncthreads();
#ifdef FUSEDCOMM_AG_TRACE
  if (threadIdx.x == 0) trace[2 * j + 1] = globaltimer_ns();
#endif
  if (threadIdx.x == 0) fused_role_done(d, epoch, static_cast<uint32_t>(p.comm_ctas));
}

template <int BN, bool kBKN>
__global__ void __launch_bounds__(kGemmThreads, 1)
    ag_gemm_kernel(const __grid_constant__ CUtensorMap tm_a,
                   const __grid_constant__ CUtensorMap tm_b,
                   const __grid_constant__ CUtensorMap tm_c,
                   const __grid_constant__ GemmProblem prob,
                   const __grid_constant__ DefaultEpilogue epi,
                   const __grid_constant__ AgParams p) {
  const uint64_t epoch = comm_launch_epoch(p.dev);
  if (static_cast<int>(blockIdx.x) >= p.gemm_ctas) {
    ag_pull_role(p, epoch, static_cast<int>(blockIdx.x) - p.gemm_ctas);
  }
  gemm_sm90_body<BN, kBKN>(tm_a, tm_b, tm_c, prob, epi, AgSchedule{{&p, epoch}});
}

#ifdef FUSEDCOMM_RS_TRACE
// Debug build only (-DFUSEDCOMM_RS_TRACE; fused_bench prints it): where gemmReduceScatter's
// time goes, in %globaltimer ns. Reducing CTA j: words [8j, 8j + 5) = start, end, flag waits,
// reducing (thread 0: from its flags to the next item's claim, its share plus the barrier),
// items (chunk slices). Every CTA b: [4096 + 2b] = entry, [4096 + 2b + 1] = end of its role (GEMM CTAs:
// consumers done). GEMM CTA b, once it joined the reduction: [6144 + 2b] = end, [6144 + 2b + 1]
// = items it reduced. Set by rs_trace_buffer (fused.cu).
__device__ uint64_t* g_rs_trace;
#define FC_RS_TRACE(...) __VA_ARGS__
#else
#define FC_RS_TRACE(...)
#endif

// ============================================================================================
// gemmReduceScatter
// ============================================================================================
// Every rank computes all of its M×N partial product (fp32, row stride N) into its workspace
// (data area + ws_offset) and every rank sweeps the tiles in the SAME order: so a tile's W
// partials complete at about the same time on all ranks. The M-blocks are taken in an
// interleaved order: logical block L -> physical block rs_block_of(L): the m_blocks split
// over W streams (split rule; stream o ~ owner o's rows), one block of each stream in turn.
// Every wave of tiles then holds rows of every owner, so all owners reduce (and all NVLink
// links carry traffic) throughout the GEMM instead of one owner at a time.
//
// Chunk = `mg` consecutive LOGICAL M-blocks (a divisor of the raster group) × chunk_cols
// columns (a multiple of 256, so of either tile width): id = (L / mg) * col_groups + n_col /
// chunk_cols. The chunk layout depends only on (M, N, W), never on a rank's tile width or CTA
// split, so every rank agrees on chunk ids. The GEMM CTA that finishes a chunk's last tile
// raises rs_ready[rank * chunks + chunk] = epoch in the region of every rank that owns rows of
// the chunk (FusedFlags::rs_ready). Owner o's reducing CTAs, and its GEMM CTAs once they have
// no tile left, claim o's chunks one by one in the order they complete (rs_reduce_role), wait
// for the W flags, and for each row of the chunk that o owns compute
//   out[row - off_o][col] = bf16( (((0 + P_0) + P_1) + ...) + P_{W-1} )   (fp32, rank order)
// pulling P_s from rank s's workspace.
//
// Why pull: each rank moves (W-1) × (M/W) × N × 4 bytes over NVLink either way. Pulling reads
// the partials where the GEMM wrote them (local stores, the engine's register epilogue) and
// writes the output once; pushing would either store the fragments straight to peers
// (16-byte row pieces per warp instruction: partial NVLink writes) or stage them in the
// owner's memory, which adds W × (M/W) × N × 4 bytes written and read again per rank. Flags
// are pushed (one remote store per chunk and owner) so that every poll is local.
struct RsParams {
  CommDevice dev;
  __nv_bfloat16* out;
  uint64_t ws_offset;  // the partial (M×N, fp32 or bf16) in every rank's data area
  int M, N;
  int m_blocks;
  int mg;           // logical M-blocks per chunk (a power of two dividing group_m)
  int chunk_cols;   // columns per chunk (multiple of 256)
  int col_groups;   // ceil(N / chunk_cols)
  int chunks;       // ceil(m_blocks / mg) * col_groups
  int item_cols;    // columns of one reduce item (a multiple of 256, at most chunk_cols): the
                    // reducing role claims chunk slices of this width
  int items_per_chunk;  // ceil(chunk_cols / item_cols)
  int group_m;      // the GEMM's raster group (also GemmProblem::group_m)
  int tile_n;       // this rank's GEMM tile width
  int gemm_ctas;    // CTAs [0, gemm_ctas) run the GEMM
  int red_ctas;     // CTAs [gemm_ctas, gemm_ctas + red_ctas) reduce
  int bf16_partials;  // 1: the partials are bf16 (RsPartials::kBF16), else fp32
};

// Logical M-block L (sweep position) -> physical M-block, and back (see above).
__host__ __device__ __forceinline__ int rs_block_of(int L, int mb, int w) {
  const int q = mb / w;
  const int o = L < q * w ? L % w : L - q * w;
  const int j = L < q * w ? L / w : q;
  return static_cast<int>(split_offset(mb, w, o)) + j;
}
__host__ __device__ __forceinline__ int rs_logical_of(int P, int mb, int w) {
  const int o = split_owner(mb, w, P);
  const int j = P - static_cast<int>(split_offset(mb, w, o));
  const int q = mb / w;
  return j < q ? j * w + o : q * w + o;
}

// 16-byte vectors of partials, widened and added into fp32 sums: 4 fp32 or 8 bf16 elements.
__device__ __forceinline__ void rs_add(float (&acc)[4], const uint4& v, float) {
  acc[0] += __uint_as_float(v.x);
  acc[1] += __uint_as_float(v.y);
  acc[2] += __uint_as_float(v.z);
  acc[3] += __uint_as_float(v.w);
}
__device__ __forceinline__ void rs_add(float (&acc)[8], const uint4& v, __nv_bfloat16) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w[i]));
    acc[2 * i] += f.x;
    acc[2 * i + 1] += f.y;
  }
}

// dst[i][c] = bf16(sum over s in 0..NS-1 of src[s][i][c]) for rows i < rows, columns c < cols
// (a multiple of 16 bytes of T; rows * cols < 2^31); row strides ld (sources) and ldo (dst),
// elements; threads tid = 0..nt-1 share the work. T: the partials' type (float or bf16).
// 16-byte loads, kU vectors per source in flight per thread (NS * kU = 8: 48 KiB per CTA of
// 384 threads, as the pull loop). Sources are summed in fp32 in order s = 0, 1, ... starting
// from 0.f, then rounded once.
template <int NS, class T>
__device__ __forceinline__ void rs_reduce_rows(const T* const* src, int64_t ld,
                                               __nv_bfloat16* dst, int64_t ldo, int rows,
                                               int cols, int tid, int nt) {
  constexpr int kU = NS >= 8 ? 1 : 8 / NS;
  constexpr int kE = 16 / sizeof(T);  // elements per vector
  const T* s_ptr[NS];
#pragma unroll
  for (int s = 0; s < NS; ++s) s_ptr[s] = src[s];
  const int vpr = cols / kE;
  const int nv = rows * vpr;
  for (int i = tid; i < nv; i += kU * nt) {
    uint4 v[kU][NS];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int idx = i + u * nt;
      if (idx < nv) {
        const int row = idx / vpr;
        const int64_t at = row * ld + (idx - row * vpr) * kE;
#pragma unroll
        for (int s = 0; s < NS; ++s) {
          v[u][s] = __ldcg(reinterpret_cast<const uint4*>(s_ptr[s] + at));
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int idx = i + u * nt;
      if (idx >= nv) continue;
      const int row = idx / vpr;
      float acc[kE];
#pragma unroll
      for (int e = 0; e < kE; ++e) acc[e] = 0.f;
#pragma unroll
      for (int s = 0; s < NS; ++s) rs_add(acc, v[u][s], T{});
      uint32_t packed[kE / 2];
#pragma unroll
      for (int e = 0; e < kE / 2; ++e) {
        const __nv_bfloat162 h = __floats2bfloat162_rn(acc[2 * e], acc[2 * e + 1]);
        packed[e] = *reinterpret_cast<const uint32_t*>(&h);
      }
      __nv_bfloat16* out = dst + row * ldo + (idx - row * vpr) * kE;
      if constexpr (kE == 4) {
        *reinterpret_cast<uint2*>(out) = make_uint2(packed[0], packed[1]);
      } else {
        *reinterpret_cast<uint4*>(out) = make_uint4(packed[0], packed[1], packed[2], packed[3]);
      }
    }
  }
}

template <int NS, class T>
__device__ __forceinline__ void rs_reduce_region_as(const RsParams& p, int64_t ra, int64_t rb,
                                                    int c0, int c1, int64_t own_off, int tid,
                                                    int nt) {
  const CommDevice& d = p.dev;
  const T* src[NS];
#pragma unroll
  for (int s = 0; s < NS; ++s) {
    src[s] = reinterpret_cast<const T*>(d.base[s] + d.data_offset + p.ws_offset) + ra * p.N + c0;
  }
  rs_reduce_rows<NS>(src, p.N, p.out + (ra - own_off) * p.N + c0, p.N, static_cast<int>(rb - ra),
                     c1 - c0, tid, nt);
}

template <int NS>
__device__ __forceinline__ void rs_reduce_region(const RsParams& p, int64_t ra, int64_t rb,
                                                 int c0, int c1, int64_t own_off, int tid,
                                                 int nt) {
  if (p.bf16_partials) {
    rs_reduce_region_as<NS, __nv_bfloat16>(p, ra, rb, c0, c1, own_off, tid, nt);
  } else {
    rs_reduce_region_as<NS, float>(p, ra, rb, c0, c1, own_off, tid, nt);
  }
}

// This rank's chunks: those holding rows it owns, in the order the GEMM completes them (raster
// group, then column group, then the group's chunks); its reduce items are their column slices
// (RsParams::item_cols), item k = slice k % items_per_chunk of owned chunk k / items_per_chunk.
// A walk only moves forward; each claimer keeps its own and seeks its claims in rising order.
struct RsWalk {
  int g = 0, cg = 0, i = 0;  // the next candidate: raster group, column group, chunk of the group
  int next = 0;              // the number of the next owned chunk
  int found = -1;            // the owned chunk of the last successful seek, at (L0, col_group)
  int L0 = 0, col_group = 0;

  // Moves to owned chunk k (not below any earlier call's k): its first logical M-block and
  // column group in L0 and col_group; false when this rank owns k or fewer chunks.
  template <int W>
  __device__ __forceinline__ bool seek(const RsParams& p, int64_t own_off, int64_t own_end,
                                       int k) {
    if (k == found) return true;
    const int mb = p.m_blocks;
    const int groups = (mb + p.group_m - 1) / p.group_m, per_group = p.group_m / p.mg;
    while (g < groups) {
      const int l0 = g * p.group_m + i * p.mg;
      if (i == per_group || l0 >= mb) {
        i = 0;
        if (++cg == p.col_groups) {
          cg = 0;
          ++g;
        }
        continue;
      }
      ++i;
      bool owned = false;
      for (int l = l0; l < min(l0 + p.mg, mb) && !owned; ++l) {
        const int64_t row0 = static_cast<int64_t>(rs_block_of(l, mb, W)) * kTileM;
        owned = row0 < own_end && min(static_cast<int64_t>(p.M), row0 + kTileM) > own_off;
      }
      if (owned && next++ == k) {
        found = k;
        L0 = l0;
        col_group = cg;
        return true;
      }
    }
    return false;
  }
};

// The reducing role. NS = world size. Items are claimed one at a time from FusedFlags::
// rs_claim, so they are taken in completion order by whichever CTA is free:
// - !kJoin: the R reducing CTAs (all 384 threads), from the kernel's start;
// - kJoin: every GEMM CTA's 256 consumer threads once the GEMM has no tile left for it (the
//   producer warpgroup has returned), so that the tail of the reduction (the chunks of the
//   GEMM's last wave) runs on every SM instead of R.
// Every CTA of the grid thus may read peers' partials, and each one counts in role_exit.
// Out of line, as ag_pull_role, and one function per world size and kind: with the eight
// reduction loops in one function ptxas spilled, and a __noinline__ function is called from
// one register region only (fused_protocol.cuh: kJoin runs in the consumers' 232 registers).
template <int NS, bool kJoin>
__device__ __noinline__ void rs_reduce_role(const RsParams& p, uint64_t epoch) {
  constexpr int kThreads = kJoin ? 256 : kGemmThreads;
  const int tid = static_cast<int>(threadIdx.x) - (kJoin ? 128 : 0);
  auto sync = [] {
    if constexpr (kJoin) {
      named_barrier_sync(1, 256);
    } else {
      __syncthreads();
    }
  };
  const CommDevice& d = p.dev;
  const int W = NS, r = d.rank, mb = p.m_blocks;  // NS == d.world (dispatch: rs_reduce_dispatch)
  const int64_t own_off = split_offset(p.M, W, r), own_end = own_off + split_count(p.M, W, r);
  FusedFlags* ff = fused_flags(d, r);
  __shared__ int s_item[2];  // the claimed item; whether its chunk's W flags are up
  // The signature (CommFlags::launch): before this CTA's fence.sc.sys in fused_role_done, which
  // the last CTA's release of the done flags follows (the counter chain), so a peer's
  // fused_finish that acquires them may compare it; published first so that a peer stuck in
  // another op's wait sees it at once.
  if (!kJoin && static_cast<int>(blockIdx.x) == p.gemm_ctas && tid == 0) {
    comm_publish_signature(d, epoch);
  }
  RsWalk walk;
  int observed = -1;  // thread 0: the chunk whose W flags it last acquired
  FC_RS_TRACE(uint64_t tr[8] = {globaltimer_ns()}; uint64_t t_chunk = 0;)
  for (;;) {
    FC_RS_TRACE(const uint64_t tw = globaltimer_ns(); if (t_chunk) tr[3] += tw - t_chunk;)
    if (tid == 0) s_item[0] = static_cast<int>(atomicAdd(&ff->rs_claim, 1u));
    sync();
    // Every thread seeks the same item (s_item[0] is rewritten only after the next barrier).
    const int item = s_item[0];
    if (!walk.template seek<NS>(p, own_off, own_end, item / p.items_per_chunk)) break;
    const int L0 = walk.L0, cg = walk.col_group;
    const int chunk = (L0 / p.mg) * p.col_groups + cg;
    // Observe pattern (FusedFlags::rs_ready): acquire every source's flag, then bar.sync (a
    // chunk's later slices on this CTA rely on the first one's acquire and barrier).
    if (tid == 0) {
      int all = 1;
      for (int s = 0; s < W && all && chunk != observed; ++s) {
        all = fused_wait(d, &ff->rs_ready[s * p.chunks + chunk], epoch, kFusedOpGemmReduceScatter,
                         kFusedStepPartial, s, 1);
      }
      if (all) observed = chunk;
      s_item[1] = all;
    }
    sync();
    // s_item[1] is rewritten only after the next iteration's first barrier.
    FC_RS_TRACE(t_chunk = globaltimer_ns(); tr[2] += t_chunk - tw; ++tr[4];)
    if (s_item[1] == 0) break;
    const int c0 = cg * p.chunk_cols + (item % p.items_per_chunk) * p.item_cols;
    const int c1 = min(min(p.N, (cg + 1) * p.chunk_cols), c0 + p.item_cols);
    for (int l = L0; c0 < c1 && l < min(L0 + p.mg, mb); ++l) {
      const int64_t row0 = static_cast<int64_t>(rs_block_of(l, mb, W)) * kTileM;
      const int64_t ra = max(row0, own_off);
      const int64_t rb = min(min(row0 + kTileM, static_cast<int64_t>(p.M)), own_end);
      if (ra < rb) rs_reduce_region<NS>(p, ra, rb, c0, c1, own_off, tid, kThreads);
    }
  }
  sync();  // every load of a peer's partial by this CTA is complete
  FC_RS_TRACE(if (tid == 0) {
    tr[1] = globaltimer_ns();
    if (t_chunk) tr[3] += tr[1] - t_chunk;
    if constexpr (kJoin) {
      g_rs_trace[6144 + 2 * blockIdx.x] = tr[1];
      g_rs_trace[6144 + 2 * blockIdx.x + 1] = tr[4];
    } else {
      for (int w = 0; w < 8; ++w) g_rs_trace[8 * (blockIdx.x - p.gemm_ctas) + w] = tr[w];
    }
  })
  if (tid == 0) {
    fused_role_done(d, epoch, gridDim.x);
    if constexpr (!kJoin) fused_finish(d, epoch, kFusedOpGemmReduceScatter);
  }
}

template <bool kJoin>
__device__ __forceinline__ void rs_reduce_dispatch(const RsParams& p, uint64_t epoch) {
  switch (p.dev.world) {
    case 1: rs_reduce_role<1, kJoin>(p, epoch); break;
    case 2: rs_reduce_role<2, kJoin>(p, epoch); break;
    case 3: rs_reduce_role<3, kJoin>(p, epoch); break;
    case 4: rs_reduce_role<4, kJoin>(p, epoch); break;
    case 5: rs_reduce_role<5, kJoin>(p, epoch); break;
    case 6: rs_reduce_role<6, kJoin>(p, epoch); break;
    case 7: rs_reduce_role<7, kJoin>(p, epoch); break;
    default: rs_reduce_role<8, kJoin>(p, epoch); break;
  }
}

struct RsSchedule : FusedClaims<RsParams> {
  __device__ __forceinline__ TileCoord coord(const GemmProblem& prob, int t) const {
    TileCoord tc = tile_coord(prob, t);  // m_block_start = 0: tc.m is the logical block
    tc.m = rs_block_of(tc.m, prob.m_blocks, p->dev.world);
    return tc;
  }
  __device__ __forceinline__ bool has_waits(const GemmProblem&) const { return false; }
  template <int BN>
  __device__ __forceinline__ bool wait(const GemmProblem&, TileCoord) const {
    return true;
  }
  __device__ __forceinline__ void consumers_done() const {
    named_barrier_sync(1, 256);
    FC_RS_TRACE(if (threadIdx.x == 128) g_rs_trace[4096 + 2 * blockIdx.x + 1] = globaltimer_ns();)
    // No tile is left for this CTA: its consumers join the reduction (rs_reduce_role).
    rs_reduce_dispatch<true>(*p, epoch);
    if (threadIdx.x == 128) fused_finish(p->dev, epoch, kFusedOpGemmReduceScatter);
  }
};

// The GEMM role's epilogue: partial tiles (fp32 or bf16) into this rank's workspace (register path:
// the stores must be complete before the chunk counter, see FusedFlags::rs_ready), then the
// chunk's arrival count and, for its last tile, the flags to the owners.
struct RsEpilogue {
  const RsParams* p;
  uint64_t epoch;

  __device__ __forceinline__ uint8_t* partial() const {
    return p->dev.base[p->dev.rank] + p->dev.data_offset + p->ws_offset;
  }
  template <int kFrag>
  __device__ __forceinline__ void store(const float (&acc)[kFrag], int row0, int col0,
                                        const GemmProblem& prob) const {
    const int64_t ld = p->N;
    if (p->bf16_partials) {
      auto* ws = reinterpret_cast<__nv_bfloat16*>(partial());
      DefaultEpilogue::apply(acc, ws + row0 * ld, ws + (row0 + 8) * ld, row0, col0, prob,
                             DefaultEpilogue::put_bf16);
    } else {
      auto* ws = reinterpret_cast<float*>(partial());
      DefaultEpilogue::apply(acc, ws + row0 * ld, ws + (row0 + 8) * ld, row0, col0, prob,
                             DefaultEpilogue::put_f32);
    }
  }
  __device__ __forceinline__ bool wants_tile_done() const { return true; }
  __device__ __forceinline__ void tile_done(TileCoord tc, const GemmProblem& prob) const {
    const CommDevice& d = p->dev;
    const int mb = prob.m_blocks;
    const int L = rs_logical_of(tc.m, mb, d.world);
    const int L0 = L / p->mg * p->mg;
    const int L1 = min(L0 + p->mg, mb);
    const int col0 = tc.n * p->tile_n;
    const int cg = col0 / p->chunk_cols;
    const int chunk = (L / p->mg) * p->col_groups + cg;
    const int c_begin = cg * p->chunk_cols;
    const int c_end = min(p->N, c_begin + p->chunk_cols);
    const int n_tiles = (c_end + p->tile_n - 1) / p->tile_n - c_begin / p->tile_n;
    // fence.sc.sys, not .gpu: this tile's stores (ordered before this thread by the named
    // barrier) are read by OTHER GPUs once the chunk's flag is up. Every CTA publishes its own
    // stores at system scope before its arrival, as the collectives' counter pattern does
    // (CommFlags::phase); the flag's release then only has to order the counter (see
    // FusedFlags::rs_ready). (The gpu-scope version relied on cumulativity from other CTAs'
    // gpu-scope fences through the counter to the last CTA's sys-scope release; the first
    // 4 x H200 run showed W >= 3 owners summing partial values that were not yet the tile's.)
    __threadfence_system();
    if (!fused_last_of(&fused_flags(d, d.rank)->chunk_count[chunk],
                       static_cast<uint32_t>((L1 - L0) * n_tiles))) {
      return;
    }
    uint32_t sent = 0;  // owners already told
    for (int l = L0; l < L1; ++l) {
      const int64_t row0 = static_cast<int64_t>(rs_block_of(l, mb, d.world)) * kTileM;
      const int64_t row1 = min(static_cast<int64_t>(p->M), row0 + kTileM) - 1;
      const int o0 = split_owner(p->M, d.world, row0), o1 = split_owner(p->M, d.world, row1);
      for (int o = o0; o <= o1; ++o) {
        if (sent & (1u << o)) continue;
        sent |= 1u << o;
        st_release_sys(&fused_flags(d, o)->rs_ready[d.rank * p->chunks + chunk], epoch);
      }
    }
  }
};

template <int BN, bool kBKN>
__global__ void __launch_bounds__(kGemmThreads, 1)
    rs_gemm_kernel(const __grid_constant__ CUtensorMap tm_a,
                   const __grid_constant__ CUtensorMap tm_b,
                   const __grid_constant__ CUtensorMap tm_c,
                   const __grid_constant__ GemmProblem prob,
                   const __grid_constant__ RsParams p) {
  const uint64_t epoch = comm_launch_epoch(p.dev);
  FC_RS_TRACE(if (threadIdx.x == 0) g_rs_trace[4096 + 2 * blockIdx.x] = globaltimer_ns();)
  if (static_cast<int>(blockIdx.x) < p.gemm_ctas) {
    gemm_sm90_body<BN, kBKN>(tm_a, tm_b, tm_c, prob, RsEpilogue{&p, epoch},
                             RsSchedule{{&p, epoch}});
    return;
  }
  rs_reduce_dispatch<false>(p, epoch);
}

}  // namespace fusedcomm::kernels::detail
