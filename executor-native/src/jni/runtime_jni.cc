// JNI for io.fusedcomm.runtime.NativeApi: availability, the executor runtime, host memory.
// Argument conversion only; the work is in the runtime.
#include <jni.h>

#include "fusedcomm/runtime/gpu.h"
#include "fusedcomm/runtime/memory.h"
#include "fusedcomm/runtime/runtime.h"
#include "jni/jni_boundary.h"

using fusedcomm::jni::from_handle;
using fusedcomm::jni::to_jstring;

namespace {
fusedcomm::Runtime* runtime(jlong rt) { return from_handle<fusedcomm::Runtime>(rt, "the runtime"); }
}  // namespace

FC_NATIVE(jstring, availability)(JNIEnv* env, jclass) {
  FC_JNI_BEGIN
  return to_jstring(env, fusedcomm::availability_report());
  FC_JNI_END(nullptr)
}

FC_NATIVE(jlong, runtimeCreate)(JNIEnv* env, jclass, jint backend, jlong timeout_ms, jlong connect_timeout_ms,
                                jlong chunk_bytes, jlong symmetric_bytes, jstring bind_host,
                                jint transport_streams, jlong busy_poll_us, jint gpu_ordinal,
                                jlong job_token, jboolean allow_shared_gpu) {
  FC_JNI_BEGIN
  FC_REQUIRE(backend >= 0 && backend <= 2, "unknown backend " + std::to_string(backend));
  fusedcomm::RuntimeConfig c;
  c.backend = static_cast<fusedcomm::Backend>(backend);
  c.timeout_ms = timeout_ms;
  c.connect_timeout_ms = connect_timeout_ms;
  c.chunk_bytes = chunk_bytes;
  c.symmetric_bytes = symmetric_bytes;
  c.bind_host = fusedcomm::jni::to_string(env, bind_host);
  c.transport_streams = transport_streams;
  c.busy_poll_us = busy_poll_us;
  c.gpu_ordinal = gpu_ordinal;
  c.job_token = static_cast<uint64_t>(job_token);
  c.allow_shared_gpu = allow_shared_gpu == JNI_TRUE;
  return reinterpret_cast<jlong>(new fusedcomm::Runtime(c));
  FC_JNI_END(0)
}

FC_NATIVE(jint, runtimeBackend)(JNIEnv* env, jclass, jlong rt) {
  FC_JNI_BEGIN
  return static_cast<jint>(runtime(rt)->backend());
  FC_JNI_END(0)
}

FC_NATIVE(jstring, runtimeDescribe)(JNIEnv* env, jclass, jlong rt) {
  FC_JNI_BEGIN
  return to_jstring(env, runtime(rt)->describe());
  FC_JNI_END(nullptr)
}

FC_NATIVE(jstring, runtimeGpuUuid)(JNIEnv* env, jclass, jlong rt) {
  FC_JNI_BEGIN
  return to_jstring(env, runtime(rt)->gpu().uuid);
  FC_JNI_END(nullptr)
}

FC_NATIVE(jint, runtimePooledRegions)(JNIEnv* env, jclass, jlong rt) {
  FC_JNI_BEGIN
  return static_cast<jint>(runtime(rt)->pooled_regions());
  FC_JNI_END(0)
}

FC_NATIVE(void, runtimePinGpu)(JNIEnv* env, jclass, jlong rt) {
  FC_JNI_BEGIN
  auto* r = runtime(rt);
  if (r->gpu().ordinal >= 0) fusedcomm::pin_gpu(r->gpu().ordinal);
  FC_JNI_END()
}

FC_NATIVE(void, runtimeClose)(JNIEnv* env, jclass, jlong rt) {
  FC_JNI_BEGIN
  delete reinterpret_cast<fusedcomm::Runtime*>(rt);
  FC_JNI_END()
}

FC_NATIVE(jlong, memAlloc)(JNIEnv* env, jclass, jlong bytes) {
  FC_JNI_BEGIN
  FC_REQUIRE(bytes >= 0, "negative allocation size");
  return reinterpret_cast<jlong>(fusedcomm::host_alloc(static_cast<size_t>(bytes)));
  FC_JNI_END(0)
}

FC_NATIVE(void, memFree)(JNIEnv* env, jclass, jlong address) {
  FC_JNI_BEGIN
  fusedcomm::host_free(reinterpret_cast<void*>(address));
  FC_JNI_END()
}

FC_NATIVE(jobject, memView)(JNIEnv* env, jclass, jlong address, jlong bytes) {
  FC_JNI_BEGIN
  return env->NewDirectByteBuffer(reinterpret_cast<void*>(address), bytes);
  FC_JNI_END(nullptr)
}

FC_NATIVE(jlongArray, memStats)(JNIEnv* env, jclass) {
  FC_JNI_BEGIN
  auto s = fusedcomm::memory_stats();
  jlong v[2] = {static_cast<jlong>(s.live_bytes), static_cast<jlong>(s.live_allocations)};
  jlongArray a = env->NewLongArray(2);
  env->SetLongArrayRegion(a, 0, 2, v);
  return a;
  FC_JNI_END(nullptr)
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
    FC_REQUIRE(npo != nullptr && ptr != nullptr, "JCuda classes are not on the classpath");
    f.native_pointer = env->GetFieldID(npo, "nativePointer", "J");
    f.byte_offset = env->GetFieldID(ptr, "byteOffset", "J");
    FC_REQUIRE(f.native_pointer != nullptr && f.byte_offset != nullptr,
               "unexpected JCuda version: pointer fields not found");
    return f;
  }();
  return fields;
}
}  // namespace

FC_NATIVE(jlong, pointerAddress)(JNIEnv* env, jclass, jobject pointer) {
  FC_JNI_BEGIN
  FC_REQUIRE(pointer != nullptr, "null JCuda pointer");
  const JcudaFields& f = jcuda_fields(env);
  return env->GetLongField(pointer, f.native_pointer) + env->GetLongField(pointer, f.byte_offset);
  FC_JNI_END(0)
}

// A JCuda handle object (cudaStream_t, CUstream): its native pointer.
FC_NATIVE(jlong, nativeHandle)(JNIEnv* env, jclass, jobject handle) {
  FC_JNI_BEGIN
  FC_REQUIRE(handle != nullptr, "null JCuda handle");
  return env->GetLongField(handle, jcuda_fields(env).native_pointer);
  FC_JNI_END(0)
}
