// gemmReduceScatter's tuned values (the fused-vs-decomposed bar is in
// kernels/common/fused_choice.h). Chosen on H200 (2 and 4 GPUs, NVLink); docs/performance.md has
// the measurements.
#pragma once

namespace fusedcomm::kernels::tuning {

// Pacing of the pusher warps' NVLink stores (RsParams::push_pace_ns). Their stores in flight slow
// the GEMM's main loops on the same SM (1.06-1.20 × the GEMM alone's cycles per tile at W = 2,
// 1.03-1.07 × with the same stores into local memory), so the pusher spreads a handoff over
// kRsPushSpreadPct percent of the next tile's main loop, estimated from K as
// tile_n · K / kRsTileKPerNs ns (~1.5 GHz), with a sleep after every 2 KiB. With bf16 partials
// only (a half-tile is one handoff there, so the consumer never waits for the pusher within a
// tile; with fp32 partials a fixed pace measured slower), and only from kRsPushPaceMinWaves
// waves of tiles: at one- and two-wave shapes the own tiles wait for the pushes and paced
// pushes were up to 2.3 × slower. Measured 0.92-1.00 × the unpaced time at W = 2 and
// 0.93-1.01 × at W = 4, at the shapes kAuto runs fused. No new wait: a paced pusher is only a
// slower one, which the deadlock argument (gemm_rs_kernel.cuh) and rs_protocol_model.py's
// random schedules already allow.
inline constexpr int kRsPushSpreadPct = 25;
inline constexpr double kRsTileKPerNs = 24.0;
inline constexpr int kRsPushPaceMinWaves = 3;

// The accumulating receive slot (RsPartials::kF32AnyOrder) from this world up: at W = 2 one
// source gains nothing from it and pays the zeroing and the reduce-adds (1.02-1.11 ×).
inline constexpr int kRsAccumulateMinWorld = 3;

// The early fetch of an own half-tile's partial (RsParams::prefetch): at this world only, with
// bf16 partials (one received slot, which the staging buffer holds).
inline constexpr int kRsPrefetchWorld = 2;

}  // namespace fusedcomm::kernels::tuning
