// Tuned values of the attention kernels, as data (chosen on one H200, CUDA 13).
#pragma once

namespace fusedcomm::kernels::tuning {

// Query rows per CTA (two consumer warpgroups of 64) and keys per block of the flash-attention
// forward, at head dims 64 and 128; the K/V ring's depth is what shared memory then allows
// (2 stages at 128, 4 at 64: detail/flash_fwd.cuh FlashCfg).
inline constexpr int kAttnBlockM = 128;
inline constexpr int kAttnBlockN = 128;

}  // namespace fusedcomm::kernels::tuning
