// The fused kernels of fused.h: allGatherGemm (pull A chunk by chunk while the GEMM consumes
// it) and gemmReduceScatter (partial half-tiles pushed to their owners, which sum them in the
// epilogue of their own tiles),
// each one persistent grid whose CTAs take roles by blockIdx.x. The GEMM role is the engine of
// gemm_sm90.cuh (gemm_sm90_body) with a dynamic tile schedule; the communication roles are
// below. Host side: kernels/src/fused.cu (geometry, SM split, launch).
//
// Grid (one CTA per SM, all resident: cooperative launch), 384 threads per CTA:
//   allGatherGemm      [0, G)     GEMM from the start
//                      [G, G+P)   pull A's chunks (peers' rows; the GEMM reads the own rows'
//                                 whole M-blocks from A_r, the copy engine copies the rest
//                                 before the launch), then GEMM; with the copy-engine
//                                 exchange (AgParams::ce) P = 1, raising the chunk flags as
//                                 the side streams report their copies (ag_ce_role)
//   gemmReduceScatter  all        GEMM; the epilogue pushes peers' rows and reduces its own
// Every CTA reads the launch epoch first (comm_launch_epoch) and ends with fused_finish.
//
// Bench build only (-DFUSEDCOMM_PHANTOM_PEER; fused_bench at world 1): one process plays rank 0
// of W = P (fused_bench --phantom-world P, default 2) whose peers are all itself
// (CommDevice::base[i] = base[0]), so that one GPU runs rank 0's whole kernel without NVLink:
// allGatherGemm pulls the "peers'" rows from this GPU's own memory, gemmReduceScatter pushes
// the rows of owners 1..P-1 into its own memory (every owner's receive slot for rank 0 is the
// same memory) and sums its own rows with the P-1 slots there. The waits for the missing peers
// (start flags, partial flags, the end barrier and its signature check) are skipped. What it
// measures: the SM- and HBM-side cost of W = P (the pulling CTAs and chunk flags; the pushes'
// staging, TMA and fences, the own half-tiles' loads and adds), not the link.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/fused/detail/fused_protocol.cuh"
#include "kernels/gemm/detail/gemm_sm90.cuh"
#include "kernels/fused/detail/rs_trace.h"
#include "kernels/fused/fused.h"

namespace fusedcomm::kernels::detail {

// Sweep position -> tile for a sweep in two parts: this rank's M-blocks [b0, b0 + nb), and the
// others from b0 + nb on (cyclically), each part a grouped raster of its own; `own_first`
// says which part comes first (allGatherGemm: the own rows, ready at the launch;
// gemmReduceScatter: the others, whose partials the owners wait for).
__device__ __forceinline__ TileCoord two_part_raster(const GemmProblem& prob, int t, int b0,
                                                     int nb, bool own_first) {
  const int mb = prob.m_blocks;
  const int own_tiles = nb * prob.n_blocks, rest_tiles = (mb - nb) * prob.n_blocks;
  const int own_t = own_first ? t : t - rest_tiles;
  if (own_t >= 0 && own_t < own_tiles) {
    TileCoord tc = grouped_raster(own_t, nb, prob.group_m, prob.n_blocks);
    tc.m += b0;
    return tc;
  }
  TileCoord tc = grouped_raster(own_first ? t - own_tiles : t, mb - nb, prob.group_m, prob.n_blocks);
  tc.m = (b0 + nb + tc.m) % mb;
  return tc;
}

// ============================================================================================
// allGatherGemm
// ============================================================================================
// Gathered A, row-major M×K in `gathered` (this process's memory): rank p's rows at
// split_offset(M,W,p). Chunk c = rows [c*chunk_rows, (c+1)*chunk_rows), chunk_rows = 128*mg (a
// whole number of GEMM M-blocks, so a tile waits for exactly one flag). Each chunk is pulled
// as `slices` slices of slice_rows rows (one work item each, 64-128 KiB, so that many CTAs
// work on the chunks the GEMM needs next); the slice that completes a chunk raises its flag.
// Work item k = slice k % slices of chunk ag_sweep_chunk(k / slices): the order of the GEMM's
// sweep (AgSchedule::coord).
inline constexpr int kAgStoreSpread = 2;  // AgParams::store_own: the stores spread over the tiles
struct AgParams {
  // A_r in this rank's data area (split_count(M,W,r) rows × K): the GEMM reads the M-blocks
  // made only of this rank's rows, [own_b0, own_b1), from it directly (AgSchedule::a_source),
  // so they need no copy into the gathered buffer before the launch. Unencoded when empty.
  CUtensorMap tm_own;
  int own_b0, own_b1;  // M-blocks read from tm_own (own_b0 == own_b1: none)
  int own_row0;        // the first row of A_r in the gathered A (split_offset(M,W,r))
  int store_own;       // the caller asked for the gathered A, so the GEMM stores blocks
                       // [own_b0, own_b1) into it (AgSchedule::stores_a): 0 no; 1 the tile
                       // in column 0 of each block stores all its K slices; 2 (kAgStoreSpread)
                       // every tile of the block stores the slices kb ≡ its column (mod
                       // n_blocks)
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
  int interleave;  // 0: sequential; else W - 1, the runs whose chunks the sweep takes in turn
                   // (ag_sweep_chunk; only where mg == 1)
  int ce;          // 1: the copy engines move the peers' rows (ag_ce_role), 0: the SMs pull
};

// The chunk at position k (0 <= k < chunks) of the sweep: the order of the GEMM's M-blocks
// (AgSchedule::coord), of the pulls (ag_pull_role) and of the copy-engine build's positions
// (ag_ce_role, fused.cu ag_ce_steps), which all take it from here. Sequential: from c_start
// on, wrapping around (this rank's own chunks first, then peer r + 1's, r + 2's, ...).
// Interleaved (mg == 1, so a chunk is an M-block): the own blocks [own_b0, own_b1) first,
// then the other R blocks (from own_b1 on, or from c_start where there is no own block) cut
// into W - 1 runs of near-equal length (the peers' rows when W divides M in whole blocks),
// taken one block of each run in turn. Why: the copy-engine build pulls each peer on its own
// stream, all at once, so every peer's rows arrive at a third of the rate at W = 4; a GEMM
// that took peer r + 1's blocks first waited for them while the others' were landing
// (bench/fused/NOTES.md, "Run 18").
// Position v (0 <= v < n) of n units cut into q consecutive runs of near-equal length (runs
// s < n % q one unit longer), taken one unit of each run in turn -> the unit's offset from the
// first. The peers' blocks in turn: ag_sweep_chunk and rs_spread_coord.
__host__ __device__ __forceinline__ int runs_in_turn(int v, int n, int q) {
  const int base = n / q, extra = n % q;
  // Positions [0, q * base) take run v % q, unit v / q; the last `extra` positions take unit
  // `base` of runs 0 .. extra - 1.
  const int s = v < q * base ? v % q : v - q * base;
  const int j = v < q * base ? v / q : base;
  return s * base + (s < extra ? s : extra) + j;
}
__host__ __device__ __forceinline__ int ag_sweep_chunk(const AgParams& p, int k) {
  if (!p.interleave) return (p.c_start + k) % p.chunks;
  const int nb = p.own_b1 - p.own_b0;
  if (k < nb) return p.own_b0 + k;
  return ((nb > 0 ? p.own_b1 : p.c_start) + runs_in_turn(k - nb, p.chunks - nb, p.interleave)) %
         p.chunks;
}

// Chunk c holds only M-blocks read from A_r: it needs neither rows nor its flag (no tile waits
// for it: AgSchedule::wait). The pulls (ag_pull_role) and the copy-engine build (ag_ce_role,
// and fused.cu ag_ce_steps, whose positions must match that role's) skip the same chunks.
__host__ __device__ __forceinline__ bool ag_chunk_is_own(const AgParams& p, int c) {
  const int mb = (p.M + kTileM - 1) / kTileM;
  const int end = (c + 1) * p.mg < mb ? (c + 1) * p.mg : mb;
  return c * p.mg >= p.own_b0 && end <= p.own_b1;
}
// Rows [*r0, *r1) of chunk c that rank o holds (the copy-engine build: the side stream for
// peer o copies them, ag_ce_role waits for them; fused.cu ag_ce_steps and ag_ce_role use this
// one predicate, so that the stream's positions are the chunks the role counts). Empty when
// *r0 >= *r1.
__host__ __device__ __forceinline__ void ag_chunk_rows_of(const AgParams& p, int W, int c, int o,
                                                          int64_t* r0, int64_t* r1) {
  const int64_t chunk_rows = static_cast<int64_t>(p.mg) * kTileM;
  const int64_t off = split_offset(p.M, W, o), end = off + split_count(p.M, W, o);
  const int64_t a = static_cast<int64_t>(c) * chunk_rows, b = a + chunk_rows;
  *r0 = a > off ? a : off;
  *r1 = b < end ? b : end;  // end <= M
}
// The rank whose rows chunk c waits for (the first one not this rank), for a timeout's report.
__device__ __forceinline__ int ag_chunk_peer(const AgParams& p, int c) {
  const int64_t r0 = static_cast<int64_t>(c) * p.mg * kTileM;
  const int64_t r1 = min(static_cast<int64_t>(p.M), r0 + p.mg * kTileM) - 1;
  const int peer = split_owner(p.M, p.dev.world, r0);
  return peer == p.dev.rank ? split_owner(p.M, p.dev.world, r1) : peer;
}

#ifdef FUSEDCOMM_AG_TRACE
// Debug build only: a timeline in this rank's scratch area (%globaltimer ns): per GEMM tile
// (m_block * n_blocks + n_block) the producer's wait [start, end); per chunk the flag time;
// per pulling CTA [start, end). Read by fused_bench --trace.
// Layout: 2 words per tile slot (m_blocks x 4096 slots), then one per chunk, then 2 per
// pulling CTA, then per pulling CTA its SM id, then per CTA of the grid its entry time.
__device__ __forceinline__ uint64_t* ag_trace(const AgParams& p) {
  return reinterpret_cast<uint64_t*>(p.dev.base[p.dev.rank] + p.dev.scratch_offset);
}
__device__ __forceinline__ uint64_t* ag_trace_chunks(const AgParams& p) {
  return ag_trace(p) + 2 * (static_cast<int64_t>(p.M + 127) / 128) * 4096;
}
__device__ __forceinline__ uint64_t* ag_trace_entry(const AgParams& p) {
  return ag_trace_chunks(p) + p.chunks + 3 * p.comm_ctas;
}
__device__ __forceinline__ uint32_t sm_id() {
  uint32_t v;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(v));
  return v;
}
#endif

// What the fused kernels' GEMM schedules share (gemm_sm90.cuh's contract): single CTAs that
// claim sweep positions one at a time from this rank's FusedFlags::tile_claim.
template <class Params>
struct FusedClaims {
  static constexpr int kCluster = 1;
  static constexpr bool kDynamic = true;
  static constexpr bool kStoresA = false;
  const Params* p;  // the kernel's parameter (grid constant)
  uint64_t epoch;

  __device__ __forceinline__ int cta() const { return 0; }
  __device__ __forceinline__ int num_ctas() const { return 1; }
  __device__ __forceinline__ bool stores_a(TileCoord) const { return false; }
  __device__ __forceinline__ int a_store_stride(const GemmProblem&) const { return 1; }
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
  // M-block m is read from A_r (made only of this rank's rows): no copy, no flag.
  __device__ __forceinline__ bool from_own(int m) const { return m >= p->own_b0 && m < p->own_b1; }
  // With a gathered output, the tiles of each such block also write the block's rows into
  // the gathered A as they pass through shared memory (engine hook kStoresA): the copy engine
  // no longer copies them before the launch. Either the tile in column 0 stores every K slice,
  // or (store_own == kAgStoreSpread) every tile of the block stores those of its stride
  // (a_store_stride: slice kb by the tile in column kb mod n_blocks), each slice once.
  static constexpr bool kStoresA = true;
  __device__ __forceinline__ bool stores_a(TileCoord tc) const {
    return p->store_own != 0 && (tc.n == 0 || p->store_own == kAgStoreSpread) && from_own(tc.m);
  }
  __device__ __forceinline__ int a_store_stride(const GemmProblem& prob) const {
    return p->store_own == kAgStoreSpread ? prob.n_blocks : 1;
  }
  // The own blocks first, in a raster group of their own, then the others from own_b1 on (the
  // pulls' order): a first group that mixed in peers' rows (M < 16 blocks at W = 2, < 32 at
  // W = 4) had half or more of the first wave waiting on pulls (bench/fused/NOTES.md, run 4).
  __device__ __forceinline__ TileCoord coord(const GemmProblem& prob, int t) const {
    if (p->interleave) {  // mg == 1: the sweep's chunks are its M-blocks (ag_sweep_chunk)
      const int nb = p->own_b1 - p->own_b0, own_tiles = nb * prob.n_blocks;
      TileCoord tc = t < own_tiles
                         ? grouped_raster(t, nb, prob.group_m, prob.n_blocks)
                         : grouped_raster(t - own_tiles, prob.m_blocks - nb, prob.group_m, prob.n_blocks);
      tc.m = ag_sweep_chunk(*p, t < own_tiles ? tc.m : nb + tc.m);
      return tc;
    }
    if (p->own_b1 == p->own_b0) return tile_coord(prob, t);  // from the block of the first row
    return two_part_raster(prob, t, p->own_b0, p->own_b1 - p->own_b0, true);
  }
  __device__ __forceinline__ const CUtensorMap* a_source(const CUtensorMap* tm_a, TileCoord tc,
                                                         int& row) const {
    if (from_own(tc.m)) {
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
    if (from_own(tc.m)) return true;
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
    // Slow path, naming the rank whose rows the chunk waits for. Twice the timeout: a chunk is
    // late only because a pulling CTA waits for a peer, and that CTA's record (the peer and its
    // start-barrier step) is the one to keep.
    return fused_wait_flag(p->dev, flag, epoch, kFusedOpAllGatherGemm, kFusedStepChunk,
                           ag_chunk_peer(*p, c), 2);
  }
  __device__ __forceinline__ void consumers_done() const {
    named_barrier_sync(1, 256);
    if (threadIdx.x == 128) fused_finish(p->dev, epoch, kFusedOpAllGatherGemm);
  }
};

// allGatherGemm's exchange by the copy engines (AgParams::ce; AgExchange::kCopyEngines). Why:
// beside the GEMM the pulls take SMs from it (a pulling SM moves ~16 GB/s there: bench/fused/
// NOTES.md "Run 20"), and copy engines move the shards without SMs (kernels/bench/probes:
// nvlink_probe, ce_gemm_probe). On the caller's stream the launcher (fused.cu) enqueues
// ag_ce_barrier_kernel, records an event, then the fused kernel; one side stream per peer
// waits for that event and copies that peer's rows chunk by chunk in ag_ce_role's order
// (cudaMemcpyAsync from its data area), writing the peer's FusedFlags::ce_progress slot = the
// position of each chunk (among the chunks holding rows of that peer) once the copy holding
// its last rows of it is issued, then the end mark (the position count + 1); the caller's
// stream joins them after the kernel. One stream per peer because at W = 4 a copy engine's
// pulls from one peer at a time moved 105-144 GB/s into each GPU, one stream per peer 200-232
// (NOTES.md "Run 17"). One pulling CTA (ag_geometry gives one) turns the positions into the
// chunk flags the GEMM waits for.
// The side streams wait on nothing but the event: a stream wait on a value that the fused
// kernel writes could be scheduled ahead of that kernel in a graph replay and never end. The
// kernel's waits on ce_progress are bounded.

// The start barrier (what ag_pull_role's CTA 0 does in the default build), as a kernel of one
// CTA before the fused kernel: this rank's signature and arrive flag to every peer, then every
// peer's arrive flag (ordering: CommFlags::arrive). The fused kernel that follows reads the same
// epoch (CommControl::epoch changes only at its end).
__global__ void ag_ce_barrier_kernel(const __grid_constant__ CommDevice d) {
  const uint64_t epoch = comm_launch_epoch(d);
  if (threadIdx.x != 0 || d.world < 2) return;
  const int W = d.world, r = d.rank;
  comm_publish_signature(d, epoch);  // before this thread's first release (CommFlags::launch)
  __threadfence_system();
  comm_signal_peers(d, [&](CommFlags* f) { return &f->arrive[r]; }, epoch);
  bool ok = true;
  for (int i = 1; i < W && ok; ++i) {
    const int o = (r + i) % W;
    ok = fused_wait(d, &comm_flags(d, r)->arrive[o], epoch, kFusedOpAllGatherGemm, kCommStepArrive,
                    o, 1);
  }
}

// CTA 0 of the pulling CTAs, the only one: raises each chunk's flag once the side stream of
// every peer with rows in it has marked the chunk's position in its own order. Returns once
// every flag is raised (or a wait gave up); the CTA then joins the GEMM.
inline __device__ __noinline__ void ag_ce_role(const AgParams& p, uint64_t epoch) {
  const CommDevice& d = p.dev;
  const int W = d.world, r = d.rank;
  FusedFlags* ff = fused_flags(d, r);
  if (threadIdx.x == 0) {
    bool ok = true;
    uint64_t pos[kCommMaxRanks - 1] = {};  // per peer slot: chunks with its rows so far
    for (int k = 0; k < p.chunks && ok; ++k) {
      const int c = ag_sweep_chunk(p, k);
      if (ag_chunk_is_own(p, c)) continue;  // the same chunks as the side streams' plans
      // Every peer with rows in the chunk (this rank's own were copied before the launch; a
      // chunk of this rank's rows alone, a partial M-block, waits for nothing).
      for (int i = 0; i + 1 < W && ok; ++i) {
        const int o = (r + 1 + i) % W;
        int64_t r0, r1;
        ag_chunk_rows_of(p, W, c, o, &r0, &r1);
        if (r0 >= r1) continue;
        // ce_progress[i] is written by this GPU's side stream for peer o (a memory operation
        // after its copies complete, with its default memory barrier); acquired at system scope.
        ok = fused_wait(d, &ff->ce_progress[i], ++pos[i], kFusedOpAllGatherGemm, kFusedStepChunk,
                        o, 2);
      }
      // Then the chunk flag is released as the pulls release it (FusedFlags::ag_chunk).
      if (ok) {
        fence_acq_rel_gpu();
        st_release_gpu(&ff->ag_chunk[c], epoch);
      }
    }
    // The end marks follow every copy: then this rank has finished reading peers' memory, and
    // each slot goes back to 0 for the next launch (whose side streams start after this kernel:
    // their event follows the next launch's barrier kernel on the same stream).
    for (int i = 0; i + 1 < W && ok; ++i) {
      ok = fused_wait(d, &ff->ce_progress[i], pos[i] + 1, kFusedOpAllGatherGemm, kFusedStepChunk,
                      (r + 1 + i) % W, 2);
    }
    if (ok) {
      for (int i = 0; i + 1 < W; ++i) *reinterpret_cast<volatile uint64_t*>(&ff->ce_progress[i]) = 0;
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) fused_role_done(d, epoch, static_cast<uint32_t>(p.comm_ctas));
}

// The pulling role (CTA j of the P pulling CTAs; its thread 0 moves the bytes with
// FusedBulkCopier). Returns when the CTA's items are done (or a wait gave up); the CTA then
// joins the GEMM. Out of line: role code
// inlined before the engine perturbed ptxas's register allocation of the engine's consumers
// (see fused_wait); as a function of its own it is allocated on its own.
inline __device__ __noinline__ void ag_pull_role(const AgParams& p, uint64_t epoch, int j) {
  const CommDevice& d = p.dev;
  const int W = d.world, r = d.rank;
  FusedFlags* ff = fused_flags(d, r);
  if (p.ce) {  // CTA-uniform: the copy engines move the rows; ag_ce_barrier_kernel ran the
    ag_ce_role(p, epoch);  // start barrier
    return;
  }
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
  if (threadIdx.x == 0) trace[2 * j] = globaltimer_ns(), trace[2 * p.comm_ctas + j] = sm_id();
#endif
  uint32_t arrived = 1u << r;  // peers whose arrive flag this CTA has observed (uniform)
  bool ok = true;
  static_assert(FusedBulkCopier::kSmemBytes <= GemmTileConfig<128>::kSmemBytes &&
                    FusedBulkCopier::kSmemBytes <= GemmTileConfig<256>::kSmemBytes,
                "the bulk pull's staging fits the kernel's dynamic shared memory");
  extern __shared__ __align__(128) uint8_t pull_smem[];
  FusedBulkCopier bulk;
  if (threadIdx.x == 0) bulk.init(pull_smem);
  const int chunk_rows = p.mg * kTileM;
  const int items = p.chunks * p.slices;
  const size_t row_bytes = static_cast<size_t>(p.K) * 2;
  for (int k = j; k < items && ok; k += p.comm_ctas) {
    const int c = ag_sweep_chunk(p, k / p.slices);
    // Skipped before any barrier, so CTA-uniformly.
    if (ag_chunk_is_own(p, c)) continue;
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
#ifdef FUSEDCOMM_PHANTOM_PEER
            s_ok = 1;  // phantom-peer bench build (top of this file): no peer process
#else
            s_ok = fused_wait(d, &comm_flags(d, r)->arrive[o], epoch, kFusedOpAllGatherGemm,
                              kCommStepArrive, o, 1);
#endif
          }
          __syncthreads();
          ok = s_ok != 0;
          __syncthreads();  // s_ok may be rewritten by the next owner's wait
          if (!ok) break;
          arrived |= 1u << o;
        }
        const uint8_t* src = d.base[o] + d.data_offset + p.in_offset + (ra - off) * row_bytes;
        if (threadIdx.x == 0) {
          bulk.copy(reinterpret_cast<uint8_t*>(p.gathered) + ra * row_bytes, src,
                    (rb - ra) * static_cast<int64_t>(row_bytes));
        }
      }
    }
    if (!ok) break;
    // Publish the slice; the last slice of the chunk raises its flag (ordering: FusedFlags::
    // ag_chunk). Empty slices (past M) count too: every chunk expects `slices` arrivals. The
    // GEMM's producers read the gathered rows with TMA. Thread 0's bulk stores are complete
    // (FusedBulkCopier::copy waits for them) before its release below; the proxy fence is kept
    // for the async-proxy reads that follow (the readers fence after their acquire as well).
    fence_proxy_async_global();
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
  if (threadIdx.x == 0) bulk.release();
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
#ifdef FUSEDCOMM_AG_TRACE
  if (threadIdx.x == 0) ag_trace_entry(p)[blockIdx.x] = globaltimer_ns();
#endif
  if (static_cast<int>(blockIdx.x) >= p.gemm_ctas) {
    ag_pull_role(p, epoch, static_cast<int>(blockIdx.x) - p.gemm_ctas);
  }
  gemm_sm90_body<BN, kBKN>(tm_a, tm_b, tm_c, prob, epi, AgSchedule{{&p, epoch}});
}

// ============================================================================================
// gemmReduceScatter
// ============================================================================================
// Owner o of rows [off_o, end_o) (the split rule) gets the bf16 sum over ranks s of A_s·W_sᵀ on
// its rows. Every rank computes its whole M×N partial product with the engine, and its
// epilogue works per 64-row half-tile (one consumer warpgroup, rows [h0, h0 + 64)):
// - rows another rank o owns are PUSHED: staged in shared memory and TMA-stored (full 128-B
//   lines, asynchronous: NVLink carries them while the warpgroup computes its next tile) into
//   o's receive slot for this rank, or, in the accumulating mode, TMA-added into o's one
//   receive slot (below); the half-tile's flag in o's region (FusedFlags::rs_tile) is raised
//   once the stores are complete, early in the warpgroup's next tile's main loop
//   (main_loop_point), or at its end;
// - rows this rank owns are REDUCED: after every pending push of the warpgroup is complete and
//   flagged, one thread waits for the W-1 peers' flags of the half-tile, then the warpgroup
//   adds the received partials (local loads from its receive slots) and its accumulator, in
//   fp32, and stores the bf16 sums once (TMA). With bf16 partials the accumulator stays fp32:
//   only the terms that travel are rounded (rounding it too, as the decomposed path does, cost
//   1 % at W = 2 on one H100: kernels/bench/fused/NOTES.md; docs/ops.md states the contract).
//   Early fetch (W = 2, bf16 partials; RsParams::prefetch): where the peer's partial of an
//   own half-tile is already flagged early in that tile's main loop (and, with pusher warps,
//   the staging buffer is already free), the issuing thread TMA-loads it into the staging
//   buffer then (as much as fits: the whole half-tile with the pushers' two rounds, 128 of
//   256 columns with the TMA pushes' one), and the epilogue adds those columns from shared
//   memory. Per-source slots: in rank order,
//   (((0 + P_0) + P_1) + ...). Accumulating: P_r + (the peers' partials, added in the order
//   they arrived).
// A half-tile holding rows of two owners (W not dividing M at a 64-row boundary) is pushed
// whole to each other owner (its rows before that owner's land in the slot's padding), and
// this rank's part of it goes to the output by the register path.
//
// Receive slots: owner o's data area at ws_offset holds slots (below) of each
// kFusedRsSlotPadRows + ceil(M/W) rows × N partials: after the padding, a slot's row i = row
// off_o + i. (A TMA box may not start at a negative row: a half-tile that begins before off_o
// is stored from the padding on.)
// - Per-source slots (the default; always at W = 2): W-1 slots, slot (s < o ? s : s - 1) for
//   source s, written by plain TMA stores.
// - Accumulating (W >= 3 and the caller allows any order, RsPartials::kF32AnyOrder;
//   RsParams::accumulate): one slot, which every
//   source adds into (cp.reduce.async.bulk.tensor .add, atomic per element). The owner's
//   launcher zeroes its own rows of it on the stream before the kernel, so the start barrier
//   (below) orders the zeroing before every peer's first add. The owner then loads one slot
//   instead of W-1: at W = 8, 1/7 of the loads that dominated the own half-tiles (one GPU,
//   phantom peers: kernels/bench/fused/NOTES.md). The price: the fp32 sum's order depends on
//   arrival, so results may differ in the last bits between runs and from the decomposed path.
//
// Pusher warps (RsEpilogue::kWarpPush, the default since run 9 on 2 × H200: 0.98 × the TMA
// pushes' time at W = 2 on average, 0.90-0.95 at the large shapes; the TMA pushes remain behind
// the bench switch FUSEDCOMM_RS_TMA_PUSH): the consumers only stage a pushed half-tile in
// shared memory (two 16 KiB rounds per handoff, 3 operand stages instead of 4) and hand it to
// a helper warp of the producer warpgroup, which stores it to the owner with st.global (or
// red.add.v4.f32 into an accumulating slot) and raises the flag itself. Neither the consumers
// nor the TMA unit (the GEMM's loads) wait for NVLink, and a flag no longer depends on the
// warpgroup's next main loop: no flush before a wait, and main_loop_point only issues the
// early fetch (rs_protocol_model.py --pusher).
//
// Tile order (RsSchedule::coord): a rank sweeps first the M-blocks holding none of its rows,
// starting after its own blocks and wrapping around (owners r+1, r+2, ...: at any time each
// owner receives from about one source), then its own blocks [own_b0, own_b0 + own_nb).
// Its own blocks were in every peer's first part, so their pushes are long done when it gets
// there; no partial is stored locally and no reduction pass follows the GEMM.
//
// No deadlock: a warpgroup waits only in its own-row half-tiles, after flushing its pushes,
// and a push is flagged in the first stages of the warpgroup's next tile, which need only
// that the other warpgroup has finished the main loop of the pushing tile (a flag raised in
// the next epilogue could instead wait, through the shared stages, for that warpgroup's own
// wait: a deadlock the model below found at M = 189, W = 4);
// every rank sweeps its first part (pushes only, no wait) before its own blocks, and its own
// blocks in one global order (physical M-block raster, columns ascending within a block, so a
// block shared by two owners is swept in the same column order by both). Take the wait on the
// smallest half-tile in that order that never completes: its pushers either claimed it (their
// warpgroups push before any wait, and can only be stuck on larger ones, or on their first
// part, which never waits) or will claim it (everything before it in their sweep is a push or
// a smaller own half-tile). Either way it completes: contradiction. The waits stay bounded
// (a dead peer): the first one that gives up records the failure. kernels/bench/fused/
// rs_protocol_model.py searches this protocol for deadlocks under random scheduling.
//
// Start barrier: a source writes into o's slots only after o's arrive flag for this launch
// (o's earlier ops on its stream, which may use its data area, are complete, and so is the
// zeroing of an accumulating slot, enqueued just before the kernel). End barrier as
// the other fused ops (fused_finish), which also checks the launch signatures.
//
// Phantom-peer bench build: see the top of this file.
struct RsParams {
  CUtensorMap tm_push[kCommMaxRanks];  // [o]: o's receive slot for this rank, or o's one slot
                                       // (accumulate) (o != rank, o with rows)
  CUtensorMap tm_out;                  // this rank's output rows (split_count × N bf16)
  CommDevice dev;
  __nv_bfloat16* out;
  uint64_t ws_offset;   // the receive slots in every rank's data area
  uint64_t slot_elems;  // (kFusedRsSlotPadRows + ceil(M/W)) * N: a slot, its padding first
  int accumulate;       // 1: every source adds into one slot (see above); 0: per-source slots
  int M, N;
  int tile_n;           // the GEMM's tile width, the same on every rank
  int n_blocks;         // tile columns
  int own_b0, own_nb;   // this rank's M-blocks: those holding any of its rows
  // The pusher warps' sleep after every 2 KiB of stores (0: none): rs_geometry's pacing.
  uint32_t push_pace_ns;
  int halves;           // half-tile rows of one slot's flags (ceil(ceil(M/W) / 64) + 1)
  int bf16_partials;    // 1: the pushed partials are bf16, else fp32
  // Bench switch FUSEDCOMM_RS_SPREAD (rs_geometry: W >= 2, every rank's rows whole M-blocks):
  // the sweep spreads the own tiles through it (rs_spread_coord).
  int spread;
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
  comm_signal_peers(d, [&](CommFlags* f) { return &f->arrive[d.rank]; }, epoch);
}

// Pusher warps (RsEpilogue::kWarpPush): warp 1 + cw of the producer warpgroup sends consumer
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
inline __device__ __noinline__ void push_chunks(uint32_t stage, char* at, int row_lo, int row_hi,
                                                int bytes, int ld, int rounds, bool add_f32,
                                                uint32_t pace_ns) {
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
                   "f"(__uint_as_float(v.x)), "f"(__uint_as_float(v.y)),
                   "f"(__uint_as_float(v.z)), "f"(__uint_as_float(v.w))
                   : "memory");
    } else {
      asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(g), "r"(v.x), "r"(v.y),
                   "r"(v.z), "r"(v.w)
                   : "memory");
    }
    if (pace_ns != 0 && (it & 3) == 3) __nanosleep(pace_ns);
  }
}

// Bench build -DFUSEDCOMM_RS_TRACE: the counters of rs_trace.h.
#ifdef FUSEDCOMM_RS_TRACE
__device__ unsigned long long g_rs_trace[kRsTraceWords];
#endif
__device__ __forceinline__ long long rs_trace_clock() {
#ifdef FUSEDCOMM_RS_TRACE
  return clock64();
#else
  return 0;
#endif
}
// Adds the cycles since t0 to word w (and counts it in `over` if it took > 2,000 cycles).
__device__ __forceinline__ void rs_trace_add(int w, long long t0, int over = -1) {
#ifdef FUSEDCOMM_RS_TRACE
  const unsigned long long c = static_cast<unsigned long long>(clock64() - t0);
  atomicAdd(&g_rs_trace[w], c);
  if (over >= 0 && c > 2000) atomicAdd(&g_rs_trace[over], 1ull);
#endif
}
__device__ __forceinline__ void rs_trace_count(int w) {
#ifdef FUSEDCOMM_RS_TRACE
  atomicAdd(&g_rs_trace[w], 1ull);
#endif
}
__device__ __forceinline__ void rs_trace_max(int w, unsigned long long v) {
#ifdef FUSEDCOMM_RS_TRACE
  atomicMax(&g_rs_trace[w], v);
#endif
}

// Early fetch of an own half-tile's received partial (RsParams::prefetch): per consumer
// warpgroup, in the engine's aux region (after the two RsPushMail with pusher warps). `bar`
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
#ifdef FUSEDCOMM_RS_TMA_PUSH  // bench switch: the consumers' TMA pushes
  static constexpr bool kWarpPush = false;
#else
  static constexpr bool kWarpPush = true;
#endif
  static constexpr int kStagingRounds = kWarpPush ? 2 : 1;
  // The early fetch: the 64×64 bf16 boxes (8 KiB) of a fetched partial that the staging
  // buffer holds: a whole half-tile (BN = 256) with two rounds, its first 128 columns with one.
  static constexpr int kFetchBoxes = 2 * kStagingRounds;
  static constexpr bool kInitAux = true;
  static constexpr bool kAuxWarps = kWarpPush;
  const RsParams* p;
  uint64_t epoch;
  // The issuing thread's state (t == 0 of each consumer warpgroup, or lane 0 of a pusher
  // warp; per thread, in registers):
  mutable uint64_t* pend = nullptr;  // flag of a TMA push not yet known complete
  mutable uint32_t started = 0;      // owners whose arrive flag this thread has observed
  mutable uint32_t posts = 0;        // handoffs made to the pusher (kWarpPush)

  // The aux region: the pushers' two mails (kWarpPush), then the two warpgroups' RsFetch.
  static constexpr int kFetchAt = kWarpPush ? 2 * sizeof(RsPushMail) : 0;
  static_assert(kFetchAt + 2 * sizeof(RsFetch) <= GemmTileConfig<256, kStagingRounds>::kAuxBytes,
                "the mails and the fetch states fit the engine's aux region");
  __device__ __forceinline__ static void init_aux(uint8_t* aux) {
    if constexpr (kWarpPush) {
      auto* mail = reinterpret_cast<RsPushMail*>(aux);
      for (int i = 0; i < 2; ++i) {
        mbar_init(&mail[i].staged, 1);
        mbar_init(&mail[i].freed, 1);
      }
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
  __device__ __forceinline__ void post(RsPushMail* mail, int h0, int col, int n, int last,
                                       int rounds) const {
    mail->h0 = h0;
    mail->col = col;
    mail->n = n;
    mail->bits = last | rounds << 1;
    mbar_arrive(&mail->staged);
    ++posts;
  }

  // Issuing thread: waits until every bulk group but the kKeep most recent is complete (the
  // pending push is older: kKeep = the rounds issued since), then raises its flag.
  template <int kKeep>
  __device__ __forceinline__ void flush() const {
    if (pend == nullptr) return;
    bulk_wait_keep<kKeep>();
    fence_proxy_async_global();  // the TMA writes (async proxy) before the generic release
    __threadfence_system();
    st_release_sys(pend, epoch);
    pend = nullptr;
  }
  // Issuing thread: o's launch has started (its receive slots may be written).
  __device__ __forceinline__ bool observe_start(int o) const {
#ifdef FUSEDCOMM_PHANTOM_PEER
    return true;  // phantom-peer bench build (top of this file): no peer process
#endif
    if (started & (1u << o)) return true;
    const CommDevice& d = p->dev;
    if (!fused_wait(d, &comm_flags(d, d.rank)->arrive[o], epoch, kFusedOpGemmReduceScatter,
                    kCommStepArrive, o, 1)) {
      return false;
    }
    fence_proxy_async_global();  // before this thread's TMA writes into o's memory
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
  __device__ __forceinline__ void load_source(float (&v)[4 * kB], int slot, int64_t row_lo,
                                              int col, bool lo_ok, bool hi_ok) const {
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
  __device__ __forceinline__ void add_sources(float (&acc)[kFrag], int64_t row_lo, int col0,
                                              bool lo_ok, bool hi_ok) const {
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
#ifdef FUSEDCOMM_PHANTOM_PEER
    return;
#endif
    const CommDevice& d = p->dev;
    for (int s = 0; s < d.world; ++s) {
      if (s != d.rank && !fused_wait(d, rs_flag(*p, d.rank, s, h, n), epoch,
                                     kFusedOpGemmReduceScatter, kFusedStepPartial, s, 1)) {
        return;  // recorded; the warpgroup sums what is there (the launch has failed)
      }
    }
  }

  // The warpgroup's half-tile to owner o's receive slot (TMA, rows `row` relative to o's first
  // row: the box is clipped to o's rows); the issuing thread then completes the older pushes
  // and keeps this one pending.
  template <int BN, bool kF32, int kFrag>
  __device__ __forceinline__ void push(const float (&acc)[kFrag], uint8_t* stage, int cw, int o,
                                       int row, int col, int h, int n) const {
    const bool ok = threadIdx.x % 128 == 0 && observe_start(o);
    if (kF32 && p->accumulate) {
      store_tile_tma<BN, kF32, kFrag, true>(acc, stage, &p->tm_push[o], cw, row, col, ok);
    } else {
      store_tile_tma<BN, kF32>(acc, stage, &p->tm_push[o], cw, row, col, ok);
    }
    if (threadIdx.x % 128 != 0) return;
    if (!ok) {
      flush<0>();  // nothing was issued (the launch failed): the pending push is the newest
      return;
    }
    flush<kStoreRounds<BN, kF32>>();
    pend = rs_flag(*p, o, p->dev.rank, h, n);
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
    if constexpr (kWarpPush) {
      if (o_lo != r || o_hi != r) hand_off<BN>(acc, stage, cw, h0, col, tc.n);
    }
    // Other owners' rows: pushed (a half-tile that straddles owners is pushed to each; rows
    // past the owner's are clipped, rows before it land in the slot's padding).
    for (int o = o_lo; o <= o_hi && !kWarpPush; ++o) {
      if (o == r) continue;
      const int row = h0 - static_cast<int>(split_offset(p->M, W, o)) + kFusedRsSlotPadRows;
      if (p->bf16_partials) {
        push<BN, false>(acc, stage, cw, o, row, col, h, tc.n);
      } else {
        push<BN, true>(acc, stage, cw, o, row, col, h, tc.n);
      }
    }
    if (r < o_lo || r > o_hi) return;
    // This rank's rows: every push of the warpgroup complete and flagged first (no wait before
    // that: see the deadlock argument above), then the peers' partials, then one TMA store of
    // the bf16 sums (clipped to this rank's rows).
    const int64_t own_off = split_offset(p->M, W, r), own_end = own_off + split_count(p->M, W, r);
    RsFetch* const fetch = fetch_of<BN>(cw);
    if (t == 0) {
      long long t0 = rs_trace_clock();
      if constexpr (kWarpPush) {
        if (o_lo == o_hi) wait_freed(mail_of<BN>(cw));  // the staging buffer is rewritten below
      } else {
        flush<0>();
      }
      rs_trace_add(kRtOwnFreedWait, t0);
      t0 = rs_trace_clock();
      // A fetched partial: its flag was acquired before the fetch (main_loop_point); its
      // bytes have landed once the fetch's barrier phase completes (published to the
      // warpgroup, like the flags' acquires, by the named barrier below).
      const uint32_t f = fetch->state;
      if (f & 1) {
        mbar_wait(&fetch->bar, f >> 1);
      } else {
        wait_sources(h, tc.n);
      }
      rs_trace_add(kRtOwnWait, t0, kRtOwnWaits);
      rs_trace_max(kRtOwnWaitMax, static_cast<unsigned long long>(rs_trace_clock() - t0));
      rs_trace_count(kRtOwnTiles);
      if (f & 1) rs_trace_count(kRtOwnFetched);
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
        if constexpr (kJ0 < kFrag / 4) {
          add_sources<__nv_bfloat16, kJ0>(acc, row_lo, col0, lo_ok, hi_ok);
        }
      } else {
        add_sources<__nv_bfloat16>(acc, row_lo, col0, lo_ok, hi_ok);
      }
    } else {
      add_sources<float>(acc, row_lo, col0, lo_ok, hi_ok);
    }
    if (o_lo == o_hi) {
      store_tile_tma<BN, false, kFrag, false, kStagingRounds>(
          acc, stage, &p->tm_out, cw, static_cast<int>(h0 - own_off), col, true);
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

  // Every consumer thread, early in each tile's main loop (the engine's main_loop_point): the
  // previous tile's push is flagged there. Not later: the other warpgroup may be waiting in
  // its epilogue for a flag that depends on this one, and the main loop's later stages wait
  // for that warpgroup (they are refilled only once both have read them).
  // (kWarpPush: no flush; the pusher raises the flags.)
  // Then (p->prefetch), in an own half-tile whose peer's partial is already flagged (one poll, no
  // wait: no new wait in the protocol), the issuing thread TMA-loads that partial into the
  // staging buffer, so that the epilogue adds it from shared memory instead of waiting for
  // global loads while the tensor cores idle.
  template <int BN>
  __device__ __forceinline__ void main_loop_point(TileCoord tc, int cw) const {
    if (threadIdx.x % 128 != 0) return;
    if constexpr (!kWarpPush) flush<0>();
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
#ifndef FUSEDCOMM_PHANTOM_PEER
    for (int s = 0; s < W; ++s) {
      if (s != r && ld_acquire_sys(rs_flag(*p, r, s, h0 / 64, tc.n)) < epoch) return;
    }
#endif
    if constexpr (kWarpPush) {
      // The pusher's reads of this warpgroup's last handoff are done (one poll: the own tiles
      // come after the pushes, so they nearly always are), then its generic-proxy accesses to
      // the buffer before the TMA's writes.
      if (!mbar_test(&mail_of<BN>(cw)->freed, (posts & 1) ^ 1)) return;
      fence_proxy_async_shared();
    }
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

  // Every consumer thread, after its last tile: the pending push is flagged and every bulk
  // store is complete (shared memory outlives its reads; the outputs are written). kWarpPush:
  // the pusher is told to return, and has raised every flag once it frees that handoff.
  __device__ __forceinline__ void consumers_end() const {
    if (threadIdx.x % 128 != 0) return;
    if constexpr (kWarpPush) {
      const int cw = threadIdx.x / 128 - 1;
      RsPushMail* mail = p->tile_n == 256 ? mail_of<256>(cw) : mail_of<128>(cw);
      wait_freed(mail);
      post(mail, -1, 0, 0, 0, 0);
      wait_freed(mail);
    } else {
      flush<0>();
    }
    bulk_wait_all();
  }

  // ---- kWarpPush ----------------------------------------------------------------------------
  // The warpgroup's half-tile (rows [h0, h0 + 64), columns [col, col + BN)) to the pusher, in
  // handoffs of two store rounds (bf16: one; fp32: BN / 128).
  template <int BN, int kFrag>
  __device__ __forceinline__ void hand_off(const float (&acc)[kFrag], uint8_t* stage, int cw,
                                           int h0, int col, int n) const {
    RsPushMail* mail = mail_of<BN>(cw);
    if (p->bf16_partials) {
      hand_off_rounds<BN, false>(acc, stage, cw, mail, h0, col, n);
    } else {
      hand_off_rounds<BN, true>(acc, stage, cw, mail, h0, col, n);
    }
  }
  template <int BN, bool kF32, int kFrag>
  __device__ __forceinline__ void hand_off_rounds(const float (&acc)[kFrag], uint8_t* stage,
                                                  int cw, RsPushMail* mail, int h0, int col,
                                                  int n) const {
    constexpr int kRounds = kStoreRounds<BN, kF32>, kCols = kF32 ? 64 : 128;
    const int t = threadIdx.x % 128;
#pragma unroll
    for (int h = 0; h < kRounds; h += 2) {
      if (t == 0) {
        const long long t0 = rs_trace_clock();
        wait_freed(mail);      // the pusher's reads of the previous handoff
        bulk_wait_read_all();  // this warpgroup's own TMA store's reads
        rs_trace_add(kRtHandoffWait, t0, kRtHandoffWaits);
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
        long long t0 = rs_trace_clock();
        const bool ok = __shfl_sync(0xffffffffu, lane == 0 ? observe_start(o) : false, 0);
        // Lane 0's acquire, then every lane's stores into o's slot: a shuffle does not order
        // memory in the PTX model, bar.warp.sync does.
        __syncwarp();
        if (lane == 0) rs_trace_add(kRtStartWait, t0);
        if (!ok) continue;  // recorded: the launch has failed
        sent |= 1u << o;
        t0 = rs_trace_clock();
        if (p->bf16_partials) {
          send_rows<false>(stage, o, h0, h1, col, rounds);
        } else {
          send_rows<true>(stage, o, h0, h1, col, rounds);
        }
        if (lane == 0) rs_trace_add(kRtStores, t0);
      }
      __syncwarp();  // every lane issued its last store: its staging reads are done
      if (lane == 0) {
        mbar_arrive(&mail->freed);
        rs_trace_count(kRtHandoffs);
      }
      if (!last || sent == 0) continue;
      const long long t0 = rs_trace_clock();
      // This lane's stores before lane 0's flag (through the syncwarp). The owner may read them
      // with TMA (the early fetch): the proxy fence covers the writer's side of that too.
      fence_proxy_async_global();
      __threadfence_system();
      __syncwarp();
      if (lane == 0) {
        for (int o = o_lo; o <= o_hi; ++o) {
          if (sent & (1u << o)) st_release_sys(rs_flag(*p, o, r, h0 / 64, n), epoch);
        }
        rs_trace_add(kRtFenceFlags, t0);
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
                min(rounds * 16 * kElems, p->N - col) * kESize, p->N * kESize, rounds,
                kF32 && p->accumulate, p->push_pace_ns);
  }
};

// The spread sweep (bench switch FUSEDCOMM_RS_SPREAD; not the default): sweep position t ->
// tile, for rank r of W whose rows are M-blocks [r * per, (r + 1) * per), `nb` tile columns,
// raster groups of `group` M-blocks. The other ranks' blocks in turn (block j of owner r + 1,
// r + 2, ..., r + W - 1, then block j + 1; a grouped raster over that order); the first
// (W - 1) * group * nb positions push, then each own tile (the own blocks' grouped raster) is
// followed by W - 1 pushes while both last, then the rest. Why: the two-part sweep puts every
// push into its first (W - 1) / W, at W / (W - 1) times the average rate, and at W = 4 square
// 8192 the pushes are then NVLink-bound (bench/fused/NOTES.md, "Run 18", item 7). Safety: with
// that lead, every peer pushes a half-tile at an earlier position of its sweep than the
// owner's position of it (fused_geometry_test checks this), and rs_protocol_model.py
// --pusher --spread -1 finds no deadlock at W = 2-8; smaller leads deadlock at W >= 3.
__host__ __device__ __forceinline__ TileCoord rs_spread_coord(int t, int W, int r, int per,
                                                              int nb, int group) {
  const int q = W - 1, n_own = per * nb, n_rest = q * per * nb;
  const int lead = q * group * nb;
  const int head = lead < n_rest ? lead : n_rest;
  bool own = false;
  int i = t;  // index in its part
  if (t >= head) {
    const int u = t - head, rest = n_rest - head;
    const int full = rest / q < n_own ? rest / q : n_own;  // whole groups: an own tile, q pushes
    if (u < W * full) {
      own = u % W == 0;
      i = own ? u / W : head + q * (u / W) + u % W - 1;
    } else {
      const int v = u - W * full, left = rest - q * full;  // pushes after the whole groups
      if (full == n_own) {
        i = head + q * full + v;
      } else if (v == 0 || v > left) {  // own tile `full`, then the own tiles after the pushes
        own = true;
        i = full + (v == 0 ? 0 : v - left);
      } else {
        i = head + q * full + v - 1;
      }
    }
  }
  if (own) {
    TileCoord tc = grouped_raster(i, per, group, nb);
    tc.m += r * per;
    return tc;
  }
  TileCoord tc = grouped_raster(i, q * per, group, nb);
  tc.m = ((r + 1) * per + runs_in_turn(tc.m, q * per, q)) % (W * per);
  return tc;
}

// The GEMM's schedule: dynamic claims; sweep position -> tile as described above.
struct RsSchedule : FusedClaims<RsParams> {
  __device__ __forceinline__ TileCoord coord(const GemmProblem& prob, int t) const {
#ifdef FUSEDCOMM_RS_SPREAD  // compiled into the bench build only: the default kernel's code stays
    if (p->spread) {
      return rs_spread_coord(t, p->dev.world, p->dev.rank, p->own_nb, prob.n_blocks, prob.group_m);
    }
#endif
    return two_part_raster(prob, t, p->own_b0, p->own_nb, false);
  }
  __device__ __forceinline__ bool has_waits(const GemmProblem&) const { return false; }
  template <int BN>
  __device__ __forceinline__ bool wait(const GemmProblem&, TileCoord) const {
    return true;
  }
  __device__ __forceinline__ void consumers_done() const {
    // Every load of this CTA from its receive slots and every push is complete (consumers_end
    // and this barrier): the end barrier's arrival, then the end of the launch.
    named_barrier_sync(1, 256);
    if (threadIdx.x == 128) {
      fused_role_done(p->dev, epoch, gridDim.x);
      const long long t0 = rs_trace_clock();
      fused_finish(p->dev, epoch, kFusedOpGemmReduceScatter);
      rs_trace_max(kRtFinishMax, static_cast<unsigned long long>(rs_trace_clock() - t0));
#ifdef FUSEDCOMM_RS_TRACE
      rs_trace_max(kRtEndNs, globaltimer_ns());
#endif
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
#ifdef FUSEDCOMM_RS_TRACE
  if (blockIdx.x == 0 && threadIdx.x == 0) g_rs_trace[kRtStartNs] = globaltimer_ns();
#endif
  if (blockIdx.x == 0 && threadIdx.x == 0 && p.dev.world > 1) rs_start(p.dev, epoch);
  gemm_sm90_body<BN, kBKN>(tm_a, tm_b, tm_c, prob, RsEpilogue{&p, epoch}, RsSchedule{{&p, epoch}});
}

}  // namespace fusedcomm::kernels::detail
