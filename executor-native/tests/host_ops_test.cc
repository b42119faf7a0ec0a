// host_ops_test: the host backend's collectives, GEMM and fused GEMM + collective ops on W = 1..4
// in-process ranks (thread_exchanger.h), both dtypes, sizes that do and do not divide by W, empty
// edge cases, and the exchanger under them. Inputs are fresh random values each run (seed printed;
// FC_TEST_SEED=<n> replays one), outputs are poisoned with NaN first, and every element is
// compared with a naive fp64 reference written here, independently of the implementation, under
// the per-element tolerance of support/host_ops_support.h. Prints "N passed, 0 failed" and exits
// non-zero on any failure. MoE and ring attention: host_moe_attention_test.
#include "support/host_ops_support.h"

namespace {

using namespace fusedcomm::testing::host_ops;
using fusedcomm::testing::check;

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
  struct Case {
    uint32_t in;
    uint16_t out;
    const char* what;
  };
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
    std::snprintf(buf, sizeof buf, "f32_to_bf16(0x%08x) = 0x%04x, want 0x%04x (%s)", c.in, got, c.out,
                  c.what);
    CHECK(got == c.out, buf);
  }
  const uint32_t nans[] = {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff800001u, 0x7fa00000u, 0x7f80ffffu};
  for (uint32_t n : nans) {
    const uint16_t got = f32_to_bf16(f(n));
    char buf[96];
    std::snprintf(buf, sizeof buf, "f32_to_bf16(NaN 0x%08x) = 0x%04x is a quiet NaN, same sign", n, got);
    CHECK((got & 0x7fc0) == 0x7fc0 && (got & 0x8000) == ((n >> 16) & 0x8000), buf);
  }
  // Every bf16 value converts to fp32 exactly and back unchanged.
  int64_t bad = 0;
  for (uint32_t b = 0; b < 65536; ++b) {
    const float x = bf16_to_f32(static_cast<uint16_t>(b));
    const bool nan = (b & 0x7fff) > 0x7f80;
    if (nan ? !std::isnan(x)
            : (static_cast<double>(x) != bf16_value(static_cast<uint16_t>(b)) || f32_to_bf16(x) != b))
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
      if (bad < 4)
        std::fprintf(stderr, "  0x%08x -> 0x%04x, want 0x%04x\n", u, f32_to_bf16(x), ref_round_bf16(x));
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
    const std::string pair =
        "rank " + std::to_string(s) + " sends 8 bytes to rank " + std::to_string(d) + ", which expects 4";
    for (int r = 0; r < w; ++r)
      CHECK(
          error_is(errors[r], ErrorKind::kCommunicator, {"size mismatch", pair, "test/mismatch"}),
          "size mismatch W=" + std::to_string(w) + " rank " + std::to_string(r) + ": " + describe(errors[r]));
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
      for (int64_t count :
           {int64_t{0}, int64_t{1}, int64_t{w - 1}, int64_t{4} * w, int64_t{103}, int64_t{1000}}) {
        const std::string what = ctx("", w, t) + " count=" + std::to_string(count);
        std::vector<Tensor> ag_in(w), rs_in(w), a2a_in(w), ag_out(w), rs_out(w), ar_out(w), ar_inplace(w),
            a2a_out(w);
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
          for (int64_t j = 0; j < ag_in[s].size(); ++j, ++i)
            std::memcpy(concat.bytes.data() + i * dtype_size(t), ag_in[s].bytes.data() + j * dtype_size(t),
                        dtype_size(t));
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
          if (t == DType::kF32)
            ordered.set(i, f);
          else {
            const uint16_t b = ref_round_bf16(f);
            std::memcpy(ordered.bytes.data() + 2 * i, &b, 2);
          }
        }
        for (int r = 0; r < w; ++r) {
          const std::string rr = what + " rank " + std::to_string(r);
          const int64_t mine = split_count(count, w, r), off = split_offset(count, w, r);
          CHECK(same_bits(ag_out[r], 0, concat, 0, count), "allGather" + rr + " equals the concatenation");
          check_close("reduceScatter" + rr, rs_out[r], sum.slice(off, mine));
          CHECK(same_bits(rs_out[r], 0, ordered, off, mine),
                "reduceScatter" + rr + " adds in rank order (bitwise)");
          check_close("allReduce" + rr, ar_out[r], sum);
          CHECK(same_bits(ar_out[r], 0, ordered, 0, count),
                "allReduce" + rr + " adds in rank order (bitwise)");
          CHECK(same_bits(ar_inplace[r], 0, ar_out[r], 0, count),
                "allReduce in place" + rr + " equals out of place");
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
  const int64_t shapes[][3] = {{0, 4, 3}, {3, 0, 5},    {4, 3, 0},     {1, 1, 1},     {1, 9, 1},
                               {2, 1, 7}, {17, 13, 29}, {33, 65, 257}, {96, 80, 300}, {5, 131, 64}};
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
    threw = e.kind() == ErrorKind::kInvalidArgument &&
            std::string(e.what()).find("gemm") != std::string::npos &&
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
            const std::string what = ctx("allGatherGemm", w, t) + " " + name(layout) +
                                     " m=" + std::to_string(m) + " k=" + std::to_string(k);
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
              all_gather_gemm(ex, t, a[r].data(), wt[r].data(), c[r].data(), keep_a ? ga[r].data() : nullptr,
                              m, n_local[r], k, layout);
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
                CHECK(same_bits(ga[r], 0, full, 0, m * k),
                      what + " rank " + std::to_string(r) + " gathered_a");
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
                check_close("gemmReduceScatter" + what + " rank " + std::to_string(r), rs[r],
                            full.slice(off, cnt));
                check_close("gemmAllReduce" + what + " rank " + std::to_string(r), ar[r], full);
                CHECK(same_bits(ar[r], 0, ar[0], 0, m * n),
                      "gemmAllReduce" + what + " same bits on every rank");
                CHECK(same_bits(rs[r], 0, ar[r], off, cnt),
                      "gemmReduceScatter" + what + " equals its allReduce block");
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
          const std::string what =
              ctx("", w, t) + " " + name(layout) + " m=" + std::to_string(m) + " bf16 partials";
          auto [a, wt, rs, ar] = gemm_reduce_tensors(t, w, m, n, k);
          auto errors = run_ranks(w, [&](Exchanger& ex) {
            const int r = ex.rank();
            gemm_reduce_scatter(ex, t, a[r].data(), wt[r].data(), rs[r].data(), m, n, split_count(k, w, r),
                                layout, PartialPrecision::kBF16);
            gemm_all_reduce(ex, t, a[r].data(), wt[r].data(), ar[r].data(), m, n, split_count(k, w, r),
                            layout, PartialPrecision::kBF16);
          });
          if (!all_ok(errors, "gemmReduceScatter / gemmAllReduce" + what)) continue;
          const Expect full = ref_gemm_sum(t, a, wt, m, n, k, w, layout, /*bf16_partials=*/true);
          for (int r = 0; r < w; ++r) {
            const int64_t off = split_offset(m, w, r) * n, cnt = split_count(m, w, r) * n;
            check_close("gemmReduceScatter" + what + " rank " + std::to_string(r), rs[r],
                        full.slice(off, cnt));
            check_close("gemmAllReduce" + what + " rank " + std::to_string(r), ar[r], full);
            CHECK(std::memcmp(ar[r].data(), ar[0].data(), static_cast<size_t>(m * n * dtype_size(t))) == 0,
                  "gemmAllReduce" + what + ": rank " + std::to_string(r) + " got other bits than rank 0");
          }
        }
}

}  // namespace

int main() {
  return run_groups("host_ops_test", {{"split", test_split},
                                      {"bf16", test_bf16},
                                      {"exchanger", test_exchanger},
                                      {"collectives", test_collectives},
                                      {"gemm", test_gemm},
                                      {"allGatherGemm", test_all_gather_gemm},
                                      {"gemmReduceScatter/gemmAllReduce", test_gemm_reduce},
                                      {"gemm + reduce, bf16 partials", test_gemm_reduce_bf16_partials}});
}
