// The two-shot allReduce (CommAlgo::kTwoShot): CTA c of every rank meets CTA c of every peer
// (no grid barrier), reduces its part of this rank's slice by reading it from every rank's data
// area, stores the sums into every rank (in place: their data areas; else their scratch, copied
// to the output after the end handshake), then meets the same peers' CTAs again.
// Included by collectives.cu only, inside its anonymous namespace: the kernels keep internal
// linkage (and their symbols) in that translation unit.
#pragma once

#include "kernels/collectives/detail/collective_kernel.cuh"

namespace fusedcomm::kernels {
namespace {

// The flag tags of a two-shot launch (CommFlags::pipe[p][c]; the chunk-pipelined variants' tag
// layout, rounds 1 and 2): CTA c of rank p has started (its rank's input is ready, its previous
// launch has finished with this rank's memory), and CTA c of rank p has stored all its sums into
// this rank's memory and finished reading it.
__device__ __forceinline__ uint64_t two_shot_tag(uint64_t epoch, uint64_t step) {
  return (epoch << kCommPipeRoundBits) | step;
}

// This CTA's flag `step` into every peer, then (thread 0) the same CTA's flag of every peer
// awaited; all threads: false if a wait gave up. The start flag (step 1) is a relaxed store
// with no fence: what it promises is that this rank's kernel has started, so that (stream
// order, a kernel boundary) its input is complete in its memory and its previous launch has
// finished every access to the peers' memory, each of which preceded that launch's release of
// its end flag. Peers read that input through this GPU's memory system, which the completed
// kernels wrote. The end flag (step 2) is released after the CTA's stores into every rank
// (publish_to_peers); CTA 0's also follows its signature (check_signatures).
__device__ __forceinline__ bool two_shot_handshake(const CommDevice& d, uint64_t epoch, uint64_t step,
                                                   uint32_t cstep, bool check_signatures) {
  __shared__ int s_ok;
  const int r = d.rank, W = d.world, c = blockIdx.x;
  const uint64_t tag = two_shot_tag(epoch, step);
  if (step == 1) {
    if (threadIdx.x == 0) {
      for (int i = 1; i < W; ++i) st_relaxed_sys(&comm_flags(d, (r + i) % W)->pipe[r][c], tag);
    }
  } else {
    publish_to_peers(
        d, [&](CommFlags* f) { return &f->pipe[r][c]; }, tag);
  }
  if (threadIdx.x == 0) {
    s_ok = wait_peers_checked(d, &comm_flags(d, r)->pipe[0][c], kCommMaxPipeCtas, tag, epoch,
                              CommOp::kAllReduce, cstep, check_signatures);
  }
  __syncthreads();
  return s_ok != 0;
}

// Rank k's copy of the slice is at src[k]; the sums go to src[k] + delta elements (0 in place:
// the data areas; else the scratch areas, at the same distance from every rank's data area).

// Elements [b, e) of the slice one by one: sums of src[0..W) in rank order, into every rank.
template <typename T, int NS>
__device__ __forceinline__ void two_shot_elems(const T* const* src, int64_t delta, int W, int64_t b,
                                               int64_t e) {
  for (int64_t i = b + threadIdx.x; i < e; i += blockDim.x) {
    float acc = 0.f;
#pragma unroll
    for (int k = 0; k < NS; ++k)
      if (k < W) acc += Elem<T>::load(src[k] + i);
#pragma unroll
    for (int k = 0; k < NS; ++k)
      if (k < W) Elem<T>::store(const_cast<T*>(src[k]) + delta + i, acc);
  }
}

// Vectors [vb, ve) (the sources 16-byte aligned, delta a multiple of the vector):
// tuning::kTwoShotLoads vectors in flight per thread (over all sources), then the sums (fp32,
// rank order, rounded once) stored to every rank.
template <typename T, int NS>
__device__ __forceinline__ void two_shot_vecs(const T* const* src, int64_t delta, int W, int64_t vb,
                                              int64_t ve) {
  constexpr int kEpv = kVecBytes / sizeof(T);
  constexpr int U = tuning::kTwoShotLoads / NS > 0 ? tuning::kTwoShotLoads / NS : 1;
  const int nt = blockDim.x;
  const int64_t dv = delta / kEpv;
  const uint4* s[NS];
#pragma unroll
  for (int k = 0; k < NS; ++k) s[k] = reinterpret_cast<const uint4*>(src[k < W ? k : 0]);
  int64_t i = vb + threadIdx.x;
  for (; i + (U - 1) * nt < ve; i += U * nt) {
    uint4 v[U][NS];
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int k = 0; k < NS; ++k)
        if (k < W) v[u][k] = ld_vec(s[k] + i + u * nt);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const uint4 packed = sum_vecs<T, NS>(v[u], W);
#pragma unroll
      for (int k = 0; k < NS; ++k)
        if (k < W) const_cast<uint4*>(s[k])[dv + i + u * nt] = packed;
    }
  }
  for (; i < ve; i += nt) {
    uint4 v[NS];
#pragma unroll
    for (int k = 0; k < NS; ++k)
      if (k < W) v[k] = ld_vec(s[k] + i);
    const uint4 packed = sum_vecs<T, NS>(v, W);
#pragma unroll
    for (int k = 0; k < NS; ++k)
      if (k < W) const_cast<uint4*>(s[k])[dv + i] = packed;
  }
}

// CTA c's share of rank p's slice (n elements starting `head` elements before the 16-byte grid of
// every copy of it): the vectors part_range gives CTA c, plus the head (CTA 0) and the tail (the
// last CTA). One contiguous element range [*b, *e), and its vectors [*vb, *ve).
__device__ __forceinline__ void two_shot_share(int64_t n, int64_t head, int epv, int G, int c, int64_t* b,
                                               int64_t* e, int64_t* vb, int64_t* ve) {
  const int64_t nv = (n - head) / epv;
  part_range(nv, G, c, 1, *vb, *ve);
  *b = c == 0 ? 0 : head + *vb * epv;
  *e = c == G - 1 ? n : head + *ve * epv;
}

// NS: the world rounded up to 2, 4 or 8 (loads unrolled over it). The rank-uniform values that
// shape the work (count, world, grid, the data area's layout) make CTA c of every rank store
// into this rank exactly the share that CTA c of this rank copies out after the end handshake.
template <typename T, int NS>
__global__ void __launch_bounds__(tuning::kCollectiveThreads, 1) two_shot_kernel(CommDevice d, Params prm) {
  const CollectiveArgs& a = prm.a;
  constexpr int kEpv = kVecBytes / sizeof(T);
  uint32_t arrived = 0;
  const uint64_t epoch = enter_collective_counted(d, &arrived);
  if (epoch == 0) return;  // this rank has given up (enter_collective_counted)
  const int W = d.world, r = d.rank, G = gridDim.x, c = blockIdx.x;
  const bool in_place = prm.in_place;
  const int64_t count = a.count;
  // Thread 0 of CTA 0: the signature before its first flag (ordering: CommFlags::launch; its
  // end flag's release makes it visible to the peers' CTA 0, which check it there).
  if (threadIdx.x == 0 && c == 0) comm_publish_signature(d, epoch);
  bool ok = two_shot_handshake(d, epoch, 1, kCommStepArrive, false);
  if (ok) {
    const int64_t off_r = split_offset(count, W, r), n_r = split_count(count, W, r);
    const T* src[NS];
#pragma unroll
    for (int k = 0; k < NS; ++k) src[k] = data_of<T>(d, a, k < W ? k : 0) + off_r;
    const int64_t delta = in_place ? 0 : static_cast<int64_t>((d.scratch_offset - d.data_offset) / sizeof(T));
    // Every copy of the slice sits at one offset from the 16-byte grid (same layout everywhere;
    // data_offset and scratch_offset are 4 KiB aligned).
    const int64_t head = head_elems(src[0], n_r);
    int64_t b, e, vb, ve;
    two_shot_share(n_r, head, kEpv, G, c, &b, &e, &vb, &ve);
    if (c == 0) two_shot_elems<T, NS>(src, delta, W, 0, min(head, n_r));
    const T* vsrc[NS];
#pragma unroll
    for (int k = 0; k < NS; ++k) vsrc[k] = src[k] + head;
    two_shot_vecs<T, NS>(vsrc, delta, W, vb, ve);
    if (c == G - 1) two_shot_elems<T, NS>(src, delta, W, head + ((n_r - head) / kEpv) * kEpv, n_r);
    // End handshake: this CTA's stores into every rank (and its reads of them) are complete
    // before its flag (publish_to_peers: bar.sync, fence.acq_rel.sys, the stores); once every peer's
    // same CTA has said so, this rank's memory holds their shares.
    ok = two_shot_handshake(d, epoch, 2, kCommStepDone, c == 0);
    if (ok && !in_place) {
      T* out = static_cast<T*>(a.output);
      for (int p = 0; p < W; ++p) {
        const int64_t off_p = split_offset(count, W, p), n_p = split_count(count, W, p);
        const T* s = reinterpret_cast<const T*>(d.base[r] + d.scratch_offset + a.in_offset) + off_p;
        two_shot_share(n_p, head_elems(s, n_p), kEpv, G, c, &b, &e, &vb, &ve);
        cta_copy<T>(out + off_p + b, s + b, e - b);
      }
    }
  }
  finish_counted(d, epoch, arrived);
}

}  // namespace
}  // namespace fusedcomm::kernels
