package io.fusedcomm.api;

import io.fusedcomm.runtime.NativeLibrary;
import java.nio.ByteBuffer;

/**
 * The JNI entries of libfusedcomm.so that take memory addresses or native handles: host and
 * device memory, streams, JCuda handles, communicators and the ops. Package-private on purpose: an address reaches
 * native code only from the tensor classes and {@link Communicator}, which hold the tensor for
 * the call (so it cannot be freed under it) and have checked its size. Each native method
 * converts its arguments and calls one function of the C API ({@code
 * executor-native/include/fusedcomm/fusedcomm.h}); every one may throw the exceptions of {@code
 * io.fusedcomm.errors}, {@link IllegalArgumentException} or {@link IllegalStateException}.
 * Enums cross as the C API's values: dtype = {@code DType.code()}, backend = {@code
 * Backend.code()}, layout = {@code WeightLayout.code()} (ringAttention: {@code
 * SequenceLayout.code()}), partials = {@code PartialPrecision.code()}, op = the {@code fc_op_t}
 * value ({@link Op}). The runtime's own entries are in {@link
 * io.fusedcomm.runtime.NativeApi}.
 */
final class NativeOps {
  private NativeOps() {}

  static {
    NativeLibrary.ensureLoaded();
  }

  /**
   * The device address a JCuda pointer holds (its native pointer plus byte offset), read from
   * JCuda's fields, so users' own JCuda allocations can be passed to ops.
   */
  static native long pointerAddress(Object jcudaPointer);

  /** The native handle a JCuda handle object (e.g. {@code cudaStream_t}) holds. */
  static native long nativeHandle(Object jcudaHandle);

  /**
   * What CUDA knows of a device address: {type ({@link MemoryType} code), device, base of its
   * allocation, size of that allocation (0: unknown)}.
   */
  static native long[] pointerInfo(long address);

  /** The GPU a live CUDA stream belongs to. */
  static native int streamDevice(long stream);

  /** Device memory of {@code bytes} (at least one byte) on the calling thread's current GPU. */
  static native long deviceAlloc(long bytes);

  static native void deviceFree(long address);

  /** A synchronous copy between host and device memory, either direction. */
  static native void deviceCopy(long dst, long src, long bytes);

  /** A synchronous 2D copy: {@code height} rows of {@code width} bytes, pitches in bytes. */
  static native void deviceCopy2d(long dst, long dstPitch, long src, long srcPitch, long width, long height);

  /** Host memory of {@code bytes} (0 to 1 TiB): 128-byte aligned, zero-filled. */
  static native long memAlloc(long bytes);

  static native void memFree(long address);

  /**
   * A direct buffer over {@code bytes} (0 to {@link Integer#MAX_VALUE}) at {@code address}; it
   * neither owns nor frees the memory. Larger views are refused, never wrapped.
   */
  static native ByteBuffer memView(long address, long bytes);

  /** With the cuda backend this also allocates (or borrows) the rank's symmetric memory. */
  static native long commCreate(long runtime, int rank, int world);

  static native String commEndpoint(long comm);

  /**
   * How a fused op ({@code op}: its {@code fc_op_t} value) would run on this communicator with
   * these sizes, in a phrase; nothing launched or exchanged.
   */
  static native String commDescribeFused(long comm, int op, long m, long n, long k, int partials);

  /** The symmetric memory's IPC blob for the bootstrap; empty with the host backend. */
  static native byte[] commDeviceHandle(long comm);

  /** Bytes of GPU memory the communicator's symmetric region takes; 0 on the host backend. */
  static native long commSymmetricBytes(long comm);

  /**
   * Connects the host half, then the device half; authShares[r]: rank r's bootstrap share
   * (RankInfo.authShare, 32 bytes); hostIds[r]: rank r's host (HostLayout).
   */
  static native void commConnect(
      long comm,
      String[] endpoints,
      int rank,
      long commId,
      byte[][] authShares,
      byte[][] deviceHandles,
      int[] hostIds);

  /** Waits for the ops enqueued on streams (cuda backend) and throws a device failure. */
  static native void commSynchronize(long comm);

  /**
   * Diagnostics: {@code iters} synchronous collectives initiated from native code; wall
   * nanoseconds. {@code op}: the {@code fc_op_t} value of a collective.
   */
  static native long commTimeCollective(
      long comm, int op, int dtype, long in, long out, long count, int iters);

  static native void commFinish(long comm);

  static native void commAbort(long comm);

  static native void commClose(long comm);

  /** {@code stream}: 0 runs synchronously; else a CUDA stream to enqueue on (cuda backend). */
  static native void allGather(
      long comm, String desc, long fp, int dtype, long in, long out, long count, long stream);

  /** {@code stream}: 0 runs synchronously; else a CUDA stream to enqueue on (cuda backend). */
  static native void reduceScatter(
      long comm, String desc, long fp, int dtype, long in, long out, long count, long stream);

  /** {@code stream}: 0 runs synchronously; else a CUDA stream to enqueue on (cuda backend). */
  static native void allReduce(
      long comm, String desc, long fp, int dtype, long in, long out, long count, long stream);

  /** {@code stream}: 0 runs synchronously; else a CUDA stream to enqueue on (cuda backend). */
  static native void allToAll(
      long comm, String desc, long fp, int dtype, long in, long out, long count, long stream);

  /**
   * Single-rank GEMM, synchronous: {@code backend} cuda (bf16, device pointers of the calling
   * thread's current GPU) or host (host memory).
   */
  static native void gemm(
      int backend, int dtype, long a, long w, long c, long m, long n, long k, int layout);

  /** {@code stream}: 0 runs synchronously; else a CUDA stream to enqueue on (cuda backend). */
  static native void allGatherGemm(
      long comm, String desc, long fp, int dtype, long a, long w, long c, long gathered, long m,
      long nLocal, long k, int layout, long stream);

  /** {@code partials}: {@code PartialPrecision.code()}; {@code stream} as for allGatherGemm. */
  static native void gemmReduceScatter(
      long comm, String desc, long fp, int dtype, long a, long w, long c, long m, long n,
      long kLocal, int layout, int partials, long stream);

  /** {@code partials} and {@code stream} as for gemmReduceScatter. */
  static native void gemmAllReduce(
      long comm, String desc, long fp, int dtype, long a, long w, long c, long m, long n,
      long kLocal, int layout, int partials, long stream);

  /** {@code maxRecvRows}: the receive bound of every rank (0: none). */
  static native long moeDispatchGemm(
      long comm, String desc, long fp, int dtype, long x, long tokens, long hidden, long ids,
      long weights, int topk, long numExperts, long w1, long ffn, long maxRecvRows);

  /** {rows, firstLocalExpert, localExperts, tokens, topk, offsets[0..localExperts]}. */
  static native long[] moeInfo(long dispatch);

  static native void moeCopy(long dispatch, long expertOut, long routedX);

  /** {expert outputs, routed tokens}: the cuda dispatch's device addresses (0 without rows). */
  static native long[] moeDeviceRows(long dispatch);

  static native void moeRowMeta(
      long dispatch, int[] srcRank, int[] srcToken, int[] slot, float[] weight);

  static native void moeCombine(
      long comm, String desc, long fp, int dtype, long dispatch, long expertOut, long width,
      long out);

  /** {@code w2}: local experts × width × k (NK). */
  static native void moeGemmCombine(
      long comm, String desc, long fp, int dtype, long dispatch, long h, long k, long w2, long width,
      long out);

  static native void moeFree(long dispatch);

  /**
   * Single-rank grouped GEMM, synchronous: {@code backend} cuda (bf16, device pointers of the
   * calling thread's current GPU) or host (host memory); {@code offsets}: groups + 1 row offsets.
   */
  static native void groupedGemm(
      int backend, int dtype, long a, long w, long c, long[] offsets, long groups, long rows, long n,
      long k, int layout);

  /** {@code layout}: a {@link SequenceLayout} code; {@code stream} as the collectives'. */
  static native void ringAttention(
      long comm, String desc, long fp, int dtype, long batch, long seq, long qHeads, long kvHeads,
      long headDim, boolean causal, float scale, int layout, long q, long k, long v, long o, long lse,
      long stream);

  /** The backward of {@link #ringAttention}: {@code lse} required, {@code dO} as {@code o}. */
  static native void ringAttentionBackward(
      long comm, String desc, long fp, int dtype, long batch, long seq, long qHeads, long kvHeads,
      long headDim, boolean causal, float scale, int layout, long q, long k, long v, long o, long lse, long dO,
      long dQ, long dK, long dV, long stream);

  /**
   * Single-rank attention forward: {@code backend} cuda (bf16, device pointers; {@code stream} 0
   * runs synchronously, else enqueued there) or host (host memory, {@code stream} 0); {@code lse}
   * 0 when not wanted.
   */
  static native void attention(
      int backend, int dtype, long batch, long qLen, long kvLen, long qHeads, long kvHeads, long headDim,
      boolean causal, float scale, long q, long k, long v, long o, long lse, long stream);

  /** The backward of {@link #attention}, the same conventions; {@code lse} required. */
  static native void attentionBackward(
      int backend, int dtype, long batch, long qLen, long kvLen, long qHeads, long kvHeads, long headDim,
      boolean causal, float scale, boolean deterministic, long q, long k, long v, long o, long lse, long dO,
      long dQ, long dK, long dV, long stream);
}
