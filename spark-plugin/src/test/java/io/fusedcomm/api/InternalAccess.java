package io.fusedcomm.api;

import io.fusedcomm.internal.bootstrap.BootstrapExchange;
import io.fusedcomm.internal.bootstrap.HostLayout;
import io.fusedcomm.internal.bootstrap.RankInfo;
import io.fusedcomm.runtime.ExecutorRuntime;
import java.util.List;

/**
 * What tests in other packages need of the API's internals: a communicator over any bootstrap
 * exchange, its bootstrap records, and native-initiated timing. Lives in the API's package (in
 * test sources only), so none of it is public API.
 */
public final class InternalAccess {
  private InternalAccess() {}

  /** A communicator over {@code exchange} (its allGather is called exactly once). */
  public static Communicator bootstrap(ExecutorRuntime runtime, BootstrapExchange exchange, CommOptions options) {
    return CommBootstrap.bootstrap(runtime, exchange, options);
  }

  /** What every rank announced at bootstrap, by rank. */
  public static List<RankInfo> ranks(Communicator comm) {
    return comm.ranks();
  }

  /** Which (virtual) host each rank is on, as the cuda backend connects them. */
  public static HostLayout hosts(Communicator comm) {
    return comm.hosts();
  }

  /**
   * Runs {@code iters} synchronous allReduces of {@code in} into {@code out} on {@code comm}'s
   * cuda backend, each initiated from native code through the same path the Java op takes after
   * its checks, and returns the wall time in nanoseconds: Java-initiated minus this is the Java
   * layer's per-op cost. Collective: every rank calls it with the same arguments.
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

  /** The host address of a host tensor's memory (for tests of what device APIs refuse). */
  public static long hostAddress(HostTensor t) {
    return t.address();
  }
}
