// A trivial kernel the runtime launches once when it opens a GPU: it proves that this
// library's sm_90a code loads on the device (a wrong architecture fails here, with a sentence,
// not at the first op). And a slow producer for the tests of early launch.
#pragma once

#include <cuda_runtime_api.h>
#include <cstdint>

namespace fusedcomm::kernels {

// Writes out[i] = i * 3 + 1 for i < n. Returns the launch status.
cudaError_t launch_selftest(uint32_t* out, uint32_t n, cudaStream_t stream);

// Tests of early launch (detail/early_launch.h): a kernel that lets the stream's next kernel be
// scheduled at once (griddepcontrol.launch_dependents, as the collectives do), then copies
// `bytes` from src to dst after delay_ns. A kernel launched early behind it that read dst
// before its pdl_wait would see the old bytes. Returns the launch status.
cudaError_t launch_delayed_copy(const void* src, void* dst, size_t bytes, uint64_t delay_ns,
                                cudaStream_t stream);

}  // namespace fusedcomm::kernels
