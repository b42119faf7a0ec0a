package io.fusedcomm.api;

import java.math.BigInteger;
import java.util.Arrays;

/** Shape arithmetic shared by the tensor classes, every product checked for overflow. */
final class Shapes {
  private Shapes() {}

  static DType requireDtype(DType dtype) {
    if (dtype == null) {
      throw new IllegalArgumentException("dtype must not be null");
    }
    return dtype;
  }

  /** A copy of {@code shape}: no negative dimension, an element count that fits in a long. */
  static long[] checked(long[] shape) {
    if (shape == null) {
      throw new IllegalArgumentException("shape must not be null");
    }
    for (long d : shape) {
      if (d < 0) {
        throw new IllegalArgumentException("negative dimension in shape " + Arrays.toString(shape));
      }
    }
    try {
      numel(shape);
    } catch (ArithmeticException e) {
      throw new IllegalArgumentException("shape " + Arrays.toString(shape) + " has " + exact(shape, 1)
          + " elements, more than a tensor can hold (" + Long.MAX_VALUE + ")");
    }
    return shape.clone();
  }

  /** The element count; {@link ArithmeticException} when it overflows a long. */
  static long numel(long[] shape) {
    long n = 1;
    for (long d : shape) {
      n = Math.multiplyExact(n, d);
    }
    return n;
  }

  /**
   * The size in bytes of a checked shape of {@code dtype}; {@link IllegalArgumentException} when
   * it does not fit in a long (it would wrap, e.g. to 0 for 2^62 f32 elements).
   */
  static long byteSize(DType dtype, long[] shape) {
    try {
      return Math.multiplyExact(numel(shape), (long) dtype.bytes());
    } catch (ArithmeticException e) {
      throw new IllegalArgumentException("a " + dtype.label() + " tensor of shape " + Arrays.toString(shape)
          + " would be " + exact(shape, dtype.bytes()) + " bytes, more than a tensor can hold ("
          + Long.MAX_VALUE + ")");
    }
  }

  private static BigInteger exact(long[] shape, int elementBytes) {
    BigInteger n = BigInteger.valueOf(elementBytes);
    for (long d : shape) {
      n = n.multiply(BigInteger.valueOf(d));
    }
    return n;
  }
}
