#include "fusedcomm/runtime/device_comm.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>

#include "kernels/collectives/copy_segments.h"
#include "kernels/ag_gemm/ag_gemm.h"
#include "kernels/gemm_ar/gemm_ar.h"
#include "kernels/gemm_rs/gemm_rs.h"
#include "fusedcomm/runtime/device_gemm.h"
#include "fusedcomm/runtime/errors.h"
#include "fusedcomm/runtime/split.h"

namespace fusedcomm {
namespace {

namespace k = fusedcomm::kernels;

void check(cudaError_t e, const std::string& what) {
  if (e != cudaSuccess) {
    cudaGetLastError();
    fail(ErrorKind::kFatalGpu, what + " failed (" + cudaGetErrorName(e) + ": " +
                                   cudaGetErrorString(e) + ")");
  }
}

size_t element_bytes(k::CommDtype d) { return d == k::CommDtype::kF32 ? 4 : 2; }

}  // namespace

DeviceComm::DeviceComm(Runtime& runtime, int rank, int world) : runtime_(runtime) {
  if (runtime.backend() != Backend::kCuda) {
    fail(ErrorKind::kState, "a device communicator needs the cuda backend");
  }
  pin_gpu(runtime.gpu().ordinal);
  // Pooled regions are staged for kCommMaxRanks: enough for one host's ranks, which is what
  // shares the region when the world (across hosts) is larger.
  sm_ = std::make_unique<SymmetricMemory>(rank, world, runtime.acquire_region(std::min(world, k::kCommMaxRanks)));
  try {
    // Blocking (not cudaStreamNonBlocking): callers fill tensors with plain cudaMemcpy (JCuda)
    // on the legacy default stream; see device_comm.h.
    check(cudaStreamCreateWithFlags(&own_, cudaStreamDefault), "cudaStreamCreate");
    check(cudaEventCreateWithFlags(&last_done_, cudaEventDisableTiming), "cudaEventCreate");
  } catch (...) {
    close();
    throw;
  }
}

DeviceComm::~DeviceComm() { close(); }

std::vector<uint8_t> DeviceComm::export_handle() const { return sm_->export_handle(); }

void DeviceComm::connect(const std::vector<std::vector<uint8_t>>& blobs, const std::vector<int>& host_of,
                         Communicator& host_comm, uint64_t comm_id) {
  FC_REQUIRE(static_cast<int>(host_of.size()) == host_comm.world(),
             "connect: " + std::to_string(host_of.size()) + " host ids for world " + std::to_string(host_comm.world()));
  pin_gpu(runtime_.gpu().ordinal);
  layout_ = make_host_layout(host_of, host_comm.rank());
  if (layout_.hosts > 1) sm_->restrict_to(layout_.members());
  sm_->connect(blobs);
  if (layout_.hosts > 1) connect_hosts(host_comm, comm_id);
  connected_ = true;
}

// The counterparts' link blobs travel as one exchange of the host communicator (every rank
// sends its blob to every rank; each keeps its counterparts').
void DeviceComm::connect_hosts(Communicator& host_comm, uint64_t comm_id) {
  link_ = std::make_unique<InterHostLink>(runtime_, layout_.host, layout_.hosts,
                                          InterHostLink::chunk_bytes_for(runtime_.config()),
                                          runtime_.config().transport_streams);
  const InterHostLink::Blob mine = link_->blob();
  const int world = host_comm.world();
  std::vector<InterHostLink::Blob> all(world);
  std::vector<SendBlock> send(world, SendBlock{&mine, sizeof mine});
  std::vector<RecvBlock> recv(world);
  for (int r = 0; r < world; ++r) recv[r] = RecvBlock{&all[r], sizeof all[r]};
  host_comm.begin_op("connect the cuda backend between hosts", 0x63756461686f7374ull);  // "cudahost"
  host_comm.exchange(send, recv, "inter-host link blobs");
  std::vector<InterHostLink::Blob> peers;
  std::vector<std::string> names;
  for (int h = 0; h < layout_.hosts; ++h) {
    const int r = layout_.counterparts[h];
    peers.push_back(all[r]);
    names.push_back("rank " + std::to_string(r) + " (host " + std::to_string(h) + ")");
  }
  // One group per local rank: an id of its own, distinct from the host communicator's.
  const uint64_t group_id = (comm_id ^ 0x696e746572686f73ull) * 0x9E3779B97F4A7C15ull + layout_.local_rank + 1;
  link_->connect(peers, names, group_id);
}

void DeviceComm::check_usable() const {
  if (closed_) fail(ErrorKind::kState, "the device communicator is closed");
  if (!connected_) fail(ErrorKind::kState, "the device communicator is not connected");
  if (failed_) {
    fail(ErrorKind::kCommunicator,
         "the device communicator failed earlier (see the first error); close it and build a new one");
  }
}

// Kernels on one CommDevice must not overlap (collectives.h): an op on a new stream waits for
// the previous op's stream. Costs nothing while the caller keeps to one stream.
void DeviceComm::join_previous(cudaStream_t s) {
  if (any_op_ && s != last_) check(cudaStreamWaitEvent(s, last_done_, 0), "cudaStreamWaitEvent");
}

// A one-shot launch reads its input where it lies (CollectiveArgs::input: no peer reads the data
// area then), unless the input overlaps the output; every other launch reads it from the data
// area, copied there first. Skipping the copy took a synchronous 4 KiB allReduce from 16.9 to
// 12.8 us on one H200 (kernels/bench/NOTES.md, "Small collectives through the runtime").
void DeviceComm::enqueue(const k::CollectiveArgs& args, const void* in, size_t in_bytes,
                         cudaStream_t s) {
  k::CollectiveArgs a = args;
  a.algo = k::collective_choose_algo(sm_->device(), a);  // decided once; the launch keeps it
  if (in_bytes > 0) {
    const auto* lo = static_cast<const char*>(in);
    const auto* out = static_cast<const char*>(a.output);
    const size_t out_bytes = static_cast<size_t>(k::collective_output_count(
                                 a.op, a.count, sm_->world(), sm_->rank())) *
                             (a.out_bf16 ? 2 : element_bytes(a.dtype));
    const bool overlaps = out != nullptr && lo < out + out_bytes && out < lo + in_bytes;
    // An element-misaligned input (which the byte copy used to hide) is copied too.
    const bool aligned = reinterpret_cast<uintptr_t>(in) % element_bytes(a.dtype) == 0;
    if (!overlaps && aligned && a.algo == k::CommAlgo::kOneShot) {
      a.input = in;
    } else {
      check(cudaMemcpyAsync(sm_->data(), in, in_bytes, cudaMemcpyDeviceToDevice, s),
            "copying the input into symmetric memory");
      ++input_copies_;
    }
  }
  const cudaError_t e = k::launch_collective(sm_->device(), a, s);
  if (e == cudaErrorInvalidValue) {
    cudaGetLastError();
    fail(ErrorKind::kInvalidArgument,
         std::string(k::comm_op_name(static_cast<uint32_t>(args.op))) + ": the kernel refused the arguments");
  }
  check(e, std::string("launching ") + k::comm_op_name(static_cast<uint32_t>(args.op)));
}

cudaStream_t DeviceComm::begin(cudaStream_t stream) {
  check_usable();
  pin_gpu(runtime_.gpu().ordinal);
  raise_device_failure();  // an earlier asynchronous op's failure surfaces here
  cudaStream_t s = stream == nullptr ? own_ : stream;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  check(cudaStreamIsCapturing(s, &status), "cudaStreamIsCapturing");
  FC_REQUIRE(status != cudaStreamCaptureStatusInvalidated,
             "the stream's CUDA graph capture was invalidated by an earlier call; end it and capture again");
  capturing_ = status == cudaStreamCaptureStatusActive;
  // A captured op runs when its graph is launched; the order against earlier ops is the
  // graph launch's stream order (the header's contract), not an event of this communicator.
  if (!capturing_) join_previous(s);
  return s;
}

void DeviceComm::end(cudaStream_t s, bool sync) {
  if (capturing_) return;  // nothing ran: the previous op stays the one to order after
  check(cudaEventRecord(last_done_, s), "cudaEventRecord");
  last_ = s;
  any_op_ = true;
  if (sync) {
    check(cudaStreamSynchronize(s), "waiting for the op");
    raise_device_failure();
  }
}

std::string DeviceComm::shortfall(uint64_t bytes) const {
  return "needs " + std::to_string(bytes) + " bytes of symmetric memory, more than its " +
         std::to_string(sm_->data_bytes()) + "-byte data area";
}

void DeviceComm::require_fits(const char* op, uint64_t bytes) const {
  if (bytes > sm_->data_bytes()) {
    fail(ErrorKind::kInvalidArgument,
         std::string(op) + " " + shortfall(bytes) + "; raise spark.fusedcomm.cuda.symmetricBytes");
  }
}

void DeviceComm::collective(k::CommOp op, k::CommDtype dtype, const void* in, void* out,
                            int64_t count, cudaStream_t stream) {
  FC_REQUIRE(count >= 0, "negative element count");
  check_usable();
  if (op == k::CommOp::kAllReduce) {
    cudaStream_t s = begin(stream);
    enqueue_all_reduce(dtype, in, out, count, s);
    end(s, stream == nullptr);
    return;
  }
  if (link_ != nullptr) {
    const HostsNeeds need = needs_across_hosts(op, element_bytes(dtype), count);
    require_fits(k::comm_op_name(static_cast<uint32_t>(op)), need.data_bytes);
    cudaStream_t s = begin(stream);
    char* work = static_cast<char*>(workspace(need.work_bytes));
    enqueue_across_hosts(op, dtype, in, UINT64_MAX, out, count, work, s);
    end(s, stream == nullptr);
    return;
  }
  const int world = sm_->world(), rank = sm_->rank();
  const size_t esize = element_bytes(dtype);
  // The largest input of any rank decides, so that every rank takes the same branch.
  require_fits(k::comm_op_name(static_cast<uint32_t>(op)),
               static_cast<uint64_t>(k::collective_input_count(op, count, world, 0)) * esize);
  cudaStream_t s = begin(stream);
  k::CollectiveArgs args;
  args.op = op;
  args.dtype = dtype;
  args.count = count;
  args.output = out;
  enqueue(args, in, static_cast<size_t>(k::collective_input_count(op, count, world, rank)) * esize, s);
  end(s, stream == nullptr);
}

// allReduce is element-wise: pieces of the data area's size (16-byte multiples) are
// independent ops.
void DeviceComm::enqueue_all_reduce(k::CommDtype dtype, const void* in, void* out, int64_t count,
                                    cudaStream_t s) {
  const size_t esize = element_bytes(dtype);
  const uint64_t capacity = sm_->data_bytes();
  const auto* src = static_cast<const char*>(in);
  auto* dst = static_cast<char*>(out);
  k::CollectiveArgs args;
  args.op = k::CommOp::kAllReduce;
  args.dtype = dtype;
  if (link_ == nullptr && static_cast<uint64_t>(count) * esize <= capacity) {
    args.count = count;
    args.output = out;
    enqueue(args, in, static_cast<size_t>(count) * esize, s);
    return;
  }
  const int64_t piece = static_cast<int64_t>(capacity / esize) / 8 * 8;
  for (int64_t done = 0; done < count; done += piece) {
    const int64_t n = std::min(piece, count - done);
    if (link_ != nullptr) {
      all_reduce_across_hosts(dtype, src + done * esize, dst + done * esize, n, s);
    } else {
      args.count = n;
      args.output = dst + done * esize;
      enqueue(args, src + done * esize, n * esize, s);
    }
  }
}

// reduceScatter inside the host into this rank's block of `out`, the block's allReduce between
// hosts in place, allGather inside the host from the block. `in` may alias `out`: a step whose
// input overlaps its output has it copied into the data area first (enqueue).
void DeviceComm::all_reduce_across_hosts(k::CommDtype dtype, const char* in, char* out, int64_t n,
                                         cudaStream_t s) {
  const size_t esize = element_bytes(dtype);
  const int L = sm_->world(), l = sm_->rank();
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
  enqueue(step(k::CommOp::kReduceScatter, block), in, static_cast<size_t>(n) * esize, s);
  link_->all_reduce(block, mine, dtype, s);
  enqueue(step(k::CommOp::kAllGather, out), block, static_cast<size_t>(mine) * esize, s);
}

namespace {

// A byte size rounded up to 16, so that buffers laid end to end stay vector-aligned.
uint64_t round16(uint64_t bytes) { return (bytes + 15) / 16 * 16; }

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

}  // namespace

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
DeviceComm::HostsNeeds DeviceComm::needs_across_hosts(k::CommOp op, size_t esize, int64_t count) const {
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

void DeviceComm::enqueue_across_hosts(k::CommOp op, k::CommDtype dtype, const void* in, uint64_t in_bytes,
                                      void* out, int64_t count, char* work, cudaStream_t s) {
  const GlobalBlocks b{layout_, count, element_bytes(dtype)};
  const int H = layout_.hosts, L = layout_.local_world, host = layout_.host, me = layout_.rank();
  const uint64_t slot = round16(b.bytes(0));
  auto* data = static_cast<char*>(sm_->data());
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
    for (int l = 0; l < L; ++l) {  // lane l: for local rank l of this host
      const int p = layout_.host_ranks[host][l];
      for (int h = 0; h < H; ++h) {
        lanes.push_back({static_cast<char*>(recvs[h]) + b.in_host(host, l), data + l * lane + h * b.bytes(p), b.bytes(p)});
      }
    }
    copy_segments(lanes, s);
    local.count = static_cast<int64_t>(L * lane / b.esize);
    local.output = gathered;
    enqueue(local, nullptr, 0, s);
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
    for (int h = 0; h < H; ++h) {
      const std::vector<int>& ranks = layout_.host_ranks[h];
      local.count = b.host_count(h);
      local.in_offset = h * slot;
      local.output = b.consecutive(h) ? dst + b.offset(ranks.front()) : work;
      enqueue(local, nullptr, 0, s);
      if (!b.consecutive(h)) {
        std::vector<k::CopySegment> blocks;
        for (int l = 0; l < L; ++l) blocks.push_back({work + b.in_host(h, l), dst + b.offset(ranks[l]), b.bytes(ranks[l])});
        copy_segments(blocks, s);
      }
    }
  } else {
    for (int h = 0; h < H; ++h) {
      const std::vector<int>& ranks = layout_.host_ranks[h];
      local.count = b.host_count(h);
      local.output = slots[h];
      if (b.consecutive(h)) {
        copy_segments({{src + b.offset(ranks.front()), data, static_cast<uint64_t>(local.count) * b.esize}}, s);
      } else {
        std::vector<k::CopySegment> blocks;
        for (int l = 0; l < L; ++l) blocks.push_back({src + b.offset(ranks[l]), data + b.in_host(h, l), b.bytes(ranks[l])});
        copy_segments(blocks, s);
      }
      enqueue(local, nullptr, 0, s);
    }
    link_->reduce_scatter(slots, counts, out, dtype, s);
  }
}

void DeviceComm::copy_segments(const std::vector<k::CopySegment>& segments, cudaStream_t s) {
  k::CopySegments c;
  for (const k::CopySegment& seg : segments) {
    if (!c.add(seg.src, seg.dst, seg.bytes)) {
      check(k::launch_copy_segments(c, s), "rearranging blocks");
      c = k::CopySegments{};
      c.add(seg.src, seg.dst, seg.bytes);
    }
  }
  check(k::launch_copy_segments(c, s), "rearranging blocks");
}

// Grows (never shrinks) this communicator's private device buffer. Growing waits for the
// previous op, which may still use the old buffer; the caller has not enqueued anything of its
// op yet.
void* DeviceComm::workspace(uint64_t bytes) {
  if (bytes <= work_bytes_) return work_;
  if (capturing_) {
    // Growing frees and allocates, which a capture forbids (and a replay could not see).
    fail(ErrorKind::kInvalidArgument,
         "this op needs " + std::to_string(bytes) + " bytes of the communicator's workspace, more than the " +
             std::to_string(work_bytes_) + " it has, and the stream is capturing a CUDA graph: run the op "
             "(or a larger one of its kind) once before the capture; the workspace only grows");
  }
  if (any_op_) check(cudaEventSynchronize(last_done_), "waiting for the previous op");
  if (work_ != nullptr) check(cudaFree(work_), "cudaFree (workspace)");
  work_ = nullptr;
  work_bytes_ = 0;
  check(cudaMalloc(&work_, bytes), "cudaMalloc of the workspace (" + std::to_string(bytes) + " bytes)");
  work_bytes_ = bytes;
  return work_;
}

namespace {
// The operands that gemmReduceScatter's and gemmAllReduce's kernel arguments (k::GemmRsArgs,
// k::GemmArArgs) share; kAuto, the workspace at the data area's start.
template <typename Args>
Args gemm_reduce_operands(const void* a, const void* w, int64_t m, int64_t n, int64_t k_local, int layout,
                          int partials) {
  Args args;
  args.M = static_cast<int>(m);
  args.N = static_cast<int>(n);
  args.K = static_cast<int>(k_local);
  args.A = static_cast<const __nv_bfloat16*>(a);
  args.B = static_cast<const __nv_bfloat16*>(w);
  args.b_layout = layout == 0 ? k::GemmLayoutB::kNK : k::GemmLayoutB::kKN;
  args.ws_offset = 0;
  args.partials = static_cast<k::RsPartials>(partials);  // the same codes
  return args;
}

// The shapes and partial precision that gemmReduceScatter and gemmAllReduce accept on the GPU.
void require_gemm_reduce_args(const char* op, int64_t m, int64_t n, int64_t k_local, int partials) {
  FC_REQUIRE(partials >= 0 && partials <= 2,
             std::string(op) + ": unknown partial precision " + std::to_string(partials));
  FC_REQUIRE(m >= 1 && n >= 8 && k_local >= 8 && n % 8 == 0 && k_local % 8 == 0 && m < (1ll << 31) &&
                 n < (1ll << 31) && k_local < (1ll << 31),
             std::string(op) + " on the GPU: M >= 1, N and K_r multiples of 8 (got M=" + std::to_string(m) +
                 ", N=" + std::to_string(n) + ", K_r=" + std::to_string(k_local) + ")");
}

// The shapes that allGatherGemm accepts on the GPU.
void require_ag_args(int64_t m, int64_t n_local, int64_t k) {
  FC_REQUIRE(m >= 1 && n_local >= 8 && k >= 8 && n_local % 8 == 0 && k % 8 == 0 && m < (1ll << 31) &&
                 n_local < (1ll << 31) && k < (1ll << 31),
             "allGatherGemm on the GPU: M >= 1, N_r and K multiples of 8 (got M=" + std::to_string(m) +
                 ", N_r=" + std::to_string(n_local) + ", K=" + std::to_string(k) + ")");
}

const char* partials_name(k::RsPartials p) {
  switch (p) {
    case k::RsPartials::kBF16: return "bf16";
    case k::RsPartials::kF32AnyOrder: return "fp32, summed in any order";
    default: return "fp32";
  }
}

void check_fused_launch(cudaError_t e, const char* op) {
  if (e == cudaErrorInvalidValue) {
    cudaGetLastError();
    fail(ErrorKind::kInvalidArgument, std::string(op) + ": the kernel refused the arguments (shapes: M >= 1, "
                                                        "N and K multiples of 8)");
  }
  check(e, std::string("launching ") + op);
}
}  // namespace

bool DeviceComm::peers_on_other_gpus() const {
  const std::vector<PeerLink>& peers = sm_->peers();  // by local rank, this rank's own included
  const int me = sm_->rank();
  if (me < 0 || me >= static_cast<int>(peers.size())) return false;
  for (int p = 0; p < static_cast<int>(peers.size()); ++p) {
    if (p != me && peers[p].pci_bus_id == peers[me].pci_bus_id) return false;
  }
  return true;
}

k::AgGemmArgs DeviceComm::ag_operands(const void* w, void* c, void* gathered, int64_t m, int64_t n_local,
                                      int64_t k, int layout) const {
  k::AgGemmArgs args;
  args.M = static_cast<int>(m);
  args.N = static_cast<int>(n_local);
  args.K = static_cast<int>(k);
  args.in_offset = 0;
  args.B = static_cast<const __nv_bfloat16*>(w);
  args.b_layout = layout == 0 ? k::GemmLayoutB::kNK : k::GemmLayoutB::kKN;
  args.C = static_cast<__nv_bfloat16*>(c);
  args.gathered = static_cast<__nv_bfloat16*>(gathered);
  // kAuto may move the exchange with the copy engines, which need every peer on another GPU
  // (kernels/fused.h FusedSideStreams; the tests' shared-GPU mode has them all on one).
  args.side = peers_on_other_gpus() ? ag_side_.get() : nullptr;
  return args;
}

void DeviceComm::all_gather_gemm(const void* a_local, const void* w, void* c, void* gathered,
                                 int64_t m, int64_t n_local, int64_t k, int layout,
                                 cudaStream_t stream) {
  check_usable();
  require_ag_args(m, n_local, k);
  if (link_ != nullptr) {
    all_gather_gemm_across_hosts(a_local, w, c, gathered, m, n_local, k, layout, stream);
    return;
  }
  k::AgGemmArgs args = ag_operands(w, c, gathered, m, n_local, k, layout);
  const k::FusedWorkspace ws = k::all_gather_gemm_workspace(args, sm_->world());
  require_fits("allGatherGemm", std::max(ws.data_bytes, ws.scratch_bytes));
  cudaStream_t s = begin(stream);
  args.gemm_ws = gemm_workspace(s);
  const int64_t rows = static_cast<int64_t>(split_count(m, sm_->world(), sm_->rank()));
  if (rows > 0) {
    check(cudaMemcpyAsync(sm_->data(), a_local, static_cast<size_t>(rows * k * 2), cudaMemcpyDeviceToDevice, s),
          "copying A into symmetric memory");
  }
  check_fused_launch(k::launch_all_gather_gemm(sm_->device(), args, s), "allGatherGemm");
  end(s, stream == nullptr);
}

void DeviceComm::gemm_reduce_scatter(const void* a, const void* w, void* out, int64_t m, int64_t n,
                                     int64_t k_local, int layout, int partials,
                                     cudaStream_t stream) {
  check_usable();
  require_gemm_reduce_args("gemmReduceScatter", m, n, k_local, partials);
  if (link_ != nullptr) {
    gemm_reduce_scatter_across_hosts(a, w, out, m, n, k_local, layout, partials, stream);
    return;
  }
  k::GemmRsArgs args = gemm_reduce_operands<k::GemmRsArgs>(a, w, m, n, k_local, layout, partials);
  args.out = static_cast<__nv_bfloat16*>(out);
  const k::FusedWorkspace ws = k::gemm_reduce_scatter_workspace(args, sm_->world());
  require_fits("gemmReduceScatter", std::max(ws.data_bytes, ws.scratch_bytes));
  cudaStream_t s = begin(stream);
  args.gemm_ws = gemm_workspace(s);
  check_fused_launch(k::launch_gemm_reduce_scatter(sm_->device(), args, s), "gemmReduceScatter");
  end(s, stream == nullptr);
}

// On one host, where the kernels' gemmAllReduce fits the data area (kernels/fused.h: the fused
// gemmReduceScatter then an allGather, or our GEMM into the data area then our allReduce,
// chosen by kAuto from rank-uniform values). Otherwise (across hosts, or a product larger than
// the data area) our GEMM, then our allReduce, in pieces where needed and hierarchical across
// hosts: bf16 partials: the GEMM rounds each rank's product into c and the allReduce sums c in
// place (fp32 sums, rounded once more; across hosts, per host and then between hosts); fp32
// partials: the product stays fp32 in the workspace until the sum is rounded once into c.
// Every path gives every rank the same bits; at world 1 each is the GEMM. The choice depends
// on rank-uniform values only (the data area's size too: connect checks it).
void DeviceComm::gemm_all_reduce(const void* a, const void* w, void* c, int64_t m, int64_t n, int64_t k_local,
                                 int layout, int partials, cudaStream_t stream) {
  check_usable();
  require_gemm_reduce_args("gemmAllReduce", m, n, k_local, partials);
  const int W = layout_.world();
  const bool bf16 = static_cast<k::RsPartials>(partials) == k::RsPartials::kBF16;
  if (link_ == nullptr) {
    k::GemmArArgs args = gemm_reduce_operands<k::GemmArArgs>(a, w, m, n, k_local, layout, partials);
    args.C = static_cast<__nv_bfloat16*>(c);
    args.algo = k::gemm_all_reduce_info(sm_->device(), args).algo;
    const k::FusedWorkspace ws = k::gemm_all_reduce_workspace(args, W);
    if (std::max(ws.data_bytes, ws.scratch_bytes) <= sm_->data_bytes()) {
      cudaStream_t s = begin(stream);
      args.gemm_ws = gemm_workspace(s);
      if (W > 1 && args.algo == k::FusedAlgo::kDecomposed && !bf16) {
        args.sums = static_cast<float*>(workspace(round16(static_cast<uint64_t>(m * n) * 4)));
      }
      check_fused_launch(k::launch_gemm_all_reduce(sm_->device(), args, s), "gemmAllReduce");
      end(s, stream == nullptr);
      return;
    }
  }
  cudaStream_t s = begin(stream);
  if (W == 1 || bf16) {
    check_fused_launch(k::launch_gemm(with_gemm_workspace(dense_gemm_args(a, w, c, m, n, k_local, layout, k::GemmOutType::kBF16), s), s),
                       "gemmAllReduce");
    if (W > 1) enqueue_all_reduce(k::CommDtype::kBF16, c, c, m * n, s);
  } else {
    auto* sums = static_cast<float*>(workspace(round16(static_cast<uint64_t>(m * n) * 4)));
    check_fused_launch(k::launch_gemm(with_gemm_workspace(dense_gemm_args(a, w, sums, m, n, k_local, layout, k::GemmOutType::kF32), s), s),
                       "gemmAllReduce");
    enqueue_all_reduce(k::CommDtype::kF32, sums, sums, m * n, s);
    check(k::launch_narrow_to_bf16(sums, c, m * n, s), "gemmAllReduce: rounding the sums");
  }
  end(s, stream == nullptr);
}

// Across hosts the fused ops take the decomposed path: our hierarchical collective and our GEMM,
// on the op's stream. When W does not divide M, the collective runs on W equal blocks of
// ceil(M / W) rows (rank p's rows first in block p; the rest is padding that no result reads).
namespace {
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
}  // namespace

void DeviceComm::all_gather_gemm_across_hosts(const void* a_local, const void* w, void* c, void* gathered,
                                              int64_t m, int64_t n_local, int64_t k, int layout,
                                              cudaStream_t stream) {
  const int W = layout_.world(), r = layout_.rank();
  const RowBlocks rb{m, W};
  const uint64_t row = static_cast<uint64_t>(k) * 2;
  const int64_t count = rb.count(k);
  const HostsNeeds need = needs_across_hosts(k::CommOp::kAllGather, 2, count);
  require_fits("allGatherGemm", need.data_bytes);
  const uint64_t own_g = gathered == nullptr ? round16(m * row) : 0;
  const uint64_t padded = rb.even() ? 0 : round16(count * 2);
  cudaStream_t s = begin(stream);
  char* work = static_cast<char*>(workspace(own_g + padded + need.work_bytes));
  char* full = gathered != nullptr ? static_cast<char*>(gathered) : work;
  char* blocks = rb.even() ? full : work + own_g;
  enqueue_across_hosts(k::CommOp::kAllGather, k::CommDtype::kBF16, a_local, rb.rows(r) * row, blocks, count,
                       work + own_g + padded, s);
  if (!rb.even()) {
    std::vector<k::CopySegment> unpack;
    for (int p = 0; p < W; ++p) unpack.push_back({blocks + p * rb.ceil() * row, full + rb.first(p) * row, rb.rows(p) * row});
    copy_segments(unpack, s);
  }
  check_fused_launch(k::launch_gemm(with_gemm_workspace(dense_gemm_args(full, w, c, m, n_local, k, layout, k::GemmOutType::kBF16), s), s),
                     "allGatherGemm");
  end(s, stream == nullptr);
}

void DeviceComm::gemm_reduce_scatter_across_hosts(const void* a, const void* w, void* out, int64_t m, int64_t n,
                                                  int64_t k_local, int layout, int partials, cudaStream_t stream) {
  const int W = layout_.world(), r = layout_.rank();
  const RowBlocks rb{m, W};
  const bool bf16 = static_cast<k::RsPartials>(partials) == k::RsPartials::kBF16;
  const k::CommDtype pd = bf16 ? k::CommDtype::kBF16 : k::CommDtype::kF32;
  const uint64_t pes = bf16 ? 2 : 4, row = static_cast<uint64_t>(n) * pes;
  const int64_t count = rb.count(n);
  const HostsNeeds need = needs_across_hosts(k::CommOp::kReduceScatter, pes, count);
  require_fits("gemmReduceScatter", need.data_bytes);
  const bool direct = bf16 && rb.even();  // the sums land in `out` as they are
  const uint64_t product = round16(m * row), padded = rb.even() ? 0 : round16(count * pes);
  const uint64_t mine = direct ? 0 : round16(rb.ceil() * row);
  cudaStream_t s = begin(stream);
  char* work = static_cast<char*>(workspace(product + padded + mine + need.work_bytes));
  char* blocks = rb.even() ? work : work + product;
  char* sums = direct ? static_cast<char*>(out) : work + product + padded;
  const k::GemmOutType c_type = bf16 ? k::GemmOutType::kBF16 : k::GemmOutType::kF32;
  check_fused_launch(k::launch_gemm(with_gemm_workspace(dense_gemm_args(a, w, work, m, n, k_local, layout, c_type), s), s),
                     "gemmReduceScatter");
  if (!rb.even()) {
    std::vector<k::CopySegment> pack;
    for (int p = 0; p < W; ++p) pack.push_back({work + rb.first(p) * row, blocks + p * rb.ceil() * row, rb.rows(p) * row});
    copy_segments(pack, s);
  }
  enqueue_across_hosts(k::CommOp::kReduceScatter, pd, blocks, UINT64_MAX, sums, count,
                       work + product + padded + mine, s);
  if (!bf16) {
    check(k::launch_narrow_to_bf16(reinterpret_cast<const float*>(sums), out, rb.rows(r) * n, s),
          "gemmReduceScatter: rounding the sums");
  } else if (!direct) {
    copy_segments({{sums, out, rb.rows(r) * row}}, s);
  }
  end(s, stream == nullptr);
}

void DeviceComm::raise_device_failure() {
  try {
    sm_->raise_if_failed();
    if (link_ != nullptr) link_->raise_if_failed();
  } catch (...) {
    failed_ = true;
    throw;
  }
}

void DeviceComm::synchronize() {
  if (closed_ || !any_op_) return;
  pin_gpu(runtime_.gpu().ordinal);
  check(cudaEventSynchronize(last_done_), "waiting for the communicator's ops");
  raise_device_failure();
}

int64_t DeviceComm::time_collectives(k::CommOp op, k::CommDtype dtype, const void* in, void* out,
                                     int64_t count, int iters) {
  FC_REQUIRE(iters > 0, "iterations must be positive");
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) collective(op, dtype, in, out, count, nullptr);
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0)
      .count();
}

void DeviceComm::abort() noexcept {
  failed_ = true;
  if (sm_ != nullptr) sm_->abort();
  if (link_ != nullptr) link_->abort();
}

k::GemmWorkspace DeviceComm::gemm_workspace(cudaStream_t s) {
  if (gemm_ws_.ptr == nullptr && !gemm_ws_tried_ && !capturing_) {
    gemm_ws_tried_ = true;
    gemm_ws_ = make_gemm_workspace(s);
  }
  return gemm_ws_;
}

k::GemmArgs DeviceComm::with_gemm_workspace(k::GemmArgs g, cudaStream_t s) {
  k::use_workspace(g, gemm_workspace(s));
  return g;
}

void DeviceComm::close() noexcept {
  if (closed_) return;
  closed_ = true;
  if (sm_ != nullptr) {
    try {
      pin_gpu(runtime_.gpu().ordinal);
      if (link_ != nullptr) {
        // The link's kernels need its proxy until they end (or give up: abort()).
        cudaDeviceSynchronize();
        if (link_->failed()) failed_ = true;
        link_->close(!failed_);
      }
      sm_->close();  // synchronises the device first
      std::unique_ptr<SymmetricRegion> region = failed_ ? nullptr : sm_->take_region();
      if (region != nullptr) runtime_.release_region(std::move(region));
    } catch (...) {
      // close() never throws: a failing GPU here is reported by the next op on the runtime.
    }
    sm_.reset();
  }
  link_.reset();
  ag_side_.reset();  // its copies ended with the device synchronisation above
  if (work_ != nullptr) cudaFree(work_);
  work_ = nullptr;
  if (gemm_ws_.ptr != nullptr) cudaFree(gemm_ws_.ptr);
  gemm_ws_ = k::GemmWorkspace{};
  if (last_done_ != nullptr) cudaEventDestroy(last_done_);
  if (own_ != nullptr) cudaStreamDestroy(own_);
  last_done_ = nullptr;
  own_ = nullptr;
  cudaGetLastError();
}

std::string DeviceComm::describe_fused(int op, int64_t m, int64_t n, int64_t k, int partials) const {
  check_usable();
  FC_REQUIRE(op >= 0 && op <= 2, "unknown fused op " + std::to_string(op));
  const char* name = op == 0 ? "allGatherGemm" : op == 1 ? "gemmReduceScatter" : "gemmAllReduce";
  if (op == 0) {
    require_ag_args(m, n, k);
  } else {
    require_gemm_reduce_args(name, m, n, k, partials);
  }
  const int W = layout_.world();
  const k::CommDevice& dev = sm_->device();
  const uint64_t area = sm_->data_bytes();
  std::string out;
  uint64_t needs = 0;            // bytes of the data area the chosen path needs
  uint64_t unless_gathered = 0;  // allGatherGemm: what it needs without the gathered A, if more
                                 // than the area (and `needs` fits)
  const auto fused_split = [](const k::FusedLaunchInfo& i) {
    return std::to_string(i.gemm_ctas) + " GEMM CTAs, tile width " + std::to_string(i.tile_n);
  };
  if (op == 0) {
    // As all_gather_gemm passes them, without pointers: the info and workspaces read sizes.
    const k::AgGemmArgs args = ag_operands(nullptr, nullptr, nullptr, m, n, k, 0);
    // Without the gathered A as an output the op builds it in the scratch area: it may fit only
    // with one. (The workspace reads only whether a pointer is given, never the pointer.)
    const k::FusedWorkspace bare = k::all_gather_gemm_workspace(args, sm_->world());
    k::AgGemmArgs given = args;
    given.gathered = reinterpret_cast<__nv_bfloat16*>(uintptr_t{256});
    const k::FusedWorkspace ws = k::all_gather_gemm_workspace(given, sm_->world());
    needs = std::max(ws.data_bytes, ws.scratch_bytes);
    if (needs <= area && std::max(bare.data_bytes, bare.scratch_bytes) > area) {
      unless_gathered = std::max(bare.data_bytes, bare.scratch_bytes);
    }
    if (link_ != nullptr) {
      out = "decomposed across hosts: the hierarchical allGather, then our GEMM";
      needs = needs_across_hosts(k::CommOp::kAllGather, 2, RowBlocks{m, W}.count(k)).data_bytes;
      unless_gathered = 0;  // there the gathered A goes to the communicator's own workspace
    } else if (const k::FusedLaunchInfo i = k::all_gather_gemm_info(dev, args); i.algo == k::FusedAlgo::kFused) {
      out = "fused: " + fused_split(i) + ", " + std::to_string(i.chunks) + " row chunks; " +
            (i.copy_engines ? "the copy engines move the peers' rows (1 CTA raises their flags)"
                            : std::to_string(i.comm_ctas) + " CTAs pull the peers' rows, then join the GEMM");
    } else {
      out = W == 1 ? "decomposed: our GEMM on the local rows (world 1)" : "decomposed: our allGather, then our GEMM";
    }
  } else if (op == 1) {
    auto args = gemm_reduce_operands<k::GemmRsArgs>(nullptr, nullptr, m, n, k, 0, partials);
    const k::FusedWorkspace ws = k::gemm_reduce_scatter_workspace(args, sm_->world());
    needs = std::max(ws.data_bytes, ws.scratch_bytes);
    const std::string p = std::string(partials_name(args.partials)) + " partials";
    if (link_ != nullptr) {
      out = "decomposed across hosts: our GEMM, then the hierarchical reduceScatter (" + p + ")";
      const uint64_t pes = args.partials == k::RsPartials::kBF16 ? 2 : 4;
      needs = needs_across_hosts(k::CommOp::kReduceScatter, pes, RowBlocks{m, W}.count(n)).data_bytes;
    } else if (const k::FusedLaunchInfo i = k::gemm_reduce_scatter_info(dev, args); i.algo == k::FusedAlgo::kFused) {
      out = "fused: " + fused_split(i) + "; each output tile's partial goes to the rank owning its rows (" + p +
            ")";
    } else {
      out = W == 1 ? "decomposed: our GEMM (world 1)" : "decomposed: our GEMM, then our reduceScatter (" + p + ")";
    }
  } else {
    auto args = gemm_reduce_operands<k::GemmArArgs>(nullptr, nullptr, m, n, k, 0, partials);
    const std::string p =
        std::string(args.partials == k::RsPartials::kBF16 ? "bf16" : "fp32") + " partials";
    const k::FusedLaunchInfo i = k::gemm_all_reduce_info(dev, args);
    args.algo = i.algo;
    const k::FusedWorkspace ws = k::gemm_all_reduce_workspace(args, W);
    if (link_ == nullptr && std::max(ws.data_bytes, ws.scratch_bytes) <= area) {
      if (W == 1) {
        out = "our GEMM (world 1)";
      } else if (i.algo == k::FusedAlgo::kFused) {
        out = "fused: gemmReduceScatter's kernel (" + fused_split(i) + ", " + p + "), then our allGather";
      } else {
        out = "decomposed: our GEMM, then our allReduce (" + p + ")";
      }
    } else {
      out = std::string(link_ != nullptr ? "across hosts" : "larger than the data area") +
            ": our GEMM, then our allReduce" + (link_ != nullptr ? " (hierarchical)" : "") +
            (W == 1 ? "" : " in pieces of the data area's size") + " (" + p + ")";
    }
  }
  if (needs > area) {
    out += "; refused: " + shortfall(needs) + " (raise spark.fusedcomm.cuda.symmetricBytes)";
  } else if (unless_gathered > 0) {
    out += "; refused unless the gathered A is asked for: without it the op " + shortfall(unless_gathered) +
           " (raise spark.fusedcomm.cuda.symmetricBytes)";
  }
  return out;
}

}  // namespace fusedcomm
