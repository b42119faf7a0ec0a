package io.fusedcomm.api;

/**
 * Parameters of {@link Communicator#ringAttention}: the whole sequence length, which positions
 * of it each rank holds ({@link SequenceLayout}; {@link Split#positions} lists them), causal
 * masking by global position, and the softmax scale.
 */
public final class AttentionOptions {
  private final long sequenceLength;
  private boolean causal;
  private float scale;
  private SequenceLayout layout = SequenceLayout.CONTIGUOUS;

  private AttentionOptions(long sequenceLength) {
    if (sequenceLength < 1) {
      throw new IllegalArgumentException("sequence length must be positive: " + sequenceLength);
    }
    this.sequenceLength = sequenceLength;
  }

  /** Options for a sequence of {@code sequenceLength} tokens over all ranks. */
  public static AttentionOptions sequence(long sequenceLength) {
    return new AttentionOptions(sequenceLength);
  }

  /** Query at global position i attends keys at positions ≤ i only. */
  public AttentionOptions causal(boolean causal) {
    this.causal = causal;
    return this;
  }

  /** Softmax scale; 0 (the default) means {@code 1/sqrt(headDim)}. */
  public AttentionOptions scale(float scale) {
    if (!(scale >= 0) || Float.isInfinite(scale)) {
      throw new IllegalArgumentException("scale must be finite and non-negative: " + scale);
    }
    this.scale = scale;
    return this;
  }

  /**
   * Which positions each rank holds: {@link SequenceLayout#CONTIGUOUS} (the default) or {@link
   * SequenceLayout#ZIGZAG}, which balances causal work over the ranks. Every rank passes the same.
   */
  public AttentionOptions layout(SequenceLayout layout) {
    if (layout == null) {
      throw new IllegalArgumentException("the sequence layout must not be null");
    }
    this.layout = layout;
    return this;
  }

  public long sequenceLength() {
    return sequenceLength;
  }

  public boolean causal() {
    return causal;
  }

  public float scale() {
    return scale;
  }

  public SequenceLayout layout() {
    return layout;
  }

  /** How many positions rank {@code rank} of {@code world} holds: {@link Split#count(long, int, int, SequenceLayout)}. */
  public long localLength(int world, int rank) {
    return Split.count(sequenceLength, world, rank, layout);
  }
}
