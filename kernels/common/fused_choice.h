// kAuto of the fused ops: fused kernel or decomposed path (our GEMM, then our collective), for
// allGatherGemm, gemmReduceScatter and gemmAllReduce, all in this one place. The launchers, their
// *_info() and so the runtime's planning call these functions.
//
// Every input of a rule must be the same on every rank (M, N or K as the op shares it, W, the SM
// count), never K_r or N_r: ranks that chose differently would wait for each other until the
// timeout. The bars were measured on H200 (2 and 4 GPUs, NVLink): docs/performance.md has the
// figures. Worlds that were not measured for speed take the decomposed path, except where a
// world lies between two measured ones with one bar (W = 3 for gemmReduceScatter).
//
// Facts that need the op's geometry (whether the fused kernel's flags or workspace fit) come in
// as callables, evaluated only where the size rules allow the fused kernel.
#pragma once

#include <cstdint>

#include "kernels/common/fused.h"

namespace fusedcomm::kernels {

// allGatherGemm: fused from this much gathered A (M·K·2 bytes) at W = 2 and W = 4. The fused
// kernel hides the exchange but costs a fixed ~10-20 us (chunk flags, SMs that start on
// communication, the first chunks' latency), which a smaller exchange does not repay: below it
// the decomposed path was faster at both worlds.
inline constexpr uint64_t kAgFusedMinGatheredBytes = uint64_t{16} << 20;

// gemmReduceScatter: fused at W = 2-4 from this many elements of the partial product (M·N), for
// every partial precision, and ...
inline constexpr uint64_t kRsFusedMinElems = uint64_t{1} << 24;
// ... at least this many rows per owner (M / W, eight M-blocks): with fewer (e.g. 512 rows per
// owner at W = 4) the fused kernel ran slower than the decomposed path at the same M·N.
inline constexpr int64_t kRsFusedMinOwnerRows = 1024;

// gemmAllReduce at W = 4: fused with bf16 partials from this many elements (M·N); fp32 partials
// at W = 4 and W = 3 were not measured for speed. At W = 2 it follows gemmReduceScatter's rule.
inline constexpr uint64_t kArFusedMinElemsW4 = uint64_t{1} << 25;

// allGatherGemm (M, K and W are rank-uniform; N_r is not).
inline FusedAlgo choose_all_gather_gemm(FusedAlgo algo, int world, int M, int K) {
  if (algo != FusedAlgo::kAuto) return algo;
  if (world != 2 && world != 4) return FusedAlgo::kDecomposed;
  const uint64_t bytes = static_cast<uint64_t>(M) * K * 2;
  return bytes >= kAgFusedMinGatheredBytes ? FusedAlgo::kFused : FusedAlgo::kDecomposed;
}

// gemmReduceScatter (M, N and W are rank-uniform; K_r is not). fused_fits(): the fused kernel's
// half-tile flags fit FusedFlags.
template <class FusedFits>
FusedAlgo choose_gemm_reduce_scatter(FusedAlgo algo, int world, int M, int N, FusedFits fused_fits) {
  if (algo != FusedAlgo::kAuto) return algo;
  if (world < 2 || world > 4) return FusedAlgo::kDecomposed;
  const uint64_t elems = static_cast<uint64_t>(M) * static_cast<uint64_t>(N);
  if (elems < kRsFusedMinElems || M / world < kRsFusedMinOwnerRows || !fused_fits()) {
    return FusedAlgo::kDecomposed;
  }
  return FusedAlgo::kFused;
}

// gemmAllReduce's one-shot kernel (FusedAlgo::kOneShot) up to this many rows, at W = 2: there
// the product is bound by reading W_r and the exchange is at most a few MiB, which the kernel
// pushes tile by tile, in one launch instead of two or three. On the Llama shapes of
// bench/shapes/fused.txt (2 x H200, bf16 partials, both captured in a CUDA graph) it took
// 0.48-0.76 x our GEMM + allReduce at M = 1-8 and 0.64-1.01 x at M = 32-128 (wgmma tiles from
// 33 rows; the ties, 1.00-1.01 x, at Llama-8B attention output M = 64 and Llama-70B MLP down
// M = 128). Above 128 rows it was not measured.
inline constexpr int kArOneShotMaxM = 128;

// gemmAllReduce (M, N, W and the partials are rank-uniform). one_shot_fits(): the one-shot
// kernel's tile flags and split counters fit FusedFlags and its workspace the data area.
// rs_fused_fits(): gemmReduceScatter's kAuto takes its fused kernel for the same M, N and
// partials, and the fused path's workspace fits the data area. The fused path needs W to
// divide M (its allGather splits elements).
template <class OneShotFits, class RsFusedFits>
FusedAlgo choose_gemm_all_reduce(FusedAlgo algo, int world, int M, int N, bool bf16_partials,
                                 OneShotFits one_shot_fits, RsFusedFits rs_fused_fits) {
  if (algo != FusedAlgo::kAuto) return algo;
  if (world == 2 && M <= kArOneShotMaxM && one_shot_fits()) return FusedAlgo::kOneShot;
  if (M % world != 0) return FusedAlgo::kDecomposed;
  if (world == 4) {
    const uint64_t elems = static_cast<uint64_t>(M) * static_cast<uint64_t>(N);
    if (!bf16_partials || elems < kArFusedMinElemsW4) return FusedAlgo::kDecomposed;
  } else if (world != 2) {
    return FusedAlgo::kDecomposed;
  }
  return rs_fused_fits() ? FusedAlgo::kFused : FusedAlgo::kDecomposed;
}

// moeDispatchGemm (kernels/moe/moe.h): the fused kernel (the rows and the grouped GEMM in one
// persistent kernel) or the decomposed launches, from the rank-uniform world only (the token
// counts differ by rank). At W = 1 (one H200, the three expert shapes at 4096 and 16384
// tokens) the fused kernel took 1.02-1.55 x the decomposed launches' time: there the rows only
// move within the GPU (a copy at the memory's speed, ~0.2 ms of the decomposed 2.9 ms at
// DeepSeek-V3-like 4096 tokens), which the SMs lent to it cost the GEMM back
// (docs/performance.md "MoE fused dispatch"). Worlds above 1 were not measured for speed. So
// kAuto takes the decomposed path everywhere; kFused is there for the benchmarks, the tests and
// the measurement on a multi-GPU host that this rule waits for.
inline FusedAlgo choose_moe_dispatch_gemm(FusedAlgo algo, int /*world*/) {
  if (algo != FusedAlgo::kAuto) return algo;
  return FusedAlgo::kDecomposed;
}

// moeGemmCombine (kernels/moe/moe.h): the fused kernel (each tile of h · W2ᵀ stored straight into
// its rows' home slots, the weighted sum in the same kernel) or the grouped GEMM then the
// combine, from the rank-uniform world only. At W = 1 (one H200, the three expert
// shapes at 4096 and 16384 tokens) the fused kernel took 1.12-1.28 × the decomposed path's
// time at the DeepSeek-V3-like and Qwen3-MoE-like shapes and 1.44-3.43 × at the Mixtral-like
// ones (docs/performance.md "MoE fused GEMM + combine"): there the rows never leave the GPU and
// the combine alone is 0.07-1.5 ms, less than the epilogue's row-by-row stores cost the GEMM.
// Worlds above 1 were not measured for speed. So kAuto takes the decomposed path everywhere;
// kFused is there for the tests, the benchmarks and the measurement on a multi-GPU host.
inline FusedAlgo choose_moe_gemm_combine(FusedAlgo algo, int /*world*/) {
  if (algo != FusedAlgo::kAuto) return algo;
  return FusedAlgo::kDecomposed;
}

// MoE low-latency mode (kernels/moe/moe.h "Low latency"): the dispatch's routing, count
// exchange, layout, rows and unpack in ONE cooperative launch (and the combine's rows and sums
// in one), in place of the normal path's five launches (and two). Its counting runs in one CTA
// and its grid is sized to the rows, so it is for decode-sized batches: kAuto takes it when the
// receive capacity (rank-uniform: the caller's maxRecvRows, else what the data area holds; part
// of the launch signature) is at most W · kMoeLowLatencyMaxTokens · topk rows, i.e. no rank can
// receive more than every rank's 256 tokens routed to it. At W = 2 on separate GPUs (the
// issue's three expert shapes, uniform routing) it took 0.68-0.93 × the normal path's time for
// the routing and rows, 0.91-1.00 × with the grouped GEMM and 0.95-1.00 × for the combine at
// 128 and 256 tokens per rank; at 512 tokens its combine took 1.04-1.05 × at two of the three
// shapes and at 1024 its routing and rows 1.13-1.15 ×, so the bar stays at 256 tokens. At W = 1
// it was faster at 128 tokens; W >= 3 on separate GPUs was not measured (the same per-rank
// bar). docs/performance.md "MoE low-latency mode" has the figures.
inline constexpr int64_t kMoeLowLatencyMaxTokens = 256;
inline bool choose_moe_low_latency(MoeMode mode, int world, int64_t capacity, int topk) {
  if (mode != MoeMode::kAuto) return mode == MoeMode::kLowLatency;
  return capacity <= static_cast<int64_t>(world) * kMoeLowLatencyMaxTokens * topk;
}

}  // namespace fusedcomm::kernels
