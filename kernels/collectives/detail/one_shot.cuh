// The one-shot collectives (CommAlgo::kOneShot): every CTA pushes its part into every peer's
// staging slot, raises one flag per (source, CTA), then reduces or copies from local staging.
// Included by collectives.cu only, inside its anonymous namespace: the kernels keep internal
// linkage (and their symbols) in that translation unit.
#pragma once

#include "kernels/collectives/detail/collective_kernel.cuh"

namespace fusedcomm::kernels {
namespace {

// ---- one-shot: push, one flag per (source, CTA), reduce/copy from local staging -------------
// Out: the reductions' output type (T, or bf16 for fp32 reduceScatter with out_bf16).
// (__launch_bounds__(threads, 1) asks for one resident CTA per SM, which lets ptxas use the
// registers it needs; with the thread count alone it held the bf16 instance to 64 and spilled.)
template <typename T, typename Out = T>
__global__ void __launch_bounds__(tuning::kCollectiveThreads, 1) one_shot_kernel(CommDevice d, Params prm) {
  const CollectiveArgs& a = prm.a;
  constexpr int kEpv = kVecBytes / sizeof(T);
  constexpr int kPre = tuning::kOneShotCopyUnroll;
  const int W = d.world, r = d.rank, G = gridDim.x, c = blockIdx.x, nt = blockDim.x;
  const T* in = static_cast<const T*>(a.input);  // the launcher sets it (data area or not)
  T* out = static_cast<T*>(a.output);
  const int64_t count = a.count;
  const int64_t n_r = split_count(count, W, r);
  int64_t b, e;
  // allReduce and allGather push the same part of the input to every peer. Where it is on the
  // 16-byte grid and fits kPre vectors per thread, it is loaded into registers before the
  // launch's epoch, so that the two loads' latencies overlap (the input is read only after
  // pdl_wait, as every global access).
  const bool same_part = (a.op == CommOp::kAllReduce || a.op == CommOp::kAllGather) && W > 1;
  int64_t pb = 0, pe = 0;
  if (same_part) part_range(a.op == CommOp::kAllReduce ? count : n_r, G, c, kEpv, pb, pe);
  const int64_t pnv = (pe - pb) / kEpv;
  const bool pre = same_part && aligned16(in + pb) && pnv <= int64_t{kPre} * nt;
  uint4 v[kPre];
  pdl_wait();
  if (pre) {
#pragma unroll
    for (int u = 0; u < kPre; ++u) {
      const int64_t i = threadIdx.x + int64_t{u} * nt;
      if (i < pnv) v[u] = ld_vec(reinterpret_cast<const uint4*>(in + pb) + i);
    }
  }
  uint32_t arrived = 0;
  const uint64_t epoch = enter_collective_counted(d, &arrived);
  if (epoch == 0) return;  // this rank has given up (enter_collective_counted)
  const uint64_t par = epoch & 1;
  // CTA 0's ready flags are its first releases: its thread 0 publishes the signature first.
  if (c == 0 && threadIdx.x == 0) comm_publish_signature(d, epoch);

  // 1. Push this CTA's part to every peer's slot [par][r].
  for (int i = 1; i < W; ++i) {
    const int p = (r + i) % W;
    T* dst = slot_of<T>(d, p, par, r);
    if (pre) {  // the vectors from registers (the slot is on the grid: pb is a whole vector),
                // then the part's last elements (< a vector) one by one
#pragma unroll
      for (int u = 0; u < kPre; ++u) {
        const int64_t j = threadIdx.x + int64_t{u} * nt;
        if (j < pnv) reinterpret_cast<uint4*>(dst + pb)[j] = v[u];
      }
      using Raw = typename Elem<T>::Raw;
      for (int64_t j = pb + pnv * kEpv + threadIdx.x; j < pe; j += nt) {
        reinterpret_cast<Raw*>(dst)[j] = __ldcg(reinterpret_cast<const Raw*>(in) + j);
      }
      continue;
    }
    switch (a.op) {
      case CommOp::kAllReduce:
        part_range(count, G, c, kEpv, b, e);
        cta_copy<T, tuning::kOneShotCopyUnroll>(dst + b, in + b, e - b);
        break;
      case CommOp::kAllGather:
        part_range(n_r, G, c, kEpv, b, e);
        cta_copy<T, tuning::kOneShotCopyUnroll>(dst + b, in + b, e - b);
        break;
      case CommOp::kReduceScatter:
      case CommOp::kAllToAll: {
        const int64_t n_p = split_count(count, W, p);
        part_range(n_p, G, c, kEpv, b, e);
        cta_copy<T, tuning::kOneShotCopyUnroll>(dst + b, in + split_offset(count, W, p) + b, e - b);
        break;
      }
    }
  }
  // Local parts that need no peer.
  if (a.op == CommOp::kAllGather) {
    part_range(n_r, G, c, kEpv, b, e);
    cta_copy<T, tuning::kOneShotCopyUnroll>(out + split_offset(count, W, r) + b, in + b, e - b);
  } else if (a.op == CommOp::kAllToAll) {
    part_range(n_r, G, c, kEpv, b, e);
    cta_copy<T, tuning::kOneShotCopyUnroll>(out + r * n_r + b, in + split_offset(count, W, r) + b, e - b);
  }
  // 2. Publish: flags ready[r][c] in every peer (ordering: CommFlags::ready). Alone (W = 1)
  // there is no peer to publish to, and the system fence would only cost time.
  if (W > 1) {
    publish_to_peers(
        d, [&](CommFlags* f) { return &f->ready[r][c]; }, epoch);
  }
  // 3. Wait for every peer's CTA c, then combine from local staging.
  __shared__ int s_ok;
  if (threadIdx.x == 0) {
    s_ok = wait_peers_checked(d, &comm_flags(d, r)->ready[0][c], kCommMaxOneShotCtas, epoch, epoch, a.op,
                              kCommStepReady, c == 0);
  }
  __syncthreads();
  const bool ok = s_ok != 0;
  if (ok) {
    switch (a.op) {
      case CommOp::kAllReduce:
      case CommOp::kReduceScatter: {
        const bool ar = a.op == CommOp::kAllReduce;
        const int64_t n = ar ? count : n_r;
        part_range(n, G, c, kEpv, b, e);
        const T* srcs[kCommMaxRanks];
        for (int p = 0; p < W; ++p) {
          srcs[p] = (p == r ? (ar ? in : in + split_offset(count, W, r)) : slot_of<T>(d, r, par, p)) + b;
        }
        cta_reduce_small<T, Out>(static_cast<Out*>(a.output) + b, nullptr, srcs, W, e - b);
        break;
      }
      case CommOp::kAllGather:
        for (int p = 0; p < W; ++p) {
          if (p == r) continue;
          part_range(split_count(count, W, p), G, c, kEpv, b, e);
          cta_copy<T, tuning::kOneShotCopyUnroll>(out + split_offset(count, W, p) + b,
                                                  slot_of<T>(d, r, par, p) + b, e - b);
        }
        break;
      case CommOp::kAllToAll:
        part_range(n_r, G, c, kEpv, b, e);
        for (int p = 0; p < W; ++p) {
          if (p == r) continue;
          cta_copy<T, tuning::kOneShotCopyUnroll>(out + p * n_r + b, slot_of<T>(d, r, par, p) + b, e - b);
        }
        break;
    }
  }
  finish_counted(d, epoch, arrived);
}

}  // namespace
}  // namespace fusedcomm::kernels
