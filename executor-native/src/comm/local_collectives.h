// The cuda backend's collectives among the ranks of one host: one persistent kernel on the
// symmetric memory (kernels/collectives/collectives.h), and the helpers every GPU path of the
// communicator shares (CudaComm and CrossHostPaths).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "fusedcomm/runtime/symmetric_memory.h"
#include "fusedcomm/types.h"
#include "kernels/collectives/collectives.h"
#include "kernels/collectives/copy_segments.h"

namespace fusedcomm {

// A CUDA error as Error(kFatalGpu): "<what> failed (<name>: <description>)".
void check_cuda(cudaError_t e, const std::string& what);
// A fused or GEMM launch's error: cudaErrorInvalidValue (the kernel refused the arguments) as
// Error(kInvalidArgument), others as check_cuda.
void check_fused_launch(cudaError_t e, const char* op);
inline size_t element_bytes(kernels::CommDtype d) { return d == kernels::CommDtype::kF32 ? 4 : 2; }
// The kernels' numbering of the two floating dtypes and the collectives (the same values).
inline kernels::CommDtype comm_dtype(DType t) { return static_cast<kernels::CommDtype>(t); }
inline kernels::CommOp comm_op(Op op) { return static_cast<kernels::CommOp>(op); }
// A byte size rounded up to 16, so that buffers laid end to end stay vector-aligned.
inline uint64_t round16(uint64_t bytes) { return (bytes + 15) / 16 * 16; }
// Moves byte ranges on the device, stream-ordered (kernels/collectives/copy_segments.h), as
// few launches as the segments need.
void copy_segments(const std::vector<kernels::CopySegment>& segments, cudaStream_t s);

class LocalCollectives {
 public:
  explicit LocalCollectives(SymmetricMemory& sm) : sm_(sm) {}

  // Launches `args` (the algorithm chosen here, once) on s. A one-shot launch reads its input
  // where it lies (CollectiveArgs::input: no peer reads the data area then), unless the input
  // overlaps the output or is element-misaligned; every other launch reads it from the data
  // area, copied there first (in_bytes of it; 0: the caller put it there).
  void enqueue(const kernels::CollectiveArgs& args, const void* in, size_t in_bytes, cudaStream_t s);

  SymmetricMemory& memory() const { return sm_; }
  uint64_t input_copies() const { return input_copies_; }

 private:
  SymmetricMemory& sm_;
  uint64_t input_copies_ = 0;
};

}  // namespace fusedcomm
