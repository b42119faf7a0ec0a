// JNI for io.fusedcomm.api.NativeOps: communicators and the ops. Java has validated the
// arguments (shapes, dtypes, tensor sizes) before any call here; each entry converts its
// arguments and calls the C API, whose communicator is the backend's (fusedcomm/comm/comm.h).
// Enums cross as the C API's values (io.fusedcomm.api's code()).
#include <jni.h>

#include <cstdint>
#include <string>
#include <vector>

#include "jni_boundary.h"

using fusedcomm::jni::as;
using fusedcomm::jni::check;
using fusedcomm::jni::Utf8;

namespace {

fc_comm_t comm_of(jlong c) { return as<fc_comm_t>(c); }
fc_dtype_t dtype(jint t) { return static_cast<fc_dtype_t>(t); }
fc_weight_layout_t layout(jint l) { return static_cast<fc_weight_layout_t>(l); }
fc_partials_t partials(jint p) { return static_cast<fc_partials_t>(p); }
fc_stream_t stream_of(jlong s) { return as<fc_stream_t>(s); }

// An op's description and fingerprint (io.fusedcomm.bootstrap.Fingerprint), for the call.
struct Desc {
  Utf8 text;
  fc_op_desc_t desc;
  Desc(JNIEnv* env, jstring d, jlong fp) : text(env, d), desc{text.c_str(), static_cast<uint64_t>(fp)} {}
  const fc_op_desc_t* get() const { return &desc; }
};

}  // namespace

FC_NATIVE(jlong, commCreate)(JNIEnv* env, jclass, jlong rt, jint rank, jint world) {
  FC_JNI_BEGIN
  fc_comm_t comm = nullptr;
  check(fc_comm_create(as<fc_runtime_t>(rt), rank, world, &comm));
  return reinterpret_cast<jlong>(comm);
  FC_JNI_END(0)
}

FC_NATIVE(jbyteArray, commDeviceHandle)(JNIEnv* env, jclass, jlong c) {
  FC_JNI_BEGIN
  const uint8_t* data = nullptr;
  size_t bytes = 0;
  check(fc_comm_device_handle(comm_of(c), &data, &bytes));
  return fusedcomm::jni::to_jbytes(env, data, bytes);
  FC_JNI_END(nullptr)
}

FC_NATIVE(jlong, commSymmetricBytes)(JNIEnv* env, jclass, jlong c) {
  FC_JNI_BEGIN
  uint64_t bytes = 0;
  check(fc_comm_symmetric_bytes(comm_of(c), &bytes));
  return static_cast<jlong>(bytes);
  FC_JNI_END(0)
}

FC_NATIVE(jstring, commEndpoint)(JNIEnv* env, jclass, jlong c) {
  FC_JNI_BEGIN
  const char* endpoint = nullptr;
  check(fc_comm_endpoint(comm_of(c), &endpoint));
  return fusedcomm::jni::to_jstring(env, endpoint);
  FC_JNI_END(nullptr)
}

// endpoints, auth shares (FC_AUTH_SHARE_BYTES each), device handles and host ids: one per rank,
// by rank.
FC_NATIVE(void, commConnect)
(JNIEnv* env, jclass, jlong c, jobjectArray endpoints, jint rank, jlong comm_id, jobjectArray auth_shares,
 jobjectArray device_handles, jintArray host_ids) {
  FC_JNI_BEGIN
  const std::vector<std::string> eps = fusedcomm::jni::to_strings(env, endpoints);
  const jsize n = static_cast<jsize>(eps.size());
  if (auth_shares == nullptr || device_handles == nullptr || host_ids == nullptr ||
      env->GetArrayLength(auth_shares) != n || env->GetArrayLength(device_handles) != n ||
      env->GetArrayLength(host_ids) != n) {
    fusedcomm::jni::invalid(
        "connect: endpoints, auth shares, device handles and host ids must have one entry per rank");
  }
  std::vector<uint8_t> shares(static_cast<size_t>(n) * FC_AUTH_SHARE_BYTES);
  std::vector<const uint8_t*> share_ptrs;
  for (jsize i = 0; i < n; ++i) {
    auto a = static_cast<jbyteArray>(env->GetObjectArrayElement(auth_shares, i));
    const bool ok = a != nullptr && env->GetArrayLength(a) == FC_AUTH_SHARE_BYTES;
    if (ok) {
      env->GetByteArrayRegion(
          a, 0, FC_AUTH_SHARE_BYTES,
          reinterpret_cast<jbyte*>(shares.data() + static_cast<size_t>(i) * FC_AUTH_SHARE_BYTES));
    }
    env->DeleteLocalRef(a);
    if (!ok) {
      fusedcomm::jni::invalid("connect: the auth share of rank " + std::to_string(i) + " is not " +
                              std::to_string(FC_AUTH_SHARE_BYTES) + " bytes");
    }
    share_ptrs.push_back(shares.data() + static_cast<size_t>(i) * FC_AUTH_SHARE_BYTES);
  }
  std::vector<const char*> ep_ptrs;
  std::vector<std::vector<uint8_t>> blobs(n);
  std::vector<const uint8_t*> blob_ptrs;
  std::vector<size_t> blob_bytes;
  for (jsize i = 0; i < n; ++i) {
    ep_ptrs.push_back(eps[i].c_str());
    auto a = static_cast<jbyteArray>(env->GetObjectArrayElement(device_handles, i));
    blobs[i].resize(a == nullptr ? 0 : env->GetArrayLength(a));
    if (!blobs[i].empty()) {
      env->GetByteArrayRegion(a, 0, static_cast<jsize>(blobs[i].size()),
                              reinterpret_cast<jbyte*>(blobs[i].data()));
    }
    env->DeleteLocalRef(a);
    blob_ptrs.push_back(blobs[i].data());
    blob_bytes.push_back(blobs[i].size());
  }
  std::vector<int32_t> hosts(n);
  env->GetIntArrayRegion(host_ids, 0, n, reinterpret_cast<jint*>(hosts.data()));
  check(fc_comm_connect(comm_of(c), rank, static_cast<uint64_t>(comm_id), n, ep_ptrs.data(),
                        share_ptrs.data(), blob_ptrs.data(), blob_bytes.data(), hosts.data()));
  FC_JNI_END()
}

FC_NATIVE(void, commSynchronize)(JNIEnv* env, jclass, jlong c) {
  FC_JNI_BEGIN
  check(fc_comm_synchronize(comm_of(c)));
  FC_JNI_END()
}

FC_NATIVE(void, commFinish)(JNIEnv* env, jclass, jlong c) {
  FC_JNI_BEGIN
  check(fc_comm_finish(comm_of(c)));
  FC_JNI_END()
}

FC_NATIVE(void, commAbort)(JNIEnv* env, jclass, jlong c) {
  FC_JNI_BEGIN
  check(fc_comm_abort(comm_of(c)));
  FC_JNI_END()
}

FC_NATIVE(void, commClose)(JNIEnv* env, jclass, jlong c) {
  FC_JNI_BEGIN
  check(fc_comm_close(comm_of(c)));
  FC_JNI_END()
}

FC_NATIVE(jlong, commTimeCollective)
(JNIEnv* env, jclass, jlong c, jint op, jint t, jlong in, jlong out, jlong count, jint iters) {
  FC_JNI_BEGIN
  int64_t nanos = 0;
  check(fc_comm_time_collective(comm_of(c), static_cast<fc_op_t>(op), dtype(t), as<const void*>(in),
                                as<void*>(out), count, iters, &nanos));
  return nanos;
  FC_JNI_END(0)
}

FC_NATIVE(void, allGather)
(JNIEnv* env, jclass, jlong c, jstring d, jlong fp, jint t, jlong in, jlong out, jlong count, jlong stream) {
  FC_JNI_BEGIN
  check(fc_all_gather(comm_of(c), Desc(env, d, fp).get(), dtype(t), as<const void*>(in), as<void*>(out),
                      count, stream_of(stream)));
  FC_JNI_END()
}

FC_NATIVE(void, reduceScatter)
(JNIEnv* env, jclass, jlong c, jstring d, jlong fp, jint t, jlong in, jlong out, jlong count, jlong stream) {
  FC_JNI_BEGIN
  check(fc_reduce_scatter(comm_of(c), Desc(env, d, fp).get(), dtype(t), as<const void*>(in), as<void*>(out),
                          count, stream_of(stream)));
  FC_JNI_END()
}

FC_NATIVE(void, allReduce)
(JNIEnv* env, jclass, jlong c, jstring d, jlong fp, jint t, jlong in, jlong out, jlong count, jlong stream) {
  FC_JNI_BEGIN
  check(fc_all_reduce(comm_of(c), Desc(env, d, fp).get(), dtype(t), as<const void*>(in), as<void*>(out),
                      count, stream_of(stream)));
  FC_JNI_END()
}

FC_NATIVE(void, allToAll)
(JNIEnv* env, jclass, jlong c, jstring d, jlong fp, jint t, jlong in, jlong out, jlong count, jlong stream) {
  FC_JNI_BEGIN
  check(fc_all_to_all(comm_of(c), Desc(env, d, fp).get(), dtype(t), as<const void*>(in), as<void*>(out),
                      count, stream_of(stream)));
  FC_JNI_END()
}

FC_NATIVE(void, allGatherGemm)
(JNIEnv* env, jclass, jlong c, jstring d, jlong fp, jint t, jlong a, jlong w, jlong out, jlong gathered,
 jlong m, jlong n_local, jlong k, jint l, jlong stream) {
  FC_JNI_BEGIN
  check(fc_all_gather_gemm(comm_of(c), Desc(env, d, fp).get(), dtype(t), as<const void*>(a),
                           as<const void*>(w), as<void*>(out), as<void*>(gathered), m, n_local, k, layout(l),
                           stream_of(stream)));
  FC_JNI_END()
}

FC_NATIVE(void, gemmReduceScatter)
(JNIEnv* env, jclass, jlong c, jstring d, jlong fp, jint t, jlong a, jlong w, jlong out, jlong m, jlong n,
 jlong k_local, jint l, jint p, jlong stream) {
  FC_JNI_BEGIN
  check(fc_gemm_reduce_scatter(comm_of(c), Desc(env, d, fp).get(), dtype(t), as<const void*>(a),
                               as<const void*>(w), as<void*>(out), m, n, k_local, layout(l), partials(p),
                               stream_of(stream)));
  FC_JNI_END()
}

FC_NATIVE(void, gemmAllReduce)
(JNIEnv* env, jclass, jlong c, jstring d, jlong fp, jint t, jlong a, jlong w, jlong out, jlong m, jlong n,
 jlong k_local, jint l, jint p, jlong stream) {
  FC_JNI_BEGIN
  check(fc_gemm_all_reduce(comm_of(c), Desc(env, d, fp).get(), dtype(t), as<const void*>(a),
                           as<const void*>(w), as<void*>(out), m, n, k_local, layout(l), partials(p),
                           stream_of(stream)));
  FC_JNI_END()
}

// op: Op.code() of a fused op.
FC_NATIVE(jstring, commDescribeFused)
(JNIEnv* env, jclass, jlong c, jint op, jlong m, jlong n, jlong k, jint p) {
  FC_JNI_BEGIN
  const char* phrase = nullptr;
  check(fc_comm_describe_fused(comm_of(c), static_cast<fc_op_t>(op), m, n, k, partials(p), &phrase));
  return fusedcomm::jni::to_jstring(env, phrase);
  FC_JNI_END(nullptr)
}

FC_NATIVE(jlong, moeDispatchGemm)
(JNIEnv* env, jclass, jlong c, jstring d, jlong fp, jint t, jlong x, jlong tokens, jlong hidden, jlong ids,
 jlong weights, jint topk, jlong num_experts, jlong w1, jlong ffn, jlong max_recv_rows) {
  FC_JNI_BEGIN
  fc_moe_dispatch_t dispatch = nullptr;
  fc_moe_options_t options{};
  options.max_recv_rows = max_recv_rows;
  check(fc_moe_dispatch_gemm_ex(comm_of(c), Desc(env, d, fp).get(), dtype(t), as<const void*>(x), tokens,
                                hidden, as<const int32_t*>(ids), as<const float*>(weights), topk, num_experts,
                                as<const void*>(w1), ffn, &options, &dispatch));
  return reinterpret_cast<jlong>(dispatch);
  FC_JNI_END(0)
}

// [rows, firstLocalExpert, localExperts, tokens, topk, offsets[0..localExperts]]
FC_NATIVE(jlongArray, moeInfo)(JNIEnv* env, jclass, jlong h) {
  FC_JNI_BEGIN
  fc_moe_layout_t l;
  check(fc_moe_dispatch_layout(as<fc_moe_dispatch_t>(h), &l));
  std::vector<jlong> v = {l.rows, l.first_local_expert, l.local_experts, l.tokens, l.topk};
  v.insert(v.end(), l.expert_offsets, l.expert_offsets + l.local_experts + 1);
  if (v.size() > static_cast<size_t>(INT32_MAX)) fusedcomm::jni::invalid("moeInfo: too many local experts");
  jlongArray a =
      fusedcomm::jni::non_null(env, env->NewLongArray(static_cast<jsize>(v.size())), "NewLongArray");
  env->SetLongArrayRegion(a, 0, static_cast<jsize>(v.size()), v.data());
  return a;
  FC_JNI_END(nullptr)
}

FC_NATIVE(void, moeCopy)(JNIEnv* env, jclass, jlong h, jlong expert_out, jlong routed_x) {
  FC_JNI_BEGIN
  check(fc_moe_dispatch_copy(as<fc_moe_dispatch_t>(h), as<void*>(expert_out), as<void*>(routed_x)));
  FC_JNI_END()
}

// [expert outputs, routed tokens]: the cuda dispatch's device addresses (0 without rows).
FC_NATIVE(jlongArray, moeDeviceRows)(JNIEnv* env, jclass, jlong h) {
  FC_JNI_BEGIN
  void *expert_out = nullptr, *routed_x = nullptr;
  check(fc_moe_dispatch_device_rows(as<fc_moe_dispatch_t>(h), &expert_out, &routed_x));
  const jlong v[] = {reinterpret_cast<jlong>(expert_out), reinterpret_cast<jlong>(routed_x)};
  jlongArray a = fusedcomm::jni::non_null(env, env->NewLongArray(2), "NewLongArray");
  env->SetLongArrayRegion(a, 0, 2, v);
  return a;
  FC_JNI_END(nullptr)
}

// Each array: one element per routed row (rows of moeInfo). Their lengths are checked before
// the first copy: a copy that throws leaves an exception pending, and no JNI call may follow it.
FC_NATIVE(void, moeRowMeta)
(JNIEnv* env, jclass, jlong h, jintArray src_rank, jintArray src_token, jintArray slot, jfloatArray weight) {
  FC_JNI_BEGIN
  fc_moe_layout_t l;
  check(fc_moe_dispatch_layout(as<fc_moe_dispatch_t>(h), &l));
  if (l.rows < 0 || l.rows > INT32_MAX)
    fusedcomm::jni::invalid("moeRowMeta: " + std::to_string(l.rows) + " rows");
  const auto n = static_cast<jsize>(l.rows);
  const jarray arrays[] = {src_rank, src_token, slot, weight};
  const char* names[] = {"srcRank", "srcToken", "slot", "weight"};
  for (int i = 0; i < 4; ++i) {
    if (arrays[i] == nullptr) fusedcomm::jni::invalid(std::string("moeRowMeta: null ") + names[i]);
    const jsize length = env->GetArrayLength(arrays[i]);
    if (length != n) {
      fusedcomm::jni::invalid(std::string("moeRowMeta: ") + names[i] + " has " + std::to_string(length) +
                              " elements for " + std::to_string(n) + " rows");
    }
  }
  env->SetIntArrayRegion(src_rank, 0, n, l.src_rank);
  env->SetIntArrayRegion(src_token, 0, n, l.src_token);
  env->SetIntArrayRegion(slot, 0, n, l.src_slot);
  env->SetFloatArrayRegion(weight, 0, n, l.weight);
  FC_JNI_END()
}

// The single-rank grouped GEMM: backend cuda (bf16, device pointers of the calling thread's
// current GPU) or host; offsets: groups + 1 row offsets, copied from the Java array.
FC_NATIVE(void, groupedGemm)
(JNIEnv* env, jclass, jint backend, jint t, jlong a, jlong w, jlong c, jlongArray offsets, jlong groups,
 jlong rows, jlong n, jlong k, jint l) {
  FC_JNI_BEGIN
  if (offsets == nullptr) fusedcomm::jni::invalid("groupedGemm: null offsets");
  const jsize len = env->GetArrayLength(offsets);
  if (groups < 0 || len != groups + 1)
    fusedcomm::jni::invalid("groupedGemm: offsets must hold groups + 1 values");
  std::vector<int64_t> off(static_cast<size_t>(len));
  env->GetLongArrayRegion(offsets, 0, len, reinterpret_cast<jlong*>(off.data()));
  fusedcomm::jni::check_pending(env, "GetLongArrayRegion");
  check(fc_grouped_gemm(static_cast<fc_backend_t>(backend), dtype(t), as<const void*>(a), as<const void*>(w),
                        as<void*>(c), off.data(), groups, rows, n, k, static_cast<fc_weight_layout_t>(l)));
  FC_JNI_END()
}

FC_NATIVE(void, moeCombine)
(JNIEnv* env, jclass, jlong c, jstring d, jlong fp, jint t, jlong h, jlong expert_out, jlong width,
 jlong out) {
  FC_JNI_BEGIN
  check(fc_moe_combine(comm_of(c), Desc(env, d, fp).get(), dtype(t), as<fc_moe_dispatch_t>(h),
                       as<const void*>(expert_out), width, as<void*>(out)));
  FC_JNI_END()
}

FC_NATIVE(void, moeGemmCombine)
(JNIEnv* env, jclass, jlong c, jstring d, jlong fp, jint t, jlong h, jlong x, jlong k, jlong w2, jlong width,
 jlong out) {
  FC_JNI_BEGIN
  check(fc_moe_gemm_combine(comm_of(c), Desc(env, d, fp).get(), dtype(t), as<fc_moe_dispatch_t>(h),
                            as<const void*>(x), k, as<const void*>(w2), FC_LAYOUT_NK, width, as<void*>(out)));
  FC_JNI_END()
}

FC_NATIVE(void, moeFree)(JNIEnv* env, jclass, jlong h) {
  FC_JNI_BEGIN
  check(fc_moe_dispatch_free(as<fc_moe_dispatch_t>(h)));
  FC_JNI_END()
}

FC_NATIVE(void, ringAttention)
(JNIEnv* env, jclass, jlong c, jstring d, jlong fp, jint t, jlong batch, jlong seq, jlong q_heads,
 jlong kv_heads, jlong head_dim, jboolean causal, jfloat scale, jint layout, jlong q, jlong k, jlong v,
 jlong o, jlong lse, jlong stream) {
  FC_JNI_BEGIN
  const int32_t is_causal = causal == JNI_TRUE ? 1 : 0;
  const fc_attention_shape_t s{batch, seq, q_heads, kv_heads, head_dim, is_causal, scale, layout};
  check(fc_ring_attention(comm_of(c), Desc(env, d, fp).get(), dtype(t), &s, as<const void*>(q),
                          as<const void*>(k), as<const void*>(v), as<void*>(o), as<float*>(lse),
                          stream_of(stream)));
  FC_JNI_END()
}

FC_NATIVE(void, ringAttentionBackward)
(JNIEnv* env, jclass, jlong c, jstring d, jlong fp, jint t, jlong batch, jlong seq, jlong q_heads,
 jlong kv_heads, jlong head_dim, jboolean causal, jfloat scale, jint layout, jlong q, jlong k, jlong v,
 jlong o, jlong lse, jlong d_o, jlong dq, jlong dk, jlong dv, jlong stream) {
  FC_JNI_BEGIN
  const int32_t is_causal = causal == JNI_TRUE ? 1 : 0;
  const fc_attention_shape_t s{batch, seq, q_heads, kv_heads, head_dim, is_causal, scale, layout};
  check(fc_ring_attention_backward(comm_of(c), Desc(env, d, fp).get(), dtype(t), &s, as<const void*>(q),
                                   as<const void*>(k), as<const void*>(v), as<const void*>(o),
                                   as<const float*>(lse), as<const void*>(d_o), as<void*>(dq), as<void*>(dk),
                                   as<void*>(dv), stream_of(stream)));
  FC_JNI_END()
}
