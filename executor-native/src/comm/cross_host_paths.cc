#include "cross_host_paths.h"

#include <algorithm>
#include <string>
#include <vector>

#include "fusedcomm/runtime/device_gemm.h"
#include "fusedcomm/runtime/errors.h"
#include "fusedcomm/runtime/split.h"
#include "kernels/ag_gemm/ag_gemm.h"
#include "kernels/gemm_rs/gemm_rs.h"

namespace fusedcomm {
namespace {

namespace k = kernels;

// The blocks of a collective of `count` elements across hosts: the global split rule decides
// them (rank g's block: split_count(count, W, g) elements at split_offset(count, W, g), W the
// whole world). Host h's ranks, ascending, hold blocks whose sizes do not grow and differ by at
// most one, so the concatenation of host h's blocks, split among its L ranks by the split rule,
// gives local rank l exactly the block of host h's l-th rank: each host's part is one local
// collective of host_count(h) elements, and the l-th block starts at split_offset(host_count(h),
// L, l) in it.
struct GlobalBlocks {
  const HostLayout& lay;
  int64_t count;
  size_t esize;
  int world() const { return lay.world(); }
  int64_t n(int g) const { return split_count(count, world(), g); }
  size_t bytes(int g) const { return static_cast<size_t>(n(g)) * esize; }
  size_t offset(int g) const { return static_cast<size_t>(split_offset(count, world(), g)) * esize; }
  int64_t host_count(int h) const {
    int64_t total = 0;
    for (int g : lay.host_ranks[h]) total += n(g);
    return total;
  }
  // Byte offset of host h's l-th block in the concatenation of host h's blocks.
  size_t in_host(int h, int l) const {
    return static_cast<size_t>(split_offset(host_count(h), lay.local_world, l)) * esize;
  }
  bool consecutive(int h) const {
    return lay.host_ranks[h].back() - lay.host_ranks[h].front() == lay.local_world - 1;
  }
  int64_t largest_host() const {
    int64_t most = 0;
    for (int h = 0; h < lay.hosts; ++h) most = std::max(most, host_count(h));
    return most;
  }
};

// The fused ops' collective runs on W equal blocks of ceil(M / W) rows when W does not divide
// M (rank p's rows first in block p; the rest is padding that no result reads).
struct RowBlocks {
  int64_t m;
  int world;
  int64_t ceil() const { return (m + world - 1) / world; }
  bool even() const { return m % world == 0; }
  int64_t rows(int p) const { return split_count(m, world, p); }
  int64_t first(int p) const { return split_offset(m, world, p); }
  // Elements of the collective over rows of `row` elements: padded to W blocks of ceil rows.
  int64_t count(int64_t row) const { return (even() ? m : world * ceil()) * row; }
};

void launch_dense_gemm(const void* a, const void* w, void* c, int64_t m, int64_t n, int64_t k,
                       WeightLayout layout, k::GemmOutType c_type, k::GemmWorkspace gemm_ws, const char* op,
                       cudaStream_t s) {
  k::GemmArgs g = dense_gemm_args(a, w, c, m, n, k, layout, c_type);
  k::use_workspace(g, gemm_ws);
  check_fused_launch(k::launch_gemm(g, s), op);
}

}  // namespace

// The counterparts' link blobs travel as one exchange of the host half (every rank sends its
// blob to every rank; each keeps its counterparts').
CrossHostPaths::CrossHostPaths(Runtime& runtime, const HostLayout& layout, LocalCollectives& local,
                               TransportExchanger& host_half, uint64_t comm_id)
    : layout_(layout), local_(local) {
  link_ = std::make_unique<InterHostLink>(runtime, layout_.host, layout_.hosts,
                                          InterHostLink::chunk_bytes_for(runtime.config()),
                                          runtime.config().transport_streams);
  const InterHostLink::Blob mine = link_->blob();
  const int world = host_half.world();
  std::vector<InterHostLink::Blob> all(world);
  std::vector<SendBlock> send(world, SendBlock{&mine, sizeof mine});
  std::vector<RecvBlock> recv(world);
  for (int r = 0; r < world; ++r) recv[r] = RecvBlock{&all[r], sizeof all[r]};
  host_half.begin_op("connect the cuda backend between hosts", 0x63756461686f7374ull);  // "cudahost"
  host_half.exchange(send, recv, "inter-host link blobs");
  std::vector<InterHostLink::Blob> peers;
  std::vector<std::string> names;
  for (int h = 0; h < layout_.hosts; ++h) {
    const int r = layout_.counterparts[h];
    peers.push_back(all[r]);
    names.push_back("rank " + std::to_string(r) + " (host " + std::to_string(h) + ")");
  }
  // One group per local rank: an id of its own, distinct from the host half's.
  const uint64_t group_id =
      (comm_id ^ 0x696e746572686f73ull) * 0x9E3779B97F4A7C15ull + layout_.local_rank + 1;
  // An abort of the communicator aborts host_half first, so its flag ends this connect too.
  link_->connect(peers, names, group_id, host_half.key(), &host_half.aborted_flag());
}

CrossHostPaths::~CrossHostPaths() = default;

// reduceScatter inside the host into this rank's block of `out`, the block's allReduce between
// hosts in place, allGather inside the host from the block. `in` may alias `out`: a step whose
// input overlaps its output has it copied into the data area first (LocalCollectives::enqueue).
void CrossHostPaths::all_reduce(k::CommDtype dtype, const char* in, char* out, int64_t n, cudaStream_t s) {
  const size_t esize = element_bytes(dtype);
  const int L = local_.memory().world(), l = local_.memory().rank();
  const int64_t mine = split_count(n, L, l);
  char* block = out + split_offset(n, L, l) * esize;
  auto step = [&](k::CommOp op, void* output) {
    k::CollectiveArgs a;
    a.op = op;
    a.dtype = dtype;
    a.count = n;
    a.output = output;
    return a;
  };
  local_.enqueue(step(k::CommOp::kReduceScatter, block), in, static_cast<size_t>(n) * esize, s);
  link_->all_reduce(block, mine, dtype, s);
  gate(s);
  local_.enqueue(step(k::CommOp::kAllGather, out), block, static_cast<size_t>(mine) * esize, s);
}

// allGather: the blocks of this rank's counterparts (one per host) are exchanged between hosts
//   into H equal slots of the data area (the own block copied in first); then, per host h, an
//   allGather among this host's ranks of slot h gives host h's blocks.
// reduceScatter: per host h, a reduceScatter among this host's ranks of host h's blocks gives
//   this rank the host-local sum of its counterpart's block on h (into the workspace); then the
//   reduceScatter between hosts of those H sums gives this rank its own block.
// allToAll (block p of every rank's input goes to rank p), in two hops:
//   1. the input's blocks, grouped by destination host (S[h']: the blocks for host h''s ranks,
//      in local order), go to the counterparts: S[h'] to host h' (R[s]: what host s sent);
//   2. a local allToAll among this host's ranks forwards each block to its rank: lane l' of the
//      local input holds, for each source host s, the block that (s, this local rank) sent to
//      (this host, l'); lanes are padded to H x count(n, W, 0) elements so that the local
//      allToAll splits evenly;
//   3. the local output (lane from each local rank l'', in source-host order) is put in source
//      rank order.
// Host h's blocks are contiguous in the caller's tensor when host h's ranks are consecutive;
// otherwise they are gathered into (or scattered from) the local step's input and output.
CrossHostPaths::Needs CrossHostPaths::collective_needs(k::CommOp op, size_t esize, int64_t count) const {
  const GlobalBlocks b{layout_, count, esize};
  const uint64_t H = layout_.hosts, L = layout_.local_world;
  const uint64_t slot = round16(b.bytes(0));
  const uint64_t host_bytes = static_cast<uint64_t>(b.largest_host()) * esize;
  bool any_scattered = false;
  for (int h = 0; h < layout_.hosts; ++h) any_scattered |= !b.consecutive(h);
  switch (op) {
    case k::CommOp::kAllGather: return {H * slot, any_scattered ? host_bytes : 0};
    case k::CommOp::kReduceScatter: return {host_bytes, H * slot};
    case k::CommOp::kAllToAll: {
      const uint64_t lane = H * b.bytes(0);
      return {L * lane, H * round16(host_bytes) * 2 + L * lane};
    }
    default: fail(ErrorKind::kState, "needs_across_hosts: not a gather, scatter or allToAll");
  }
}

void CrossHostPaths::enqueue_collective(k::CommOp op, k::CommDtype dtype, const void* in, uint64_t in_bytes,
                                        void* out, int64_t count, char* work, cudaStream_t s) {
  const GlobalBlocks b{layout_, count, element_bytes(dtype)};
  const int H = layout_.hosts, L = layout_.local_world, host = layout_.host, me = layout_.rank();
  const uint64_t slot = round16(b.bytes(0));
  auto* data = static_cast<char*>(local_.memory().data());
  const auto* src = static_cast<const char*>(in);
  auto* dst = static_cast<char*>(out);
  k::CollectiveArgs local;
  local.op = op;
  local.dtype = dtype;
  if (op == k::CommOp::kAllToAll) {
    const size_t mine = b.bytes(me);  // every block this rank receives has its size
    const uint64_t lane = static_cast<uint64_t>(H) * b.bytes(0);
    const uint64_t send_slot = round16(static_cast<uint64_t>(b.largest_host()) * b.esize);
    char* send = work;
    char* recv = send + H * send_slot;
    char* gathered = recv + H * send_slot;
    std::vector<k::CopySegment> group, lanes, order;
    std::vector<void*> sends(H), recvs(H);
    std::vector<int64_t> send_counts(H), recv_counts(H, b.host_count(host));
    for (int h = 0; h < H; ++h) {
      sends[h] = send + h * send_slot;
      send_counts[h] = b.host_count(h);
      recvs[h] = h == host ? sends[h] : recv + h * send_slot;
      for (int l = 0; l < L; ++l) {
        const int p = layout_.host_ranks[h][l];
        group.push_back({src + b.offset(p), send + h * send_slot + b.in_host(h, l), b.bytes(p)});
      }
    }
    copy_segments(group, s);
    link_->all_to_all(sends, send_counts, recvs, recv_counts, dtype, s);
    gate(s);
    for (int l = 0; l < L; ++l) {  // lane l: for local rank l of this host
      const int p = layout_.host_ranks[host][l];
      for (int h = 0; h < H; ++h) {
        lanes.push_back({static_cast<char*>(recvs[h]) + b.in_host(host, l), data + l * lane + h * b.bytes(p),
                         b.bytes(p)});
      }
    }
    copy_segments(lanes, s);
    local.count = static_cast<int64_t>(L * lane / b.esize);
    local.output = gathered;
    local_.enqueue(local, nullptr, 0, s);
    for (int l = 0; l < L; ++l) {
      for (int h = 0; h < H; ++h) {
        const int q = layout_.host_ranks[h][l];
        order.push_back({gathered + l * lane + h * mine, dst + static_cast<size_t>(q) * mine, mine});
      }
    }
    copy_segments(order, s);
    return;
  }
  const bool gather = op == k::CommOp::kAllGather;
  std::vector<void*> slots(H);
  std::vector<int64_t> counts(H);
  for (int h = 0; h < H; ++h) {
    slots[h] = (gather ? data : work) + h * slot;
    counts[h] = b.n(layout_.counterparts[h]);
  }
  if (gather) {
    copy_segments({{in, slots[host], std::min<uint64_t>(in_bytes, b.bytes(me))}}, s);
    link_->all_gather(slots, counts, dtype, s);
    gate(s);
    for (int h = 0; h < H; ++h) {
      const std::vector<int>& ranks = layout_.host_ranks[h];
      local.count = b.host_count(h);
      local.in_offset = h * slot;
      local.output = b.consecutive(h) ? dst + b.offset(ranks.front()) : work;
      local_.enqueue(local, nullptr, 0, s);
      if (!b.consecutive(h)) {
        std::vector<k::CopySegment> blocks;
        for (int l = 0; l < L; ++l)
          blocks.push_back({work + b.in_host(h, l), dst + b.offset(ranks[l]), b.bytes(ranks[l])});
        copy_segments(blocks, s);
      }
    }
  } else {
    for (int h = 0; h < H; ++h) {
      const std::vector<int>& ranks = layout_.host_ranks[h];
      local.count = b.host_count(h);
      local.output = slots[h];
      if (b.consecutive(h)) {
        copy_segments({{src + b.offset(ranks.front()), data, static_cast<uint64_t>(local.count) * b.esize}},
                      s);
      } else {
        std::vector<k::CopySegment> blocks;
        for (int l = 0; l < L; ++l)
          blocks.push_back({src + b.offset(ranks[l]), data + b.in_host(h, l), b.bytes(ranks[l])});
        copy_segments(blocks, s);
      }
      local_.enqueue(local, nullptr, 0, s);
    }
    link_->reduce_scatter(slots, counts, out, dtype, s);
    gate(s);
  }
}

// The workspace: the gathered A when the caller asks for none, then (W not dividing M) the
// padded blocks, then the hierarchical allGather's own.
CrossHostPaths::Needs CrossHostPaths::all_gather_gemm_needs(int64_t m, int64_t k, bool gathered_given) const {
  const RowBlocks rb{m, layout_.world()};
  const uint64_t row = static_cast<uint64_t>(k) * 2;
  const int64_t count = rb.count(k);
  const Needs need = collective_needs(k::CommOp::kAllGather, 2, count);
  const uint64_t own_g = gathered_given ? 0 : round16(m * row);
  const uint64_t padded = rb.even() ? 0 : round16(count * 2);
  return {need.data_bytes, own_g + padded + need.work_bytes};
}

k::FusedHosts CrossHostPaths::fused_hosts() const {
  k::FusedHosts hosts{layout_.world(), layout_.rank(), layout_.host, {}};
  for (int h = 0; h < layout_.hosts; ++h) hosts.rank_of_host[h] = layout_.counterparts[h];
  return hosts;
}

bool CrossHostPaths::gemm_reduce_scatter_fused(int64_t m, int64_t n) const {
  if (!fused_ || layout_.local_world != 1) return false;
  k::GemmRsArgs args;
  args.M = static_cast<int>(m);
  args.N = static_cast<int>(n);
  args.K = 8;  // any valid K_r: the fit depends on M and N only
  return k::gemm_reduce_scatter_hosts_fits(args, layout_.world());
}

bool CrossHostPaths::all_gather_gemm_fused(int64_t m, int64_t n_local, int64_t k) const {
  if (!fused_ || layout_.local_world != 1) return false;
  k::AgGemmArgs args;
  args.M = static_cast<int>(m);
  args.N = static_cast<int>(n_local);
  args.K = static_cast<int>(k);
  k::ProxyCollective px{};
  px.chunk_bytes = link_->chunk_bytes();
  return k::all_gather_gemm_hosts_fits(args, layout_.world(), px);
}

void CrossHostPaths::all_gather_gemm(const void* a_local, const void* w, void* c, void* gathered, int64_t m,
                                     int64_t n_local, int64_t k, WeightLayout layout, char* work,
                                     k::GemmWorkspace gemm_ws, cudaStream_t s) {
  if (all_gather_gemm_fused(m, n_local, k) && (reinterpret_cast<uintptr_t>(a_local) & 15) == 0) {
    k::AgGemmArgs args;
    args.M = static_cast<int>(m);
    args.N = static_cast<int>(n_local);
    args.K = static_cast<int>(k);
    args.B = static_cast<const __nv_bfloat16*>(w);
    args.b_layout = layout == WeightLayout::kNK ? k::GemmLayoutB::kNK : k::GemmLayoutB::kKN;
    args.C = static_cast<__nv_bfloat16*>(c);
    args.gathered = static_cast<__nv_bfloat16*>(gathered != nullptr ? gathered : static_cast<void*>(work));
    k::ProxyCollective px{};
    link_->prepare(px, k::CommDtype::kBF16);
    check_fused_launch(
        k::launch_all_gather_gemm_hosts(local_.memory().device(), fused_hosts(), a_local, args, px, s),
        "allGatherGemm");
    gate(s);
    return;
  }
  const int W = layout_.world(), r = layout_.rank();
  const RowBlocks rb{m, W};
  const uint64_t row = static_cast<uint64_t>(k) * 2;
  const int64_t count = rb.count(k);
  const uint64_t own_g = gathered == nullptr ? round16(m * row) : 0;
  const uint64_t padded = rb.even() ? 0 : round16(count * 2);
  char* full = gathered != nullptr ? static_cast<char*>(gathered) : work;
  char* blocks = rb.even() ? full : work + own_g;
  enqueue_collective(k::CommOp::kAllGather, k::CommDtype::kBF16, a_local, rb.rows(r) * row, blocks, count,
                     work + own_g + padded, s);
  if (!rb.even()) {
    std::vector<k::CopySegment> unpack;
    for (int p = 0; p < W; ++p)
      unpack.push_back({blocks + p * rb.ceil() * row, full + rb.first(p) * row, rb.rows(p) * row});
    copy_segments(unpack, s);
  }
  launch_dense_gemm(full, w, c, m, n_local, k, layout, k::GemmOutType::kBF16, gemm_ws, "allGatherGemm", s);
}

// The workspace: the partial product, then (W not dividing M) its padded blocks, then (unless
// bf16 sums land in the output as they are) this rank's block of sums, then the hierarchical
// reduceScatter's own.
CrossHostPaths::Needs CrossHostPaths::gemm_reduce_scatter_needs(int64_t m, int64_t n,
                                                                PartialPrecision partials) const {
  const RowBlocks rb{m, layout_.world()};
  const bool bf16 = partials == PartialPrecision::kBF16;
  const uint64_t pes = bf16 ? 2 : 4, row = static_cast<uint64_t>(n) * pes;
  const int64_t count = rb.count(n);
  const Needs need = collective_needs(k::CommOp::kReduceScatter, pes, count);
  const bool direct = bf16 && rb.even();
  const uint64_t product = round16(m * row), padded = rb.even() ? 0 : round16(count * pes);
  const uint64_t mine = direct ? 0 : round16(rb.ceil() * row);
  return {need.data_bytes, product + padded + mine + need.work_bytes};
}

void CrossHostPaths::gemm_reduce_scatter(const void* a, const void* w, void* out, int64_t m, int64_t n,
                                         int64_t k_local, WeightLayout layout, PartialPrecision partials,
                                         char* work, k::GemmWorkspace gemm_ws, cudaStream_t s) {
  const int W = layout_.world(), r = layout_.rank();
  const RowBlocks rb{m, W};
  const bool bf16 = partials == PartialPrecision::kBF16;
  const k::CommDtype pd = bf16 ? k::CommDtype::kBF16 : k::CommDtype::kF32;
  const uint64_t pes = bf16 ? 2 : 4, row = static_cast<uint64_t>(n) * pes;
  const int64_t count = rb.count(n);
  const bool direct = bf16 && rb.even();  // the sums land in `out` as they are
  const uint64_t product = round16(m * row), padded = rb.even() ? 0 : round16(count * pes);
  const uint64_t mine = direct ? 0 : round16(rb.ceil() * row);
  if (gemm_reduce_scatter_fused(m, n) && (reinterpret_cast<uintptr_t>(a) & 15) == 0 &&
      (reinterpret_cast<uintptr_t>(w) & 15) == 0 && (reinterpret_cast<uintptr_t>(out) & 15) == 0) {
    k::GemmRsArgs args;
    args.M = static_cast<int>(m);
    args.N = static_cast<int>(n);
    args.K = static_cast<int>(k_local);
    args.A = static_cast<const __nv_bfloat16*>(a);
    args.B = static_cast<const __nv_bfloat16*>(w);
    args.b_layout = layout == WeightLayout::kNK ? k::GemmLayoutB::kNK : k::GemmLayoutB::kKN;
    args.partials = bf16 ? k::RsPartials::kBF16 : k::RsPartials::kF32;
    char* sums = bf16 ? static_cast<char*>(out) : work + product;
    k::ProxyCollective px{};
    link_->prepare(px, pd);
    check_fused_launch(
        k::launch_gemm_reduce_scatter_hosts(local_.memory().device(), fused_hosts(), args, work, sums, px, s),
        "gemmReduceScatter");
    gate(s);
    if (!bf16) {
      check_cuda(k::launch_narrow_to_bf16(reinterpret_cast<const float*>(sums), out, rb.rows(r) * n, s),
                 "gemmReduceScatter: rounding the sums");
    }
    return;
  }
  char* blocks = rb.even() ? work : work + product;
  char* sums = direct ? static_cast<char*>(out) : work + product + padded;
  const k::GemmOutType c_type = bf16 ? k::GemmOutType::kBF16 : k::GemmOutType::kF32;
  launch_dense_gemm(a, w, work, m, n, k_local, layout, c_type, gemm_ws, "gemmReduceScatter", s);
  if (!rb.even()) {
    std::vector<k::CopySegment> pack;
    for (int p = 0; p < W; ++p)
      pack.push_back({work + rb.first(p) * row, blocks + p * rb.ceil() * row, rb.rows(p) * row});
    copy_segments(pack, s);
  }
  enqueue_collective(k::CommOp::kReduceScatter, pd, blocks, UINT64_MAX, sums, count,
                     work + product + padded + mine, s);
  if (!bf16) {
    check_cuda(k::launch_narrow_to_bf16(reinterpret_cast<const float*>(sums), out, rb.rows(r) * n, s),
               "gemmReduceScatter: rounding the sums");
  } else if (!direct) {
    copy_segments({{sums, out, rb.rows(r) * row}}, s);
  }
}

// Below this many bytes of bf16 product the reduceScatter and allGather between hosts (two
// proxy steps) cost more than the allReduce's one, and more than the kernel saves by hiding the
// GEMM: 2 virtual hosts x 1 H200 over TCP at the default chunk, gemmReduceScatter's kernel then the
// allGather took 1.40-1.47 x the time of our GEMM then our allReduce at 1 MiB and 1.15-1.21 x at
// 2 MiB, 0.72-0.88 x at 4 MiB and 0.71-0.83 x from 8 MiB (docs/performance.md).
constexpr uint64_t kArFusedMinBytes = uint64_t{4} << 20;

bool CrossHostPaths::gemm_all_reduce_fused(int64_t m, int64_t n) const {
  return static_cast<uint64_t>(m) * static_cast<uint64_t>(n) * 2 >= kArFusedMinBytes &&
         gemm_reduce_scatter_fused(m, n);
}

// The workspace: (W not dividing M) the W padded blocks that the allGather moves, then the
// larger of gemmReduceScatter's and the allGather's own (one runs after the other on the stream).
CrossHostPaths::Needs CrossHostPaths::gemm_all_reduce_needs(int64_t m, int64_t n, PartialPrecision partials) const {
  const RowBlocks rb{m, layout_.world()};
  const Needs rs = gemm_reduce_scatter_needs(m, n, partials);
  const Needs ag = collective_needs(k::CommOp::kAllGather, 2, rb.count(n));
  const uint64_t padded = rb.even() ? 0 : round16(rb.count(n) * 2);
  return {std::max(rs.data_bytes, ag.data_bytes), padded + std::max(rs.work_bytes, ag.work_bytes)};
}

void CrossHostPaths::gemm_all_reduce(const void* a, const void* w, void* c, int64_t m, int64_t n, int64_t k_local,
                                     WeightLayout layout, PartialPrecision partials, char* work,
                                     k::GemmWorkspace gemm_ws, cudaStream_t s) {
  const int W = layout_.world(), r = layout_.rank();
  const RowBlocks rb{m, W};
  const uint64_t row = static_cast<uint64_t>(n) * 2;
  const uint64_t padded = rb.even() ? 0 : round16(rb.count(n) * 2);
  // Even blocks are C's own rows: this rank's sums land in place and the allGather fills the rest.
  char* blocks = rb.even() ? static_cast<char*>(c) : work;
  char* mine = blocks + (rb.even() ? rb.first(r) : r * rb.ceil()) * row;
  gemm_reduce_scatter(a, w, mine, m, n, k_local, layout, partials, work + padded, gemm_ws, s);
  enqueue_collective(k::CommOp::kAllGather, k::CommDtype::kBF16, mine, rb.rows(r) * row, blocks, rb.count(n),
                     work + padded, s);
  if (!rb.even()) {
    std::vector<k::CopySegment> unpack;
    for (int p = 0; p < W; ++p)
      unpack.push_back({blocks + p * rb.ceil() * row, static_cast<char*>(c) + rb.first(p) * row, rb.rows(p) * row});
    copy_segments(unpack, s);
  }
}

void CrossHostPaths::gate(cudaStream_t s) {
  check_fused_launch(
      k::launch_comm_fail_if(local_.memory().device(), link_->status_device(), k::kCommHostsFailed, s),
      "a step between hosts");
}

void CrossHostPaths::raise_if_failed() { link_->raise_if_failed(); }
bool CrossHostPaths::failed() const { return link_->failed(); }
void CrossHostPaths::abort() noexcept { link_->abort(); }
void CrossHostPaths::close(bool drain) noexcept { link_->close(drain); }

}  // namespace fusedcomm
