// launch_collective (collectives.h): argument checks, the algorithm (select.cu), the grid and
// chunk of the chosen kernel family, and the launch. The kernels: detail/one_shot.cuh,
// detail/two_phase.cuh, detail/pipelined.cuh (all instantiated in this translation unit).
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>

#include "kernels/collectives/collectives.h"
#include "kernels/collectives/detail/collective_kernel.cuh"
#include "kernels/collectives/detail/one_shot.cuh"
#include "kernels/collectives/detail/pipelined.cuh"
#include "kernels/collectives/detail/select.h"
#include "kernels/collectives/detail/two_phase.cuh"
#include "kernels/collectives/detail/two_shot.cuh"
#include "kernels/collectives/tuning.h"
#include "kernels/common/early_launch.h"

namespace fusedcomm::kernels {
namespace {

// Every collective kernel starts through here: launched early (early_launch.h),
// tuning::kCollectiveThreads threads each.
template <class Kernel>
cudaError_t start_kernel(Kernel kernel, int grid, cudaStream_t stream, const CommDevice& d,
                         const Params& prm) {
  return launch_early(kernel, dim3(grid), dim3(tuning::kCollectiveThreads), 0, stream, d, prm);
}

template <typename T, CommOp kOp, bool kPush, bool kDirect = false>
cudaError_t launch_pipe_ns(const CommDevice& d, const Params& prm, int grid, cudaStream_t stream) {
  if (d.world <= 2) { return start_kernel(pipe_kernel<T, kOp, kPush, 2, kDirect>, grid, stream, d, prm); }
  if (d.world <= 4) { return start_kernel(pipe_kernel<T, kOp, kPush, 4, kDirect>, grid, stream, d, prm); }
  return start_kernel(pipe_kernel<T, kOp, kPush, 8, kDirect>, grid, stream, d, prm);
}
template <typename T>
cudaError_t launch_pipe(const CommDevice& d, const Params& prm, int grid, cudaStream_t stream) {
  const bool push = prm.a.algo == CommAlgo::kTwoPhasePush;
  if (prm.a.algo == CommAlgo::kDirect) {
    return launch_pipe_ns<T, CommOp::kAllReduce, true, true>(d, prm, grid, stream);
  }
  switch (prm.a.op) {
    case CommOp::kAllReduce:
      return push ? launch_pipe_ns<T, CommOp::kAllReduce, true>(d, prm, grid, stream)
                  : launch_pipe_ns<T, CommOp::kAllReduce, false>(d, prm, grid, stream);
    case CommOp::kReduceScatter: return launch_pipe_ns<T, CommOp::kReduceScatter, true>(d, prm, grid, stream);
    case CommOp::kAllGather:
      return start_kernel(pipe_kernel<T, CommOp::kAllGather, true, 1>, grid, stream, d, prm);
    case CommOp::kAllToAll:
      return start_kernel(pipe_kernel<T, CommOp::kAllToAll, true, 1>, grid, stream, d, prm);
  }
  return cudaErrorInvalidValue;
}

}  // namespace

cudaError_t launch_collective(const CommDevice& dev, const CollectiveArgs& a, cudaStream_t stream) {
  CommDevice d = dev;  // the kernel's copy, with this launch's signature (below)
  if (d.world < 1 || d.world > kCommMaxRanks || d.rank < 0 || d.rank >= d.world) {
    return cudaErrorInvalidValue;
  }
  for (int p = 0; p < d.world; ++p) {
    if (d.base[p] == nullptr) return cudaErrorInvalidValue;
  }
  if (d.error == nullptr || a.count < 0 || d.slot_bytes % 16 != 0) return cudaErrorInvalidValue;
  const int64_t es = elem_size(a.dtype);
  const int64_t in_bytes = collective_input_count(a.op, a.count, d.world, d.rank) * es;
  if (a.input == nullptr && a.in_offset + static_cast<uint64_t>(in_bytes) > d.data_bytes) {
    return cudaErrorInvalidValue;
  }
  if (collective_output_count(a.op, a.count, d.world, d.rank) > 0 && a.output == nullptr) {
    return cudaErrorInvalidValue;
  }
  CommAlgo algo = collective_choose_algo(d, a);
  // kPipelined and kTwoShot only change allReduce (the only op with two phases).
  if ((algo == CommAlgo::kPipelined || algo == CommAlgo::kTwoShot) && a.op != CommOp::kAllReduce) {
    algo = CommAlgo::kTwoPhase;
  }
  if (a.input != nullptr && algo != CommAlgo::kOneShot) return cudaErrorInvalidValue;
  if (algo == CommAlgo::kDirect && (a.op != CommOp::kAllReduce || !in_place(d, a))) {
    return cudaErrorInvalidValue;
  }
  if (a.out_bf16 && (a.op != CommOp::kReduceScatter || a.dtype != CommDtype::kF32 ||
                     (algo != CommAlgo::kOneShot && algo != CommAlgo::kTwoPhase))) {
    return cudaErrorInvalidValue;
  }
  if (d.launch_sig == 0) {
    const uint32_t sig_algo =
        algo == CommAlgo::kTwoShot && in_place(d, a) ? kSigAlgoTwoShotInPlace : static_cast<uint32_t>(algo);
    d.launch_sig = comm_launch_signature(static_cast<uint32_t>(a.op), static_cast<uint32_t>(a.dtype),
                                         sig_algo, static_cast<uint64_t>(a.count));
  }
  const int sms = d.sm_count > 0 ? d.sm_count : 1;
  Params prm{a, 0, 0};
  if (algo == CommAlgo::kOneShot) {
    // The kernel reads its input through prm.a.input: the caller's, or its data-area slice.
    if (a.input == nullptr) prm.a.input = d.base[d.rank] + d.data_offset + a.in_offset;
    const int64_t payload = one_shot_payload(a, d.world);
    if (d.world > 1 && payload > static_cast<int64_t>(d.slot_bytes)) return cudaErrorInvalidValue;
    // tuning::kOneShotBytesPerCta per CTA and peer.
    const int64_t pushed = payload * std::max(1, d.world - 1);
    const int64_t per_cta = tuning::kOneShotBytesPerCta;
    int grid =
        a.num_ctas > 0
            ? a.num_ctas
            : static_cast<int>(std::min<int64_t>((pushed + per_cta - 1) / per_cta, kCommMaxOneShotCtas));
    grid = std::clamp(grid, 1, std::min(kCommMaxOneShotCtas, sms));
    if (a.dtype == CommDtype::kBF16) {
      return start_kernel(one_shot_kernel<__nv_bfloat16>, grid, stream, d, prm);
    }
    if (a.out_bf16) { return start_kernel(one_shot_kernel<float, __nv_bfloat16>, grid, stream, d, prm); }
    return start_kernel(one_shot_kernel<float>, grid, stream, d, prm);
  } else if (algo == CommAlgo::kTwoPhase) {
    const int64_t bytes = two_phase_bytes(a, d.world, d.rank);
    int64_t chunk_bytes = 8 << 10;
    while (chunk_bytes < tuning::kTwoPhaseMaxChunkBytes && chunk_bytes * 2 * sms * 2 <= bytes) {
      chunk_bytes *= 2;
    }
    prm.chunk = chunk_bytes / es;
    const int64_t items = std::max<int64_t>(1, bytes / chunk_bytes);
    // Every CTA must be resident (the allReduce grid barrier): at most kTwoPhaseCtasPerSm per
    // SM, which the kernel's launch bounds guarantee.
    const int max_grid = sms * tuning::kTwoPhaseCtasPerSm;
    int grid;
    if (a.num_ctas > 0) {
      grid = std::clamp(a.num_ctas, 1, max_grid);
      prm.pull_ctas = grid;
    } else {
      // CTAs that read peers: few enough not to congest NVLink (tuning.h), at most one per work
      // item. allGather / allToAll add CTAs for the local segment (a local copy
      // is several times faster per CTA than a pull, and its segment is 1/(W-1) of the rest).
      int pull = two_phase_pull_ctas(d.world);
      pull = static_cast<int>(std::clamp<int64_t>(std::min<int64_t>(items, pull), 1, max_grid));
      int local = 0;
      if (a.op == CommOp::kAllGather || a.op == CommOp::kAllToAll) {
        local = std::max(1, pull / (2 * std::max(1, d.world - 1)));
        local = std::min(local, max_grid - pull);
      }
      grid = pull + local;
      prm.pull_ctas = pull;
    }
    if (a.dtype == CommDtype::kBF16) {
      return start_kernel(two_phase_kernel<__nv_bfloat16>, grid, stream, d, prm);
    }
    if (a.out_bf16) { return start_kernel(two_phase_kernel<float, __nv_bfloat16>, grid, stream, d, prm); }
    return start_kernel(two_phase_kernel<float>, grid, stream, d, prm);
  } else if (algo == CommAlgo::kTwoShot) {
    prm.in_place = in_place(d, a);
    // Every CTA resident (its handshakes wait for the peers' same CTA, and theirs for it).
    const int grid = two_shot_ctas(d, a);
    if (grid > sms) return cudaErrorInvalidValue;
    if (a.dtype == CommDtype::kBF16) {
      if (d.world <= 2) return start_kernel(two_shot_kernel<__nv_bfloat16, 2>, grid, stream, d, prm);
      if (d.world <= 4) return start_kernel(two_shot_kernel<__nv_bfloat16, 4>, grid, stream, d, prm);
      return start_kernel(two_shot_kernel<__nv_bfloat16, 8>, grid, stream, d, prm);
    }
    if (d.world <= 2) return start_kernel(two_shot_kernel<float, 2>, grid, stream, d, prm);
    if (d.world <= 4) return start_kernel(two_shot_kernel<float, 4>, grid, stream, d, prm);
    return start_kernel(two_shot_kernel<float, 8>, grid, stream, d, prm);
  } else if (algo == CommAlgo::kTwoPhasePush || algo == CommAlgo::kPipelined || algo == CommAlgo::kDirect) {
    CollectiveArgs planned = a;
    // kAuto's push: kAutoPushChunkBytes; its direct: the default chunk (64 KiB: faster than
    // 128 KiB at 64 and 256 MiB, equal at 1 GiB).
    if (a.algo == CommAlgo::kAuto && a.chunk_bytes == 0 && algo != CommAlgo::kDirect) {
      planned.chunk_bytes = tuning::kAutoPushChunkBytes;
    }
    PipePlan plan;
    if (!pipe_plan(d, planned, algo, &plan)) return cudaErrorInvalidValue;
    prm.chunk = plan.chunk;
    prm.pull_ctas = plan.producers;
    prm.consumers = plan.consumers;
    prm.slot_stride = plan.slot_stride;
    prm.a.algo = algo;  // launch_pipe picks the kernel from it (kAuto may resolve to these)
    const int grid = prm.pull_ctas + prm.consumers;
    return a.dtype == CommDtype::kBF16 ? launch_pipe<__nv_bfloat16>(d, prm, grid, stream)
                                       : launch_pipe<float>(d, prm, grid, stream);
  }
  return cudaErrorInvalidValue;
}

namespace {
__global__ void comm_fail_if_kernel(CommDevice d, const uint32_t* word, uint32_t code) {
  const uint32_t w = *reinterpret_cast<const volatile uint32_t*>(word);
  detail::comm_epoch_slot() = 0;  // read by the record (its launch signature): no launch here
  if (w != 0) detail::comm_record_failure(d, code, 0, w, 0, 0, 0, d.rank);
}
}  // namespace

cudaError_t launch_comm_fail_if(const CommDevice& dev, const uint32_t* word, uint32_t code,
                                cudaStream_t stream) {
  if (word == nullptr || code == 0) return cudaErrorInvalidValue;
  comm_fail_if_kernel<<<1, 1, 0, stream>>>(dev, word, code);
  return cudaGetLastError();
}

}  // namespace fusedcomm::kernels
