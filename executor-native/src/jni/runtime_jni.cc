// JNI for io.fusedcomm.runtime.NativeApi (availability, the executor runtime, memory statistics)
// and for the memory entries of io.fusedcomm.api.NativeOps (host memory and its views, device
// memory and streams, the single-rank GEMM, JCuda handles). Argument conversion and one C API
// call each.
#include <jni.h>

#include <cstdint>
#include <string>

#include "jni_boundary.h"

using fusedcomm::jni::as;
using fusedcomm::jni::check;
using fusedcomm::jni::to_jstring;

FC_RUNTIME_NATIVE(jstring, availability)(JNIEnv* env, jclass) {
  FC_JNI_BEGIN
  const char* report = nullptr;
  check(fc_availability(&report));
  return to_jstring(env, report);
  FC_JNI_END(nullptr)
}

FC_RUNTIME_NATIVE(jlong, runtimeCreate)
(JNIEnv* env, jclass, jint backend, jlong timeout_ms, jlong connect_timeout_ms, jlong chunk_bytes,
 jlong symmetric_bytes, jstring bind_host, jint transport_streams, jlong busy_poll_us, jint gpu_ordinal,
 jlong job_token, jboolean allow_shared_gpu, jint transport, jint libfabric_provider, jint libfabric_rails,
 jlong libfabric_peer_timeout_ms) {
  FC_JNI_BEGIN
  const fusedcomm::jni::Utf8 host(env, bind_host);
  fc_runtime_config_t c;
  check(fc_runtime_config_init(&c));
  c.backend = static_cast<fc_backend_t>(backend);
  c.timeout_ms = timeout_ms;
  c.connect_timeout_ms = connect_timeout_ms;
  c.chunk_bytes = chunk_bytes;
  c.symmetric_bytes = symmetric_bytes;
  c.bind_host = host.c_str();
  c.transport_streams = transport_streams;
  c.busy_poll_us = busy_poll_us;
  c.gpu_ordinal = gpu_ordinal;
  c.job_token = static_cast<uint64_t>(job_token);
  c.allow_shared_gpu = allow_shared_gpu == JNI_TRUE;
  c.transport = transport;
  c.libfabric_provider = libfabric_provider;
  c.libfabric_rails = libfabric_rails;
  c.libfabric_peer_timeout_ms = libfabric_peer_timeout_ms;
  fc_runtime_t rt = nullptr;
  check(fc_runtime_create(&c, &rt));
  return reinterpret_cast<jlong>(rt);
  FC_JNI_END(0)
}

FC_RUNTIME_NATIVE(jint, runtimeBackend)(JNIEnv* env, jclass, jlong rt) {
  FC_JNI_BEGIN
  fc_backend_t backend = FC_BACKEND_AUTO;
  check(fc_runtime_backend(as<fc_runtime_t>(rt), &backend));
  return static_cast<jint>(backend);
  FC_JNI_END(0)
}

FC_RUNTIME_NATIVE(jstring, runtimeDescribe)(JNIEnv* env, jclass, jlong rt) {
  FC_JNI_BEGIN
  const char* s = nullptr;
  check(fc_runtime_describe(as<fc_runtime_t>(rt), &s));
  return to_jstring(env, s);
  FC_JNI_END(nullptr)
}

FC_RUNTIME_NATIVE(jstring, runtimeGpuUuid)(JNIEnv* env, jclass, jlong rt) {
  FC_JNI_BEGIN
  const char* s = nullptr;
  check(fc_runtime_gpu_uuid(as<fc_runtime_t>(rt), &s));
  return to_jstring(env, s);
  FC_JNI_END(nullptr)
}

FC_RUNTIME_NATIVE(jint, runtimePooledRegions)(JNIEnv* env, jclass, jlong rt) {
  FC_JNI_BEGIN
  int32_t n = 0;
  check(fc_runtime_pooled_regions(as<fc_runtime_t>(rt), &n));
  return n;
  FC_JNI_END(0)
}

FC_RUNTIME_NATIVE(void, runtimePinGpu)(JNIEnv* env, jclass, jlong rt) {
  FC_JNI_BEGIN
  check(fc_runtime_pin_gpu(as<fc_runtime_t>(rt)));
  FC_JNI_END()
}

FC_RUNTIME_NATIVE(void, runtimeClose)(JNIEnv* env, jclass, jlong rt) {
  FC_JNI_BEGIN
  check(fc_runtime_destroy(as<fc_runtime_t>(rt)));
  FC_JNI_END()
}

FC_NATIVE(jlong, memAlloc)(JNIEnv* env, jclass, jlong bytes) {
  FC_JNI_BEGIN
  if (bytes < 0) fusedcomm::jni::invalid("negative allocation size");
  void* p = nullptr;
  check(fc_host_alloc(static_cast<size_t>(bytes), &p));
  return reinterpret_cast<jlong>(p);
  FC_JNI_END(0)
}

FC_NATIVE(void, memFree)(JNIEnv* env, jclass, jlong address) {
  FC_JNI_BEGIN
  check(fc_host_free(as<void*>(address)));
  FC_JNI_END()
}

// A direct ByteBuffer's capacity is a Java int: a larger view is refused, never wrapped.
FC_NATIVE(jobject, memView)(JNIEnv* env, jclass, jlong address, jlong bytes) {
  FC_JNI_BEGIN
  if (bytes < 0 || bytes > INT32_MAX) {
    fusedcomm::jni::invalid("a view of " + std::to_string(bytes) + " bytes: a ByteBuffer holds 0 to " +
                            std::to_string(INT32_MAX));
  }
  if (address == 0 && bytes > 0) fusedcomm::jni::invalid("a view of null memory");
  return env->NewDirectByteBuffer(as<void*>(address), bytes);
  FC_JNI_END(nullptr)
}

// {type (fc_memory_type_t), device, range base, range bytes}.
FC_NATIVE(jlongArray, pointerInfo)(JNIEnv* env, jclass, jlong address) {
  FC_JNI_BEGIN
  fc_pointer_info_t info;
  check(fc_pointer_info(as<const void*>(address), &info));
  jlong v[4] = {static_cast<jlong>(info.type), static_cast<jlong>(info.device),
                static_cast<jlong>(info.range_base), static_cast<jlong>(info.range_bytes)};
  jlongArray a = env->NewLongArray(4);
  if (a != nullptr) env->SetLongArrayRegion(a, 0, 4, v);
  return a;
  FC_JNI_END(nullptr)
}

FC_NATIVE(jint, streamDevice)(JNIEnv* env, jclass, jlong stream) {
  FC_JNI_BEGIN
  int32_t device = -1;
  check(fc_stream_device(as<fc_stream_t>(stream), &device));
  return device;
  FC_JNI_END(-1)
}

FC_NATIVE(jlong, deviceAlloc)(JNIEnv* env, jclass, jlong bytes) {
  FC_JNI_BEGIN
  if (bytes < 0) fusedcomm::jni::invalid("negative allocation size");
  void* p = nullptr;
  check(fc_device_alloc(static_cast<size_t>(bytes), &p));
  return reinterpret_cast<jlong>(p);
  FC_JNI_END(0)
}

FC_NATIVE(void, deviceFree)(JNIEnv* env, jclass, jlong address) {
  FC_JNI_BEGIN
  check(fc_device_free(as<void*>(address)));
  FC_JNI_END()
}

FC_NATIVE(void, deviceCopy)(JNIEnv* env, jclass, jlong dst, jlong src, jlong bytes) {
  FC_JNI_BEGIN
  if (bytes < 0) fusedcomm::jni::invalid("negative copy size");
  check(fc_device_copy(as<void*>(dst), as<const void*>(src), static_cast<size_t>(bytes)));
  FC_JNI_END()
}

FC_NATIVE(void, deviceCopy2d)(JNIEnv* env, jclass, jlong dst, jlong dstPitch, jlong src, jlong srcPitch,
                              jlong width, jlong height) {
  FC_JNI_BEGIN
  if (dstPitch < 0 || srcPitch < 0 || width < 0 || height < 0) fusedcomm::jni::invalid("negative copy size");
  check(fc_device_copy_2d(as<void*>(dst), static_cast<size_t>(dstPitch), as<const void*>(src),
                          static_cast<size_t>(srcPitch), static_cast<size_t>(width), static_cast<size_t>(height)));
  FC_JNI_END()
}

// {free, total} bytes of the calling thread's current GPU.
FC_RUNTIME_NATIVE(jlongArray, deviceMemory)(JNIEnv* env, jclass) {
  FC_JNI_BEGIN
  uint64_t free_bytes = 0;
  uint64_t total_bytes = 0;
  check(fc_device_memory(&free_bytes, &total_bytes));
  jlong v[2] = {static_cast<jlong>(free_bytes), static_cast<jlong>(total_bytes)};
  jlongArray a = env->NewLongArray(2);
  if (a != nullptr) env->SetLongArrayRegion(a, 0, 2, v);
  return a;
  FC_JNI_END(nullptr)
}

FC_RUNTIME_NATIVE(jlongArray, memStats)(JNIEnv* env, jclass) {
  FC_JNI_BEGIN
  uint64_t live_bytes = 0, live_allocations = 0;
  check(fc_memory_stats(&live_bytes, &live_allocations));
  jlong v[2] = {static_cast<jlong>(live_bytes), static_cast<jlong>(live_allocations)};
  jlongArray a = env->NewLongArray(2);
  env->SetLongArrayRegion(a, 0, 2, v);
  return a;
  FC_JNI_END(nullptr)
}

// backend: cuda (device memory, bf16) or host.
FC_NATIVE(void, gemm)
(JNIEnv* env, jclass, jint backend, jint t, jlong a, jlong w, jlong c, jlong m, jlong n, jlong k, jint l) {
  FC_JNI_BEGIN
  check(fc_gemm(static_cast<fc_backend_t>(backend), static_cast<fc_dtype_t>(t), as<const void*>(a),
                as<const void*>(w), as<void*>(c), m, n, k, static_cast<fc_weight_layout_t>(l)));
  FC_JNI_END()
}

FC_NATIVE(void, attention)
(JNIEnv* env, jclass, jint backend, jint t, jlong batch, jlong q_len, jlong kv_len, jlong q_heads,
 jlong kv_heads, jlong head_dim, jboolean causal, jfloat scale, jlong q, jlong k, jlong v, jlong o, jlong lse,
 jlong stream) {
  FC_JNI_BEGIN
  const fc_attention_local_t s{batch, q_len, kv_len, q_heads, kv_heads, head_dim, causal == JNI_TRUE ? 1 : 0,
                               scale, 0};
  check(fc_attention(static_cast<fc_backend_t>(backend), static_cast<fc_dtype_t>(t), &s, as<const void*>(q),
                     as<const void*>(k), as<const void*>(v), as<void*>(o), as<float*>(lse),
                     as<fc_stream_t>(stream)));
  FC_JNI_END()
}

FC_NATIVE(void, attentionBackward)
(JNIEnv* env, jclass, jint backend, jint t, jlong batch, jlong q_len, jlong kv_len, jlong q_heads,
 jlong kv_heads, jlong head_dim, jboolean causal, jfloat scale, jboolean deterministic, jlong q, jlong k, jlong v,
 jlong o, jlong lse, jlong d_o, jlong dq, jlong dk, jlong dv, jlong stream) {
  FC_JNI_BEGIN
  const fc_attention_local_t s{batch, q_len, kv_len, q_heads, kv_heads, head_dim, causal == JNI_TRUE ? 1 : 0,
                               scale, deterministic == JNI_TRUE ? 1 : 0};
  check(fc_attention_backward(static_cast<fc_backend_t>(backend), static_cast<fc_dtype_t>(t), &s,
                              as<const void*>(q), as<const void*>(k), as<const void*>(v), as<const void*>(o),
                              as<const float*>(lse), as<const void*>(d_o), as<void*>(dq), as<void*>(dk),
                              as<void*>(dv), as<fc_stream_t>(stream)));
  FC_JNI_END()
}

// JCuda keeps a native handle in NativePointerObject.nativePointer, and a device pointer's byte
// offset in Pointer.byteOffset. Field ids are looked up once (JCuda's classes are never
// unloaded while ours are loaded: both come from the same class loader).
namespace {
struct JcudaFields {
  jfieldID native_pointer = nullptr;
  jfieldID byte_offset = nullptr;
};
const JcudaFields& jcuda_fields(JNIEnv* env) {
  static const JcudaFields fields = [env] {
    JcudaFields f;
    jclass npo = env->FindClass("jcuda/NativePointerObject");
    jclass ptr = env->FindClass("jcuda/Pointer");
    if (npo == nullptr || ptr == nullptr) fusedcomm::jni::invalid("JCuda classes are not on the classpath");
    f.native_pointer = env->GetFieldID(npo, "nativePointer", "J");
    f.byte_offset = env->GetFieldID(ptr, "byteOffset", "J");
    if (f.native_pointer == nullptr || f.byte_offset == nullptr) {
      fusedcomm::jni::invalid("unexpected JCuda version: pointer fields not found");
    }
    return f;
  }();
  return fields;
}
}  // namespace

FC_NATIVE(jlong, pointerAddress)(JNIEnv* env, jclass, jobject pointer) {
  FC_JNI_BEGIN
  if (pointer == nullptr) fusedcomm::jni::invalid("null JCuda pointer");
  const JcudaFields& f = jcuda_fields(env);
  return env->GetLongField(pointer, f.native_pointer) + env->GetLongField(pointer, f.byte_offset);
  FC_JNI_END(0)
}

// A JCuda handle object (cudaStream_t, CUstream): its native pointer.
FC_NATIVE(jlong, nativeHandle)(JNIEnv* env, jclass, jobject handle) {
  FC_JNI_BEGIN
  if (handle == nullptr) fusedcomm::jni::invalid("null JCuda handle");
  return env->GetLongField(handle, jcuda_fields(env).native_pointer);
  FC_JNI_END(0)
}
