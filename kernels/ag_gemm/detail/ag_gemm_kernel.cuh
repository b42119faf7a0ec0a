// The fused allGatherGemm kernel (ag_gemm.h): the GEMM consumes the gathered A chunk by chunk
// while the peers' rows arrive, in one persistent grid whose CTAs take roles by blockIdx.x. The
// GEMM role is the engine of gemm_sm90.cuh (gemm_sm90_body) with a dynamic tile schedule
// (AgSchedule); the communication roles are below. Host side: ag_gemm.cu (geometry, SM split,
// launch).
//
// Grid (one CTA per SM, all resident: cooperative launch), 384 threads per CTA:
//   [0, G)     GEMM from the start
//   [G, G+P)   pull A's chunks (peers' rows; the GEMM reads the own rows' whole M-blocks from
//              A_r, the copy engine copies the rest before the launch), then GEMM; with the
//              copy-engine exchange (AgParams::ce) P = 1, raising the chunk flags as the side
//              streams report their copies (ag_ce_role); across hosts (AgParams::hosts) P
//              lanes of the proxy's allGather, raising the chunk flags as the rows land
//              (ag_hosts_role)
// Every CTA reads the launch epoch first (comm_launch_epoch) and ends with fused_finish.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/ag_gemm/ag_gemm.h"
#include "kernels/common/fused_protocol.cuh"
#include "kernels/common/fused_schedule.cuh"
#include "kernels/gemm/detail/gemm_sm90.cuh"
#include "kernels/proxy/detail/proxy_lane.cuh"

namespace fusedcomm::kernels::detail {

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
  int mg;  // M-blocks per chunk
  int chunks;
  int slices;  // work items per chunk
  int slice_rows;
  int c_start;     // chunk of the GEMM's first M-block
  int gemm_ctas;   // CTAs [0, gemm_ctas) start on the GEMM
  int comm_ctas;   // CTAs [gemm_ctas, gemm_ctas + comm_ctas) pull first
  int interleave;  // 0: sequential; else W - 1, the runs whose chunks the sweep takes in turn
                   // (ag_sweep_chunk; only where mg == 1)
  int ce;          // 1: the copy engines move the peers' rows (ag_ce_role), 0: the SMs pull
  // The op's ranks: `dev`'s on one host; across hosts (hosts = 1) the whole world, one rank per
  // host, while `dev` is this rank's own symmetric memory (world 1: flags and epoch only) and
  // the kernel's ProxyCollective moves the rows (ag_hosts_role).
  int world, rank;
  int hosts;
};

// The chunk at position k (0 <= k < chunks) of the sweep: the order of the GEMM's M-blocks
// (AgSchedule::coord), of the pulls (ag_pull_role) and of the copy-engine build's positions
// (ag_ce_role, ag_gemm.cu ag_ce_steps), which all take it from here. Sequential: from c_start
// on, wrapping around (this rank's own chunks first, then peer r + 1's, r + 2's, ...).
// Interleaved (mg == 1, so a chunk is an M-block): the own blocks [own_b0, own_b1) first,
// then the other R blocks (from own_b1 on, or from c_start where there is no own block) cut
// into W - 1 runs of near-equal length (the peers' rows when W divides M in whole blocks),
// taken one block of each run in turn. Why: the copy-engine build pulls each peer on its own
// stream, all at once, so every peer's rows arrive at a third of the rate at W = 4; a GEMM
// that took peer r + 1's blocks first waited for them while the others' were landing.
// Position v (0 <= v < n) of n units cut into q consecutive runs of near-equal length (runs
// s < n % q one unit longer), taken one unit of each run in turn -> the unit's offset from the
// first (ag_sweep_chunk: the peers' blocks in turn).
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
  return ((nb > 0 ? p.own_b1 : p.c_start) + runs_in_turn(k - nb, p.chunks - nb, p.interleave)) % p.chunks;
}

// Chunk c holds only M-blocks read from A_r: it needs neither rows nor its flag (no tile waits
// for it: AgSchedule::wait). The pulls (ag_pull_role) and the copy-engine build (ag_ce_role,
// and ag_gemm.cu ag_ce_steps, whose positions must match that role's) skip the same chunks.
__host__ __device__ __forceinline__ bool ag_chunk_is_own(const AgParams& p, int c) {
  const int mb = (p.M + kTileM - 1) / kTileM;
  const int end = (c + 1) * p.mg < mb ? (c + 1) * p.mg : mb;
  return c * p.mg >= p.own_b0 && end <= p.own_b1;
}
// Rows [*r0, *r1) of chunk c that rank o holds (the copy-engine build: the side stream for
// peer o copies them, ag_ce_role waits for them; ag_gemm.cu ag_ce_steps and ag_ce_role use this
// one predicate, so that the stream's positions are the chunks the role counts). Empty when
// *r0 >= *r1.
__host__ __device__ __forceinline__ void ag_chunk_rows_of(const AgParams& p, int W, int c, int o, int64_t* r0,
                                                          int64_t* r1) {
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
  const int peer = split_owner(p.M, p.world, r0);
  return peer == p.rank ? split_owner(p.M, p.world, r1) : peer;
}

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
  // W = 4) had half or more of the first wave waiting on pulls.
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
  __device__ __forceinline__ bool wait(const GemmProblem&, TileCoord tc) const {
    // Blocks read from A_r (a_source) are ready before the launch (stream order): no flag.
    if (from_own(tc.m)) return true;
    const int c = tc.m / p->mg;
    const uint64_t* flag = &fused_flags(p->dev, p->dev.rank)->ag_chunk[c];
    // gpu scope: this GPU's pulling CTAs raise the flag (FusedFlags::ag_chunk). Up to G
    // producers poll it while the pull runs; .sys polls slowed the pull ~10x.
    if (ld_acquire_gpu(flag) >= epoch) return true;
    // Slow path, naming the rank whose rows the chunk waits for. Twice the timeout: a chunk is
    // late only because a pulling CTA waits for a peer, and that CTA's record (the peer and its
    // start-barrier step) is the one to keep.
    return fused_wait_flag(p->dev, flag, epoch, kFusedOpAllGatherGemm, kFusedStepChunk, ag_chunk_peer(*p, c),
                           2);
  }
  __device__ __forceinline__ void consumers_done() const {
    named_barrier_sync(1, 256);
    if (threadIdx.x == 128) fused_finish(p->dev, epoch, kFusedOpAllGatherGemm);
  }
};

// allGatherGemm's exchange by the copy engines (AgParams::ce; AgExchange::kCopyEngines). Why:
// beside the GEMM the pulls take SMs from it (a pulling SM moves ~16 GB/s there), and copy
// engines move the shards without SMs. On the caller's stream the launcher (ag_gemm.cu) enqueues
// ag_ce_barrier_kernel, records an event, then the fused kernel; one side stream per peer
// waits for that event and copies that peer's rows chunk by chunk in ag_ce_role's order
// (cudaMemcpyAsync from its data area), writing the peer's FusedFlags::ce_progress slot = the
// position of each chunk (among the chunks holding rows of that peer) once the copy holding
// its last rows of it is issued, then the end mark (the position count + 1); the caller's
// stream joins them after the kernel. One stream per peer because at W = 4 a copy engine's
// pulls from one peer at a time moved 105-144 GB/s into each GPU, one stream per peer 200-232
// (H200). One pulling CTA (ag_geometry gives one) turns the positions into the
// chunk flags the GEMM waits for.
// The side streams wait on nothing but the event: a stream wait on a value that the fused
// kernel writes could be scheduled ahead of that kernel in a graph replay and never end. The
// kernel's waits on ce_progress are bounded.

// The start barrier (what ag_pull_role's CTA 0 does with the SM pulls), as a kernel of one
// CTA before the fused kernel: this rank's signature and arrive flag to every peer, then every
// peer's arrive flag (ordering: CommFlags::arrive). The fused kernel that follows reads the same
// epoch (CommControl::epoch changes only at its end).
__global__ void ag_ce_barrier_kernel(const __grid_constant__ CommDevice d) {
  const uint64_t epoch = comm_launch_epoch(d);
  if (threadIdx.x != 0 || d.world < 2) return;
  const int W = d.world, r = d.rank;
  comm_publish_signature(d, epoch);  // before this thread's first release (CommFlags::launch)
  __threadfence_system();
  comm_signal_peers(
      d, [&](CommFlags* f) { return &f->arrive[r]; }, epoch);
  bool ok = true;
  for (int i = 1; i < W && ok; ++i) {
    const int o = (r + i) % W;
    ok = fused_wait(d, &comm_flags(d, r)->arrive[o], epoch, kFusedOpAllGatherGemm, kCommStepArrive, o, 1);
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
        ok = fused_wait(d, &ff->ce_progress[i], ++pos[i], kFusedOpAllGatherGemm, kFusedStepChunk, o, 2);
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

// The pulls (ag_pull_role): one thread of a pulling CTA moves each slice with bulk copies
// (cp.async.bulk: the peer's memory -> this CTA's shared memory -> this rank's gathered A),
// kStages pieces of kPiece bytes in flight (128 KiB per CTA). 16-byte register loads by every
// thread (48 KiB in flight per CTA) were latency-bound beside the GEMM and needed several times
// the pulling CTAs; with bulk copies 8-24 CTAs reach the link's speed (tuning.h, kAgSplit).
// The staging area is the CTA's dynamic shared memory, which its GEMM role only takes after
// the pull role ends (release() first invalidates the mbarriers). The waits below are on this
// CTA's own copies, not on a peer's progress: the bytes are in the peer's mapped memory (CUDA
// IPC, open until this process closes the communicator) once its arrive flag was seen, so they
// need no timeout.
struct FusedBulkCopier {
  static constexpr int kStages = 4;
  static constexpr uint32_t kPiece = 32u << 10;
  static constexpr size_t kSmemBytes = size_t(kStages) * kPiece + kStages * sizeof(uint64_t);
  uint8_t* buf;    // kStages pieces
  uint64_t* bar;   // one mbarrier per stage, after them
  uint32_t phase;  // bit s: the parity the next wait on stage s expects

  // All three below: the CTA's thread 0 only.
  __device__ __forceinline__ void init(uint8_t* smem) {
    buf = smem;
    bar = reinterpret_cast<uint64_t*>(smem + size_t(kStages) * kPiece);
    phase = 0;
    for (int s = 0; s < kStages; ++s) mbar_init(&bar[s], 1);
    mbar_init_fence();
  }
  // Copies `bytes` (a multiple of 16; both pointers 16-byte aligned) from src to dst and returns
  // once the stores are complete (the caller then publishes them).
  __device__ __forceinline__ void copy(void* dst, const void* src, int64_t bytes) {
    const int64_t n = (bytes + kPiece - 1) / kPiece;
    auto piece_bytes = [&](int64_t q) {
      return static_cast<uint32_t>(min(static_cast<int64_t>(kPiece), bytes - q * kPiece));
    };
    int64_t issued = 0;
    for (int64_t q = 0; q < n; ++q) {
      while (issued < n && issued - q < kStages) {
        const int st = static_cast<int>(issued % kStages);
        // The stage's last store has read it (all stores: the oldest pending one is that one).
        if (issued >= kStages) bulk_wait_read_all();
        const uint32_t b = piece_bytes(issued);
        mbar_arrive_expect_tx(&bar[st], b);
        asm volatile(
            "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                smem_u32(buf + size_t(st) * kPiece)),
            "l"(static_cast<const uint8_t*>(src) + issued * kPiece), "r"(b), "r"(smem_u32(&bar[st]))
            : "memory");
        ++issued;
      }
      const int st = static_cast<int>(q % kStages);
      mbar_wait(&bar[st], (phase >> st) & 1u);
      phase ^= 1u << st;
      asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(
                       static_cast<uint8_t*>(dst) + q * kPiece),
                   "r"(smem_u32(buf + size_t(st) * kPiece)), "r"(piece_bytes(q))
                   : "memory");
      bulk_commit();
    }
    bulk_wait_all();
  }
  // Before the CTA's shared memory changes hands (the GEMM role initialises its own barriers).
  __device__ __forceinline__ void release() {
    bulk_wait_all();
    for (int s = 0; s < kStages; ++s) {
      asm volatile("mbarrier.inval.shared::cta.b64 [%0];" ::"r"(smem_u32(&bar[s])) : "memory");
    }
  }
};

// The pulling role (CTA j of the P pulling CTAs; its thread 0 moves the bytes with
// FusedBulkCopier). Returns when the CTA's items are done (or a wait gave up); the CTA then
// joins the GEMM. Out of line: role code
// inlined before the engine perturbed ptxas's register allocation of the engine's consumers
// (see fused_wait); as a function of its own it is allocated on its own.
inline __device__ __noinline__ void ag_pull_role(const AgParams& p, uint64_t epoch, int j) {
  const CommDevice& d = p.dev;
  const int W = d.world, r = d.rank;
  FusedFlags* ff = fused_flags(d, r);
  if (p.ce) {              // CTA-uniform: the copy engines move the rows; ag_ce_barrier_kernel ran the
    ag_ce_role(p, epoch);  // start barrier
    return;
  }
  __shared__ int s_ok;
  // Start barrier, signal side (ordering: CommFlags::arrive): stream order puts this rank's
  // input before the kernel; the fence publishes it at system scope.
  if (j == 0 && threadIdx.x == 0 && W > 1) {
    comm_publish_signature(d, epoch);  // before this thread's first release (CommFlags::launch)
    __threadfence_system();
    comm_signal_peers(
        d, [&](CommFlags* f) { return &f->arrive[r]; }, epoch);
  }
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
    const int64_t a =
        static_cast<int64_t>(c) * chunk_rows + static_cast<int64_t>(k % p.slices) * p.slice_rows;
    const int64_t b =
        min(min(a + p.slice_rows, static_cast<int64_t>(c + 1) * chunk_rows), static_cast<int64_t>(p.M));
    if (a < b) {
      const int o0 = split_owner(p.M, W, a), o1 = split_owner(p.M, W, b - 1);
      for (int o = o0; o <= o1; ++o) {
        const int64_t off = split_offset(p.M, W, o), cnt = split_count(p.M, W, o);
        const int64_t ra = max(a, off), rb = min(b, off + cnt);
        // This rank's own rows were copied by the copy engine before the launch (ag_gemm.cu):
        // local copies here ran at a few GB/s once the GEMM was busy.
        if (ra >= rb || o == r) continue;
        if ((arrived & (1u << o)) == 0) {
          // Start barrier, wait side: o's input for this epoch is written and o has finished
          // its previous launch. Observe pattern: acquire by thread 0, then bar.sync.
          if (threadIdx.x == 0) {
            s_ok = fused_wait(d, &comm_flags(d, r)->arrive[o], epoch, kFusedOpAllGatherGemm, kCommStepArrive,
                              o, 1);
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
      }
    }
  }
  // Every load of a peer's memory by this CTA is complete (its values were stored).
  if (threadIdx.x == 0) bulk.release();
  __syncthreads();
  if (threadIdx.x == 0) fused_role_done(d, epoch, static_cast<uint32_t>(p.comm_ctas));
}

// ---- across hosts: one rank per host, the rows through the proxy (AgParams::hosts) ----------
// The P = proxy_active_lanes CTAs after the GEMM's are the lanes of the proxy's allGather
// (proxy_lane): host h's block is rank h's rows of the gathered A (elements [j * per, (j + 1) *
// per) of it form the op's chunk j, per = chunk_bytes / 2), this rank's own block is A_r where
// it lies; each lane copies its region of every chunk from the inbox into the gathered A. A
// flag chunk c may wait for several ranks' rows: it needs chunk ag_hosts_need(c) - 1 of the
// op from every lane (chunk j of every block lands at once, and each lane takes the chunks
// in order, so the last lane to finish chunk j has finished every earlier one). That lane
// raises the flags of the chunks whose need is j + 1 (ordering as the pulls': each lane's
// stores, fence.proxy.async by every thread, bar.sync, then thread 0's fence.acq_rel.gpu and
// arrival on chunk_count[j]; the last arrival acquires and releases the flags). Chunks made
// only of this rank's rows need nothing: lane 0 raises them first.
__host__ __device__ __forceinline__ int64_t ag_hosts_need(const AgParams& p, int c, int64_t per) {
  const int64_t chunk_rows = static_cast<int64_t>(p.mg) * kTileM;
  const int64_t r0 = static_cast<int64_t>(c) * chunk_rows;
  const int64_t r1 = r0 + chunk_rows < p.M ? r0 + chunk_rows : p.M;
  int64_t need = 0;
  if (r0 >= r1) return 0;
  for (int o = split_owner(p.M, p.world, r0); o <= split_owner(p.M, p.world, r1 - 1); ++o) {
    if (o == p.rank) continue;
    const int64_t off = split_offset(p.M, p.world, o), end = off + split_count(p.M, p.world, o);
    const int64_t rows = (r1 < end ? r1 : end) - off;  // o's rows up to the chunk's end
    const int64_t n = (rows * p.K + per - 1) / per;
    need = n > need ? n : need;
  }
  return need;
}

struct AgHostsHooks {
  const AgParams& p;
  FusedFlags* ff;
  uint64_t epoch;
  int64_t per;
  uint32_t lanes;
  static constexpr bool kAsyncReaders = true;  // the GEMM reads the gathered rows with TMA
  __device__ bool send_ready(int64_t) const { return true; }
  __device__ bool receive_ready(int64_t) const { return true; }
  __device__ void received(int64_t j) const {
    fence_acq_rel_gpu();
    if (!fused_last_of(&ff->chunk_count[j], lanes)) return;
    for (int c = 0; c < p.chunks; ++c) {
      if (ag_hosts_need(p, c, per) == j + 1) st_release_gpu(&ff->ag_chunk[c], epoch);
    }
  }
};

inline __device__ __noinline__ void ag_hosts_role(const AgParams& p, const ProxyCollective& px, uint64_t epoch,
                                                  int lane) {
  FusedFlags* ff = fused_flags(p.dev, p.dev.rank);
  const int64_t per = static_cast<int64_t>(px.chunk_bytes / 2);
  if (lane == 0 && threadIdx.x == 0) {
    for (int c = 0; c < p.chunks; ++c) {
      if (ag_hosts_need(p, c, per) == 0) st_release_gpu(&ff->ag_chunk[c], epoch);
    }
  }
  AgHostsHooks hooks{p, ff, epoch, per, static_cast<uint32_t>(p.comm_ctas)};
  proxy_lane<__nv_bfloat16>(px, static_cast<uint32_t>(lane), hooks);
  // A failed lane leaves its chunks' flags down: the GEMM's waits for them time out, naming
  // the rank whose rows are missing, and the link's status word names the failure.
  __syncthreads();
  if (threadIdx.x == 0) fused_role_done(p.dev, epoch, static_cast<uint32_t>(p.comm_ctas));
}

template <int BN, bool kBKN>
__global__ void __launch_bounds__(kGemmThreads, 1)
    ag_gemm_kernel(const __grid_constant__ CUtensorMap tm_a, const __grid_constant__ CUtensorMap tm_b,
                   const __grid_constant__ CUtensorMap tm_c, const __grid_constant__ GemmProblem prob,
                   const __grid_constant__ DefaultEpilogue epi, const __grid_constant__ AgParams p,
                   const __grid_constant__ ProxyCollective px) {
  const uint64_t epoch = comm_launch_epoch(p.dev);
  if (static_cast<int>(blockIdx.x) >= p.gemm_ctas) {
    if (p.hosts) {
      ag_hosts_role(p, px, epoch, static_cast<int>(blockIdx.x) - p.gemm_ctas);
    } else {
      ag_pull_role(p, epoch, static_cast<int>(blockIdx.x) - p.gemm_ctas);
    }
  }
  gemm_sm90_body<BN, kBKN>(tm_a, tm_b, tm_c, prob, epi, AgSchedule{{&p, epoch}});
}

}  // namespace fusedcomm::kernels::detail
