// launch_moe_dispatch and launch_moe_combine (moe.h): routing on the GPU, the rows over NVLink,
// the grouped GEMM, and the combine's weighted sum. The steps and their protocol: moe.h.
#include <cuda_bf16.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>

#include "kernels/collectives/collectives.h"
#include "kernels/common/comm_protocol.cuh"
#include "kernels/common/fused_choice.h"
#include "kernels/common/fused_launch.cuh"
#include "kernels/common/fused_protocol.cuh"
#include "kernels/common/split.h"
#include "kernels/gemm/detail/gemm_sm90.cuh"
#include "kernels/moe/detail/moe_grouped.cuh"
#include "kernels/moe/detail/moe_layout.h"
#include "kernels/moe/moe.h"

namespace fusedcomm::kernels {
namespace detail {
namespace {

constexpr int kCountsThreads = 1024;
constexpr int kRowThreads = 256;
constexpr int kSlotHeaderBytes = 16;  // int32 tokens, int32 bad id, int64 bad pair (-1: none)
// The fused dispatch's SM split (moe.h "Fused"): CTAs that store rows before they join the
// GEMM, and the bytes of rows per work item (one release-add per expert run of an item).
constexpr int kFusedDispatchCtas = 32;
constexpr int64_t kFusedItemBytes = 1 << 20;
constexpr int kFusedMaxItemRows = 384;
// moe_dispatch_role's row table (source, destination, expert per row) and up to kFusedMaxStages
// barriers, before its stages.
constexpr int kFusedMaxStages = 16;
constexpr uint32_t kFusedRoleTableBytes = kFusedMaxItemRows * 20 + kFusedMaxStages * 8;

// The dispatch's workspace (private device memory), in this order, each 256-byte aligned.
struct DispatchWs {
  size_t bad_pair, chunk_counts, pair_pos, send_base, send_start, send_list, gemm, total;
};
size_t align256(size_t v) { return (v + 255) / 256 * 256; }
DispatchWs dispatch_ws(int64_t tokens, int topk, int num_experts, int local_experts, int64_t capacity) {
  const int64_t pairs = tokens * topk;
  DispatchWs w{};
  size_t at = 0;
  w.bad_pair = at;
  at += 256;
  w.chunk_counts = at;
  at += align256(static_cast<size_t>(moe_chunks(pairs)) * num_experts * 4);
  w.pair_pos = at;
  at += align256(static_cast<size_t>(pairs) * 4);
  w.send_base = at;
  at += align256(static_cast<size_t>(num_experts) * 8);
  w.send_start = at;
  at += align256(static_cast<size_t>(num_experts) * 4);
  w.send_list = at;
  at += align256(static_cast<size_t>(pairs) * 4);
  w.gemm = at;
  at += align256(grouped_gemm_workspace_bytes(capacity, local_experts));
  w.total = at;
  return w;
}

__device__ __forceinline__ uint32_t lanemask_lt() {
  uint32_t m;
  asm("mov.u32 %0, %%lanemask_lt;" : "=r"(m));
  return m;
}

// 1. One warp per chunk of pairs: the chunk's per-expert counts, and each pair's rank among the
// chunk's pairs of its expert (pairs in order, 32 at a time: __match_any_sync groups the lanes
// of one expert, the lanes below in the group come first, then the group's leader advances the
// expert's count). Bad ids are counted nowhere; the lowest such pair is kept (atomicMin).
__global__ void __launch_bounds__(32)
    moe_count_kernel(const int32_t* ids, int64_t pairs, int64_t chunk_pairs, int num_experts,
                     int32_t* chunk_counts, int32_t* pair_pos, unsigned long long* bad_pair) {
  __shared__ int32_t hist[kMoeMaxExperts];
  const int lane = static_cast<int>(threadIdx.x);
  for (int e = lane; e < num_experts; e += 32) hist[e] = 0;
  __syncwarp();
  const int64_t begin = blockIdx.x * chunk_pairs;
  const int64_t end = min(pairs, begin + chunk_pairs);
  for (int64_t base = begin; base < end; base += 32) {
    const int64_t j = base + lane;
    int id = -1;
    if (j < end) {
      id = ids[j];
      if (id < 0 || id >= num_experts) {
        atomicMin(bad_pair, static_cast<unsigned long long>(j));
        id = -1;
      }
    }
    const uint32_t group = __match_any_sync(0xFFFFFFFFu, id);
    const int before = hist[id < 0 ? 0 : id];
    __syncwarp();
    if (id >= 0) {
      if (lane == __ffs(group) - 1) hist[id] = before + __popc(group);
      pair_pos[j] = before + __popc(group & lanemask_lt());
    }
    __syncwarp();
  }
  for (int e = lane; e < num_experts; e += 32)
    chunk_counts[blockIdx.x * static_cast<int64_t>(num_experts) + e] = hist[e];
}

struct CountsParams {
  CommDevice dev;
  int32_t* chunk_counts;  // in: per chunk counts; out: per chunk exclusive prefix
  int64_t chunks;
  int num_experts;
  int64_t tokens;
  const int32_t* ids;
  const unsigned long long* bad_pair;
  int64_t* send_base;   // E: the first row at e's owner of this rank's pairs for e
  int32_t* send_start;  // E, or null: the fused dispatch's send list (moe_for_send_order)
  MoeDeviceLayout layout;
  int64_t capacity;
};

// 2. The count exchange (one CTA of kCountsThreads; a launch of the epoch sequence).
__global__ void __launch_bounds__(kCountsThreads) moe_counts_kernel(const __grid_constant__ CountsParams p) {
  __shared__ int32_t s_m[kCommMaxRanks * kMoeMaxExperts];
  __shared__ int64_t s_tot[kMoeMaxExperts];
  __shared__ int64_t s_bad[kCommMaxRanks];  // bad pair per rank (-1: none)
  __shared__ int32_t s_bad_id[kCommMaxRanks];
  __shared__ int32_t s_tokens[kCommMaxRanks];
  __shared__ MoeStatus s_status;
  const CommDevice& d = p.dev;
  const int W = d.world, r = d.rank, E = p.num_experts;
  const int tid = static_cast<int>(threadIdx.x);
  const uint64_t epoch = comm_launch_epoch(d);
  const uint64_t parity = epoch & 1;

  for (int e = tid; e < E; e += blockDim.x) {
    int32_t run = 0;
    for (int64_t c = 0; c < p.chunks; ++c) {
      int32_t* cc = p.chunk_counts + c * E + e;
      const int32_t v = *cc;
      *cc = run;
      run += v;
    }
    s_m[r * E + e] = run;
  }
  if (tid == 0) {
    const unsigned long long b = *p.bad_pair;
    s_bad[r] = b == ~0ull ? -1 : static_cast<int64_t>(b);
    s_bad_id[r] = b == ~0ull ? 0 : p.ids[b];
    s_tokens[r] = static_cast<int32_t>(p.tokens);
  }
  __syncthreads();
  for (int i = 1; i < W; ++i) {
    const int q = (r + i) % W;
    auto* slot = reinterpret_cast<int32_t*>(comm_slot(d, q, parity, r));
    for (int e = tid; e < E; e += blockDim.x) slot[kSlotHeaderBytes / 4 + e] = s_m[r * E + e];
    if (tid == 0) {
      slot[0] = s_tokens[r];
      slot[1] = s_bad_id[r];
      reinterpret_cast<int64_t*>(slot)[1] = s_bad[r];
    }
  }
  if (tid == 0) comm_publish_signature(d, epoch);
  comm_publish_fence();
  if (tid == 0) {
    comm_signal_peers(
        d, [&](CommFlags* f) { return &f->ready[r][0]; }, epoch);
  }
  const bool ok = comm_wait_peers(d, &comm_flags(d, r)->ready[0][0], kCommMaxOneShotCtas, epoch,
                                  static_cast<CommOp>(kMoeOpCounts), kMoeStepCounts, true);
  if (ok) {
    for (int i = 1; i < W; ++i) {
      const int q = (r + i) % W;
      const auto* slot = reinterpret_cast<const int32_t*>(comm_slot(d, r, parity, q));
      for (int e = tid; e < E; e += blockDim.x) s_m[q * E + e] = __ldcg(slot + kSlotHeaderBytes / 4 + e);
      if (tid == 0) {
        s_tokens[q] = __ldcg(slot);
        s_bad_id[q] = __ldcg(slot + 1);
        s_bad[q] = __ldcg(reinterpret_cast<const long long*>(slot) + 1);
      }
    }
  }
  __syncthreads();
  for (int e = tid; e < E; e += blockDim.x) s_tot[e] = moe_expert_total(s_m, W, E, e);
  __syncthreads();
  if (tid == 0) {
    MoeStatus st{};
    if (!ok) {
      st.code = kMoeProtocol;
      st.rank = r;
    } else {
      for (int s = 0; s < W && st.code == kMoeOk; ++s) {
        if (s_bad[s] >= 0) st = MoeStatus{kMoeBadExpert, s, s_bad[s], s_bad_id[s], 0};
      }
      for (int q = 0; q < W && st.code == kMoeOk; ++q) {
        const int64_t rows = moe_owner_rows(s_tot, W, E, q);
        if (rows > p.capacity) st = MoeStatus{kMoeOverflow, q, rows, p.capacity, 0};
      }
    }
    s_status = st;
    *p.layout.status = st;
  }
  __syncthreads();
  const bool good = s_status.code == kMoeOk;
  for (int i = tid; i < W * E; i += blockDim.x) p.layout.counts[i] = good ? s_m[i] : 0;
  if (tid < W) p.layout.tokens[tid] = ok ? s_tokens[tid] : 0;
  for (int e = tid; e < E; e += blockDim.x) p.send_base[e] = moe_send_base(s_m, s_tot, W, E, r, e);
  const int first = static_cast<int>(split_offset(E, W, r)), local = static_cast<int>(split_count(E, W, r));
  for (int i = tid; i <= local; i += blockDim.x) {
    const int64_t off = i < local ? moe_owner_offset(s_tot, W, E, first + i) : moe_owner_rows(s_tot, W, E, r);
    p.layout.expert_offsets[i] = good ? off : 0;
  }
  if (tid == 0 && p.send_start != nullptr) {
    // The fused dispatch's send list: this rank's pairs by expert in moe_for_send_order's order, each
    // expert's pairs in pair order; send_start[e] = the first position of e's.
    int32_t at = 0;
    moe_for_send_order(E, W, r, [&](int e) {
      p.send_start[e] = at;
      at += good ? s_m[r * E + e] : 0;
    });
  }
  if (tid == 0) *reinterpret_cast<volatile uint64_t*>(&comm_control(d)->epoch) = epoch;
}

// The identity of a routed row, beside the rows in the owner's data area.
struct alignas(16) RowMeta {
  int32_t rank, token, slot;
  float weight;
};

struct RowsParams {
  CommDevice dev;
  const uint4* x;    // tokens × hidden bf16, as 16-byte vectors
  int64_t row_vecs;  // hidden / 8
  int64_t pairs;
  int topk;
  int num_experts;
  const int32_t* ids;
  const float* weights;
  const int32_t* chunk_prefix;
  const int32_t* pair_pos;
  const int64_t* send_base;
  int64_t chunk_pairs;
  uint64_t meta_offset;  // from the data area's start
  const MoeStatus* status;
};

// The end of a launch of the epoch sequence whose CTAs stored into peers' memory: the last CTA
// tells every peer (done[r]), waits for every peer's done of this epoch, compares signatures
// and publishes the epoch. publish_signature: this launch has not released a flag before.
__device__ __forceinline__ void moe_finish(const CommDevice& d, uint64_t epoch, uint32_t op,
                                           bool publish_signature) {
  comm_publish_fence();
  if (threadIdx.x != 0) return;
  if (!comm_last_cta(&comm_control(d)->exit_count)) return;
  if (publish_signature) {
    comm_publish_signature(d, epoch);
    __threadfence_system();
  }
  comm_signal_peers(
      d, [&](CommFlags* f) { return &f->done[d.rank]; }, epoch);
  bool ok = true;
  for (int i = 1; i < d.world && ok; ++i) {
    const int q = (d.rank + i) % d.world;
    ok = comm_wait_flag(d, &comm_flags(d, d.rank)->done[q], epoch, op, kCommStepDone, q);
  }
  if (ok) comm_check_signatures(d, epoch, op, kCommStepDone);
  *reinterpret_cast<volatile uint64_t*>(&comm_control(d)->epoch) = epoch;
}

// The waits of a launch whose CTAs all wait for the same event. One thread of the launch (the
// leader) waits for it, or for the event that precedes it, with comm_wait_flag's checks: the
// host-mapped abort word, a peer in another launch, a peer that gave up. Every other CTA
// follows with moe_follow_flag, which reads only the flag and this GPU's memory: every 16
// polls the error claim (which the leader sets when it gives up, on an abort too) and the
// clock. So an abort still stops every wait: a follower's flag is raised by the leader or by
// CTAs with finite work ahead of them. Why not every CTA with comm_wait_flag's checks: each of
// its slow checks (every kCommSlowCheckNs of waiting) reads the abort word over PCIe, and the
// GPU serves such reads one at a time, ~1 us each (H200: one read by each of 132 CTAs took
// ~130 us). Once a wait passed kCommSlowCheckNs, the grid's reads queued for hundreds of
// microseconds and its waits ended that late; the rank that ended late made its peer's next
// waits as long, so the stall repeated launch after launch (~0.4 ms each at W = 2). A follower
// gives up on the error claim, or after timeout_scale x the timeout (above the leader's), so
// that the leader's record, naming the peer and the step, is the one the host reads.
__device__ __forceinline__ bool moe_follow_flag(const CommDevice& d, const uint64_t* flag, uint64_t epoch,
                                                bool local, uint32_t op, uint32_t step, int peer,
                                                uint32_t timeout_scale = 2) {
  auto load = [&] { return local ? ld_acquire_gpu(flag) : ld_acquire_sys(flag); };
  uint64_t v = load();
  if (v >= epoch) return true;
  const uint64_t timeout = timeout_scale * (d.timeout_ns ? d.timeout_ns : kDefaultWaitTimeoutNs);
  const uint64_t t0 = globaltimer_ns();
  uint32_t sleep_ns = 16;
  for (uint32_t polls = 1;; ++polls) {
    v = load();
    if (v >= epoch) return true;
    if ((polls & 15) == 0) {
      if (comm_failed(d)) return false;
      const uint64_t elapsed = globaltimer_ns() - t0;
      if (elapsed > timeout) {
        comm_record_failure(d, kGemmWaitTimeout, epoch, v, elapsed, op, step, peer);
        return false;
      }
    }
    __nanosleep(sleep_ns);
    const uint32_t cap =
        polls < tuning::kCommPollLatePolls ? tuning::kCommPollSleepNs : tuning::kCommPollSleepLateNs;
    sleep_ns = sleep_ns * 2 < cap ? sleep_ns * 2 : cap;
  }
}

// All threads of a CTA: comm_wait_peers over the peers' flags of one field (stride 1, each the
// peer's first release of the launch, after its signature), led by CTA 0: its thread 0 waits
// with comm_wait_flag, every other CTA's follows (moe_follow_flag). Every CTA then compares the
// signatures (a CTA must not store into a peer that runs another launch). False to every thread
// if a wait gave up or a signature differs.
__device__ __forceinline__ bool moe_wait_peers_led(const CommDevice& d, const uint64_t* flags, uint64_t epoch,
                                                   uint32_t op, uint32_t step) {
  __shared__ int s_ok;
  if (threadIdx.x == 0) {
    int ok = 1;
    for (int i = 1; i < d.world && ok; ++i) {
      const int p = (d.rank + i) % d.world;
      ok = blockIdx.x == 0 ? comm_wait_flag(d, flags + p, epoch, op, step, p)
                           : moe_follow_flag(d, flags + p, epoch, false, op, step, p);
    }
    if (ok) ok = comm_check_signatures(d, epoch, op, step);
    s_ok = ok;
  }
  __syncthreads();
  return s_ok != 0;
}

// 3. The rows: one warp per pair, to the owner's data area at the pair's row.
__global__ void __launch_bounds__(kRowThreads) moe_rows_kernel(const __grid_constant__ RowsParams p) {
  const CommDevice& d = p.dev;
  const uint64_t epoch = comm_launch_epoch(d);
  if (reinterpret_cast<const volatile MoeStatus*>(p.status)->code == kMoeOk) {
    const int lane = threadIdx.x % 32;
    const int64_t warps = static_cast<int64_t>(gridDim.x) * (kRowThreads / 32);
    const int E = p.num_experts;
    const uint64_t row_bytes = static_cast<uint64_t>(p.row_vecs) * 16;
    for (int64_t j = blockIdx.x * (kRowThreads / 32) + threadIdx.x / 32; j < p.pairs; j += warps) {
      const int e = p.ids[j];
      const int64_t t = j / p.topk;
      const int q = split_owner(E, d.world, e);
      const int64_t row = p.send_base[e] + p.chunk_prefix[(j / p.chunk_pairs) * E + e] + p.pair_pos[j];
      uint8_t* area = d.base[q] + d.data_offset;
      auto* dst = reinterpret_cast<uint4*>(area + row * row_bytes);
      const uint4* src = p.x + t * p.row_vecs;
      for (int64_t v = lane; v < p.row_vecs; v += 32) dst[v] = __ldg(src + v);
      if (lane == 0) {
        RowMeta m{d.rank, static_cast<int32_t>(t), static_cast<int32_t>(j - t * p.topk), p.weights[j]};
        *reinterpret_cast<RowMeta*>(area + p.meta_offset + row * sizeof(RowMeta)) = m;
      }
    }
  }
  moe_finish(d, epoch, kMoeOpRows, true);
}

// 4. The received rows' identities into the layout, the rows into routed_x (if any).
__global__ void __launch_bounds__(kRowThreads)
    moe_unpack_kernel(const uint8_t* area, uint64_t meta_offset, int64_t row_vecs, const int64_t* rows_at,
                      MoeDeviceLayout layout, uint4* routed_x) {
  const int64_t rows = *rows_at;
  const int lane = threadIdx.x % 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (kRowThreads / 32);
  for (int64_t i = blockIdx.x * (kRowThreads / 32) + threadIdx.x / 32; i < rows; i += warps) {
    if (lane == 0) {
      const RowMeta m = *reinterpret_cast<const RowMeta*>(area + meta_offset + i * sizeof(RowMeta));
      layout.src_rank[i] = m.rank;
      layout.src_token[i] = m.token;
      layout.src_slot[i] = m.slot;
      layout.weight[i] = m.weight;
    }
    if (routed_x != nullptr) {
      const auto* src = reinterpret_cast<const uint4*>(area + i * row_vecs * 16);
      for (int64_t v = lane; v < row_vecs; v += 32) routed_x[i * row_vecs + v] = __ldcg(src + v);
    }
  }
}

// ---- the fused dispatch (MoeDispatchArgs::algo = kFused; moe.h "Fused") ----------------------

// The send list: position send_start[e] + (the pair's rank among this rank's pairs of e) holds
// pair j (the same rank the decomposed rows kernel adds to send_base).
__global__ void __launch_bounds__(kRowThreads)
    moe_send_list_kernel(const int32_t* ids, int64_t pairs, int64_t chunk_pairs, int num_experts,
                         const int32_t* chunk_prefix, const int32_t* pair_pos, const int32_t* send_start,
                         int32_t* list, const MoeStatus* status) {
  if (reinterpret_cast<const volatile MoeStatus*>(status)->code != kMoeOk) return;
  for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < pairs;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int e = ids[j];
    list[send_start[e] + chunk_prefix[(j / chunk_pairs) * num_experts + e] + pair_pos[j]] =
        static_cast<int32_t>(j);
  }
}

struct FusedParams : RowsParams {
  const int32_t* list;  // the send list (moe_send_list_kernel)
  int item_rows;        // send list positions per work item (<= kFusedMaxItemRows)
  int bulk_stages;      // moe_dispatch_role's shared-memory stages (0: register copies)
  uint32_t stage_bytes;
  int gemm_ctas;      // CTAs [0, gemm_ctas) start on the GEMM
  int dispatch_ctas;  // CTAs [gemm_ctas, gemm_ctas + dispatch_ctas) store rows first
  int local_experts;
  int first_expert;
  const int32_t* counts;  // W × E (the layout's)
};

__device__ __forceinline__ uint64_t* moe_rows_arrived(const CommDevice& d, int rank) {
  return reinterpret_cast<uint64_t*>(d.base[rank] + kMoeFlagsOffset);
}

__device__ __forceinline__ void red_release_sys_add(uint64_t* p, uint64_t v) {
  asm volatile("red.release.sys.global.add.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

// Waits until at most `keep` of the most recently committed bulk groups have not finished
// reading shared memory (keep >= 0; above 7 waits as for 7: the immediate must be a constant).
__device__ __forceinline__ void bulk_wait_read_upto(int keep) {
  switch (keep < 7 ? keep : 7) {
    case 0: bulk_wait_read_keep<0>(); break;
    case 1: bulk_wait_read_keep<1>(); break;
    case 2: bulk_wait_read_keep<2>(); break;
    case 3: bulk_wait_read_keep<3>(); break;
    case 4: bulk_wait_read_keep<4>(); break;
    case 5: bulk_wait_read_keep<5>(); break;
    case 6: bulk_wait_read_keep<6>(); break;
    default: bulk_wait_read_keep<7>(); break;
  }
}

// One warp copies one row, 8 × 16 bytes per lane in flight (a lane's loads, then its stores).
__device__ __forceinline__ void copy_row_warp(uint4* dst, const uint4* src, int64_t vecs, int lane) {
  constexpr int kUnroll = 8;
  for (int64_t v0 = lane; v0 < vecs; v0 += 32 * kUnroll) {
    uint4 t[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (v0 + u * 32 < vecs) t[u] = __ldg(src + v0 + u * 32);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (v0 + u * 32 < vecs) dst[v0 + u * 32] = t[u];
  }
}

// The dispatch role (CTA j of the dispatch CTAs; all threads). Work item i = send list positions
// [i · item_rows, (i + 1) · item_rows), taken by the CTAs in turn (so in the list's order). Per
// item: every thread works out some rows' places (the owner's data area at the row step 3 gives
// them) and stores their identities; the rows move either by bulk copies (bulk_stages > 0, the
// fused kernel: thread 0 streams each row through one of bulk_stages shared-memory stages,
// global -> shared -> the owner, up to bulk_stages - 1 loads in flight; a stage is reused once
// its own last store has read it, not every store; the register copies of
// one CTA moved ~16 GB/s, so the GEMM waited on a dispatch of 16 CTAs for most of its time), or
// by one warp per row (the rows-only kernel, whose CTAs have no dynamic shared memory). Then,
// per run of one expert in the item, one release-add of the run's length to that expert's
// arrival counter at its owner (publish pattern of comm_protocol.cuh: the bulk stores complete,
// bar.sync, thread 0 fence.proxy.async + fence.sc.sys, then the releases). No wait on a peer: a
// peer's data area and counters are free once its count exchange (the launch before, on every
// rank) has raised its ready flag, which every rank saw before this kernel started. When done,
// the CTA tells the peers (fused_role_done: the last dispatch CTA raises done[r] at every peer)
// and returns (it then joins the GEMM). Out of line: ag_gemm_kernel.cuh's rule for role code
// before the engine.
inline __device__ __noinline__ void moe_dispatch_role(const FusedParams& p, uint64_t epoch, int j) {
  const CommDevice& d = p.dev;
  const int W = d.world, E = p.num_experts;
  if (j == 0 && threadIdx.x == 0) comm_publish_signature(d, epoch);  // before any release
  const bool ok = reinterpret_cast<const volatile MoeStatus*>(p.status)->code == kMoeOk;
  // Dynamic shared memory (the GEMM's, before it starts): the item's row table, the stages'
  // barriers, the stages.
  extern __shared__ __align__(128) uint8_t role_smem[];
  auto* t_src = reinterpret_cast<const uint8_t**>(role_smem);
  auto* t_dst = reinterpret_cast<uint8_t**>(role_smem + kFusedMaxItemRows * 8);
  auto* t_run = reinterpret_cast<int32_t*>(role_smem + kFusedMaxItemRows * 16);  // expert of the row
  auto* bar = reinterpret_cast<uint64_t*>(role_smem + kFusedMaxItemRows * 20);
  uint8_t* stage_buf = role_smem + kFusedRoleTableBytes;
  const int S = p.bulk_stages;
  if (S > 0 && threadIdx.x == 0) {
    for (int s = 0; s < S; ++s) mbar_init(&bar[s], 1);
    mbar_init_fence();
  }
  __syncthreads();
  if (ok) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    const uint64_t row_bytes = static_cast<uint64_t>(p.row_vecs) * 16;
    const int64_t items = (p.pairs + p.item_rows - 1) / p.item_rows;
    uint64_t loads = 0;  // thread 0: bulk loads issued by this CTA so far (stage, parity)
    for (int64_t it = j; it < items; it += p.dispatch_ctas) {
      const int64_t a = it * p.item_rows, b = min(a + p.item_rows, p.pairs);
      for (int64_t i = a + threadIdx.x; i < b; i += blockDim.x) {
        const int64_t pj = p.list[i];
        const int e = p.ids[pj];
        const int64_t t = pj / p.topk;
        const int q = split_owner(E, W, e);
        const int64_t row = p.send_base[e] + p.chunk_prefix[(pj / p.chunk_pairs) * E + e] + p.pair_pos[pj];
        uint8_t* area = d.base[q] + d.data_offset;
        t_src[i - a] = reinterpret_cast<const uint8_t*>(p.x + t * p.row_vecs);
        t_dst[i - a] = area + row * row_bytes;
        t_run[i - a] = e;
        RowMeta m{d.rank, static_cast<int32_t>(t), static_cast<int32_t>(pj - t * p.topk), p.weights[pj]};
        *reinterpret_cast<RowMeta*>(area + p.meta_offset + row * sizeof(RowMeta)) = m;
      }
      __syncthreads();
      const int n = static_cast<int>(b - a);
      if (S == 0) {
        for (int i = warp; i < n; i += warps) {
          copy_row_warp(reinterpret_cast<uint4*>(t_dst[i]), reinterpret_cast<const uint4*>(t_src[i]),
                        p.row_vecs, lane);
        }
        __syncthreads();
      } else if (threadIdx.x == 0) {
        const uint32_t rb = static_cast<uint32_t>(row_bytes);
        int issued = 0;
        for (int q = 0; q < n; ++q) {
          while (issued < n && issued - q < S - 1) {
            const uint64_t k = loads + issued;
            const int st = static_cast<int>(k % S);
            // The stage's last store (store k - S) has read it. This CTA has committed loads + q
            // stores, one bulk group each, so the most recent q - issued + S - 1 (>= 1) may
            // still be reading: they stay in flight.
            if (k >= static_cast<uint64_t>(S)) bulk_wait_read_upto(q - issued + S - 1);
            mbar_arrive_expect_tx(&bar[st], rb);
            asm volatile(
                "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
                    "r"(smem_u32(stage_buf + static_cast<size_t>(st) * p.stage_bytes)),
                "l"(t_src[issued]), "r"(rb), "r"(smem_u32(&bar[st]))
                : "memory");
            ++issued;
          }
          const uint64_t k = loads + q;
          const int st = static_cast<int>(k % S);
          mbar_wait(&bar[st], static_cast<uint32_t>((k / S) & 1));
          asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(t_dst[q]),
                       "r"(smem_u32(stage_buf + static_cast<size_t>(st) * p.stage_bytes)), "r"(rb)
                       : "memory");
          bulk_commit();
        }
        loads += n;
        bulk_wait_all();  // the item's rows are stored
        fence_proxy_async_global();
      }
      if (threadIdx.x == 0) {
        __threadfence_system();
        for (int i = 0; i < n;) {
          const int e = t_run[i];
          int r = 1;
          while (i + r < n && t_run[i + r] == e) ++r;
          const int q = split_owner(E, W, e);
          red_release_sys_add(moe_rows_arrived(d, q) + (e - split_offset(E, W, q)), static_cast<uint64_t>(r));
          i += r;
        }
      }
      __syncthreads();  // the table is rewritten by the next item
    }
  }
  // The GEMM initialises its own barriers in this shared memory next.
  if (S > 0 && threadIdx.x == 0) {
    for (int s = 0; s < S; ++s)
      asm volatile("mbarrier.inval.shared::cta.b64 [%0];" ::"r"(smem_u32(&bar[s])) : "memory");
  }
  __syncthreads();
  if (threadIdx.x == 0) fused_role_done(d, epoch, static_cast<uint32_t>(p.dispatch_ctas));
}

// The end of the fused launch (one thread of each CTA, after the CTA's last access): the last
// CTA waits until every peer has stored all its rows here (done), compares the signatures,
// resets this rank's arrival counters and publishes the epoch (fused_finish's sequence).
inline __device__ __noinline__ void moe_fused_finish(const CommDevice& d, uint64_t epoch, int local_experts) {
  __threadfence();
  if (!comm_last_cta(&comm_control(d)->exit_count)) return;
  fused_await_done(d, epoch, kMoeOpFused);
  uint64_t* arrived = moe_rows_arrived(d, d.rank);
  for (int i = 0; i < local_experts; ++i) reinterpret_cast<volatile uint64_t*>(arrived)[i] = 0;
  *reinterpret_cast<volatile uint64_t*>(&comm_control(d)->epoch) = epoch;
}

// The GEMM producer's slow wait for an expert's rows (out of line, from the producer's region
// only). Names a source of the expert's rows other than this rank, if any.
inline __device__ __noinline__ bool moe_wait_rows(const FusedParams& p, const uint64_t* counter,
                                                  uint64_t need, int group) {
  const CommDevice& d = p.dev;
  int peer = d.rank;
  for (int s = 0; s < d.world; ++s) {
    if (s != d.rank && p.counts[static_cast<int64_t>(s) * p.num_experts + p.first_expert + group] > 0) {
      peer = s;
      break;
    }
  }
  // Twice the timeout: a source that never stores is caught by the end barrier's or the count
  // exchange's wait first, whose record names it and its step.
  return comm_wait_flag_inline(d, counter, need, kMoeOpFused, kMoeStepRows, peer, 2, d.world == 1,
                               tuning::kFusedProducerPollSleepCapNs);
}

// The GEMM role's schedule: the grouped GEMM's table and claims, and before each tile every
// row of its expert (the counter reaches the expert's row count; one expert's rows come from
// every source, so a tile waits for all of them).
struct MoeFusedSchedule : GroupedSchedule {
  const FusedParams* p;
  uint64_t epoch;
  __device__ __forceinline__ bool has_waits(const GemmProblem&) const { return true; }
  template <int BN>
  __device__ __forceinline__ bool wait(const GemmProblem&, TileCoord tc) const {
    const int4 b = table[tc.m];  // the group's end, the group, its first row
    const uint64_t need = static_cast<uint64_t>(b.y - b.w);
    const uint64_t* counter = moe_rows_arrived(p->dev, p->dev.rank) + b.z;
    if ((p->dev.world == 1 ? ld_acquire_gpu(counter) : ld_acquire_sys(counter)) >= need) return true;
    return moe_wait_rows(*p, counter, need, b.z);
  }
  __device__ __forceinline__ void consumers_done() const {
    named_barrier_sync(1, 256);
    if (threadIdx.x == 128) moe_fused_finish(p->dev, epoch, p->local_experts);
  }
};

// Grid (cooperative, one CTA per SM at most, 384 threads): CTAs [0, G) run the grouped GEMM
// from the start, CTAs [G, G + P) store rows first (moe_dispatch_role), then join the GEMM.
template <int BN, bool kBKN>
__global__ void __launch_bounds__(kGemmThreads, 1)
    moe_fused_kernel(const __grid_constant__ CUtensorMap tm_a, const __grid_constant__ CUtensorMap tm_b,
                     const __grid_constant__ CUtensorMap tm_c, const __grid_constant__ GemmProblem prob,
                     const __grid_constant__ GroupedEpilogue epi, const __grid_constant__ GroupedSchedule gs,
                     const __grid_constant__ FusedParams p) {
  const uint64_t epoch = comm_launch_epoch(p.dev);
  if (static_cast<int>(blockIdx.x) >= p.gemm_ctas)
    moe_dispatch_role(p, epoch, static_cast<int>(blockIdx.x) - p.gemm_ctas);
  MoeFusedSchedule sched;
  static_cast<GroupedSchedule&>(sched) = gs;
  sched.p = &p;
  sched.epoch = epoch;
  gemm_sm90_body<BN, kBKN>(tm_a, tm_b, tm_c, prob, epi, sched);
}

// A rank with no GEMM (no local expert, or no output asked for) in a fused launch: the dispatch
// role on every CTA, then the same end (its peers run moe_fused_kernel, whose protocol this is).
__global__ void __launch_bounds__(kGemmThreads) moe_fused_rows_kernel(const __grid_constant__ FusedParams p) {
  const uint64_t epoch = comm_launch_epoch(p.dev);
  moe_dispatch_role(p, epoch, static_cast<int>(blockIdx.x));
  if (threadIdx.x == 0) moe_fused_finish(p.dev, epoch, p.local_experts);
}

struct CombineParams {
  CommDevice dev;
  const uint4* expert_out;
  int64_t row_vecs;  // width / 8
  const int64_t* rows_at;
  const int32_t* src_rank;
  const int32_t* src_token;
  const int32_t* src_slot;
  const int32_t* tokens;  // W
  int topk;
  MoeStatus* status;
};

// Combine 1. The rows home: start barrier, one warp per row, end barrier.
__global__ void __launch_bounds__(kRowThreads) moe_combine_kernel(const __grid_constant__ CombineParams p) {
  const CommDevice& d = p.dev;
  const uint64_t epoch = comm_launch_epoch(d);
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    comm_publish_signature(d, epoch);
    __threadfence_system();
    comm_signal_peers(
        d, [&](CommFlags* f) { return &f->arrive[d.rank]; }, epoch);
  }
  const bool ok = moe_wait_peers_led(d, comm_flags(d, d.rank)->arrive, epoch, kMoeOpCombine, kCommStepArrive);
  // Every home rank's slots must fit its data area; every rank sees every T_s, so all agree.
  const uint64_t row_bytes = static_cast<uint64_t>(p.row_vecs) * 16;
  int worst = 0;
  uint64_t most = 0;
  for (int s = 0; s < d.world; ++s) {
    const uint64_t b = static_cast<uint64_t>(p.tokens[s]) * p.topk * row_bytes;
    if (b > most) {
      most = b;
      worst = s;
    }
  }
  const bool fits = most <= d.data_bytes;
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    *p.status = fits ? MoeStatus{}
                     : MoeStatus{kMoeCombineArea, worst, static_cast<int64_t>(most),
                                 static_cast<int64_t>(d.data_bytes), 0};
  }
  if (ok && fits) {
    const int64_t rows = *p.rows_at;
    const int lane = threadIdx.x % 32;
    const int64_t warps = static_cast<int64_t>(gridDim.x) * (kRowThreads / 32);
    for (int64_t i = blockIdx.x * (kRowThreads / 32) + threadIdx.x / 32; i < rows; i += warps) {
      const int s = p.src_rank[i];
      const int64_t slot = static_cast<int64_t>(p.src_token[i]) * p.topk + p.src_slot[i];
      auto* dst = reinterpret_cast<uint4*>(d.base[s] + d.data_offset + slot * row_bytes);
      const uint4* src = p.expert_out + i * p.row_vecs;
      for (int64_t v = lane; v < p.row_vecs; v += 32) dst[v] = __ldg(src + v);
    }
  }
  moe_finish(d, epoch, kMoeOpCombine, false);
}

// out[t] columns [8v, 8v + 8) = Σ_slot w[t, slot] · row(t, slot), fp32 products and sums rounded
// as written (no contraction into FMAs), slot order, rounded once to bf16: the combine's
// arithmetic, shared by its kernel and the fused moeGemmCombine (bit for bit the same).
__device__ __forceinline__ uint4 moe_weighted_vec(const uint8_t* area, int64_t t, int64_t v, int topk,
                                                  int64_t row_vecs, const float* weights) {
  float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  for (int k = 0; k < topk; ++k) {
    const float w = weights[t * topk + k];
    const uint4 raw = __ldcg(reinterpret_cast<const uint4*>(area) + (t * topk + k) * row_vecs + v);
    const auto* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const float2 f = __bfloat1622float2(h[q]);
      acc[2 * q] = __fadd_rn(acc[2 * q], __fmul_rn(w, f.x));
      acc[2 * q + 1] = __fadd_rn(acc[2 * q + 1], __fmul_rn(w, f.y));
    }
  }
  uint4 o;
  auto* ho = reinterpret_cast<__nv_bfloat162*>(&o);
#pragma unroll
  for (int q = 0; q < 4; ++q) ho[q] = __floats2bfloat162_rn(acc[2 * q], acc[2 * q + 1]);
  return o;
}

// Combine 2. out[t] = Σ_slot w[t, slot] · row(t, slot), 8 columns per thread (moe_weighted_vec).
__global__ void __launch_bounds__(kRowThreads)
    moe_weighted_sum_kernel(const uint8_t* area, int64_t tokens, int topk, int64_t row_vecs,
                            const float* weights, uint4* out, const MoeStatus* status) {
  if (reinterpret_cast<const volatile MoeStatus*>(status)->code != kMoeOk) return;
  const int64_t n = tokens * row_vecs;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / row_vecs;
    out[i] = moe_weighted_vec(area, t, i - t * row_vecs, topk, row_vecs, weights);
  }
}

// ---- the low-latency mode (MoeMode::kLowLatency; moe.h "Low latency") -----------------------

constexpr int kLlThreads = kGemmThreads;  // launch_cooperative's block
constexpr int kLlWarps = kLlThreads / 32;
static_assert(kLlWarps == kMoeLlCountWarps, "moe_layout.h's low-latency chunking is this kernel's");

__device__ __forceinline__ uint64_t* moe_ll_flags(const CommDevice& d) {
  return reinterpret_cast<uint64_t*>(d.base[d.rank] + kMoeLlFlagsOffset);
}

// Thread 0 (after the CTA's stores and a __syncthreads): the CTA's stores before the local flag.
__device__ __forceinline__ void moe_ll_release(uint64_t* flag, uint64_t epoch) {
  __threadfence();
  st_release_gpu(flag, epoch);
}

// Out of line (inlined twice, the wait made the dispatch kernel spill).
inline __device__ __noinline__ bool moe_ll_follow(const CommDevice& d, const uint64_t* flag, uint64_t epoch,
                                                  uint32_t op, uint32_t step) {
  return moe_follow_flag(d, flag, epoch, true, op, step, d.rank);
}

// All threads: thread 0 follows a local flag (moe_follow_flag: the CTA behind the flag waits for
// the peers with comm_wait_flag's checks, and where a peer never comes, its record, naming that
// peer and step, is the one the host reads); false (to every thread) if it gave up.
__device__ __forceinline__ bool moe_ll_wait(const CommDevice& d, const uint64_t* flag, uint64_t epoch,
                                            uint32_t op, uint32_t step) {
  __shared__ int s_ok;
  if (threadIdx.x == 0) s_ok = moe_ll_follow(d, flag, epoch, op, step) ? 1 : 0;
  __syncthreads();
  return s_ok != 0;
}

// Its shared memory (dynamic): the per-warp chunk counts, then the W × E count matrix, then (at
// the next 16-byte boundary) the per-expert totals and this rank's send bases (int64 each).
__host__ __device__ __forceinline__ size_t moe_ll_int64_offset(int W, int E) {
  return (static_cast<size_t>(kLlWarps + W) * E * 4 + 15) / 16 * 16;
}
size_t moe_ll_smem(int W, int E) { return moe_ll_int64_offset(W, E) + static_cast<size_t>(E) * 16; }

struct LlParams {
  CommDevice dev;
  const uint4* x;
  int64_t row_vecs;
  int64_t tokens;
  int topk;
  int num_experts;
  const int32_t* ids;
  const float* weights;
  int32_t* pair_row;  // pairs: first each pair's rank in its warp's chunk, then its row at the owner
  uint64_t meta_offset;
  MoeDeviceLayout layout;
  int64_t capacity;
  uint4* routed_x;  // or null
};

// The dispatch's routing, count exchange, rows and unpack in one launch (moe.h "Low latency").
__global__ void __launch_bounds__(kLlThreads) moe_ll_dispatch_kernel(const __grid_constant__ LlParams p) {
  extern __shared__ __align__(16) uint8_t ll_smem[];
  __shared__ MoeStatus s_status;
  __shared__ int64_t s_bad[kCommMaxRanks];
  __shared__ int32_t s_bad_id[kCommMaxRanks];
  __shared__ int32_t s_tokens[kCommMaxRanks];
  __shared__ unsigned long long s_bad_pair;
  const CommDevice& d = p.dev;
  const int W = d.world, r = d.rank, E = p.num_experts;
  const int tid = static_cast<int>(threadIdx.x), lane = tid % 32, warp = tid / 32;
  const uint64_t epoch = comm_launch_epoch(d);
  uint64_t* ll = moe_ll_flags(d);
  const int64_t pairs = p.tokens * p.topk;
  const int local = static_cast<int>(split_count(E, W, r));

  if (blockIdx.x == 0) {
    auto* hist = reinterpret_cast<int32_t*>(ll_smem);  // [kLlWarps][E]
    auto* s_m = hist + kLlWarps * E;                   // [W][E]
    auto* s_tot = reinterpret_cast<int64_t*>(ll_smem + moe_ll_int64_offset(W, E));
    int64_t* s_base = s_tot + E;
    for (int i = tid; i < kLlWarps * E; i += blockDim.x) hist[i] = 0;
    if (tid == 0) s_bad_pair = ~0ull;
    __syncthreads();
    // Counts: warp w takes pairs [w·C, (w+1)·C), 32 at a time in pair order (moe_count_kernel's
    // stable ranks within the chunk).
    const int64_t chunk = moe_ll_chunk_pairs(pairs);
    int32_t* h = hist + warp * E;
    const int64_t begin = warp * chunk, end = min(pairs, begin + chunk);
    for (int64_t base = begin; base < end; base += 32) {
      const int64_t j = base + lane;
      int id = -1;
      if (j < end) {
        id = p.ids[j];
        if (id < 0 || id >= E) {
          atomicMin(&s_bad_pair, static_cast<unsigned long long>(j));
          id = -1;
        }
      }
      const uint32_t group = __match_any_sync(0xFFFFFFFFu, id);
      const int before = h[id < 0 ? 0 : id];
      __syncwarp();
      if (id >= 0) {
        if (lane == __ffs(group) - 1) h[id] = before + __popc(group);
        p.pair_row[j] = before + __popc(group & lanemask_lt());
      }
      __syncwarp();
    }
    __syncthreads();
    // Per expert: the warps' exclusive prefix (in place) and this rank's total.
    for (int e = tid; e < E; e += blockDim.x) {
      int32_t run = 0;
      for (int w = 0; w < kLlWarps; ++w) {
        const int32_t v = hist[w * E + e];
        hist[w * E + e] = run;
        run += v;
      }
      s_m[r * E + e] = run;
    }
    if (tid == 0) {
      const unsigned long long b = s_bad_pair;
      s_bad[r] = b == ~0ull ? -1 : static_cast<int64_t>(b);
      s_bad_id[r] = b == ~0ull ? 0 : p.ids[b];
      s_tokens[r] = static_cast<int32_t>(p.tokens);
    }
    __syncthreads();
    // The count exchange, as moe_counts_kernel's.
    const uint64_t parity = epoch & 1;
    for (int i = 1; i < W; ++i) {
      const int q = (r + i) % W;
      auto* slot = reinterpret_cast<int32_t*>(comm_slot(d, q, parity, r));
      for (int e = tid; e < E; e += blockDim.x) slot[kSlotHeaderBytes / 4 + e] = s_m[r * E + e];
      if (tid == 0) {
        slot[0] = s_tokens[r];
        slot[1] = s_bad_id[r];
        reinterpret_cast<int64_t*>(slot)[1] = s_bad[r];
      }
    }
    if (tid == 0) comm_publish_signature(d, epoch);
    comm_publish_fence();
    if (tid == 0) {
      comm_signal_peers(
          d, [&](CommFlags* f) { return &f->ready[r][0]; }, epoch);
    }
    const bool ok = comm_wait_peers(d, &comm_flags(d, r)->ready[0][0], kCommMaxOneShotCtas, epoch,
                                    static_cast<CommOp>(kMoeOpLowLatency), kMoeStepCounts, true);
    if (ok) {
      for (int i = 1; i < W; ++i) {
        const int q = (r + i) % W;
        const auto* slot = reinterpret_cast<const int32_t*>(comm_slot(d, r, parity, q));
        for (int e = tid; e < E; e += blockDim.x) s_m[q * E + e] = __ldcg(slot + kSlotHeaderBytes / 4 + e);
        if (tid == 0) {
          s_tokens[q] = __ldcg(slot);
          s_bad_id[q] = __ldcg(slot + 1);
          s_bad[q] = __ldcg(reinterpret_cast<const long long*>(slot) + 1);
        }
      }
    }
    __syncthreads();
    for (int e = tid; e < E; e += blockDim.x) s_tot[e] = moe_expert_total(s_m, W, E, e);
    __syncthreads();
    if (tid == 0) {
      MoeStatus st{};
      if (!ok) {
        st.code = kMoeProtocol;
        st.rank = r;
      } else {
        for (int s = 0; s < W && st.code == kMoeOk; ++s) {
          if (s_bad[s] >= 0) st = MoeStatus{kMoeBadExpert, s, s_bad[s], s_bad_id[s], 0};
        }
        for (int q = 0; q < W && st.code == kMoeOk; ++q) {
          const int64_t rows = moe_owner_rows(s_tot, W, E, q);
          if (rows > p.capacity) st = MoeStatus{kMoeOverflow, q, rows, p.capacity, 0};
        }
      }
      s_status = st;
      *p.layout.status = st;
    }
    __syncthreads();
    const bool good = s_status.code == kMoeOk;
    for (int i = tid; i < W * E; i += blockDim.x) p.layout.counts[i] = good ? s_m[i] : 0;
    if (tid < W) p.layout.tokens[tid] = ok ? s_tokens[tid] : 0;
    for (int e = tid; e < E; e += blockDim.x) s_base[e] = moe_send_base(s_m, s_tot, W, E, r, e);
    const int first = static_cast<int>(split_offset(E, W, r));
    for (int i = tid; i <= local; i += blockDim.x) {
      const int64_t off =
          i < local ? moe_owner_offset(s_tot, W, E, first + i) : moe_owner_rows(s_tot, W, E, r);
      p.layout.expert_offsets[i] = good ? off : 0;
    }
    __syncthreads();
    if (good) {
      for (int64_t j = tid; j < pairs; j += blockDim.x) {
        const int e = p.ids[j];
        p.pair_row[j] = static_cast<int32_t>(s_base[e] + hist[(j / chunk) * E + e] + p.pair_row[j]);
      }
    }
    __syncthreads();
    if (tid == 0) moe_ll_release(&ll[0], epoch);
  }
  // The rows, once CTA 0's layout is out (every CTA; CTA 0's own wait returns at once).
  bool go = moe_ll_wait(d, &ll[0], epoch, kMoeOpLowLatency, kMoeStepLlLayout);
  go = go && reinterpret_cast<const volatile MoeStatus*>(p.layout.status)->code == kMoeOk;
  const uint64_t row_bytes = static_cast<uint64_t>(p.row_vecs) * 16;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kLlWarps;
  if (go) {
    for (int64_t j = blockIdx.x * kLlWarps + warp; j < pairs; j += warps) {
      const int e = __ldcg(p.ids + j);
      const int64_t t = j / p.topk;
      const int q = split_owner(E, W, e);
      const int64_t row = __ldcg(p.pair_row + j);
      uint8_t* area = d.base[q] + d.data_offset;
      auto* dst = reinterpret_cast<uint4*>(area + row * row_bytes);
      const uint4* src = p.x + t * p.row_vecs;
      for (int64_t v = lane; v < p.row_vecs; v += 32) dst[v] = __ldg(src + v);
      if (lane == 0) {
        RowMeta m{r, static_cast<int32_t>(t), static_cast<int32_t>(j - t * p.topk), p.weights[j]};
        *reinterpret_cast<RowMeta*>(area + p.meta_offset + row * sizeof(RowMeta)) = m;
      }
    }
  }
  // The end barrier (the last CTA: done to and from every peer, signatures, the epoch), then
  // ll[1] for the unpack.
  comm_publish_fence();
  if (tid == 0 && comm_last_cta(&comm_control(d)->exit_count)) {
    comm_signal_peers(
        d, [&](CommFlags* f) { return &f->done[r]; }, epoch);
    bool ok = true;
    for (int i = 1; i < W && ok; ++i) {
      const int q = (r + i) % W;
      ok = comm_wait_flag(d, &comm_flags(d, r)->done[q], epoch, kMoeOpLowLatency, kCommStepDone, q);
    }
    if (ok) comm_check_signatures(d, epoch, kMoeOpLowLatency, kCommStepDone);
    st_release_gpu(&ll[1], epoch);
    *reinterpret_cast<volatile uint64_t*>(&comm_control(d)->epoch) = epoch;
  }
  if (!moe_ll_wait(d, &ll[1], epoch, kMoeOpLowLatency, kMoeStepLlArrived) || comm_failed(d)) return;
  if (reinterpret_cast<const volatile MoeStatus*>(p.layout.status)->code != kMoeOk) return;
  const int64_t rows = __ldcg(p.layout.expert_offsets + local);
  const uint8_t* area = d.base[r] + d.data_offset;
  for (int64_t i = blockIdx.x * kLlWarps + warp; i < rows; i += warps) {
    if (lane == 0) {
      const uint4 m = __ldcg(reinterpret_cast<const uint4*>(area + p.meta_offset + i * sizeof(RowMeta)));
      p.layout.src_rank[i] = static_cast<int32_t>(m.x);
      p.layout.src_token[i] = static_cast<int32_t>(m.y);
      p.layout.src_slot[i] = static_cast<int32_t>(m.z);
      p.layout.weight[i] = __uint_as_float(m.w);
    }
    if (p.routed_x != nullptr) {
      const auto* src = reinterpret_cast<const uint4*>(area + i * row_bytes);
      for (int64_t v = lane; v < p.row_vecs; v += 32) p.routed_x[i * p.row_vecs + v] = __ldcg(src + v);
    }
  }
}

struct LlCombineParams {
  CombineParams rows;
  const float* weights;  // tokens × topk
  int64_t tokens;
  uint4* out;
};

// The combine in one launch: moe_combine_kernel's start barrier, rows and end barrier, then
// the weighted sums (moe_weighted_vec) once the last CTA has seen every peer's done.
__global__ void __launch_bounds__(kLlThreads)
    moe_ll_combine_kernel(const __grid_constant__ LlCombineParams lp) {
  const CombineParams& p = lp.rows;
  const CommDevice& d = p.dev;
  const uint64_t epoch = comm_launch_epoch(d);
  uint64_t* ll = moe_ll_flags(d);
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    comm_publish_signature(d, epoch);
    __threadfence_system();
    comm_signal_peers(
        d, [&](CommFlags* f) { return &f->arrive[d.rank]; }, epoch);
  }
  const bool ok =
      moe_wait_peers_led(d, comm_flags(d, d.rank)->arrive, epoch, kMoeOpLlCombine, kCommStepArrive);
  const uint64_t row_bytes = static_cast<uint64_t>(p.row_vecs) * 16;
  int worst = 0;
  uint64_t most = 0;
  for (int s = 0; s < d.world; ++s) {
    const uint64_t b = static_cast<uint64_t>(p.tokens[s]) * p.topk * row_bytes;
    if (b > most) {
      most = b;
      worst = s;
    }
  }
  const bool fits = most <= d.data_bytes;
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    *p.status = fits ? MoeStatus{}
                     : MoeStatus{kMoeCombineArea, worst, static_cast<int64_t>(most),
                                 static_cast<int64_t>(d.data_bytes), 0};
  }
  const int lane = threadIdx.x % 32;
  if (ok && fits) {
    const int64_t rows = *p.rows_at;
    const int64_t warps = static_cast<int64_t>(gridDim.x) * kLlWarps;
    for (int64_t i = blockIdx.x * kLlWarps + threadIdx.x / 32; i < rows; i += warps) {
      const int s = p.src_rank[i];
      const int64_t slot = static_cast<int64_t>(p.src_token[i]) * p.topk + p.src_slot[i];
      auto* dst = reinterpret_cast<uint4*>(d.base[s] + d.data_offset + slot * row_bytes);
      const uint4* src = p.expert_out + i * p.row_vecs;
      for (int64_t v = lane; v < p.row_vecs; v += 32) dst[v] = __ldg(src + v);
    }
  }
  comm_publish_fence();
  if (threadIdx.x == 0 && comm_last_cta(&comm_control(d)->exit_count)) {
    comm_signal_peers(
        d, [&](CommFlags* f) { return &f->done[d.rank]; }, epoch);
    bool done = true;
    for (int i = 1; i < d.world && done; ++i) {
      const int q = (d.rank + i) % d.world;
      done = comm_wait_flag(d, &comm_flags(d, d.rank)->done[q], epoch, kMoeOpLlCombine, kCommStepDone, q);
    }
    if (done) comm_check_signatures(d, epoch, kMoeOpLlCombine, kCommStepDone);
    st_release_gpu(&ll[1], epoch);
    *reinterpret_cast<volatile uint64_t*>(&comm_control(d)->epoch) = epoch;
  }
  if (!moe_ll_wait(d, &ll[1], epoch, kMoeOpLlCombine, kMoeStepLlArrived) || comm_failed(d) || !ok || !fits) {
    return;
  }
  const uint8_t* area = d.base[d.rank] + d.data_offset;
  const int64_t n = lp.tokens * p.row_vecs;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / p.row_vecs;
    lp.out[i] = moe_weighted_vec(area, t, i - t * p.row_vecs, p.topk, p.row_vecs, lp.weights);
  }
}

// ---- the fused moeGemmCombine (MoeGemmCombineArgs::algo = kFused; moe.h) -------------------

struct GcParams {
  CommDevice dev;
  const int32_t* tokens;  // W: every rank's T (the dispatch's layout)
  int topk;
  int width;
  int64_t my_tokens;     // this rank's T (the caller's)
  const float* weights;  // this rank's tokens × topk
  uint4* out;            // tokens × width bf16
  MoeStatus* status;
};

__device__ __forceinline__ uint64_t* moe_combine_arrived(const CommDevice& d, int rank) {
  return reinterpret_cast<uint64_t*>(d.base[rank] + kMoeCombineFlagOffset);
}

// This CTA's verdict after the start (one per CTA, as comm_epoch_slot): non-zero = every peer
// arrived, the launches match and every home rank's slots fit its data area: store and sum.
__device__ __forceinline__ int& moe_gc_go() {
  __shared__ int s_go;
  return s_go;
}

// The start (all threads of every CTA, before the engine; out of line, role code before the
// engine as ag_gemm_kernel.cuh's rule says): CTA 0 publishes the signature and raises arrive at
// every peer (this rank's data area is free: the stream's earlier work has completed); every
// CTA's thread 0 waits until every peer has arrived (so no store of this CTA reaches a peer
// still using its data area), compares the signatures (a CTA must not store into a peer that
// runs another op) and checks that every home rank's slots fit its data area (every rank sees
// every T_s, so all agree; CTA 0 writes the status).
inline __device__ __noinline__ void moe_gc_start(const GcParams& p, uint64_t epoch) {
  const CommDevice& d = p.dev;
  if (threadIdx.x == 0) {
    if (blockIdx.x == 0) {
      comm_publish_signature(d, epoch);
      __threadfence_system();
      comm_signal_peers(
          d, [&](CommFlags* f) { return &f->arrive[d.rank]; }, epoch);
    }
    CommFlags* mine = comm_flags(d, d.rank);
    bool ok = true;
    for (int i = 1; i < d.world && ok; ++i) {
      const int q = (d.rank + i) % d.world;
      ok = blockIdx.x == 0
               ? fused_wait(d, &mine->arrive[q], epoch, kMoeOpGemmCombine, kCommStepArrive, q, 1)
               : moe_follow_flag(d, &mine->arrive[q], epoch, false, kMoeOpGemmCombine, kCommStepArrive, q);
    }
    if (ok && d.world > 1) ok = comm_check_signatures(d, epoch, kMoeOpGemmCombine, kCommStepArrive);
    const uint64_t row_bytes = static_cast<uint64_t>(p.width) * 2;
    int worst = 0;
    uint64_t most = 0;
    for (int s = 0; s < d.world; ++s) {
      const uint64_t b = static_cast<uint64_t>(p.tokens[s]) * p.topk * row_bytes;
      if (b > most) {
        most = b;
        worst = s;
      }
    }
    const bool fits = most <= d.data_bytes;
    if (blockIdx.x == 0) {
      *p.status = fits ? MoeStatus{}
                       : MoeStatus{kMoeCombineArea, worst, static_cast<int64_t>(most),
                                   static_cast<int64_t>(d.data_bytes), 0};
    }
    moe_gc_go() = ok && fits;
  }
  __syncthreads();
}

// The end (one thread per CTA, after the CTA's last access; fused_finish's sequence): the last
// CTA raises done at every peer, waits for every peer's done (each peer's rows for this rank
// are counted and its sums are read from its own area only), compares the signatures, resets
// this rank's counter (every add of this launch preceded the count this rank's CTAs waited
// for; a peer's next adds follow this rank's next arrive) and publishes the epoch.
inline __device__ __noinline__ void moe_gc_finish(const CommDevice& d, uint64_t epoch) {
  __threadfence();
  if (!comm_last_cta(&comm_control(d)->exit_count)) return;
  comm_signal_peers(
      d, [&](CommFlags* f) { return &f->done[d.rank]; }, epoch);
  fused_await_done(d, epoch, kMoeOpGemmCombine);
  *reinterpret_cast<volatile uint64_t*>(moe_combine_arrived(d, d.rank)) = 0;
  *reinterpret_cast<volatile uint64_t*>(&comm_control(d)->epoch) = epoch;
}

// The weighted sums (threads tid < n of the CTA; `named`: the engine's two consumer warpgroups,
// named barrier 1, else the whole CTA): thread 0 waits (bounded) until every row element of
// this rank's slots has arrived, then the CTA computes its share of out with the combine's
// arithmetic, then the end. Out of line: from the engine's consumer region only.
inline __device__ __noinline__ void moe_gc_sum(const GcParams& p, uint64_t epoch, int tid, int n,
                                               bool named) {
  __shared__ int s_ok;
  const CommDevice& d = p.dev;
  auto sync = [&] {
    if (named) {
      named_barrier_sync(1, 256);
    } else {
      __syncthreads();
    }
  };
  if (tid == 0) {
    int ok = moe_gc_go();
    if (ok) {
      const uint64_t need = static_cast<uint64_t>(p.tokens[d.rank]) * p.topk * p.width;
      // CTA 0 leads (moe_follow_flag), with twice the timeout: a peer that never stores is
      // named by the start's or the end's wait; the followers give up after three times.
      const int peer = d.world > 1 ? (d.rank + 1) % d.world : d.rank;
      ok = blockIdx.x == 0 ? fused_wait(d, moe_combine_arrived(d, d.rank), need, kMoeOpGemmCombine,
                                        kMoeStepCombineRows, peer, 2, d.world == 1)
                           : moe_follow_flag(d, moe_combine_arrived(d, d.rank), need, d.world == 1,
                                             kMoeOpGemmCombine, kMoeStepCombineRows, peer, 3);
    }
    s_ok = ok;
  }
  sync();
  if (s_ok) {
    const uint8_t* area = d.base[d.rank] + d.data_offset;
    const int64_t row_vecs = p.width / 8, total = p.my_tokens * row_vecs;
    for (int64_t i = blockIdx.x * static_cast<int64_t>(n) + tid; i < total;
         i += static_cast<int64_t>(gridDim.x) * n) {
      const int64_t t = i / row_vecs;
      p.out[i] = moe_weighted_vec(area, t, i - t * row_vecs, p.topk, row_vecs, p.weights);
    }
  }
  sync();
  if (tid == 0) moe_gc_finish(d, epoch);
}

// The epilogue (gemm_sm90.cuh's kOwnsTile concept): a consumer warpgroup's 64 rows of a tile
// go to their home ranks' slots. Each 128-column round is staged in the warpgroup's buffer
// (stage_round, as the engine's row store), then warp w stores rows w, w + 4, ...: lane l the
// columns [4l, 4l + 4) of the round, one 8-byte store (the row's slot is 16-byte aligned, width
// a multiple of 8), 256 contiguous bytes per warp and row. Then thread 0 of the warpgroup,
// after the warpgroup's barrier (every store issued), fences (sys) and release-adds rows ×
// columns to each home rank's counter, one add per run of one source rank (a segment's rows
// are ordered by source rank).
struct GcEpilogue {
  static constexpr bool kOwnsTile = true;
  static constexpr int kStagingRounds = 1;
  static constexpr bool kInitAux = false;
  static constexpr bool kAuxWarps = false;
  const int4* table;  // the grouped GEMM's block table
  const int32_t* src_rank;
  const int32_t* src_token;
  const int32_t* src_slot;
  uint8_t* home[kCommMaxRanks];      // every rank's data area (its slots)
  uint64_t* arrived[kCommMaxRanks];  // every rank's combine counter
  int topk;
  int width;

  template <int BN, int kFrag>
  __device__ __forceinline__ void tile(float (&acc)[kFrag], uint8_t* staging, TileCoord tc, int cw,
                                       const GemmProblem&) const {
    if (!moe_gc_go()) return;
    const int4 b = table[tc.m];
    const int row = b.x + cw * 64;  // this warpgroup's first row
    if (row >= b.y) return;         // the block's second half lies past its group
    const int rows = min(64, b.y - row);
    const int t = threadIdx.x % 128, warp = t / 32, lane = t % 32;
    const uint32_t bar_id = 2 + cw;
    const StagedLane staged(smem_u32(staging), lane);
    const int64_t row_bytes = static_cast<int64_t>(width) * 2;
#pragma unroll
    for (int h = 0; h < BN / 128; ++h) {
      named_barrier_sync(bar_id, 128);  // the previous round's (tile's) reads are done
      stage_round<false>(acc, staging, h);
      named_barrier_sync(bar_id, 128);
      const int col = tc.n * BN + h * 128 + 4 * lane;
      if (col < width) {
#pragma unroll 2
        for (int r = warp; r < rows; r += 4) {
          const uint2 v = staged.row(r);
          const int i = row + r;
          const int64_t slot = static_cast<int64_t>(__ldg(src_token + i)) * topk + __ldg(src_slot + i);
          *reinterpret_cast<uint2*>(home[__ldg(src_rank + i)] + slot * row_bytes +
                                    static_cast<int64_t>(col) * 2) = v;
        }
      }
    }
    named_barrier_sync(bar_id, 128);  // every store of the half-tile issued
    if (t == 0) {
      __threadfence_system();
      const uint64_t cols = static_cast<uint64_t>(min(BN, width - tc.n * BN));
      for (int r = 0; r < rows;) {
        const int s = __ldg(src_rank + row + r);
        int n = rows - r;
        if (__ldg(src_rank + row + rows - 1) != s) {
          n = 1;
          while (r + n < rows && __ldg(src_rank + row + r + n) == s) ++n;
        }
        asm volatile("red.release.sys.global.add.u64 [%0], %1;" ::"l"(arrived[s]), "l"(n * cols) : "memory");
        r += n;
      }
    }
  }
  template <int BN>
  __device__ __forceinline__ void main_loop_point(TileCoord, int) const {}
  __device__ __forceinline__ void consumers_end() const {}
};

// The schedule: the grouped GEMM's, then, after each CTA's last tile, the weighted sums.
struct GcSchedule : GroupedSchedule {
  const GcParams* p;
  uint64_t epoch;
  __device__ __forceinline__ void consumers_done() const {
    named_barrier_sync(1, 256);
    moe_gc_sum(*p, epoch, static_cast<int>(threadIdx.x) - 128, 256, true);
  }
};

// Grid (cooperative, one CTA per SM at most, 384 threads): every CTA starts, runs the grouped
// GEMM (tiles claimed dynamically) and then its share of the weighted sums.
template <int BN, bool kBKN>
__global__ void __launch_bounds__(kGemmThreads, 1)
    moe_gc_kernel(const __grid_constant__ CUtensorMap tm_a, const __grid_constant__ CUtensorMap tm_b,
                  const __grid_constant__ CUtensorMap tm_c, const __grid_constant__ GemmProblem prob,
                  const __grid_constant__ GcEpilogue epi, const __grid_constant__ GroupedSchedule gs,
                  const __grid_constant__ GcParams p) {
  const uint64_t epoch = comm_launch_epoch(p.dev);
  moe_gc_start(p, epoch);
  GcSchedule sched;
  static_cast<GroupedSchedule&>(sched) = gs;
  sched.p = &p;
  sched.epoch = epoch;
  gemm_sm90_body<BN, kBKN>(tm_a, tm_b, tm_c, prob, epi, sched);
}

// A rank whose grouped GEMM is empty: the same protocol without the GEMM.
__global__ void __launch_bounds__(kRowThreads) moe_gc_sum_kernel(const __grid_constant__ GcParams p) {
  const uint64_t epoch = comm_launch_epoch(p.dev);
  moe_gc_start(p, epoch);
  moe_gc_sum(p, epoch, static_cast<int>(threadIdx.x), kRowThreads, false);
}

int sm_count() {
  int dev = 0, n = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return 132;
  if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) return 132;
  return n;
}

int row_grid(int64_t rows) {
  const int64_t want = (rows + kRowThreads / 32 - 1) / (kRowThreads / 32);
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(want, 4LL * sm_count())));
}

struct FusedSplit {
  int gemm, dispatch, item_rows;
};
// The fused kernel's grid: G GEMM CTAs and P dispatch CTAs (a rank without a GEMM: P = every
// CTA of its rows kernel), and the rows per work item (a multiple of the CTA's 12 warps).
FusedSplit fused_split(const CommDevice& dev, const MoeDispatchArgs& a, bool gemm) {
  const int sms = device_sms(dev);
  const int grid = a.fused_ctas > 0 ? std::min(a.fused_ctas, sms) : sms;
  const int warps = kGemmThreads / 32;
  const int64_t row_bytes = static_cast<int64_t>(a.hidden) * 2;
  int64_t rows = std::clamp<int64_t>(kFusedItemBytes / std::max<int64_t>(row_bytes, 16), warps, 32 * warps);
  rows = (rows + warps - 1) / warps * warps;
  FusedSplit f{};
  f.item_rows = static_cast<int>(rows);
  if (!gemm) {
    f.dispatch = grid;
    return f;
  }
  const int want = a.dispatch_ctas > 0 ? a.dispatch_ctas : kFusedDispatchCtas;
  f.dispatch = std::clamp(want, 1, std::max(1, grid / 2));
  f.gemm = std::max(1, grid - f.dispatch);
  return f;
}

FusedAlgo moe_algo(const CommDevice& dev, const MoeDispatchArgs& a) {
  return choose_moe_dispatch_gemm(a.algo, dev.world);
}

// One cooperative launch of a grouped-GEMM kernel instance (the fused dispatch's or the fused
// combine's) with its epilogue, its shared memory opted in once per instance.
template <auto Kernel, int BN, class Epi, class Params>
cudaError_t launch_grouped_cooperative(const GroupedLaunch& l, const Epi& epi, int grid, const Params& p,
                                       cudaStream_t stream) {
  static std::atomic<uint64_t> opted{0};
  constexpr size_t smem = GemmTileConfig<BN, Epi::kStagingRounds>::kSmemBytes;
  if (cudaError_t e = gemm_opt_in_smem(reinterpret_cast<const void*>(Kernel), smem, opted);
      e != cudaSuccess) {
    return e;
  }
  return launch_cooperative(Kernel, grid, smem, stream, l.plan.ta, l.plan.tb, l.plan.tc, l.plan.prob, epi,
                            l.sched, p);
}

template <int BN, bool kBKN>
cudaError_t launch_fused_instance_moe(const GroupedLaunch& l, int grid, const FusedParams& p,
                                      cudaStream_t stream) {
  return launch_grouped_cooperative<moe_fused_kernel<BN, kBKN>, BN>(l, l.epi, grid, p, stream);
}

template <int BN, bool kBKN>
cudaError_t launch_gc_instance(const GroupedLaunch& l, const GcEpilogue& epi, int grid, const GcParams& p,
                               cudaStream_t stream) {
  return launch_grouped_cooperative<moe_gc_kernel<BN, kBKN>, BN>(l, epi, grid, p, stream);
}

}  // namespace
}  // namespace detail

MoeLaunchInfo moe_dispatch_info(const CommDevice& dev, const MoeDispatchArgs& a) {
  using namespace detail;
  MoeLaunchInfo info{};
  info.low_latency = choose_moe_low_latency(a.mode, dev.world, a.capacity, a.topk);
  info.algo = info.low_latency ? FusedAlgo::kDecomposed : moe_algo(dev, a);
  if (info.algo == FusedAlgo::kFused && dev.world >= 1 && dev.rank >= 0 && dev.rank < dev.world) {
    const bool gemm = a.out != nullptr && split_count(a.num_experts, dev.world, dev.rank) > 0;
    const FusedSplit f = fused_split(dev, a, gemm);
    info.gemm_ctas = f.gemm;
    info.dispatch_ctas = f.dispatch;
    info.item_rows = f.item_rows;
  }
  return info;
}

uint64_t moe_dispatch_data_bytes(int64_t capacity, int hidden) {
  return static_cast<uint64_t>(capacity) * (static_cast<uint64_t>(hidden) * 2 + sizeof(detail::RowMeta));
}

int64_t moe_capacity_for(uint64_t data_bytes, int hidden) {
  return static_cast<int64_t>(data_bytes / (static_cast<uint64_t>(hidden) * 2 + sizeof(detail::RowMeta)));
}

uint64_t moe_combine_data_bytes(int64_t tokens, int topk, int width) {
  return static_cast<uint64_t>(tokens) * topk * width * 2;
}

size_t moe_dispatch_workspace_bytes(int64_t tokens, int topk, int num_experts, int world, int rank,
                                    int64_t capacity) {
  return detail::dispatch_ws(tokens, topk, num_experts,
                             static_cast<int>(detail::split_count(num_experts, world, rank)), capacity)
      .total;
}

cudaError_t launch_moe_dispatch(const CommDevice& dev, const MoeDispatchArgs& a, cudaStream_t stream) {
  using namespace detail;
  const int W = dev.world, r = dev.rank, E = a.num_experts;
  if (W < 1 || W > kCommMaxRanks || E < 1 || E > kMoeMaxExperts || a.topk < 1 || a.topk > kMoeMaxTopk) {
    return cudaErrorInvalidValue;
  }
  if (a.tokens < 0 || a.tokens * a.topk >= (1ll << 31) || a.hidden < 8 || a.hidden % 8 != 0 ||
      a.capacity < 0 || a.capacity >= (1ll << 31)) {
    return cudaErrorInvalidValue;
  }
  if (a.tokens > 0 &&
      (a.x == nullptr || a.topk_ids == nullptr || a.topk_weights == nullptr || !aligned16(a.x))) {
    return cudaErrorInvalidValue;
  }
  const MoeDeviceLayout& L = a.layout;
  if (L.expert_offsets == nullptr || L.counts == nullptr || L.tokens == nullptr || L.status == nullptr ||
      (a.capacity > 0 &&
       (L.src_rank == nullptr || L.src_token == nullptr || L.src_slot == nullptr || L.weight == nullptr))) {
    return cudaErrorInvalidValue;
  }
  const int local = static_cast<int>(split_count(E, W, r));
  const FusedAlgo algo = moe_algo(dev, a);
  if (algo != FusedAlgo::kFused && algo != FusedAlgo::kDecomposed) return cudaErrorInvalidValue;
  const bool fused = algo == FusedAlgo::kFused;
  const bool gemm = a.out != nullptr && local > 0;
  if (gemm && (a.w1 == nullptr || a.ffn < 8 || a.ffn % 8 != 0 || !aligned16(a.w1) || !aligned16(a.out))) {
    return cudaErrorInvalidValue;
  }
  if (a.routed_x != nullptr && !aligned16(a.routed_x)) return cudaErrorInvalidValue;
  if (static_cast<uint64_t>(E) * 4 + kSlotHeaderBytes > dev.slot_bytes) return cudaErrorInvalidValue;
  if (moe_dispatch_data_bytes(a.capacity, a.hidden) > dev.data_bytes) return cudaErrorInvalidValue;
  const DispatchWs ws = dispatch_ws(a.tokens, a.topk, E, local, a.capacity);
  if (a.workspace == nullptr || a.workspace_bytes < ws.total ||
      (reinterpret_cast<uintptr_t>(a.workspace) & 255)) {
    return cudaErrorInvalidValue;
  }
  auto* base = static_cast<uint8_t*>(a.workspace);
  auto* bad_pair = reinterpret_cast<unsigned long long*>(base + ws.bad_pair);
  auto* chunk_counts = reinterpret_cast<int32_t*>(base + ws.chunk_counts);
  auto* pair_pos = reinterpret_cast<int32_t*>(base + ws.pair_pos);
  auto* send_base = reinterpret_cast<int64_t*>(base + ws.send_base);
  auto* send_start = reinterpret_cast<int32_t*>(base + ws.send_start);
  auto* send_list = reinterpret_cast<int32_t*>(base + ws.send_list);
  const int64_t pairs = a.tokens * a.topk;
  const int64_t chunks = moe_chunks(pairs);
  const int64_t chunk_pairs = moe_chunk_pairs(pairs);

  // The launches' signatures: what every rank must share (E, topk, hidden, capacity).
  CommDevice d = dev;
  const uint64_t sizes = comm_sig_hash(static_cast<uint64_t>(E) << 8 | static_cast<uint64_t>(a.topk),
                                       static_cast<uint64_t>(a.hidden), static_cast<uint64_t>(a.capacity));
  const uint8_t* area = dev.base[r] + dev.data_offset;
  const uint64_t meta_offset = static_cast<uint64_t>(a.capacity) * a.hidden * 2;
  auto grouped_args = [&] {
    GroupedGemmArgs g;
    g.A = reinterpret_cast<const __nv_bfloat16*>(area);
    g.rows_capacity = a.capacity;
    g.offsets = L.expert_offsets;
    g.groups = local;
    g.B = a.w1;
    g.b_layout = a.w1_layout;
    g.N = a.ffn;
    g.K = a.hidden;
    g.C = a.out;
    g.workspace = base + ws.gemm;
    g.workspace_bytes = ws.total - ws.gemm;
    return g;
  };

  if (choose_moe_low_latency(a.mode, W, a.capacity, a.topk)) {
    // Steps 1-4 in one cooperative launch, then the grouped GEMM (moe.h "Low latency").
    LlParams lp{};
    d.launch_sig = comm_launch_signature(kMoeOpLowLatency, static_cast<uint32_t>(CommDtype::kBF16), 0, sizes);
    lp.dev = d;
    lp.x = reinterpret_cast<const uint4*>(a.x);
    lp.row_vecs = a.hidden / 8;
    lp.tokens = a.tokens;
    lp.topk = a.topk;
    lp.num_experts = E;
    lp.ids = a.topk_ids;
    lp.weights = a.topk_weights;
    lp.pair_row = pair_pos;
    lp.meta_offset = meta_offset;
    lp.layout = L;
    lp.capacity = a.capacity;
    lp.routed_x = reinterpret_cast<uint4*>(a.routed_x);
    const size_t smem = moe_ll_smem(W, E);
    static std::atomic<size_t> opted{0};
    if (smem > 48 * 1024 && opted.load() < smem) {
      if (cudaError_t e = cudaFuncSetAttribute(
              moe_ll_dispatch_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
          e != cudaSuccess) {
        return e;
      }
      opted.store(smem);
    }
    const int sms = device_sms(dev);
    const int cap = a.fused_ctas > 0 ? std::min(a.fused_ctas, sms) : sms;
    const int64_t work = std::max<int64_t>(pairs, a.capacity);
    const int grid = static_cast<int>(std::clamp<int64_t>((work + kLlWarps - 1) / kLlWarps, 1, cap));
    if (cudaError_t e = launch_cooperative(moe_ll_dispatch_kernel, grid, smem, stream, lp);
        e != cudaSuccess) {
      return e;
    }
    if (gemm && a.capacity > 0) {
      GroupedGemmArgs g = grouped_args();
      g.num_ctas = a.gemm_ctas;
      return launch_grouped_gemm(g, stream);
    }
    return cudaSuccess;
  }

  if (cudaError_t e = cudaMemsetAsync(bad_pair, 0xFF, sizeof(unsigned long long), stream); e != cudaSuccess) {
    return e;
  }
  if (chunks > 0) {
    moe_count_kernel<<<static_cast<unsigned>(chunks), 32, 0, stream>>>(a.topk_ids, pairs, chunk_pairs, E,
                                                                       chunk_counts, pair_pos, bad_pair);
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  }
  CountsParams cp{};
  d.launch_sig = comm_launch_signature(kMoeOpCounts, static_cast<uint32_t>(CommDtype::kBF16), 0, sizes);
  cp.dev = d;
  cp.chunk_counts = chunk_counts;
  cp.chunks = chunks;
  cp.num_experts = E;
  cp.tokens = a.tokens;
  cp.ids = a.topk_ids;
  cp.bad_pair = bad_pair;
  cp.send_base = send_base;
  cp.layout = L;
  cp.capacity = a.capacity;
  cp.send_start = fused ? send_start : nullptr;
  moe_counts_kernel<<<1, kCountsThreads, 0, stream>>>(cp);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;

  // The row movers' parameters, shared by both paths (d carries the launch's signature).
  auto rows_params = [&](const CommDevice& dev_sig) {
    RowsParams rp{};
    rp.dev = dev_sig;
    rp.x = reinterpret_cast<const uint4*>(a.x);
    rp.row_vecs = a.hidden / 8;
    rp.pairs = pairs;
    rp.topk = a.topk;
    rp.num_experts = E;
    rp.ids = a.topk_ids;
    rp.weights = a.topk_weights;
    rp.chunk_prefix = chunk_counts;
    rp.pair_pos = pair_pos;
    rp.send_base = send_base;
    rp.chunk_pairs = chunk_pairs;
    rp.meta_offset = meta_offset;
    rp.status = L.status;
    return rp;
  };

  if (fused) {
    // The send list, then the rows and the grouped GEMM in one kernel (or the rows alone on a
    // rank with no GEMM), then the unpack as in the decomposed path.
    if (pairs > 0) {
      moe_send_list_kernel<<<row_grid((pairs + 31) / 32), kRowThreads, 0, stream>>>(
          a.topk_ids, pairs, chunk_pairs, E, chunk_counts, pair_pos, send_start, send_list, L.status);
      if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
    }
    FusedParams fp{};
    d.launch_sig = comm_launch_signature(kMoeOpFused, static_cast<uint32_t>(CommDtype::kBF16), 0, sizes);
    static_cast<RowsParams&>(fp) = rows_params(d);
    fp.list = send_list;
    fp.local_experts = local;
    fp.first_expert = static_cast<int>(split_offset(E, W, r));
    fp.counts = L.counts;
    GroupedLaunch gl;
    bool empty = true;
    if (gemm && a.capacity > 0) {
      GroupedGemmArgs g = grouped_args();
      g.num_ctas = fused_split(dev, a, true).gemm;  // the tile width for the CTAs that start on it
      if (cudaError_t e = grouped_gemm_prepare(g, &gl, &empty, stream); e != cudaSuccess) return e;
    }
    const FusedSplit f = fused_split(dev, a, !empty);
    fp.item_rows = f.item_rows;
    fp.gemm_ctas = f.gemm;
    fp.dispatch_ctas = f.dispatch;
    fp.bulk_stages = 0;
    fp.stage_bytes = 0;
    if (!empty) {
      // The stages: the rows (rounded to 128 bytes) that fit the GEMM's shared memory after
      // the row table; fewer than 2 (rows of ~100 KiB and more): register copies.
      const size_t smem = gl.plan.tile_n == 256
                              ? GemmTileConfig<256, GroupedEpilogue::kStagingRounds>::kSmemBytes
                              : GemmTileConfig<128, GroupedEpilogue::kStagingRounds>::kSmemBytes;
      const uint64_t stage = (static_cast<uint64_t>(a.hidden) * 2 + 127) / 128 * 128;
      const int stages =
          static_cast<int>(std::min<uint64_t>(kFusedMaxStages, (smem - kFusedRoleTableBytes) / stage));
      if (stages >= 2) {
        fp.bulk_stages = stages;
        fp.stage_bytes = static_cast<uint32_t>(stage);
      }
    }
    if (empty) {
      moe_fused_rows_kernel<<<f.dispatch, kGemmThreads, kFusedRoleTableBytes, stream>>>(fp);
      if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
    } else {
      const int grid = f.gemm + f.dispatch;
      const cudaError_t e = gl.plan.tile_n == 256
                                ? (gl.plan.kn ? launch_fused_instance_moe<256, true>(gl, grid, fp, stream)
                                              : launch_fused_instance_moe<256, false>(gl, grid, fp, stream))
                                : (gl.plan.kn ? launch_fused_instance_moe<128, true>(gl, grid, fp, stream)
                                              : launch_fused_instance_moe<128, false>(gl, grid, fp, stream));
      if (e != cudaSuccess) return e;
    }
    if (a.capacity > 0) {
      moe_unpack_kernel<<<row_grid(a.capacity), kRowThreads, 0, stream>>>(
          area, meta_offset, a.hidden / 8, L.expert_offsets + local, L, reinterpret_cast<uint4*>(a.routed_x));
      if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
    }
    return cudaSuccess;
  }

  d.launch_sig = comm_launch_signature(kMoeOpRows, static_cast<uint32_t>(CommDtype::kBF16), 0, sizes);
  const RowsParams rp = rows_params(d);
  moe_rows_kernel<<<row_grid(pairs), kRowThreads, 0, stream>>>(rp);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;

  if (a.capacity > 0) {
    moe_unpack_kernel<<<row_grid(a.capacity), kRowThreads, 0, stream>>>(area, rp.meta_offset, a.hidden / 8,
                                                                        L.expert_offsets + local, L,
                                                                        reinterpret_cast<uint4*>(a.routed_x));
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  }
  if (gemm && a.capacity > 0) {
    GroupedGemmArgs g = grouped_args();
    g.num_ctas = a.gemm_ctas;
    return launch_grouped_gemm(g, stream);
  }
  return cudaSuccess;
}

bool moe_combine_low_latency(const CommDevice& dev, const MoeCombineArgs& a) {
  return choose_moe_low_latency(a.mode, dev.world, a.capacity, a.topk);
}

cudaError_t launch_moe_combine(const CommDevice& dev, const MoeCombineArgs& a, cudaStream_t stream) {
  using namespace detail;
  const int W = dev.world, r = dev.rank, E = a.num_experts;
  if (W < 1 || W > kCommMaxRanks || E < 1 || E > kMoeMaxExperts || a.topk < 1 || a.topk > kMoeMaxTopk) {
    return cudaErrorInvalidValue;
  }
  if (a.width < 0 || a.width % 8 != 0 || a.tokens < 0 || a.capacity < 0) return cudaErrorInvalidValue;
  const MoeDeviceLayout& L = a.layout;
  if (L.expert_offsets == nullptr || L.tokens == nullptr || L.status == nullptr) return cudaErrorInvalidValue;
  if (a.width > 0 &&
      ((a.capacity > 0 && (a.expert_out == nullptr || !aligned16(a.expert_out))) ||
       (a.tokens > 0 && (a.out == nullptr || !aligned16(a.out) || a.topk_weights == nullptr)))) {
    return cudaErrorInvalidValue;
  }
  const int local = static_cast<int>(split_count(E, W, r));
  CommDevice d = dev;
  d.launch_sig =
      comm_launch_signature(kMoeOpCombine, static_cast<uint32_t>(CommDtype::kBF16), 0,
                            comm_sig_hash(static_cast<uint64_t>(E) << 8 | static_cast<uint64_t>(a.topk),
                                          static_cast<uint64_t>(a.width), 0));
  CombineParams cp{};
  cp.dev = d;
  cp.expert_out = reinterpret_cast<const uint4*>(a.expert_out);
  cp.row_vecs = a.width / 8;
  cp.rows_at = L.expert_offsets + local;
  cp.src_rank = L.src_rank;
  cp.src_token = L.src_token;
  cp.src_slot = L.src_slot;
  cp.tokens = L.tokens;
  cp.topk = a.topk;
  cp.status = L.status;
  // With width 0 nothing travels; the launch still keeps the epoch sequence in step.
  if (a.width == 0) cp.rows_at = L.expert_offsets;  // expert_offsets[0] == 0: no rows
  if (moe_combine_low_latency(dev, a)) {
    cp.dev.launch_sig =
        comm_launch_signature(kMoeOpLlCombine, static_cast<uint32_t>(CommDtype::kBF16), 0,
                              comm_sig_hash(static_cast<uint64_t>(E) << 8 | static_cast<uint64_t>(a.topk),
                                            static_cast<uint64_t>(a.width), 0));
    LlCombineParams lp{};
    lp.rows = cp;
    lp.weights = a.topk_weights;
    lp.tokens = a.width > 0 ? a.tokens : 0;
    lp.out = reinterpret_cast<uint4*>(a.out);
    const int sms = device_sms(dev);
    const int cap = a.ctas > 0 ? std::min(a.ctas, sms) : sms;
    const int64_t work = std::max<int64_t>(
        a.width > 0 ? a.capacity : 0, (lp.tokens * (a.width / 8) + kLlThreads - 1) / kLlThreads * kLlWarps);
    const int grid = static_cast<int>(std::clamp<int64_t>((work + kLlWarps - 1) / kLlWarps, 1, cap));
    return launch_cooperative(moe_ll_combine_kernel, grid, 0, stream, lp);
  }
  moe_combine_kernel<<<row_grid(a.width > 0 ? a.capacity : 0), kRowThreads, 0, stream>>>(cp);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  const int64_t n = a.tokens * (a.width / 8);
  if (n > 0) {
    const int grid = static_cast<int>(
        std::max<int64_t>(1, std::min<int64_t>((n + kRowThreads - 1) / kRowThreads, 8LL * sm_count())));
    moe_weighted_sum_kernel<<<grid, kRowThreads, 0, stream>>>(dev.base[r] + dev.data_offset, a.tokens, a.topk,
                                                              a.width / 8, a.topk_weights,
                                                              reinterpret_cast<uint4*>(a.out), L.status);
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

size_t moe_gemm_combine_workspace_bytes(int64_t rows, int local_experts, int width, FusedAlgo algo) {
  const size_t gemm =
      detail::align256(grouped_gemm_workspace_bytes(std::max<int64_t>(rows, 0), local_experts));
  if (algo == FusedAlgo::kFused) return gemm;
  return gemm + detail::align256(static_cast<size_t>(std::max<int64_t>(rows, 0)) * std::max(width, 0) * 2);
}

FusedAlgo moe_gemm_combine_algo(const CommDevice& dev, const MoeGemmCombineArgs& a) {
  return choose_moe_gemm_combine(a.algo, dev.world);
}

cudaError_t launch_moe_gemm_combine(const CommDevice& dev, const MoeGemmCombineArgs& a, cudaStream_t stream) {
  using namespace detail;
  const int W = dev.world, r = dev.rank, E = a.num_experts;
  if (W < 1 || W > kCommMaxRanks || r < 0 || r >= W || E < 1 || E > kMoeMaxExperts || a.topk < 1 ||
      a.topk > kMoeMaxTopk) {
    return cudaErrorInvalidValue;
  }
  if (a.k < 8 || a.k % 8 != 0 || a.width < 8 || a.width % 8 != 0 || a.rows < 0 || a.rows >= (1ll << 31) ||
      a.tokens < 0) {
    return cudaErrorInvalidValue;
  }
  const MoeDeviceLayout& L = a.layout;
  if (L.expert_offsets == nullptr || L.tokens == nullptr || L.status == nullptr) return cudaErrorInvalidValue;
  const int local = static_cast<int>(split_count(E, W, r));
  const bool gemm = local > 0 && a.rows > 0;
  if (gemm && (a.h == nullptr || a.w2 == nullptr || !aligned16(a.h) || !aligned16(a.w2) ||
               L.src_rank == nullptr || L.src_token == nullptr || L.src_slot == nullptr)) {
    return cudaErrorInvalidValue;
  }
  if (a.tokens > 0 && (a.out == nullptr || !aligned16(a.out) || a.topk_weights == nullptr)) {
    return cudaErrorInvalidValue;
  }
  const FusedAlgo algo = moe_gemm_combine_algo(dev, a);
  if (algo != FusedAlgo::kFused && algo != FusedAlgo::kDecomposed) return cudaErrorInvalidValue;
  const size_t gemm_ws = align256(grouped_gemm_workspace_bytes(a.rows, local));
  if (a.workspace == nullptr ||
      a.workspace_bytes < moe_gemm_combine_workspace_bytes(a.rows, local, a.width, algo) ||
      (reinterpret_cast<uintptr_t>(a.workspace) & 255)) {
    return cudaErrorInvalidValue;
  }
  auto* ws = static_cast<uint8_t*>(a.workspace);
  GroupedGemmArgs g;
  g.A = a.h;
  g.rows_capacity = a.rows;
  g.offsets = L.expert_offsets;
  g.groups = local;
  g.B = a.w2;
  g.b_layout = a.w2_layout;
  g.N = a.width;
  g.K = a.k;
  g.workspace = ws;
  g.workspace_bytes = gemm_ws;
  g.tile_n = a.tile_n;

  if (algo == FusedAlgo::kDecomposed) {
    auto* rows = reinterpret_cast<__nv_bfloat16*>(ws + gemm_ws);
    if (gemm) {
      g.C = rows;
      if (cudaError_t e = launch_grouped_gemm(g, stream); e != cudaSuccess) return e;
    }
    MoeCombineArgs cb;
    cb.expert_out = rows;
    cb.width = a.width;
    cb.layout = L;
    cb.num_experts = E;
    cb.topk = a.topk;
    cb.capacity = a.rows;
    cb.mode = MoeMode::kNormal;  // a.rows is this rank's: no rank-uniform size to choose by
    cb.tokens = a.tokens;
    cb.topk_weights = a.topk_weights;
    cb.out = a.out;
    return launch_moe_combine(dev, cb, stream);
  }

  const int sms = device_sms(dev);
  const int grid = a.fused_ctas > 0 ? std::min(a.fused_ctas, sms) : sms;
  GcParams p{};
  p.dev = dev;
  p.dev.launch_sig =
      comm_launch_signature(kMoeOpGemmCombine, static_cast<uint32_t>(CommDtype::kBF16), 0,
                            comm_sig_hash(static_cast<uint64_t>(E) << 8 | static_cast<uint64_t>(a.topk),
                                          static_cast<uint64_t>(a.width), 0));
  p.tokens = L.tokens;
  p.topk = a.topk;
  p.width = a.width;
  p.my_tokens = a.tokens;
  p.weights = a.topk_weights;
  p.out = reinterpret_cast<uint4*>(a.out);
  p.status = L.status;
  GroupedLaunch gl;
  bool empty = true;
  if (gemm) {
    // The epilogue stores no C: the engine's C map is encoded over h (never written).
    g.C = const_cast<__nv_bfloat16*>(a.h);
    g.num_ctas = grid;
    if (cudaError_t e = grouped_gemm_prepare(g, &gl, &empty, stream); e != cudaSuccess) return e;
  }
  if (empty) {
    const int64_t vecs = a.tokens * (a.width / 8);
    const int n = static_cast<int>(
        std::max<int64_t>(1, std::min<int64_t>(grid, (vecs + kRowThreads - 1) / kRowThreads)));
    moe_gc_sum_kernel<<<n, kRowThreads, 0, stream>>>(p);
    return cudaGetLastError();
  }
  GcEpilogue epi{};
  epi.table = gl.epi.table;
  epi.src_rank = L.src_rank;
  epi.src_token = L.src_token;
  epi.src_slot = L.src_slot;
  for (int q = 0; q < W; ++q) {
    epi.home[q] = dev.base[q] + dev.data_offset;
    epi.arrived[q] = reinterpret_cast<uint64_t*>(dev.base[q] + kMoeCombineFlagOffset);
  }
  epi.topk = a.topk;
  epi.width = a.width;
  return gl.plan.tile_n == 256 ? (gl.plan.kn ? launch_gc_instance<256, true>(gl, epi, grid, p, stream)
                                             : launch_gc_instance<256, false>(gl, epi, grid, p, stream))
                               : (gl.plan.kn ? launch_gc_instance<128, true>(gl, epi, grid, p, stream)
                                             : launch_gc_instance<128, false>(gl, epi, grid, p, stream));
}

}  // namespace fusedcomm::kernels
