// The attention backward launcher: argument checks, tensor maps, the passes.
#include "kernels/attention/attention_bwd.h"

#include <cmath>

#include "kernels/attention/detail/bshd_map.h"
#include "kernels/attention/detail/flash_bwd.cuh"
#include "kernels/attention/tuning.h"

namespace fusedcomm::kernels {

namespace {

using detail::encode_bshd;

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }
bool stride_ok(int64_t s) { return s >= 0 && s % 8 == 0 && s < (int64_t{1} << 36); }
bool tensor_ok(const AttnTensor& t) {
  return aligned16(t.ptr) && stride_ok(t.stride_b) && stride_ok(t.stride_s) && stride_ok(t.stride_h);
}
bool grad_ok(const AttnGrad& g) {
  return g.ptr != nullptr && aligned16(g.ptr) && stride_ok(g.stride_b) && stride_ok(g.stride_s) &&
         stride_ok(g.stride_h);
}
// Dense (B, S, H, D) strides where a view leaves them 0.
AttnTensor dense_or(const AttnTensor& t, int64_t s, int64_t h, int64_t d) {
  AttnTensor r = t;
  if (r.stride_h == 0) r.stride_h = d;
  if (r.stride_s == 0) r.stride_s = h * d;
  if (r.stride_b == 0) r.stride_b = s * h * d;
  return r;
}
AttnGrad dense_or(const AttnGrad& g, int64_t s, int64_t h, int64_t d) {
  AttnGrad r = g;
  if (r.stride_h == 0) r.stride_h = d;
  if (r.stride_s == 0) r.stride_s = h * d;
  if (r.stride_b == 0) r.stride_b = s * h * d;
  return r;
}

// Where dQ is computed (detail::BwdDq): dq_path, else tuning.h's choice for the stored mode; the
// accumulate mode (the ring) keeps the separate pass, whose sums are bit-reproducible.
int dq_mode(const AttentionBwdArgs& a) {
  if (a.dq_path != 0)
    return a.dq_path == 1 ? detail::kDqPass : a.dq_path == 2 ? detail::kDqRed : detail::kDqTma;
  if (a.mode == AttnGradMode::kAdd) return detail::kDqPass;
  return a.head_dim == 128 ? tuning::kAttnBwdDq128 : tuning::kAttnBwdDq64;
}
bool fused_dq(const AttentionBwdArgs& a) { return dq_mode(a) != detail::kDqPass; }

// (B, S, H, D) fp32 at p's dq pointer and strides, added into in boxes of 32 columns × 1 head ×
// 64 rows × 1 batch from 128-byte swizzled shared memory; rows past S are dropped.
bool encode_dq_f32(CUtensorMap* map, const detail::BwdParams& p, int64_t b, int64_t s, int64_t h, int64_t d) {
  auto encode = detail::tensor_map_encoder();
  if (encode == nullptr) return false;
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(d), static_cast<cuuint64_t>(h),
                              static_cast<cuuint64_t>(s > 0 ? s : 1), static_cast<cuuint64_t>(b > 0 ? b : 1)};
  auto stride = [](int64_t st, int64_t fallback) {
    return static_cast<cuuint64_t>((st > 0 ? st : fallback) * 4);
  };
  const cuuint64_t strides[3] = {stride(p.dq_sh, d), stride(p.dq_ss, h * d), stride(p.dq_sb, s * h * d)};
  const cuuint32_t box[4] = {32, 1, 64, 1};
  const cuuint32_t elem_strides[4] = {1, 1, 1, 1};
  return encode(map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, p.dq, dims, strides, box, elem_strides,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// δ (launch_attention_bwd_delta), and with `zero` dQ's dense fp32 accumulator zeroed in the same
// pass over the rows.
cudaError_t launch_delta(const AttnTensor& o_in, const AttnTensor& g_in, float* delta, int64_t delta_stride_b,
                         int64_t delta_stride_h, int64_t batch, int64_t q_len, int64_t q_heads,
                         int64_t head_dim, float* zero, cudaStream_t stream) {
  if (head_dim != 64 && head_dim != 128) return cudaErrorInvalidValue;
  if (batch < 0 || q_len < 0 || q_heads <= 0 || delta == nullptr) return cudaErrorInvalidValue;
  if (!tensor_ok(o_in) || !tensor_ok(g_in) || o_in.ptr == nullptr || g_in.ptr == nullptr)
    return cudaErrorInvalidValue;
  if (zero != nullptr && !aligned16(zero)) return cudaErrorInvalidValue;
  const int64_t rows = batch * q_len * q_heads;
  if (rows == 0) return cudaSuccess;
  const AttnTensor o = dense_or(o_in, q_len, q_heads, head_dim);
  const AttnTensor g = dense_or(g_in, q_len, q_heads, head_dim);
  const int64_t sh = delta_stride_h != 0 ? delta_stride_h : q_len;
  const int64_t sb = delta_stride_b != 0 ? delta_stride_b : q_heads * q_len;
  const int threads = 256;
  const int64_t blocks = (rows * 8 + threads - 1) / threads;
  if (blocks > 0x7fffffff) return cudaErrorInvalidValue;
  if (head_dim == 128) {
    detail::flash_bwd_delta_kernel<128><<<static_cast<unsigned>(blocks), threads, 0, stream>>>(
        o.ptr, o.stride_b, o.stride_s, o.stride_h, g.ptr, g.stride_b, g.stride_s, g.stride_h, delta, sb, sh,
        static_cast<int>(q_len), static_cast<int>(q_heads), rows, zero);
  } else {
    detail::flash_bwd_delta_kernel<64><<<static_cast<unsigned>(blocks), threads, 0, stream>>>(
        o.ptr, o.stride_b, o.stride_s, o.stride_h, g.ptr, g.stride_b, g.stride_s, g.stride_h, delta, sb, sh,
        static_cast<int>(q_len), static_cast<int>(q_heads), rows, zero);
  }
  return cudaGetLastError();
}

template <int D, int kDq>
cudaError_t launch_dkdv(const AttentionBwdArgs& a, detail::BwdParams p, cudaStream_t stream) {
  using C = detail::BwdKVCfg<D, kDq>;
  CUtensorMap tq, tk, tv, tdo, tdq;
  if (!encode_bshd(&tq, a.q, a.batch, a.q_len, a.q_heads, D, C::kBM) ||
      !encode_bshd(&tk, a.k, a.batch, a.kv_len, a.kv_heads, D, C::kBN) ||
      !encode_bshd(&tv, a.v, a.batch, a.kv_len, a.kv_heads, D, C::kBN) ||
      !encode_bshd(&tdo, a.d_o, a.batch, a.q_len, a.q_heads, D, C::kBM)) {
    return cudaErrorInvalidValue;
  }
  if constexpr (kDq == detail::kDqTma) {
    if (!encode_dq_f32(&tdq, p, a.batch, a.q_len, a.q_heads, D)) return cudaErrorInvalidValue;
  } else {
    tdq = tq;  // not read
  }
  p.tiles = static_cast<int>((a.kv_len + C::kBN - 1) / C::kBN);
  auto kernel = detail::flash_bwd_dkdv_kernel<D, kDq>;
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmemBytes);
  if (e != cudaSuccess) return e;
  const dim3 grid(static_cast<unsigned>(p.tiles), static_cast<unsigned>(a.kv_heads),
                  static_cast<unsigned>(a.batch));
  kernel<<<grid, 384, C::kSmemBytes, stream>>>(tq, tk, tv, tdo, tdq, p);
  return cudaGetLastError();
}

template <int D>
cudaError_t launch_passes(const AttentionBwdArgs& a, cudaStream_t stream) {
  const bool add = a.mode == AttnGradMode::kAdd;
  // With no query rows there is no dQ to add: the plain dK/dV pass stores the zeros.
  const int dq_kind = a.q_len > 0 ? dq_mode(a) : detail::kDqPass;
  const bool fused = dq_kind != detail::kDqPass;
  detail::BwdParams p{};
  const AttnGrad dq = dense_or(a.dq, a.q_len, a.q_heads, D);
  const AttnGrad dk = dense_or(a.dk, a.kv_len, a.kv_heads, D);
  const AttnGrad dv = dense_or(a.dv, a.kv_len, a.kv_heads, D);
  p.dq = dq.ptr;
  p.dk = dk.ptr;
  p.dv = dv.ptr;
  p.dq_sb = dq.stride_b;
  p.dq_ss = dq.stride_s;
  p.dq_sh = dq.stride_h;
  p.dk_sb = dk.stride_b;
  p.dk_ss = dk.stride_s;
  p.dk_sh = dk.stride_h;
  p.dv_sb = dv.stride_b;
  p.dv_ss = dv.stride_s;
  p.dv_sh = dv.stride_h;
  p.lse = a.lse;
  p.delta = a.delta;
  p.lse_sh = a.lse_stride_h != 0 ? a.lse_stride_h : a.q_len;
  p.lse_sb = a.lse_stride_b != 0 ? a.lse_stride_b : a.q_heads * a.q_len;
  p.dl_sh = a.delta_stride_h != 0 ? a.delta_stride_h : a.q_len;
  p.dl_sb = a.delta_stride_b != 0 ? a.delta_stride_b : a.q_heads * a.q_len;
  p.add = add ? 1 : 0;
  p.q_len = static_cast<int>(a.q_len);
  p.kv_len = static_cast<int>(a.kv_len);
  p.q_heads = static_cast<int>(a.q_heads);
  p.group = static_cast<int>(a.q_heads / a.kv_heads);
  p.causal = a.causal ? 1 : 0;
  p.dpos = detail::flash_causal_delta(a.q_pos0, a.k_pos0, a.q_len, a.kv_len);
  p.scale = a.scale != 0.0f ? a.scale : 1.0f / std::sqrt(static_cast<float>(D));
  p.scale_log2 = p.scale * 1.4426950408889634f;

  cudaError_t e = cudaSuccess;
  // dQ in the dK/dV pass, kStore: accumulated in the workspace, zeroed first (by the δ pass when
  // it runs), rounded after.
  const bool via_acc = fused && !add;
  if (!a.delta_ready && a.q_len > 0) {
    e = launch_delta(a.o, a.d_o, a.delta, p.dl_sb, p.dl_sh, a.batch, a.q_len, a.q_heads, D,
                     via_acc ? a.dq_acc : nullptr, stream);
    if (e != cudaSuccess) return e;
  }
  if (via_acc) {
    p.dq = a.dq_acc;
    p.dq_sh = D;
    p.dq_ss = a.q_heads * D;
    p.dq_sb = a.q_len * a.q_heads * D;
    p.add = 0;
    if (a.delta_ready) {
      const size_t bytes = static_cast<size_t>(a.batch) * a.q_len * a.q_heads * D * sizeof(float);
      if ((e = cudaMemsetAsync(a.dq_acc, 0, bytes, stream)) != cudaSuccess) return e;
    }
  }
  if (a.kv_len > 0 && !(add && a.q_len == 0)) {
    e = dq_kind == detail::kDqTma   ? launch_dkdv<D, detail::kDqTma>(a, p, stream)
        : dq_kind == detail::kDqRed ? launch_dkdv<D, detail::kDqRed>(a, p, stream)
                                    : launch_dkdv<D, detail::kDqPass>(a, p, stream);
    if (e != cudaSuccess) return e;
  }
  if (via_acc) {
    return launch_attention_grad_convert(a.dq_acc, 0, 0, 0, static_cast<__nv_bfloat16*>(dq.ptr), dq.stride_b,
                                         dq.stride_s, dq.stride_h, a.batch, a.q_len, a.q_heads, D, stream);
  }
  if (fused) return cudaSuccess;
  if (a.q_len > 0) {
    using C = detail::BwdQCfg<D>;
    CUtensorMap tq, tk, tv, tdo;
    if (!encode_bshd(&tq, a.q, a.batch, a.q_len, a.q_heads, D, C::kBM) ||
        !encode_bshd(&tk, a.k, a.batch, a.kv_len, a.kv_heads, D, C::kBN) ||
        !encode_bshd(&tv, a.v, a.batch, a.kv_len, a.kv_heads, D, C::kBN) ||
        !encode_bshd(&tdo, a.d_o, a.batch, a.q_len, a.q_heads, D, C::kBM)) {
      return cudaErrorInvalidValue;
    }
    p.tiles = static_cast<int>((a.q_len + C::kBM - 1) / C::kBM);
    auto kernel = detail::flash_bwd_dq_kernel<D>;
    if ((e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmemBytes)) !=
        cudaSuccess) {
      return e;
    }
    const dim3 grid(static_cast<unsigned>(p.tiles), static_cast<unsigned>(a.q_heads),
                    static_cast<unsigned>(a.batch));
    kernel<<<grid, 384, C::kSmemBytes, stream>>>(tq, tk, tv, tdo, p);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
  }
  return cudaSuccess;
}

}  // namespace

const char* attention_bwd_check(const AttentionBwdArgs& a) {
  if (a.head_dim != 64 && a.head_dim != 128) return "head_dim must be 64 or 128";
  if (a.batch < 0 || a.q_len < 0 || a.kv_len < 0) return "negative extent";
  if (a.q_heads <= 0 || a.kv_heads <= 0 || a.q_heads % a.kv_heads != 0)
    return "q_heads must be a positive multiple of kv_heads";
  if (a.batch > 65535 || a.q_heads > 65535) return "batch and q_heads must be at most 65535";
  if (a.q_len >= (int64_t{1} << 31) - 256 || a.kv_len >= (int64_t{1} << 31) - 256) return "sequence too long";
  if (a.scale < 0.0f || !std::isfinite(a.scale)) return "scale must be finite and >= 0";
  if (a.batch == 0) return nullptr;
  const AttnTensor* ins[4] = {&a.q, &a.k, &a.v, &a.d_o};
  for (const AttnTensor* t : ins) {
    if (t->ptr == nullptr) return "q, k, v and d_o must not be null";
    if (!tensor_ok(*t))
      return "q, k, v and d_o must be 16-byte aligned with strides that are multiples of 8 elements";
  }
  if (!a.delta_ready && (a.o.ptr == nullptr || !tensor_ok(a.o)))
    return "o must be 16-byte aligned with strides that are multiples of 8 elements";
  if (a.lse == nullptr || reinterpret_cast<uintptr_t>(a.lse) % 4 != 0)
    return "lse must not be null (4-byte aligned)";
  if (a.delta == nullptr || reinterpret_cast<uintptr_t>(a.delta) % 4 != 0)
    return "delta must not be null (4-byte aligned)";
  if (a.lse_stride_b < 0 || a.lse_stride_h < 0 || a.delta_stride_b < 0 || a.delta_stride_h < 0)
    return "negative lse or delta stride";
  if (!grad_ok(a.dq) || !grad_ok(a.dk) || !grad_ok(a.dv))
    return "dq, dk and dv must not be null, 16-byte aligned, with strides that are multiples of 8 elements";
  if (a.dq_path < 0 || a.dq_path > 3) return "dq_path must be 0, 1, 2 or 3";
  if (attention_bwd_dq_acc_bytes(a) > 0 && (a.dq_acc == nullptr || !aligned16(a.dq_acc)))
    return "dq_acc (attention_bwd_dq_acc_bytes) must not be null and 16-byte aligned";
  return nullptr;
}

size_t attention_bwd_dq_acc_bytes(const AttentionBwdArgs& a) {
  if (a.mode != AttnGradMode::kStore || !fused_dq(a) || a.batch <= 0 || a.q_len <= 0 || a.q_heads <= 0 ||
      a.head_dim <= 0)
    return 0;
  return static_cast<size_t>(a.batch) * a.q_len * a.q_heads * a.head_dim * sizeof(float);
}

cudaError_t launch_attention_bwd(const AttentionBwdArgs& a, cudaStream_t stream) {
  if (attention_bwd_check(a) != nullptr) return cudaErrorInvalidValue;
  if (a.batch == 0) return cudaSuccess;
  return a.head_dim == 128 ? launch_passes<128>(a, stream) : launch_passes<64>(a, stream);
}

cudaError_t launch_attention_bwd_delta(const AttnTensor& o, const AttnTensor& d_o, float* delta,
                                       int64_t delta_stride_b, int64_t delta_stride_h, int64_t batch,
                                       int64_t q_len, int64_t q_heads, int64_t head_dim,
                                       cudaStream_t stream) {
  return launch_delta(o, d_o, delta, delta_stride_b, delta_stride_h, batch, q_len, q_heads, head_dim, nullptr,
                      stream);
}

cudaError_t launch_attention_grad_convert(const float* src, int64_t src_sb, int64_t src_ss, int64_t src_sh,
                                          __nv_bfloat16* dst, int64_t dst_sb, int64_t dst_ss, int64_t dst_sh,
                                          int64_t batch, int64_t seq, int64_t heads, int64_t head_dim,
                                          cudaStream_t stream) {
  if (batch < 0 || seq < 0 || heads <= 0 || head_dim <= 0 || head_dim % 2 != 0) return cudaErrorInvalidValue;
  const int64_t pairs = batch * seq * heads * head_dim / 2;
  if (pairs == 0) return cudaSuccess;
  if (src == nullptr || dst == nullptr || reinterpret_cast<uintptr_t>(src) % 8 != 0 ||
      reinterpret_cast<uintptr_t>(dst) % 4 != 0)
    return cudaErrorInvalidValue;
  if (src_sb == 0) src_sh = head_dim, src_ss = heads * head_dim, src_sb = seq * heads * head_dim;
  if (dst_sb == 0) dst_sh = head_dim, dst_ss = heads * head_dim, dst_sb = seq * heads * head_dim;
  for (int64_t s : {src_sb, src_ss, src_sh, dst_sb, dst_ss, dst_sh})
    if (s < 0 || s % 2 != 0) return cudaErrorInvalidValue;
  const int threads = 256;
  // Eight elements per thread where every row starts 16-byte aligned in both tensors.
  const int64_t vecs = pairs / 4;
  const bool vec8 = head_dim % 8 == 0 && reinterpret_cast<uintptr_t>(src) % 16 == 0 &&
                    reinterpret_cast<uintptr_t>(dst) % 16 == 0 && src_sb % 4 == 0 && src_ss % 4 == 0 &&
                    src_sh % 4 == 0 && dst_sb % 8 == 0 && dst_ss % 8 == 0 && dst_sh % 8 == 0 &&
                    vecs <= int64_t{0xffffffff} - 65536 * threads;
  if (vec8) {
    int64_t blocks = (vecs + threads - 1) / threads;
    if (blocks > 65536) blocks = 65536;
    detail::flash_bwd_convert8_kernel<<<static_cast<unsigned>(blocks), threads, 0, stream>>>(
        src, src_sb, src_ss, src_sh, dst, dst_sb, dst_ss, dst_sh, static_cast<uint32_t>(seq),
        static_cast<uint32_t>(heads), static_cast<uint32_t>(head_dim / 8), static_cast<uint32_t>(vecs));
    return cudaGetLastError();
  }
  int64_t blocks = (pairs + threads - 1) / threads;
  if (blocks > 65536) blocks = 65536;
  detail::flash_bwd_convert_kernel<<<static_cast<unsigned>(blocks), threads, 0, stream>>>(
      src, src_sb, src_ss, src_sh, dst, dst_sb, dst_ss, dst_sh, static_cast<int>(seq),
      static_cast<int>(heads), static_cast<int>(head_dim / 2), pairs);
  return cudaGetLastError();
}

}  // namespace fusedcomm::kernels
