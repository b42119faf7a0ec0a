// host_ops_test: every op of the host backend on W = 1..4 in-process ranks (thread_exchanger.h),
// both dtypes, sizes that do and do not divide by W, empty edge cases. Inputs are fresh random
// values each run (seed printed; FC_TEST_SEED=<n> replays one), outputs are poisoned with NaN
// first, and every element is compared with a naive fp64 reference written here, independently
// of the implementation, under a per-element tolerance:
//   fp32 output:  |got - ref| <= acc + 1e-5 · (|ref| + acc)
//   bf16 output:  |got - ref| <= acc + 2^-8 · (|ref| + acc)        (half an ulp of bf16)
// where acc bounds the fp32 accumulation error: 2 · terms · 2^-24 · sum|terms|.
// Prints "N passed, 0 failed" and exits non-zero on any failure.
#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "support/check.h"
#include "fusedcomm/host/host_ops.h"
#include "fusedcomm/runtime/errors.h"
#include "fusedcomm/runtime/split.h"
#include "support/thread_exchanger.h"

namespace {

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
#define CHECK(cond, what) check((cond), std::string(what) + "  [" #cond ", line " + std::to_string(__LINE__) + "]")

std::mt19937_64 g_rng;

const char* name(DType t) { return t == DType::kF32 ? "f32" : "bf16"; }
const char* name(WeightLayout l) { return l == WeightLayout::kNK ? "NK" : "KN"; }
std::string ctx(const char* op, int w, DType t) {
  return std::string(op) + " W=" + std::to_string(w) + " " + name(t);
}

std::string describe(const std::exception_ptr& e) {
  if (!e) return "ok";
  try {
    std::rethrow_exception(e);
  } catch (const Error& err) {
    return "Error(kind " + std::to_string(static_cast<int>(err.kind())) + "): " + err.what();
  } catch (const std::exception& err) {
    return std::string("exception: ") + err.what();
  }
  return "unknown exception";
}

bool all_ok(const std::vector<std::exception_ptr>& errors, const std::string& what) {
  bool ok = true;
  for (size_t r = 0; r < errors.size(); ++r) {
    CHECK(!errors[r], what + " rank " + std::to_string(r) + ": " + describe(errors[r]));
    ok = ok && !errors[r];
  }
  return ok;
}

// ---- reference number formats (independent of the implementation) ----------------------------
double bf16_value(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }

// fp32 -> bf16 by comparing distances to the two neighbouring bf16 values in fp64.
uint16_t ref_round_bf16(float f) {
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

Tensor random_tensor(DType t, int64_t n, float lo = -1.f, float hi = 1.f) {
  return Tensor(t, n).randomize(lo, hi);
}
Tensor poisoned(DType t, int64_t n) { return Tensor(t, n).poison(); }

// ---- comparison -----------------------------------------------------------------------------
constexpr double kU32 = 5.9604644775390625e-08;  // 2^-24, the fp32 unit roundoff

// acc: bound on the error of the fp32 value before its rounding to the output dtype.
double rounding_tol(DType t, double ref, double acc) {
  const double rel = t == DType::kF32 ? 1e-5 : std::ldexp(1.0, -8);
  return acc + rel * (std::fabs(ref) + acc) + 1e-30;
}
// A sum of `terms` products whose magnitudes add up to `mag`, accumulated in fp32.
double sum_tol(DType t, double ref, double mag, double terms) {
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
    return Expect{{val.begin() + off, val.begin() + off + n},
                  {tol.begin() + off, tol.begin() + off + n}};
  }
};

// The largest |got - ref| / tol seen, reported at the end to show how tight the bounds are.
double g_worst_ratio = 0;
std::string g_worst_what;

void check_close(const std::string& what, const Tensor& got, const Expect& e, int64_t offset = 0) {
  int64_t bad = 0;
  const int64_t n = static_cast<int64_t>(e.val.size());
  bool size_ok = got.size() >= offset + n;
  for (int64_t i = 0; size_ok && i < n; ++i) {
    const double g = got.at(offset + i), err = std::fabs(g - e.val[i]);
    if (err / e.tol[i] > g_worst_ratio) g_worst_ratio = err / e.tol[i], g_worst_what = what;
    if (!(err <= e.tol[i])) {
      if (bad < 4)
        std::fprintf(stderr, "  %s[%lld]: got %.9g, want %.9g, tol %.3g\n", what.c_str(),
                     static_cast<long long>(i), g, e.val[i], e.tol[i]);
      ++bad;
    }
  }
  CHECK(size_ok && bad == 0, what + ": " + std::to_string(bad) + " of " + std::to_string(n) +
                                 " elements outside tolerance");
}

// got[got_off + i] == want[want_off + i] bit for bit, i < n.
bool same_bits(const Tensor& got, int64_t got_off, const Tensor& want, int64_t want_off, int64_t n) {
  if (got.t != want.t || got.size() < got_off + n || want.size() < want_off + n) return false;
  for (int64_t i = 0; i < n; ++i)
    if (got.bits(got_off + i) != want.bits(want_off + i)) return false;
  return true;
}

bool error_is(const std::exception_ptr& e, ErrorKind kind, const std::vector<std::string>& words) {
  if (!e) return false;
  try {
    std::rethrow_exception(e);
  } catch (const Error& err) {
    if (err.kind() != kind) return false;
    const std::string msg = err.what();
    for (const auto& w : words)
      if (msg.find(w) == std::string::npos) return false;
    return true;
  } catch (...) {
  }
  return false;
}

// ---- split rule -----------------------------------------------------------------------------
void test_split() {
  const int64_t counts[] = {3, 3, 2, 2}, offsets[] = {0, 3, 6, 8};
  for (int r = 0; r < 4; ++r) {
    CHECK(split_count(10, 4, r) == counts[r], "split_count(10, 4, " + std::to_string(r) + ")");
    CHECK(split_offset(10, 4, r) == offsets[r], "split_offset(10, 4, " + std::to_string(r) + ")");
  }
  CHECK(split_count(2, 4, 1) == 1 && split_count(2, 4, 2) == 0 && split_offset(2, 4, 3) == 2,
        "split of 2 over 4");
}

// ---- bf16 -----------------------------------------------------------------------------------
void test_bf16() {
  auto f = [](uint32_t u) { return std::bit_cast<float>(u); };
  struct Case { uint32_t in; uint16_t out; const char* what; };
  const Case cases[] = {
      {0x3f800000u, 0x3f80, "1.0"},
      {0x3f808000u, 0x3f80, "tie 1+2^-8 -> even (down)"},
      {0x3f818000u, 0x3f82, "tie -> even (up)"},
      {0x3f808001u, 0x3f81, "just above a tie"},
      {0x3f807fffu, 0x3f80, "just below a tie"},
      {0xbf808000u, 0xbf80, "negative tie -> even"},
      {0xbf818000u, 0xbf82, "negative tie -> even (up)"},
      {0x00000000u, 0x0000, "+0"},
      {0x80000000u, 0x8000, "-0"},
      {0x7f800000u, 0x7f80, "+inf"},
      {0xff800000u, 0xff80, "-inf"},
      {0x7f7fffffu, 0x7f80, "max float rounds to inf"},
      {0x7f7f7fffu, 0x7f7f, "largest value below max bf16's upper tie"},
      {0x00008000u, 0x0000, "denormal tie -> even 0"},
      {0x00018000u, 0x0002, "denormal tie -> even (up)"},
      {0x00010001u, 0x0001, "denormal rounds down"},
      {0x0000ffffu, 0x0001, "denormal rounds up"},
      {0x80018000u, 0x8002, "negative denormal tie"},
      {0x007fffffu, 0x0080, "largest denormal rounds up to the smallest normal"},
  };
  for (const Case& c : cases) {
    const uint16_t got = f32_to_bf16(f(c.in));
    char buf[128];
    std::snprintf(buf, sizeof buf, "f32_to_bf16(0x%08x) = 0x%04x, want 0x%04x (%s)", c.in, got,
                  c.out, c.what);
    CHECK(got == c.out, buf);
  }
  const uint32_t nans[] = {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff800001u, 0x7fa00000u,
                           0x7f80ffffu};
  for (uint32_t n : nans) {
    const uint16_t got = f32_to_bf16(f(n));
    char buf[96];
    std::snprintf(buf, sizeof buf, "f32_to_bf16(NaN 0x%08x) = 0x%04x is a quiet NaN, same sign", n,
                  got);
    CHECK((got & 0x7fc0) == 0x7fc0 && (got & 0x8000) == ((n >> 16) & 0x8000), buf);
  }
  // Every bf16 value converts to fp32 exactly and back unchanged.
  int64_t bad = 0;
  for (uint32_t b = 0; b < 65536; ++b) {
    const float x = bf16_to_f32(static_cast<uint16_t>(b));
    const bool nan = (b & 0x7fff) > 0x7f80;
    if (nan ? !std::isnan(x) : (static_cast<double>(x) != bf16_value(static_cast<uint16_t>(b)) ||
                                f32_to_bf16(x) != b))
      ++bad;
  }
  CHECK(bad == 0, "bf16 -> f32 -> bf16 round trip of all 65536 values (" + std::to_string(bad) + " bad)");
  // Random bit patterns against the distance-based reference rounding.
  bad = 0;
  std::uniform_int_distribution<uint32_t> any;
  for (int i = 0; i < 1000000; ++i) {
    uint32_t u = any(g_rng);
    if (i % 4 == 0) u = (u & 0xffff0000u) | 0x8000u;  // many exact ties
    if (i % 8 == 1) u &= 0x807fffffu;                 // many denormals
    const float x = f(u);
    if (std::isnan(x)) continue;
    if (f32_to_bf16(x) != ref_round_bf16(x)) {
      if (bad < 4) std::fprintf(stderr, "  0x%08x -> 0x%04x, want 0x%04x\n", u, f32_to_bf16(x), ref_round_bf16(x));
      ++bad;
    }
  }
  CHECK(bad == 0, "f32_to_bf16 matches the reference rounding on 1e6 random patterns");
}

// ---- exchanger --------------------------------------------------------------------------------
void test_exchanger() {
  // Uneven pairwise sizes deliver the right bytes.
  for (int w = 1; w <= 4; ++w) {
    std::vector<std::vector<std::vector<uint8_t>>> got(w);
    auto errors = run_ranks(w, [&](Exchanger& ex) {
      const int r = ex.rank();
      std::vector<std::vector<uint8_t>> out(w), in(w);
      std::vector<SendBlock> send(w);
      std::vector<RecvBlock> recv(w);
      for (int p = 0; p < w; ++p) {
        out[p].assign(static_cast<size_t>(r * 3 + p), static_cast<uint8_t>(16 * r + p));
        in[p].assign(static_cast<size_t>(p * 3 + r), 0xee);
        send[p] = {out[p].data(), out[p].size()};
        recv[p] = {in[p].data(), in[p].size()};
      }
      ex.exchange(send, recv, "test/uneven");
      got[r] = in;
    });
    bool ok = all_ok(errors, "exchanger W=" + std::to_string(w));
    for (int r = 0; ok && r < w; ++r)
      for (int p = 0; p < w; ++p)
        ok = ok && got[r][p] == std::vector<uint8_t>(p * 3 + r, static_cast<uint8_t>(16 * p + r));
    CHECK(ok, "exchanger W=" + std::to_string(w) + " delivers every block");
  }
  // A pairwise size mismatch fails on both sides (and on the uninvolved rank) as kCommunicator.
  for (int w : {2, 3}) {
    const int s = w - 2, d = w - 1;  // s sends 8 bytes, d expects 4
    auto errors = run_ranks(w, [&](Exchanger& ex) {
      const int r = ex.rank();
      std::vector<uint8_t> out(8, 1), in(8 * w, 0);
      std::vector<SendBlock> send(w, SendBlock{out.data(), 4});
      std::vector<RecvBlock> recv(w);
      for (int p = 0; p < w; ++p) recv[p] = {in.data() + 8 * p, 4};
      if (r == s) send[d].bytes = 8;
      ex.exchange(send, recv, "test/mismatch");
    });
    const std::string pair = "rank " + std::to_string(s) + " sends 8 bytes to rank " +
                             std::to_string(d) + ", which expects 4";
    for (int r = 0; r < w; ++r)
      CHECK(error_is(errors[r], ErrorKind::kCommunicator, {"size mismatch", pair, "test/mismatch"}),
            "size mismatch W=" + std::to_string(w) + " rank " + std::to_string(r) + ": " +
                describe(errors[r]));
  }
  {
    auto errors = run_ranks(2, [&](Exchanger& ex) {
      std::vector<SendBlock> send(2);
      std::vector<RecvBlock> recv(2);
      ex.exchange(send, recv, ex.rank() == 0 ? "test/a" : "test/b");
    });
    CHECK(error_is(errors[0], ErrorKind::kCommunicator, {"disagree"}) &&
              error_is(errors[1], ErrorKind::kCommunicator, {"disagree"}),
          "ranks in different steps fail: " + describe(errors[0]));
  }
  {
    const auto start = std::chrono::steady_clock::now();
    auto errors = run_ranks(
        2,
        [&](Exchanger& ex) {
          if (ex.rank() == 1) return;  // never arrives
          std::vector<SendBlock> send(2);
          std::vector<RecvBlock> recv(2);
          ex.exchange(send, recv, "test/timeout");
        },
        std::chrono::milliseconds(200));
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    CHECK(error_is(errors[0], ErrorKind::kTimeout, {"rank(s) 1", "test/timeout"}) && s < 5.0,
          "a missing rank times out: " + describe(errors[0]));
  }
}

// ---- collectives --------------------------------------------------------------------------------
void test_collectives() {
  for (int w = 1; w <= 4; ++w) {
    for (DType t : {DType::kF32, DType::kBF16}) {
      for (int64_t count : {int64_t{0}, int64_t{1}, int64_t{w - 1}, int64_t{4} * w, int64_t{103}, int64_t{1000}}) {
        const std::string what = ctx("", w, t) + " count=" + std::to_string(count);
        std::vector<Tensor> ag_in(w), rs_in(w), a2a_in(w), ag_out(w), rs_out(w), ar_out(w),
            ar_inplace(w), a2a_out(w);
        for (int r = 0; r < w; ++r) {
          const int64_t mine = split_count(count, w, r);
          ag_in[r] = random_tensor(t, mine);
          rs_in[r] = random_tensor(t, count);
          a2a_in[r] = random_tensor(t, count);
          ag_out[r] = poisoned(t, count);
          rs_out[r] = poisoned(t, mine);
          ar_out[r] = poisoned(t, count);
          ar_inplace[r] = rs_in[r];
          a2a_out[r] = poisoned(t, mine * w);
        }
        auto errors = run_ranks(w, [&](Exchanger& ex) {
          const int r = ex.rank();
          all_gather(ex, t, ag_in[r].data(), ag_out[r].data(), count);
          reduce_scatter(ex, t, rs_in[r].data(), rs_out[r].data(), count);
          all_reduce(ex, t, rs_in[r].data(), ar_out[r].data(), count);
          all_reduce(ex, t, ar_inplace[r].data(), ar_inplace[r].data(), count);
          all_to_all(ex, t, a2a_in[r].data(), a2a_out[r].data(), count);
        });
        if (!all_ok(errors, "collectives" + what)) continue;

        // References: concatenation, fp64 sums, and the fp32 rank-order sum rounded once.
        Tensor concat(t, count);
        for (int s = 0, i = 0; s < w; ++s)
          for (int64_t j = 0; j < ag_in[s].size(); ++j, ++i) std::memcpy(concat.bytes.data() + i * dtype_size(t), ag_in[s].bytes.data() + j * dtype_size(t), dtype_size(t));
        Expect sum;
        Tensor ordered(t, count);
        for (int64_t i = 0; i < count; ++i) {
          double v = 0, mag = 0;
          float f = 0;
          for (int s = 0; s < w; ++s) {
            v += rs_in[s].at(i);
            mag += std::fabs(rs_in[s].at(i));
            f = s == 0 ? static_cast<float>(rs_in[s].at(i)) : f + static_cast<float>(rs_in[s].at(i));
          }
          sum.push(v, sum_tol(t, v, mag, w));
          if (t == DType::kF32) ordered.set(i, f);
          else { const uint16_t b = ref_round_bf16(f); std::memcpy(ordered.bytes.data() + 2 * i, &b, 2); }
        }
        for (int r = 0; r < w; ++r) {
          const std::string rr = what + " rank " + std::to_string(r);
          const int64_t mine = split_count(count, w, r), off = split_offset(count, w, r);
          CHECK(same_bits(ag_out[r], 0, concat, 0, count), "allGather" + rr + " equals the concatenation");
          check_close("reduceScatter" + rr, rs_out[r], sum.slice(off, mine));
          CHECK(same_bits(rs_out[r], 0, ordered, off, mine), "reduceScatter" + rr + " adds in rank order (bitwise)");
          check_close("allReduce" + rr, ar_out[r], sum);
          CHECK(same_bits(ar_out[r], 0, ordered, 0, count), "allReduce" + rr + " adds in rank order (bitwise)");
          CHECK(same_bits(ar_inplace[r], 0, ar_out[r], 0, count), "allReduce in place" + rr + " equals out of place");
          bool a2a = true;
          for (int s = 0; s < w; ++s) a2a = a2a && same_bits(a2a_out[r], s * mine, a2a_in[s], off, mine);
          CHECK(a2a, "allToAll" + rr + ": block s is rank s's block r");
        }
      }
    }
  }
}

// ---- GEMM -------------------------------------------------------------------------------------
double weight_at(const Tensor& w, WeightLayout layout, int64_t j, int64_t kk, int64_t n, int64_t k) {
  return layout == WeightLayout::kNK ? w.at(j * k + kk) : w.at(kk * n + j);
}

// fp64 a (m×k) · op(w), plus c0 when given; tolerance for an output of dtype t.
Expect ref_gemm(DType t, const Tensor& a, const Tensor& w, int64_t m, int64_t n, int64_t k,
                WeightLayout layout, const Tensor* c0 = nullptr) {
  Expect e;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double v = c0 ? c0->at(i * n + j) : 0.0, mag = std::fabs(v);
      for (int64_t kk = 0; kk < k; ++kk) {
        const double p = a.at(i * k + kk) * weight_at(w, layout, j, kk, n, k);
        v += p;
        mag += std::fabs(p);
      }
      e.push(v, sum_tol(t, v, mag, k + 1));
    }
  }
  return e;
}

void test_gemm() {
  const int64_t shapes[][3] = {{0, 4, 3},   {3, 0, 5},    {4, 3, 0},    {1, 1, 1},     {1, 9, 1},
                               {2, 1, 7},   {17, 13, 29}, {33, 65, 257}, {96, 80, 300}, {5, 131, 64}};
  for (DType t : {DType::kF32, DType::kBF16}) {
    for (WeightLayout layout : {WeightLayout::kNK, WeightLayout::kKN}) {
      for (const auto& s : shapes) {
        const int64_t m = s[0], n = s[1], k = s[2];
        const std::string what = std::string("gemm ") + name(t) + " " + name(layout) + " " +
                                 std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k);
        const Tensor a = random_tensor(t, m * k), w = random_tensor(t, n * k);
        Tensor c = poisoned(t, m * n);
        gemm(t, a.data(), w.data(), c.data(), m, n, k, layout);
        check_close(what, c, ref_gemm(t, a, w, m, n, k, layout));
        const Tensor c0 = random_tensor(t, m * n);
        Tensor acc = c0;
        gemm(t, a.data(), w.data(), acc.data(), m, n, k, layout, /*accumulate=*/true);
        check_close(what + " accumulate", acc, ref_gemm(t, a, w, m, n, k, layout, &c0));
      }
    }
  }
  bool threw = false;
  try {
    gemm(DType::kF32, nullptr, nullptr, nullptr, -1, 2, 3, WeightLayout::kNK);
  } catch (const Error& e) {
    threw = e.kind() == ErrorKind::kInvalidArgument && std::string(e.what()).find("gemm") != std::string::npos &&
            std::string(e.what()).find("-1") != std::string::npos;
  }
  CHECK(threw, "gemm m=-1 fails with a message naming the op and the value");
}

// ---- fused GEMM + collective ------------------------------------------------------------------
void test_all_gather_gemm() {
  for (int w = 1; w <= 4; ++w)
    for (DType t : {DType::kF32, DType::kBF16})
      for (WeightLayout layout : {WeightLayout::kNK, WeightLayout::kKN})
        for (int64_t m : {int64_t{0}, int64_t{2}, int64_t{3} * w, int64_t{13}})
          for (int64_t k : {int64_t{1}, int64_t{37}}) {
            const bool keep_a = (m + k) % 2 == 1;
            const std::string what = ctx("allGatherGemm", w, t) + " " + name(layout) + " m=" +
                                     std::to_string(m) + " k=" + std::to_string(k);
            std::vector<Tensor> a(w), wt(w), c(w), ga(w);
            std::vector<int64_t> n_local(w);
            for (int r = 0; r < w; ++r) {
              n_local[r] = r == 1 ? 0 : 3 + 2 * r;  // rank 1 holds no columns
              a[r] = random_tensor(t, split_count(m, w, r) * k);
              wt[r] = random_tensor(t, n_local[r] * k);
              c[r] = poisoned(t, m * n_local[r]);
              ga[r] = poisoned(t, keep_a ? m * k : 0);
            }
            auto errors = run_ranks(w, [&](Exchanger& ex) {
              const int r = ex.rank();
              all_gather_gemm(ex, t, a[r].data(), wt[r].data(), c[r].data(),
                              keep_a ? ga[r].data() : nullptr, m, n_local[r], k, layout);
            });
            if (!all_ok(errors, what)) continue;
            Tensor full(t, m * k);
            for (int s = 0; s < w; ++s)
              for (int64_t i = 0; i < a[s].size(); ++i)
                std::memcpy(full.bytes.data() + (split_offset(m, w, s) * k + i) * dtype_size(t),
                            a[s].bytes.data() + i * dtype_size(t), dtype_size(t));
            for (int r = 0; r < w; ++r) {
              check_close(what + " rank " + std::to_string(r), c[r],
                          ref_gemm(t, full, wt[r], m, n_local[r], k, layout));
              if (keep_a)
                CHECK(same_bits(ga[r], 0, full, 0, m * k), what + " rank " + std::to_string(r) + " gathered_a");
            }
          }
}

// The sum over ranks of a_s · op(w_s), a_s: m × k_s, k_s = split_count(k, w, s). bf16_partials:
// each rank's partial rounded to bf16 first (PartialPrecision::kBF16); the implementation
// rounds its fp32 partial, this reference the exact one, so the two roundings may land one
// bf16 ulp apart: 2^-7 of the partial's term magnitudes more tolerance.
Expect ref_gemm_sum(DType t, const std::vector<Tensor>& a, const std::vector<Tensor>& wt, int64_t m,
                    int64_t n, int64_t k, int w, WeightLayout layout, bool bf16_partials = false) {
  Expect e;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double v = 0, mag = 0;
      for (int s = 0; s < w; ++s) {
        const int64_t ks = split_count(k, w, s);
        double part = 0;
        for (int64_t kk = 0; kk < ks; ++kk) {
          const double p = a[s].at(i * ks + kk) * weight_at(wt[s], layout, j, kk, n, ks);
          part += p;
          mag += std::fabs(p);
        }
        v += bf16_partials ? bf16_value(ref_round_bf16(static_cast<float>(part))) : part;
      }
      e.push(v, sum_tol(t, v, mag, k + w) + (bf16_partials ? std::ldexp(mag, -7) : 0.0));
    }
  return e;
}

// Per-rank tensors of a gemmReduceScatter + gemmAllReduce case, K split over the w ranks: A
// (m x k_r) and the weight (n x k_r) random, the reduceScatter block and the allReduce output
// poisoned.
struct GemmReduceTensors {
  std::vector<Tensor> a, wt, rs, ar;
};
GemmReduceTensors gemm_reduce_tensors(DType t, int w, int64_t m, int64_t n, int64_t k) {
  GemmReduceTensors x;
  for (int r = 0; r < w; ++r) {
    const int64_t ks = split_count(k, w, r);
    x.a.push_back(random_tensor(t, m * ks));
    x.wt.push_back(random_tensor(t, n * ks));
    x.rs.push_back(poisoned(t, split_count(m, w, r) * n));
    x.ar.push_back(poisoned(t, m * n));
  }
  return x;
}

void test_gemm_reduce() {
  for (int w = 1; w <= 4; ++w)
    for (DType t : {DType::kF32, DType::kBF16})
      for (WeightLayout layout : {WeightLayout::kNK, WeightLayout::kKN})
        for (int64_t m : {int64_t{0}, int64_t{1}, int64_t{2} * w + 1, int64_t{4} * w})
          for (int64_t k : {int64_t{2}, int64_t{45}})
            for (int64_t n : {int64_t{1}, int64_t{19}}) {
              const std::string what = ctx("", w, t) + " " + name(layout) + " m=" + std::to_string(m) +
                                       " n=" + std::to_string(n) + " k=" + std::to_string(k);
              auto [a, wt, rs, ar] = gemm_reduce_tensors(t, w, m, n, k);  // k=2 leaves ranks with no K slice
              auto errors = run_ranks(w, [&](Exchanger& ex) {
                const int r = ex.rank();
                const int64_t ks = split_count(k, w, r);
                gemm_reduce_scatter(ex, t, a[r].data(), wt[r].data(), rs[r].data(), m, n, ks, layout);
                gemm_all_reduce(ex, t, a[r].data(), wt[r].data(), ar[r].data(), m, n, ks, layout);
              });
              if (!all_ok(errors, "gemm collectives" + what)) continue;
              const Expect full = ref_gemm_sum(t, a, wt, m, n, k, w, layout);
              for (int r = 0; r < w; ++r) {
                const int64_t off = split_offset(m, w, r) * n, cnt = split_count(m, w, r) * n;
                CHECK(rs[r].size() == cnt, "gemmReduceScatter" + what + " block size");
                check_close("gemmReduceScatter" + what + " rank " + std::to_string(r), rs[r], full.slice(off, cnt));
                check_close("gemmAllReduce" + what + " rank " + std::to_string(r), ar[r], full);
                CHECK(same_bits(ar[r], 0, ar[0], 0, m * n), "gemmAllReduce" + what + " same bits on every rank");
                CHECK(same_bits(rs[r], 0, ar[r], off, cnt), "gemmReduceScatter" + what + " equals its allReduce block");
              }
            }
}

// gemmReduceScatter with bf16 partials (PartialPrecision::kBF16): each rank's partial product is
// rounded to bf16 before the fp32 sum. Directed: two ranks whose only partial is 1 + 2^-10
// (exact in fp32; its bf16 neighbours are 1 and 1 + 2^-7) give exactly 2, where fp32 partials
// give 2 + 2^-9. Random: against Σ_s bf16(partial_s) (ref_gemm_sum).
void test_gemm_reduce_bf16_partials() {
  {
    const float x = 1.f + std::ldexp(1.f, -10);
    std::vector<Tensor> a(2), wt(2), f32(2), b16(2);
    for (int r = 0; r < 2; ++r) {
      a[r] = Tensor(DType::kF32, 2);  // m = 2 rows, k_r = 1
      a[r].set(0, x);
      a[r].set(1, x);
      wt[r] = Tensor(DType::kF32, 1);
      wt[r].set(0, 1.f);
      f32[r] = poisoned(DType::kF32, 1);
      b16[r] = poisoned(DType::kF32, 1);
    }
    std::vector<Tensor> ar_f32(2), ar_b16(2);
    for (int r = 0; r < 2; ++r) {
      ar_f32[r] = poisoned(DType::kF32, 2);
      ar_b16[r] = poisoned(DType::kF32, 2);
    }
    auto errors = run_ranks(2, [&](Exchanger& ex) {
      const int r = ex.rank();
      gemm_reduce_scatter(ex, DType::kF32, a[r].data(), wt[r].data(), f32[r].data(), 2, 1, 1,
                          WeightLayout::kNK, PartialPrecision::kF32);
      gemm_reduce_scatter(ex, DType::kF32, a[r].data(), wt[r].data(), b16[r].data(), 2, 1, 1,
                          WeightLayout::kNK, PartialPrecision::kBF16);
      gemm_all_reduce(ex, DType::kF32, a[r].data(), wt[r].data(), ar_f32[r].data(), 2, 1, 1,
                      WeightLayout::kNK, PartialPrecision::kF32);
      gemm_all_reduce(ex, DType::kF32, a[r].data(), wt[r].data(), ar_b16[r].data(), 2, 1, 1,
                      WeightLayout::kNK, PartialPrecision::kBF16);
    });
    if (all_ok(errors, "gemmReduceScatter / gemmAllReduce partial precision, directed")) {
      for (int r = 0; r < 2; ++r) {
        const std::string at = " rank " + std::to_string(r);
        CHECK(f32[r].at(0) == 2.0 + std::ldexp(1.0, -9), "fp32 partials sum to 2 + 2^-9" + at);
        CHECK(b16[r].at(0) == 2.0, "bf16 partials round 1 + 2^-10 to 1 before the sum: 2" + at);
        for (int64_t i = 0; i < 2; ++i) {
          CHECK(ar_f32[r].at(i) == 2.0 + std::ldexp(1.0, -9), "gemmAllReduce, fp32 partials: 2 + 2^-9" + at);
          CHECK(ar_b16[r].at(i) == 2.0, "gemmAllReduce, bf16 partials: 2" + at);
        }
      }
    }
  }
  for (int w = 1; w <= 4; ++w)
    for (DType t : {DType::kF32, DType::kBF16})
      for (WeightLayout layout : {WeightLayout::kNK, WeightLayout::kKN})
        for (int64_t m : {int64_t{1}, int64_t{2} * w + 1}) {
          const int64_t k = 45, n = 19;
          const std::string what = ctx("", w, t) + " " + name(layout) + " m=" + std::to_string(m) +
                                   " bf16 partials";
          auto [a, wt, rs, ar] = gemm_reduce_tensors(t, w, m, n, k);
          auto errors = run_ranks(w, [&](Exchanger& ex) {
            const int r = ex.rank();
            gemm_reduce_scatter(ex, t, a[r].data(), wt[r].data(), rs[r].data(), m, n,
                                split_count(k, w, r), layout, PartialPrecision::kBF16);
            gemm_all_reduce(ex, t, a[r].data(), wt[r].data(), ar[r].data(), m, n,
                            split_count(k, w, r), layout, PartialPrecision::kBF16);
          });
          if (!all_ok(errors, "gemmReduceScatter / gemmAllReduce" + what)) continue;
          const Expect full = ref_gemm_sum(t, a, wt, m, n, k, w, layout, /*bf16_partials=*/true);
          for (int r = 0; r < w; ++r) {
            const int64_t off = split_offset(m, w, r) * n, cnt = split_count(m, w, r) * n;
            check_close("gemmReduceScatter" + what + " rank " + std::to_string(r), rs[r], full.slice(off, cnt));
            check_close("gemmAllReduce" + what + " rank " + std::to_string(r), ar[r], full);
            CHECK(std::memcmp(ar[r].data(), ar[0].data(), static_cast<size_t>(m * n * dtype_size(t))) == 0,
                  "gemmAllReduce" + what + ": rank " + std::to_string(r) + " got other bits than rank 0");
          }
        }
}

// ---- MoE --------------------------------------------------------------------------------------
int ref_owner(int64_t expert, int64_t experts, int w) {
  for (int p = 0; p < w; ++p) {
    int64_t first = 0;  // the documented rule: the first E % W ranks own one more expert
    for (int q = 0; q < p; ++q) first += experts / w + (q < experts % w ? 1 : 0);
    if (expert >= first && expert < first + experts / w + (p < experts % w ? 1 : 0)) return p;
  }
  return -1;
}

// A deterministic, bf16-exact expert output row element for (home rank, token, slot, column).
float expert_value(int home, int64_t token, int slot, int64_t c) {
  return static_cast<float>((home * 131 + token * 17 + slot * 7 + c * 3) % 61 - 30) / 32.f;
}

struct MoeCase {
  int64_t experts;
  int topk;
  std::vector<int64_t> tokens;  // per rank (first w entries used)
  int64_t hidden, ffn, width;
};

void run_moe_case(int w, DType t, const MoeCase& mc, bool& saw_duplicate, bool& saw_empty) {
  const int64_t e_count = mc.experts, hidden = mc.hidden, ffn = mc.ffn, width = mc.width;
  const int topk = mc.topk;
  const std::string what = ctx("moe", w, t) + " E=" + std::to_string(e_count) + " topk=" + std::to_string(topk);
  std::uniform_int_distribution<int64_t> pick(0, e_count - 1);
  const int64_t cold = pick(g_rng);  // an expert nobody routes to
  std::vector<int64_t> tokens(w);
  std::vector<Tensor> x(w), w1(w), combined(w);
  std::vector<std::vector<int32_t>> ids(w);
  std::vector<std::vector<float>> weights(w);
  std::uniform_real_distribution<float> uw(0.f, 1.f);
  for (int r = 0; r < w; ++r) {
    tokens[r] = mc.tokens[r];
    x[r] = random_tensor(t, tokens[r] * hidden);
    w1[r] = random_tensor(t, split_count(e_count, w, r) * ffn * hidden);
    combined[r] = poisoned(t, tokens[r] * width);
    for (int64_t tok = 0; tok < tokens[r]; ++tok)
      for (int k = 0; k < topk; ++k) {
        int64_t id = pick(g_rng);
        while (e_count > 1 && id == cold) id = pick(g_rng);
        if (tok == 0 && k == 1) id = ids[r][0];  // token 0 goes twice to one expert
        ids[r].push_back(static_cast<int32_t>(id));
        weights[r].push_back(uw(g_rng));
      }
  }
  std::vector<MoeDispatchResult> res(w);
  auto errors = run_ranks(w, [&](Exchanger& ex) {
    const int r = ex.rank();
    res[r] = moe_dispatch_gemm(ex, t, x[r].data(), tokens[r], hidden, ids[r].data(),
                               weights[r].data(), topk, e_count, w1[r].data(), ffn);
    const MoeLayout& l = res[r].layout;
    Tensor eo(t, l.rows() * width);
    for (int64_t row = 0; row < l.rows(); ++row)
      for (int64_t c = 0; c < width; ++c)
        eo.set(row * width + c, expert_value(l.src_rank[row], l.src_token[row], l.src_slot[row], c));
    moe_combine(ex, t, l, eo.data(), width, combined[r].data());
  });
  if (!all_ok(errors, what)) return;

  for (int r = 0; r < w; ++r) {
    const std::string rr = what + " rank " + std::to_string(r);
    const MoeLayout& l = res[r].layout;
    int64_t first = 0;
    for (int q = 0; q < r; ++q) first += split_count(e_count, w, q);
    const int64_t local = split_count(e_count, w, r);
    CHECK(l.world == w && l.rank == r && l.topk == topk && l.num_experts == e_count &&
              l.first_local_expert == first && l.local_experts == local && l.tokens == tokens[r],
          rr + " layout header");
    // Reference layout: expert-major, then (source rank, token, slot).
    std::vector<int64_t> offsets{0};
    std::vector<int32_t> src_rank, src_token, src_slot;
    std::vector<float> wt;
    for (int64_t e = first; e < first + local; ++e) {
      int64_t rows_e = 0;
      for (int s = 0; s < w; ++s)
        for (int64_t tok = 0; tok < tokens[s]; ++tok)
          for (int k = 0; k < topk; ++k)
            if (ids[s][tok * topk + k] == e) {
              src_rank.push_back(s), src_token.push_back(static_cast<int32_t>(tok)), src_slot.push_back(k);
              wt.push_back(weights[s][tok * topk + k]);
              ++rows_e;
            }
      saw_empty = saw_empty || rows_e == 0;
      offsets.push_back(offsets.back() + rows_e);
    }
    const bool layout_ok = l.expert_offsets == offsets && l.src_rank == src_rank &&
                           l.src_token == src_token && l.src_slot == src_slot && l.weight == wt;
    CHECK(layout_ok, rr + " layout rows (offsets, source rank/token/slot, weight)");
    for (size_t i = 1; i < src_rank.size(); ++i)
      saw_duplicate = saw_duplicate || (src_rank[i] == src_rank[i - 1] && src_token[i] == src_token[i - 1]);
    std::vector<std::vector<int64_t>> pairs(w);
    for (int64_t tok = 0; tok < tokens[r]; ++tok)
      for (int k = 0; k < topk; ++k) pairs[ref_owner(ids[r][tok * topk + k], e_count, w)].push_back(tok * topk + k);
    CHECK(l.sent_pairs == pairs, rr + " sent_pairs");
    if (!layout_ok) continue;
    // routed_x rows are the source tokens, bit for bit; out = routed row · W1_eᵀ.
    Tensor routed(t, 0);
    routed.bytes = res[r].routed_x;
    bool rows_ok = routed.size() == l.rows() * hidden;
    for (int64_t row = 0; rows_ok && row < l.rows(); ++row)
      rows_ok = same_bits(routed, row * hidden, x[src_rank[row]], src_token[row] * hidden, hidden);
    CHECK(rows_ok, rr + " routed_x rows are the routed tokens");
    Tensor out(t, 0);
    out.bytes = res[r].out;
    Expect e;
    for (int64_t le = 0; le < local; ++le)
      for (int64_t row = offsets[le]; row < offsets[le + 1]; ++row)
        for (int64_t f = 0; f < ffn; ++f) {
          double v = 0, mag = 0;
          for (int64_t h = 0; h < hidden; ++h) {
            const double p = x[src_rank[row]].at(src_token[row] * hidden + h) *
                             w1[r].at((le * ffn + f) * hidden + h);
            v += p;
            mag += std::fabs(p);
          }
          e.push(v, sum_tol(t, v, mag, hidden));
        }
    CHECK(out.size() == l.rows() * ffn, rr + " out size");
    check_close(rr + " expert GEMM", out, e);
    // Combine: weighted sum over slots of the rows each expert sent back.
    Expect ce;
    for (int64_t tok = 0; tok < tokens[r]; ++tok)
      for (int64_t c = 0; c < width; ++c) {
        double v = 0, mag = 0;
        for (int k = 0; k < topk; ++k) {
          const double p = static_cast<double>(weights[r][tok * topk + k]) * expert_value(r, tok, k, c);
          v += p;
          mag += std::fabs(p);
        }
        ce.push(v, sum_tol(t, v, mag, topk));
      }
    check_close(rr + " combine", combined[r], ce);
  }
}

void test_moe() {
  bool saw_duplicate = false, saw_empty = false;
  const std::vector<MoeCase> cases = {
      {5, 2, {5, 0, 7, 3}, 24, 16, 12},   // E not divisible by W; rank 1 has no tokens
      {3, 3, {4, 6, 0, 2}, 16, 8, 5},     // W=4: one rank owns no expert
      {9, 1, {11, 3, 6, 1}, 32, 20, 20},  // topk 1
      {1, 2, {3, 2, 1, 0}, 8, 4, 3},      // one expert for everybody
  };
  for (int w = 1; w <= 4; ++w)
    for (DType t : {DType::kF32, DType::kBF16})
      for (const MoeCase& mc : cases) run_moe_case(w, t, mc, saw_duplicate, saw_empty);
  CHECK(saw_duplicate, "moe tests routed a token twice to the same expert");
  CHECK(saw_empty, "moe tests had an expert with no rows");

  // An out-of-range id fails on its rank with the token and id named; the peer is released.
  for (int32_t bad : {int32_t{5}, int32_t{-1}}) {
    const Tensor xx = random_tensor(DType::kF32, 3 * 4), ww = random_tensor(DType::kF32, 3 * 2 * 4);
    const std::vector<float> wts(6, 0.5f);
    auto errors = run_ranks(2, [&](Exchanger& ex) {
      std::vector<int32_t> ids = {0, 1, 2, 3, 4, 0};  // 3 tokens × topk 2, E = 5
      if (ex.rank() == 1) ids[4] = bad;                // token 2, slot 0
      moe_dispatch_gemm(ex, DType::kF32, xx.data(), 3, 4, ids.data(), wts.data(), 2, 5, ww.data(), 2);
    });
    CHECK(error_is(errors[1], ErrorKind::kInvalidArgument,
                   {"moeDispatchGemm", "token 2", "expert id " + std::to_string(bad)}),
          "moe id " + std::to_string(bad) + " out of range: " + describe(errors[1]));
    CHECK(error_is(errors[0], ErrorKind::kCommunicator, {}), "moe bad id releases the peer: " + describe(errors[0]));
  }
}

// ---- ring attention -----------------------------------------------------------------------------
struct AttnCase {
  int64_t batch, seq, hq, hkv, d;
  float scale;
};

void run_attention_case(int w, DType t, bool causal, const AttnCase& ac) {
  AttentionShape shape;
  shape.batch = ac.batch, shape.seq = ac.seq, shape.q_heads = ac.hq, shape.kv_heads = ac.hkv;
  shape.head_dim = ac.d, shape.causal = causal, shape.scale = ac.scale;
  const int64_t b = ac.batch, s = ac.seq, hq = ac.hq, hkv = ac.hkv, d = ac.d;
  const std::string what = ctx("ringAttention", w, t) + (causal ? " causal" : " full") +
                           " B=" + std::to_string(b) + " S=" + std::to_string(s) + " Hq=" +
                           std::to_string(hq) + " Hkv=" + std::to_string(hkv) + " D=" + std::to_string(d);
  std::vector<Tensor> q(w), k(w), v(w), o(w), lse(w);
  for (int r = 0; r < w; ++r) {
    const int64_t n = split_count(s, w, r);
    q[r] = random_tensor(t, b * n * hq * d, -2.f, 2.f);
    k[r] = random_tensor(t, b * n * hkv * d, -2.f, 2.f);
    v[r] = random_tensor(t, b * n * hkv * d);
    o[r] = poisoned(t, b * n * hq * d);
    lse[r] = poisoned(DType::kF32, b * hq * n);
  }
  auto errors = run_ranks(w, [&](Exchanger& ex) {
    const int r = ex.rank();
    ring_attention(ex, t, shape, q[r].data(), k[r].data(), v[r].data(), o[r].data(),
                   static_cast<float*>(lse[r].data()));
  });
  if (!all_ok(errors, what)) return;

  // Global accessors over the rank blocks: position p lives on the rank whose block holds it.
  auto locate = [&](int64_t p, int& rank, int64_t& local) {
    for (rank = 0; rank < w; ++rank)
      if (p < split_offset(s, w, rank) + split_count(s, w, rank)) break;
    local = p - split_offset(s, w, rank);
  };
  auto elem = [&](const std::vector<Tensor>& x, int64_t heads, int64_t bi, int64_t p, int64_t h, int64_t i) {
    int rank;
    int64_t local;
    locate(p, rank, local);
    const int64_t n = split_count(s, w, rank);
    return x[rank].at(((bi * n + local) * heads + h) * d + i);
  };
  const double scale = ac.scale != 0.f ? ac.scale : 1.0 / std::sqrt(static_cast<double>(d));
  std::vector<Expect> eo(w), el(w);
  for (int r = 0; r < w; ++r) {
    const int64_t n = split_count(s, w, r), first = split_offset(s, w, r);
    eo[r].val.assign(b * n * hq * d, 0), eo[r].tol.assign(b * n * hq * d, 0);
    el[r].val.assign(b * hq * n, 0), el[r].tol.assign(b * hq * n, 0);
    for (int64_t bi = 0; bi < b; ++bi)
      for (int64_t li = 0; li < n; ++li)
        for (int64_t h = 0; h < hq; ++h) {
          const int64_t pos = first + li, kh = h / (hq / hkv);
          const int64_t keys = causal ? pos + 1 : s;
          std::vector<double> score(keys);
          double mx = -INFINITY, smag = 0;
          for (int64_t j = 0; j < keys; ++j) {
            double dot = 0, mag = 0;
            for (int64_t i = 0; i < d; ++i) {
              const double p = elem(q, hq, bi, pos, h, i) * elem(k, hkv, bi, j, kh, i);
              dot += p;
              mag += std::fabs(p);
            }
            score[j] = dot * scale;
            mx = std::max(mx, score[j]);
            smag = std::max(smag, mag * std::fabs(scale));
          }
          double l = 0;
          for (int64_t j = 0; j < keys; ++j) l += std::exp(score[j] - mx);
          const double lse_ref = mx + std::log(l);
          // fp32 error model: scores off by ~(d+2)·u·smag, each exp and sum by a few u.
          const double rel = 4.0 * (d + keys + 8) * kU32 * (1.0 + smag);
          el[r].val[(bi * hq + h) * n + li] = lse_ref;
          el[r].tol[(bi * hq + h) * n + li] = rel + 1e-6 * std::fabs(lse_ref);
          for (int64_t i = 0; i < d; ++i) {
            double acc = 0, mag = 0;
            for (int64_t j = 0; j < keys; ++j) {
              const double p = std::exp(score[j] - mx) / l, vv = elem(v, hkv, bi, j, kh, i);
              acc += p * vv;
              mag += p * std::fabs(vv);
            }
            const int64_t idx = ((bi * n + li) * hq + h) * d + i;
            eo[r].val[idx] = acc;
            eo[r].tol[idx] = rounding_tol(t, acc, 2.0 * rel * mag);
          }
        }
    check_close(what + " rank " + std::to_string(r) + " O", o[r], eo[r]);
    check_close(what + " rank " + std::to_string(r) + " LSE", lse[r], el[r]);
  }
}

void test_ring_attention() {
  for (int w = 1; w <= 4; ++w)
    for (DType t : {DType::kF32, DType::kBF16})
      for (bool causal : {false, true}) {
        const std::vector<AttnCase> cases = {
            {2, 3 * w, 4, 2, 8, 0.f},      // divides by W, GQA 2:1
            {1, 11, 3, 1, 16, 0.3f},       // uneven, GQA 3:1 (MQA), explicit scale
            {2, 2, 2, 2, 8, 0.f},          // fewer positions than ranks
            {1, 4 * w + 1, 2, 2, 4, 0.f},  // uneven, MHA
        };
        for (const AttnCase& ac : cases) run_attention_case(w, t, causal, ac);
      }
  AttentionShape bad;
  bad.seq = 4, bad.q_heads = 3, bad.kv_heads = 2, bad.head_dim = 4;
  auto errors = run_ranks(1, [&](Exchanger& ex) {
    ring_attention(ex, DType::kF32, bad, nullptr, nullptr, nullptr, nullptr, nullptr);
  });
  CHECK(error_is(errors[0], ErrorKind::kInvalidArgument, {"ringAttention", "q_heads = 3", "kv_heads = 2"}),
        "ringAttention with q_heads % kv_heads != 0 fails: " + describe(errors[0]));
}

}  // namespace

int main() {
  uint64_t seed = std::random_device{}();
  if (const char* s = std::getenv("FC_TEST_SEED")) seed = std::strtoull(s, nullptr, 10);
  g_rng.seed(seed);
  std::printf("host_ops_test seed %llu (FC_TEST_SEED=%llu replays it)\n",
              static_cast<unsigned long long>(seed), static_cast<unsigned long long>(seed));
  const auto start = std::chrono::steady_clock::now();
  struct Group { const char* name; void (*fn)(); };
  const Group groups[] = {{"split", test_split},
                          {"bf16", test_bf16},
                          {"exchanger", test_exchanger},
                          {"collectives", test_collectives},
                          {"gemm", test_gemm},
                          {"allGatherGemm", test_all_gather_gemm},
                          {"gemmReduceScatter/gemmAllReduce", test_gemm_reduce},
                          {"gemm + reduce, bf16 partials", test_gemm_reduce_bf16_partials},
                          {"moe", test_moe},
                          {"ringAttention", test_ring_attention}};
  for (const Group& g : groups) {
    const int before_pass = g_passed, before_fail = g_failed;
    const auto t0 = std::chrono::steady_clock::now();
    g_worst_ratio = 0;
    g_worst_what.clear();
    try {
      g.fn();
    } catch (const std::exception& e) {
      check(false, std::string(g.name) + " threw: " + e.what());
    }
    std::printf("  %-32s %5d passed, %d failed (%.2f s); worst |error|/tol %.3g in %s\n", g.name,
                g_passed - before_pass, g_failed - before_fail,
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
                g_worst_ratio, g_worst_what.empty() ? "-" : g_worst_what.c_str());
  }
  std::printf("total %.2f s\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  std::printf("%d passed, %d failed\n", g_passed, g_failed);
  return g_failed == 0 ? 0 : 1;
}
