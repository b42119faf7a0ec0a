// What host_ops_test and host_moe_attention_test share: the in-process harness (check counts,
// the random source, error descriptions), reference number formats written independently of
// the implementation, a raw tensor of either dtype, and the per-element tolerances:
//   fp32 output:  |got - ref| <= acc + 1e-5 · (|ref| + acc)
//   bf16 output:  |got - ref| <= acc + 2^-8 · (|ref| + acc)        (half an ulp of bf16)
// where acc bounds the fp32 accumulation error: 2 · terms · 2^-24 · sum|terms|.
#pragma once

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <random>
#include <string>
#include <vector>

#include "fusedcomm/host/host_ops.h"
#include "fusedcomm/runtime/errors.h"
#include "fusedcomm/runtime/split.h"
#include "support/check.h"
#include "support/thread_exchanger.h"

namespace fusedcomm::testing::host_ops {

using fusedcomm::Error;
using fusedcomm::ErrorKind;
using fusedcomm::Exchanger;
using fusedcomm::RecvBlock;
using fusedcomm::SendBlock;
using fusedcomm::split_count;
using fusedcomm::split_offset;
using fusedcomm::testing::run_ranks;
using namespace fusedcomm::host;

// ---- harness --------------------------------------------------------------------------------
using fusedcomm::testing::check;
using fusedcomm::testing::g_failed;
using fusedcomm::testing::g_passed;
#define CHECK(cond, what) \
  check((cond), std::string(what) + "  [" #cond ", line " + std::to_string(__LINE__) + "]")

inline std::mt19937_64 g_rng;

inline const char* name(DType t) { return t == DType::kF32 ? "f32" : "bf16"; }
inline const char* name(WeightLayout l) { return l == WeightLayout::kNK ? "NK" : "KN"; }
inline std::string ctx(const char* op, int w, DType t) {
  return std::string(op) + " W=" + std::to_string(w) + " " + name(t);
}

inline std::string describe(const std::exception_ptr& e) {
  if (!e) return "ok";
  try {
    std::rethrow_exception(e);
  } catch (const Error& err) {
    return "Error(kind " + std::to_string(static_cast<int>(err.kind())) + "): " + err.what();
  } catch (const std::exception& err) { return std::string("exception: ") + err.what(); }
  return "unknown exception";
}

inline bool all_ok(const std::vector<std::exception_ptr>& errors, const std::string& what) {
  bool ok = true;
  for (size_t r = 0; r < errors.size(); ++r) {
    CHECK(!errors[r], what + " rank " + std::to_string(r) + ": " + describe(errors[r]));
    ok = ok && !errors[r];
  }
  return ok;
}

// ---- reference number formats (independent of the implementation) ----------------------------
inline double bf16_value(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }

// fp32 -> bf16 by comparing distances to the two neighbouring bf16 values in fp64.
inline uint16_t ref_round_bf16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t mag = u & 0x7fffffffu;
  if (mag > 0x7f800000u) return sign | 0x7fc0;  // NaN (callers check NaN-ness, not payload)
  if (mag == 0x7f800000u) return sign | 0x7f80;
  const double x = std::fabs(static_cast<double>(f));
  const uint32_t lo = mag & 0xffff0000u, hi = lo + 0x10000u;
  const double vlo = std::bit_cast<float>(lo);
  const double vhi = hi >= 0x7f800000u ? std::ldexp(1.0, 128) : std::bit_cast<float>(hi);
  const double dlo = x - vlo, dhi = vhi - x;
  const uint32_t pick = dlo < dhi ? lo : dhi < dlo ? hi : (((lo >> 16) & 1u) ? hi : lo);
  return sign | static_cast<uint16_t>(pick >> 16);
}

// A tensor of either dtype as raw bytes.
struct Tensor {
  DType t = DType::kF32;
  std::vector<uint8_t> bytes;
  Tensor() = default;
  Tensor(DType dtype, int64_t n) : t(dtype), bytes(static_cast<size_t>(n * dtype_size(dtype))) {}
  int64_t size() const { return static_cast<int64_t>(bytes.size()) / dtype_size(t); }
  void* data() { return bytes.empty() ? nullptr : bytes.data(); }  // empty: null on purpose
  const void* data() const { return bytes.empty() ? nullptr : bytes.data(); }
  uint32_t bits(int64_t i) const {
    if (t == DType::kF32) {
      uint32_t v;
      std::memcpy(&v, bytes.data() + 4 * i, 4);
      return v;
    }
    uint16_t v;
    std::memcpy(&v, bytes.data() + 2 * i, 2);
    return v;
  }
  double at(int64_t i) const {
    return t == DType::kF32 ? static_cast<double>(std::bit_cast<float>(bits(i)))
                            : bf16_value(static_cast<uint16_t>(bits(i)));
  }
  // Stores fp32 value v, truncated to bf16 when needed (inputs only: truncation yields valid
  // bf16 values without using the implementation's rounding).
  void set(int64_t i, float v) {
    if (t == DType::kF32) {
      std::memcpy(bytes.data() + 4 * i, &v, 4);
    } else {
      const uint16_t b = static_cast<uint16_t>(std::bit_cast<uint32_t>(v) >> 16);
      std::memcpy(bytes.data() + 2 * i, &b, 2);
    }
  }
  Tensor& randomize(float lo = -1.f, float hi = 1.f) {
    std::uniform_real_distribution<float> dist(lo, hi);
    for (int64_t i = 0; i < size(); ++i) set(i, dist(g_rng));
    return *this;
  }
  Tensor& poison() {  // all-ones bytes: a NaN in both dtypes
    std::fill(bytes.begin(), bytes.end(), 0xff);
    return *this;
  }
};

inline Tensor random_tensor(DType t, int64_t n, float lo = -1.f, float hi = 1.f) {
  return Tensor(t, n).randomize(lo, hi);
}
inline Tensor poisoned(DType t, int64_t n) { return Tensor(t, n).poison(); }

// ---- comparison -----------------------------------------------------------------------------
inline constexpr double kU32 = 5.9604644775390625e-08;  // 2^-24, the fp32 unit roundoff

// acc: bound on the error of the fp32 value before its rounding to the output dtype.
inline double rounding_tol(DType t, double ref, double acc) {
  const double rel = t == DType::kF32 ? 1e-5 : std::ldexp(1.0, -8);
  return acc + rel * (std::fabs(ref) + acc) + 1e-30;
}
// A sum of `terms` products whose magnitudes add up to `mag`, accumulated in fp32.
inline double sum_tol(DType t, double ref, double mag, double terms) {
  return rounding_tol(t, ref, 2.0 * (terms + 1) * kU32 * mag);
}

struct Expect {
  std::vector<double> val, tol;
  void push(double v, double tolerance) {
    val.push_back(v);
    tol.push_back(tolerance);
  }
  // The expectations of elements [off, off + n) (a rank's block of a reduceScatter).
  Expect slice(int64_t off, int64_t n) const {
    return Expect{{val.begin() + off, val.begin() + off + n}, {tol.begin() + off, tol.begin() + off + n}};
  }
};

// The largest |got - ref| / tol seen, reported at the end to show how tight the bounds are.
inline double g_worst_ratio = 0;
inline std::string g_worst_what;

inline void check_close(const std::string& what, const Tensor& got, const Expect& e, int64_t offset = 0) {
  int64_t bad = 0;
  const int64_t n = static_cast<int64_t>(e.val.size());
  bool size_ok = got.size() >= offset + n;
  for (int64_t i = 0; size_ok && i < n; ++i) {
    const double g = got.at(offset + i), err = g == e.val[i] ? 0 : std::fabs(g - e.val[i]);  // inf == inf
    if (err / e.tol[i] > g_worst_ratio) g_worst_ratio = err / e.tol[i], g_worst_what = what;
    if (!(err <= e.tol[i])) {
      if (bad < 4)
        std::fprintf(stderr, "  %s[%lld]: got %.9g, want %.9g, tol %.3g\n", what.c_str(),
                     static_cast<long long>(i), g, e.val[i], e.tol[i]);
      ++bad;
    }
  }
  CHECK(size_ok && bad == 0,
        what + ": " + std::to_string(bad) + " of " + std::to_string(n) + " elements outside tolerance");
}

// got[got_off + i] == want[want_off + i] bit for bit, i < n.
inline bool same_bits(const Tensor& got, int64_t got_off, const Tensor& want, int64_t want_off, int64_t n) {
  if (got.t != want.t || got.size() < got_off + n || want.size() < want_off + n) return false;
  for (int64_t i = 0; i < n; ++i)
    if (got.bits(got_off + i) != want.bits(want_off + i)) return false;
  return true;
}

inline bool error_is(const std::exception_ptr& e, ErrorKind kind, const std::vector<std::string>& words) {
  if (!e) return false;
  try {
    std::rethrow_exception(e);
  } catch (const Error& err) {
    if (err.kind() != kind) return false;
    const std::string msg = err.what();
    for (const auto& w : words)
      if (msg.find(w) == std::string::npos) return false;
    return true;
  } catch (...) {}
  return false;
}

// Runs each group of checks, timed, with its counts and the tightest tolerance it reached;
// FC_TEST_SEED=<n> replays a run. The process's exit code.
struct Group {
  const char* name;
  void (*fn)();
};
inline int run_groups(const char* test, const std::vector<Group>& groups) {
  uint64_t seed = std::random_device{}();
  if (const char* s = std::getenv("FC_TEST_SEED")) seed = std::strtoull(s, nullptr, 10);
  g_rng.seed(seed);
  std::printf("%s seed %llu (FC_TEST_SEED=%llu replays it)\n", test, static_cast<unsigned long long>(seed),
              static_cast<unsigned long long>(seed));
  const auto start = std::chrono::steady_clock::now();
  for (const Group& g : groups) {
    const int before_pass = g_passed, before_fail = g_failed;
    const auto t0 = std::chrono::steady_clock::now();
    g_worst_ratio = 0;
    g_worst_what.clear();
    try {
      g.fn();
    } catch (const std::exception& e) { check(false, std::string(g.name) + " threw: " + e.what()); }
    std::printf("  %-32s %5d passed, %d failed (%.2f s); worst |error|/tol %.3g in %s\n", g.name,
                g_passed - before_pass, g_failed - before_fail,
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), g_worst_ratio,
                g_worst_what.empty() ? "-" : g_worst_what.c_str());
  }
  std::printf("total %.2f s\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  std::printf("%d passed, %d failed\n", g_passed, g_failed);
  return g_failed == 0 ? 0 : 1;
}

}  // namespace fusedcomm::testing::host_ops
