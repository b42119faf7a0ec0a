// Tuned values of the attention kernels, as data (chosen on one H200, CUDA 13).
#pragma once

namespace fusedcomm::kernels::tuning {

// Query rows per CTA (two consumer warpgroups of 64) and keys per block of the flash-attention
// forward, at head dims 64 and 128; the K/V ring's depth is what shared memory then allows
// (2 stages at 128, 4 at 64: detail/flash_fwd.cuh FlashCfg).
inline constexpr int kAttnBlockM = 128;
inline constexpr int kAttnBlockN = 128;

// The consumer loop per head dim (detail/flash_fwd.cuh): pipelined within each warpgroup with
// the two warpgroups' matmuls taking turns, or plain. At head dim 128 the pipelined loop ran
// 1.02-1.03 × faster at S = 4k-16k; at 64, where the exponentials cost as much as the matmuls,
// 0.96-0.97 × as fast.
inline constexpr bool kAttnPipelined128 = true;
inline constexpr bool kAttnPipelined64 = false;

// The backward's dQ per head dim in the stored mode (attention_bwd.h; detail::BwdDq): a separate
// pass that recomputes S and dP (kDqPass), or added into fp32 from the dK/dV pass with vector
// reductions (kDqRed) or TMA reduce-adds (kDqTma). The TMA path ran 1.04-1.15 × as fast as the
// separate pass at head dim 128 and 1.02-1.09 × at 64 (S = 4k-16k, causal and not); the vector
// reductions 0.90-0.97 × at 128. Its dq is not bit-reproducible (the accumulate mode keeps the pass).
inline constexpr int kAttnBwdDq128 = 2;  // detail::BwdDq
inline constexpr int kAttnBwdDq64 = 2;

}  // namespace fusedcomm::kernels::tuning
