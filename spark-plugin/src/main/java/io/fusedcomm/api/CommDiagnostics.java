package io.fusedcomm.api;

/**
 * Measurements of the plugin's own cost, for benchmarks and tests: the same collective
 * initiated from native code, so that Java-initiated minus native-initiated time is the Java
 * layer's per-op overhead (argument checks, fingerprint, JNI crossing).
 */
public final class CommDiagnostics {
  private CommDiagnostics() {}

  /**
   * Runs {@code iters} synchronous allReduces of {@code in} into {@code out} on {@code comm}'s
   * cuda backend, each initiated from native code through the same path the Java op takes
   * after its checks, and returns the wall time in nanoseconds. Collective: every rank must
   * call it with the same arguments.
   */
  public static long nativeAllReduceNanos(Communicator comm, Tensor in, Tensor out, int iters) {
    if (comm.backend() != Backend.CUDA) {
      throw new IllegalArgumentException("native timing needs the cuda backend, got " + comm.backend());
    }
    if (in.numel() != out.numel() || in.dtype() != out.dtype() || !in.isDevice() || !out.isDevice()) {
      throw new IllegalArgumentException("allReduce timing: in and out must be device tensors of one dtype and size");
    }
    if (iters < 1) {
      throw new IllegalArgumentException("iters must be positive, got " + iters);
    }
    return comm.timeNative(Op.ALL_REDUCE, in, out, in.numel(), iters);
  }
}
