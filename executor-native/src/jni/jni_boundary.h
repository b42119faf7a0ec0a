// The one error boundary between Java and native code. Every JNI entry point wraps its body in
// FC_JNI_BEGIN / FC_JNI_END(value) and calls the C API (fusedcomm/fusedcomm.h) through check():
// a failing status becomes a Java exception of io.fusedcomm.errors (or the JDK's
// IllegalArgument/IllegalState/OutOfMemory) with the C API's message, and nothing escapes to
// abort the JVM. This layer sees the C API only: it converts arguments and calls.
#pragma once

#include <jni.h>

#include <cstdint>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include "fusedcomm/fusedcomm.h"

namespace fusedcomm::jni {

// A failed call, thrown inside an entry and turned into a Java exception by FC_JNI_END: a C API
// status with its message, or an argument this layer could not convert.
struct Failure {
  fc_status_t status;
  std::string message;
};

// The Java exception classes the entries throw, one per kind of failure. JNI_OnLoad
// (jni_onload.cc) loads them all and keeps global references while the library is loaded: the
// error path must not need to load a class, which fails exactly when the process is out of file
// descriptors or memory (NoClassDefFoundError instead of the error that happened).
enum class JavaError : int {
  kIllegalArgument,
  kIllegalState,
  kOutOfMemory,
  kCommunicator,
  kTimeout,
  kTransport,
  kFatalGpu,
  kUnavailable,
  kCount
};

inline const char* class_name(JavaError e) {
  switch (e) {
    case JavaError::kIllegalArgument: return "java/lang/IllegalArgumentException";
    case JavaError::kIllegalState: return "java/lang/IllegalStateException";
    case JavaError::kOutOfMemory: return "java/lang/OutOfMemoryError";
    case JavaError::kTimeout: return "io/fusedcomm/errors/CommTimeoutException";
    case JavaError::kTransport: return "io/fusedcomm/errors/TransportException";
    case JavaError::kFatalGpu: return "io/fusedcomm/errors/FatalGpuException";
    case JavaError::kUnavailable: return "io/fusedcomm/errors/BackendUnavailableException";
    case JavaError::kCommunicator:
    case JavaError::kCount: break;
  }
  return "io/fusedcomm/errors/CommunicatorException";
}

inline JavaError java_error(fc_status_t status) {
  switch (status) {
    case FC_STATUS_INVALID_ARGUMENT: return JavaError::kIllegalArgument;
    case FC_STATUS_STATE: return JavaError::kIllegalState;
    case FC_STATUS_TIMEOUT: return JavaError::kTimeout;
    case FC_STATUS_TRANSPORT: return JavaError::kTransport;
    case FC_STATUS_FATAL_GPU: return JavaError::kFatalGpu;
    case FC_STATUS_UNAVAILABLE: return JavaError::kUnavailable;
    case FC_STATUS_OUT_OF_MEMORY: return JavaError::kOutOfMemory;
    default: return JavaError::kCommunicator;
  }
}

// Global references to the classes of JavaError, filled by JNI_OnLoad before any entry runs and
// dropped by JNI_OnUnload; read-only in between.
inline jclass g_java_errors[static_cast<int>(JavaError::kCount)] = {};

inline void throw_java(JNIEnv* env, fc_status_t status, const std::string& msg) {
  if (env->ExceptionCheck()) return;  // keep the first exception
  const JavaError e = java_error(status);
  jclass c = g_java_errors[static_cast<int>(e)];
  if (c == nullptr) {
    // Only if JNI_OnLoad has not run.
    c = env->FindClass(class_name(e));
    if (c == nullptr) return;  // FindClass already threw NoClassDefFoundError
  }
  env->ThrowNew(c, msg.c_str());
}

// A C API call must succeed; a failing status throws its Failure.
inline void check(fc_status_t status) {
  if (status != FC_STATUS_SUCCESS) throw Failure{status, fc_last_error_message()};
}

[[noreturn]] inline void invalid(const std::string& message) {
  throw Failure{FC_STATUS_INVALID_ARGUMENT, message};
}

// After a JNI call that can throw: a pending Java exception ends the entry here (no further JNI
// call may be made with one pending), and FC_JNI_END leaves that exception to the caller.
inline void check_pending(JNIEnv* env, const char* call) {
  if (env->ExceptionCheck()) throw Failure{FC_STATUS_INTERNAL, std::string(call) + " failed"};
}

// What a JNI call returned must not be null: a null with an exception pending ends the entry
// (as check_pending), a null without one is reported as `what`.
template <typename T>
T non_null(JNIEnv* env, T value, const char* what) {
  if (value == nullptr) {
    check_pending(env, what);
    throw Failure{FC_STATUS_INTERNAL, std::string(what) + " returned null"};
  }
  return value;
}

// A Java string as UTF-8 for the duration of a call (short ones without allocating).
class Utf8 {
 public:
  Utf8(JNIEnv* env, jstring s) {
    if (s == nullptr) invalid("unexpected null string");
    const jsize bytes = env->GetStringUTFLength(s);
    check_pending(env, "GetStringUTFLength");
    // A length past jsize's range wraps negative (strings of over 2 GiB of UTF-8).
    if (bytes < 0) invalid("string too long to convert to UTF-8");
    char* dst = small_;
    if (static_cast<size_t>(bytes) >= sizeof small_) {
      large_.resize(static_cast<size_t>(bytes) + 1);
      dst = large_.data();
    }
    env->GetStringUTFRegion(s, 0, env->GetStringLength(s), dst);
    check_pending(env, "GetStringUTFRegion");
    dst[bytes] = '\0';
    chars_ = dst;
  }
  Utf8(const Utf8&) = delete;
  Utf8& operator=(const Utf8&) = delete;
  const char* c_str() const { return chars_; }

 private:
  char small_[512];
  std::vector<char> large_;
  const char* chars_ = nullptr;
};

inline std::vector<std::string> to_strings(JNIEnv* env, jobjectArray a) {
  if (a == nullptr) invalid("unexpected null array");
  std::vector<std::string> out;
  jsize n = env->GetArrayLength(a);
  for (jsize i = 0; i < n; ++i) {
    auto s = static_cast<jstring>(env->GetObjectArrayElement(a, i));
    check_pending(env, "GetObjectArrayElement");
    out.emplace_back(Utf8(env, s).c_str());
    env->DeleteLocalRef(s);
  }
  return out;
}

// A C API string (never null on success; refused if it is) as a Java string.
inline jstring to_jstring(JNIEnv* env, const char* s) {
  if (s == nullptr) throw Failure{FC_STATUS_INTERNAL, "a native call returned a null string"};
  return non_null(env, env->NewStringUTF(s), "NewStringUTF");
}

inline jbyteArray to_jbytes(JNIEnv* env, const uint8_t* data, size_t bytes) {
  if (bytes > static_cast<size_t>(INT32_MAX)) invalid("a native byte blob is too large for a Java array");
  jbyteArray a = non_null(env, env->NewByteArray(static_cast<jsize>(bytes)), "NewByteArray");
  if (bytes > 0) {
    env->SetByteArrayRegion(a, 0, static_cast<jsize>(bytes), reinterpret_cast<const jbyte*>(data));
  }
  return a;
}

// Handles and addresses cross the JNI as jlong.
template <typename T>
T as(jlong value) {
  return reinterpret_cast<T>(value);
}

}  // namespace fusedcomm::jni

// Declares a native method of io.fusedcomm.api.NativeOps: the entries that take addresses or
// native handles (tensors, communicators, ops), package-private in Java.
#define FC_NATIVE(ret, name) extern "C" JNIEXPORT ret JNICALL Java_io_fusedcomm_api_NativeOps_##name
// Declares a native method of io.fusedcomm.runtime.NativeApi: availability, the executor runtime
// and memory statistics.
#define FC_RUNTIME_NATIVE(ret, name) \
  extern "C" JNIEXPORT ret JNICALL Java_io_fusedcomm_runtime_NativeApi_##name

#define FC_JNI_BEGIN try {
#define FC_JNI_END(ret)                                                                     \
  }                                                                                         \
  catch (const ::fusedcomm::jni::Failure& f) {                                              \
    ::fusedcomm::jni::throw_java(env, f.status, f.message);                                 \
  }                                                                                         \
  catch (const std::bad_alloc&) {                                                           \
    ::fusedcomm::jni::throw_java(env, FC_STATUS_OUT_OF_MEMORY, "native allocation failed"); \
  }                                                                                         \
  catch (const std::exception& e) {                                                         \
    ::fusedcomm::jni::throw_java(env, FC_STATUS_INTERNAL, e.what());                        \
  }                                                                                         \
  catch (...) {                                                                             \
    ::fusedcomm::jni::throw_java(env, FC_STATUS_INTERNAL, "unknown native error");          \
  }                                                                                         \
  return ret;
