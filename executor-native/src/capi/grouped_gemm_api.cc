// The C API's single-rank grouped GEMM (fc_grouped_gemm): the host backend's reference or the
// GPU's grouped GEMM over the same offsets.
#include "boundary.h"
#include "fusedcomm/runtime/device_gemm.h"

using namespace fusedcomm;
using capi::guarded;

extern "C" {

fc_status_t fc_grouped_gemm(fc_backend_t backend, fc_dtype_t dtype, const void* a, const void* w, void* c,
                            const int64_t* offsets, int64_t groups, int64_t rows, int64_t n, int64_t k,
                            fc_weight_layout_t layout) {
  return guarded([&] {
    constexpr const char* kOp = "groupedGemm";
    FC_REQUIRE(groups >= 0, std::string(kOp) + ": groups = " + std::to_string(groups) + " must be >= 0");
    capi::require_size(kOp, "a", dtype, {rows, k});
    capi::require_size(kOp, "w", dtype, {groups, n, k});
    capi::require_size(kOp, "c", dtype, {rows, n});
    const WeightLayout l = capi::weight_layout(layout);
    switch (capi::backend(backend)) {
      case Backend::kHost:
        host::grouped_gemm(capi::floating(dtype), a, w, c, offsets, groups, rows, n, k, l);
        return;
      case Backend::kCuda:
        FC_REQUIRE(dtype == FC_DTYPE_BF16, std::string(kOp) + " on the cuda backend takes bf16 tensors");
        device_grouped_gemm_bf16(a, w, c, offsets, groups, rows, n, k, l);
        return;
      case Backend::kAuto: break;
    }
    fail(ErrorKind::kInvalidArgument,
         std::string(kOp) + ": name the backend to run on (cuda or host), not auto");
  });
}

}  // extern "C"
