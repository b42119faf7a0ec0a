// host_attention_bwd_test: the host backend's attention backward, single-rank and ring (both
// sequence layouts, W = 1..4 in-process ranks over thread_exchanger.h), both dtypes, head dims
// from 1 to 64, causal and not, grouped-query and multi-query heads, lengths that divide nothing,
// Lq != Lk and empty edge cases. Fresh random inputs (seed printed; FC_TEST_SEED=<n> replays
// one), poisoned outputs, every gradient element compared with a naive fp64 backward written
// here (with an error bound per element), a few elements also with central finite differences
// of an fp64 forward, and the ring with the single-rank op over the whole sequence; and the
// argument errors.
#include "support/host_ops_support.h"

namespace {

using namespace fusedcomm::testing::host_ops;
using fusedcomm::testing::check;

// The shape of one single-rank problem: q, o, dO (B, lq, Hq, D); k, v (B, lk, Hkv, D).
struct Dims {
  int64_t b, lq, lk, hq, hkv, d;
  bool causal;
  float scale;
  double scale64() const { return scale != 0.f ? scale : 1.0 / std::sqrt(static_cast<double>(d)); }
  int64_t q_elems() const { return b * lq * hq * d; }
  int64_t kv_elems() const { return b * lk * hkv * d; }
  int64_t keys(int64_t i) const { return causal ? std::min(i + 1, lk) : lk; }  // top-left
  std::string str() const {
    return std::string(causal ? "causal" : "full") + " B=" + std::to_string(b) + " Lq=" + std::to_string(lq) +
           " Lk=" + std::to_string(lk) + " Hq=" + std::to_string(hq) + " Hkv=" + std::to_string(hkv) +
           " D=" + std::to_string(d);
  }
};

// The gradients the fp64 backward expects, with a bound per element for output dtype t.
struct GradRef {
  Expect dq, dk, dv;
};

// The contract's formulas in fp64 over the caller's q, k, v, o, lse and dO as held (o and lse
// as the forward returned them): P = exp(scale q·k - lse), δ = dO·o, dV = Σ P dO,
// dS = P (dO·v - δ), dQ = scale Σ dS k, dK = scale Σ dS q. The bound of each element follows
// the fp32 errors of the score, the two dots and the sums, term by term.
GradRef reference_backward(DType t, const Dims& s, const Tensor& q, const Tensor& k, const Tensor& v,
                           const Tensor& o, const Tensor& lse, const Tensor& d_o) {
  const int64_t d = s.d, group = s.hq / s.hkv;
  const double scale = s.scale64(), dotu = (d + 2) * kU32;
  std::vector<double> dq(s.q_elems(), 0), dq_err(s.q_elems(), 0), dq_mag(s.q_elems(), 0);
  std::vector<double> dk(s.kv_elems(), 0), dk_err(s.kv_elems(), 0), dk_mag(s.kv_elems(), 0);
  std::vector<double> dv(s.kv_elems(), 0), dv_err(s.kv_elems(), 0), dv_mag(s.kv_elems(), 0);
  std::vector<double> terms_q(s.q_elems(), 0), terms_kv(s.kv_elems(), 0);
  for (int64_t bi = 0; bi < s.b; ++bi)
    for (int64_t i = 0; i < s.lq; ++i)
      for (int64_t h = 0; h < s.hq; ++h) {
        const int64_t qrow = ((bi * s.lq + i) * s.hq + h) * d, kh = h / group;
        const double l = lse.at((bi * s.hq + h) * s.lq + i);
        double delta = 0, delta_mag = 0;
        for (int64_t x = 0; x < d; ++x) {
          delta += d_o.at(qrow + x) * o.at(qrow + x);
          delta_mag += std::fabs(d_o.at(qrow + x) * o.at(qrow + x));
        }
        for (int64_t j = 0; j < s.keys(i); ++j) {
          const int64_t krow = ((bi * s.lk + j) * s.hkv + kh) * d;
          double dot = 0, dot_mag = 0, dp = 0, dp_mag = 0;
          for (int64_t x = 0; x < d; ++x) {
            dot += q.at(qrow + x) * k.at(krow + x);
            dot_mag += std::fabs(q.at(qrow + x) * k.at(krow + x));
            dp += d_o.at(qrow + x) * v.at(krow + x);
            dp_mag += std::fabs(d_o.at(qrow + x) * v.at(krow + x));
          }
          const double p = std::exp(dot * scale - l);
          const double p_err = p * (dotu * dot_mag * std::fabs(scale) +
                                    4 * kU32 * (1 + std::fabs(l) + std::fabs(dot * scale)));
          const double ds = p * (dp - delta);
          const double ds_err =
              p_err * std::fabs(dp - delta) + p * dotu * (dp_mag + delta_mag) + 3 * kU32 * std::fabs(ds);
          for (int64_t x = 0; x < d; ++x) {
            const double qx = q.at(qrow + x), kx = k.at(krow + x), dox = d_o.at(qrow + x);
            dq[qrow + x] += scale * ds * kx;
            dq_err[qrow + x] += std::fabs(scale * kx) * ds_err;
            dq_mag[qrow + x] += std::fabs(scale * ds * kx);
            terms_q[qrow + x] += 1;
            dk[krow + x] += scale * ds * qx;
            dk_err[krow + x] += std::fabs(scale * qx) * ds_err;
            dk_mag[krow + x] += std::fabs(scale * ds * qx);
            dv[krow + x] += p * dox;
            dv_err[krow + x] += p_err * std::fabs(dox);
            dv_mag[krow + x] += std::fabs(p * dox);
            terms_kv[krow + x] += 1;
          }
        }
      }
  GradRef ref;
  const auto fill = [&](Expect& e, const std::vector<double>& val, const std::vector<double>& err,
                        const std::vector<double>& mag, const std::vector<double>& terms) {
    for (size_t i = 0; i < val.size(); ++i)
      e.push(val[i], rounding_tol(t, val[i], 2.0 * (err[i] + 2.0 * (terms[i] + 2) * kU32 * mag[i])));
  };
  fill(ref.dq, dq, dq_err, dq_mag, terms_q);
  fill(ref.dk, dk, dk_err, dk_mag, terms_kv);
  fill(ref.dv, dv, dv_err, dv_mag, terms_kv);
  return ref;
}

AttentionLocalShape local_shape(const Dims& s) {
  AttentionLocalShape l;
  l.batch = s.b, l.q_len = s.lq, l.kv_len = s.lk, l.q_heads = s.hq, l.kv_heads = s.hkv, l.head_dim = s.d;
  l.causal = s.causal, l.scale = s.scale;
  return l;
}

// Random inputs of one problem, its forward (o, lse) by the host op, and the gradients.
struct Problem {
  Tensor q, k, v, o, lse, d_o, dq, dk, dv;
};
Problem make_problem(DType t, const Dims& s) {
  Problem p;
  p.q = random_tensor(t, s.q_elems(), -2.f, 2.f);
  p.k = random_tensor(t, s.kv_elems(), -2.f, 2.f);
  p.v = random_tensor(t, s.kv_elems());
  p.d_o = random_tensor(t, s.q_elems());
  p.o = poisoned(t, s.q_elems());
  p.lse = poisoned(DType::kF32, s.b * s.hq * s.lq);
  attention(t, local_shape(s), p.q.data(), p.k.data(), p.v.data(), p.o.data(),
            static_cast<float*>(p.lse.data()));
  p.dq = poisoned(t, s.q_elems());
  p.dk = poisoned(t, s.kv_elems());
  p.dv = poisoned(t, s.kv_elems());
  return p;
}
void run_backward(DType t, const Dims& s, Problem& p) {
  attention_backward(t, local_shape(s), p.q.data(), p.k.data(), p.v.data(), p.o.data(),
                     static_cast<const float*>(p.lse.data()), p.d_o.data(), p.dq.data(), p.dk.data(),
                     p.dv.data());
}

void run_local_case(DType t, const Dims& s) {
  const std::string what = std::string("attentionBackward ") + name(t) + " " + s.str();
  Problem p = make_problem(t, s);
  try {
    run_backward(t, s, p);
  } catch (const std::exception& e) {
    CHECK(false, what + ": " + e.what());
    return;
  }
  const GradRef ref = reference_backward(t, s, p.q, p.k, p.v, p.o, p.lse, p.d_o);
  check_close(what + " dQ", p.dq, ref.dq);
  check_close(what + " dK", p.dk, ref.dk);
  check_close(what + " dV", p.dv, ref.dv);
}

void test_local_backward() {
  for (DType t : {DType::kF32, DType::kBF16})
    for (bool causal : {false, true}) {
      run_local_case(t, {2, 7, 7, 4, 2, 8, causal, 0.f});     // square, GQA 2:1
      run_local_case(t, {1, 5, 9, 3, 1, 16, causal, 0.25f});  // more keys than queries, MQA
      run_local_case(t, {3, 9, 4, 2, 2, 4, causal, 0.f});     // fewer keys than queries
      run_local_case(t, {1, 13, 11, 4, 1, 64, causal, 0.f});  // D 64, MQA 4:1
      run_local_case(t, {1, 6, 6, 2, 2, 1, causal, 0.f});     // D 1
      run_local_case(t, {2, 5, 3, 6, 3, 5, causal, 1.5f});    // odd D, large scale
      run_local_case(t, {1, 3, 0, 2, 1, 8, causal, 0.f});     // no key: dQ = 0
      run_local_case(t, {1, 0, 5, 2, 1, 8, causal, 0.f});     // no query: dK = dV = 0
      run_local_case(t, {0, 4, 4, 2, 1, 8, causal, 0.f});     // no batch
    }
}

// ---- finite differences --------------------------------------------------------------------
// L = Σ dO · o with o the fp64 forward at the f32 inputs, one element moved by ±h: a central
// difference (error O(h²)) of the forward alone, independent of the backward's formulas.
double loss64(const Dims& s, const std::vector<double>& q, const std::vector<double>& k,
              const std::vector<double>& v, const Tensor& d_o) {
  const int64_t d = s.d, group = s.hq / s.hkv;
  const double scale = s.scale64();
  double loss = 0;
  for (int64_t bi = 0; bi < s.b; ++bi)
    for (int64_t i = 0; i < s.lq; ++i)
      for (int64_t h = 0; h < s.hq; ++h) {
        const int64_t qrow = ((bi * s.lq + i) * s.hq + h) * d, kh = h / group, keys = s.keys(i);
        if (keys == 0) continue;
        std::vector<double> sc(keys);
        double mx = -INFINITY;
        for (int64_t j = 0; j < keys; ++j) {
          double dot = 0;
          for (int64_t x = 0; x < d; ++x) dot += q[qrow + x] * k[((bi * s.lk + j) * s.hkv + kh) * d + x];
          sc[j] = dot * scale;
          mx = std::max(mx, sc[j]);
        }
        double sum = 0;
        for (int64_t j = 0; j < keys; ++j) sum += std::exp(sc[j] - mx);
        for (int64_t x = 0; x < d; ++x) {
          double ox = 0;
          for (int64_t j = 0; j < keys; ++j)
            ox += std::exp(sc[j] - mx) / sum * v[((bi * s.lk + j) * s.hkv + kh) * d + x];
          loss += d_o.at(qrow + x) * ox;
        }
      }
  return loss;
}

void test_finite_differences() {
  for (bool causal : {false, true})
    for (const Dims& s : {Dims{1, 6, 6, 4, 2, 8, causal, 0.f}, Dims{2, 5, 7, 3, 1, 5, causal, 0.7f}}) {
      const std::string what = "attentionBackward vs finite differences f32 " + s.str();
      Problem p = make_problem(DType::kF32, s);
      run_backward(DType::kF32, s, p);
      std::vector<double> q(s.q_elems()), k(s.kv_elems()), v(s.kv_elems());
      for (int64_t i = 0; i < s.q_elems(); ++i) q[i] = p.q.at(i);
      for (int64_t i = 0; i < s.kv_elems(); ++i) k[i] = p.k.at(i), v[i] = p.v.at(i);
      const double h = 1e-4;
      std::uniform_int_distribution<int64_t> pick_q(0, s.q_elems() - 1), pick_kv(0, s.kv_elems() - 1);
      for (int n = 0; n < 6; ++n) {
        struct Probe {
          const char* name;
          std::vector<double>* x;
          const Tensor* grad;
          int64_t at;
        };
        for (const Probe& pr : {Probe{"dQ", &q, &p.dq, pick_q(g_rng)}, Probe{"dK", &k, &p.dk, pick_kv(g_rng)},
                                Probe{"dV", &v, &p.dv, pick_kv(g_rng)}}) {
          const double x0 = (*pr.x)[pr.at];
          (*pr.x)[pr.at] = x0 + h;
          const double up = loss64(s, q, k, v, p.d_o);
          (*pr.x)[pr.at] = x0 - h;
          const double down = loss64(s, q, k, v, p.d_o);
          (*pr.x)[pr.at] = x0;
          const double fd = (up - down) / (2 * h), got = pr.grad->at(pr.at);
          CHECK(std::fabs(got - fd) <= 1e-4 + 1e-3 * std::fabs(fd),
                what + " " + pr.name + "[" + std::to_string(pr.at) + "]: backward " + std::to_string(got) +
                    ", finite difference " + std::to_string(fd));
        }
      }
    }
}

// ---- ring -----------------------------------------------------------------------------------
const char* layout_name(SeqLayout l) { return l == SeqLayout::kZigzag ? "zigzag" : "contiguous"; }

// Rank r's global positions under the layout, in its tensors' order, from the documented rule.
std::vector<int64_t> positions(int64_t seq, int w, int r, SeqLayout layout) {
  std::vector<int64_t> out;
  const auto chunk = [&](int parts, int c) {
    const int64_t first = c * (seq / parts) + std::min<int64_t>(c, seq % parts);
    for (int64_t i = 0; i < seq / parts + (c < seq % parts ? 1 : 0); ++i) out.push_back(first + i);
  };
  if (layout == SeqLayout::kContiguous) {
    chunk(w, r);
  } else {
    chunk(2 * w, r);
    chunk(2 * w, 2 * w - 1 - r);
  }
  return out;
}

// The rows of a (B, S, inner) tensor at the global positions `pos`, in that order.
Tensor gather_rows(const Tensor& x, int64_t b, int64_t s, int64_t inner, const std::vector<int64_t>& pos) {
  const int64_t n = static_cast<int64_t>(pos.size()), es = dtype_size(x.t);
  Tensor out(x.t, b * n * inner);
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t i = 0; i < n; ++i)
      std::memcpy(out.bytes.data() + (bi * n + i) * inner * es,
                  x.bytes.data() + (bi * s + pos[i]) * inner * es, static_cast<size_t>(inner * es));
  return out;
}
// The columns `pos` of a (rows, S) fp32 tensor (lse: rows = B · Hq).
Tensor gather_cols(const Tensor& x, int64_t rows, int64_t s, const std::vector<int64_t>& pos) {
  Tensor out(DType::kF32, rows * static_cast<int64_t>(pos.size()));
  int64_t at = 0;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t p : pos) out.set(at++, static_cast<float>(x.at(r * s + p)));
  return out;
}
Expect gather_expect(const Expect& full, int64_t b, int64_t s, int64_t inner,
                     const std::vector<int64_t>& pos) {
  Expect out;
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t i : pos)
      for (int64_t x = 0; x < inner; ++x)
        out.push(full.val[(bi * s + i) * inner + x], full.tol[(bi * s + i) * inner + x]);
  return out;
}
// The same expectations centred on another result that is itself within them: twice the bound.
Expect around(const Expect& e, const Tensor& centre) {
  Expect out = e;
  for (size_t i = 0; i < out.val.size(); ++i)
    out.val[i] = centre.at(static_cast<int64_t>(i)), out.tol[i] *= 2;
  return out;
}

struct RingCase {
  int64_t batch, seq, hq, hkv, d;
  float scale;
};

void run_ring_case(int w, DType t, bool causal, SeqLayout layout, const RingCase& rc) {
  AttentionShape shape;
  shape.batch = rc.batch, shape.seq = rc.seq, shape.q_heads = rc.hq, shape.kv_heads = rc.hkv;
  shape.head_dim = rc.d, shape.causal = causal, shape.scale = rc.scale, shape.layout = layout;
  const Dims whole{rc.batch, rc.seq, rc.seq, rc.hq, rc.hkv, rc.d, causal, rc.scale};
  const int64_t b = rc.batch, s = rc.seq, hq = rc.hq, hkv = rc.hkv, d = rc.d;
  const std::string what = ctx("ringAttentionBackward", w, t) + " " + layout_name(layout) + " " + whole.str();
  // The whole sequence's forward and backward by the single-rank ops; the ranks get the same o
  // and lse rows, so that the ring and the single-rank op differ only in fp32 summation order.
  Problem g = make_problem(t, whole);
  run_backward(t, whole, g);
  std::vector<std::vector<int64_t>> pos(w);
  std::vector<Tensor> q(w), k(w), v(w), o(w), lse(w), d_o(w), dq(w), dk(w), dv(w);
  for (int r = 0; r < w; ++r) {
    pos[r] = positions(s, w, r, layout);
    const int64_t n = static_cast<int64_t>(pos[r].size());
    CHECK(n == fusedcomm::seq_runs(s, w, r, layout).total(),
          what + " rank " + std::to_string(r) + " holds the documented count");
    q[r] = gather_rows(g.q, b, s, hq * d, pos[r]);
    k[r] = gather_rows(g.k, b, s, hkv * d, pos[r]);
    v[r] = gather_rows(g.v, b, s, hkv * d, pos[r]);
    o[r] = gather_rows(g.o, b, s, hq * d, pos[r]);
    d_o[r] = gather_rows(g.d_o, b, s, hq * d, pos[r]);
    lse[r] = gather_cols(g.lse, b * hq, s, pos[r]);
    dq[r] = poisoned(t, b * n * hq * d);
    dk[r] = poisoned(t, b * n * hkv * d);
    dv[r] = poisoned(t, b * n * hkv * d);
  }
  auto errors = run_ranks(w, [&](Exchanger& ex) {
    const int r = ex.rank();
    ring_attention_backward(ex, t, shape, q[r].data(), k[r].data(), v[r].data(), o[r].data(),
                            static_cast<const float*>(lse[r].data()), d_o[r].data(), dq[r].data(),
                            dk[r].data(), dv[r].data());
  });
  if (!all_ok(errors, what)) return;
  const GradRef ref = reference_backward(t, whole, g.q, g.k, g.v, g.o, g.lse, g.d_o);
  check_close(what + " local op dQ", g.dq, ref.dq);
  check_close(what + " local op dK", g.dk, ref.dk);
  check_close(what + " local op dV", g.dv, ref.dv);
  for (int r = 0; r < w; ++r) {
    const std::string at = what + " rank " + std::to_string(r);
    const Expect eq = gather_expect(ref.dq, b, s, hq * d, pos[r]),
                 ek = gather_expect(ref.dk, b, s, hkv * d, pos[r]),
                 ev = gather_expect(ref.dv, b, s, hkv * d, pos[r]);
    check_close(at + " dQ", dq[r], eq);
    check_close(at + " dK", dk[r], ek);
    check_close(at + " dV", dv[r], ev);
    check_close(at + " dQ vs the local op", dq[r], around(eq, gather_rows(g.dq, b, s, hq * d, pos[r])));
    check_close(at + " dK vs the local op", dk[r], around(ek, gather_rows(g.dk, b, s, hkv * d, pos[r])));
    check_close(at + " dV vs the local op", dv[r], around(ev, gather_rows(g.dv, b, s, hkv * d, pos[r])));
  }
}

void test_ring_backward() {
  for (int w = 1; w <= 4; ++w)
    for (DType t : {DType::kF32, DType::kBF16})
      for (bool causal : {false, true})
        for (SeqLayout layout : {SeqLayout::kContiguous, SeqLayout::kZigzag}) {
          const std::vector<RingCase> cases = {
              {2, 6 * w, 4, 2, 8, 0.f},       // divides by 2W, GQA 2:1
              {1, 11, 3, 1, 16, 0.3f},        // uneven, MQA 3:1, explicit scale
              {2, 2, 2, 2, 8, 0.f},           // fewer positions than ranks (and chunks)
              {1, 4 * w + 1, 2, 2, 5, 0.f},   // uneven, MHA, odd D
              {1, 2 * w + 3, 8, 2, 8, 0.f},   // uneven over 2W chunks, GQA 4:1
              {1, 3 * w + 2, 2, 1, 64, 0.f},  // D 64
          };
          for (const RingCase& rc : cases) run_ring_case(w, t, causal, layout, rc);
        }
}

// ---- argument errors --------------------------------------------------------------------------
void test_errors() {
  float x[256] = {};
  const auto local_fails = [&](const AttentionLocalShape& s, const float* lse,
                               const std::vector<std::string>& words, const std::string& what) {
    std::exception_ptr e;
    try {
      attention_backward(DType::kF32, s, x, x, x, x, lse, x, x, x, x);
    } catch (...) { e = std::current_exception(); }
    CHECK(error_is(e, ErrorKind::kInvalidArgument, words), what + ": " + describe(e));
  };
  AttentionLocalShape s;
  s.q_len = 2, s.kv_len = 2, s.q_heads = 2, s.kv_heads = 1, s.head_dim = 8;
  local_fails(s, nullptr, {"attentionBackward", "lse", "required"}, "attentionBackward without lse");
  s.kv_heads = 3;
  local_fails(s, x, {"attentionBackward", "q_heads = 2", "kv_heads = 3"},
              "attentionBackward with Hq % Hkv != 0");
  s.kv_heads = 1, s.head_dim = 0;
  local_fails(s, x, {"attentionBackward", "head_dim = 0"}, "attentionBackward with head_dim 0");
  s.head_dim = 8, s.q_len = -1;
  local_fails(s, x, {"attentionBackward", "q_len"}, "attentionBackward with a negative q_len");
  s.q_len = 2;
  std::exception_ptr e;
  try {
    attention_backward(DType::kF32, s, x, x, x, x, x, x, nullptr, x, x);
  } catch (...) { e = std::current_exception(); }
  CHECK(error_is(e, ErrorKind::kInvalidArgument, {"attentionBackward", "dq is null"}),
        "attentionBackward with a null dq: " + describe(e));

  AttentionShape bad;
  bad.seq = 4, bad.q_heads = 2, bad.kv_heads = 1, bad.head_dim = 4;
  auto errors = run_ranks(2, [&](Exchanger& ex) {
    ring_attention_backward(ex, DType::kF32, bad, x, x, x, x, nullptr, x, x, x, x);
  });
  CHECK(error_is(errors[0], ErrorKind::kInvalidArgument, {"ringAttentionBackward", "lse", "required"}),
        "ringAttentionBackward without lse fails: " + describe(errors[0]));
  bad.layout = static_cast<SeqLayout>(5);
  errors = run_ranks(
      2, [&](Exchanger& ex) { ring_attention_backward(ex, DType::kF32, bad, x, x, x, x, x, x, x, x, x); });
  CHECK(error_is(errors[1], ErrorKind::kInvalidArgument,
                 {"ringAttentionBackward", "unknown sequence layout 5"}),
        "ringAttentionBackward with an unknown layout fails: " + describe(errors[1]));
}

}  // namespace

int main() {
  return run_groups("host_attention_bwd_test", {{"attentionBackward", test_local_backward},
                                                {"finite differences", test_finite_differences},
                                                {"ringAttentionBackward", test_ring_backward},
                                                {"errors", test_errors}});
}
