// The C++ names of the C API's enums (fusedcomm/fusedcomm.h, the one definition of their
// values): the runtime, both backends and the C API speak these; converting to or from the C
// enum is a cast.
#pragma once

#include <cstdint>

#include "fusedcomm/fusedcomm.h"

namespace fusedcomm {

enum class DType : int32_t { kF32 = FC_DTYPE_F32, kBF16 = FC_DTYPE_BF16, kI32 = FC_DTYPE_I32 };

enum class WeightLayout : int32_t {
  kNK = FC_LAYOUT_NK,  // C = A · Wᵀ, W: N×K (a linear layer's weight)
  kKN = FC_LAYOUT_KN,  // C = A · B,  B: K×N (backward passes)
};

// gemmReduceScatter's and gemmAllReduce's partial products: the precision they are kept and
// exchanged in (the kernels' RsPartials has the same values). The sum is fp32 either way and
// rounded once, at the output; kBF16 rounds each rank's partial to bf16 first (RNE);
// kF32AnyOrder allows any order of the sum.
enum class PartialPrecision : int32_t {
  kF32 = FC_PARTIALS_F32,
  kBF16 = FC_PARTIALS_BF16,
  kF32AnyOrder = FC_PARTIALS_F32_ANY_ORDER,
};

// What CUDA knows of an address (device_memory.h: pointer_info).
enum class MemoryType : int32_t {
  kUnregistered = FC_MEMORY_UNREGISTERED,
  kHost = FC_MEMORY_HOST,
  kDevice = FC_MEMORY_DEVICE,
  kManaged = FC_MEMORY_MANAGED,
};

// Which sequence positions each rank of ringAttention holds (runtime/split.h: seq_runs).
enum class SeqLayout : int32_t { kContiguous = FC_SEQ_CONTIGUOUS, kZigzag = FC_SEQ_ZIGZAG };

enum class Backend : int32_t { kAuto = FC_BACKEND_AUTO, kCuda = FC_BACKEND_CUDA, kHost = FC_BACKEND_HOST };

enum class Op : int32_t {
  kAllGather = FC_OP_ALL_GATHER,
  kReduceScatter = FC_OP_REDUCE_SCATTER,
  kAllReduce = FC_OP_ALL_REDUCE,
  kAllToAll = FC_OP_ALL_TO_ALL,
  kAllGatherGemm = FC_OP_ALL_GATHER_GEMM,
  kGemmReduceScatter = FC_OP_GEMM_REDUCE_SCATTER,
  kGemmAllReduce = FC_OP_GEMM_ALL_REDUCE,
  kMoeDispatchGemm = FC_OP_MOE_DISPATCH_GEMM,
  kMoeCombine = FC_OP_MOE_COMBINE,
  kRingAttention = FC_OP_RING_ATTENTION,
};

// The op's name in the Java API and in messages ("allGather", "gemmAllReduce", ...).
const char* op_name(Op op);
inline bool is_collective(Op op) { return op >= Op::kAllGather && op <= Op::kAllToAll; }
inline bool is_fused(Op op) { return op >= Op::kAllGatherGemm && op <= Op::kGemmAllReduce; }

// Names an op call for errors and the host backend's cross-rank check (fc_op_desc_t). The
// description is borrowed for the call (never null).
struct OpDesc {
  const char* description = "";
  uint64_t fingerprint = 0;
};

}  // namespace fusedcomm
