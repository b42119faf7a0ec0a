package io.fusedcomm.errors;

/**
 * A bounded wait inside an op or a connection set-up ran past its limit ({@code
 * spark.fusedcomm.timeout} or {@code spark.fusedcomm.connectTimeout}); typically a peer died or
 * never arrived. The context names the waiting rank, the peer it waited for, the op and step.
 */
public class CommTimeoutException extends CommunicatorException {
  private static final long serialVersionUID = 1L;

  /** An error with no rank/peer/op/step context. */
  public CommTimeoutException(String detail) {
    super(detail);
  }

  /** An error with no rank/peer/op/step context, caused by {@code cause}. */
  public CommTimeoutException(String detail, Throwable cause) {
    super(detail, cause);
  }

  /**
   * An error with context; see {@link CommunicatorException#CommunicatorException(String, int,
   * int, String, long, Throwable)}.
   */
  public CommTimeoutException(String detail, int rank, int peer, String op, long step, Throwable cause) {
    super(detail, rank, peer, op, step, cause);
  }
}
