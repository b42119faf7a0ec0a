// A single-GPU GEMM on the calling thread's current device, through the kernels library's
// persistent TMA + wgmma engine: the Java API's `gemm` on device tensors, and the runtime's
// building block for the decomposed (GEMM, then collective) paths.
#pragma once

#include <cstdint>

#include "fusedcomm/types.h"
#include "kernels/gemm/gemm.h"

namespace fusedcomm {

// The engine's arguments for c (m×n, c_type) = a (m×k, bf16) · op(w), dense row-major operands
// (kNK or kKN, as below); the engine chooses the schedule.
kernels::GemmArgs dense_gemm_args(const void* a, const void* w, void* c, int64_t m, int64_t n, int64_t k,
                                  WeightLayout layout, kernels::GemmOutType c_type);

// A stream-K workspace (kernels/gemm/gemm.h) for the current device: gemm_workspace_bytes(0) bytes,
// allocated and zeroed on stream `s`, so launches on s or ordered after it find its counters
// zero. None ({}) when that fails, the error cleared: GEMMs without one only lose stream-K.
// The caller owns it (cudaFree).
kernels::GemmWorkspace make_gemm_workspace(cudaStream_t s);

// c (m×n, bf16) = a (m×k, bf16) · op(w): kNK (w: n×k, C = A·Wᵀ) or kKN (w: k×n).
// Device pointers, 16-byte aligned; any n and k >= 1 (Error(kInvalidArgument) otherwise): where k
// (or n, kKN) is not a multiple of 8, a's (w's) rows are first copied into padded rows
// (kernels/gemm/gemm.h, launch_gemm_staged), in a buffer per device kept like the workspace
// below at the largest size a call needed.
// Synchronous: returns after the kernel finished; a CUDA failure is Error(kFatalGpu). The first
// call on a device allocates that device's stream-K workspace (~33 MiB, kept for the process),
// which the launch uses where it chooses stream-K (small M, long K); calls on one device
// serialise on it.
void device_gemm_bf16(const void* a, const void* w, void* c, int64_t m, int64_t n, int64_t k,
                      WeightLayout layout);

// The grouped GEMM on the current device (kernels/moe/moe.h, launch_grouped_gemm): group g owns
// rows [offsets[g], offsets[g+1]) of a (rows × k) and c (rows × n), and those rows of c = the
// same rows of a · op(w_g); w: groups × n × k (kNK) or groups × k × n (kKN); bf16, fp32
// accumulation, each element rounded once; rows outside every group are not written. offsets:
// groups + 1 values in host memory, checked as host::require_group_offsets says; groups <=
// kernels::kMoeMaxExperts. Device pointers, 16-byte aligned; n and k positive multiples of 8.
// kKN with k not a multiple of 64: the last k slice of group g also reads the first rows of
// group g + 1's weight, multiplied by zeros (so the weights must be finite). Synchronous, like
// device_gemm_bf16; the offsets and the block table travel in a device buffer of its own.
void device_grouped_gemm_bf16(const void* a, const void* w, void* c, const int64_t* offsets, int64_t groups,
                              int64_t rows, int64_t n, int64_t k, WeightLayout layout);

}  // namespace fusedcomm
