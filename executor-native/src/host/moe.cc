// MoE expert parallelism on the host: dispatch (route token rows to their experts' ranks, then
// one GEMM per local expert) and combine (send expert rows home, weighted sum per token).
//
// Wire format of the dispatch: first the same count block to every rank: the sender's token
// count T, its receive bound (MoeDispatchOptions::max_recv_rows) and n_d, the rows it routes to
// each rank d (so every rank derives every rank's receive total and fails an overflow the same
// way), then one block per destination rank d:
//   [RoutedRowMeta × n_d][n_d × hidden elements of dtype t]
// rows in the sender's (token, slot) order, each pair at most once, so n_d <= T × topk. The
// receiver checks the counts before it sizes anything from them, and every row's identity
// before it uses it: a peer's numbers are its word until they fit. The combine exchange returns,
// per home rank s:
//   [float weight × n_s][n_s × width elements of dtype t]
// rows again in s's (token, slot) order, which is the order of layout.sent_pairs[d] on s.
#include <algorithm>
#include <cstring>
#include <limits>
#include <utility>

#include "detail.h"
#include "fusedcomm/runtime/split.h"

namespace fusedcomm::host {

namespace {

// One routed row's identity, sent ahead of the rows themselves.
struct alignas(4) RoutedRowMeta {
  int32_t token;   // index in the source rank's tokens
  int32_t slot;    // which of the token's topk choices
  int32_t expert;  // global expert id
  float weight;    // the token's routing weight for this slot
};
static_assert(sizeof(RoutedRowMeta) == 16, "RoutedRowMeta travels between ranks");

// What a rank announces to every rank before the rows: a header, then world int64 row counts
// (rows_to[d]: the rows it routes to rank d).
struct alignas(8) CountsHeader {
  int64_t tokens;         // its own token count T (RoutedRowMeta::token < T)
  int64_t max_recv_rows;  // its receive bound (0: none); the same on every rank
};
static_assert(sizeof(CountsHeader) == 16, "CountsHeader travels between ranks");

std::string str(int64_t v) { return std::to_string(v); }

// a · b for non-negative a, b, or -1 when it does not fit an int64.
int64_t checked_mul(int64_t a, int64_t b) {
  int64_t r = 0;
  return __builtin_mul_overflow(a, b, &r) ? -1 : r;
}

// The byte size of `rows` rows of `row_bytes` each, refused (naming the op) when it overflows.
size_t checked_bytes(int64_t rows, int64_t row_bytes, const char* op, const char* what) {
  const int64_t b = checked_mul(rows, row_bytes);
  if (b < 0 || static_cast<uint64_t>(b) > std::numeric_limits<size_t>::max()) {
    fail(ErrorKind::kInvalidArgument, std::string(op) + ": " + what + " of " + str(rows) + " rows of " +
                                          str(row_bytes) + " bytes overflows a byte count");
  }
  return static_cast<size_t>(b);
}

}  // namespace

MoeDispatchResult moe_dispatch_gemm(Exchanger& ex, DType t, const void* x, int64_t tokens, int64_t hidden,
                                    const int32_t* topk_ids, const float* topk_weights, int topk,
                                    int64_t num_experts, const void* w1_local, int64_t ffn,
                                    const MoeDispatchOptions& options) {
  constexpr const char* kOp = "moeDispatchGemm";
  const int world = ex.world(), r = ex.rank();
  detail::require_dtype(t, kOp);
  detail::require_nonneg(tokens, kOp, "tokens");
  detail::require_nonneg(hidden, kOp, "hidden");
  detail::require_nonneg(topk, kOp, "topk");
  detail::require_nonneg(ffn, kOp, "ffn");
  FC_REQUIRE(num_experts >= 1, std::string(kOp) + ": num_experts = " + str(num_experts) + " must be >= 1");
  FC_REQUIRE(options.max_recv_rows >= 0, std::string(kOp) + ": maxRecvRows = " + str(options.max_recv_rows) +
                                             " must be >= 0 (0: no bound)");
  detail::require_data(x, tokens * hidden, kOp, "x");
  detail::require_data(topk_ids, tokens * topk, kOp, "topk_ids");
  detail::require_data(topk_weights, tokens * topk, kOp, "topk_weights");
  detail::require_data(w1_local, split_count(num_experts, world, r) * ffn * hidden, kOp, "w1_local");
  // Rows travel with an int32 token index (RoutedRowMeta).
  FC_REQUIRE(tokens <= std::numeric_limits<int32_t>::max(), std::string(kOp) + ": tokens = " + str(tokens) +
                                                                " exceeds " +
                                                                str(std::numeric_limits<int32_t>::max()));
  for (int64_t tok = 0; tok < tokens; ++tok) {
    for (int k = 0; k < topk; ++k) {
      const int32_t id = topk_ids[tok * topk + k];
      FC_REQUIRE(id >= 0 && id < num_experts, std::string(kOp) + ": token " + str(tok) + " slot " + str(k) +
                                                  " routes to expert id " + str(id) + ", outside [0, " +
                                                  str(num_experts) + ")");
    }
  }

  const int64_t esize = dtype_size(t);
  const int64_t row_bytes = hidden * esize;
  std::vector<int> owner(static_cast<size_t>(num_experts));
  for (int p = 0; p < world; ++p) {
    const int64_t first = split_offset(num_experts, world, p);
    for (int64_t e = first; e < first + split_count(num_experts, world, p); ++e) owner[e] = p;
  }

  MoeDispatchResult result;
  MoeLayout& layout = result.layout;
  layout.world = world;
  layout.rank = r;
  layout.topk = topk;
  layout.num_experts = num_experts;
  layout.first_local_expert = split_offset(num_experts, world, r);
  layout.local_experts = split_count(num_experts, world, r);
  layout.tokens = tokens;
  layout.sent_pairs.assign(world, {});
  for (int64_t tok = 0; tok < tokens; ++tok)
    for (int k = 0; k < topk; ++k)
      layout.sent_pairs[owner[topk_ids[tok * topk + k]]].push_back(tok * topk + k);

  // 1. Row counts, so every rank can size its receive blocks and check every rank's receive
  // total against the bound; checked before anything is sized from them: a peer's token count
  // fits RoutedRowMeta's int32, and its rows (to any rank, and in all) are at most its tokens ×
  // topk (topk is in the op's fingerprint, the same on every rank).
  std::vector<int64_t> send_rows(world), recv_rows(world), recv_tokens(world);
  {
    const size_t block = sizeof(CountsHeader) + static_cast<size_t>(world) * sizeof(int64_t);
    std::vector<uint8_t> out(block), in(block * world);
    CountsHeader head{tokens, options.max_recv_rows};
    std::memcpy(out.data(), &head, sizeof head);
    for (int p = 0; p < world; ++p) {
      send_rows[p] = static_cast<int64_t>(layout.sent_pairs[p].size());
      std::memcpy(out.data() + sizeof head + p * sizeof(int64_t), &send_rows[p], sizeof(int64_t));
    }
    std::vector<SendBlock> send(world);
    std::vector<RecvBlock> recv(world);
    for (int p = 0; p < world; ++p) {
      send[p] = {out.data(), block};
      recv[p] = {in.data() + p * block, block};
    }
    ex.exchange(send, recv, "moeDispatch/counts");
    std::vector<int64_t> total(world, 0), bound(world, 0);
    for (int p = 0; p < world; ++p) {
      CountsHeader c;
      std::memcpy(&c, in.data() + p * block, sizeof c);
      if (c.tokens < 0 || c.tokens > std::numeric_limits<int32_t>::max()) {
        fail(ErrorKind::kCommunicator, std::string(kOp) + ": rank " + str(p) + " announced " + str(c.tokens) +
                                           " tokens, outside [0, " +
                                           str(std::numeric_limits<int32_t>::max()) + "]");
      }
      const int64_t most = c.tokens * topk;  // < 2^31 · 2^31: no overflow
      int64_t sum = 0;
      for (int d = 0; d < world; ++d) {
        int64_t rows = 0;
        std::memcpy(&rows, in.data() + p * block + sizeof c + d * sizeof(int64_t), sizeof rows);
        sum += (rows >= 0 && rows <= most) ? rows : 0;
        if (rows < 0 || rows > most || sum > most) {
          fail(ErrorKind::kCommunicator, std::string(kOp) + ": rank " + str(p) + " announced " + str(rows) +
                                             " rows for rank " + str(d) + ", outside [0, " + str(most) +
                                             "] (its " + str(c.tokens) + " tokens x topk " + str(topk) +
                                             (sum > most ? ", in all" : "") + ")");
        }
        // Saturating: a total past int64 is past any bound as well.
        total[d] = rows > std::numeric_limits<int64_t>::max() - total[d] ? std::numeric_limits<int64_t>::max()
                                                                         : total[d] + rows;
        if (d == r) recv_rows[p] = rows;
      }
      recv_tokens[p] = c.tokens;
      bound[p] = c.max_recv_rows;
    }
    // The bound and every rank's total are the same numbers on every rank: so is the verdict.
    for (int p = 1; p < world; ++p) {
      if (bound[p] != bound[0]) {
        fail(ErrorKind::kInvalidArgument,
             std::string(kOp) + ": maxRecvRows differs between ranks (rank 0: " + str(bound[0]) + ", rank " +
                 str(p) + ": " + str(bound[p]) + ")");
      }
    }
    for (int d = 0; d < world; ++d) {
      if (bound[0] > 0 && total[d] > bound[0]) {
        fail(ErrorKind::kInvalidArgument,
             std::string(kOp) + ": rank " + str(d) + " would receive " + str(total[d]) +
                 " routed rows, more than maxRecvRows = " + str(bound[0]) + "; no row moved");
      }
    }
  }

  // 2. The routed rows with their metadata.
  const auto* xb = static_cast<const uint8_t*>(x);
  const auto block_bytes = [&](int64_t rows) {
    return checked_bytes(rows, static_cast<int64_t>(sizeof(RoutedRowMeta)) + row_bytes, kOp, "a row block");
  };
  std::vector<std::vector<uint8_t>> out_blocks(world), in_blocks(world);
  std::vector<SendBlock> send(world);
  std::vector<RecvBlock> recv(world);
  for (int p = 0; p < world; ++p) {
    const int64_t n = send_rows[p];
    out_blocks[p].resize(block_bytes(n));
    auto* meta = reinterpret_cast<RoutedRowMeta*>(out_blocks[p].data());
    uint8_t* rows = out_blocks[p].data() + n * sizeof(RoutedRowMeta);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t pair = layout.sent_pairs[p][i];
      const int64_t tok = pair / topk;
      meta[i] = {static_cast<int32_t>(tok), static_cast<int32_t>(pair % topk), topk_ids[pair],
                 topk_weights[pair]};
      if (row_bytes) std::memcpy(rows + i * row_bytes, xb + tok * row_bytes, row_bytes);
    }
    in_blocks[p].resize(block_bytes(recv_rows[p]));
    send[p] = {out_blocks[p].data(), out_blocks[p].size()};
    recv[p] = {in_blocks[p].data(), in_blocks[p].size()};
  }
  ex.exchange(send, recv, "moeDispatch/rows");

  // 3. Expert-major layout; a counting sort keeps (source rank, token, slot) order per expert.
  // Each row's identity is checked first: an expert this rank owns, a token of the sender's, a
  // slot below topk, pairs strictly ascending (each at most once, as the combine returns them).
  const int64_t local = layout.local_experts, first = layout.first_local_expert;
  layout.expert_offsets.assign(local + 1, 0);
  for (int s = 0; s < world; ++s) {
    const auto* meta = reinterpret_cast<const RoutedRowMeta*>(in_blocks[s].data());
    int64_t previous = -1;
    for (int64_t i = 0; i < recv_rows[s]; ++i) {
      const int64_t e = static_cast<int64_t>(meta[i].expert) - first;
      if (e < 0 || e >= local)
        fail(ErrorKind::kCommunicator, std::string(kOp) + ": rank " + str(r) + " received a row for expert " +
                                           str(meta[i].expert) + " from rank " + str(s) +
                                           ", which it does not own");
      const int64_t tok = meta[i].token, slot = meta[i].slot;
      if (tok < 0 || tok >= recv_tokens[s] || slot < 0 || slot >= topk || tok * topk + slot <= previous) {
        fail(ErrorKind::kCommunicator,
             std::string(kOp) + ": rank " + str(r) + " received row " + str(i) + " from rank " + str(s) +
                 " for token " + str(tok) + " slot " + str(slot) + ": not a new (token, slot) of its " +
                 str(recv_tokens[s]) + " tokens x topk " + str(topk) + " in ascending order");
      }
      previous = tok * topk + slot;
      ++layout.expert_offsets[e + 1];
    }
  }
  for (int64_t e = 0; e < local; ++e) layout.expert_offsets[e + 1] += layout.expert_offsets[e];
  const int64_t rows = layout.rows();
  layout.src_rank.resize(rows);
  layout.src_token.resize(rows);
  layout.src_slot.resize(rows);
  layout.weight.resize(rows);
  result.routed_x.resize(checked_bytes(rows, row_bytes, kOp, "the routed rows"));
  std::vector<int64_t> cursor(layout.expert_offsets.begin(), layout.expert_offsets.end() - 1);
  for (int s = 0; s < world; ++s) {
    const auto* meta = reinterpret_cast<const RoutedRowMeta*>(in_blocks[s].data());
    const uint8_t* src_rows = in_blocks[s].data() + recv_rows[s] * sizeof(RoutedRowMeta);
    for (int64_t i = 0; i < recv_rows[s]; ++i) {
      const int64_t row = cursor[meta[i].expert - first]++;
      layout.src_rank[row] = s;
      layout.src_token[row] = meta[i].token;
      layout.src_slot[row] = meta[i].slot;
      layout.weight[row] = meta[i].weight;
      if (row_bytes)
        std::memcpy(result.routed_x.data() + row * row_bytes, src_rows + i * row_bytes, row_bytes);
    }
  }

  // 4. One GEMM per local expert over its contiguous rows.
  result.out.resize(checked_bytes(rows, checked_mul(ffn, esize), kOp, "the expert outputs"));
  const auto* w1 = static_cast<const uint8_t*>(w1_local);
  for (int64_t e = 0; e < local; ++e) {
    const int64_t begin = layout.expert_offsets[e], n = layout.expert_offsets[e + 1] - begin;
    if (n == 0 || ffn == 0) continue;
    gemm(t, result.routed_x.data() + begin * row_bytes, w1 + e * ffn * hidden * esize,
         result.out.data() + begin * ffn * esize, n, ffn, hidden, WeightLayout::kNK);
  }
  return result;
}

void moe_combine(Exchanger& ex, DType t, const MoeLayout& layout, const void* expert_out, int64_t width,
                 void* out) {
  constexpr const char* kOp = "moeCombine";
  const int world = ex.world(), r = ex.rank();
  detail::require_dtype(t, kOp);
  detail::require_nonneg(width, kOp, "width");
  FC_REQUIRE(layout.world == world && layout.rank == r,
             std::string(kOp) + ": layout is for rank " + str(layout.rank) + " of " + str(layout.world) +
                 ", called on rank " + str(r) + " of " + str(world));
  const int64_t rows = layout.rows();
  FC_REQUIRE(static_cast<int64_t>(layout.sent_pairs.size()) == world &&
                 static_cast<int64_t>(layout.src_rank.size()) == rows &&
                 static_cast<int64_t>(layout.src_token.size()) == rows &&
                 static_cast<int64_t>(layout.src_slot.size()) == rows &&
                 static_cast<int64_t>(layout.weight.size()) == rows,
             std::string(kOp) + ": layout is incomplete (rows = " + str(rows) + ", sent_pairs for " +
                 str(static_cast<int64_t>(layout.sent_pairs.size())) + " ranks)");
  detail::require_data(expert_out, rows * width, kOp, "expert_out");
  detail::require_data(out, layout.tokens * width, kOp, "out");

  const int64_t esize = dtype_size(t);
  const int64_t row_bytes = width * esize;
  const int topk = layout.topk;

  // Return rows to each home rank in the order it sent them: ascending (token, slot).
  std::vector<std::vector<int64_t>> back(world);
  for (int64_t row = 0; row < rows; ++row) back[layout.src_rank[row]].push_back(row);
  const auto* eo = static_cast<const uint8_t*>(expert_out);
  const auto block_bytes = [&](int64_t n) { return n * static_cast<int64_t>(sizeof(float) + row_bytes); };
  std::vector<std::vector<uint8_t>> out_blocks(world), in_blocks(world);
  std::vector<SendBlock> send(world);
  std::vector<RecvBlock> recv(world);
  for (int s = 0; s < world; ++s) {
    auto& order = back[s];
    std::sort(order.begin(), order.end(), [&](int64_t x, int64_t y) {
      return std::pair(layout.src_token[x], layout.src_slot[x]) <
             std::pair(layout.src_token[y], layout.src_slot[y]);
    });
    const int64_t n = static_cast<int64_t>(order.size());
    out_blocks[s].resize(static_cast<size_t>(block_bytes(n)));
    auto* weights = reinterpret_cast<float*>(out_blocks[s].data());
    uint8_t* dst_rows = out_blocks[s].data() + n * sizeof(float);
    for (int64_t i = 0; i < n; ++i) {
      weights[i] = layout.weight[order[i]];
      if (row_bytes) std::memcpy(dst_rows + i * row_bytes, eo + order[i] * row_bytes, row_bytes);
    }
    in_blocks[s].resize(static_cast<size_t>(block_bytes(layout.sent_pairs[s].size())));
    send[s] = {out_blocks[s].data(), out_blocks[s].size()};
    recv[s] = {in_blocks[s].data(), in_blocks[s].size()};
  }
  ex.exchange(send, recv, "moeCombine/rows");

  // Index every (token, slot) pair's returned row, then sum per token in slot order.
  const int64_t pairs = layout.tokens * topk;
  std::vector<const uint8_t*> row_of(static_cast<size_t>(pairs), nullptr);
  std::vector<float> weight_of(static_cast<size_t>(pairs), 0.f);
  for (int s = 0; s < world; ++s) {
    const int64_t n = static_cast<int64_t>(layout.sent_pairs[s].size());
    const auto* weights = reinterpret_cast<const float*>(in_blocks[s].data());
    const uint8_t* src_rows = in_blocks[s].data() + n * sizeof(float);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t pair = layout.sent_pairs[s][i];
      row_of[pair] = src_rows + i * row_bytes;
      weight_of[pair] = weights[i];
    }
  }
  std::vector<float> acc(static_cast<size_t>(width)), row(static_cast<size_t>(width));
  auto* ob = static_cast<uint8_t*>(out);
  for (int64_t tok = 0; tok < layout.tokens; ++tok) {
    std::fill(acc.begin(), acc.end(), 0.f);
    for (int k = 0; k < topk; ++k) {
      const int64_t pair = tok * topk + k;
      if (row_of[pair] == nullptr) {
        if (width == 0) continue;
        fail(ErrorKind::kCommunicator, std::string(kOp) + ": rank " + str(r) + " got no row back for token " +
                                           str(tok) + " slot " + str(k));
      }
      detail::to_f32(t, row_of[pair], width, row.data());
      for (int64_t c = 0; c < width; ++c) acc[c] += weight_of[pair] * row[c];
    }
    detail::from_f32(t, acc.data(), width, ob + tok * row_bytes);
  }
}

}  // namespace fusedcomm::host
