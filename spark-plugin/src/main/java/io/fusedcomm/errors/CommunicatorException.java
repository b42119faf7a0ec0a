package io.fusedcomm.errors;

import java.util.Optional;
import java.util.OptionalInt;
import java.util.OptionalLong;

/**
 * Base of fusedcomm's runtime errors: something went wrong in a communicator or an op.
 *
 * <p>Carries, where known, the rank that reports the error, the peer it concerns, the op and the
 * step (for example the tile or ring step) at which it happened. Known fields are appended to the
 * message, e.g. {@code "peer did not arrive (rank 1, peer 3, op allGatherGemm, step 7)"}, so a log
 * line alone says where to look. Unchecked, like every exception of this package.
 */
public class CommunicatorException extends RuntimeException {
  private static final long serialVersionUID = 1L;

  /** Value of {@code rank}/{@code peer}/{@code step} arguments meaning "not known". */
  public static final int UNKNOWN = -1;

  private final String detail;
  private final int rank;
  private final int peer;
  private final String op;
  private final long step;

  /** An error with no rank/peer/op/step context. */
  public CommunicatorException(String detail) {
    this(detail, UNKNOWN, UNKNOWN, null, UNKNOWN, null);
  }

  /** An error with no rank/peer/op/step context, caused by {@code cause}. */
  public CommunicatorException(String detail, Throwable cause) {
    this(detail, UNKNOWN, UNKNOWN, null, UNKNOWN, cause);
  }

  /**
   * An error with context.
   *
   * @param detail what went wrong, as a sentence
   * @param rank the reporting rank, or {@link #UNKNOWN}
   * @param peer the peer rank concerned, or {@link #UNKNOWN}
   * @param op the op name, or null
   * @param step the op's step, or {@link #UNKNOWN}
   * @param cause the underlying error, or null
   */
  public CommunicatorException(
      String detail, int rank, int peer, String op, long step, Throwable cause) {
    super(format(detail, rank, peer, op, step), cause);
    this.detail = detail;
    this.rank = rank < 0 ? UNKNOWN : rank;
    this.peer = peer < 0 ? UNKNOWN : peer;
    this.op = op == null || op.isEmpty() ? null : op;
    this.step = step < 0 ? UNKNOWN : step;
  }

  /** The message without the appended context. */
  public String detail() {
    return detail;
  }

  /** The reporting rank, if known. */
  public OptionalInt rank() {
    return rank == UNKNOWN ? OptionalInt.empty() : OptionalInt.of(rank);
  }

  /** The peer rank the error concerns, if known. */
  public OptionalInt peer() {
    return peer == UNKNOWN ? OptionalInt.empty() : OptionalInt.of(peer);
  }

  /** The op, if known. */
  public Optional<String> op() {
    return Optional.ofNullable(op);
  }

  /** The step inside the op, if known. */
  public OptionalLong step() {
    return step == UNKNOWN ? OptionalLong.empty() : OptionalLong.of(step);
  }

  private static String format(String detail, int rank, int peer, String op, long step) {
    StringBuilder ctx = new StringBuilder();
    if (rank >= 0) {
      ctx.append("rank ").append(rank);
    }
    if (peer >= 0) {
      ctx.append(ctx.length() > 0 ? ", " : "").append("peer ").append(peer);
    }
    if (op != null && !op.isEmpty()) {
      ctx.append(ctx.length() > 0 ? ", " : "").append("op ").append(op);
    }
    if (step >= 0) {
      ctx.append(ctx.length() > 0 ? ", " : "").append("step ").append(step);
    }
    String d = detail == null ? "" : detail;
    return ctx.length() == 0 ? d : d + " (" + ctx + ")";
  }
}
