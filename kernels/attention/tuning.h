// Tuned values of the attention kernels, as data (chosen on one H200, CUDA 13).
#pragma once

namespace fusedcomm::kernels::tuning {

// The flash-attention forward per head dim (detail/flash_fwd.cuh): consumer warpgroups of 64
// query rows and the consumer loop (detail::FlashLoop: 0 plain, 1 pipelined with two P register
// sets, 2 pipelined with one). Keys per block: 128; the K/V ring's depth is what shared memory
// then allows (3 stages at 128, 4 at 64: FlashCfg). Against cuDNN in one process (S = 4k-64k,
// causal and not): at head dim 128 the two-P loop ran 0.91-1.15 × cuDNN's time (geomean 0.97),
// the one-P loop 0.95-1.04 × (1.00); at head dim 64, 3 warpgroups with the one-P loop ran
// 0.90-1.05 × (0.93), 3 with the plain loop 0.96-1.15 × (1.00) and 2 with the plain loop
// 1.10-1.25 × (1.15).
inline constexpr int kAttnBlockN = 128;
inline constexpr int kAttnWarpgroups128 = 2;
inline constexpr int kAttnWarpgroups64 = 3;
inline constexpr int kAttnLoop128 = 1;
inline constexpr int kAttnLoop64 = 2;

// The persistent ring kernel (ring_fwd.h): a pull of the next K/V block is cut into at most this
// many chunks (each at least 64 KiB), one CTA each. An SM pulling from a peer moves ~16 GB/s
// (docs/performance.md, allGatherGemm's SM pulls), so about 32 of them fill one NVLink
// direction; more would only stall on the link with SMs the step's tiles could use.
inline constexpr int kRingPullChunks = 32;

// The backward's dQ per head dim in the stored mode (attention_bwd.h; detail::BwdDq): a separate
// pass that recomputes S and dP (kDqPass), or added into fp32 from the dK/dV pass with vector
// reductions (kDqRed) or TMA reduce-adds (kDqTma). The TMA path ran 1.04-1.15 × as fast as the
// separate pass at head dim 128 and 1.02-1.09 × at 64 (S = 4k-16k, causal and not); the vector
// reductions 0.90-0.97 × at 128. Its dq is not bit-reproducible (the accumulate mode keeps the pass).
inline constexpr int kAttnBwdDq128 = 2;  // detail::BwdDq
inline constexpr int kAttnBwdDq64 = 2;

}  // namespace fusedcomm::kernels::tuning
