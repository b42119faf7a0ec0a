// A trivial kernel the runtime launches once when it opens a GPU: it proves that this
// library's sm_90a code loads on the device (a wrong architecture fails here, with a sentence,
// not at the first op).
#pragma once

#include <cuda_runtime_api.h>
#include <cstdint>

namespace fusedcomm::kernels {

// Writes out[i] = i * 3 + 1 for i < n. Returns the launch status.
cudaError_t launch_selftest(uint32_t* out, uint32_t n, cudaStream_t stream);

}  // namespace fusedcomm::kernels
