// Where the cuda backend runs a fused op: the one place that decides, shared by CudaComm's ops
// and describe_fused(), so that the phrase a user reads is the path the op takes.
//
//   kKernels      one host, the op fits the data area: the kernels' launcher
//                 (kernels/<op>/<op>.h), whose own size rule (kAuto, read through the kernels'
//                 *_info) picks the fused kernel or our GEMM then our collective;
//   kAcrossHosts  ranks on several hosts: our GEMM and the hierarchical collective
//                 (cross_host_paths.h); gemmAllReduce: our GEMM, then our allReduce,
//                 hierarchical and in pieces of the data area's size;
//   kPieces       gemmAllReduce on one host, larger than the data area: our GEMM, then our
//                 allReduce in pieces of the data area's size.
// Every input is rank-uniform (sizes, world, data area), so every rank takes the same route;
// allGatherGemm's exchange (copy engines or SM pulls) is the one rank-local choice.
#pragma once

#include <cstdint>
#include <string>

#include "fusedcomm/types.h"
#include "kernels/ag_gemm/ag_gemm.h"
#include "kernels/collectives/collectives.h"
#include "kernels/common/fused.h"
#include "kernels/gemm_ar/gemm_ar.h"
#include "kernels/gemm_rs/gemm_rs.h"

namespace fusedcomm {

class CrossHostPaths;

// What the plan reads of the communicator.
struct FusedContext {
  const kernels::CommDevice& dev;  // the symmetric memory of this host's ranks
  uint64_t area;                   // the data area's bytes
  int world;                       // every rank, on every host
  const CrossHostPaths* hosts;     // null on one host
};

enum class FusedRoute { kKernels, kAcrossHosts, kPieces };

struct FusedPlan {
  FusedRoute route = FusedRoute::kKernels;
  // kKernels: what the kernels' launch does with these arguments (kAuto resolved).
  kernels::FusedLaunchInfo info{};
  uint64_t needs = 0;  // bytes of the data area the route needs; the op is refused above it
  // allGatherGemm: what it needs with a gathered A given, and without one (the op then builds
  // it in the scratch area, kKernels). `needs` is one of the two.
  uint64_t needs_with_gathered = 0, needs_without_gathered = 0;
};

// The arguments as the op passes them to the kernels (args.gathered: whether the caller gives
// the gathered A; args.algo: kAuto).
FusedPlan plan_all_gather_gemm(const FusedContext& ctx, const kernels::AgGemmArgs& args);
FusedPlan plan_gemm_reduce_scatter(const FusedContext& ctx, const kernels::GemmRsArgs& args);
FusedPlan plan_gemm_all_reduce(const FusedContext& ctx, const kernels::GemmArArgs& args);

// describe_fused's phrase for a plan (made with a gathered A for allGatherGemm): the route and,
// fused, the SM split and how peers' data moves; a size the data area cannot hold is said to be
// refused.
std::string describe_plan(const FusedContext& ctx, Op op, const FusedPlan& plan, PartialPrecision partials);

}  // namespace fusedcomm
