// host_moe_attention_test: the host backend's moeDispatchGemm, moeCombine and ringAttention on
// W = 1..4 in-process ranks (thread_exchanger.h), both dtypes, uneven splits and empty edge
// cases, with fresh random inputs (seed printed; FC_TEST_SEED=<n> replays one), poisoned outputs
// and every element compared with a naive fp64 reference written here under the tolerance of
// support/host_ops_support.h; and their argument errors releasing the peers.
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
                           " B=" + std::to_string(b) + " S=" + std::to_string(s) +
                           " Hq=" + std::to_string(hq) + " Hkv=" + std::to_string(hkv) +
                           " D=" + std::to_string(d);
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
  return run_groups("host_moe_attention_test", {{"moe", test_moe}, {"ringAttention", test_ring_attention}});
}
