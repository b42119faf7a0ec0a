package io.fusedcomm.api;

/**
 * How a GEMM's second operand is laid out (row-major). Mirrors {@code fc_weight_layout_t} of the
 * native C API ({@code FC_LAYOUT_<name>}): the same names and {@link #code() values}.
 */
public enum WeightLayout {
  /** {@code C = A · Wᵀ} with {@code W: N×K}, a linear layer's weight (forward passes). */
  NK(0),
  /** {@code C = A · B} with {@code B: K×N} (backward passes). */
  KN(1);

  private final int code;

  WeightLayout(int code) {
    this.code = code;
  }

  /** The value of {@code FC_LAYOUT_<name>} in the native C API. */
  public int code() {
    return code;
  }
}
