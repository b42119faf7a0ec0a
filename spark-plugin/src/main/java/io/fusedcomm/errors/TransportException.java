package io.fusedcomm.errors;

/**
 * The inter-process transport failed: a connection could not be made, broke, or delivered
 * something malformed. The communicator that saw it is unusable; the executor is not.
 */
public class TransportException extends CommunicatorException {
  private static final long serialVersionUID = 1L;

  /** An error with no rank/peer/op/step context. */
  public TransportException(String detail) {
    super(detail);
  }

  /** An error with no rank/peer/op/step context, caused by {@code cause}. */
  public TransportException(String detail, Throwable cause) {
    super(detail, cause);
  }

  /**
   * An error with context; see {@link CommunicatorException#CommunicatorException(String, int,
   * int, String, long, Throwable)}.
   */
  public TransportException(String detail, int rank, int peer, String op, long step, Throwable cause) {
    super(detail, rank, peer, op, step, cause);
  }
}
