// The fused gemmReduceScatter's wait counters, a bench build's only (-DFUSEDCOMM_RS_TRACE:
// fused_gemm.cuh accumulates them, fused.cu's rs_trace_take copies them out, fused_bench
// prints them per shape). Other builds compile the counting to nothing.
#pragma once

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
