// The one error boundary between Java and native code. Every JNI entry point wraps its body in
// FC_JNI_BEGIN / FC_JNI_END(value): C++ errors become Java exceptions of io.fusedcomm.errors
// (or the JDK's IllegalArgument/IllegalState/OutOfMemory), and nothing escapes to abort the JVM.
#pragma once

#include <jni.h>

#include <new>
#include <string>
#include <vector>

#include "fusedcomm/rdma/errors.h"
#include "fusedcomm/runtime/errors.h"

namespace fusedcomm::jni {

inline void throw_java(JNIEnv* env, const char* cls, const std::string& msg) {
  if (env->ExceptionCheck()) return;  // keep the first exception
  jclass c = env->FindClass(cls);
  if (c == nullptr) return;  // FindClass already threw NoClassDefFoundError
  env->ThrowNew(c, msg.c_str());
}

inline const char* java_class(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kInvalidArgument: return "java/lang/IllegalArgumentException";
    case ErrorKind::kState: return "java/lang/IllegalStateException";
    case ErrorKind::kTimeout: return "io/fusedcomm/errors/CommTimeoutException";
    case ErrorKind::kTransport: return "io/fusedcomm/errors/TransportException";
    case ErrorKind::kFatalGpu: return "io/fusedcomm/errors/FatalGpuException";
    case ErrorKind::kUnavailable: return "io/fusedcomm/errors/BackendUnavailableException";
    case ErrorKind::kCommunicator: break;
  }
  return "io/fusedcomm/errors/CommunicatorException";
}

inline std::string to_string(JNIEnv* env, jstring s) {
  if (s == nullptr) fail(ErrorKind::kInvalidArgument, "unexpected null string");
  const char* chars = env->GetStringUTFChars(s, nullptr);
  std::string out(chars);
  env->ReleaseStringUTFChars(s, chars);
  return out;
}

inline std::vector<std::string> to_strings(JNIEnv* env, jobjectArray a) {
  if (a == nullptr) fail(ErrorKind::kInvalidArgument, "unexpected null array");
  std::vector<std::string> out;
  jsize n = env->GetArrayLength(a);
  for (jsize i = 0; i < n; ++i) {
    auto s = static_cast<jstring>(env->GetObjectArrayElement(a, i));
    out.push_back(to_string(env, s));
    env->DeleteLocalRef(s);
  }
  return out;
}

inline jstring to_jstring(JNIEnv* env, const std::string& s) { return env->NewStringUTF(s.c_str()); }

template <typename T>
T* from_handle(jlong handle, const char* what) {
  if (handle == 0) fail(ErrorKind::kState, std::string(what) + " is closed");
  return reinterpret_cast<T*>(handle);
}

}  // namespace fusedcomm::jni

// Declares a native method of io.fusedcomm.runtime.NativeApi.
#define FC_NATIVE(ret, name) extern "C" JNIEXPORT ret JNICALL Java_io_fusedcomm_runtime_NativeApi_##name

#define FC_JNI_BEGIN try {
#define FC_JNI_END(ret)                                                                          \
  }                                                                                              \
  catch (const ::fusedcomm::Error& e) {                                                          \
    ::fusedcomm::jni::throw_java(env, ::fusedcomm::jni::java_class(e.kind()), e.what());         \
  }                                                                                              \
  catch (const ::fusedcomm::rdma::ConnectTimeout& e) {                                           \
    ::fusedcomm::jni::throw_java(env, "io/fusedcomm/errors/CommTimeoutException", e.what());     \
  }                                                                                              \
  catch (const ::fusedcomm::rdma::TransportError& e) {                                           \
    ::fusedcomm::jni::throw_java(env, "io/fusedcomm/errors/TransportException", e.what());       \
  }                                                                                              \
  catch (const std::bad_alloc&) {                                                                \
    ::fusedcomm::jni::throw_java(env, "java/lang/OutOfMemoryError", "native allocation failed"); \
  }                                                                                              \
  catch (const std::exception& e) {                                                              \
    ::fusedcomm::jni::throw_java(env, "io/fusedcomm/errors/CommunicatorException", e.what());    \
  }                                                                                              \
  catch (...) {                                                                                  \
    ::fusedcomm::jni::throw_java(env, "io/fusedcomm/errors/CommunicatorException",               \
                                 "unknown native error");                                        \
  }                                                                                              \
  return ret;
