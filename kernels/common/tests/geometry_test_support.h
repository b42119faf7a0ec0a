// What the host-only geometry tests of the fused ops and the collectives share: a CommDevice
// described by its world, rank and SM count alone (no memory: the *_info, *_sweep and choice
// functions read nothing else).
#pragma once

#include "kernels/collectives/collectives.h"

namespace fusedcomm::testing {

inline kernels::CommDevice geometry_device(int world, int rank, int sms) {
  kernels::CommDevice d{};
  d.world = world;
  d.rank = rank;
  d.sm_count = sms;
  return d;
}

}  // namespace fusedcomm::testing
