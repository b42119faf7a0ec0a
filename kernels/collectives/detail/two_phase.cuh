// The two-phase collectives (CommAlgo::kTwoPhase): start barrier, pulls from the peers' data
// areas (allReduce: reduce-scatter, grid barrier, all-gather), end barrier.
// Included by collectives.cu only, inside its anonymous namespace: the kernels keep internal
// linkage (and their symbols) in that translation unit.
#pragma once

#include "kernels/collectives/detail/collective_kernel.cuh"

namespace fusedcomm::kernels {
namespace {

// ---- two-phase: start barrier, pull (allReduce: reduce-scatter, grid barrier, all-gather),
// end barrier --------------------------------------------------------------------------------

// Work items: the W-1 peers' segments, interleaved chunk by chunk (item k reads peer
// (r + 1 + k % (W-1)) % W, so at any moment the pulling CTAs read from all peers), and, unless
// skip_self, this rank's own segment (local copies). With pull_ctas < gridDim.x, CTAs
// [0, pull_ctas) take the remote items and the others the local ones, concurrently (fewer
// CTAs pulling over NVLink was faster on 4 x H200: too many reads in flight congest the links);
// otherwise every CTA takes remote items first, then local ones.
// Segment p's chunks are cut on the 16-byte grid of its destination: chunk c is
// [c * chunk - lead(p), (c + 1) * chunk - lead(p)) clipped to the segment, lead(p) the elements
// the destination's start sits past the grid (< a vector). Only a segment's first and last
// chunks then have elements outside 16-byte vectors: a head or tail in every chunk costs its
// threads one more NVLink round trip per chunk, as much as the chunk's vectors.
__device__ __forceinline__ int64_t chunk_count(int64_t len, int64_t lead, int64_t chunk) {
  return len > 0 ? (len + lead + chunk - 1) / chunk : 0;
}
// Calls f(p, elem_begin, elem_end) for each item of this CTA.
template <typename SegLen, typename Lead, typename F>
__device__ void for_interleaved_chunks(int W, int r, int64_t chunk, SegLen seg_len, Lead lead, F f,
                                       bool skip_self, int pull_ctas) {
  int64_t max_chunks = 0;
  for (int p = 0; p < W; ++p) {
    if (p != r) max_chunks = max(max_chunks, chunk_count(seg_len(p), lead(p), chunk));
  }
  const int nseg = W - 1;
  const int64_t remote_items = max_chunks * nseg;
  const int64_t self_items = skip_self ? 0 : chunk_count(seg_len(r), lead(r), chunk);
  const int G = gridDim.x, c = blockIdx.x;
  const bool split = pull_ctas < G;
  int64_t k0, k1, step;
  if (!split) {
    k0 = c, k1 = remote_items + self_items, step = G;
  } else if (c < pull_ctas) {
    k0 = c, k1 = remote_items, step = pull_ctas;
  } else {
    k0 = remote_items + (c - pull_ctas), k1 = remote_items + self_items, step = G - pull_ctas;
  }
  for (int64_t k = k0; k < k1; k += step) {
    int p;
    int64_t c;
    if (k < remote_items) {
      p = (r + 1 + static_cast<int>(k % nseg)) % W;
      c = k / nseg;
    } else {
      p = r;
      c = k - remote_items;
    }
    const int64_t n = seg_len(p), l = lead(p);
    const int64_t b = max(int64_t{0}, c * chunk - l), e = min(n, (c + 1) * chunk - l);
    if (b >= e) continue;
    f(p, b, e);
  }
}

// Resident by the launch bounds: tuning::kTwoPhaseCtasPerSm per SM.
template <typename T, typename Out = T>  // Out: as one_shot_kernel
__global__ void __launch_bounds__(tuning::kCollectiveThreads, tuning::kTwoPhaseCtasPerSm)
    two_phase_kernel(CommDevice d, Params prm) {
  const CollectiveArgs& a = prm.a;
  const uint64_t epoch = enter_collective(d);
  if (epoch == 0) return;  // this rank has given up (enter_collective)
  const int W = d.world, r = d.rank;
  const int64_t count = a.count, chunk = prm.chunk;
  T* out = static_cast<T*>(a.output);
  CommFlags* mine = comm_flags(d, r);

  // Start barrier (ordering: CommFlags::arrive). Stream order makes this rank's input, written
  // by earlier work on the stream, precede the kernel; the fence publishes it at system scope.
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    comm_publish_signature(d, epoch);
    __threadfence_system();
    comm_signal_peers(
        d, [&](CommFlags* f) { return &f->arrive[r]; }, epoch);
  }
  bool ok = comm_wait_peers(d, mine->arrive, 1, epoch, a.op, kCommStepArrive, blockIdx.x == 0);

  const int64_t n_r = split_count(count, W, r);
  // Elements a destination starts past the 16-byte grid (for_interleaved_chunks).
  auto lead_of = [](const void* p) {
    return static_cast<int64_t>((reinterpret_cast<uintptr_t>(p) & 15) / sizeof(T));
  };
  if (ok) {
    switch (a.op) {
      case CommOp::kAllGather:
        for_interleaved_chunks(
            W, r, chunk, [&](int p) { return split_count(count, W, p); },
            [&](int p) { return lead_of(out + split_offset(count, W, p)); },
            [&](int p, int64_t b, int64_t e) {
              cta_copy<T>(out + split_offset(count, W, p) + b, data_of<T>(d, a, p) + b, e - b);
            },
            false, prm.pull_ctas);
        break;
      case CommOp::kAllToAll:
        for_interleaved_chunks(
            W, r, chunk, [&](int) { return n_r; }, [&](int p) { return lead_of(out + p * n_r); },
            [&](int p, int64_t b, int64_t e) {
              cta_copy<T>(out + p * n_r + b, data_of<T>(d, a, p) + split_offset(count, W, r) + b, e - b);
            },
            false, prm.pull_ctas);
        break;
      case CommOp::kReduceScatter:
      case CommOp::kAllReduce: {
        const bool ar = a.op == CommOp::kAllReduce;
        const int64_t off_r = split_offset(count, W, r);
        T* scratch_r = reinterpret_cast<T*>(d.base[r] + d.scratch_offset) + off_r;
        Out* dst = static_cast<Out*>(a.output) + (ar ? off_r : 0);
        // Chunks on dst's 16-byte grid (for_interleaved_chunks), for Out's vectors.
        const int64_t lead = static_cast<int64_t>((reinterpret_cast<uintptr_t>(dst) & 15) / sizeof(Out));
        const int64_t items = chunk_count(n_r, lead, chunk);
        for (int64_t c = blockIdx.x; c < items; c += gridDim.x) {
          const int64_t b = max(int64_t{0}, c * chunk - lead), e = min(n_r, (c + 1) * chunk - lead);
          const T* srcs[kCommMaxRanks];
          for (int p = 0; p < W; ++p) srcs[p] = data_of<T>(d, a, p) + off_r + b;
          cta_reduce<T, tuning::kTwoPhaseRedUnroll, Out>(dst + b, ar ? scratch_r + b : nullptr, srcs, W,
                                                         e - b);
        }
        if (!ar) break;
        // Grid barrier + publish (ordering: CommFlags::phase).
        comm_publish_fence();
        if (threadIdx.x == 0 && comm_last_cta(&comm_control(d)->phase_count)) {
          comm_signal_peers(
              d, [&](CommFlags* f) { return &f->phase[r]; }, epoch);
        }
        ok = comm_wait_peers(d, mine->phase, 1, epoch, a.op, kCommStepPhase);
        if (!ok) break;
        for_interleaved_chunks(
            W, r, chunk, [&](int p) { return split_count(count, W, p); },
            [&](int p) { return lead_of(out + split_offset(count, W, p)); },
            [&](int p, int64_t b, int64_t e) {
              const int64_t off_p = split_offset(count, W, p);
              const T* src = reinterpret_cast<const T*>(d.base[p] + d.scratch_offset) + off_p;
              cta_copy(out + off_p + b, src + b, e - b);
            },
            true, prm.pull_ctas);
        break;
      }
    }
  }
  finish_with_end_barrier(d, epoch, a.op);
}

}  // namespace
}  // namespace fusedcomm::kernels
