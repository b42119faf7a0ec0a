// The GEMM engine's kernel template (see ../gemm.h for the contract). The engine is a device
// function, gemm_sm90_body (main_loop.cuh), parameterised by the epilogue (where finished tiles
// go) and the tile schedule (this CTA's index among the computing CTAs and their number, which
// tiles it computes in what order, and what it waits for before loading one). gemm_sm90_kernel is the plain
// GEMM: every CTA computes, round robin over the tiles, hook-1 waits from GemmWaitConfig;
// launch_gemm() uses it with DefaultEpilogue. The fused kernels (ag_gemm_kernel.cuh,
// gemm_rs_kernel.cuh) call the same body from CTAs they give the GEMM role, with their own
// epilogue and schedule.
//
// The pieces, one concern each:
//   gemm_config.cuh     threads, tile sizes, shared-memory budget, GemmProblem, TileCoord
//   readiness_wait.cuh  hook 1: the bounded wait for readiness flags
//   tile_scheduler.cuh  grouped raster, CTA pairs, the schedule concept, PlainSchedule
//   stream_k.cuh        stream-K's iteration ranges, partials and sums
//   epilogue.cuh        the epilogue concept, DefaultEpilogue, C through TMA, register split
//   main_loop.cuh       load / wgmma steps and gemm_sm90_body
//   gemm_sm90.cuh       (this file) the plain kernel and what a host launch needs (GemmPlan)
//
// CTA = 3 warpgroups (384 threads), one CTA per SM:
//   warpgroup 0: producer. setmaxnreg down to 40 (56 with aux warps: RegisterSplit);
//                thread 0 walks the CTA's tiles, waits on the readiness flags (hook 1), then
//                issues TMA loads of 64-deep K slices of A (128×64) and B (BN×64, or 64×BN
//                for kKN) into a kStages-deep ring.
//   warpgroups 1, 2: consumers. setmaxnreg up to 232 (224 with aux warps); each owns 64 rows
//                of the 128×BN tile, runs 4 wgmma (k16) per slice with one wgmma group in
//                flight, releases slices back to the producer, then hands its fragment to the
//                epilogue.
//
// Shared memory (dynamic, base rounded up to 1024 B for the 128-byte swizzle):
//   [A ring]  kStages × 128×64 bf16 (16 KiB each; rows of 128 B, TMA SWIZZLE_128B)
//   [B ring]  kStages × BN×64 bf16; kNK: BN rows of 128 B (K-major, like A);
//             kKN: BN/64 slabs of 64 K-rows × 128 B (64 N-elements), 8 KiB each (N-major)
//   [staging] 2 × R × 16 KiB (R = the epilogue's kStagingRounds, 1 or 2): per consumer
//             warpgroup, R store rounds of 16 KiB (store_tile_tma): a round is 64 rows × 128
//             columns of bf16 as two 64×64 boxes, or 64 rows × 64 columns of fp32 as two 64×32
//             boxes (128-B swizzled rows either way)
//   [aux]     kAuxBytes: the epilogue's (kInitAux: its helper warps' mailboxes, its barriers)
//   [full]    kStages × mbarrier: 1 arrival (producer, expect_tx = stage bytes) + TMA bytes
//   [empty]   kStages × mbarrier: 8 arrivals (lane 0 of each consumer warp) per CTA that reads
//             the stage's B half from this CTA's loads: 8, or 16 in a CTA pair (below)
//   [done]    mbarrier: CTA pairs only, 8 arrivals (the partner's consumer warps, at their end)
//   [status]  kStages × u32, written by the producer before it arms a tile's first stage:
//             static schedules: 0, or 1 = the producer stopped (hook-1 failure), no data;
//             dynamic schedules: the tile index, or kStageEnd (no more tiles) / kStageStop
//             (failure), no data
//
// Ordering: mbarrier arrive/complete_tx (release) → try_wait (acquire) orders the TMA writes
// and the status word before the consumers' reads; wgmma_wait<1> before the empty arrival
// guarantees the slice is no longer read by the tensor cores when the producer reuses it.
//
// CTA pairs (Schedule::kCluster == 2, the plain GEMM only): a cluster of two CTAs computes two
// M-blocks of the same N-block (pair_tile_coord) in lockstep, and each CTA's producer loads
// its own A slice and one half of the shared B slice, multicast into the same stage of both
// CTAs; each CTA's full barrier still expects the whole stage (A + both B halves). A stage may
// be refilled only when both CTAs' consumers have released it, so every consumer warp arrives
// on the empty barrier of both CTAs (after wgmma_wait: the tensor cores' reads are complete;
// the arrival needs no cluster-scope release, see mbar_arrive_remote).
// The peer's half can land on a full barrier before the local producer's expect_tx for that
// phase: the transaction count goes negative and the phase cannot complete before the local
// arrival, so no data is missed. The consumers end with a handshake through `done`
// (leave_cluster): no CTA leaves while its partner may still write its shared memory or
// barriers.
// An M-block past the last one (odd M-block count) is computed from zero-filled A and stored
// nowhere: both CTAs must run the same stages, since each loads half of the other's B.
#pragma once

#include <cuda_bf16.h>

#include <atomic>
#include <cstdint>

#include "kernels/common/sm90_primitives.cuh"
#include "kernels/gemm/detail/epilogue.cuh"
#include "kernels/gemm/detail/gemm_config.cuh"
#include "kernels/gemm/detail/main_loop.cuh"
#include "kernels/gemm/detail/readiness_wait.cuh"
#include "kernels/gemm/detail/stream_k.cuh"
#include "kernels/gemm/detail/tile_scheduler.cuh"
#include "kernels/gemm/gemm.h"

namespace fusedcomm::kernels::detail {

// ---- the plain GEMM kernel --------------------------------------------------------------------
// kPair: launched in clusters of 2 (cudaLaunchAttributeClusterDimension), grid even. Launched
// early (early_launch.h): the stream's previous kernel is complete before the body starts. A
// launch with readiness waits (hook 1) does not release its dependents early: their CTAs would
// hold SMs that the kernels it waits for, on other streams, may need.
template <int BN, bool kBKN, bool kPair, class Epilogue>
__global__ void __launch_bounds__(kGemmThreads, 1)
    gemm_sm90_kernel(const __grid_constant__ CUtensorMap tm_a, const __grid_constant__ CUtensorMap tm_b,
                     const __grid_constant__ CUtensorMap tm_c, const __grid_constant__ GemmProblem prob,
                     const __grid_constant__ Epilogue epi) {
  pdl_wait();
  if (prob.wait.a.flags == nullptr && prob.wait.b.flags == nullptr) pdl_release_dependents();
  gemm_sm90_body<BN, kBKN>(tm_a, tm_b, tm_c, prob, epi, PlainSchedule<kPair>{});
}

// ---- host side: what a launch of the engine needs ----------------------------------------------
// gemm.cu's launch_gemm and the fused launchers share the argument checks and the set-up.
struct GemmPlan {
  CUtensorMap ta, tb, tc;  // A, B, and C (C only when prob.c_tma)
  GemmProblem prob;
  DefaultEpilogue epi;  // C (when not through TMA) and the tile sink of the arguments
  int grid;             // CTAs of a plain launch: min(computing CTAs, tiles), or 2 × the
                        // pairs (min(computing CTAs / 2, pair sweep)); the launcher may
                        // lower it to the clusters that fit at once
  int tile_n;           // 128 or 256
  int cluster;          // 1, or 2: CTA pairs share B (plain launches only)
  bool kn;              // B is K×N
  bool pingpong;        // plain launches: consumers take turns (gemm_pingpong.cuh)
};

// The tensor map of an A operand as gemm_plan encodes it (rows × K bf16, row stride lda
// elements, 128 × 64 boxes): for schedules that read some A blocks from another tensor.
bool encode_a_map(CUtensorMap* map, const __nv_bfloat16* A, int rows, int K, int64_t lda);
// The tensor map of a B operand of single CTAs as gemm_plan encodes it, over `rows` rows of
// `cols` (kNK: rows of N × K columns, boxes of tile_n × 64; kKN: rows of K × N columns, 64 × 64
// boxes): for a grouped GEMM whose groups' weights lie one after the other in one map.
bool encode_b_map(CUtensorMap* map, const __nv_bfloat16* B, int64_t rows, int cols, int64_t ldb, bool kn,
                  int tile_n);
// A tensor map that store_tile_tma writes: rows × cols, row stride ld elements, bf16 or fp32
// (the 64-row boxes of the engine's C store).
bool encode_store_map(CUtensorMap* map, void* base, int rows, int cols, int64_t ld, bool f32);

// Checks `a` against the gemm.h contract and fills `plan` for `a.num_ctas` computing CTAs
// (0: one per SM of the current device). cudaErrorInvalidValue for a contract violation.
cudaError_t gemm_plan(const GemmArgs& a, GemmPlan* plan);

// Raises `kernel`'s dynamic shared-memory limit to `bytes` on the current device, once per
// device (the attribute is per device; `opted` remembers which of the first 64 have it).
inline cudaError_t gemm_opt_in_smem(const void* kernel, size_t bytes, std::atomic<uint64_t>& opted) {
  int dev = 0;
  if (cudaError_t e = cudaGetDevice(&dev); e != cudaSuccess) return e;
  const uint64_t bit = 1ull << (dev & 63);
  if ((opted.load(std::memory_order_relaxed) & bit) != 0) return cudaSuccess;
  if (cudaError_t e =
          cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
      e != cudaSuccess) {
    return e;
  }
  opted.fetch_or(bit, std::memory_order_relaxed);
  return cudaSuccess;
}

}  // namespace fusedcomm::kernels::detail
