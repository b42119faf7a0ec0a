// capi_test: the C API (fusedcomm/fusedcomm.h) on the host backend, as a C caller sees it: a
// status for every call and the detail in fc_last_error_message() (per thread); a closed
// (null) handle, a null output pointer, out-of-range enum values and sizes whose byte count
// overflows refused; a runtime and a one-rank communicator over the socket transport running a
// collective, a GEMM, describe_fused and an MoE round trip with the results checked; the
// single-rank attention op and its backward; ring attention and its backward over 1-4 runtimes
// of this process in both sequence layouts against them; the teardown verbs; and libfusedcomm.so
// exporting the C API and the JNI entries. Host code only: runs everywhere.
#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "fusedcomm/fusedcomm.h"
#include "fusedcomm/host/host_ops.h"
#include "fusedcomm/rdma/transport.h"
#include "support/check.h"

namespace {

using fusedcomm::testing::check;

// The call failed with `status` and its message contains `text`.
void check_fails(fc_status_t got, fc_status_t status, const std::string& text, const std::string& what) {
  const std::string message = fc_last_error_message();
  check(got == status && message.find(text) != std::string::npos,
        what + ": got '" + fc_status_string(got) + "': " + message);
}

void status_strings() {
  check(std::strcmp(fc_status_string(FC_STATUS_SUCCESS), "success") == 0, "success's name");
  std::vector<std::string> names;
  for (int s = FC_STATUS_SUCCESS; s <= FC_STATUS_INTERNAL; ++s) {
    const std::string name = fc_status_string(static_cast<fc_status_t>(s));
    for (const std::string& n : names) check(n != name, "status names are distinct: " + name);
    names.push_back(name);
  }
  int version = 0;
  check(fc_get_version(&version) == FC_STATUS_SUCCESS && version == FUSEDCOMM_API_VERSION, "fc_get_version");
}

void refusals() {
  float x = 0;
  check_fails(fc_all_reduce(nullptr, nullptr, FC_DTYPE_F32, &x, &x, 1, nullptr), FC_STATUS_STATE,
              "the communicator is closed", "an op on a null communicator");
  fc_backend_t backend;
  check_fails(fc_runtime_backend(nullptr, &backend), FC_STATUS_STATE, "the runtime is closed",
              "a null runtime");
  check_fails(fc_get_version(nullptr), FC_STATUS_INVALID_ARGUMENT, "null output pointer", "a null output");
  fc_runtime_config_t c;
  check(
      fc_runtime_config_init(&c) == FC_STATUS_SUCCESS && c.backend == FC_BACKEND_AUTO && c.gpu_ordinal == -1,
      "config defaults");
  fc_runtime_t rt = nullptr;
  c.backend = static_cast<fc_backend_t>(7);
  check_fails(fc_runtime_create(&c, &rt), FC_STATUS_INVALID_ARGUMENT, "unknown backend 7",
              "an unknown backend");
  c.backend = FC_BACKEND_HOST;
  c.chunk_bytes = 100;
  check_fails(fc_runtime_create(&c, &rt), FC_STATUS_INVALID_ARGUMENT, "chunk bytes must be at least 4096",
              "a too small chunk");
  check(rt == nullptr, "no runtime after a refusal");
  c.backend = FC_BACKEND_CUDA;
  c.chunk_bytes = 1 << 20;
  check_fails(fc_runtime_create(&c, &rt), FC_STATUS_UNAVAILABLE, "no GPU assigned", "cuda without a GPU");
  // The message is per thread, and a call that succeeds leaves it.
  int version = 0;
  check(fc_get_version(&version) == FC_STATUS_SUCCESS &&
            std::string(fc_last_error_message()).find("no GPU assigned") != std::string::npos,
        "a success keeps the last error message");
  std::string other = "unset";
  std::thread([&] { other = fc_last_error_message(); }).join();
  check(other.empty(), "another thread's last error message is its own: '" + other + "'");
  check(fc_comm_close(nullptr) == FC_STATUS_SUCCESS && fc_runtime_destroy(nullptr) == FC_STATUS_SUCCESS &&
            fc_moe_dispatch_free(nullptr) == FC_STATUS_SUCCESS,
        "freeing null handles is a no-op");
}

void one_rank(fc_runtime_t rt) {
  fc_comm_t comm = nullptr;
  check(fc_comm_create(rt, 0, 1, &comm) == FC_STATUS_SUCCESS, "fc_comm_create");
  const char* ep = nullptr;
  check(fc_comm_endpoint(comm, &ep) == FC_STATUS_SUCCESS && std::strchr(ep, '#') != nullptr,
        std::string("endpoint: ") + (ep ? ep : "null"));
  const std::string endpoint = ep;
  const uint8_t* blob = nullptr;
  size_t blob_bytes = 1;
  check(fc_comm_device_handle(comm, &blob, &blob_bytes) == FC_STATUS_SUCCESS && blob_bytes == 0,
        "the host backend has no device handle");
  uint64_t symmetric = 1;
  check(fc_comm_symmetric_bytes(comm, &symmetric) == FC_STATUS_SUCCESS && symmetric == 0,
        "the host backend holds no symmetric memory");
  const char* endpoints[] = {endpoint.c_str()};
  check(fc_comm_connect(comm, 0, 42, 1, endpoints, nullptr, nullptr, nullptr, nullptr) == FC_STATUS_SUCCESS,
        std::string("connect: ") + fc_last_error_message());

  const fc_op_desc_t desc{"capi_test allReduce", 1};
  std::vector<float> in = {1.5f, -2.f, 3.25f}, out(3, 0.f);
  check(fc_all_reduce(comm, &desc, FC_DTYPE_F32, in.data(), out.data(), 3, nullptr) == FC_STATUS_SUCCESS &&
            out == in,
        "allReduce at world 1 copies its input");
  check_fails(fc_all_reduce(comm, &desc, FC_DTYPE_I32, in.data(), out.data(), 3, nullptr),
              FC_STATUS_INVALID_ARGUMENT, "unsupported dtype 2 (f32 or bf16)", "an I32 allReduce");
  // Sizes whose byte count overflows int64 are refused before any data moves (2^62 f32
  // elements would wrap to 0 bytes).
  check_fails(fc_all_to_all(comm, &desc, FC_DTYPE_F32, in.data(), out.data(), int64_t{1} << 62, nullptr),
              FC_STATUS_INVALID_ARGUMENT,
              "allToAll: in: 4611686018427387904 elements of 4 bytes are more than",
              "an allToAll of 2^62 f32 elements");
  check_fails(fc_all_gather(comm, &desc, FC_DTYPE_BF16, in.data(), out.data(), INT64_MAX, nullptr),
              FC_STATUS_INVALID_ARGUMENT, "more than a tensor can hold",
              "an allGather of INT64_MAX elements");
  check(fc_all_reduce(comm, &desc, FC_DTYPE_F32, in.data(), out.data(), 3, nullptr) == FC_STATUS_SUCCESS &&
            out == in,
        "the communicator still works after the refusals");
  check_fails(
      fc_all_reduce(comm, &desc, FC_DTYPE_F32, in.data(), out.data(), 3, reinterpret_cast<fc_stream_t>(8)),
      FC_STATUS_INVALID_ARGUMENT, "the host backend runs ops synchronously", "a stream on the host backend");
  int64_t nanos = 0;
  check_fails(
      fc_comm_time_collective(comm, FC_OP_ALL_REDUCE, FC_DTYPE_F32, in.data(), out.data(), 3, 1, &nanos),
      FC_STATUS_STATE, "needs the cuda backend", "native timing on the host backend");

  const char* phrase = nullptr;
  check(fc_comm_describe_fused(comm, FC_OP_GEMM_ALL_REDUCE, 8, 8, 8, FC_PARTIALS_F32, &phrase) ==
                FC_STATUS_SUCCESS &&
            std::string(phrase).find("host backend") != std::string::npos,
        std::string("describe gemmAllReduce: ") + (phrase ? phrase : fc_last_error_message()));
  check_fails(fc_comm_describe_fused(comm, FC_OP_ALL_REDUCE, 8, 8, 8, FC_PARTIALS_F32, &phrase),
              FC_STATUS_INVALID_ARGUMENT, "unknown fused op 3", "describe a collective");
  check_fails(
      fc_comm_describe_fused(comm, FC_OP_ALL_GATHER_GEMM, 8, 8, 8, static_cast<fc_partials_t>(9), &phrase),
      FC_STATUS_INVALID_ARGUMENT, "unknown partial precision 9", "an unknown partial precision");

  // gemmAllReduce at world 1: the GEMM. c = a · wᵀ with a = [[1, 2]], w = [[3, 4], [5, 6]].
  const float a[] = {1, 2}, w[] = {3, 4, 5, 6};
  float c[2] = {0, 0};
  const fc_op_desc_t gdesc{"capi_test gemmAllReduce", 2};
  check(fc_gemm_all_reduce(comm, &gdesc, FC_DTYPE_F32, a, w, c, 1, 2, 2, FC_LAYOUT_NK, FC_PARTIALS_F32,
                           nullptr) == FC_STATUS_SUCCESS &&
            c[0] == 11 && c[1] == 17,
        "gemmAllReduce at world 1");
  check_fails(fc_gemm_all_reduce(comm, &gdesc, FC_DTYPE_F32, a, w, c, 1, 2, 2,
                                 static_cast<fc_weight_layout_t>(5), FC_PARTIALS_F32, nullptr),
              FC_STATUS_INVALID_ARGUMENT, "unknown weight layout 5", "an unknown layout");

  // MoE with one expert (an identity W1): every token is routed to rank 0 and combined back.
  const float x[] = {1, 2, 3, 4, 5, 6, 7, 8};  // 2 tokens x 4
  const int32_t ids[] = {0, 0};
  const float weights[] = {1, 1};
  float w1[16] = {};
  for (int i = 0; i < 4; ++i) w1[i * 4 + i] = 1;
  fc_moe_dispatch_t dispatch = nullptr;
  const fc_op_desc_t mdesc{"capi_test moe", 3};
  check(fc_moe_dispatch_gemm(comm, &mdesc, FC_DTYPE_F32, x, 2, 4, ids, weights, 1, 1, w1, 4, &dispatch) ==
            FC_STATUS_SUCCESS,
        std::string("moeDispatchGemm: ") + fc_last_error_message());
  fc_moe_layout_t layout{};
  check(fc_moe_dispatch_layout(dispatch, &layout) == FC_STATUS_SUCCESS && layout.rows == 2 &&
            layout.local_experts == 1 && layout.expert_offsets[1] == 2 && layout.src_token[1] == 1,
        "the dispatch's layout");
  float expert_out[8] = {}, combined[8] = {};
  check(fc_moe_dispatch_copy(dispatch, expert_out, nullptr) == FC_STATUS_SUCCESS &&
            std::memcmp(expert_out, x, sizeof x) == 0,
        "expert outputs: the routed tokens times the identity");
  check(fc_moe_combine(comm, &mdesc, FC_DTYPE_F32, dispatch, expert_out, 4, combined) == FC_STATUS_SUCCESS &&
            std::memcmp(combined, x, sizeof x) == 0,
        "moeCombine returns each token");
  // moeGemmCombine: bit for bit the grouped GEMM over the expert offsets, then the combine, for
  // both weight layouts (h: the expert rows; w2: one expert, 3 x 4 outputs of width 3).
  for (const fc_weight_layout_t wl : {FC_LAYOUT_NK, FC_LAYOUT_KN}) {
    const float h[] = {0.5f, -1.25f, 2, 3.75f, -0.125f, 1, 4.5f, -2};  // 2 rows x k = 4
    const float w2[] = {0.3f, -0.7f, 1.1f, 0.9f, -1.3f, 0.2f, 0.6f, -0.4f, 1.7f, -0.05f, 0.8f, -1.9f};
    float rows[6] = {}, want[6] = {}, got[6] = {};
    const int64_t offsets[] = {0, 2};
    check(fc_grouped_gemm(FC_BACKEND_HOST, FC_DTYPE_F32, h, w2, rows, offsets, 1, 2, 3, 4, wl) ==
                  FC_STATUS_SUCCESS &&
              fc_moe_combine(comm, &mdesc, FC_DTYPE_F32, dispatch, rows, 3, want) == FC_STATUS_SUCCESS,
          "moeGemmCombine's reference: groupedGemm then moeCombine");
    check(fc_moe_gemm_combine(comm, &mdesc, FC_DTYPE_F32, dispatch, h, 4, w2, wl, 3, got) ==
                  FC_STATUS_SUCCESS &&
              std::memcmp(got, want, sizeof got) == 0,
          std::string("moeGemmCombine = moeCombine(groupedGemm) bit for bit (") +
              (wl == FC_LAYOUT_NK ? "NK" : "KN") + "): " + fc_last_error_message());
  }
  void* device_rows = &device_rows;
  check_fails(fc_moe_dispatch_device_rows(dispatch, &device_rows, nullptr), FC_STATUS_STATE,
              "holds its rows in host memory", "device rows of a host-backend dispatch");
  check(device_rows == &device_rows, "a refused fc_moe_dispatch_device_rows writes nothing");
  check_fails(fc_moe_gemm_combine(comm, &mdesc, FC_DTYPE_F32, dispatch, x, 4, w1, FC_LAYOUT_NK, -1, combined),
              FC_STATUS_INVALID_ARGUMENT, "moeGemmCombine", "a negative width");
  // A receive bound below the rows (2 routed rows to rank 0, maxRecvRows = 1): refused, naming
  // the rank, its rows and the bound, with no result; the next dispatch (bounded at 2) works.
  fc_moe_options_t bound{};
  bound.max_recv_rows = 1;
  fc_moe_dispatch_t bounded = nullptr;
  check_fails(fc_moe_dispatch_gemm_ex(comm, &mdesc, FC_DTYPE_F32, x, 2, 4, ids, weights, 1, 1, w1, 4, &bound,
                                      &bounded),
              FC_STATUS_INVALID_ARGUMENT, "rank 0 would receive 2 routed rows, more than maxRecvRows = 1",
              "a receive bound below the rows");
  check(bounded == nullptr, "an overflowing dispatch returns no result");
  bound.max_recv_rows = -1;
  check_fails(fc_moe_dispatch_gemm_ex(comm, &mdesc, FC_DTYPE_F32, x, 2, 4, ids, weights, 1, 1, w1, 4, &bound,
                                      &bounded),
              FC_STATUS_INVALID_ARGUMENT, "maxRecvRows = -1", "a negative receive bound");
  bound.max_recv_rows = 2;
  fc_moe_layout_t blayout{};
  float brows[8] = {};
  check(fc_moe_dispatch_gemm_ex(comm, &mdesc, FC_DTYPE_F32, x, 2, 4, ids, weights, 1, 1, w1, 4, &bound,
                                &bounded) == FC_STATUS_SUCCESS &&
            fc_moe_dispatch_layout(bounded, &blayout) == FC_STATUS_SUCCESS && blayout.rows == 2 &&
            fc_moe_dispatch_copy(bounded, brows, nullptr) == FC_STATUS_SUCCESS &&
            std::memcmp(brows, x, sizeof x) == 0,
        std::string("a dispatch at its bound after an overflow: ") + fc_last_error_message());
  check(fc_moe_dispatch_free(bounded) == FC_STATUS_SUCCESS, "fc_moe_dispatch_free (bounded)");
  check(fc_moe_dispatch_free(dispatch) == FC_STATUS_SUCCESS, "fc_moe_dispatch_free");
  check_fails(fc_moe_dispatch_layout(nullptr, &layout), FC_STATUS_STATE, "the MoE dispatch is closed",
              "a null dispatch");

  check(fc_comm_synchronize(comm) == FC_STATUS_SUCCESS && fc_comm_finish(comm) == FC_STATUS_SUCCESS,
        "synchronize and finish");
  check(fc_comm_close(comm) == FC_STATUS_SUCCESS, "fc_comm_close");

  // Aborted, then closed: closing frees it without the barrier.
  check(fc_comm_create(rt, 0, 1, &comm) == FC_STATUS_SUCCESS && fc_comm_abort(comm) == FC_STATUS_SUCCESS &&
            fc_comm_close(comm) == FC_STATUS_SUCCESS,
        "abort, then close");
}

void single_rank_gemm_and_memory() {
  uint64_t bytes0 = 0, allocs0 = 0, bytes1 = 0, allocs1 = 0;
  check(fc_memory_stats(&bytes0, &allocs0) == FC_STATUS_SUCCESS, "fc_memory_stats");
  void* p = nullptr;
  check(fc_host_alloc(1000, &p) == FC_STATUS_SUCCESS && p != nullptr &&
            reinterpret_cast<uintptr_t>(p) % 128 == 0,
        "fc_host_alloc");
  fc_memory_stats(&bytes1, &allocs1);
  check(bytes1 == bytes0 + 1000 && allocs1 == allocs0 + 1, "a host allocation is counted");
  check(fc_host_free(p) == FC_STATUS_SUCCESS, "fc_host_free");
  fc_memory_stats(&bytes1, &allocs1);
  check(bytes1 == bytes0 && allocs1 == allocs0, "freed");

  const float a[] = {1, 2}, w[] = {3, 5, 4, 6};  // KN: the same product as above
  float c[2] = {0, 0};
  check(fc_gemm(FC_BACKEND_HOST, FC_DTYPE_F32, a, w, c, 1, 2, 2, FC_LAYOUT_KN) == FC_STATUS_SUCCESS &&
            c[0] == 11 && c[1] == 17,
        "host GEMM, KN");
  check_fails(fc_gemm(FC_BACKEND_AUTO, FC_DTYPE_F32, a, w, c, 1, 2, 2, FC_LAYOUT_KN),
              FC_STATUS_INVALID_ARGUMENT, "not auto", "a GEMM on backend auto");
  check_fails(
      fc_gemm(FC_BACKEND_HOST, FC_DTYPE_F32, a, w, c, int64_t{1} << 31, 2, int64_t{1} << 31, FC_LAYOUT_KN),
      FC_STATUS_INVALID_ARGUMENT, "gemm: a: 2147483648 x 2147483648 elements", "a GEMM whose A overflows");
  void* huge = nullptr;
  check_fails(fc_host_alloc(size_t{1} << 62, &huge), FC_STATUS_INVALID_ARGUMENT, "is too large",
              "a host allocation of 2^62 bytes");
  const char* report = nullptr;
  check(fc_availability(&report) == FC_STATUS_SUCCESS &&
            std::string(report).find("host: available") != std::string::npos,
        "availability report");
}

// fc_attention on the host: a worked example (one query, two keys: the softmax weights of
// scores 0 and log 3 are 1/4 and 3/4), the refusals (unknown or auto backend, a stream on the
// host, a null shape, sizes that overflow) and the cuda backend's answer here.
void single_rank_attention() {
  const fc_attention_local_t shape{1, 1, 2, 1, 1, 1, 0, 1.f, 0};  // B=1, Lq=1, Lk=2, Hq=Hkv=1, D=1, scale 1
  const float q[] = {1.f}, k[] = {0.f, std::log(3.f)}, v[] = {4.f, 8.f};
  float o = 0.f, lse = 0.f;
  check(
      fc_attention(FC_BACKEND_HOST, FC_DTYPE_F32, &shape, q, k, v, &o, &lse, nullptr) == FC_STATUS_SUCCESS &&
          std::fabs(o - 7.f) < 1e-5f && std::fabs(lse - std::log(4.f)) < 1e-6f,
      "host attention: o = 1/4·4 + 3/4·8 = 7, lse = log 4; got " + std::to_string(o) + ", " +
          std::to_string(lse));
  fc_attention_local_t causal = shape;
  causal.causal = 1;  // top-left: query 0 sees key 0 only
  check(fc_attention(FC_BACKEND_HOST, FC_DTYPE_F32, &causal, q, k, v, &o, nullptr, nullptr) ==
                FC_STATUS_SUCCESS &&
            o == 4.f,
        "host attention, causal, no lse: o = v[0]");
  check_fails(fc_attention(FC_BACKEND_AUTO, FC_DTYPE_F32, &shape, q, k, v, &o, nullptr, nullptr),
              FC_STATUS_INVALID_ARGUMENT, "attention: name the backend", "attention on backend auto");
  check_fails(fc_attention(FC_BACKEND_HOST, FC_DTYPE_F32, &shape, q, k, v, &o, nullptr,
                           reinterpret_cast<fc_stream_t>(8)),
              FC_STATUS_INVALID_ARGUMENT, "the host backend runs ops synchronously",
              "attention with a stream on host");
  check_fails(fc_attention(FC_BACKEND_HOST, FC_DTYPE_F32, nullptr, q, k, v, &o, nullptr, nullptr),
              FC_STATUS_INVALID_ARGUMENT, "attention: null shape", "attention without a shape");
  check_fails(fc_attention(FC_BACKEND_HOST, FC_DTYPE_I32, &shape, q, k, v, &o, nullptr, nullptr),
              FC_STATUS_INVALID_ARGUMENT, "unsupported dtype 2", "an I32 attention");
  fc_attention_local_t huge = shape;
  huge.q_len = int64_t{1} << 40, huge.head_dim = int64_t{1} << 40;
  check_fails(fc_attention(FC_BACKEND_HOST, FC_DTYPE_F32, &huge, q, k, v, &o, nullptr, nullptr),
              FC_STATUS_INVALID_ARGUMENT, "attention: q: ", "an attention whose q overflows");
  const fc_status_t cuda =
      fc_attention(FC_BACKEND_CUDA, FC_DTYPE_BF16, &shape, q, k, v, &o, nullptr, nullptr);
  check(cuda == FC_STATUS_UNAVAILABLE || cuda == FC_STATUS_INVALID_ARGUMENT,
        std::string("attention on cuda with host pointers is refused: ") + fc_last_error_message());
}

// fc_attention_backward on the host: the worked example above with dO = 1 (δ = o = 7; dS =
// P (v - δ) = (-3/4, 3/4)), the refusals as the forward's, a missing lse, and the cuda
// backend's answer here.
void single_rank_attention_backward() {
  const fc_attention_local_t shape{1, 1, 2, 1, 1, 1, 0, 1.f, 0};
  const float q[] = {1.f}, k[] = {0.f, std::log(3.f)}, v[] = {4.f, 8.f}, o[] = {7.f}, lse[] = {std::log(4.f)},
              d_o[] = {1.f};
  float dq = NAN, dk[2] = {NAN, NAN}, dv[2] = {NAN, NAN};
  check(fc_attention_backward(FC_BACKEND_HOST, FC_DTYPE_F32, &shape, q, k, v, o, lse, d_o, &dq, dk, dv,
                              nullptr) == FC_STATUS_SUCCESS &&
            std::fabs(dv[0] - 0.25f) < 1e-6f && std::fabs(dv[1] - 0.75f) < 1e-6f &&
            std::fabs(dk[0] + 0.75f) < 1e-6f && std::fabs(dk[1] - 0.75f) < 1e-6f &&
            std::fabs(dq - 0.75f * std::log(3.f)) < 1e-6f,
        "host attention backward: dV = (1/4, 3/4), dK = (-3/4, 3/4), dQ = 3/4 log 3; got dV (" +
            std::to_string(dv[0]) + ", " + std::to_string(dv[1]) + "), dK (" + std::to_string(dk[0]) + ", " +
            std::to_string(dk[1]) + "), dQ " + std::to_string(dq) + ": " + fc_last_error_message());
  check_fails(fc_attention_backward(FC_BACKEND_AUTO, FC_DTYPE_F32, &shape, q, k, v, o, lse, d_o, &dq, dk, dv,
                                    nullptr),
              FC_STATUS_INVALID_ARGUMENT, "attentionBackward: name the backend",
              "attention backward on backend auto");
  check_fails(fc_attention_backward(FC_BACKEND_HOST, FC_DTYPE_F32, &shape, q, k, v, o, lse, d_o, &dq, dk, dv,
                                    reinterpret_cast<fc_stream_t>(8)),
              FC_STATUS_INVALID_ARGUMENT, "the host backend runs ops synchronously",
              "attention backward with a stream on host");
  check_fails(fc_attention_backward(FC_BACKEND_HOST, FC_DTYPE_F32, nullptr, q, k, v, o, lse, d_o, &dq, dk, dv,
                                    nullptr),
              FC_STATUS_INVALID_ARGUMENT, "attentionBackward: null shape",
              "attention backward without a shape");
  check_fails(fc_attention_backward(FC_BACKEND_HOST, FC_DTYPE_F32, &shape, q, k, v, o, nullptr, d_o, &dq, dk,
                                    dv, nullptr),
              FC_STATUS_INVALID_ARGUMENT,
              "attentionBackward: lse (the forward's log-sum-exp, fp32) is required",
              "attention backward without lse");
  check_fails(fc_attention_backward(FC_BACKEND_HOST, FC_DTYPE_I32, &shape, q, k, v, o, lse, d_o, &dq, dk, dv,
                                    nullptr),
              FC_STATUS_INVALID_ARGUMENT, "unsupported dtype 2", "an I32 attention backward");
  fc_attention_local_t huge = shape;
  huge.kv_len = int64_t{1} << 40, huge.head_dim = int64_t{1} << 40;
  check_fails(
      fc_attention_backward(FC_BACKEND_HOST, FC_DTYPE_F32, &huge, q, k, v, o, lse, d_o, &dq, dk, dv, nullptr),
      FC_STATUS_INVALID_ARGUMENT, "attentionBackward: k: ", "an attention backward whose k overflows");
  const fc_status_t cuda = fc_attention_backward(FC_BACKEND_CUDA, FC_DTYPE_BF16, &shape, q, k, v, o, lse, d_o,
                                                 &dq, dk, dv, nullptr);
  check(cuda == FC_STATUS_UNAVAILABLE || cuda == FC_STATUS_INVALID_ARGUMENT,
        std::string("attention backward on cuda with host pointers is refused: ") + fc_last_error_message());
}

// fc_ring_attention over W = 1..4 ranks of this process (one host runtime each, the socket
// transport between them), zigzag and contiguous, causal and not, GQA, S not a multiple of 2W:
// every rank's rows against fc_attention over the whole sequence (f32; the ring merges the
// same keys in other groups, so within a few fp32 ulps); fc_ring_attention_backward the same
// against fc_attention_backward, from the same o and lse rows.
void ring_attention_ranks(int w) {
  constexpr int64_t kB = 2, kHq = 4, kHkv = 2, kD = 8;
  const int64_t seq = 4 * w + 3;
  std::vector<float> gq(kB * seq * kHq * kD), gk(kB * seq * kHkv * kD), gv(gk.size()), gdo(gq.size());
  uint32_t state = 12345u + w;
  const auto next = [&] {
    state = state * 1664525u + 1013904223u;
    return static_cast<float>(state >> 8) / 16777216.f * 2.f - 1.f;
  };
  for (auto* vec : {&gq, &gk, &gv, &gdo})
    for (float& x : *vec) x = next();
  std::vector<fc_runtime_t> rts(w, nullptr);
  std::vector<fc_comm_t> comms(w, nullptr);
  std::vector<std::string> endpoints(w);
  std::vector<std::vector<uint8_t>> shares(w, std::vector<uint8_t>(FC_AUTH_SHARE_BYTES));
  bool ok = true;
  for (int r = 0; r < w && ok; ++r) {
    fc_runtime_config_t c;
    fc_runtime_config_init(&c);
    c.backend = FC_BACKEND_HOST;
    c.bind_host = "127.0.0.1";
    c.timeout_ms = 20000;
    c.job_token = 77;
    const char* ep = nullptr;
    ok = fc_runtime_create(&c, &rts[r]) == FC_STATUS_SUCCESS &&
         fc_comm_create(rts[r], r, w, &comms[r]) == FC_STATUS_SUCCESS &&
         fc_comm_endpoint(comms[r], &ep) == FC_STATUS_SUCCESS;
    if (ok) endpoints[r] = ep;
    for (size_t i = 0; i < shares[r].size(); ++i) shares[r][i] = static_cast<uint8_t>(next() * 100 + r);
  }
  check(ok,
        "ring attention W=" + std::to_string(w) + ": runtimes and communicators: " + fc_last_error_message());
  if (ok) {
    std::vector<const char*> eps(w);
    std::vector<const uint8_t*> sh(w);
    for (int r = 0; r < w; ++r) eps[r] = endpoints[r].c_str(), sh[r] = shares[r].data();
    // Runs `body(rank)` on one thread per rank; true when every rank's calls succeeded.
    const auto on_ranks = [&](auto body) {
      std::vector<std::string> errors(w);
      std::vector<std::thread> threads;
      for (int r = 0; r < w; ++r)
        threads.emplace_back([&, r] {
          if (!body(r)) errors[r] = fc_last_error_message();
        });
      for (std::thread& t : threads) t.join();
      std::string all;
      for (int r = 0; r < w; ++r)
        if (!errors[r].empty()) all += " rank " + std::to_string(r) + ": " + errors[r];
      return all;
    };
    std::string failed = on_ranks([&](int r) {
      return fc_comm_connect(comms[r], r, 900 + w, w, eps.data(), sh.data(), nullptr, nullptr, nullptr) ==
             FC_STATUS_SUCCESS;
    });
    check(failed.empty(), "ring attention W=" + std::to_string(w) + ": connect:" + failed);
    for (int32_t layout : {FC_SEQ_CONTIGUOUS, FC_SEQ_ZIGZAG})
      for (int32_t causal : {0, 1}) {
        const std::string what = "fc_ring_attention W=" + std::to_string(w) +
                                 (layout == FC_SEQ_ZIGZAG ? " zigzag" : " contiguous") +
                                 (causal ? " causal" : " full");
        const fc_attention_local_t whole{kB, seq, seq, kHq, kHkv, kD, causal, 0.f, 0};
        std::vector<float> ro(gq.size()), rlse(kB * kHq * seq);
        check(fc_attention(FC_BACKEND_HOST, FC_DTYPE_F32, &whole, gq.data(), gk.data(), gv.data(), ro.data(),
                           rlse.data(), nullptr) == FC_STATUS_SUCCESS,
              what + ": the reference");
        std::vector<float> rdq(gq.size()), rdk(gk.size()), rdv(gk.size());
        check(fc_attention_backward(FC_BACKEND_HOST, FC_DTYPE_F32, &whole, gq.data(), gk.data(), gv.data(),
                                    ro.data(), rlse.data(), gdo.data(), rdq.data(), rdk.data(), rdv.data(),
                                    nullptr) == FC_STATUS_SUCCESS,
              what + ": the backward's reference");
        // Each rank's positions, from the documented rule (2W chunks: r, then 2W-1-r).
        std::vector<std::vector<int64_t>> pos(w);
        for (int r = 0; r < w; ++r) {
          const auto chunk = [&](int parts, int c) {
            const int64_t first = c * (seq / parts) + std::min<int64_t>(c, seq % parts);
            for (int64_t i = 0; i < seq / parts + (c < seq % parts ? 1 : 0); ++i) pos[r].push_back(first + i);
          };
          if (layout == FC_SEQ_ZIGZAG) {
            chunk(2 * w, r);
            chunk(2 * w, 2 * w - 1 - r);
          } else {
            chunk(w, r);
          }
        }
        const auto rows = [&](const std::vector<float>& x, int64_t inner, const std::vector<int64_t>& p) {
          std::vector<float> out;
          for (int64_t b = 0; b < kB; ++b)
            for (int64_t i : p)
              out.insert(out.end(), x.begin() + (b * seq + i) * inner, x.begin() + (b * seq + i + 1) * inner);
          return out;
        };
        std::vector<std::vector<float>> o(w), lse(w);
        failed = on_ranks([&](int r) {
          const int64_t n = static_cast<int64_t>(pos[r].size());
          const std::vector<float> q = rows(gq, kHq * kD, pos[r]), k = rows(gk, kHkv * kD, pos[r]),
                                   v = rows(gv, kHkv * kD, pos[r]);
          o[r].assign(q.size(), NAN);
          lse[r].assign(kB * kHq * n, NAN);
          const fc_attention_shape_t s{kB, seq, kHq, kHkv, kD, causal, 0.f, layout};
          const fc_op_desc_t desc{"capi_test ringAttention", 5};
          return fc_ring_attention(comms[r], &desc, FC_DTYPE_F32, &s, q.data(), k.data(), v.data(),
                                   o[r].data(), lse[r].data(), nullptr) == FC_STATUS_SUCCESS;
        });
        check(failed.empty(), what + ":" + failed);
        if (!failed.empty()) continue;
        for (int r = 0; r < w; ++r) {
          const std::vector<float> want = rows(ro, kHq * kD, pos[r]);
          double worst = 0, worst_lse = 0;
          for (size_t i = 0; i < want.size(); ++i)
            worst = std::max<double>(worst, std::fabs(o[r][i] - want[i]));
          const int64_t n = static_cast<int64_t>(pos[r].size());
          for (int64_t row = 0; row < kB * kHq; ++row)
            for (int64_t i = 0; i < n; ++i)
              worst_lse =
                  std::max<double>(worst_lse, std::fabs(lse[r][row * n + i] - rlse[row * seq + pos[r][i]]));
          check(worst <= 1e-5 && worst_lse <= 1e-5, what + " rank " + std::to_string(r) +
                                                        ": max |o - reference| " + std::to_string(worst) +
                                                        ", |lse - reference| " + std::to_string(worst_lse));
        }
        // The backward, every rank from the reference's o and lse rows.
        std::vector<std::vector<float>> dq(w), dk(w), dv(w);
        failed = on_ranks([&](int r) {
          const std::vector<float> q = rows(gq, kHq * kD, pos[r]), k = rows(gk, kHkv * kD, pos[r]),
                                   v = rows(gv, kHkv * kD, pos[r]), ro_r = rows(ro, kHq * kD, pos[r]),
                                   d_o = rows(gdo, kHq * kD, pos[r]);
          std::vector<float> lse_r;
          for (int64_t row = 0; row < kB * kHq; ++row)
            for (int64_t i : pos[r]) lse_r.push_back(rlse[row * seq + i]);
          dq[r].assign(q.size(), NAN);
          dk[r].assign(k.size(), NAN);
          dv[r].assign(k.size(), NAN);
          const fc_attention_shape_t s{kB, seq, kHq, kHkv, kD, causal, 0.f, layout};
          const fc_op_desc_t desc{"capi_test ringAttentionBackward", 6};
          return fc_ring_attention_backward(comms[r], &desc, FC_DTYPE_F32, &s, q.data(), k.data(), v.data(),
                                            ro_r.data(), lse_r.data(), d_o.data(), dq[r].data(), dk[r].data(),
                                            dv[r].data(), nullptr) == FC_STATUS_SUCCESS;
        });
        check(failed.empty(), what + " backward:" + failed);
        if (!failed.empty()) continue;
        for (int r = 0; r < w; ++r) {
          double worst = 0;
          const auto compare = [&](const std::vector<float>& got, const std::vector<float>& want) {
            for (size_t i = 0; i < want.size(); ++i)
              worst = std::max<double>(worst, std::fabs(got[i] - want[i]) / (1.0 + std::fabs(want[i])));
          };
          compare(dq[r], rows(rdq, kHq * kD, pos[r]));
          compare(dk[r], rows(rdk, kHkv * kD, pos[r]));
          compare(dv[r], rows(rdv, kHkv * kD, pos[r]));
          check(worst <= 1e-5, what + " backward rank " + std::to_string(r) +
                                   ": max |grad - reference| / (1 + |reference|) " + std::to_string(worst));
        }
      }
    // An unknown layout is refused on every rank before anything moves.
    failed = on_ranks([&](int r) {
      const fc_attention_shape_t s{kB, seq, kHq, kHkv, kD, 0, 0.f, 7};
      const fc_status_t st = fc_ring_attention(comms[r], nullptr, FC_DTYPE_F32, &s, nullptr, nullptr, nullptr,
                                               nullptr, nullptr, nullptr);
      const bool refused =
          st == FC_STATUS_INVALID_ARGUMENT &&
          std::string(fc_last_error_message()).find("ringAttention: unknown sequence layout 7") !=
              std::string::npos;
      return refused;
    });
    check(failed.empty(), "ringAttention with layout 7 is refused on every rank:" + failed);
    failed = on_ranks([&](int r) {
      const fc_attention_shape_t s{kB, seq, kHq, kHkv, kD, 0, 0.f, 7};
      const fc_status_t st =
          fc_ring_attention_backward(comms[r], nullptr, FC_DTYPE_F32, &s, nullptr, nullptr, nullptr, nullptr,
                                     nullptr, nullptr, nullptr, nullptr, nullptr, nullptr);
      return st == FC_STATUS_INVALID_ARGUMENT &&
             std::string(fc_last_error_message()).find("ringAttentionBackward: unknown sequence layout 7") !=
                 std::string::npos;
    });
    check(failed.empty(), "ringAttentionBackward with layout 7 is refused on every rank:" + failed);
    // The host backend runs synchronously: a stream is refused, before anything moves.
    failed = on_ranks([&](int r) {
      const fc_attention_shape_t s{kB, seq, kHq, kHkv, kD, 0, 0.f, 0};
      const fc_status_t st = fc_ring_attention(comms[r], nullptr, FC_DTYPE_F32, &s, nullptr, nullptr, nullptr,
                                               nullptr, nullptr, reinterpret_cast<fc_stream_t>(0x10));
      return st == FC_STATUS_INVALID_ARGUMENT &&
             std::string(fc_last_error_message()).find("host backend runs ops synchronously") !=
                 std::string::npos;
    });
    check(failed.empty(),
          "ringAttention with a stream on the host backend is refused on every rank:" + failed);
  }
  // Closing ends with a barrier of all ranks: close them together.
  std::vector<std::thread> closing;
  std::vector<std::string> close_errors(w);
  for (int r = 0; r < w; ++r)
    closing.emplace_back([&, r] {
      if (fc_comm_close(comms[r]) != FC_STATUS_SUCCESS) close_errors[r] = fc_last_error_message();
    });
  for (std::thread& t : closing) t.join();
  for (int r = 0; r < w; ++r)
    check(close_errors[r].empty(), "close rank " + std::to_string(r) + ": " + close_errors[r]);
  for (int r = 0; r < w; ++r) fc_runtime_destroy(rts[r]);
}

// Device memory and streams. Without a GPU every call says why; with one, the runtime's own
// allocation is device memory whose range covers it, a pageable host address is unregistered,
// and copies go both ways. Null arguments are refused either way.
void device_memory() {
  int host_value = 7;
  fc_pointer_info_t info{};
  const fc_status_t probe = fc_pointer_info(&host_value, &info);
  if (probe != FC_STATUS_SUCCESS) {
    check(probe == FC_STATUS_UNAVAILABLE &&
              std::string(fc_last_error_message()).find("cudaPointerGetAttributes: ") == 0,
          std::string("pointer info without a GPU: ") + fc_last_error_message());
    void* p = nullptr;
    check_fails(fc_device_alloc(64, &p), FC_STATUS_UNAVAILABLE,
                "cudaMalloc of 64 bytes: ", "a device allocation without a GPU");
    int32_t device = 0;
    check_fails(fc_stream_device(nullptr, &device), FC_STATUS_UNAVAILABLE,
                "cudaStreamGetDevice: ", "a stream's device without a GPU");
    uint64_t free_bytes = 0;
    uint64_t total_bytes = 0;
    check_fails(fc_device_memory(&free_bytes, &total_bytes), FC_STATUS_UNAVAILABLE,
                "cudaMemGetInfo: ", "GPU memory without a GPU");
  } else {
    check(info.type == FC_MEMORY_UNREGISTERED && info.device == -1 && info.range_bytes == 0,
          "a pageable host address is unregistered");
    constexpr size_t kBytes = 1 << 20;
    void* p = nullptr;
    check(fc_device_alloc(kBytes, &p) == FC_STATUS_SUCCESS && p != nullptr, "fc_device_alloc");
    const auto at = reinterpret_cast<uint64_t>(p);
    check(fc_pointer_info(static_cast<char*>(p) + 16, &info) == FC_STATUS_SUCCESS &&
              info.type == FC_MEMORY_DEVICE && info.device >= 0 && info.range_base == at &&
              info.range_bytes >= kBytes,
          "an allocation of the runtime is device memory with its range");
    std::vector<int> up(kBytes / sizeof(int)), down(up.size(), 0);
    for (size_t i = 0; i < up.size(); ++i) up[i] = static_cast<int>(i * 7 + 1);
    check(fc_device_copy(p, up.data(), kBytes) == FC_STATUS_SUCCESS &&
              fc_device_copy(down.data(), p, kBytes) == FC_STATUS_SUCCESS && down == up,
          "a round trip through device memory");
    // Three int columns of 1000 rows interleaved into a 1000 x 3 row-major matrix on the GPU.
    constexpr size_t kRows = 1000;
    int* cols = static_cast<int*>(p);
    int* matrix = cols + 3 * kRows;
    for (size_t c = 0; c < 3; ++c) {
      check(fc_device_copy_2d(matrix + c, 3 * sizeof(int), cols + c * kRows, sizeof(int), sizeof(int),
                              kRows) == FC_STATUS_SUCCESS,
            "fc_device_copy_2d");
    }
    std::vector<int> packed(3 * kRows, 0);
    check(fc_device_copy(packed.data(), matrix, packed.size() * sizeof(int)) == FC_STATUS_SUCCESS,
          "copy the packed matrix down");
    bool interleaved = true;
    for (size_t r = 0; r < kRows; ++r)
      for (size_t c = 0; c < 3; ++c) interleaved &= packed[r * 3 + c] == up[c * kRows + r];
    check(interleaved, "columns interleaved row-major by fc_device_copy_2d");
    uint64_t free_bytes = 0;
    uint64_t total_bytes = 0;
    check(fc_device_memory(&free_bytes, &total_bytes) == FC_STATUS_SUCCESS && total_bytes >= kBytes &&
              free_bytes <= total_bytes,
          "fc_device_memory");
    int32_t device = -1;
    check(fc_stream_device(nullptr, &device) == FC_STATUS_SUCCESS && device == info.device,
          "the legacy stream is on the current GPU");
    check(fc_device_free(p) == FC_STATUS_SUCCESS, "fc_device_free");
  }
  check_fails(fc_pointer_info(&host_value, nullptr), FC_STATUS_INVALID_ARGUMENT, "null output pointer",
              "pointer info without an output");
  check_fails(fc_device_copy(nullptr, &host_value, 4), FC_STATUS_INVALID_ARGUMENT, "null memory",
              "a copy to null");
  check(fc_device_copy(nullptr, nullptr, 0) == FC_STATUS_SUCCESS &&
            fc_device_free(nullptr) == FC_STATUS_SUCCESS,
        "an empty copy and freeing null are no-ops");
  check_fails(fc_device_copy_2d(&host_value, 2, &host_value, 4, 4, 1), FC_STATUS_INVALID_ARGUMENT,
              "a pitch narrower than the row width", "a 2D copy with overlapping rows");
  check_fails(fc_device_copy_2d(nullptr, 4, &host_value, 4, 4, 1), FC_STATUS_INVALID_ARGUMENT, "null memory",
              "a 2D copy to null");
  check(fc_device_copy_2d(nullptr, 0, nullptr, 0, 0, 5) == FC_STATUS_SUCCESS, "an empty 2D copy is a no-op");
  uint64_t total_only = 0;
  check_fails(fc_device_memory(nullptr, &total_only), FC_STATUS_INVALID_ARGUMENT, "null output pointer",
              "GPU memory without an output");
}

// fc_attention_backward on the cuda backend where a GPU is present: from the host backend's bf16
// forward (o, lse), the Hopper kernel's dq, dk, dv against the host backend's backward on the same
// inputs, each within 3 % of that gradient's largest magnitude (the kernel rounds P and dS to bf16
// for its tensor-core products; the host keeps them in fp32), at head dims 64 and 128, causal and
// not, grouped-query heads, lengths off the 128-row tile and Lq != Lk.
void attention_backward_on_gpu() {
  using fusedcomm::host::bf16_to_f32;
  using fusedcomm::host::f32_to_bf16;
  void* probe = nullptr;
  if (fc_device_alloc(16, &probe) != FC_STATUS_SUCCESS) {
    std::printf("attention backward on the GPU: skipped, no GPU (%s)\n", fc_last_error_message());
    return;
  }
  fc_device_free(probe);
  struct Case {
    int64_t q_len, kv_len, q_heads, kv_heads, head_dim;
    int32_t causal;
  };
  const Case cases[] = {
      {200, 150, 4, 2, 64, 0}, {200, 200, 4, 1, 64, 1}, {129, 300, 2, 2, 128, 0}, {333, 333, 4, 2, 128, 1}};
  uint32_t state = 2024;
  auto uniform = [&state]() {
    state = state * 1664525u + 1013904223u;
    return static_cast<float>(state >> 8) / static_cast<float>(1u << 24) * 2.0f - 1.0f;
  };
  for (const Case& c : cases) {
    fc_attention_local_t shape{};
    shape.batch = 1;
    shape.q_len = c.q_len;
    shape.kv_len = c.kv_len;
    shape.q_heads = c.q_heads;
    shape.kv_heads = c.kv_heads;
    shape.head_dim = c.head_dim;
    shape.causal = c.causal;
    const size_t nq = static_cast<size_t>(c.q_len * c.q_heads * c.head_dim);
    const size_t nk = static_cast<size_t>(c.kv_len * c.kv_heads * c.head_dim);
    const size_t nl = static_cast<size_t>(c.q_heads * c.q_len);
    std::vector<uint16_t> q(nq), k(nk), v(nk), o(nq), d_o(nq);
    for (auto* t : {&q, &k, &v, &d_o})
      for (uint16_t& x : *t) x = f32_to_bf16(uniform());
    std::vector<float> lse(nl);
    std::vector<uint16_t> want_q(nq), want_k(nk), want_v(nk), got_q(nq), got_k(nk), got_v(nk);
    bool ok = fc_attention(FC_BACKEND_HOST, FC_DTYPE_BF16, &shape, q.data(), k.data(), v.data(), o.data(),
                           lse.data(), nullptr) == FC_STATUS_SUCCESS &&
              fc_attention_backward(FC_BACKEND_HOST, FC_DTYPE_BF16, &shape, q.data(), k.data(), v.data(),
                                    o.data(), lse.data(), d_o.data(), want_q.data(), want_k.data(),
                                    want_v.data(), nullptr) == FC_STATUS_SUCCESS;
    void *dq_in = nullptr, *dk_in = nullptr, *dv_in = nullptr, *d_out = nullptr, *d_do = nullptr,
         *d_lse = nullptr, *g_q = nullptr, *g_k = nullptr, *g_v = nullptr;
    for (auto [ptr, bytes] : {std::pair{&dq_in, nq * 2},
                              {&dk_in, nk * 2},
                              {&dv_in, nk * 2},
                              {&d_out, nq * 2},
                              {&d_do, nq * 2},
                              {&d_lse, nl * 4},
                              {&g_q, nq * 2},
                              {&g_k, nk * 2},
                              {&g_v, nk * 2}})
      ok = ok && fc_device_alloc(bytes, ptr) == FC_STATUS_SUCCESS;
    ok = ok && fc_device_copy(dq_in, q.data(), nq * 2) == FC_STATUS_SUCCESS &&
         fc_device_copy(dk_in, k.data(), nk * 2) == FC_STATUS_SUCCESS &&
         fc_device_copy(dv_in, v.data(), nk * 2) == FC_STATUS_SUCCESS &&
         fc_device_copy(d_out, o.data(), nq * 2) == FC_STATUS_SUCCESS &&
         fc_device_copy(d_do, d_o.data(), nq * 2) == FC_STATUS_SUCCESS &&
         fc_device_copy(d_lse, lse.data(), nl * 4) == FC_STATUS_SUCCESS &&
         fc_attention_backward(FC_BACKEND_CUDA, FC_DTYPE_BF16, &shape, dq_in, dk_in, dv_in, d_out,
                               static_cast<const float*>(d_lse), d_do, g_q, g_k, g_v,
                               nullptr) == FC_STATUS_SUCCESS &&
         fc_device_copy(got_q.data(), g_q, nq * 2) == FC_STATUS_SUCCESS &&
         fc_device_copy(got_k.data(), g_k, nk * 2) == FC_STATUS_SUCCESS &&
         fc_device_copy(got_v.data(), g_v, nk * 2) == FC_STATUS_SUCCESS;
    const std::string what = "attention backward on the GPU (Lq " + std::to_string(c.q_len) + ", Lk " +
                             std::to_string(c.kv_len) + ", Hq " + std::to_string(c.q_heads) + ", Hkv " +
                             std::to_string(c.kv_heads) + ", D " + std::to_string(c.head_dim) +
                             (c.causal ? ", causal" : "") + ")";
    check(ok, what + " ran: " + fc_last_error_message());
    const char* names[] = {"dq", "dk", "dv"};
    const std::vector<uint16_t>* wants[] = {&want_q, &want_k, &want_v};
    const std::vector<uint16_t>* gots[] = {&got_q, &got_k, &got_v};
    for (int g = 0; ok && g < 3; ++g) {
      float largest = 0, worst = 0;
      for (size_t i = 0; i < wants[g]->size(); ++i) {
        largest = std::max(largest, std::fabs(bf16_to_f32((*wants[g])[i])));
        worst = std::max(worst, std::fabs(bf16_to_f32((*gots[g])[i]) - bf16_to_f32((*wants[g])[i])));
      }
      check(largest > 0 && worst <= 0.03f * largest, what + ": " + names[g] + " max |err| " +
                                                         std::to_string(worst) + " of max |grad| " +
                                                         std::to_string(largest));
    }
    for (void* p : {dq_in, dk_in, dv_in, d_out, d_do, d_lse, g_q, g_k, g_v}) fc_device_free(p);
  }
}

// libfusedcomm.so exports the C API and the JNI, and keeps the C++ runtime to itself. Builds
// without the JNI library (FUSEDCOMM_JNI=OFF) have nothing to open.
// fc_grouped_gemm on the host backend: groups of 2, 0 and 1 rows (the empty one in the middle),
// a row outside every group left as it was, both weight layouts giving the same product, bf16
// rounding once, and the refusals (offsets out of order or past the rows, null offsets, backend
// auto, f32 on cuda).
void grouped_gemm() {
  // a: 4 x 2; groups' weights (NK, each 2 x 2): g0 = [[1, 0], [0, 1]], g1 unused, g2 = [[1, 1], [2, -1]].
  const float a[] = {1, 2, 3, 4, 5, 6, 7, 8};
  const float w_nk[] = {1, 0, 0, 1, 9, 9, 9, 9, 1, 1, 2, -1};
  const float w_kn[] = {1, 0, 0, 1, 9, 9, 9, 9, 1, 2, 1, -1};  // each group's transpose
  const int64_t offsets[] = {0, 2, 2, 3};
  for (fc_weight_layout_t layout : {FC_LAYOUT_NK, FC_LAYOUT_KN}) {
    float c[8];
    for (float& v : c) v = -100;
    const bool ok = fc_grouped_gemm(FC_BACKEND_HOST, FC_DTYPE_F32, a, layout == FC_LAYOUT_NK ? w_nk : w_kn, c,
                                    offsets, 3, 4, 2, 2, layout) == FC_STATUS_SUCCESS;
    const float want[] = {1, 2, 3, 4, 11, 4, -100, -100};
    check(ok && std::memcmp(c, want, sizeof want) == 0, std::string("host grouped GEMM, ") +
                                                            (layout == FC_LAYOUT_NK ? "NK" : "KN") + ": " +
                                                            fc_last_error_message());
  }
  // bf16: 1 + 2^-8 + 2^-8 accumulated in fp32, rounded once to 1 + 2^-7 (twice would give 1).
  const uint16_t one = 0x3F80, eps = 0x3B80;  // 1.0, 2^-8
  const uint16_t ab[] = {one, eps, eps}, wb[] = {one, one, one};
  uint16_t cb = 0;
  const int64_t off1[] = {0, 1};
  check(fc_grouped_gemm(FC_BACKEND_HOST, FC_DTYPE_BF16, ab, wb, &cb, off1, 1, 1, 1, 3, FC_LAYOUT_NK) ==
                FC_STATUS_SUCCESS &&
            cb == 0x3F81,
        "host grouped GEMM, bf16 rounded once");
  float c[8] = {};
  const int64_t backwards[] = {0, 3, 2, 4};
  check_fails(fc_grouped_gemm(FC_BACKEND_HOST, FC_DTYPE_F32, a, w_nk, c, backwards, 3, 4, 2, 2, FC_LAYOUT_NK),
              FC_STATUS_INVALID_ARGUMENT, "groupedGemm: offsets[2] = 2 must be in [offsets[1] = 3",
              "grouped GEMM offsets out of order");
  const int64_t past[] = {0, 2, 2, 5};
  check_fails(fc_grouped_gemm(FC_BACKEND_HOST, FC_DTYPE_F32, a, w_nk, c, past, 3, 4, 2, 2, FC_LAYOUT_NK),
              FC_STATUS_INVALID_ARGUMENT, "rows = 4", "grouped GEMM offsets past the rows");
  check_fails(fc_grouped_gemm(FC_BACKEND_HOST, FC_DTYPE_F32, a, w_nk, c, nullptr, 3, 4, 2, 2, FC_LAYOUT_NK),
              FC_STATUS_INVALID_ARGUMENT, "offsets must hold groups + 1 = 4 values",
              "grouped GEMM, null offsets");
  check_fails(fc_grouped_gemm(FC_BACKEND_AUTO, FC_DTYPE_F32, a, w_nk, c, offsets, 3, 4, 2, 2, FC_LAYOUT_NK),
              FC_STATUS_INVALID_ARGUMENT, "not auto", "grouped GEMM on backend auto");
  check_fails(fc_grouped_gemm(FC_BACKEND_CUDA, FC_DTYPE_F32, a, w_nk, c, offsets, 3, 4, 2, 2, FC_LAYOUT_NK),
              FC_STATUS_INVALID_ARGUMENT, "takes bf16", "grouped GEMM on cuda in f32");
  check_fails(fc_grouped_gemm(FC_BACKEND_HOST, FC_DTYPE_F32, a, w_nk, c, offsets, -1, 4, 2, 2, FC_LAYOUT_NK),
              FC_STATUS_INVALID_ARGUMENT, "groups = -1", "grouped GEMM with negative groups");
}

// fc_grouped_gemm on the cuda backend where a GPU is present: against the host backend, bit for
// bit (entries of -1, 0, 1 over K = 64: every sum exact in fp32 and in bf16), on a small
// problem, a larger one (the device's kept workspace grows), then the small one again (it is
// reused), with empty groups, groups longer than a 128-row block, and both weight layouts.
void grouped_gemm_on_gpu() {
  void* probe = nullptr;
  if (fc_device_alloc(16, &probe) != FC_STATUS_SUCCESS) {
    std::printf("grouped GEMM on the GPU: skipped, no GPU (%s)\n", fc_last_error_message());
    return;
  }
  fc_device_free(probe);
  struct Problem {
    std::vector<int64_t> offsets;
    int64_t n;
    fc_weight_layout_t layout;
  };
  const Problem problems[] = {{{0, 5, 5, 135}, 16, FC_LAYOUT_NK},
                              {{0, 0, 300, 301, 301, 1000, 1128, 1129, 2500, 2500}, 24, FC_LAYOUT_KN},
                              {{0, 5, 5, 135}, 16, FC_LAYOUT_NK}};
  constexpr int64_t k = 64;
  uint32_t state = 12345;
  auto next = [&state]() {
    state = state * 1664525u + 1013904223u;
    const uint16_t values[] = {0xBF80, 0x0000, 0x3F80};  // -1, 0, 1 in bf16
    return values[(state >> 16) % 3];
  };
  for (const Problem& p : problems) {
    const int64_t groups = static_cast<int64_t>(p.offsets.size()) - 1, rows = p.offsets.back();
    std::vector<uint16_t> a(rows * k), w(groups * p.n * k), want(rows * p.n, 0x7FC0), got(rows * p.n, 0);
    for (uint16_t& v : a) v = next();
    for (uint16_t& v : w) v = next();
    const bool host_ok =
        fc_grouped_gemm(FC_BACKEND_HOST, FC_DTYPE_BF16, a.data(), w.data(), want.data(), p.offsets.data(),
                        groups, rows, p.n, k, p.layout) == FC_STATUS_SUCCESS;
    void *da = nullptr, *dw = nullptr, *dc = nullptr;
    bool ok = host_ok && fc_device_alloc(a.size() * 2, &da) == FC_STATUS_SUCCESS &&
              fc_device_alloc(w.size() * 2, &dw) == FC_STATUS_SUCCESS &&
              fc_device_alloc(got.size() * 2, &dc) == FC_STATUS_SUCCESS &&
              fc_device_copy(da, a.data(), a.size() * 2) == FC_STATUS_SUCCESS &&
              fc_device_copy(dw, w.data(), w.size() * 2) == FC_STATUS_SUCCESS &&
              fc_grouped_gemm(FC_BACKEND_CUDA, FC_DTYPE_BF16, da, dw, dc, p.offsets.data(), groups, rows, p.n,
                              k, p.layout) == FC_STATUS_SUCCESS &&
              fc_device_copy(got.data(), dc, got.size() * 2) == FC_STATUS_SUCCESS;
    check(ok && got == want, "grouped GEMM on the GPU, " + std::to_string(groups) + " groups of " +
                                 std::to_string(rows) +
                                 " rows, as the host backend's: " + fc_last_error_message());
    fc_device_free(da);
    fc_device_free(dw);
    fc_device_free(dc);
  }
}

void exports() {
#ifndef FC_LIBFUSEDCOMM
  std::printf("exports: skipped, libfusedcomm.so is not built (FUSEDCOMM_JNI=OFF)\n");
#else
  void* lib = dlopen(FC_LIBFUSEDCOMM, RTLD_NOW | RTLD_LOCAL);
  check(lib != nullptr, std::string("dlopen libfusedcomm.so: ") + (lib ? "" : dlerror()));
  if (lib == nullptr) return;
  for (const char* sym :
       {"fc_status_string", "fc_last_error_message", "fc_comm_create", "fc_all_reduce",
        "fc_comm_describe_fused", "fc_pointer_info", "Java_io_fusedcomm_api_NativeOps_allReduce",
        "Java_io_fusedcomm_api_NativeOps_pointerInfo", "Java_io_fusedcomm_runtime_NativeApi_memStats",
        "fc_grouped_gemm", "JNI_OnLoad", "fc_moe_gemm_combine", "fc_moe_dispatch_device_rows",
        "fc_moe_dispatch_gemm_ex", "fc_attention_backward", "fc_ring_attention_backward",
        "Java_io_fusedcomm_api_NativeOps_attentionBackward",
        "Java_io_fusedcomm_api_NativeOps_ringAttentionBackward"}) {
    check(dlsym(lib, sym) != nullptr, std::string("exported: ") + sym);
  }
  check(dlsym(lib, "_ZN9fusedcomm4Comm6createERNS_7RuntimeEii") == nullptr,
        "the C++ runtime is not exported");
  using StatusString = const char* (*)(fc_status_t);
  auto name = reinterpret_cast<StatusString>(dlsym(lib, "fc_status_string"));
  check(name != nullptr && std::strcmp(name(FC_STATUS_TIMEOUT), "timeout") == 0,
        "the library's fc_status_string");
  dlclose(lib);
#endif
}

// spark.fusedcomm.transport through the C API: socket and auto start on any host (auto says
// what it chose), libfabric on tcp where libfabric is installed (its reason printed where not),
// unknown values are refused.
void transport_choice() {
  auto make = [](int32_t transport, int32_t provider, int32_t rails, fc_runtime_t* rt,
                 int64_t peer_timeout_ms = 5000) {
    fc_runtime_config_t c;
    fc_runtime_config_init(&c);
    c.backend = FC_BACKEND_HOST;
    c.bind_host = "127.0.0.1";
    c.transport = transport;
    c.libfabric_provider = provider;
    c.libfabric_rails = rails;
    c.libfabric_peer_timeout_ms = peer_timeout_ms;
    return fc_runtime_create(&c, rt);
  };
  auto describe = [](fc_runtime_t rt) {
    const char* d = nullptr;
    return fc_runtime_describe(rt, &d) == FC_STATUS_SUCCESS ? std::string(d) : std::string();
  };
  fc_runtime_config_t d;
  fc_runtime_config_init(&d);
  check(
      d.transport == FC_TRANSPORT_AUTO && d.libfabric_provider == FC_LIBFABRIC_AUTO && d.libfabric_rails == 1 &&
          d.libfabric_peer_timeout_ms == 5000,
      "transport defaults: auto, provider auto, 1 rail, a 5 s peer timeout");
  fc_runtime_t rt = nullptr;
  check(make(FC_TRANSPORT_SOCKET, FC_LIBFABRIC_AUTO, 1, &rt) == FC_STATUS_SUCCESS &&
            describe(rt).find("transport=socket (socket: as configured") != std::string::npos,
        "socket as configured: " + (rt ? describe(rt) : std::string(fc_last_error_message())));
  fc_runtime_destroy(rt);
  rt = nullptr;
  check(make(FC_TRANSPORT_AUTO, FC_LIBFABRIC_AUTO, 1, &rt) == FC_STATUS_SUCCESS &&
            describe(rt).find("(auto: ") != std::string::npos,
        "auto says what it chose: " + (rt ? describe(rt) : std::string(fc_last_error_message())));
  std::printf("  auto: %s\n", rt ? describe(rt).c_str() : "");
  fc_runtime_destroy(rt);
  rt = nullptr;
  const fusedcomm::rdma::Availability tcp =
      fusedcomm::rdma::probe_libfabric(fusedcomm::rdma::LibfabricProvider::kTcp);
  const fc_status_t s = make(FC_TRANSPORT_LIBFABRIC, FC_LIBFABRIC_TCP, 1, &rt);
  if (tcp.available) {
    check(s == FC_STATUS_SUCCESS && describe(rt).find("transport=libfabric") != std::string::npos &&
              describe(rt).find("tcp;ofi_rxm") != std::string::npos,
          "libfabric tcp: " + (rt ? describe(rt) : std::string(fc_last_error_message())));
    fc_runtime_destroy(rt);
    rt = nullptr;
    // More rails than the provider has NICs: refused at start-up, naming the NICs.
    check(make(FC_TRANSPORT_LIBFABRIC, FC_LIBFABRIC_TCP, 8, &rt) == FC_STATUS_UNAVAILABLE &&
              std::string(fc_last_error_message()).find("rails asked for") != std::string::npos,
          std::string("8 rails on loopback: ") + fc_last_error_message());
  } else {
    std::printf("  SKIPPED libfabric tcp runtime: %s\n", tcp.reason.c_str());
    check(s == FC_STATUS_UNAVAILABLE &&
              std::string(fc_last_error_message()).find("libfabric") != std::string::npos,
          std::string("libfabric unavailable, with the reason: ") + fc_last_error_message());
  }
  check(make(7, FC_LIBFABRIC_AUTO, 1, &rt) == FC_STATUS_INVALID_ARGUMENT, "unknown transport refused");
  check(make(FC_TRANSPORT_SOCKET, 9, 1, &rt) == FC_STATUS_INVALID_ARGUMENT, "unknown provider refused");
  check(make(FC_TRANSPORT_SOCKET, FC_LIBFABRIC_AUTO, 0, &rt) == FC_STATUS_INVALID_ARGUMENT,
        "0 rails refused");
  check(make(FC_TRANSPORT_SOCKET, FC_LIBFABRIC_AUTO, 1, &rt, 99) == FC_STATUS_INVALID_ARGUMENT &&
            std::string(fc_last_error_message()).find("peer timeout must be 100..600000 ms") != std::string::npos,
        std::string("a 99 ms peer timeout refused: ") + fc_last_error_message());
}

}  // namespace

int main() {
  status_strings();
  refusals();
  single_rank_gemm_and_memory();
  single_rank_attention();
  single_rank_attention_backward();
  for (int w = 1; w <= 4; ++w) ring_attention_ranks(w);
  grouped_gemm();
  grouped_gemm_on_gpu();
  attention_backward_on_gpu();
  transport_choice();
  device_memory();
  fc_runtime_config_t c;
  fc_runtime_config_init(&c);
  c.backend = FC_BACKEND_HOST;
  c.bind_host = "127.0.0.1";
  c.timeout_ms = 20000;
  fc_runtime_t rt = nullptr;
  check(fc_runtime_create(&c, &rt) == FC_STATUS_SUCCESS,
        std::string("host runtime: ") + fc_last_error_message());
  if (rt != nullptr) {
    fc_backend_t backend = FC_BACKEND_AUTO;
    const char* describe = nullptr;
    check(fc_runtime_backend(rt, &backend) == FC_STATUS_SUCCESS && backend == FC_BACKEND_HOST,
          "resolved backend");
    check(fc_runtime_describe(rt, &describe) == FC_STATUS_SUCCESS &&
              std::string(describe).find("backend=host") != std::string::npos,
          "describe");
    one_rank(rt);
    check(fc_runtime_destroy(rt) == FC_STATUS_SUCCESS, "fc_runtime_destroy");
  }
  exports();
  std::printf("capi_test: %d checks passed, %d failed\n", fusedcomm::testing::g_passed,
              fusedcomm::testing::g_failed);
  return fusedcomm::testing::g_failed == 0 ? 0 : 1;
}
