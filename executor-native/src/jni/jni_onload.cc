// JNI_OnLoad / JNI_OnUnload of libfusedcomm.so: the Java exception classes the entries throw are
// loaded here, at System.load (the executor plugin's start), and kept as global references
// (jni_boundary.h says why). A class that cannot be loaded fails the load itself, with the
// class named, rather than a later error path.
#include <jni.h>

#include "jni_boundary.h"

extern "C" JNIEXPORT jint JNICALL JNI_OnLoad(JavaVM* vm, void*) {
  JNIEnv* env = nullptr;
  if (vm->GetEnv(reinterpret_cast<void**>(&env), JNI_VERSION_1_8) != JNI_OK) return JNI_ERR;
  using fusedcomm::jni::JavaError;
  for (int i = 0; i < static_cast<int>(JavaError::kCount); ++i) {
    jclass local = env->FindClass(fusedcomm::jni::class_name(static_cast<JavaError>(i)));
    if (local == nullptr) return JNI_ERR;  // NoClassDefFoundError is pending and names the class
    fusedcomm::jni::g_java_errors[i] = static_cast<jclass>(env->NewGlobalRef(local));
    env->DeleteLocalRef(local);
    if (fusedcomm::jni::g_java_errors[i] == nullptr) return JNI_ERR;
  }
  return JNI_VERSION_1_8;
}

extern "C" JNIEXPORT void JNICALL JNI_OnUnload(JavaVM* vm, void*) {
  JNIEnv* env = nullptr;
  if (vm->GetEnv(reinterpret_cast<void**>(&env), JNI_VERSION_1_8) != JNI_OK) return;
  for (jclass& c : fusedcomm::jni::g_java_errors) {
    if (c != nullptr) env->DeleteGlobalRef(c);
    c = nullptr;
  }
}
