package io.fusedcomm.runtime;

import java.nio.ByteBuffer;

/**
 * The JNI surface of libfusedcomm.so. Internal: use {@link io.fusedcomm.api.Communicator} and
 * the tensor classes. Every method may throw the exceptions of {@code io.fusedcomm.errors},
 * {@link IllegalArgumentException} or {@link IllegalStateException}; handles are raw native
 * pointers owned by exactly one {@link AutoCloseable} Java object. Each native method converts its
 * arguments and calls one function of the C API ({@code executor-native/include/fusedcomm/fusedcomm.h}).
 * Enums cross as the C API's values: dtype = {@code DType.code()}, backend = {@code
 * Backend.code()}, layout = {@code WeightLayout.code()}, partials = {@code PartialPrecision.code()},
 * op = the {@code fc_op_t} value ({@code io.fusedcomm.api.Op}).
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
      boolean allowSharedGpu);

  static native int runtimeBackend(long runtime);

  static native String runtimeDescribe(long runtime);

  static native String runtimeGpuUuid(long runtime);

  static native void runtimePinGpu(long runtime);

  static native int runtimePooledRegions(long runtime);

  static native void runtimeClose(long runtime);

  /**
   * The device address a JCuda pointer holds (its native pointer plus byte offset), read from
   * JCuda's fields, so users' own JCuda allocations can be passed to ops.
   */
  public static native long pointerAddress(Object jcudaPointer);

  /** The native handle a JCuda handle object (e.g. {@code cudaStream_t}) holds. */
  public static native long nativeHandle(Object jcudaHandle);

  public static native long memAlloc(long bytes);

  public static native void memFree(long address);

  public static native ByteBuffer memView(long address, long bytes);

  /** {live bytes, live allocations} of runtime-allocated host memory. */
  public static native long[] memStats();

  /** With the cuda backend this also allocates (or borrows) the rank's symmetric memory. */
  public static native long commCreate(long runtime, int rank, int world);

  public static native String commEndpoint(long comm);

  /**
   * How a fused op ({@code op}: its {@code fc_op_t} value) would run on this communicator with
   * these sizes, in a phrase; nothing launched or exchanged.
   */
  public static native String commDescribeFused(long comm, int op, long m, long n, long k, int partials);

  /** The symmetric memory's IPC blob for the bootstrap; empty with the host backend. */
  public static native byte[] commDeviceHandle(long comm);

  /**
   * Connects the host half, then the device half; authShares[r]: rank r's bootstrap share
   * (RankInfo.authShare, 32 bytes); hostIds[r]: rank r's host (HostLayout).
   */
  public static native void commConnect(
      long comm,
      String[] endpoints,
      int rank,
      long commId,
      byte[][] authShares,
      byte[][] deviceHandles,
      int[] hostIds);

  /** Waits for the ops enqueued on streams (cuda backend) and throws a device failure. */
  public static native void commSynchronize(long comm);

  /**
   * Diagnostics: {@code iters} synchronous collectives initiated from native code; wall
   * nanoseconds. {@code op}: the {@code fc_op_t} value of a collective.
   */
  public static native long commTimeCollective(
      long comm, int op, int dtype, long in, long out, long count, int iters);

  public static native void commFinish(long comm);

  public static native void commAbort(long comm);

  public static native void commClose(long comm);

  /** {@code stream}: 0 runs synchronously; else a CUDA stream to enqueue on (cuda backend). */
  public static native void allGather(
      long comm, String desc, long fp, int dtype, long in, long out, long count, long stream);

  /** {@code stream}: 0 runs synchronously; else a CUDA stream to enqueue on (cuda backend). */
  public static native void reduceScatter(
      long comm, String desc, long fp, int dtype, long in, long out, long count, long stream);

  /** {@code stream}: 0 runs synchronously; else a CUDA stream to enqueue on (cuda backend). */
  public static native void allReduce(
      long comm, String desc, long fp, int dtype, long in, long out, long count, long stream);

  /** {@code stream}: 0 runs synchronously; else a CUDA stream to enqueue on (cuda backend). */
  public static native void allToAll(
      long comm, String desc, long fp, int dtype, long in, long out, long count, long stream);

  /**
   * Single-rank GEMM, synchronous: {@code backend} cuda (bf16, device pointers of the calling
   * thread's current GPU) or host (host memory).
   */
  public static native void gemm(
      int backend, int dtype, long a, long w, long c, long m, long n, long k, int layout);

  /** {@code stream}: 0 runs synchronously; else a CUDA stream to enqueue on (cuda backend). */
  public static native void allGatherGemm(
      long comm, String desc, long fp, int dtype, long a, long w, long c, long gathered, long m,
      long nLocal, long k, int layout, long stream);

  /** {@code partials}: {@code PartialPrecision.code()}; {@code stream} as for allGatherGemm. */
  public static native void gemmReduceScatter(
      long comm, String desc, long fp, int dtype, long a, long w, long c, long m, long n,
      long kLocal, int layout, int partials, long stream);

  /** {@code partials} and {@code stream} as for gemmReduceScatter. */
  public static native void gemmAllReduce(
      long comm, String desc, long fp, int dtype, long a, long w, long c, long m, long n,
      long kLocal, int layout, int partials, long stream);

  public static native long moeDispatchGemm(
      long comm, String desc, long fp, int dtype, long x, long tokens, long hidden, long ids,
      long weights, int topk, long numExperts, long w1, long ffn);

  /** {rows, firstLocalExpert, localExperts, tokens, topk, offsets[0..localExperts]}. */
  public static native long[] moeInfo(long dispatch);

  public static native void moeCopy(long dispatch, long expertOut, long routedX);

  public static native void moeRowMeta(
      long dispatch, int[] srcRank, int[] srcToken, int[] slot, float[] weight);

  public static native void moeCombine(
      long comm, String desc, long fp, int dtype, long dispatch, long expertOut, long width,
      long out);

  public static native void moeFree(long dispatch);

  public static native void ringAttention(
      long comm, String desc, long fp, int dtype, long batch, long seq, long qHeads, long kvHeads,
      long headDim, boolean causal, float scale, long q, long k, long v, long o, long lse);
}
