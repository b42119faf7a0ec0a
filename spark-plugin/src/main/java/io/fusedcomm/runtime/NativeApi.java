package io.fusedcomm.runtime;

/**
 * The JNI surface of libfusedcomm.so that the runtime package needs: availability, the executor
 * runtime and memory statistics. Internal: use {@link ExecutorRuntime}. Nothing here takes a
 * memory address; the entries that do (tensors, communicators, ops) are package-private in
 * {@code io.fusedcomm.api.NativeOps}, so no caller outside the API can hand native code an
 * address it does not own. Every method may throw the exceptions of {@code io.fusedcomm.errors},
 * {@link IllegalArgumentException} or {@link IllegalStateException}; handles are raw native
 * pointers owned by exactly one {@link AutoCloseable} Java object. Each native method converts
 * its arguments and calls one function of the C API ({@code
 * executor-native/include/fusedcomm/fusedcomm.h}). Enums cross as the C API's values: backend =
 * {@code Backend.code()}.
 */
public final class NativeApi {
  private NativeApi() {}

  static {
    NativeLibrary.ensureLoaded();
  }

  /** One line per backend and transport: "name: available|unavailable: reason". */
  public static native String availability();

  static native long runtimeCreate(
      int backend,
      long timeoutMs,
      long connectTimeoutMs,
      long chunkBytes,
      long symmetricBytes,
      String bindHost,
      int transportStreams,
      long busyPollMicros,
      int gpuOrdinal,
      long jobToken,
      boolean allowSharedGpu,
      int transport,
      int libfabricProvider,
      int libfabricRails,
      long libfabricPeerTimeoutMs);

  static native int runtimeBackend(long runtime);

  static native String runtimeDescribe(long runtime);

  static native String runtimeGpuUuid(long runtime);

  static native void runtimePinGpu(long runtime);

  static native int runtimePooledRegions(long runtime);

  static native void runtimeClose(long runtime);

  /** {free, total} bytes of the calling thread's current GPU. */
  static native long[] deviceMemory();

  /** {live bytes, live allocations} of runtime-allocated host memory. */
  public static native long[] memStats();
}
