// The ring attention's sync kernel (ring.h): one thread.
#include "kernels/attention/ring.h"
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
  bool ok = !comm_failed(d);
  if (ok && a.begin) comm_publish_signature(d, epoch);
  if (ok && a.publish != 0) {
    // The copy into our buffer and the copy out of pred's completed before this kernel began
    // (stream order); the fence and the release make them precede the flag for its readers.
    __threadfence_system();
    st_release_sys(&comm_flags(d, pred)->ring[d.rank], tag(a.publish));
    if (succ != pred) st_release_sys(&comm_flags(d, succ)->ring[d.rank], tag(a.publish));
  }
  if (ok && a.wait != 0) {
    const CommFlags* mine = comm_flags(d, d.rank);
    if (!a.finish) {
      ok = comm_wait_flag_inline(d, &mine->ring[pred], tag(a.wait), kRingOp, kRingStepBlock, pred,
                                 kRingTimeoutScale);
    }
    if (ok) {
      ok = comm_wait_flag_inline(d, &mine->ring[succ], tag(a.wait), kRingOp,
                                 a.finish ? kCommStepDone : kRingStepBlock, succ, kRingTimeoutScale);
    }
  }
  if (a.finish) *reinterpret_cast<volatile uint64_t*>(&comm_control(d)->epoch) = epoch;
}

}  // namespace

cudaError_t launch_ring_sync(const CommDevice& dev, const RingSyncArgs& args, cudaStream_t stream) {
  if (dev.world < 2 || dev.world > kCommMaxRanks) return cudaErrorInvalidValue;
  CommDevice d = dev;
  d.launch_sig = comm_launch_signature(kRingOp, static_cast<uint32_t>(CommDtype::kBF16), 0, args.sig_size);
  ring_sync_kernel<<<1, 32, 0, stream>>>(d, args);
  return cudaGetLastError();
}

}  // namespace fusedcomm::kernels
