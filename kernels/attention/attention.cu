// The attention launcher: argument checks, tensor maps, the grid.
#include "kernels/attention/attention.h"

#include <cmath>

#include "kernels/attention/detail/bshd_map.h"
#include "kernels/attention/detail/flash_fwd.cuh"
#include "kernels/attention/tuning.h"

namespace fusedcomm::kernels {

namespace {

static_assert(tuning::kAttnBlockN == detail::FlashCfg<128>::kBN, "tuning.h and the kernel's tile disagree");

using detail::encode_bshd;

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }
bool stride_ok(int64_t s) { return s >= 0 && s % 8 == 0 && s < (int64_t{1} << 36); }

template <int D, int kWG, int kLoop>
cudaError_t launch_cfg(const AttentionArgs& a, cudaStream_t stream) {
  using C = detail::FlashCfg<D, kWG>;
  CUtensorMap tq, tk, tv;
  if (!encode_bshd(&tq, a.q, a.batch, a.q_len, a.q_heads, D, C::kBM) ||
      !encode_bshd(&tk, a.k, a.batch, a.kv_len, a.kv_heads, D) ||
      !encode_bshd(&tv, a.v, a.batch, a.kv_len, a.kv_heads, D)) {
    return cudaErrorInvalidValue;
  }
  detail::FlashParams p{};
  p.o = a.o;
  p.o_sb = a.o_stride_b;
  p.o_ss = a.o_stride_s;
  p.o_sh = a.o_stride_h;
  p.lse = a.lse;
  p.o_acc = a.o_acc;
  p.lse_sh = a.lse_stride_h != 0 ? a.lse_stride_h : a.q_len;
  p.lse_sb = a.lse_stride_b != 0 ? a.lse_stride_b : a.q_heads * a.q_len;
  p.acc_sb = a.acc_stride_b != 0 ? a.acc_stride_b : a.q_len * a.q_heads * D;
  p.acc = static_cast<int>(a.acc);
  p.q_len = static_cast<int>(a.q_len);
  p.kv_len = static_cast<int>(a.kv_len);
  p.q_heads = static_cast<int>(a.q_heads);
  p.group = static_cast<int>(a.q_heads / a.kv_heads);
  p.m_tiles = static_cast<int>((a.q_len + C::kBM - 1) / C::kBM);
  p.causal = a.causal ? 1 : 0;
  p.delta = detail::flash_causal_delta(a.q_pos0, a.k_pos0, a.q_len, a.kv_len);
  const float scale = a.scale != 0.0f ? a.scale : 1.0f / std::sqrt(static_cast<float>(D));
  p.scale_log2 = scale * 1.4426950408889634f;
  auto kernel = detail::flash_fwd_kernel<D, kWG, kLoop>;
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmemBytes);
  if (e != cudaSuccess) return e;
  const dim3 grid(static_cast<unsigned>(p.m_tiles), static_cast<unsigned>(a.q_heads),
                  static_cast<unsigned>(a.batch));
  kernel<<<grid, C::kThreads, C::kSmemBytes, stream>>>(tq, tk, tv, p);
  return cudaGetLastError();
}

template <int D>
cudaError_t launch_d(const AttentionArgs& a, cudaStream_t stream) {
  if constexpr (D == 128) {
    return launch_cfg<128, tuning::kAttnWarpgroups128, tuning::kAttnLoop128>(a, stream);
  } else {
    return launch_cfg<64, tuning::kAttnWarpgroups64, tuning::kAttnLoop64>(a, stream);
  }
}

}  // namespace

const char* attention_check(const AttentionArgs& a) {
  if (a.head_dim != 64 && a.head_dim != 128) return "head_dim must be 64 or 128";
  if (a.batch < 0 || a.q_len < 0 || a.kv_len < 0) return "negative extent";
  if (a.q_heads <= 0 || a.kv_heads <= 0 || a.q_heads % a.kv_heads != 0)
    return "q_heads must be a positive multiple of kv_heads";
  if (a.batch > 65535 || a.q_heads > 65535) return "batch and q_heads must be at most 65535";
  if (a.q_len >= (int64_t{1} << 31) - 256 || a.kv_len >= (int64_t{1} << 31) - 256) return "sequence too long";
  if (a.scale < 0.0f || !std::isfinite(a.scale)) return "scale must be finite and >= 0";
  const AttnTensor* ins[3] = {&a.q, &a.k, &a.v};
  for (const AttnTensor* t : ins) {
    if (t->ptr == nullptr && a.batch > 0) return "q, k and v must not be null";
    if (!aligned16(t->ptr)) return "q, k and v must be 16-byte aligned";
    if (!stride_ok(t->stride_b) || !stride_ok(t->stride_s) || !stride_ok(t->stride_h))
      return "q, k and v strides must be non-negative multiples of 8 elements";
  }
  if (!aligned16(a.o) || !stride_ok(a.o_stride_b) || !stride_ok(a.o_stride_s) || !stride_ok(a.o_stride_h))
    return "o must be 16-byte aligned with strides that are multiples of 8 elements";
  if (a.acc == AttnAccum::kNone) {
    if (a.o == nullptr && a.batch > 0 && a.q_len > 0) return "o must not be null";
  } else {
    if (a.o_acc == nullptr || a.lse == nullptr) return "accumulation needs o_acc and lse";
    if (reinterpret_cast<uintptr_t>(a.o_acc) % 16 != 0) return "o_acc must be 16-byte aligned";
  }
  return nullptr;
}

cudaError_t launch_attention(const AttentionArgs& a, cudaStream_t stream) {
  if (attention_check(a) != nullptr) return cudaErrorInvalidValue;
  if (a.batch == 0 || a.q_len == 0) return cudaSuccess;
  return a.head_dim == 128 ? launch_d<128>(a, stream) : launch_d<64>(a, stream);
}

}  // namespace fusedcomm::kernels
