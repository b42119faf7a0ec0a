// The fused gemmReduceScatter's wait counters, a bench and test build's only
// (-DFUSEDCOMM_RS_TRACE: fused_gemm.cuh accumulates them, rs_trace_take copies them out;
// fused_bench prints them per shape, gpu_fused_test its early fetches). Other builds compile
// the counting to nothing.
#pragma once

#include <cuda_runtime.h>

namespace fusedcomm::kernels::detail {

// Where the fused kernel's threads wait during one launch, in SM cycles (clock64), summed (or the
// largest) over the launch's CTAs. Every other build compiles these calls to nothing.
enum RsTraceWord : int {
  kRtHandoffWait,    // consumer thread 0, before staging a push: the previous handoff's freed
  kRtHandoffWaits,   //   how many of those waits took > 2,000 cycles
  kRtOwnFreedWait,   // consumer thread 0, own half-tile: the last handoff freed
  kRtOwnWait,        // consumer thread 0, own half-tile: the peers' flags (wait_sources)
  kRtOwnTiles,       //   own half-tiles summed
  kRtOwnWaits,       //   how many of those waits took > 2,000 cycles
  kRtOwnWaitMax,     //   the longest
  kRtOwnFetched,     //   own half-tiles whose partial was fetched early (RsParams::prefetch)
  kRtStartWait,      // pusher lane 0: observe_start (a peer's arrive flag)
  kRtStores,         // pusher lane 0: issuing one handoff's stores (send_rows)
  kRtFenceFlags,     // pusher lane 0: the fence and the flags after a half-tile's last handoff
  kRtHandoffs,       //   handoffs pushed
  kRtFinishMax,      // thread 128 of each CTA: fused_finish (the last CTA waits for the peers)
  kRtStartNs,        // CTA 0's start (%globaltimer, ns)
  kRtEndNs,          // the latest CTA end (%globaltimer, ns)
  kRsTraceWords
};

}  // namespace fusedcomm::kernels::detail

#ifdef FUSEDCOMM_RS_TRACE
namespace fusedcomm::kernels {
// The counters (`words` must be detail::kRsTraceWords), copied out and then zeroed,
// stream-ordered: `out` holds them once `stream` has reached this point (kernels/src/fused.cu).
cudaError_t rs_trace_take(unsigned long long* out, int words, cudaStream_t stream);
}  // namespace fusedcomm::kernels
#endif
