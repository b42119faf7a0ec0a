package io.fusedcomm.api;

/**
 * How a GEMM's second operand is laid out (row-major). The ordinal is the native code.
 */
public enum WeightLayout {
  /** {@code C = A · Wᵀ} with {@code W: N×K}, a linear layer's weight (forward passes). */
  NK,
  /** {@code C = A · B} with {@code B: K×N} (backward passes). */
  KN
}
