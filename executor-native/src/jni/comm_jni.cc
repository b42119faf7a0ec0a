// JNI for io.fusedcomm.runtime.NativeApi: communicators and the ops. Java has validated the
// arguments (shapes, dtypes, tensor sizes) before any call here; each entry converts its
// arguments, names the op for errors (begin_op) and calls the backend.
#include <jni.h>

#include <cstring>
#include <memory>

#include "fusedcomm/host/host_ops.h"
#include "fusedcomm/runtime/communicator.h"
#include "fusedcomm/runtime/device_gemm.h"
#include "fusedcomm/runtime/runtime.h"
#include "jni/jni_boundary.h"

using fusedcomm::Communicator;
using fusedcomm::ErrorKind;
using fusedcomm::jni::from_handle;
namespace host = fusedcomm::host;

namespace {

struct CommHandle {
  fusedcomm::Runtime* runtime;
  std::unique_ptr<Communicator> comm;
};

// Starts an op on the host backend: names it (errors and the cross-rank check) and returns the
// communicator. The cuda backend's ops come with the GPU runtime; until then they refuse loudly.
Communicator& start_op(JNIEnv* env, jlong handle, jstring description, jlong fingerprint) {
  auto* h = from_handle<CommHandle>(handle, "the communicator");
  std::string desc = fusedcomm::jni::to_string(env, description);
  if (h->runtime->backend() != fusedcomm::Backend::kHost) {
    fusedcomm::fail(ErrorKind::kUnavailable,
                    desc + ": the cuda backend's ops are not available in this build; use "
                           "spark.fusedcomm.backend=host");
  }
  h->comm->begin_op(desc, static_cast<uint64_t>(fingerprint));
  return *h->comm;
}

host::DType dtype(jint t) {
  FC_REQUIRE(t == 0 || t == 1, "unsupported dtype " + std::to_string(t) + " (f32 or bf16)");
  return static_cast<host::DType>(t);
}

host::WeightLayout layout(jint l) {
  FC_REQUIRE(l == 0 || l == 1, "unknown weight layout " + std::to_string(l));
  return static_cast<host::WeightLayout>(l);
}

template <typename T = void>
T* ptr(jlong address) {
  return reinterpret_cast<T*>(address);
}

}  // namespace

FC_NATIVE(jlong, commCreate)(JNIEnv* env, jclass, jlong rt, jint world) {
  FC_JNI_BEGIN
  auto* runtime = from_handle<fusedcomm::Runtime>(rt, "the runtime");
  auto h = std::make_unique<CommHandle>();
  h->runtime = runtime;
  h->comm = std::make_unique<Communicator>(*runtime, world);
  return reinterpret_cast<jlong>(h.release());
  FC_JNI_END(0)
}

FC_NATIVE(jstring, commEndpoint)(JNIEnv* env, jclass, jlong c) {
  FC_JNI_BEGIN
  return fusedcomm::jni::to_jstring(env, from_handle<CommHandle>(c, "the communicator")->comm->endpoint());
  FC_JNI_END(nullptr)
}

FC_NATIVE(void, commConnect)(JNIEnv* env, jclass, jlong c, jobjectArray endpoints, jint rank, jlong comm_id) {
  FC_JNI_BEGIN
  from_handle<CommHandle>(c, "the communicator")
      ->comm->connect(fusedcomm::jni::to_strings(env, endpoints), rank, static_cast<uint64_t>(comm_id));
  FC_JNI_END()
}

FC_NATIVE(void, commFinish)(JNIEnv* env, jclass, jlong c) {
  FC_JNI_BEGIN
  from_handle<CommHandle>(c, "the communicator")->comm->finish();
  FC_JNI_END()
}

FC_NATIVE(void, commAbort)(JNIEnv* env, jclass, jlong c) {
  FC_JNI_BEGIN
  from_handle<CommHandle>(c, "the communicator")->comm->abort();
  FC_JNI_END()
}

// Frees the communicator whatever happens; a failure of the closing barrier is reported after.
FC_NATIVE(void, commClose)(JNIEnv* env, jclass, jlong c) {
  FC_JNI_BEGIN
  std::unique_ptr<CommHandle> h(from_handle<CommHandle>(c, "the communicator"));
  h->comm->close();
  FC_JNI_END()
}

FC_NATIVE(void, allGather)(JNIEnv* env, jclass, jlong c, jstring d, jlong fp, jint t, jlong in, jlong out, jlong count) {
  FC_JNI_BEGIN
  host::all_gather(start_op(env, c, d, fp), dtype(t), ptr(in), ptr(out), count);
  FC_JNI_END()
}

FC_NATIVE(void, reduceScatter)(JNIEnv* env, jclass, jlong c, jstring d, jlong fp, jint t, jlong in, jlong out, jlong count) {
  FC_JNI_BEGIN
  host::reduce_scatter(start_op(env, c, d, fp), dtype(t), ptr(in), ptr(out), count);
  FC_JNI_END()
}

FC_NATIVE(void, allReduce)(JNIEnv* env, jclass, jlong c, jstring d, jlong fp, jint t, jlong in, jlong out, jlong count) {
  FC_JNI_BEGIN
  host::all_reduce(start_op(env, c, d, fp), dtype(t), ptr(in), ptr(out), count);
  FC_JNI_END()
}

FC_NATIVE(void, allToAll)(JNIEnv* env, jclass, jlong c, jstring d, jlong fp, jint t, jlong in, jlong out, jlong count) {
  FC_JNI_BEGIN
  host::all_to_all(start_op(env, c, d, fp), dtype(t), ptr(in), ptr(out), count);
  FC_JNI_END()
}

FC_NATIVE(void, gemm)(JNIEnv* env, jclass, jint t, jlong a, jlong w, jlong c, jlong m, jlong n, jlong k, jint l) {
  FC_JNI_BEGIN
  host::gemm(dtype(t), ptr(a), ptr(w), ptr(c), m, n, k, layout(l));
  FC_JNI_END()
}

FC_NATIVE(void, allGatherGemm)(JNIEnv* env, jclass, jlong comm, jstring d, jlong fp, jint t, jlong a, jlong w,
                               jlong c, jlong gathered, jlong m, jlong n_local, jlong k, jint l) {
  FC_JNI_BEGIN
  host::all_gather_gemm(start_op(env, comm, d, fp), dtype(t), ptr(a), ptr(w), ptr(c), ptr(gathered), m, n_local,
                        k, layout(l));
  FC_JNI_END()
}

FC_NATIVE(void, gemmReduceScatter)(JNIEnv* env, jclass, jlong comm, jstring d, jlong fp, jint t, jlong a,
                                   jlong w, jlong c, jlong m, jlong n, jlong k_local, jint l) {
  FC_JNI_BEGIN
  host::gemm_reduce_scatter(start_op(env, comm, d, fp), dtype(t), ptr(a), ptr(w), ptr(c), m, n, k_local, layout(l));
  FC_JNI_END()
}

FC_NATIVE(void, gemmAllReduce)(JNIEnv* env, jclass, jlong comm, jstring d, jlong fp, jint t, jlong a, jlong w,
                               jlong c, jlong m, jlong n, jlong k_local, jint l) {
  FC_JNI_BEGIN
  host::gemm_all_reduce(start_op(env, comm, d, fp), dtype(t), ptr(a), ptr(w), ptr(c), m, n, k_local, layout(l));
  FC_JNI_END()
}

FC_NATIVE(jlong, moeDispatchGemm)(JNIEnv* env, jclass, jlong comm, jstring d, jlong fp, jint t, jlong x,
                                  jlong tokens, jlong hidden, jlong ids, jlong weights, jint topk,
                                  jlong num_experts, jlong w1, jlong ffn) {
  FC_JNI_BEGIN
  auto result = std::make_unique<host::MoeDispatchResult>(
      host::moe_dispatch_gemm(start_op(env, comm, d, fp), dtype(t), ptr(x), tokens, hidden,
                              ptr<const int32_t>(ids), ptr<const float>(weights), topk, num_experts, ptr(w1), ffn));
  return reinterpret_cast<jlong>(result.release());
  FC_JNI_END(0)
}

// [rows, firstLocalExpert, localExperts, tokens, topk, offsets[0..localExperts]]
FC_NATIVE(jlongArray, moeInfo)(JNIEnv* env, jclass, jlong h) {
  FC_JNI_BEGIN
  const auto& l = from_handle<host::MoeDispatchResult>(h, "the MoE dispatch")->layout;
  std::vector<jlong> v = {l.rows(), l.first_local_expert, l.local_experts, l.tokens, l.topk};
  for (int64_t o : l.expert_offsets) v.push_back(o);
  jlongArray a = env->NewLongArray(static_cast<jsize>(v.size()));
  env->SetLongArrayRegion(a, 0, static_cast<jsize>(v.size()), v.data());
  return a;
  FC_JNI_END(nullptr)
}

FC_NATIVE(void, moeCopy)(JNIEnv* env, jclass, jlong h, jlong expert_out, jlong routed_x) {
  FC_JNI_BEGIN
  auto* r = from_handle<host::MoeDispatchResult>(h, "the MoE dispatch");
  if (expert_out != 0 && !r->out.empty()) std::memcpy(ptr(expert_out), r->out.data(), r->out.size());
  if (routed_x != 0 && !r->routed_x.empty()) std::memcpy(ptr(routed_x), r->routed_x.data(), r->routed_x.size());
  FC_JNI_END()
}

FC_NATIVE(void, moeRowMeta)(JNIEnv* env, jclass, jlong h, jintArray src_rank, jintArray src_token,
                            jintArray slot, jfloatArray weight) {
  FC_JNI_BEGIN
  const auto& l = from_handle<host::MoeDispatchResult>(h, "the MoE dispatch")->layout;
  auto n = static_cast<jsize>(l.rows());
  env->SetIntArrayRegion(src_rank, 0, n, l.src_rank.data());
  env->SetIntArrayRegion(src_token, 0, n, l.src_token.data());
  env->SetIntArrayRegion(slot, 0, n, l.src_slot.data());
  env->SetFloatArrayRegion(weight, 0, n, l.weight.data());
  FC_JNI_END()
}

FC_NATIVE(void, moeCombine)(JNIEnv* env, jclass, jlong comm, jstring d, jlong fp, jint t, jlong h,
                            jlong expert_out, jlong width, jlong out) {
  FC_JNI_BEGIN
  const auto& l = from_handle<host::MoeDispatchResult>(h, "the MoE dispatch")->layout;
  host::moe_combine(start_op(env, comm, d, fp), dtype(t), l, ptr(expert_out), width, ptr(out));
  FC_JNI_END()
}

FC_NATIVE(void, moeFree)(JNIEnv* env, jclass, jlong h) {
  FC_JNI_BEGIN
  delete reinterpret_cast<host::MoeDispatchResult*>(h);
  FC_JNI_END()
}

FC_NATIVE(void, ringAttention)(JNIEnv* env, jclass, jlong comm, jstring d, jlong fp, jint t, jlong batch,
                               jlong seq, jlong q_heads, jlong kv_heads, jlong head_dim, jboolean causal,
                               jfloat scale, jlong q, jlong k, jlong v, jlong o, jlong lse) {
  FC_JNI_BEGIN
  host::AttentionShape s;
  s.batch = batch;
  s.seq = seq;
  s.q_heads = q_heads;
  s.kv_heads = kv_heads;
  s.head_dim = head_dim;
  s.causal = causal == JNI_TRUE;
  s.scale = scale;
  host::ring_attention(start_op(env, comm, d, fp), dtype(t), s, ptr(q), ptr(k), ptr(v), ptr(o), ptr<float>(lse));
  FC_JNI_END()
}

FC_NATIVE(void, gemmDevice)(JNIEnv* env, jclass, jlong a, jlong w, jlong c, jlong m, jlong n, jlong k, jint l) {
  FC_JNI_BEGIN
  layout(l);
  fusedcomm::device_gemm_bf16(ptr(a), ptr(w), ptr(c), m, n, k, l);
  FC_JNI_END()
}
