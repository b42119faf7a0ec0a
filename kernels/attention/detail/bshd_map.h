// Host side: TMA tensor maps over (B, S, H, D) bf16 views, shared by the attention forward and
// backward launchers.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled

#include <cstdint>

#include "kernels/attention/attention.h"
#include "kernels/common/driver_entry.h"

namespace fusedcomm::kernels::detail {

inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const auto fn = driver_entry<PFN_cuTensorMapEncodeTiled_v12000>("cuTensorMapEncodeTiled", 12000);
  return fn;
}

// (B, S, H, D) bf16, read in boxes of 64 columns × 1 head × box_rows rows × 1 batch, 128-byte
// swizzled: each box is one box_rows × 128-byte panel in shared memory. Rows past S read as 0.
inline bool encode_bshd(CUtensorMap* map, const AttnTensor& t, int64_t b, int64_t s, int64_t h, int64_t d,
                        uint32_t box_rows = 128) {
  auto encode = tensor_map_encoder();
  if (encode == nullptr) return false;
  // Extents of 0 (no keys) still need a valid map; nothing is loaded from it then.
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(d), static_cast<cuuint64_t>(h),
                              static_cast<cuuint64_t>(s > 0 ? s : 1), static_cast<cuuint64_t>(b > 0 ? b : 1)};
  // A stride of an extent-1 dimension is never stepped over; give it a legal value.
  auto stride = [](int64_t st, int64_t fallback) {
    return static_cast<cuuint64_t>((st > 0 ? st : fallback) * 2);
  };
  const cuuint64_t strides[3] = {stride(t.stride_h, d), stride(t.stride_s, h * d),
                                 stride(t.stride_b, s * h * d)};
  const cuuint32_t box[4] = {64, 1, box_rows, 1};
  const cuuint32_t elem_strides[4] = {1, 1, 1, 1};
  return encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, const_cast<__nv_bfloat16*>(t.ptr), dims, strides,
                box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

}  // namespace fusedcomm::kernels::detail
