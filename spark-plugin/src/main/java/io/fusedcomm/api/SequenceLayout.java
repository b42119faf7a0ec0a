package io.fusedcomm.api;

/**
 * Which positions of a sequence each rank holds in {@link Communicator#ringAttention} (docs/ops.md
 * "ringAttention"); {@link Split#positions} gives them. Mirrors {@code fc_seq_layout_t} of the
 * native C API ({@code FC_SEQ_<name>}): the same names and {@link #code() values}.
 */
public enum SequenceLayout {
  /**
   * Rank {@code r} holds the {@link Split} block {@code [Split.offset(S, W, r), + Split.count(S,
   * W, r))}: with causal masking the last rank has the most work (the default).
   */
  CONTIGUOUS(0),
  /**
   * The sequence in {@code 2W} chunks by the {@link Split} rule; rank {@code r} holds chunk
   * {@code r} then chunk {@code 2W-1-r}, one after the other in its tensors: with causal masking
   * every rank has about the same work.
   */
  ZIGZAG(1);

  private final int code;

  SequenceLayout(int code) {
    this.code = code;
  }

  /** The value of {@code FC_SEQ_<name>} in the native C API. */
  public int code() {
    return code;
  }
}
