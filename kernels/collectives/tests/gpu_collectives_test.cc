// gpu_collectives_test: the GPU collectives (kernels/collectives.h) over SymmetricMemory, one
// forked process per GPU, handles exchanged through pipes (process_group.h).
//   worlds: 1; every world from 2 to the GPU count (at most 8), on GPUs 0..W-1; with 4 or more
//     GPUs also 3 ranks on GPUs 1,2,3.
//   correctness: every op x {fp32, bf16} x odd/even counts (0, 1, 7, ..., 2M+3, and 1, 7, 1023
//     and 1000003 per rank) x {auto,
//     one-shot, two-phase, two-phase push, pipelined, two-shot}, allReduce in place (direct with
//     the default plan and with few producers / small chunks, two-shot with the default grid
//     and 1, 3 and 7 CTAs, and auto), fp32 reduceScatter with bf16 output
//     (out_bf16; auto, one-shot, two-phase) and its refusal elsewhere, plus the chunk-pipelined variants with
//     few producers and small chunks (many rounds, consumers covering several producers),
//     misaligned input offsets and outputs; fresh random inputs per run
//     (seed printed, FC_TEST_SEED=<n> replays), outputs poisoned (0xFF = NaN) first, every
//     element checked: gathers / all-to-all bit-exact, reductions vs an fp64 reference with
//       fp32 out: |got-ref| <= acc + 1e-6 (|ref| + acc),  bf16 out: <= acc + 2^-8 (|ref| + acc),
//     acc = 2 * terms * 2^-24 * sum|terms| (fp32 accumulation error bound).
//   every one-shot case again with its input outside the data area (CollectiveArgs::input; the
//     data area at that offset poisoned), and that input refused by the other algorithms;
//   1,000 back-to-back launches with no host sync, inputs rewritten on the stream between
//     launches (exact small-integer sums: stale flags or early input reuse would show); for
//     one-shot also with each launch reading its input in place, rewritten just before it by a
//     kernel that lets it start early (launch_delayed_copy, detail/early_launch.h) from one of
//     two alternating sets;
//   CUDA graph capture + 10 replays (two-phase, push, pipelined, direct, two-shot); a rank starting 200 ms late
//     (every algorithm);
//   a rank that never launches: the others time out (1 s) naming rank/peer/op/step, then an
//     abort of a waiting two-phase launch, then a fresh SymmetricMemory works on the same
//     processes;
//   launch mismatch: odd ranks launch another count / op / algorithm / dtype / placement
//     (direct, two-shot) than even ranks at the same epoch: every rank gets Error(kCommunicator)
//     naming both launches (record code kCommLaunchMismatch, a peer of the other parity, both
//     signatures) within 2 s although the timeout is 10 s; then a fresh SymmetricMemory works.
// FC_TEST_WORLDS=<w,...>: only those worlds (gpu_test_support.h).
// FC_TEST_SHARED_GPU=<max world>: every rank on GPU 0, worlds 2..max (gpu_test_support.h:
// protocol and numerics only; the back-to-back loops run 200 launches instead of 1,000).
// FC_TEST_NEW_ALGOS=1: only the chunk-pipelined variants (kTwoPhasePush, kPipelined, kDirect) in every
// section but the dead-rank one, in the worlds above (a quick check for benchmark runs).
// Exit 77 (skip) with a reason where fewer than 2 Hopper GPUs with peer access are visible
// (and the shared-GPU mode is off).
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "fusedcomm/runtime/errors.h"
#include "fusedcomm/runtime/split.h"
#include "fusedcomm/runtime/symmetric_memory.h"
#include "kernels/collectives/collectives.h"
#include "kernels/common/selftest.h"
#include "support/gpu_test_support.h"
#include "support/process_group.h"

namespace {

namespace k = fusedcomm::kernels;
using fusedcomm::Error;
using fusedcomm::ErrorKind;
using fusedcomm::split_count;
using fusedcomm::split_offset;
using fusedcomm::SymmetricConfig;
using fusedcomm::testing::check;
using fusedcomm::testing::g_failed;
using fusedcomm::testing::g_passed;
using fusedcomm::testing::mix;
using fusedcomm::testing::ProcessGroup;

float bf16_round(float f) { return __bfloat162float(__float2bfloat16_rn(f)); }

// Input element i of rank p for one case: uniform in [-1, 1) (integers in [-8, 8] if `ints`),
// representable in the dtype. Every rank can compute every rank's input (the reference).
float input_value(uint64_t key, int p, int64_t i, bool bf16, bool ints) {
  const uint64_t h = mix(key ^ mix(static_cast<uint64_t>(p) * 0x100000001b3ull + i));
  float v = ints ? static_cast<float>(static_cast<int>(h % 17) - 8)
                 : static_cast<float>(static_cast<double>(h >> 11) * 0x1p-53 * 2.0 - 1.0);
  return bf16 ? bf16_round(v) : v;
}

template <typename T>
cudaError_t dmalloc(T** p, size_t n) {
  return cudaMalloc(reinterpret_cast<void**>(p), n);
}

size_t esize(k::CommDtype t) { return t == k::CommDtype::kBF16 ? 2 : 4; }

void to_bytes(const std::vector<float>& v, k::CommDtype t, std::vector<uint8_t>& out) {
  out.resize(v.size() * esize(t));
  if (t == k::CommDtype::kF32) {
    std::memcpy(out.data(), v.data(), out.size());
  } else {
    auto* b = reinterpret_cast<__nv_bfloat16*>(out.data());
    for (size_t i = 0; i < v.size(); ++i) b[i] = __float2bfloat16_rn(v[i]);
  }
}
float from_bytes(const uint8_t* p, k::CommDtype t, int64_t i) {
  if (t == k::CommDtype::kF32) {
    float f;
    std::memcpy(&f, p + i * 4, 4);
    return f;
  }
  __nv_bfloat16 b;
  std::memcpy(&b, p + i * 2, 2);
  return __bfloat162float(b);
}

struct Case {
  k::CommOp op;
  k::CommDtype dtype;
  int64_t count;
  k::CommAlgo algo;
  uint64_t in_offset;   // bytes
  uint64_t out_offset;  // bytes into the output buffer
  bool ints;
  int num_ctas = 0;         // CollectiveArgs::num_ctas
  int64_t chunk_bytes = 0;  // CollectiveArgs::chunk_bytes
  bool out_bf16 = false;    // CollectiveArgs::out_bf16 (reduceScatter of fp32 only)
  bool direct = false;      // CollectiveArgs::input: the input in ordinary device memory
                            // (one-shot), the data area poisoned
  bool in_place = false;    // allReduce: output = the input's place in the data area
};

k::CommDtype out_dtype(const Case& c) { return c.out_bf16 ? k::CommDtype::kBF16 : c.dtype; }

bool g_new_only = false;  // FC_TEST_NEW_ALGOS=1
bool is_new_algo(k::CommAlgo a) {
  return a == k::CommAlgo::kTwoPhasePush || a == k::CommAlgo::kPipelined || a == k::CommAlgo::kDirect ||
         a == k::CommAlgo::kTwoShot;
}

std::string name(const Case& c) {
  return std::string(k::comm_op_name(static_cast<uint32_t>(c.op))) +
         (c.dtype == k::CommDtype::kBF16 ? " bf16" : " f32") + " count=" + std::to_string(c.count) +
         " algo=" + std::to_string(static_cast<int>(c.algo)) + " in_off=" + std::to_string(c.in_offset) +
         " out_off=" + std::to_string(c.out_offset) +
         (c.num_ctas ? " ctas=" + std::to_string(c.num_ctas) : std::string()) +
         (c.chunk_bytes ? " chunk=" + std::to_string(c.chunk_bytes) : std::string()) +
         (c.out_bf16 ? " out=bf16" : "") + (c.direct ? " direct" : "") + (c.in_place ? " in-place" : "");
}

// Host input of rank r for a case.
std::vector<float> make_input(const Case& c, uint64_t key, int W, int r) {
  const int64_t n = k::collective_input_count(c.op, c.count, W, r);
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = input_value(key, r, i, c.dtype == k::CommDtype::kBF16, c.ints);
  return v;
}

// Checks rank r's downloaded output of a case against the fp64 reference. Returns mismatches.
int64_t verify(const Case& c, uint64_t key, int W, int r, const uint8_t* got) {
  const bool bf = c.dtype == k::CommDtype::kBF16;           // inputs
  const bool bf_out = out_dtype(c) == k::CommDtype::kBF16;  // output (rounding tolerance)
  const int64_t n_out = k::collective_output_count(c.op, c.count, W, r);
  int64_t bad = 0;
  auto exact = [&](int64_t i, float ref) {
    const float g = from_bytes(got, c.dtype, i);
    uint32_t gb, rb;
    std::memcpy(&gb, &g, 4);
    std::memcpy(&rb, &ref, 4);
    if (gb != rb && bad++ < 3) {
      std::fprintf(stderr, "  rank %d %s: out[%lld] = %g, expected %g\n", r, name(c).c_str(),
                   static_cast<long long>(i), g, ref);
    }
  };
  auto reduced = [&](int64_t i, int64_t src_index) {
    double ref = 0, mag = 0;
    for (int p = 0; p < W; ++p) {
      const double x = input_value(key, p, src_index, bf, c.ints);
      ref += x;
      mag += std::fabs(x);
    }
    const double acc = 2.0 * W * 0x1p-24 * mag;
    const double tol = acc + (bf_out ? 0x1p-8 : 1e-6) * (std::fabs(ref) + acc);
    const double g = from_bytes(got, out_dtype(c), i);
    if (!(std::fabs(g - ref) <= tol) && bad++ < 3) {
      std::fprintf(stderr, "  rank %d %s: out[%lld] = %.8g, expected %.8g (tol %.3g)\n", r, name(c).c_str(),
                   static_cast<long long>(i), g, ref, tol);
    }
  };
  switch (c.op) {
    case k::CommOp::kAllGather:
      for (int p = 0; p < W; ++p) {
        const int64_t off = split_offset(c.count, W, p), n = split_count(c.count, W, p);
        for (int64_t i = 0; i < n; ++i) exact(off + i, input_value(key, p, i, bf, c.ints));
      }
      break;
    case k::CommOp::kAllToAll: {
      const int64_t n = split_count(c.count, W, r), src_off = split_offset(c.count, W, r);
      for (int p = 0; p < W; ++p)
        for (int64_t i = 0; i < n; ++i) exact(p * n + i, input_value(key, p, src_off + i, bf, c.ints));
      break;
    }
    case k::CommOp::kReduceScatter: {
      const int64_t off = split_offset(c.count, W, r);
      for (int64_t i = 0; i < n_out; ++i) reduced(i, off + i);
      break;
    }
    case k::CommOp::kAllReduce:
      for (int64_t i = 0; i < n_out; ++i) reduced(i, i);
      break;
  }
  return bad;
}

struct Rank : fusedcomm::testing::SymmetricRank {
  uint8_t* out = nullptr;  // output buffer
  size_t out_cap = 0;
  uint8_t* in_direct = nullptr;  // inputs of Case::direct (at in_offset), out_cap bytes

  using SymmetricRank::SymmetricRank;

  void upload(const Case& c, uint64_t key, uint8_t* dst) {
    std::vector<uint8_t> bytes;
    to_bytes(make_input(c, key, W, r), c.dtype, bytes);
    // On the test's stream and complete on return: cudaMemcpy from pageable memory may return
    // before its DMA lands, and does not order the non-blocking stream the kernels run on.
    CUDA_OK(cudaMemcpyAsync(dst, bytes.data(), bytes.size(), cudaMemcpyHostToDevice, stream));
    CUDA_OK(cudaStreamSynchronize(stream));
  }

  k::CollectiveArgs args(const Case& c, void* output) const {
    k::CollectiveArgs a;
    a.op = c.op;
    a.dtype = c.dtype;
    a.count = c.count;
    a.in_offset = c.in_offset;
    a.output = output;
    a.algo = c.algo;
    a.num_ctas = c.num_ctas;
    a.chunk_bytes = c.chunk_bytes;
    a.out_bf16 = c.out_bf16;
    if (c.direct) a.input = in_direct + c.in_offset;
    if (c.in_place) a.output = data_at(c.in_offset);
    return a;
  }

  uint8_t* data_at(uint64_t offset) const { return static_cast<uint8_t*>(sm->data()) + offset; }

  // One case, synchronously: upload, poison, launch, sync, check.
  void run_case(const Case& c, uint64_t key) {
    uint8_t* data_in = data_at(c.in_offset);
    if (c.direct) {
      const size_t in_bytes = k::collective_input_count(c.op, c.count, W, r) * esize(c.dtype);
      CUDA_OK(cudaMemsetAsync(data_in, 0xFF, in_bytes, stream));  // a read there shows as NaN
    }
    upload(c, key, c.direct ? in_direct + c.in_offset : data_in);
    const size_t out_bytes = k::collective_output_count(c.op, c.count, W, r) * esize(out_dtype(c));
    // In place: the output is the input itself; the 64 bytes after it are poisoned instead.
    uint8_t* const result = c.in_place ? data_in : out + c.out_offset;
    if (c.in_place) {
      CUDA_OK(cudaMemsetAsync(data_in + out_bytes, 0xFF, 64, stream));
    } else {
      CUDA_OK(cudaMemsetAsync(out, 0xFF, out_bytes + c.out_offset + 64, stream));
    }
    g.barrier();  // inputs everywhere are ready before anyone could read them twice... (not
                  // needed by the protocol; keeps cases from overlapping in the log)
    CUDA_OK(k::launch_collective(sm->device(), args(c, out + c.out_offset), stream));
    CUDA_OK(cudaStreamSynchronize(stream));
    sm->raise_if_failed();
    std::vector<uint8_t> got(out_bytes + 64);
    CUDA_OK(cudaMemcpy(got.data(), result, out_bytes + 64, cudaMemcpyDeviceToHost));
    int64_t bad = verify(c, key, W, r, got.data());
    // Nothing written past the end.
    for (size_t i = out_bytes; i < out_bytes + 64; ++i) bad += got[i] != 0xFF;
    check(bad == 0, "rank " + std::to_string(r) + " " + name(c) + ": " + std::to_string(bad) + " bad");
  }

  void correctness() {
    // out_bf16 is refused (before any launch) outside fp32 reduceScatter one-shot / two-phase.
    for (const Case& c :
         {Case{k::CommOp::kAllReduce, k::CommDtype::kF32, 1000, k::CommAlgo::kAuto, 0, 0, false, 0, 0, true},
          Case{k::CommOp::kReduceScatter, k::CommDtype::kBF16, 1000, k::CommAlgo::kAuto, 0, 0, false, 0, 0,
               true},
          Case{k::CommOp::kReduceScatter, k::CommDtype::kF32, 1000, k::CommAlgo::kTwoPhasePush, 0, 0, false,
               0, 0, true},
          // An input outside the data area is refused outside one-shot.
          Case{k::CommOp::kAllGather, k::CommDtype::kBF16, 1000, k::CommAlgo::kTwoPhase, 0, 0, false, 0, 0,
               false, true},
          Case{k::CommOp::kAllReduce, k::CommDtype::kF32, 1000, k::CommAlgo::kPipelined, 0, 0, false, 0, 0,
               false, true},
          // Direct: allReduce in place only.
          Case{k::CommOp::kAllReduce, k::CommDtype::kBF16, 1000, k::CommAlgo::kDirect, 0, 0, false},
          Case{k::CommOp::kAllGather, k::CommDtype::kBF16, 1000, k::CommAlgo::kDirect, 0, 0, false, 0, 0,
               false, false, true}}) {
      check(k::launch_collective(sm->device(), args(c, out), stream) == cudaErrorInvalidValue,
            "rank " + std::to_string(r) + " refuses " + name(c));
    }
    // Totals, and per-rank counts of 1, 7, 1023 and 1000003 (segments at every offset from the
    // 16-byte grid: the vector bodies' heads and tails).
    const int64_t counts[] = {0,      1,      7,       8L * W - 1, 1000,       4099,          65536,
                              131075, 300001, 2000003, int64_t{W}, 7L * W + 1, 1023L * W + 3, 1000003L * W};
    uint64_t case_id = 0;
    for (k::CommOp op :
         {k::CommOp::kAllReduce, k::CommOp::kAllGather, k::CommOp::kReduceScatter, k::CommOp::kAllToAll}) {
      for (k::CommDtype dt : {k::CommDtype::kF32, k::CommDtype::kBF16}) {
        for (int64_t n : counts) {
          for (k::CommAlgo algo :
               {k::CommAlgo::kAuto, k::CommAlgo::kOneShot, k::CommAlgo::kTwoPhase, k::CommAlgo::kTwoPhasePush,
                k::CommAlgo::kPipelined, k::CommAlgo::kTwoShot}) {
            ++case_id;
            if (g_new_only && !is_new_algo(algo)) continue;
            Case c{op, dt, n, algo, (case_id % 3 == 1) ? 4u : 0u, (case_id % 4 == 2) ? 4u : 0u, false};
            if (algo == k::CommAlgo::kOneShot && W > 1) {
              const int64_t payload = (op == k::CommOp::kAllReduce ? n : split_count(n, W, 0)) * esize(dt);
              if (payload > static_cast<int64_t>(sm->device().slot_bytes)) continue;
            }
            run_case(c, mix(seed ^ case_id));
            if (algo == k::CommAlgo::kOneShot) {  // the same with its input outside the data area
              c.direct = true;
              run_case(c, mix(seed ^ case_id ^ 0xD1EC7));
            }
          }
        }
        // reduceScatter of fp32 partials written as bf16 (the decomposed gemmReduceScatter's
        // path): the vector path, and the scalar one where out_offset leaves the output only
        // 4-byte aligned.
        if (op == k::CommOp::kReduceScatter && dt == k::CommDtype::kF32) {
          for (int64_t n : counts) {
            for (k::CommAlgo algo : {k::CommAlgo::kAuto, k::CommAlgo::kOneShot, k::CommAlgo::kTwoPhase}) {
              ++case_id;
              if (g_new_only) continue;
              Case c{op,    dt, n, algo, (case_id % 3 == 1) ? 4u : 0u, (case_id % 4 == 2) ? 4u : 0u,
                     false, 0,  0, true};
              if (algo == k::CommAlgo::kOneShot && W > 1 &&
                  split_count(n, W, 0) * 4 > static_cast<int64_t>(sm->device().slot_bytes)) {
                continue;
              }
              run_case(c, mix(seed ^ case_id));
            }
          }
        }
        // allReduce in place: direct (default plan, few producers / small chunks: many rounds,
        // reducers covering several producers), and kAuto in place (direct where enabled).
        if (op == k::CommOp::kAllReduce) {
          for (int64_t n : counts) {
            for (const auto& pc : {std::pair<int, int64_t>{0, 0}, {1, 4096}, {5, 1024}, {3, 96 << 10}}) {
              ++case_id;
              Case c{op,    dt,       n,        k::CommAlgo::kDirect, (case_id % 3 == 1) ? 4u : 0u, 0,
                     false, pc.first, pc.second};
              c.in_place = true;
              run_case(c, mix(seed ^ case_id));
            }
            // Two-shot in place: the default grid, one CTA, and grids that split the slices
            // unevenly (heads and tails in the first and last CTA's shares).
            for (int ctas : {0, 1, 3, 7}) {
              ++case_id;
              Case t{op, dt, n, k::CommAlgo::kTwoShot, (case_id % 3 == 1) ? 4u : 0u, 0, false, ctas};
              t.in_place = true;
              run_case(t, mix(seed ^ case_id));
            }
            ++case_id;
            if (g_new_only) continue;
            Case c{op, dt, n, k::CommAlgo::kAuto, (case_id % 3 == 1) ? 4u : 0u, 0, false};
            c.in_place = true;
            run_case(c, mix(seed ^ case_id));
          }
        }
        // Chunk-pipelined variants with few producers and small chunks: many rounds per
        // producer, consumers covering several producers, uneven last rounds.
        for (int64_t n : {int64_t{4099}, int64_t{300001}, int64_t{2000003}}) {
          for (k::CommAlgo algo :
               {k::CommAlgo::kTwoPhasePush, k::CommAlgo::kPipelined, k::CommAlgo::kTwoShot}) {
            for (const auto& pc : {std::pair<int, int64_t>{1, 4096}, {5, 1024}, {3, 96 << 10}}) {
              ++case_id;
              Case c{
                  op,    dt,       n,        algo, (case_id % 3 == 1) ? 4u : 0u, (case_id % 4 == 2) ? 4u : 0u,
                  false, pc.first, pc.second};
              run_case(c, mix(seed ^ case_id));
            }
          }
        }
      }
    }
  }

  // 1,000 launches, no host sync; the input is rewritten on the stream before each launch from
  // a pool of K device-resident inputs; outputs rotate over K buffers; check the last K.
  // direct (one-shot): each launch reads its pool input where it lies (CollectiveArgs::input),
  // rewritten before it by a kernel that lets the launch start early and writes 20 us later
  // (launch_delayed_copy), from one of two source sets that alternate every K launches: a
  // launch that read its input before that kernel completed would see the other set's values.
  void back_to_back(int64_t count, k::CommAlgo algo, bool direct = false, bool all_reduce_in_place = false) {
    constexpr int K = 4;
    const int kIters = fusedcomm::testing::shared_gpu_scale(1000);
    const k::CommDtype dt = k::CommDtype::kF32;
    // Direct (allReduce in place): every launch an allReduce, its result copied out of the
    // data area on the stream (the next launch's input copy follows it).
    const bool in_place = algo == k::CommAlgo::kDirect || all_reduce_in_place;
    const k::CommOp ops[2] = {k::CommOp::kAllReduce,
                              in_place ? k::CommOp::kAllReduce : k::CommOp::kAllGather};
    std::vector<uint8_t*> pool(K), outs(K), alt(K);
    const size_t in_bytes = count * 4;
    auto key = [&](int j, int set) { return mix(seed ^ ((set ? 0xB2C000 : 0xB2B000) + j)); };
    for (int j = 0; j < K; ++j) {
      CUDA_OK(dmalloc(&pool[j], in_bytes));
      CUDA_OK(dmalloc(&outs[j], in_bytes + 64));
      CUDA_OK(cudaMemsetAsync(outs[j], 0xFF, in_bytes + 64, stream));
      Case c{ops[j % 2], dt, count, algo, 0, 0, true};
      upload(c, key(j, 0), pool[j]);
      if (direct) {
        CUDA_OK(dmalloc(&alt[j], 2 * in_bytes));  // set 0, then set 1
        CUDA_OK(cudaMemcpyAsync(alt[j], pool[j], in_bytes, cudaMemcpyDeviceToDevice, stream));
        upload(c, key(j, 1), alt[j] + in_bytes);
      }
    }
    g.barrier();
    for (int i = 0; i < kIters; ++i) {
      const int j = i % K;
      Case c{ops[j % 2], dt, count, algo, 0, 0, true};
      c.in_place = in_place;
      const size_t n_in = k::collective_input_count(c.op, count, W, r) * 4;
      k::CollectiveArgs a = args(c, outs[j]);
      if (direct) {
        const int set = (i / K) % 2;
        CUDA_OK(k::launch_delayed_copy(alt[j] + set * in_bytes, pool[j], n_in, 20000, stream));
        a.input = pool[j];
      } else {
        CUDA_OK(cudaMemcpyAsync(sm->data(), pool[j], n_in, cudaMemcpyDeviceToDevice, stream));
      }
      CUDA_OK(k::launch_collective(sm->device(), a, stream));
      if (in_place) CUDA_OK(cudaMemcpyAsync(outs[j], sm->data(), n_in, cudaMemcpyDeviceToDevice, stream));
    }
    CUDA_OK(cudaStreamSynchronize(stream));
    sm->raise_if_failed();
    for (int j = 0; j < K; ++j) {
      Case c{ops[j % 2], dt, count, algo, 0, 0, true};
      std::vector<uint8_t> got(in_bytes);
      CUDA_OK(cudaMemcpy(got.data(), outs[j], in_bytes, cudaMemcpyDeviceToHost));
      const int i_last = (kIters - 1 - j) / K * K + j;  // the last launch that used j
      const int64_t bad = verify(c, key(j, direct ? (i_last / K) % 2 : 0), W, r, got.data());
      check(bad == 0, "rank " + std::to_string(r) + " back-to-back x" + std::to_string(kIters) + " " +
                          name(c) + (direct ? " direct" : ""));
      cudaFree(pool[j]);
      cudaFree(outs[j]);
      if (direct) cudaFree(alt[j]);
    }
  }

  // Capture [copy input; allReduce one-shot; copy input; `big_op` `big_algo`] x2, replay 10x.
  void graph(k::CommOp big_op = k::CommOp::kAllGather, k::CommAlgo big_algo = k::CommAlgo::kTwoPhase) {
    const int64_t n_small = 3001, n_big = 1000003;
    Case cs{k::CommOp::kAllReduce, k::CommDtype::kF32, n_small, k::CommAlgo::kOneShot, 0, 0, true};
    Case cb{big_op, k::CommDtype::kBF16, n_big, big_algo, 0, 0, false};
    cb.in_place = big_algo == k::CommAlgo::kDirect;  // its result copied out after each launch
    uint8_t *ps, *pb, *os, *ob;
    const size_t nb_out = k::collective_output_count(cb.op, n_big, W, r) * 2;
    CUDA_OK(dmalloc(&ps, n_small * 4));
    CUDA_OK(dmalloc(&pb, n_big * 2));
    CUDA_OK(dmalloc(&os, n_small * 4));
    CUDA_OK(dmalloc(&ob, nb_out));
    upload(cs, mix(seed ^ 0x6A0), ps);
    upload(cb, mix(seed ^ 0x6A1), pb);
    const size_t nb_in = k::collective_input_count(cb.op, n_big, W, r) * 2;
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    for (int rep = 0; rep < 2; ++rep) {
      CUDA_OK(cudaMemcpyAsync(sm->data(), ps, n_small * 4, cudaMemcpyDeviceToDevice, stream));
      CUDA_OK(k::launch_collective(sm->device(), args(cs, os), stream));
      CUDA_OK(cudaMemcpyAsync(sm->data(), pb, nb_in, cudaMemcpyDeviceToDevice, stream));
      CUDA_OK(k::launch_collective(sm->device(), args(cb, ob), stream));
      if (cb.in_place) CUDA_OK(cudaMemcpyAsync(ob, sm->data(), nb_out, cudaMemcpyDeviceToDevice, stream));
    }
    CUDA_OK(cudaStreamEndCapture(stream, &graph));
    CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    CUDA_OK(cudaMemsetAsync(os, 0xFF, n_small * 4, stream));
    CUDA_OK(cudaMemsetAsync(ob, 0xFF, nb_out, stream));
    g.barrier();
    for (int i = 0; i < 10; ++i) CUDA_OK(cudaGraphLaunch(exec, stream));
    CUDA_OK(cudaStreamSynchronize(stream));
    sm->raise_if_failed();
    std::vector<uint8_t> got(n_big * 2);
    CUDA_OK(cudaMemcpy(got.data(), os, n_small * 4, cudaMemcpyDeviceToHost));
    check(verify(cs, mix(seed ^ 0x6A0), W, r, got.data()) == 0, "graph replay " + name(cs));
    CUDA_OK(cudaMemcpy(got.data(), ob, nb_out, cudaMemcpyDeviceToHost));
    check(verify(cb, mix(seed ^ 0x6A1), W, r, got.data()) == 0, "graph replay " + name(cb));
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaFree(ps);
    cudaFree(pb);
    cudaFree(os);
    cudaFree(ob);
  }

  // kAuto's push allReduce (W = 2 from 256 MiB): the algorithm it resolves to, and 256 MiB
  // launches in bf16 and fp32 checked element by element, in a memory of its own.
  void large_auto_all_reduce() {
    if (W != 2) return;
    const int64_t bytes = int64_t{256} << 20;
    SymmetricConfig cfg;
    cfg.data_bytes = static_cast<uint64_t>(bytes) + 4096;
    open(cfg);
    uint8_t* big = nullptr;
    CUDA_OK(dmalloc(&big, static_cast<size_t>(bytes) + 4096));
    uint64_t id = 0;
    for (k::CommDtype dt : {k::CommDtype::kBF16, k::CommDtype::kF32}) {
      const Case c{k::CommOp::kAllReduce,
                   dt,
                   bytes / static_cast<int64_t>(esize(dt)),
                   k::CommAlgo::kAuto,
                   0,
                   0,
                   false};
      check(k::collective_choose_algo(sm->device(), args(c, big)) == k::CommAlgo::kTwoPhasePush,
            "rank " + std::to_string(r) + " " + name(c) + ": kAuto picks the push allReduce");
      std::swap(out, big);
      run_case(c, mix(seed ^ (0x4C41 + ++id)));
      std::swap(out, big);
    }
    cudaFree(big);
    open(SymmetricConfig{});
  }

  // The last rank launches 200 ms after the others.
  void late_rank() {
    for (k::CommAlgo algo : {k::CommAlgo::kOneShot, k::CommAlgo::kTwoPhase, k::CommAlgo::kTwoPhasePush,
                             k::CommAlgo::kPipelined, k::CommAlgo::kDirect, k::CommAlgo::kTwoShot}) {
      if (g_new_only && !is_new_algo(algo)) continue;
      Case c{k::CommOp::kAllReduce, k::CommDtype::kBF16, 70001, algo, 0, 0, false};
      c.in_place = algo == k::CommAlgo::kDirect;
      const uint64_t key = mix(seed ^ (0x1A7E + static_cast<int>(algo)));
      upload(c, key, static_cast<uint8_t*>(sm->data()));
      CUDA_OK(cudaMemsetAsync(out, 0xFF, c.count * 2, stream));
      g.barrier();
      if (r == W - 1) std::this_thread::sleep_for(std::chrono::milliseconds(200));
      CUDA_OK(k::launch_collective(sm->device(), args(c, out), stream));
      CUDA_OK(cudaStreamSynchronize(stream));
      sm->raise_if_failed();
      std::vector<uint8_t> got(c.count * 2);
      CUDA_OK(cudaMemcpy(got.data(), c.in_place ? data_at(0) : out, got.size(), cudaMemcpyDeviceToHost));
      check(verify(c, key, W, r, got.data()) == 0, "late rank " + name(c));
    }
  }

  // Odd ranks launch another count / op / algorithm / dtype than even ranks at the same
  // epoch. Every rank must get Error(kCommunicator) naming both launches, well before the
  // timeout (10 s here): from the fast check after the first flags, or from a wait's slow check
  // when the peer's protocol never raises the awaited flag. Then a fresh memory works.
  void mismatch() {
    const auto F = k::CommDtype::kF32, B = k::CommDtype::kBF16;
    const auto AR = k::CommOp::kAllReduce, AG = k::CommOp::kAllGather, RS = k::CommOp::kReduceScatter;
    struct Pair {
      Case even, odd;
      const char* what;
    };
    const Pair pairs[] = {
        {{AR, F, 1000, k::CommAlgo::kOneShot, 0, 0, true},
         {AR, F, 2000, k::CommAlgo::kOneShot, 0, 0, true},
         "count (one-shot)"},
        {{AR, B, 1 << 20, k::CommAlgo::kTwoPhase, 0, 0, false},
         {AG, B, 1 << 20, k::CommAlgo::kTwoPhase, 0, 0, false},
         "op (two-phase)"},
        {{AR, F, 4096, k::CommAlgo::kOneShot, 0, 0, true},
         {AR, F, 4096, k::CommAlgo::kTwoPhase, 0, 0, true},
         "algorithm (one-shot vs two-phase)"},
        {{RS, B, 300001, k::CommAlgo::kTwoPhasePush, 0, 0, false},
         {RS, F, 300001, k::CommAlgo::kTwoPhasePush, 0, 0, false},
         "dtype (push)"},
        // The even ranks in place (direct), the odd ones not.
        {{AR, B, 1 << 20, k::CommAlgo::kDirect, 0, 0, false, 0, 0, false, false, true},
         {AR, B, 1 << 20, k::CommAlgo::kTwoPhase, 0, 0, false},
         "in place (direct vs two-phase)"},
        // Two-shot: both sides pass the handshakes (same grid, same tags); CTA 0 compares the
        // signatures at the end handshake.
        {{AR, B, 1 << 20, k::CommAlgo::kTwoShot, 0, 0, false},
         {AR, F, 1 << 20, k::CommAlgo::kTwoShot, 0, 0, false},
         "dtype (two-shot)"},
        {{AR, B, 1 << 20, k::CommAlgo::kTwoShot, 0, 0, false, 0, 0, false, false, true},
         {AR, B, 1 << 20, k::CommAlgo::kTwoShot, 0, 0, false},
         "in place (two-shot in place vs not)"},
    };
    // The signature's algorithm field (an in-place two-shot signs apart from an out-of-place one).
    auto sig_algo = [](const Case& c) {
      return c.algo == k::CommAlgo::kTwoShot && c.in_place ? k::kSigAlgoTwoShotInPlace
                                                           : static_cast<uint32_t>(c.algo);
    };
    SymmetricConfig cfg;
    cfg.data_bytes = 16 << 20;
    cfg.timeout_ns = 10ull * 1000 * 1000 * 1000;
    uint64_t id = 0;
    for (const Pair& p : pairs) {
      open(cfg);
      const Case& c = r % 2 == 0 ? p.even : p.odd;
      const Case& other = r % 2 == 0 ? p.odd : p.even;
      upload(c, mix(seed ^ (0x313A + ++id)), static_cast<uint8_t*>(sm->data()));
      g.barrier();
      const auto t0 = std::chrono::steady_clock::now();
      CUDA_OK(k::launch_collective(sm->device(), args(c, out), stream));
      CUDA_OK(cudaStreamSynchronize(stream));  // returns: no hang
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const std::string who = "rank " + std::to_string(r) + " mismatch " + p.what;
      const k::CommErrorRecord rec = fusedcomm::testing::expect_launch_mismatch(*sm, r, W, who, s, 2.0);
      check(k::comm_sig_op(rec.launch_sig) == static_cast<uint32_t>(c.op) &&
                k::comm_sig_size(rec.launch_sig) == static_cast<uint64_t>(c.count) &&
                k::comm_sig_dtype(rec.launch_sig) == static_cast<uint32_t>(c.dtype) &&
                k::comm_sig_algo(rec.launch_sig) == sig_algo(c) &&
                k::comm_sig_op(rec.observed) == static_cast<uint32_t>(other.op) &&
                k::comm_sig_size(rec.observed) == static_cast<uint64_t>(other.count) &&
                k::comm_sig_dtype(rec.observed) == static_cast<uint32_t>(other.dtype) &&
                k::comm_sig_algo(rec.observed) == sig_algo(other) && k::comm_sig_epoch8(rec.observed) == 1 &&
                k::comm_sig_epoch8(rec.launch_sig) == 1,
            who + ": record holds both launches' signatures");
    }
    open(SymmetricConfig{});
    run_case(Case{AR, B, 100003, k::CommAlgo::kAuto, 0, 0, false}, mix(seed ^ 0x313F));
  }

  // The last rank never launches: the others time out; then an abort; then a fresh memory.
  void dead_rank() {
    SymmetricConfig cfg;
    cfg.data_bytes = 16 << 20;
    cfg.timeout_ns = 1000ull * 1000 * 1000;  // 1 s
    open(cfg);
    Case c{k::CommOp::kAllReduce, k::CommDtype::kF32, 1000, k::CommAlgo::kOneShot, 0, 0, false};
    if (r != W - 1) {
      const auto t0 = std::chrono::steady_clock::now();
      CUDA_OK(k::launch_collective(sm->device(), args(c, out), stream));
      CUDA_OK(cudaStreamSynchronize(stream));  // returns: the kernel gave up, no hang
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const std::optional<Error> e = fusedcomm::testing::raised(*sm);
      const bool threw = e && e->kind() == ErrorKind::kTimeout;
      if (e && r == 0) std::printf("  rank 0 got the expected timeout after %.2f s: %s\n", s, e->what());
      const k::CommErrorRecord rec = sm->error();
      check(threw, "rank " + std::to_string(r) + ": dead peer -> Error(kTimeout)");
      check(rec.code == k::kGemmWaitTimeout && rec.rank == static_cast<uint32_t>(r) &&
                rec.peer == static_cast<uint32_t>(W - 1) &&
                rec.op == static_cast<uint32_t>(k::CommOp::kAllReduce) && rec.step == k::kCommStepReady &&
                rec.epoch == 1,
            "rank " + std::to_string(r) + ": error record names rank/peer/op/step (got rank " +
                std::to_string(rec.rank) + " peer " + std::to_string(rec.peer) + " op " +
                std::to_string(rec.op) + " step " + std::to_string(rec.step) + ")");
      check(s > 0.9 && s < 5.0, "timeout took " + std::to_string(s) + " s (configured 1 s)");
      check(cudaGetLastError() == cudaSuccess, "the CUDA context survives a timeout");
    }
    // Abort: a two-phase launch waiting for the dead rank is stopped by the abort word.
    cfg.timeout_ns = 0;
    open(cfg);
    if (r != W - 1) {
      Case ca{k::CommOp::kAllGather, k::CommDtype::kBF16, 1 << 20, k::CommAlgo::kTwoPhase, 0, 0, false};
      const auto t0 = std::chrono::steady_clock::now();
      CUDA_OK(k::launch_collective(sm->device(), args(ca, out), stream));
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      sm->abort();
      CUDA_OK(cudaStreamSynchronize(stream));
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const std::optional<Error> e = fusedcomm::testing::raised(*sm);
      const bool threw = e && e->kind() == ErrorKind::kCommunicator &&
                         std::string(e->what()).find("abort") != std::string::npos;
      if (e && r == 0) std::printf("  rank 0 got the expected abort after %.2f s: %s\n", s, e->what());
      const k::CommErrorRecord rec = sm->error();
      check(threw && rec.code == k::kGemmAborted && rec.step == k::kCommStepArrive &&
                rec.peer == static_cast<uint32_t>(W - 1) && s < 3.0,
            "rank " + std::to_string(r) + ": abort stops a waiting launch");
    }
    // A fresh symmetric memory on the same processes works.
    open(SymmetricConfig{});
    for (k::CommAlgo algo : {k::CommAlgo::kOneShot, k::CommAlgo::kTwoPhase}) {
      run_case(Case{k::CommOp::kAllReduce, k::CommDtype::kBF16, 100003, algo, 0, 0, false},
               mix(seed ^ (0xF2E5 + static_cast<int>(algo))));
    }
  }
};

int rank_main(ProcessGroup& g, const std::vector<int>& gpus, uint64_t seed, bool full) {
  CUDA_OK(cudaSetDevice(gpus[g.rank]));
  Rank R(g, seed);
  CUDA_OK(cudaStreamCreateWithFlags(&R.stream, cudaStreamNonBlocking));
  R.out_cap = 64 << 20;
  CUDA_OK(dmalloc(&R.out, R.out_cap));
  CUDA_OK(dmalloc(&R.in_direct, R.out_cap));
  SymmetricConfig cfg;
  cfg.data_bytes = 32 << 20;
  R.open(cfg);
  if (g.rank == 0) std::printf("%s\n", R.sm->describe().c_str());
  const auto t0 = std::chrono::steady_clock::now();
  R.correctness();
  const double t_corr = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (full) {
    if (!g_new_only) {
      R.back_to_back(5000, k::CommAlgo::kOneShot);
      R.back_to_back(5000, k::CommAlgo::kOneShot, true);
      R.back_to_back(1 << 20, k::CommAlgo::kTwoPhase);
      R.graph();
    }
    R.back_to_back(1 << 20, k::CommAlgo::kTwoPhasePush);
    R.back_to_back(1 << 20, k::CommAlgo::kPipelined);
    R.graph(k::CommOp::kAllReduce, k::CommAlgo::kTwoPhasePush);
    R.graph(k::CommOp::kReduceScatter, k::CommAlgo::kTwoPhasePush);
    R.graph(k::CommOp::kAllReduce, k::CommAlgo::kPipelined);
    R.back_to_back(1 << 20, k::CommAlgo::kDirect);
    R.graph(k::CommOp::kAllReduce, k::CommAlgo::kDirect);
    R.back_to_back(1 << 20, k::CommAlgo::kTwoShot);
    R.back_to_back(1 << 20, k::CommAlgo::kTwoShot, false, true);
    R.back_to_back(5000, k::CommAlgo::kTwoShot, false, true);
    R.graph(k::CommOp::kAllReduce, k::CommAlgo::kTwoShot);
    R.large_auto_all_reduce();
    R.late_rank();
    if (g.world > 1 && !g_new_only) R.dead_rank();
    if (g.world > 1 && !g_new_only) R.mismatch();
  }
  R.sm.reset();
  cudaFree(R.out);
  cudaFree(R.in_direct);
  std::printf("  rank %d: %d passed, %d failed (correctness sweep %.1f s)\n", g.rank, g_passed, g_failed,
              t_corr);
  return g_failed == 0 ? 0 : 1;
}

}  // namespace

int main() {
  const int shared = fusedcomm::testing::shared_gpu_world();
  const int n = fusedcomm::testing::peer_gpus_or_skip("gpu_collectives_test", shared);
  if (n == 0) return 77;
  if (const char* s = std::getenv("FC_TEST_NEW_ALGOS")) g_new_only = std::atoi(s) != 0;
  const uint64_t seed = fusedcomm::testing::test_seed("gpu_collectives_test", n);
  struct Config {
    std::vector<int> gpus;
    bool full;
  };
  // Every world from 2 to the GPU count (at most kCommMaxRanks), on GPUs 0..w-1; with 4 or
  // more GPUs also 3 ranks on GPUs 1, 2, 3 (a world that does not start at GPU 0).
  std::vector<Config> configs = {{{0}, false}};
  for (int w = 2; w <= std::min(n, k::kCommMaxRanks); ++w) {
    std::vector<int> gpus(w);
    for (int i = 0; i < w; ++i) gpus[i] = i;
    configs.push_back({gpus, true});
  }
  if (n >= 4 && !g_new_only) configs.push_back({{1, 2, 3}, true});
  if (shared > 0) {  // every rank on GPU 0 (time-sliced): see gpu_test_support.h
    fusedcomm::testing::g_shared_gpu = true;
    configs = {{{0}, false}};
    for (int w = 2; w <= std::min(shared, k::kCommMaxRanks); ++w) {
      configs.push_back({std::vector<int>(w, 0), true});
    }
  }
  int failed = 0;
  for (const Config& c : configs) {
    if (!fusedcomm::testing::test_world_selected(static_cast<int>(c.gpus.size()))) continue;
    std::string list;
    for (int gpu : c.gpus) {
      if (!list.empty()) list += ',';
      list += std::to_string(gpu);
    }
    std::printf("== world %zu on GPUs %s (%s)\n", c.gpus.size(), list.c_str(),
                c.full ? "all tests" : "correctness sweep");
    std::fflush(stdout);
    const auto t0 = std::chrono::steady_clock::now();
    const int f = fusedcomm::testing::run_processes(
        static_cast<int>(c.gpus.size()), [&](ProcessGroup& g) { return rank_main(g, c.gpus, seed, c.full); },
        240);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("== world %zu on GPUs %s: %s (%.1f s)\n", c.gpus.size(), list.c_str(),
                f == 0 ? "PASS" : "FAIL", s);
    failed += f;
  }
  std::printf(failed == 0 ? "gpu_collectives_test: PASS\n" : "gpu_collectives_test: FAIL\n");
  return failed == 0 ? 0 : 1;
}
