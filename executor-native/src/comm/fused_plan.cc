#include "fused_plan.h"

#include <algorithm>

#include "cross_host_paths.h"

namespace fusedcomm {
namespace {

namespace k = kernels;

static_assert(static_cast<int>(k::RsPartials::kF32) == FC_PARTIALS_F32 &&
                  static_cast<int>(k::RsPartials::kBF16) == FC_PARTIALS_BF16 &&
                  static_cast<int>(k::RsPartials::kF32AnyOrder) == FC_PARTIALS_F32_ANY_ORDER,
              "fc_partials_t carries the kernels' RsPartials values");

uint64_t larger(const k::FusedWorkspace& ws) { return std::max(ws.data_bytes, ws.scratch_bytes); }

PartialPrecision precision(k::RsPartials p) { return static_cast<PartialPrecision>(p); }

const char* partials_name(k::RsPartials p) {
  switch (p) {
    case k::RsPartials::kBF16: return "bf16";
    case k::RsPartials::kF32AnyOrder: return "fp32, summed in any order";
    default: return "fp32";
  }
}

std::string fused_split(const k::FusedLaunchInfo& i) {
  return std::to_string(i.gemm_ctas) + " GEMM CTAs, tile width " + std::to_string(i.tile_n);
}

// "needs <bytes> bytes of symmetric memory, more than its <area>-byte data area"
std::string shortfall(uint64_t bytes, uint64_t area) {
  return "needs " + std::to_string(bytes) + " bytes of symmetric memory, more than its " +
         std::to_string(area) + "-byte data area";
}

}  // namespace

FusedPlan plan_all_gather_gemm(const FusedContext& ctx, const k::AgGemmArgs& args) {
  FusedPlan plan;
  if (ctx.hosts != nullptr) {
    plan.route = FusedRoute::kAcrossHosts;
    // There the gathered A goes to the communicator's own workspace: the data area needs the same.
    plan.needs = ctx.hosts->all_gather_gemm_needs(args.M, args.K, args.gathered != nullptr).data_bytes;
    plan.needs_with_gathered = plan.needs_without_gathered = plan.needs;
    plan.info.algo = ctx.hosts->all_gather_gemm_fused(args.M, args.N, args.K) ? k::FusedAlgo::kFused
                                                                               : k::FusedAlgo::kDecomposed;
    return plan;
  }
  // The workspace reads only whether a gathered A is given, never the pointer.
  k::AgGemmArgs given = args, bare = args;
  given.gathered = reinterpret_cast<__nv_bfloat16*>(uintptr_t{256});
  bare.gathered = nullptr;
  plan.needs_with_gathered = larger(k::all_gather_gemm_workspace(given, ctx.dev.world));
  plan.needs_without_gathered = larger(k::all_gather_gemm_workspace(bare, ctx.dev.world));
  plan.needs = args.gathered != nullptr ? plan.needs_with_gathered : plan.needs_without_gathered;
  plan.info = k::all_gather_gemm_info(ctx.dev, args);
  return plan;
}

FusedPlan plan_gemm_reduce_scatter(const FusedContext& ctx, const k::GemmRsArgs& args) {
  FusedPlan plan;
  if (ctx.hosts != nullptr) {
    plan.route = FusedRoute::kAcrossHosts;
    plan.needs = ctx.hosts->gemm_reduce_scatter_needs(args.M, args.N, precision(args.partials)).data_bytes;
    plan.info.algo = ctx.hosts->gemm_reduce_scatter_fused(args.M, args.N) ? k::FusedAlgo::kFused
                                                                         : k::FusedAlgo::kDecomposed;
    return plan;
  }
  plan.needs = larger(k::gemm_reduce_scatter_workspace(args, ctx.dev.world));
  plan.info = k::gemm_reduce_scatter_info(ctx.dev, args);
  return plan;
}

// The kernels' gemmAllReduce (its one-shot kernel, its fused composition or its decomposed one,
// chosen by its own rule) where it fits the data area on one host; otherwise our GEMM and our allReduce, which
// runs in pieces and, across hosts, hierarchically: never refused for its size.
FusedPlan plan_gemm_all_reduce(const FusedContext& ctx, const k::GemmArArgs& args) {
  FusedPlan plan;
  if (ctx.hosts != nullptr) {
    plan.route = FusedRoute::kAcrossHosts;
    plan.info.algo = k::FusedAlgo::kDecomposed;
    if (ctx.hosts->gemm_all_reduce_fused(args.M, args.N)) {
      const uint64_t needs = ctx.hosts->gemm_all_reduce_needs(args.M, args.N, precision(args.partials)).data_bytes;
      if (needs <= ctx.area) {
        plan.needs = needs;
        plan.info.algo = k::FusedAlgo::kFused;
      }
    }
    return plan;
  }
  plan.info = k::gemm_all_reduce_info(ctx.dev, args);
  k::GemmArArgs resolved = args;
  resolved.algo = plan.info.algo;
  const uint64_t needs = larger(k::gemm_all_reduce_workspace(resolved, ctx.world));
  plan.route = needs <= ctx.area ? FusedRoute::kKernels : FusedRoute::kPieces;
  return plan;
}

std::string describe_plan(const FusedContext& ctx, Op op, const FusedPlan& plan, PartialPrecision partials) {
  const int W = ctx.world;
  const bool across = plan.route == FusedRoute::kAcrossHosts;
  const k::FusedLaunchInfo& i = plan.info;
  const bool fused = plan.route == FusedRoute::kKernels && i.algo == k::FusedAlgo::kFused;
  const auto rs = static_cast<k::RsPartials>(partials);
  std::string out;
  uint64_t needs = 0, unless_gathered = 0;
  if (op == Op::kAllGatherGemm) {
    needs = plan.needs_with_gathered;
    if (!across && needs <= ctx.area && plan.needs_without_gathered > ctx.area) {
      unless_gathered = plan.needs_without_gathered;
    }
    if (across && i.algo == k::FusedAlgo::kFused) {
      out = "fused across hosts: one kernel; the proxy's lanes bring the other hosts' rows while the GEMM "
            "works on the rows already there";
    } else if (across) {
      out = "decomposed across hosts: the hierarchical allGather, then our GEMM";
    } else if (fused) {
      out = "fused: " + fused_split(i) + ", " + std::to_string(i.chunks) + " row chunks; " +
            (i.copy_engines ? "the copy engines move the peers' rows (1 CTA raises their flags)"
                            : std::to_string(i.comm_ctas) + " CTAs pull the peers' rows, then join the GEMM");
    } else {
      out = W == 1 ? "decomposed: our GEMM on the local rows (world 1)"
                   : "decomposed: our allGather, then our GEMM";
    }
  } else if (op == Op::kGemmReduceScatter) {
    needs = plan.needs;
    const std::string p = std::string(partials_name(rs)) + " partials";
    if (across && i.algo == k::FusedAlgo::kFused) {
      out = "fused across hosts: one kernel; the proxy's lanes send each host its rows' partials as their "
            "tiles complete and sum what arrives (" + p + ")";
    } else if (across) {
      out = "decomposed across hosts: our GEMM, then the hierarchical reduceScatter (" + p + ")";
    } else if (fused) {
      out = "fused: " + fused_split(i) + "; each output tile's partial goes to the rank owning its rows (" +
            p + ")";
    } else {
      out = W == 1 ? "decomposed: our GEMM (world 1)"
                   : "decomposed: our GEMM, then our reduceScatter (" + p + ")";
    }
  } else {
    const std::string p = std::string(rs == k::RsPartials::kBF16 ? "bf16" : "fp32") + " partials";
    if (plan.route == FusedRoute::kKernels) {
      if (i.algo == k::FusedAlgo::kOneShot) {
        out = "one-shot: one kernel, " + std::to_string(i.gemm_ctas) + " CTAs over " +
              std::to_string(i.chunks) + " tiles (K split " + std::to_string(i.k_splits) +
              "); each tile's partial goes to every rank, " + "which sums them in rank order (" + p + ")";
      } else if (W == 1) {
        out = "our GEMM (world 1)";
      } else if (fused) {
        out = "fused: gemmReduceScatter's kernel (" + fused_split(i) + ", " + p + "), then our allGather";
      } else {
        out = "decomposed: our GEMM, then our allReduce (" + p + ")";
      }
    } else if (across && i.algo == k::FusedAlgo::kFused) {
      out = "fused across hosts: gemmReduceScatter's one kernel (the proxy's lanes send each host its rows' "
            "partials as their tiles complete), then the hierarchical allGather (" + p + ")";
    } else {
      out = std::string(across ? "across hosts" : "larger than the data area") +
            ": our GEMM, then our allReduce" + (across ? " (hierarchical)" : "") +
            (W == 1 ? "" : " in pieces of the data area's size") + " (" + p + ")";
    }
  }
  if (needs > ctx.area) {
    out += "; refused: " + shortfall(needs, ctx.area) + " (raise spark.fusedcomm.cuda.symmetricBytes)";
  } else if (unless_gathered > 0) {
    out += "; refused unless the gathered A is asked for: without it the op " +
           shortfall(unless_gathered, ctx.area) + " (raise spark.fusedcomm.cuda.symmetricBytes)";
  }
  return out;
}

}  // namespace fusedcomm
