package io.fusedcomm.errors;

/**
 * The executor's GPU context is unusable (a sticky CUDA error such as an illegal address or a kernel
 * that had to be killed). Every later GPU op on this executor would fail too, so the executor
 * should be replaced rather than retried in place.
 */
public class FatalGpuException extends CommunicatorException {
  private static final long serialVersionUID = 1L;

  /** An error with no rank/peer/op/step context. */
  public FatalGpuException(String detail) {
    super(detail);
  }

  /** An error with no rank/peer/op/step context, caused by {@code cause}. */
  public FatalGpuException(String detail, Throwable cause) {
    super(detail, cause);
  }

  /**
   * An error with context; see {@link CommunicatorException#CommunicatorException(String, int,
   * int, String, long, Throwable)}.
   */
  public FatalGpuException(String detail, int rank, int peer, String op, long step, Throwable cause) {
    super(detail, rank, peer, op, step, cause);
  }
}
