#include "fusedcomm/comm/comm.h"

#include "fusedcomm/comm/cuda_comm.h"
#include "fusedcomm/comm/host_comm.h"
#include "fusedcomm/runtime/runtime.h"

namespace fusedcomm {

std::unique_ptr<Comm> Comm::create(Runtime& runtime, int rank, int world) {
  if (runtime.backend() == Backend::kCuda) return std::make_unique<CudaComm>(runtime, rank, world);
  return std::make_unique<HostComm>(runtime, world);
}

const char* op_name(Op op) {
  switch (op) {
    case Op::kAllGather: return "allGather";
    case Op::kReduceScatter: return "reduceScatter";
    case Op::kAllReduce: return "allReduce";
    case Op::kAllToAll: return "allToAll";
    case Op::kAllGatherGemm: return "allGatherGemm";
    case Op::kGemmReduceScatter: return "gemmReduceScatter";
    case Op::kGemmAllReduce: return "gemmAllReduce";
    case Op::kMoeDispatchGemm: return "moeDispatchGemm";
    case Op::kMoeCombine: return "moeCombine";
    case Op::kRingAttention: return "ringAttention";
  }
  return "?";
}

}  // namespace fusedcomm
