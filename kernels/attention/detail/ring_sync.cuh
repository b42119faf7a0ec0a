// Device side of the ring attention's protocol (ring.h, ring_fwd.h), shared by the step
// pipeline's sync kernel and the persistent forward kernel.
#pragma once

#include "kernels/attention/ring.h"
#include "kernels/common/comm_protocol.cuh"

namespace fusedcomm::kernels::detail {

// After this rank's wait timed out (the record claimed by this rank's ring waiters: the sync
// kernel, or a CTA of the persistent kernel; several CTAs that time out write the same): if some rank has not started this launch at all (its start
// tag, which every rank sends to every peer, is missing), name it in the record instead of
// the neighbour, which may only be stuck behind it. The host reads the record after the op's
// stream has finished, so these later stores are complete by then.
__device__ __forceinline__ void ring_name_absent_rank(const CommDevice& d, uint64_t start_tag) {
  volatile CommErrorRecord* e = d.error;
  if (e->code != kGemmWaitTimeout || e->rank != static_cast<uint32_t>(d.rank)) return;
  const CommFlags* mine = comm_flags(d, d.rank);
  for (int i = 1; i < d.world; ++i) {
    const int p = (d.rank + i) % d.world;
    const uint64_t v = ld_acquire_sys(&mine->ring[p]);
    if (v < start_tag) {
      e->peer = static_cast<uint32_t>(p);
      e->step = kCommStepArrive;
      e->epoch = start_tag;
      e->observed = v;
      __threadfence_system();
      return;
    }
  }
}

}  // namespace fusedcomm::kernels::detail
