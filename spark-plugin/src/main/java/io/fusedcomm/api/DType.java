package io.fusedcomm.api;

/**
 * Element types of tensors. Ops compute in fp32 and round once at the output; {@link #BF16} is
 * stored as 16 bits with round-to-nearest-even. {@link #I32} is for index tensors only (MoE
 * routing). Mirrors {@code fc_dtype_t} of the native C API ({@code fusedcomm.h}): the same names
 * and {@link #code() values}, checked by a unit test.
 */
public enum DType {
  /** IEEE-754 binary32. */
  F32(0, 4),
  /** bfloat16: the upper 16 bits of a binary32. */
  BF16(1, 2),
  /** 32-bit signed integer (indices). */
  I32(2, 4);

  private final int code;
  private final int bytes;

  DType(int code, int bytes) {
    this.code = code;
    this.bytes = bytes;
  }

  /** The value of {@code FC_DTYPE_<name>} in the native C API. */
  public int code() {
    return code;
  }

  /** Bytes per element. */
  public int bytes() {
    return bytes;
  }

  /** True for the types ops compute on ({@link #F32}, {@link #BF16}). */
  public boolean isFloating() {
    return this != I32;
  }

  /** Lower-case name as used in messages and fingerprints. */
  public String label() {
    return name().toLowerCase(java.util.Locale.ROOT);
  }
}
