// The ring attention's sync kernel (ring.h): one thread.
#include "kernels/attention/ring.h"
#include "kernels/attention/detail/ring_sync.cuh"
#include "kernels/common/comm_protocol.cuh"

namespace fusedcomm::kernels {
namespace {

__global__ void ring_sync_kernel(CommDevice d, RingSyncArgs a) {
  using namespace detail;
  const uint64_t epoch = comm_launch_epoch(d);  // CommControl::epoch + 1, bumped by `finish` only
  if (threadIdx.x != 0) return;
  const int pred = (d.rank + d.world - 1) % d.world, succ = (d.rank + 1) % d.world;
  auto tag = [&](uint32_t j) { return (epoch << kCommPipeRoundBits) | j; };
  // After a failure of this rank nothing is published (a neighbour must not take a block that
  // never came) and nothing awaited (every wait would give up at once anyway).
  const bool failed_before = comm_failed(d);
  bool ok = !failed_before;
  if (ok && a.begin) comm_publish_signature(d, epoch);
  if (ok && a.publish != 0) {
    // The copy into our buffer and the copy out of pred's completed before this kernel began
    // (stream order); the fence and the release make them precede the flag for its readers.
    // The start tag (publish 1, with `begin`) goes to every peer: a timed-out wait then names
    // a rank that never started the launch (ring_name_absent_rank).
    __threadfence_system();
    for (int i = 1; i < d.world; ++i) {
      const int p = (d.rank + i) % d.world;
      if (p == pred || p == succ || a.begin) st_release_sys(&comm_flags(d, p)->ring[d.rank], tag(a.publish));
    }
  }
  const uint32_t wait_pred = a.finish ? 0 : (a.wait_pred != 0 ? a.wait_pred : a.wait);
  const uint32_t wait_succ = a.wait_succ != 0 ? a.wait_succ : a.wait;
  if (ok && (wait_pred != 0 || wait_succ != 0)) {
    const CommFlags* mine = comm_flags(d, d.rank);
    if (wait_pred != 0) {
      ok = comm_wait_flag_inline(d, &mine->ring[pred], tag(wait_pred), a.op, kRingStepBlock, pred,
                                 kRingTimeoutScale);
    }
    if (ok && wait_succ != 0) {
      ok = comm_wait_flag_inline(d, &mine->ring[succ], tag(wait_succ), a.op,
                                 a.finish ? kCommStepDone : kRingStepBlock, succ, kRingTimeoutScale);
    }
  }
  if (!ok && !failed_before) ring_name_absent_rank(d, tag(1));  // this kernel's wait gave up
  if (a.finish) *reinterpret_cast<volatile uint64_t*>(&comm_control(d)->epoch) = epoch;
}

}  // namespace

cudaError_t launch_ring_sync(const CommDevice& dev, const RingSyncArgs& args, cudaStream_t stream) {
  if (dev.world < 2 || dev.world > kCommMaxRanks) return cudaErrorInvalidValue;
  if (args.op != kRingOp && args.op != kRingBwdOp) return cudaErrorInvalidValue;
  CommDevice d = dev;
  d.launch_sig = comm_launch_signature(args.op, static_cast<uint32_t>(CommDtype::kBF16), 0, args.sig_size);
  ring_sync_kernel<<<1, 32, 0, stream>>>(d, args);
  return cudaGetLastError();
}

}  // namespace fusedcomm::kernels
