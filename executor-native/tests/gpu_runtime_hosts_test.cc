// gpu_runtime_hosts_test: the cuda backend's communicator across "virtual hosts"
// (docs/architecture.md), through the same runtime objects the C API drives (Runtime,
// CudaComm): one forked process per rank, each with its own Runtime (GPU, socket transport on
// the loopback); the bootstrap blobs go through the parent (the stand-in for Spark's barrier
// allGather); each rank is given a host id, and the ranks of one id share symmetric memory while
// different ids talk through the GPU-posted proxy path.
// Layouts: H hosts x L ranks, with contiguous host blocks (rank / L) and interleaved
// (rank % H: ranks of a host need not be contiguous in Spark).
// Checks, per layout:
//   - allReduce fp32 and bf16 at 0, 7, 1,000,003 elements and at more than the data area
//     (pieces); allGather, reduceScatter and allToAll fp32 and bf16 at 0, 7 and 1,000,003
//     elements; fresh
//     small-integer inputs (every sum exact in any order), poisoned outputs, every element
//     bit-exact; on the communicator's own stream and 20 back to back on a stream of the caller
//     with one synchronisation; the four ops mixed back to back on a caller stream;
//   - allGatherGemm (with and without the gathered A), gemmReduceScatter and gemmAllReduce
//     (each partial precision; gemmAllReduce's bits equal on every rank, and 10 back to back),
//     NK and KN weights, M divisible by W and not, small-integer inputs checked bit-exact (bf16
//     partials: within 2^-7 of the terms' magnitude); across hosts, and with every rank on one
//     host;
//   - gemmAllReduce at M = 4096, N = 8192 on one host, every element bit-exact, the same bits on
//     every rank: at W = 2 through gemmReduceScatter's fused kernel and an allGather;
//   - every rank on one host: the four collectives fp32 and bf16 at one-shot sizes, their input
//     read where it lies (no copy: CudaComm::input_copies), 20 back to back on a caller stream,
//     and in place (in == out: copied);
//   - CUDA graphs: the four collectives and the three GEMM ops captured on a caller stream, the
//     graph replayed 3 times with fresh inputs, every output checked; across hosts and with
//     every rank on one host; a capture that would grow the workspace is refused;
//   - an allGather larger than the data area fails with Error(kInvalidArgument), and the
//     communicator stays usable;
//   - a host that never arrives (an allToAll): the ranks of the other host time out with
//     Error(kTimeout) naming the op and a rank of the missing host; every rank aborts and closes; then the same wait ended
//     by abort() from another thread within seconds (Error(kCommunicator)); a fresh communicator
//     on the same runtimes works;
//   - (L >= 2) one rank that never arrives while the rest of its host does: every other rank
//     gets Error(kTimeout), none a result with that rank's blocks missing.
// FC_TEST_HOSTS=<H> (default 2), FC_TEST_LOCAL=<L> (default GPUs / H, at least 1);
// FC_TEST_SHARED_GPU=<n> lets ranks share GPUs (timings meaningless). Exit 77 (skip) with a
// reason where no Hopper GPU is visible or the layout needs more GPUs.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "fusedcomm/comm/cuda_comm.h"
#include "fusedcomm/runtime/errors.h"
#include "fusedcomm/runtime/runtime.h"
#include "fusedcomm/runtime/split.h"
#include "kernels/gemm_ar/gemm_ar.h"
#include "support/cuda_comm_support.h"
#include "support/gpu_test_support.h"
#include "support/process_group.h"
#include "support/proxy_test_support.h"

namespace {

namespace k = fusedcomm::kernels;
using fusedcomm::CudaComm;
using fusedcomm::DType;
using fusedcomm::Error;
using fusedcomm::ErrorKind;
using fusedcomm::Op;
using fusedcomm::PartialPrecision;
using fusedcomm::Runtime;
using fusedcomm::testing::check;
using fusedcomm::testing::ProcessGroup;

constexpr int64_t kSymmetricBytes = 4 << 20;  // small: 3,000,001 fp32 elements take 3 pieces
constexpr int64_t kTimeoutMs = 20000;
constexpr int64_t kLargeCount = 3000001;

// One communicator, bootstrapped as the C API's callers do it (the parent stands in for the
// launcher's allGather).
struct Comm {
  std::unique_ptr<CudaComm> device;

  Comm(Runtime& rt, ProcessGroup& g, const std::vector<int>& host_of, uint64_t comm_id)
      : device(fusedcomm::testing::make_cuda_comm(rt, g, comm_id, host_of)) {}
  // Ops done, the closing barrier, then the GPU half back to the pool.
  void close() { device->close(); }
  // Both halves stop now; the region is dropped.
  void abort_and_close() {
    device->abort();
    try {
      device->close();
    } catch (const std::exception&) {}
  }
};

// The kernels' numbering of ops and dtypes is the C API's (static_asserts in the runtime).
Op op_of(k::CommOp op) { return static_cast<Op>(op); }
DType dtype_of(k::CommDtype d) { return static_cast<DType>(d); }
fusedcomm::WeightLayout layout_of(int wl) {
  return wl == 0 ? fusedcomm::WeightLayout::kNK : fusedcomm::WeightLayout::kKN;
}
PartialPrecision partials_of(int p) { return static_cast<PartialPrecision>(p); }
const fusedcomm::OpDesc kDesc{"gpu_runtime_hosts_test", 0};

float value(uint64_t seed, int rank, int64_t i) { return fusedcomm::testing::small_value(seed, rank, i); }
std::vector<uint8_t> encode(const std::vector<float>& v, k::CommDtype dtype) {
  return fusedcomm::testing::encode_elements(v, dtype);
}

const char* op_name(k::CommOp op) { return k::comm_op_name(static_cast<uint32_t>(op)); }

// One collective's data (`count` elements, kernels/collectives/collectives.h): rank r's full vector is
// value(seed, r, i), i < count; its input is the vector (allReduce, reduceScatter, allToAll) or
// its block of it (allGather: split_count(count, W, r) elements at split_offset); `want` is
// this rank's expected output, bit for bit.
struct CollData {
  std::vector<uint8_t> in, want;
};
CollData coll_data(k::CommOp op, int rank, int world, uint64_t seed, k::CommDtype dtype, int64_t count) {
  using fusedcomm::split_count;
  using fusedcomm::split_offset;
  const int64_t mine_n = split_count(count, world, rank), mine_at = split_offset(count, world, rank);
  std::vector<float> in_v, want;
  if (op == k::CommOp::kAllGather) {
    for (int64_t i = mine_at; i < mine_at + mine_n; ++i) in_v.push_back(value(seed, rank, i));
    for (int g = 0; g < world; ++g) {
      for (int64_t i = split_offset(count, world, g);
           i < split_offset(count, world, g) + split_count(count, world, g); ++i) {
        want.push_back(value(seed, g, i));
      }
    }
  } else if (op == k::CommOp::kAllToAll) {
    for (int64_t i = 0; i < count; ++i) in_v.push_back(value(seed, rank, i));
    for (int q = 0; q < world; ++q) {
      for (int64_t i = mine_at; i < mine_at + mine_n; ++i) want.push_back(value(seed, q, i));
    }
  } else {
    const bool scatter = op == k::CommOp::kReduceScatter;
    for (int64_t i = 0; i < count; ++i) in_v.push_back(value(seed, rank, i));
    for (int64_t i = scatter ? mine_at : 0; i < (scatter ? mine_at + mine_n : count); ++i) {
      float sum = 0.f;
      for (int r = 0; r < world; ++r) sum += value(seed, r, i);
      want.push_back(sum);
    }
  }
  return {encode(in_v, dtype), encode(want, dtype)};
}

// Checks `out` (want.size() bytes, then a 16-byte guard of 0xFF) against `want`.
void check_output(const void* out, const std::vector<uint8_t>& want, size_t es, const std::string& what) {
  std::vector<uint8_t> got(want.size() + 16);
  CUDA_OK(cudaMemcpy(got.data(), out, got.size(), cudaMemcpyDeviceToHost));
  int64_t bad = 0;
  for (size_t i = 0; i < want.size(); i += es) bad += std::memcmp(&got[i], &want[i], es) != 0;
  bool guard = true;
  for (size_t b = want.size(); b < got.size(); ++b) guard &= got[b] == 0xFF;
  check(bad == 0, what + ": " + std::to_string(bad) + " elements wrong");
  check(guard, what + ": wrote past the end of the output");
}

// One collective case: on the own stream (stream == nullptr) once, or `reps` times back to
// back on `stream` with one synchronisation; every element of the last result checked
// bit-exact, and a guard after the output.
void collective_case(CudaComm& dc, k::CommOp op, int rank, int world, uint64_t seed, k::CommDtype dtype,
                     int64_t count, cudaStream_t stream, int reps, const std::string& layout) {
  const size_t es = dtype == k::CommDtype::kF32 ? 4 : 2;
  const CollData d = coll_data(op, rank, world, seed, dtype, count);
  void *in = nullptr, *out = nullptr;
  CUDA_OK(cudaMalloc(&in, d.in.size() + 16));
  CUDA_OK(cudaMalloc(&out, d.want.size() + 16));
  CUDA_OK(cudaMemcpy(in, d.in.data(), d.in.size(), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemset(out, 0xFF, d.want.size() + 16));  // NaN, and a guard after the end
  const std::string what = layout + ": " + op_name(op) + (dtype == k::CommDtype::kF32 ? " fp32 " : " bf16 ") +
                           std::to_string(count) +
                           (stream ? " x" + std::to_string(reps) + " on a caller stream" : "") + ", rank " +
                           std::to_string(rank);
  try {
    for (int i = 0; i < reps; ++i) dc.collective(op_of(op), dtype_of(dtype), in, out, count, stream);
    dc.synchronize();
    check_output(out, d.want, es, what);
  } catch (const std::exception& e) { check(false, what + ": threw " + e.what()); }
  cudaFree(in);
  cudaFree(out);
}

// One collective in place (in == out, the buffer as large as the larger of the two): the input
// overlaps the output, so CudaComm must copy it into the data area even where the launch is
// one-shot (which otherwise reads it where it lies): checked through CudaComm::input_copies,
// and the result as collective_case.
void in_place_case(CudaComm& dc, k::CommOp op, int rank, int world, uint64_t seed, k::CommDtype dtype,
                   int64_t count, const std::string& layout) {
  const CollData d = coll_data(op, rank, world, seed, dtype, count);
  const size_t bytes = std::max(d.in.size(), d.want.size());
  void* buf = nullptr;
  CUDA_OK(cudaMalloc(&buf, bytes + 16));
  CUDA_OK(cudaMemset(buf, 0xFF, bytes + 16));
  CUDA_OK(cudaMemcpy(buf, d.in.data(), d.in.size(), cudaMemcpyHostToDevice));
  const std::string what = layout + ": " + op_name(op) + (dtype == k::CommDtype::kF32 ? " fp32 " : " bf16 ") +
                           std::to_string(count) + " in place, rank " + std::to_string(rank);
  try {
    const uint64_t copies = dc.input_copies();
    dc.collective(op_of(op), dtype_of(dtype), buf, buf, count, nullptr);
    check(dc.input_copies() == copies + 1, what + ": the input was not copied");
    std::vector<uint8_t> got(d.want.size());
    CUDA_OK(cudaMemcpy(got.data(), buf, got.size(), cudaMemcpyDeviceToHost));
    check(got == d.want, what + ": wrong output");
  } catch (const std::exception& e) { check(false, what + ": threw " + e.what()); }
  cudaFree(buf);
}

void all_reduce_case(CudaComm& dc, int rank, int world, uint64_t seed, k::CommDtype dtype, int64_t count,
                     cudaStream_t stream, int reps, const std::string& layout) {
  collective_case(dc, k::CommOp::kAllReduce, rank, world, seed, dtype, count, stream, reps, layout);
}

// Ops of different kinds back to back on a caller stream, one synchronisation at the end: each
// op's signal values start where the previous op's ended, whatever its kind. Checked through
// the last op of each kind (the others' results are overwritten in place).
void mixed_case(CudaComm& dc, int rank, int world, uint64_t seed, cudaStream_t stream,
                const std::string& layout) {
  for (int i = 0; i < 3; ++i) {
    for (const k::CommOp op :
         {k::CommOp::kAllGather, k::CommOp::kReduceScatter, k::CommOp::kAllReduce, k::CommOp::kAllToAll}) {
      collective_case(dc, op, rank, world, seed + 31 * i + static_cast<int>(op), k::CommDtype::kBF16,
                      300007 + i, stream, 2, layout + " (mixed)");
    }
  }
}

// Larger than the data area takes: allGather needs H equal block slots of it.
void too_large(CudaComm& dc, int rank, int world, const std::string& layout) {
  const int H = dc.layout().hosts;
  const int64_t count = (kSymmetricBytes / 4 / H + 1) * world;  // H slots of more than data / H
  void* buf = nullptr;
  CUDA_OK(cudaMalloc(&buf, count * 4));
  try {
    dc.collective(Op::kAllGather, DType::kF32, buf, buf, count, nullptr);
    check(false, layout + ": an allGather larger than the data area ran on rank " + std::to_string(rank));
  } catch (const Error& e) {
    const std::string m = e.what();
    check(e.kind() == ErrorKind::kInvalidArgument && m.find("symmetricBytes") != std::string::npos,
          layout + ": too-large allGather on rank " + std::to_string(rank) + ": " + m);
  }
  cudaFree(buf);
}

// Device copies of host values in bf16 (freed by the caller).
void* upload_bf16(const std::vector<float>& v) {
  const std::vector<uint8_t> bytes = encode(v, k::CommDtype::kBF16);
  void* d = nullptr;
  CUDA_OK(cudaMalloc(&d, bytes.size() + 16));
  if (!bytes.empty()) CUDA_OK(cudaMemcpy(d, bytes.data(), bytes.size(), cudaMemcpyHostToDevice));
  return d;
}
std::vector<float> download_bf16(const void* d, int64_t n) {
  std::vector<__nv_bfloat16> b(n);
  CUDA_OK(cudaMemcpy(b.data(), d, n * 2, cudaMemcpyDeviceToHost));
  std::vector<float> out(n);
  for (int64_t i = 0; i < n; ++i) out[i] = __bfloat162float(b[i]);
  return out;
}
float bf16_round(float x) { return __bfloat162float(__float2bfloat16(x)); }
// Weight element (row j of op's N, column kk of K) of a weight stored NK (N x K) or KN (K x N).
float weight_at(const std::vector<float>& w, int layout, int64_t n, int64_t kdim, int64_t j, int64_t kk) {
  return layout == 0 ? w[j * kdim + kk] : w[kk * n + j];
}

// The fused ops' data: small integer inputs, so every product sum is exact in fp32, and C and
// the fp32-partials sums equal the bf16 rounding of the exact result bit for bit; bf16 partials
// are rounded per rank and per host before the last sum, so they are checked within 2^-7 of the
// sum of |terms| per element.
// allGatherGemm: K = 64, N_r = 64 + 8 (r % 2); this rank's rows of A, its weight (layout wl:
// 0 NK, 1 KN), the expected C and gathered A.
struct AgData {
  int64_t m, n, kd;
  std::vector<float> a, w, want_c, want_g;
};
AgData ag_data(uint64_t seed, int64_t m, int wl, int rank, int world) {
  using fusedcomm::split_count;
  using fusedcomm::split_offset;
  AgData d{m, 64 + 8 * (rank % 2), 64, {}, {}, {}, {}};
  const int64_t kd = d.kd, n = d.n;
  auto a_at = [&](int64_t i, int64_t kk) { return value(seed ^ 0xA, 0, i * kd + kk); };
  const int64_t rows = split_count(m, world, rank), first = split_offset(m, world, rank);
  d.w.resize(n * kd);
  d.want_c.resize(m * n);
  d.want_g.resize(m * kd);
  for (int64_t i = first; i < first + rows; ++i)
    for (int64_t kk = 0; kk < kd; ++kk) d.a.push_back(a_at(i, kk));
  for (int64_t i = 0; i < n * kd; ++i) d.w[i] = value(seed ^ 0xB, rank, i);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t kk = 0; kk < kd; ++kk) d.want_g[i * kd + kk] = a_at(i, kk);
    for (int64_t j = 0; j < n; ++j) {
      float acc = 0;
      for (int64_t kk = 0; kk < kd; ++kk) acc += a_at(i, kk) * weight_at(d.w, wl, n, kd, j, kk);
      d.want_c[i * n + j] = bf16_round(acc);
    }
  }
  return d;
}
// gemmReduceScatter (gemmAllReduce: all_rows): N = 72, K_r = 32 + 8 (r % 3); this rank's A
// and weight, and per element of its output block (every row) the exact sum and the sum of
// |terms|.
struct RsData {
  int64_t m, n, kd, rows;
  std::vector<float> a, w, exact, mag;
};
RsData rs_data(uint64_t seed, int64_t m, int wl, int rank, int world, bool all_rows = false) {
  using fusedcomm::split_count;
  using fusedcomm::split_offset;
  auto kr = [&](int r) { return int64_t{32} + 8 * (r % 3); };
  RsData d{m, 72, kr(rank), all_rows ? m : split_count(m, world, rank), {}, {}, {}, {}};
  const int64_t n = d.n, kd = d.kd, first = all_rows ? 0 : split_offset(m, world, rank);
  auto a_of = [&](int r, int64_t i, int64_t kk) { return value(seed ^ 0xC, r, i * kr(r) + kk); };
  auto w_of = [&](int r, int64_t j, int64_t kk) { return value(seed ^ 0xD, r, j * kr(r) + kk); };
  d.a.resize(m * kd);
  d.w.resize(n * kd);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t kk = 0; kk < kd; ++kk) d.a[i * kd + kk] = a_of(rank, i, kk);
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t kk = 0; kk < kd; ++kk) {
      if (wl == 0)
        d.w[j * kd + kk] = w_of(rank, j, kk);
      else
        d.w[kk * n + j] = w_of(rank, j, kk);
    }
  }
  for (int64_t i = 0; i < d.rows; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      float exact = 0, mag = 0;
      for (int r = 0; r < world; ++r) {
        for (int64_t kk = 0; kk < kr(r); ++kk) {
          const float t = a_of(r, first + i, kk) * w_of(r, j, kk);
          exact += t;
          mag += std::fabs(t);
        }
      }
      d.exact.push_back(exact);
      d.mag.push_back(mag);
    }
  }
  return d;
}
// Elements of a gemmReduceScatter / gemmAllReduce output (rows x n, downloaded) outside the
// check.
int64_t rs_wrong(const RsData& d, const void* out, int partials) {
  const std::vector<float> got = download_bf16(out, d.rows * d.n);
  int64_t bad = 0;
  for (size_t e = 0; e < got.size(); ++e) {
    bad += partials == 1 ? !(std::fabs(got[e] - d.exact[e]) <= d.mag[e] / 128)
                         : got[e] != bf16_round(d.exact[e]);
  }
  return bad;
}

// gemmAllReduce with each partial precision: every element checked (as gemmReduceScatter's),
// a guard after the output, and the same bits on every rank (the outputs' bytes compared
// through the process group). `reps` launches back to back on `stream` (null: the own stream).
void all_reduce_gemm_case(CudaComm& dc, ProcessGroup& g, uint64_t seed, int64_t m, int wl,
                          cudaStream_t stream, int reps, const std::string& what) {
  const RsData d = rs_data(seed, m, wl, g.rank, g.world, /*all_rows=*/true);
  for (const int partials : {0, 1, 2}) {
    void* a = upload_bf16(d.a);
    void* wt = upload_bf16(d.w);
    void* c = nullptr;
    const size_t bytes = static_cast<size_t>(m * d.n * 2);
    CUDA_OK(cudaMalloc(&c, bytes + 16));
    CUDA_OK(cudaMemset(c, 0xFF, bytes + 16));
    const std::string w = what + ": gemmAllReduce partials " + std::to_string(partials) +
                          (reps > 1 ? " x" + std::to_string(reps) : "");
    bool ran = false;
    try {
      for (int i = 0; i < reps; ++i)
        dc.gemm_all_reduce(kDesc, DType::kBF16, a, wt, c, m, d.n, d.kd, layout_of(wl), partials_of(partials),
                           stream);
      dc.synchronize();
      ran = true;
    } catch (const std::exception& e) { check(false, w + " threw " + e.what()); }
    std::vector<uint8_t> got(bytes + 16);
    CUDA_OK(cudaMemcpy(got.data(), c, got.size(), cudaMemcpyDeviceToHost));
    if (ran) {
      const int64_t bad = rs_wrong(d, c, partials);
      check(bad == 0, w + ": " + std::to_string(bad) + " elements wrong");
      bool guard = true;
      for (size_t b = bytes; b < got.size(); ++b) guard &= got[b] == 0xFF;
      check(guard, w + ": wrote past the end of the output");
    }
    got.resize(bytes);
    const auto all = g.all_gather(got);  // every rank takes part, also after a failure
    for (int r = 0; r < g.world; ++r) {
      check(!ran || all[r] == got, w + ": rank " + std::to_string(r) + "'s result differs in its bits");
    }
    for (void* p : {a, wt, c}) cudaFree(p);
  }
}

// The fused ops (across hosts: one kernel with one rank per host, else the decomposed path,
// hierarchical collective and our GEMM; gpu_hosts_fused_test compares the two), M
// divisible by W and not, NK and KN; allGatherGemm asks for the gathered A with NK;
// gemmReduceScatter and gemmAllReduce with each partial precision.
void fused_cases(CudaComm& dc, ProcessGroup& g, uint64_t seed, cudaStream_t stream,
                 const std::string& layout) {
  const int rank = g.rank, world = g.world;
  for (const int64_t m : {int64_t{32} * world, int64_t{16} * world + 3}) {
    for (const int wl : {0, 1}) {
      const std::string what =
          layout + ": M=" + std::to_string(m) + (wl ? " KN" : " NK") + ", rank " + std::to_string(rank);
      {
        const AgData d = ag_data(seed, m, wl, rank, world);
        void* a = upload_bf16(d.a);
        void* wt = upload_bf16(d.w);
        void *c = nullptr, *g = nullptr;
        CUDA_OK(cudaMalloc(&c, m * d.n * 2));
        CUDA_OK(cudaMemset(c, 0xFF, m * d.n * 2));
        if (wl == 0) {
          CUDA_OK(cudaMalloc(&g, m * d.kd * 2));
          CUDA_OK(cudaMemset(g, 0xFF, m * d.kd * 2));
        }
        try {
          dc.all_gather_gemm(kDesc, DType::kBF16, a, wt, c, g, m, d.n, d.kd, layout_of(wl), nullptr);
          check(download_bf16(c, m * d.n) == d.want_c,
                what + ": allGatherGemm C differs from the exact product");
          if (g != nullptr)
            check(download_bf16(g, m * d.kd) == d.want_g, what + ": allGatherGemm gathered A differs");
        } catch (const std::exception& e) { check(false, what + ": allGatherGemm threw " + e.what()); }
        for (void* p : {a, wt, c, g}) cudaFree(p);
      }
      const RsData d = rs_data(seed, m, wl, rank, world);
      for (const int partials : {0, 1, 2}) {
        void* a = upload_bf16(d.a);
        void* wt = upload_bf16(d.w);
        void* out = nullptr;
        CUDA_OK(cudaMalloc(&out, d.rows * d.n * 2 + 16));
        CUDA_OK(cudaMemset(out, 0xFF, d.rows * d.n * 2 + 16));
        try {
          dc.gemm_reduce_scatter(kDesc, DType::kBF16, a, wt, out, m, d.n, d.kd, layout_of(wl),
                                 partials_of(partials), nullptr);
          const int64_t bad = rs_wrong(d, out, partials);
          check(bad == 0, what + ": gemmReduceScatter partials " + std::to_string(partials) + ": " +
                              std::to_string(bad) + " elements wrong");
        } catch (const std::exception& e) { check(false, what + ": gemmReduceScatter threw " + e.what()); }
        for (void* p : {a, wt, out}) cudaFree(p);
      }
      all_reduce_gemm_case(dc, g, seed ^ 0xE, m, wl, nullptr, 1, what);
    }
  }
  all_reduce_gemm_case(dc, g, seed ^ 0xE1, int64_t{8} * world + 5, 1, stream, 10,
                       layout + ": M=" + std::to_string(8 * world + 5) + " KN on a caller stream, rank " +
                           std::to_string(rank));
  // An fp32 product larger than the data area (16001 x 72 x 4 B > 4 MiB): the runtime's GEMM
  // then allReduce in pieces.
  all_reduce_gemm_case(
      dc, g, seed ^ 0xE2, 16001, 0, nullptr, 1,
      layout + ": M=16001 NK (fp32 product larger than the data area), rank " + std::to_string(rank));
}

// CUDA graphs (cuda_comm.h): the four collectives and both fused ops, each twice, captured
// on a caller stream after one eager run (which sizes the workspace), then the graph replayed
// 3 times, each with fresh inputs uploaded and outputs poisoned on the same stream before the
// launch; every output checked after each replay. Across hosts, a capture before that eager
// run is refused (the workspace cannot grow inside a capture), and the communicator stays
// usable.
void graph_case(CudaComm& dc, int rank, int world, uint64_t seed, cudaStream_t stream,
                const std::string& layout) {
  struct Coll {
    k::CommOp op;
    k::CommDtype dtype;
    int64_t count;
    void *in = nullptr, *out = nullptr;
    size_t in_bytes = 0, out_bytes = 0;
  };
  std::vector<Coll> colls = {{k::CommOp::kAllReduce, k::CommDtype::kBF16, 65539},
                             {k::CommOp::kAllGather, k::CommDtype::kF32, 100003},
                             {k::CommOp::kReduceScatter, k::CommDtype::kBF16, 100003},
                             {k::CommOp::kAllToAll, k::CommDtype::kF32, 100003}};
  const int64_t m = int64_t{16} * world + 3;
  for (Coll& c : colls) {
    const CollData d = coll_data(c.op, rank, world, seed, c.dtype, c.count);
    c.in_bytes = d.in.size();
    c.out_bytes = d.want.size();
    CUDA_OK(cudaMalloc(&c.in, c.in_bytes + 16));
    CUDA_OK(cudaMalloc(&c.out, c.out_bytes + 16));
  }
  const AgData ag0 = ag_data(seed, m, 0, rank, world);
  const RsData rs0 = rs_data(seed, m, 1, rank, world);
  const RsData ar0 = rs_data(seed, m, 0, rank, world, /*all_rows=*/true);
  std::vector<void*> fused(10, nullptr);  // ag: a, w, c, gathered; rs: a, w, out; ar: a, w, c
  const size_t fused_bytes[10] = {
      ag0.a.size() * 2, ag0.w.size() * 2,     size_t(m * ag0.n * 2),        size_t(m * ag0.kd * 2),
      rs0.a.size() * 2, rs0.w.size() * 2,     size_t(rs0.rows * rs0.n * 2), ar0.a.size() * 2,
      ar0.w.size() * 2, size_t(m * ar0.n * 2)};
  for (int i = 0; i < 10; ++i) CUDA_OK(cudaMalloc(&fused[i], fused_bytes[i] + 16));
  auto enqueue_all = [&] {
    for (const Coll& c : colls) dc.collective(op_of(c.op), dtype_of(c.dtype), c.in, c.out, c.count, stream);
    dc.all_gather_gemm(kDesc, DType::kBF16, fused[0], fused[1], fused[2], fused[3], m, ag0.n, ag0.kd,
                       layout_of(0), stream);
    dc.gemm_reduce_scatter(kDesc, DType::kBF16, fused[4], fused[5], fused[6], m, rs0.n, rs0.kd, layout_of(1),
                           PartialPrecision::kF32, stream);
    dc.gemm_all_reduce(kDesc, DType::kBF16, fused[7], fused[8], fused[9], m, ar0.n, ar0.kd, layout_of(0),
                       PartialPrecision::kF32, stream);
  };
  const std::string what = layout + ": graph, rank " + std::to_string(rank);
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  try {
    if (dc.layout().hosts > 1) {
      // Before any reduceScatter, its workspace does not exist: refused inside the capture.
      CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
      std::string message;
      try {
        dc.collective(op_of(colls[2].op), dtype_of(colls[2].dtype), colls[2].in, colls[2].out, colls[2].count,
                      stream);
      } catch (const Error& e) {
        message = e.kind() == ErrorKind::kInvalidArgument ? e.what() : std::string("wrong kind: ") + e.what();
      }
      cudaGraph_t partial = nullptr;
      check(cudaStreamEndCapture(stream, &partial) == cudaSuccess,
            what + ": the refused capture could not end");
      if (partial != nullptr) cudaGraphDestroy(partial);
      check(
          message.find("before the capture") != std::string::npos,
          what + ": growing the workspace inside a capture: " + (message.empty() ? "not refused" : message));
    }
    enqueue_all();  // eager: sizes the workspace, warms the launches
    CUDA_OK(cudaStreamSynchronize(stream));
    dc.synchronize();
    CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    enqueue_all();
    enqueue_all();
    CUDA_OK(cudaStreamEndCapture(stream, &graph));
    CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    for (int rep = 0; rep < 3; ++rep) {
      const uint64_t s = seed ^ (0x9A0 + rep);
      std::vector<CollData> want;
      for (const Coll& c : colls) {
        want.push_back(coll_data(c.op, rank, world, s, c.dtype, c.count));
        CUDA_OK(cudaMemcpyAsync(c.in, want.back().in.data(), c.in_bytes, cudaMemcpyHostToDevice, stream));
        CUDA_OK(cudaMemsetAsync(c.out, 0xFF, c.out_bytes + 16, stream));
      }
      const AgData ag = ag_data(s, m, 0, rank, world);
      const RsData rs = rs_data(s, m, 1, rank, world);
      const RsData ar = rs_data(s, m, 0, rank, world, /*all_rows=*/true);
      const std::vector<uint8_t> up[6] = {
          encode(ag.a, k::CommDtype::kBF16), encode(ag.w, k::CommDtype::kBF16),
          encode(rs.a, k::CommDtype::kBF16), encode(rs.w, k::CommDtype::kBF16),
          encode(ar.a, k::CommDtype::kBF16), encode(ar.w, k::CommDtype::kBF16)};
      const int at[6] = {0, 1, 4, 5, 7, 8};
      for (int i = 0; i < 6; ++i) {
        CUDA_OK(cudaMemcpyAsync(fused[at[i]], up[i].data(), up[i].size(), cudaMemcpyHostToDevice, stream));
      }
      for (const int i : {2, 3, 6, 9}) CUDA_OK(cudaMemsetAsync(fused[i], 0xFF, fused_bytes[i] + 16, stream));
      CUDA_OK(cudaGraphLaunch(exec, stream));
      CUDA_OK(cudaStreamSynchronize(stream));
      dc.synchronize();  // a device failure in the replay is raised here
      const std::string r = what + ", replay " + std::to_string(rep);
      for (size_t i = 0; i < colls.size(); ++i) {
        check_output(colls[i].out, want[i].want, colls[i].dtype == k::CommDtype::kF32 ? 4 : 2,
                     r + ": " + op_name(colls[i].op));
      }
      check(download_bf16(fused[2], m * ag.n) == ag.want_c,
            r + ": allGatherGemm C differs from the exact product");
      check(download_bf16(fused[3], m * ag.kd) == ag.want_g, r + ": allGatherGemm gathered A differs");
      const int64_t bad = rs_wrong(rs, fused[6], 0);
      check(bad == 0, r + ": gemmReduceScatter: " + std::to_string(bad) + " elements wrong");
      const int64_t bad_ar = rs_wrong(ar, fused[9], 0);
      check(bad_ar == 0, r + ": gemmAllReduce: " + std::to_string(bad_ar) + " elements wrong");
    }
  } catch (const std::exception& e) {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream, &status) == cudaSuccess && status != cudaStreamCaptureStatusNone) {
      cudaGraph_t g = nullptr;
      cudaStreamEndCapture(stream, &g);
      if (g != nullptr) cudaGraphDestroy(g);
    }
    check(false, what + ": threw " + e.what());
  }
  if (exec != nullptr) cudaGraphExecDestroy(exec);
  if (graph != nullptr) cudaGraphDestroy(graph);
  for (Coll& c : colls) {
    cudaFree(c.in);
    cudaFree(c.out);
  }
  for (void* p : fused) cudaFree(p);
}

// FNV-1a of a byte range: compares results across ranks without moving them.
uint64_t fnv1a(const uint8_t* p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

// gemmAllReduce large enough that at W = 2 gemmReduceScatter's fused kernel computes the row
// blocks (then an allGather fills c): M = 4096, N = 8192, every rank on one host, on a runtime
// of its own with a data area that holds the fused workspace. A_r is rank 1 (A_r[i][k] = u_r(i)
// v_r(k)) so that the reference is cheap: the sum is Σ_r u_r(i) h_r(j), h_r(j) = Σ_k v_r(k)
// W_r[j][k], every term and sum exact in fp32; checked bit for bit with each partial precision
// (bf16: the sum of the rank terms rounded to bf16, but the owner's own term in fp32 on the
// fused path, docs/ops.md; then rounded), twice back to back on a caller
// stream, and the same bits on every rank. At other world sizes the same checks cover GEMM +
// allReduce at this size.
void large_all_reduce_gemm(ProcessGroup& g, int gpus, bool shared, uint64_t seed) {
  constexpr int64_t M = 4096, N = 8192, K = 64;
  const int rank = g.rank, world = g.world;
  Runtime rt(
      fusedcomm::testing::loopback_cuda_config(rank % gpus, seed, kTimeoutMs, int64_t{160} << 20, shared));
  Comm c(rt, g, std::vector<int>(world, 0), 5000);
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  auto u = [&](int r, int64_t i) { return value(seed ^ 0x51, r, i); };
  auto v = [&](int r, int64_t kk) { return value(seed ^ 0x52, r, kk); };
  auto wv = [&](int r, int64_t j, int64_t kk) { return value(seed ^ 0x53, r, j * K + kk); };
  std::vector<float> a(M * K), w(N * K);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t kk = 0; kk < K; ++kk) a[i * K + kk] = u(rank, i) * v(rank, kk);
  for (int64_t j = 0; j < N; ++j)
    for (int64_t kk = 0; kk < K; ++kk) w[j * K + kk] = wv(rank, j, kk);
  std::vector<std::vector<float>> h(world, std::vector<float>(N));
  for (int r = 0; r < world; ++r)
    for (int64_t j = 0; j < N; ++j) {
      float acc = 0;
      for (int64_t kk = 0; kk < K; ++kk) acc += v(r, kk) * wv(r, j, kk);
      h[r][j] = acc;
    }
  // The path the op takes for these partials (the choice depends on them: at W = 4 only bf16
  // partials take the fused kernel), which decides which terms the reference rounds.
  auto fused_for = [&](int partials) {
    k::GemmArArgs probe;
    probe.M = M;
    probe.N = N;
    probe.K = K;
    probe.partials = static_cast<k::RsPartials>(partials);
    const bool fused =
        k::gemm_all_reduce_info(c.device->memory().device(), probe).algo == k::FusedAlgo::kFused;
    if (rank == 0) {
      std::printf("  gemmAllReduce M=%lld N=%lld at W=%d, partials %d: %s\n", static_cast<long long>(M),
                  static_cast<long long>(N), world, partials,
                  fused ? "fused gemmReduceScatter, then allGather" : "GEMM, then allReduce");
    }
    return fused;
  };
  if (world == 2)
    check(fused_for(0), "large gemmAllReduce: the fused gemmReduceScatter path is not chosen at W = 2");
  void* da = upload_bf16(a);
  void* dw = upload_bf16(w);
  void* dc = nullptr;
  const size_t bytes = M * N * 2;
  CUDA_OK(cudaMalloc(&dc, bytes));
  std::vector<__nv_bfloat16> got(M * N);
  for (const int partials : {0, 1, 2}) {
    const std::string what = "large gemmAllReduce (W=" + std::to_string(world) + ") partials " +
                             std::to_string(partials) + ", rank " + std::to_string(rank);
    const bool fused = fused_for(partials);
    CUDA_OK(cudaMemset(dc, 0xFF, bytes));
    try {
      for (int rep = 0; rep < 2; ++rep)
        c.device->gemm_all_reduce(kDesc, DType::kBF16, da, dw, dc, M, N, K, layout_of(0),
                                  partials_of(partials), stream);
      c.device->synchronize();
      CUDA_OK(cudaStreamSynchronize(stream));
    } catch (const std::exception& e) { check(false, what + " threw " + e.what()); }
    CUDA_OK(cudaMemcpy(got.data(), dc, bytes, cudaMemcpyDeviceToHost));
    // bf16 partials: every rank's term rounded, except (fused kernel) the owner's own.
    int64_t bad = 0;
    for (int64_t i = 0; i < M; ++i) {
      const int owner = static_cast<int>(i / (M / world));  // W divides M here
      for (int64_t j = 0; j < N; ++j) {
        float sum = 0;
        for (int r = 0; r < world; ++r) {
          const float term = u(r, i) * h[r][j];
          sum += partials == 1 && !(fused && r == owner) ? bf16_round(term) : term;
        }
        bad += __bfloat162float(got[i * N + j]) != bf16_round(sum);
      }
    }
    check(bad == 0, what + ": " + std::to_string(bad) + " elements wrong");
    const uint64_t mine = fnv1a(reinterpret_cast<const uint8_t*>(got.data()), bytes);
    const auto all = g.all_gather(std::vector<uint8_t>(reinterpret_cast<const uint8_t*>(&mine),
                                                       reinterpret_cast<const uint8_t*>(&mine) + 8));
    for (int r = 0; r < world; ++r) {
      uint64_t theirs = 0;
      std::memcpy(&theirs, all[r].data(), 8);
      check(theirs == mine, what + ": rank " + std::to_string(r) + "'s result differs in its bits");
    }
  }
  for (void* p : {da, dw, dc}) cudaFree(p);
  g.barrier();
  c.close();
  cudaStreamDestroy(stream);
}

// Everything but the large gemmAllReduce, on one runtime with a small data area.
void small_cases(ProcessGroup& g, int H, int L, int gpus, bool shared, uint64_t seed) {
  const int rank = g.rank, world = g.world;
  fusedcomm::RuntimeConfig cfg =
      fusedcomm::testing::loopback_cuda_config(rank % gpus, seed, kTimeoutMs, kSymmetricBytes, shared);
  cfg.chunk_bytes = 1 << 20;
  Runtime rt(cfg);
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  struct Layout {
    const char* name;
    std::vector<int> host_of;
  };
  std::vector<Layout> layouts = {{"blocks", {}}, {"interleaved", {}}};
  for (int r = 0; r < world; ++r) {
    layouts[0].host_of.push_back(r / L);
    layouts[1].host_of.push_back(r % H);
  }
  uint64_t comm_id = 1000;
  for (const Layout& lay : layouts) {
    const std::string name = std::to_string(H) + " x " + std::to_string(L) + " " + lay.name;
    Comm c(rt, g, lay.host_of, ++comm_id);
    check(c.device->layout().hosts == H && c.device->layout().local_world == L,
          name + ": layout of rank " + std::to_string(rank));
    for (const k::CommDtype dt : {k::CommDtype::kF32, k::CommDtype::kBF16}) {
      for (const int64_t count : {int64_t{0}, int64_t{7}, int64_t{1000003}, kLargeCount}) {
        all_reduce_case(*c.device, rank, world, seed ^ count ^ comm_id, dt, count, nullptr, 1, name);
      }
      all_reduce_case(*c.device, rank, world, seed ^ 77 ^ comm_id, dt, 65536 + 3, stream, 20, name);
      for (const k::CommOp op : {k::CommOp::kAllGather, k::CommOp::kReduceScatter, k::CommOp::kAllToAll}) {
        for (const int64_t count : {int64_t{0}, int64_t{7}, int64_t{1000003}}) {
          collective_case(*c.device, op, rank, world, seed ^ count ^ comm_id ^ 3, dt, count, nullptr, 1,
                          name);
        }
        collective_case(*c.device, op, rank, world, seed ^ 78 ^ comm_id, dt, 65536 + 5, stream, 20, name);
      }
    }
    mixed_case(*c.device, rank, world, seed ^ comm_id, stream, name);
    fused_cases(*c.device, g, seed ^ comm_id ^ 0xF, stream, name);
    too_large(*c.device, rank, world, name);
    all_reduce_case(*c.device, rank, world, seed ^ 5 ^ comm_id, k::CommDtype::kF32, 4099, nullptr, 1,
                    name + " after the refusal");
    collective_case(*c.device, k::CommOp::kAllGather, rank, world, seed ^ 6 ^ comm_id, k::CommDtype::kF32,
                    4099, nullptr, 1, name + " after the refusal");
    g.barrier();
    c.close();
  }

  // Every rank on one host: one-shot launches read the input where it lies (LocalCollectives),
  // on the own stream and 20 back to back on a caller stream (launches with no copy between);
  // in place, the input is copied into the data area first.
  if (world <= k::kCommMaxRanks) {
    Comm c(rt, g, std::vector<int>(world, 0), ++comm_id);
    const std::string name = "1 x " + std::to_string(world);
    for (const k::CommDtype dt : {k::CommDtype::kF32, k::CommDtype::kBF16}) {
      for (const k::CommOp op :
           {k::CommOp::kAllReduce, k::CommOp::kAllGather, k::CommOp::kReduceScatter, k::CommOp::kAllToAll}) {
        const uint64_t copies = c.device->input_copies();
        for (const int64_t count : {int64_t{7}, int64_t{4099}, int64_t{30001}}) {
          collective_case(*c.device, op, rank, world, seed ^ count ^ comm_id ^ 11, dt, count, nullptr, 1,
                          name);
        }
        // All one-shot (kAuto picks it up to 256 KiB at any world; these are <= 120 KB): read in
        // place, no copy.
        check(c.device->input_copies() == copies,
              name + ": " + op_name(op) + " copied a one-shot input, rank " + std::to_string(rank));
        collective_case(*c.device, op, rank, world, seed ^ 79 ^ comm_id, dt, 4099, stream, 20, name);
        in_place_case(*c.device, op, rank, world, seed ^ 80 ^ comm_id, dt, 4099, name);
      }
    }
    g.barrier();
    c.close();
  }

  // CUDA graphs, on fresh communicators: across hosts, and (where the world fits one host)
  // every rank on one host.
  for (const bool one_host : {false, true}) {
    if (one_host && world > k::kCommMaxRanks) continue;
    const std::vector<int> host_of = one_host ? std::vector<int>(world, 0) : layouts[0].host_of;
    Comm c(rt, g, host_of, ++comm_id);
    const std::string name =
        one_host ? "1 x " + std::to_string(world) : std::to_string(H) + " x " + std::to_string(L) + " blocks";
    // The fused ops' one-host path as the C API drives it (across hosts: above).
    if (one_host) fused_cases(*c.device, g, seed ^ comm_id ^ 0xF, stream, name);
    graph_case(*c.device, rank, world, seed ^ comm_id, stream, name);
    g.barrier();
    c.close();
  }

  // One fp32 collective of `count` elements in place on a fresh buffer of `elems`, expected to
  // fail: its error's kind and message (kState and "" if it returned), and the seconds it took.
  struct Failure {
    ErrorKind kind = ErrorKind::kState;
    std::string message;
    double seconds = 0;
  };
  auto failure_with = [&](CudaComm& dc, Op op, int64_t count, int64_t elems) {
    Failure f;
    void* buf = nullptr;
    CUDA_OK(cudaMalloc(&buf, elems * 4));
    CUDA_OK(cudaMemset(buf, 0, elems * 4));
    const auto t0 = std::chrono::steady_clock::now();
    try {
      dc.collective(op, DType::kF32, buf, buf, count, nullptr);
    } catch (const Error& e) {
      f.message = e.what();
      f.kind = e.kind();
    }
    f.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    cudaFree(buf);
    return f;
  };
  // A host that never arrives: host 1's ranks skip one allToAll (the error names the op that
  // gave up between hosts).
  {
    const std::vector<int>& host_of = layouts[0].host_of;
    Comm c(rt, g, host_of, ++comm_id);
    const bool late = host_of[rank] == 1;
    if (!late) {
      const auto [kind, message, s] = failure_with(*c.device, Op::kAllToAll, 4096, 4096);
      check(
          kind == ErrorKind::kTimeout && message.find("allToAll [between hosts]") != std::string::npos &&
              message.find("(host 1)") != std::string::npos,
          "missing host: rank " + std::to_string(rank) + " got: " + (message.empty() ? "no error" : message));
      check(s < kTimeoutMs / 1000.0 + 15, "missing host: the timeout took " + std::to_string(s) + " s");
      if (rank == 0) std::printf("  missing host, rank 0 after %.1f s: %s\n", s, message.c_str());
    }
    g.barrier();  // every rank past the failure (Spark: the failed tasks abort the stage)
    c.abort_and_close();
  }
  // A rank that never arrives while the rest of its host does (L >= 2): the last rank skips an
  // allGather. Every other rank gets Error(kTimeout), none a silent result: its counterparts
  // time out between hosts, and the ranks that only wait for them inside a host are told that a
  // peer gave up first (kCommPeerFailed) instead of finishing with its blocks missing.
  if (L >= 2) {
    const std::vector<int>& host_of = layouts[0].host_of;
    Comm c(rt, g, host_of, ++comm_id);
    if (rank != world - 1) {
      const auto [kind, message, s] = failure_with(*c.device, Op::kAllGather, 4096 * world, 4096 * world);
      check(
          kind == ErrorKind::kTimeout &&
              (message.find("(host ") != std::string::npos || message.find("peer ") != std::string::npos),
          "missing rank: rank " + std::to_string(rank) + " got: " + (message.empty() ? "no error" : message));
      check(s < kTimeoutMs / 1000.0 + 15, "missing rank: the error took " + std::to_string(s) + " s");
      std::printf("  missing rank %d, rank %d after %.1f s: %s\n", world - 1, rank, s, message.c_str());
    }
    g.barrier();
    c.abort_and_close();
  }
  // abort() from another thread (a killed task) while host 0's ranks wait for host 1: the wait
  // ends at once with Error(kCommunicator), long before the timeout.
  {
    const std::vector<int>& host_of = layouts[0].host_of;
    Comm c(rt, g, host_of, ++comm_id);
    if (host_of[rank] != 1) {
      void* buf = nullptr;
      CUDA_OK(cudaMalloc(&buf, 4096 * 4));
      CUDA_OK(cudaMemset(buf, 0, 4096 * 4));
      std::thread killer([&] {
        std::this_thread::sleep_for(std::chrono::seconds(1));
        c.device->abort();
      });
      std::string message;
      ErrorKind kind = ErrorKind::kState;
      const auto t0 = std::chrono::steady_clock::now();
      try {
        c.device->collective(Op::kAllReduce, DType::kBF16, buf, buf, 4096, nullptr);
      } catch (const Error& e) {
        message = e.what();
        kind = e.kind();
      }
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      killer.join();
      cudaFree(buf);
      check(kind == ErrorKind::kCommunicator && message.find("abort") != std::string::npos,
            "abort: rank " + std::to_string(rank) + " got: " + (message.empty() ? "no error" : message));
      check(s < 10, "abort: the wait ended after " + std::to_string(s) + " s");
      if (rank == 0) std::printf("  abort, rank 0 after %.1f s: %s\n", s, message.c_str());
    }
    g.barrier();
    c.abort_and_close();
  }
  // The next communicator on the same runtimes works.
  {
    Comm c(rt, g, layouts[0].host_of, ++comm_id);
    all_reduce_case(*c.device, rank, world, seed ^ 99, k::CommDtype::kBF16, 100003, nullptr, 1,
                    "after the missing host");
    g.barrier();
    c.close();
  }
  cudaStreamDestroy(stream);
}

int rank_main(ProcessGroup& g, int H, int L, int gpus, bool shared, uint64_t seed) {
  small_cases(g, H, L, gpus, shared, seed);  // its runtime is gone before the large case's starts
  if (g.world <= k::kCommMaxRanks) large_all_reduce_gemm(g, gpus, shared, seed ^ 0x1A);
  return fusedcomm::testing::rank_result(g.rank);
}

}  // namespace

int main() { return fusedcomm::testing::run_virtual_hosts("gpu_runtime_hosts_test", rank_main); }
