// Hook 1 of gemm.h: the producer's bounded wait for a tile's readiness flags (GemmWaitConfig),
// with the error record a CTA that gives up fills.
#pragma once

#include <cstdint>

#include "kernels/common/sm90_primitives.cuh"
#include "kernels/common/tuning.h"
#include "kernels/gemm/detail/gemm_config.cuh"
#include "kernels/gemm/gemm.h"

namespace fusedcomm::kernels::detail {

// Out of line (the producer's 40-register region stays small) but `inline` for the linker:
// this header is included by more than one translation unit (gemm.cu, ag_gemm.cu, gemm_rs.cu).
inline __device__ __noinline__ void record_wait_failure(GemmErrorRecord* e, uint32_t code, uint32_t operand,
                                                        uint32_t chunk, TileCoord tc, uint64_t observed,
                                                        uint64_t elapsed) {
  if (atomicCAS_system(&e->code, 0u, code) != 0u) return;  // someone else reported first
  volatile GemmErrorRecord* v = e;
  v->operand = operand;
  v->chunk = chunk;
  v->cta = blockIdx.x;
  v->tile_m = static_cast<uint32_t>(tc.m);
  v->tile_n = static_cast<uint32_t>(tc.n);
  v->observed = observed;
  v->elapsed_ns = elapsed;
  __threadfence_system();
}

// Returns true once flag >= epoch; false if it timed out, was aborted, or another CTA failed.
// The error record and the clock every 16 polls, the host-mapped abort word every
// tuning::kAbortCheckPolls (see there).
// Scalars by value: a reference into the kernel's parameter space would force a local copy.
inline __device__ __noinline__ bool wait_flag(const uint64_t* flag, uint64_t epoch, uint64_t timeout,
                                              const volatile uint32_t* abort_word, GemmErrorRecord* error,
                                              uint32_t operand, uint32_t chunk, TileCoord tc) {
  uint64_t v = ld_acquire_sys(flag);
  if (v >= epoch) return true;
  const uint64_t t0 = globaltimer_ns();
  uint32_t backoff = 32;
  for (uint32_t polls = 1;; ++polls) {
    __nanosleep(backoff);
    backoff = backoff < 1024 ? backoff * 2 : 1024;
    v = ld_acquire_sys(flag);
    if (v >= epoch) return true;
    if ((polls & 15) == 0) {
      const uint64_t elapsed = globaltimer_ns() - t0;
      uint32_t code = kGemmOk;
      if ((polls & (tuning::kAbortCheckPolls - 1)) == 0 && abort_word != nullptr && *abort_word != 0) {
        code = kGemmAborted;
      } else if (ld_volatile_u32(&error->code) != 0) {
        return false;  // another CTA gave up: stop without overwriting its record
      } else if (elapsed >= timeout) {
        code = kGemmWaitTimeout;
      }
      if (code != kGemmOk) {
        record_wait_failure(error, code, operand, chunk, tc, v, elapsed);
        return false;
      }
    }
  }
}

__device__ __forceinline__ bool wait_operand(const GemmReadyFlags& f, const GemmWaitConfig& w,
                                             uint32_t operand, int row_begin, int row_end, TileCoord tc) {
  if (f.flags == nullptr) return true;
  uint32_t c0 = static_cast<uint32_t>(row_begin) / f.chunk_rows;
  uint32_t c1 = static_cast<uint32_t>(row_end - 1) / f.chunk_rows;
  if (c0 >= f.num_chunks) c0 = f.num_chunks - 1;
  if (c1 >= f.num_chunks) c1 = f.num_chunks - 1;
  for (uint32_t c = c0; c <= c1; ++c) {
    if (!wait_flag(f.flags + c, w.epoch, w.timeout_ns ? w.timeout_ns : kDefaultWaitTimeoutNs, w.abort_word,
                   w.error, operand, c, tc)) {
      return false;
    }
  }
  return true;
}

}  // namespace fusedcomm::kernels::detail
