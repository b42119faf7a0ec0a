// The chunk-pipelined collectives, one kernel family with per-chunk flags:
// kTwoPhasePush (producers pull-reduce and push), kPipelined (allReduce: consumers pull the
// peers' reduced chunks as they are flagged) and kDirect (allReduce in place: only stores cross
// NVLink).
// Included by collectives.cu only, inside its anonymous namespace: the kernels keep internal
// linkage (and their symbols) in that translation unit.
#pragma once

#include "kernels/collectives/detail/collective_kernel.cuh"

namespace fusedcomm::kernels {
namespace {

// ---- chunk-pipelined variants (kTwoPhasePush, kPipelined): per-chunk flags ---------------------
//
// CTAs [0, P) produce, [P, P + C) consume (collectives.h). Inside every CTA warp 0 is the
// control warp (flag waits and releases) and warps 1.. move data, so that neither a release's
// fence.sc.sys (it waits for the CTA's remote stores to be acknowledged) nor a flag acquire
// sits on the data path: in loop iteration j the data warps work on round j while the control
// warp releases round j - 1 (producers) or acquires the flags of round j + 1 (consumers); one
// bar.sync ends the iteration. Ordering: round j's stores (data warps) -> bar.sync -> thread 0
// fence.sc.sys + st.release.sys (next iteration); acquire (control lane) -> bar.sync -> reads
// of round j + 1 (next iteration). See CommFlags::pipe.

// (kCtl, the control warp's threads: detail/select.h.)

__device__ __forceinline__ uint64_t pipe_tag(uint64_t epoch, int64_t rounds_done) {
  return (epoch << kCommPipeRoundBits) | static_cast<uint64_t>(rounds_done);
}

// Where a pipelined copy / reduction stores: an optional local pointer, plus the same byte
// offset in the regions of the ranks in peer_order (remote stores, or this rank's own scratch).
struct Dests {
  uint8_t* local;
  uint32_t peer_order;  // rank_order(mask of ranks, this rank)
  uint64_t peer_off;
};
// A rank mask laid out so that the lowest set bit first visits ranks r+1, r+2, ... then 0,
// 1, ...: every rank stores to a different peer first (bit p, or bit p + 8 for p <= r).
static_assert((kCommMaxRanks & (kCommMaxRanks - 1)) == 0 && 2 * kCommMaxRanks <= 32, "rank_order");
__device__ __forceinline__ uint32_t rank_order(uint32_t mask, int r) {
  const uint32_t upto = (2u << r) - 1u;
  return (mask & ~upto) | ((mask & upto) << kCommMaxRanks);
}
// The common offset of the destinations from the 16-byte grid (local and peer_off; the
// regions' bases are aligned), or -1 where they differ.
__device__ __forceinline__ int dests_mis(const Dests& ds) {
  const int mp = static_cast<int>(ds.peer_off & 15);
  if (ds.local == nullptr) return mp;
  const int ml = static_cast<int>(reinterpret_cast<uintptr_t>(ds.local) & 15);
  return ds.peer_order == 0 || ml == mp ? ml : -1;
}
__device__ __forceinline__ Dests dests_plus(const Dests& ds, int64_t bytes) {
  return Dests{ds.local != nullptr ? ds.local + bytes : nullptr, ds.peer_order, ds.peer_off + bytes};
}
// The peer loop stays rolled (region bases read from the parameter space per store): unrolled,
// eight hoisted bases per batch of stores pushed the reductions over 128 registers.
template <typename V>
__device__ __forceinline__ void dests_store(const CommDevice& d, const Dests& ds, int64_t i, V v) {
  if (ds.local != nullptr) reinterpret_cast<V*>(ds.local)[i] = v;
#pragma unroll 1
  for (uint32_t m = ds.peer_order; m != 0; m &= m - 1) {
    reinterpret_cast<V*>(d.base[(__ffs(m) - 1) & (kCommMaxRanks - 1)] + ds.peer_off)[i] = v;
  }
}

// Elements before the destinations' first 16-byte boundary (at most n), or -1 where they sit
// at different offsets or off the element grid (then element by element throughout).
template <typename T>
__device__ __forceinline__ int64_t dests_head(const Dests& ds, int64_t n) {
  const int md = dests_mis(ds);
  if (md < 0 || md % static_cast<int>(sizeof(T)) != 0) return -1;
  const int64_t h = ((kVecBytes - md) & 15) / static_cast<int64_t>(sizeof(T));
  return h < n ? h : n;
}

// Data warps: n elements from src to every destination. Where src sits at the destinations'
// offset from the 16-byte grid (every kAuto path: pipe_kernel's slot_pad): the elements before
// the boundary and the tail one by one, and 16-byte vectors between, tuning::kPipeCopyUnroll in
// flight per thread, the last batch predicated (no serial tail loop on NVLink latency); else
// element by element. (Joining shifted source vectors here, as cta_copy does, pushed the
// kernels past 128 registers.)
template <typename T>
__device__ __forceinline__ void pipe_copy(const CommDevice& d, const uint8_t* src, const Dests& ds,
                                          int64_t n) {
  using Raw = typename Elem<T>::Raw;
  constexpr int kEpv = kVecBytes / sizeof(T);
  constexpr int64_t es = sizeof(T);
  constexpr int U = tuning::kPipeCopyUnroll;
  const int tid = threadIdx.x - kCtl, nt = blockDim.x - kCtl;
  const Raw* rs = reinterpret_cast<const Raw*>(src);
  int64_t head = dests_head<T>(ds, n);
  if (head >= 0 && ((reinterpret_cast<uintptr_t>(src) + head * es) & 15) != 0) head = -1;
  int64_t done = 0;
  if (head >= 0) {
    // The head's and the tail's elements (fewer than a vector each, one per thread) are loaded
    // before the vectors and stored after them: in every chunk, not one more round trip.
    const int64_t nv = (n - head) / kEpv, tail_b = head + nv * kEpv;
    const bool has_h = tid < head, has_t = tail_b + tid < n;
    Raw hv = 0, tv = 0;
    if (has_h) hv = __ldcg(rs + tid);
    if (has_t) tv = __ldcg(rs + tail_b + tid);
    const uint8_t* s0 = src + head * es;
    const Dests dv = dests_plus(ds, head * es);
    {
      const uint4* s = reinterpret_cast<const uint4*>(s0);
      for (int64_t i = tid; i < nv; i += static_cast<int64_t>(U) * nt) {
        uint4 v[U];
#pragma unroll
        for (int u = 0; u < U; ++u)
          if (i + u * nt < nv) v[u] = ld_vec(s + i + u * nt);
#pragma unroll
        for (int u = 0; u < U; ++u)
          if (i + u * nt < nv) dests_store(d, dv, i + u * nt, v[u]);
      }
    }
    if (has_h) dests_store(d, ds, tid, hv);
    if (has_t) dests_store(d, ds, tail_b + tid, tv);
    return;
  }
  for (int64_t i = done + tid; i < n; i += nt) dests_store(d, ds, i, static_cast<Raw>(__ldcg(rs + i)));
}

// Data warps: element-wise fp32 sum of the ns <= NS sources (src(k): chunk start of source k,
// rank order) rounded once, to every destination. NS is a compile-time bucket (2, 4, 8) with
// the sources past ns predicated off, so a kernel holds one instantiation (a switch over eight
// inlined source counts pushed the kernel past 128 registers). NS * U loads in flight. Sources
// and destinations at one offset from the 16-byte grid (else element by element): the head and
// the tail one by one, 16-byte vectors between (as pipe_copy).
template <typename T, int NS, typename Src>
__device__ __forceinline__ void pipe_reduce(const CommDevice& d, int ns, Src src, const Dests& ds,
                                            int64_t n) {
  constexpr int kEpv = kVecBytes / sizeof(T);
  constexpr int64_t es = sizeof(T);
  constexpr int U = NS >= tuning::kPipeRedLoads ? 1 : tuning::kPipeRedLoads / NS;
  const int tid = threadIdx.x - kCtl, nt = blockDim.x - kCtl;
  int64_t head = dests_head<T>(ds, n);
  const uintptr_t ms = reinterpret_cast<uintptr_t>(src(0)) & 15;
  for (int k = 1; k < ns; ++k) {
    if ((reinterpret_cast<uintptr_t>(src(k)) & 15) != ms) head = -1;
  }
  if (head >= 0 && ((ms + head * es) & 15) != 0) head = -1;
  auto sum_elem = [&](int64_t i) {
    float acc = 0.f;
    for (int k = 0; k < ns; ++k) acc += Elem<T>::load(reinterpret_cast<const T*>(src(k)) + i);
    T t;
    Elem<T>::store(&t, acc);
    return *reinterpret_cast<const typename Elem<T>::Raw*>(&t);
  };
  int64_t done = 0;
  if (head >= 0) {
    // The head's and the tail's elements: raw loads before the vectors, sums and stores after
    // them (as pipe_copy). Same adds in the same order as sum_elem.
    using Raw = typename Elem<T>::Raw;
    const int64_t nv = (n - head) / kEpv, tail_b = head + nv * kEpv;
    const bool has_h = tid < head, has_t = tail_b + tid < n;
    Raw hr[NS], tr[NS];
#pragma unroll
    for (int k = 0; k < NS; ++k) {
      hr[k] = 0, tr[k] = 0;
      if (k < ns && has_h) hr[k] = __ldcg(reinterpret_cast<const Raw*>(src(k)) + tid);
      if (k < ns && has_t) tr[k] = __ldcg(reinterpret_cast<const Raw*>(src(k)) + tail_b + tid);
    }
    const Dests dv = dests_plus(ds, head * es);
    auto vec_at = [&](int k) {  // source k's vector 0 after the head
      return reinterpret_cast<const uint4*>(src(k) + head * es);
    };
    {
      for (int64_t i = tid; i < nv; i += static_cast<int64_t>(U) * nt) {
        uint4 v[U][NS];
#pragma unroll
        for (int u = 0; u < U; ++u)
          if (i + u * nt < nv) {
#pragma unroll
            for (int k = 0; k < NS; ++k)
              if (k < ns) { v[u][k] = ld_vec(vec_at(k) + i + u * nt); }
          }
#pragma unroll
        for (int u = 0; u < U; ++u)
          if (i + u * nt < nv) dests_store(d, dv, i + u * nt, sum_vecs<T, NS>(v[u], ns));
      }
    }
    auto sum_raw = [&](const Raw(&x)[NS]) {
      float acc = 0.f;
#pragma unroll
      for (int k = 0; k < NS; ++k)
        if (k < ns) acc += Elem<T>::to_float(x[k]);
      T t;
      Elem<T>::store(&t, acc);
      return *reinterpret_cast<const Raw*>(&t);
    };
    if (has_h) dests_store(d, ds, tid, sum_raw(hr));
    if (has_t) dests_store(d, ds, tail_b + tid, sum_raw(tr));
    return;
  }
  for (int64_t i = done + tid; i < n; i += nt) dests_store(d, ds, i, sum_elem(i));
}

// The round loop of a pipelined CTA (all threads). acquire(j): control warp, all lanes,
// returns (warp-uniformly) whether round j's inputs are observed; work(j): data warps;
// release(j): control warp (thread 0 acts) publishes round j. Returns false, to every
// thread, if an acquire gave up.
template <typename Acquire, typename Work, typename Release>
__device__ __forceinline__ bool pipe_rounds(int rounds, Acquire acquire, Work work, Release release) {
  __shared__ int s_ok[2];  // [round parity]: written by thread 0 one iteration ahead
  const bool ctl = threadIdx.x < kCtl;
  if (ctl) {
    const bool ok = rounds > 0 ? acquire(0) : true;
    if (threadIdx.x == 0) s_ok[0] = ok;
  }
  __syncthreads();
  int j = 0;
  for (; j < rounds; ++j) {
    if (!s_ok[j & 1]) break;  // every thread reads it after the same barrier
    if (ctl) {
      if (j > 0) release(j - 1);
      const bool ok = j + 1 < rounds ? acquire(j + 1) : true;
      if (threadIdx.x == 0) s_ok[(j + 1) & 1] = ok;  // last read before the previous barrier
    } else {
      work(j);
    }
    __syncthreads();
  }
  if (j < rounds) return false;
  if (ctl && rounds > 0) release(rounds - 1);
  return true;
}

// One kernel per (dtype, op, push or pull, source-count bucket NS >= world for the reducing
// ops): each holds a single data path (all of them in one kernel spilled).
// kDirect (allReduce in place, CommAlgo::kDirect): producers push block p of the input into
// owner p's scratch slot as the push reduceScatter does; each consumer reduces chunks of this
// rank's block from its input and the slots, and stores the sums into the data area of every
// rank (its own included) at the block's place; an end barrier (CommFlags::done) then says
// every peer's stores into this rank's data area are complete. Only stores cross NVLink.
template <typename T, CommOp kOp, bool kPush, int NS, bool kDirect = false>
__global__ void __launch_bounds__(tuning::kCollectiveThreads, 1)
    pipe_kernel(const __grid_constant__ CommDevice d, const __grid_constant__ Params prm) {
  const CollectiveArgs& a = prm.a;
  const uint64_t epoch = enter_collective(d);
  if (epoch == 0) return;  // this rank has given up (enter_collective)
  const int W = d.world, r = d.rank;
  const int P = prm.pull_ctas, C = prm.consumers;
  constexpr bool push = kPush;
  constexpr CommOp op = kOp;
  static_assert(!kDirect || (op == CommOp::kAllReduce && kPush), "direct: allReduce only");
  constexpr bool blocks = kDirect || op == CommOp::kReduceScatter || op == CommOp::kAllToAll;
  constexpr int64_t es = sizeof(T);
  const int64_t count = a.count, chunk = prm.chunk;
  const int64_t n_r = split_count(count, W, r), off_r = split_offset(count, W, r);
  const int64_t n_0 = split_count(count, W, 0);         // the longest slice / block
  const uint64_t in_off = d.data_offset + a.in_offset;  // input's byte offset in every region
  uint8_t* const out = static_cast<uint8_t*>(a.output);
  CommFlags* const mine = comm_flags(d, r);
  const uint32_t peers = ((1u << W) - 1u) & ~(1u << r);
  auto nch = [&](int64_t len) { return (len + chunk - 1) / chunk; };
  // Element offset of source `src`'s slot in receiver `recv`'s scratch (push RS / A2A).
  auto slot = [&](int recv, int src) {
    return static_cast<int64_t>((src - recv - 1 + W) % W) * prm.slot_stride;
  };
  // Bytes past a slot's start where its block begins: the block's own offset from the 16-byte
  // grid in the input (the plan leaves a vector of room), so that a block, its copies in the
  // slots and its place in every data area share one offset and the reductions stay vectorised.
  auto slot_pad = [&](int owner) {
    return static_cast<int64_t>((in_off + static_cast<uint64_t>(split_offset(count, W, owner) * es)) & 15);
  };
  auto rounds_of = [&](int64_t chunks, int first) {
    return static_cast<int>(chunks > first ? (chunks - first + P - 1) / P : 0);
  };
  bool ok = true;

  if (static_cast<int>(blockIdx.x) < P) {
    // ---- producer c: start barrier (CommFlags::arrive), then rounds of chunks c + j * P.
    const int c = blockIdx.x;
    if (c == 0 && threadIdx.x == 0) {
      comm_publish_signature(d, epoch);
      __threadfence_system();
      comm_signal_peers(
          d, [&](CommFlags* f) { return &f->arrive[r]; }, epoch);
    }
    ok = comm_wait_peers(d, mine->arrive, 1, epoch, op, kCommStepArrive, c == 0);
    if (ok) {
      // RS / A2A push block p (<= n_0 long) to every peer p; AR / AG handle this rank's slice.
      const int rounds = rounds_of(nch(blocks ? n_0 : n_r), c);
      auto work = [&](int j) {
        const int64_t k = c + static_cast<int64_t>(j) * P, b = k * chunk;
        if constexpr (!blocks) {
          if (k >= nch(n_r)) return;
          const int64_t n = min(chunk, n_r - b);
          const uint64_t pos = (off_r + b) * es;  // the slice's place in output and scratch
          const Dests ds{out + pos, rank_order(push ? peers : (1u << r), r), d.scratch_offset + pos};
          if constexpr (op == CommOp::kAllReduce) {
            const uint64_t so = in_off + pos;
            pipe_reduce<T, NS>(
                d, W, [&](int s) { return d.base[s] + so; }, ds, n);
          } else {  // allGather (push): this rank's block
            pipe_copy<T>(d, d.base[r] + in_off + b * es, ds, n);
          }
        } else {
          for (int i = 1; i < W; ++i) {
            const int p = (r + i) % W;
            const int64_t n_p = split_count(count, W, p);
            if (k >= nch(n_p)) continue;
            const Dests ds{nullptr, rank_order(1u << p, r),
                           d.scratch_offset + (slot(p, r) + b) * es + slot_pad(p)};
            pipe_copy<T>(d, d.base[r] + in_off + (split_offset(count, W, p) + b) * es, ds,
                         min(chunk, n_p - b));
          }
          if (op == CommOp::kAllToAll && k < nch(n_r)) {
            const Dests ds{out + (r * n_r + b) * es, 0u, 0};
            pipe_copy<T>(d, d.base[r] + in_off + (off_r + b) * es, ds, min(chunk, n_r - b));
          }
        }
      };
      auto release = [&](int j) {
        if (threadIdx.x == 0) {
          __threadfence_system();
          comm_signal_peers(
              d, [&](CommFlags* f) { return &f->pipe[r][c]; }, pipe_tag(epoch, j + 1));
        }
      };
      pipe_rounds(
          rounds, [](int) { return true; }, work, release);
    }
  } else {
    // ---- consumer q: chunks of producers c = q, q + C, ... (< P) of every peer.
    const int q = blockIdx.x - P;
    const int ncov = (P - q + C - 1) / C;
    // Length whose chunks source s's producers release to this rank.
    auto seg = [&](int s) { return blocks ? n_r : split_count(count, W, s); };
    const int rounds = rounds_of(nch(n_0), q);
    auto acquire = [&](int j) {
      bool good = true;
      const int npeer = W - 1;
      for (int idx = threadIdx.x; good && idx < ncov * npeer; idx += kCtl) {
        const int c = q + (idx / npeer) * C;
        const int s = (r + 1 + idx % npeer) % W;
        if (c + static_cast<int64_t>(j) * P < nch(seg(s))) {
          good = comm_wait_flag_inline(d, &mine->pipe[s][c], pipe_tag(epoch, j + 1),
                                       static_cast<uint32_t>(op), kCommStepChunk, s);
        }
      }
      return __all_sync(0xffffffffu, good);
    };
    auto work = [&](int j) {
      for (int ci = 0; ci < ncov; ++ci) {
        const int64_t k = q + ci * C + static_cast<int64_t>(j) * P, b = k * chunk;
        if constexpr (kDirect) {
          // This rank's block, chunk k: the sum (rank order) of its own input there and the
          // peers' blocks in the slots, into every rank's data area at the same place. The
          // own input is overwritten by the thread that read it (pipe_reduce loads before it
          // stores); peer p's copy of this chunk was already pushed here (its chunk flag).
          if (k >= nch(n_r)) continue;
          const uint64_t pos = in_off + (off_r + b) * es;
          const uint8_t* own = d.base[r] + pos;
          const uint8_t* scr = d.base[r] + d.scratch_offset + b * es + slot_pad(r);
          pipe_reduce<T, NS>(
              d, W, [&](int s) { return s == r ? own : scr + slot(r, s) * es; },
              Dests{d.base[r] + pos, rank_order(peers, r), pos}, min(chunk, n_r - b));
        } else if constexpr (op == CommOp::kReduceScatter) {
          if (k >= nch(n_r)) continue;
          const uint8_t* own = d.base[r] + in_off + (off_r + b) * es;
          const uint8_t* scr = d.base[r] + d.scratch_offset + b * es + slot_pad(r);
          pipe_reduce<T, NS>(
              d, W, [&](int s) { return s == r ? own : scr + slot(r, s) * es; }, Dests{out + b * es, 0u, 0},
              min(chunk, n_r - b));
        } else {
          for (int i = 1; i < W; ++i) {
            const int s = (r + i) % W;
            if constexpr (op == CommOp::kAllToAll) {
              if (k >= nch(n_r)) continue;
              pipe_copy<T>(d, d.base[r] + d.scratch_offset + (slot(r, s) + b) * es + slot_pad(r),
                           Dests{out + (s * n_r + b) * es, 0u, 0}, min(chunk, n_r - b));
            } else {  // allReduce, allGather: slice s at its output position
              const int64_t n_s = split_count(count, W, s);
              if (k >= nch(n_s)) continue;
              const uint64_t pos = (split_offset(count, W, s) + b) * es;
              // push: the peer stored it into this rank's scratch; pipelined: pull it from the
              // peer's own scratch.
              pipe_copy<T>(d, d.base[push ? r : s] + d.scratch_offset + pos, Dests{out + pos, 0u, 0},
                           min(chunk, n_s - b));
            }
          }
        }
      }
    };
    ok = pipe_rounds(rounds, acquire, work, [](int) {});
  }

  if constexpr (push && !kDirect) {
    // No end barrier: every peer's reads of this rank's memory (allReduce's phase-1 loads of
    // the input) precede the chunk flags this rank's consumers have acquired (CommFlags::pipe).
    finish_launch(d, epoch);
    return;
  }
  // End barrier. Pipelined: peers read this rank's scratch. Direct: no peer reads this rank's
  // memory, but the peers' reducers store into its data area (the output); done[p] >= epoch
  // says all of p's CTAs, those stores included, are done.
  finish_with_end_barrier(d, epoch, op);
  (void)ok;
}

}  // namespace
}  // namespace fusedcomm::kernels
