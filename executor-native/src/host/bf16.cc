// bf16 <-> fp32 conversion and the dtype plumbing every host op uses.
#include <bit>
#include <cstring>

#include "detail.h"

namespace fusedcomm::host {

uint16_t f32_to_bf16(float x) {
  uint32_t u = std::bit_cast<uint32_t>(x);
  // NaN: keep sign and the top payload bits, force the quiet bit so truncation cannot turn a
  // NaN whose payload lives in the low 16 bits into an infinity.
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  // Round to nearest even: add just under half an ulp, plus one when the kept lsb is odd.
  // Carries into the exponent are correct (including overflow to infinity).
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

float bf16_to_f32(uint16_t x) { return std::bit_cast<float>(static_cast<uint32_t>(x) << 16); }

namespace detail {

void require_dtype(DType t, const char* op) {
  FC_REQUIRE(t == DType::kF32 || t == DType::kBF16,
             std::string(op) + ": unknown dtype " + std::to_string(static_cast<int>(t)));
}

void require_nonneg(int64_t value, const char* op, const char* name) {
  FC_REQUIRE(value >= 0, std::string(op) + ": " + name + " = " + std::to_string(value) + " must be >= 0");
}

void require_data(const void* ptr, int64_t elems, const char* op, const char* name) {
  FC_REQUIRE(ptr != nullptr || elems == 0,
             std::string(op) + ": " + name + " is null but holds " + std::to_string(elems) + " elements");
}

void to_f32(DType t, const void* src, int64_t n, float* dst) {
  if (n == 0) return;
  if (t == DType::kF32) {
    std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
    return;
  }
  const auto* s = static_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(s[i]);
}

std::vector<float> to_f32(DType t, const void* src, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n));
  to_f32(t, src, n, out.data());
  return out;
}

void from_f32(DType t, const float* src, int64_t n, void* dst) {
  if (n == 0) return;
  if (t == DType::kF32) {
    std::memmove(dst, src, static_cast<size_t>(n) * sizeof(float));
    return;
  }
  auto* d = static_cast<uint16_t*>(dst);
  for (int64_t i = 0; i < n; ++i) d[i] = f32_to_bf16(src[i]);
}

}  // namespace detail
}  // namespace fusedcomm::host
