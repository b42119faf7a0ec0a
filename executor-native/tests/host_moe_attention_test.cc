// host_moe_attention_test: the host backend's moeDispatchGemm, moeCombine and ringAttention (both
// sequence layouts) on W = 1..4 in-process ranks (thread_exchanger.h), and the single-rank
// attention op, both dtypes, uneven splits and empty edge cases, with fresh random inputs (seed
// printed; FC_TEST_SEED=<n> replays one), poisoned outputs and every element compared with a
// naive fp64 reference written here under the tolerance of support/host_ops_support.h (ring
// attention also with the single-rank op over the whole sequence); and their argument errors
// releasing the peers.
#include "support/host_ops_support.h"

namespace {

using namespace fusedcomm::testing::host_ops;
using fusedcomm::testing::check;

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
  const std::string what =
      ctx("moe", w, t) + " E=" + std::to_string(e_count) + " topk=" + std::to_string(topk);
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
    res[r] = moe_dispatch_gemm(ex, t, x[r].data(), tokens[r], hidden, ids[r].data(), weights[r].data(), topk,
                               e_count, w1[r].data(), ffn);
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
      for (int k = 0; k < topk; ++k)
        pairs[ref_owner(ids[r][tok * topk + k], e_count, w)].push_back(tok * topk + k);
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
            const double p =
                x[src_rank[row]].at(src_token[row] * hidden + h) * w1[r].at((le * ffn + f) * hidden + h);
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
      if (ex.rank() == 1) ids[4] = bad;               // token 2, slot 0
      moe_dispatch_gemm(ex, DType::kF32, xx.data(), 3, 4, ids.data(), wts.data(), 2, 5, ww.data(), 2);
    });
    CHECK(error_is(errors[1], ErrorKind::kInvalidArgument,
                   {"moeDispatchGemm", "token 2", "expert id " + std::to_string(bad)}),
          "moe id " + std::to_string(bad) + " out of range: " + describe(errors[1]));
    CHECK(error_is(errors[0], ErrorKind::kCommunicator, {}),
          "moe bad id releases the peer: " + describe(errors[0]));
  }
}

// ---- attention ----------------------------------------------------------------------------------
// The fp64 reference of softmax attention over whole tensors: q (B, lq, Hq, D), k, v (B, lk, Hkv,
// D); query i sees keys j <= i when causal (top-left). Fills the expected o (B, lq, Hq, D) and
// lse (B, Hq, lq) with per-element tolerances for output dtype t.
struct AttnRef {
  Expect o, lse;
};
AttnRef reference_attention(DType t, const Tensor& q, const Tensor& k, const Tensor& v, int64_t b, int64_t lq,
                            int64_t lk, int64_t hq, int64_t hkv, int64_t d, bool causal, float scale_in) {
  const double scale = scale_in != 0.f ? scale_in : 1.0 / std::sqrt(static_cast<double>(d));
  AttnRef ref;
  ref.o.val.assign(b * lq * hq * d, 0), ref.o.tol.assign(b * lq * hq * d, 0);
  ref.lse.val.assign(b * hq * lq, -INFINITY), ref.lse.tol.assign(b * hq * lq, 0);
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t i = 0; i < lq; ++i)
      for (int64_t h = 0; h < hq; ++h) {
        const int64_t kh = h / (hq / hkv);
        const int64_t keys = causal ? std::min(i + 1, lk) : lk;
        const int64_t lse_at = (bi * hq + h) * lq + i;
        if (keys == 0) {  // no visible key: o = 0, lse = -inf, exactly
          ref.lse.tol[lse_at] = 1e-30;
          for (int64_t x = 0; x < d; ++x) ref.o.tol[((bi * lq + i) * hq + h) * d + x] = 1e-30;
          continue;
        }
        std::vector<double> score(keys);
        double mx = -INFINITY, smag = 0;
        for (int64_t j = 0; j < keys; ++j) {
          double dot = 0, mag = 0;
          for (int64_t x = 0; x < d; ++x) {
            const double p =
                q.at(((bi * lq + i) * hq + h) * d + x) * k.at(((bi * lk + j) * hkv + kh) * d + x);
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
        ref.lse.val[lse_at] = lse_ref;
        ref.lse.tol[lse_at] = rel + 1e-6 * std::fabs(lse_ref);
        for (int64_t x = 0; x < d; ++x) {
          double acc = 0, mag = 0;
          for (int64_t j = 0; j < keys; ++j) {
            const double p = std::exp(score[j] - mx) / l, vv = v.at(((bi * lk + j) * hkv + kh) * d + x);
            acc += p * vv;
            mag += p * std::fabs(vv);
          }
          const int64_t idx = ((bi * lq + i) * hq + h) * d + x;
          ref.o.val[idx] = acc;
          ref.o.tol[idx] = rounding_tol(t, acc, 2.0 * rel * mag);
        }
      }
  return ref;
}

struct AttnCase {
  int64_t batch, seq, hq, hkv, d;
  float scale;
};

const char* layout_name(SeqLayout l) { return l == SeqLayout::kZigzag ? "zigzag" : "contiguous"; }

// The rows of a (B, S, H·D) tensor at the global positions `pos`, in that order.
Tensor gather_rows(const Tensor& x, int64_t b, int64_t s, int64_t inner, const std::vector<int64_t>& pos) {
  const int64_t n = static_cast<int64_t>(pos.size()), es = dtype_size(x.t);
  Tensor out(x.t, b * n * inner);
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t i = 0; i < n; ++i)
      std::memcpy(out.bytes.data() + (bi * n + i) * inner * es,
                  x.bytes.data() + (bi * s + pos[i]) * inner * es, static_cast<size_t>(inner * es));
  return out;
}

// Expectations of `full` (B, S, inner) at the rows `pos`; lse-like (rows, S) with inner = 0.
Expect gather_expect(const Expect& full, int64_t b, int64_t s, int64_t inner,
                     const std::vector<int64_t>& pos) {
  Expect out;
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t i : pos)
      for (int64_t x = 0; x < inner; ++x)
        out.push(full.val[(bi * s + i) * inner + x], full.tol[(bi * s + i) * inner + x]);
  return out;
}
Expect gather_lse(const Expect& full, int64_t rows, int64_t s, const std::vector<int64_t>& pos) {
  Expect out;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i : pos) out.push(full.val[r * s + i], full.tol[r * s + i]);
  return out;
}

// Rank r's global positions under the layout, in its tensors' order.
std::vector<int64_t> positions(int64_t seq, int w, int r, SeqLayout layout) {
  // Written from the documented rule, not from split.h's seq_runs.
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

void run_attention_case(int w, DType t, bool causal, SeqLayout layout, const AttnCase& ac) {
  AttentionShape shape;
  shape.batch = ac.batch, shape.seq = ac.seq, shape.q_heads = ac.hq, shape.kv_heads = ac.hkv;
  shape.head_dim = ac.d, shape.causal = causal, shape.scale = ac.scale, shape.layout = layout;
  const int64_t b = ac.batch, s = ac.seq, hq = ac.hq, hkv = ac.hkv, d = ac.d;
  const std::string what = ctx("ringAttention", w, t) + (causal ? " causal " : " full ") +
                           layout_name(layout) + " B=" + std::to_string(b) + " S=" + std::to_string(s) +
                           " Hq=" + std::to_string(hq) + " Hkv=" + std::to_string(hkv) +
                           " D=" + std::to_string(d);
  // The whole sequence, dealt to the ranks by the layout.
  const Tensor gq = random_tensor(t, b * s * hq * d, -2.f, 2.f),
               gk = random_tensor(t, b * s * hkv * d, -2.f, 2.f), gv = random_tensor(t, b * s * hkv * d);
  std::vector<std::vector<int64_t>> pos(w);
  std::vector<Tensor> q(w), k(w), v(w), o(w), lse(w);
  for (int r = 0; r < w; ++r) {
    pos[r] = positions(s, w, r, layout);
    const int64_t n = static_cast<int64_t>(pos[r].size());
    CHECK(n == fusedcomm::seq_runs(s, w, r, layout).total(),
          what + " rank " + std::to_string(r) + " holds the documented count");
    q[r] = gather_rows(gq, b, s, hq * d, pos[r]);
    k[r] = gather_rows(gk, b, s, hkv * d, pos[r]);
    v[r] = gather_rows(gv, b, s, hkv * d, pos[r]);
    o[r] = poisoned(t, b * n * hq * d);
    lse[r] = poisoned(DType::kF32, b * hq * n);
  }
  auto errors = run_ranks(w, [&](Exchanger& ex) {
    const int r = ex.rank();
    ring_attention(ex, t, shape, q[r].data(), k[r].data(), v[r].data(), o[r].data(),
                   static_cast<float*>(lse[r].data()));
  });
  if (!all_ok(errors, what)) return;

  // The single-rank op over the whole sequence, and the fp64 reference.
  AttentionLocalShape local;
  local.batch = b, local.q_len = s, local.kv_len = s, local.q_heads = hq, local.kv_heads = hkv;
  local.head_dim = d, local.causal = causal, local.scale = ac.scale;
  Tensor lo = poisoned(t, b * s * hq * d), llse = poisoned(DType::kF32, b * hq * s);
  attention(t, local, gq.data(), gk.data(), gv.data(), lo.data(), static_cast<float*>(llse.data()));
  const AttnRef ref = reference_attention(t, gq, gk, gv, b, s, s, hq, hkv, d, causal, ac.scale);
  check_close(what + " local op O", lo, ref.o);
  check_close(what + " local op LSE", llse, ref.lse);
  for (int r = 0; r < w; ++r) {
    const std::string at = what + " rank " + std::to_string(r);
    const Expect eo = gather_expect(ref.o, b, s, hq * d, pos[r]), el = gather_lse(ref.lse, b * hq, s, pos[r]);
    check_close(at + " O", o[r], eo);
    check_close(at + " LSE", lse[r], el);
    // Against the local op's rows: both within their bound of fp64, so within the sum.
    Expect vs_local_o = eo, vs_local_l = el;
    const Tensor lo_rows = gather_rows(lo, b, s, hq * d, pos[r]);
    for (size_t i = 0; i < vs_local_o.val.size(); ++i)
      vs_local_o.val[i] = lo_rows.at(i), vs_local_o.tol[i] *= 2;
    Tensor llse_rows(DType::kF32, b * hq * static_cast<int64_t>(pos[r].size()));
    int64_t at_i = 0;
    for (int64_t row = 0; row < b * hq; ++row)
      for (int64_t p : pos[r]) llse_rows.set(at_i++, static_cast<float>(llse.at(row * s + p)));
    for (size_t i = 0; i < vs_local_l.val.size(); ++i)
      vs_local_l.val[i] = llse_rows.at(i), vs_local_l.tol[i] *= 2;
    check_close(at + " O vs the local op", o[r], vs_local_o);
    check_close(at + " LSE vs the local op", lse[r], vs_local_l);
  }
}

void test_ring_attention() {
  for (int w = 1; w <= 4; ++w)
    for (DType t : {DType::kF32, DType::kBF16})
      for (bool causal : {false, true})
        for (SeqLayout layout : {SeqLayout::kContiguous, SeqLayout::kZigzag}) {
          const std::vector<AttnCase> cases = {
              {2, 6 * w, 4, 2, 8, 0.f},      // divides by 2W, GQA 2:1
              {1, 11, 3, 1, 16, 0.3f},       // uneven, GQA 3:1 (MQA), explicit scale
              {2, 2, 2, 2, 8, 0.f},          // fewer positions than ranks (and chunks)
              {1, 4 * w + 1, 2, 2, 4, 0.f},  // uneven, MHA
              {1, 2 * w + 3, 8, 2, 8, 0.f},  // uneven over 2W chunks, GQA 4:1
          };
          for (const AttnCase& ac : cases) run_attention_case(w, t, causal, layout, ac);
        }
  // Zigzag rank 0 of 2 over 10 positions: chunks of 3, 3, 2, 2; it holds 0-2, then 8-9.
  const fusedcomm::SeqRuns z = fusedcomm::seq_runs(10, 2, 0, SeqLayout::kZigzag);
  CHECK(z.n == 2 && z.run[0].pos == 0 && z.run[0].count == 3 && z.run[1].pos == 8 && z.run[1].count == 2,
        "zigzag runs of rank 0 of 2 over 10 positions");
  AttentionShape bad;
  bad.seq = 4, bad.q_heads = 3, bad.kv_heads = 2, bad.head_dim = 4;
  auto errors = run_ranks(1, [&](Exchanger& ex) {
    ring_attention(ex, DType::kF32, bad, nullptr, nullptr, nullptr, nullptr, nullptr);
  });
  CHECK(error_is(errors[0], ErrorKind::kInvalidArgument, {"ringAttention", "q_heads = 3", "kv_heads = 2"}),
        "ringAttention with q_heads % kv_heads != 0 fails: " + describe(errors[0]));
  bad.kv_heads = 3;
  bad.layout = static_cast<SeqLayout>(5);
  errors = run_ranks(2, [&](Exchanger& ex) {
    ring_attention(ex, DType::kF32, bad, nullptr, nullptr, nullptr, nullptr, nullptr);
  });
  CHECK(error_is(errors[0], ErrorKind::kInvalidArgument, {"ringAttention", "unknown sequence layout 5"}),
        "ringAttention with an unknown layout fails: " + describe(errors[0]));
}

// The single-rank op: query and key lengths that differ (causal top-left: query i sees keys
// j <= i), no lse, empty sequences, against the fp64 reference.
void run_local_case(DType t, bool causal, int64_t b, int64_t lq, int64_t lk, int64_t hq, int64_t hkv,
                    int64_t d, float scale, bool want_lse) {
  const std::string what =
      std::string("attention ") + name(t) + (causal ? " causal" : " full") + " B=" + std::to_string(b) +
      " Lq=" + std::to_string(lq) + " Lk=" + std::to_string(lk) + " Hq=" + std::to_string(hq) +
      " Hkv=" + std::to_string(hkv) + " D=" + std::to_string(d) + (want_lse ? "" : " no lse");
  AttentionLocalShape s;
  s.batch = b, s.q_len = lq, s.kv_len = lk, s.q_heads = hq, s.kv_heads = hkv, s.head_dim = d;
  s.causal = causal, s.scale = scale;
  const Tensor q = random_tensor(t, b * lq * hq * d, -2.f, 2.f),
               k = random_tensor(t, b * lk * hkv * d, -2.f, 2.f), v = random_tensor(t, b * lk * hkv * d);
  Tensor o = poisoned(t, b * lq * hq * d), lse = poisoned(DType::kF32, b * hq * lq);
  try {
    attention(t, s, q.data(), k.data(), v.data(), o.data(),
              want_lse ? static_cast<float*>(lse.data()) : nullptr);
  } catch (const std::exception& e) {
    CHECK(false, what + ": " + e.what());
    return;
  }
  const AttnRef ref = reference_attention(t, q, k, v, b, lq, lk, hq, hkv, d, causal, scale);
  check_close(what + " O", o, ref.o);
  if (want_lse) {
    check_close(what + " LSE", lse, ref.lse);
  } else {
    const Tensor untouched = poisoned(DType::kF32, b * hq * lq);
    CHECK(same_bits(lse, 0, untouched, 0, b * hq * lq), what + ": lse left alone");
  }
}

void test_local_attention() {
  for (DType t : {DType::kF32, DType::kBF16})
    for (bool causal : {false, true}) {
      run_local_case(t, causal, 2, 7, 7, 4, 2, 8, 0.f, true);     // square, GQA 2:1
      run_local_case(t, causal, 1, 5, 9, 3, 1, 16, 0.25f, true);  // more keys than queries, MQA
      run_local_case(t, causal, 3, 9, 4, 2, 2, 4, 0.f, false);    // fewer keys, no lse
      run_local_case(t, causal, 1, 3, 0, 2, 1, 8, 0.f, true);     // no key: o = 0, lse = -inf
      run_local_case(t, causal, 1, 0, 5, 2, 1, 8, 0.f, true);     // no query
    }
  AttentionLocalShape bad;
  bad.q_len = 2, bad.kv_len = 2, bad.q_heads = 4, bad.kv_heads = 3, bad.head_dim = 8;
  const auto fails = [](const AttentionLocalShape& s, const std::vector<std::string>& words,
                        const std::string& what, const void* p = nullptr) {
    std::exception_ptr e;
    try {
      attention(DType::kF32, s, p, p, p, const_cast<void*>(p), nullptr);
    } catch (...) { e = std::current_exception(); }
    CHECK(error_is(e, ErrorKind::kInvalidArgument, words), what + ": " + describe(e));
  };
  fails(bad, {"attention", "q_heads = 4", "kv_heads = 3"}, "attention with q_heads % kv_heads != 0");
  bad.kv_heads = 2, bad.head_dim = 0;
  fails(bad, {"attention", "head_dim = 0"}, "attention with head_dim 0");
  bad.head_dim = 8, bad.kv_len = -1;
  fails(bad, {"attention", "kv_len"}, "attention with a negative kv_len");
  bad.kv_len = 2;
  fails(bad, {"attention", "q is null"}, "attention with a null q");
  bad.scale = NAN;
  float x[64] = {};
  fails(bad, {"attention", "scale"}, "attention with a NaN scale", x);
}

}  // namespace

int main() {
  return run_groups(
      "host_moe_attention_test",
      {{"moe", test_moe}, {"attention", test_local_attention}, {"ringAttention", test_ring_attention}});
}
