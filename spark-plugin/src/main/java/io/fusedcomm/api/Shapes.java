package io.fusedcomm.api;

/** Shape arithmetic shared by the tensor classes. */
final class Shapes {
  private Shapes() {}

  static long[] checked(long[] shape) {
    if (shape == null) {
      throw new IllegalArgumentException("shape must not be null");
    }
    long n = 1;
    for (long d : shape) {
      if (d < 0) {
        throw new IllegalArgumentException("negative dimension in shape " + java.util.Arrays.toString(shape));
      }
      n = Math.multiplyExact(n, d);
    }
    return shape.clone();
  }

  static long numel(long[] shape) {
    long n = 1;
    for (long d : shape) {
      n *= d;
    }
    return n;
  }
}
