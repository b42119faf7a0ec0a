package io.fusedcomm.testing;

/**
 * An fp64 reference result: per element the exact value, the sum of the magnitudes of the terms
 * that made it (what bounds the rounding error of any summation order), and the number of terms.
 */
public final class Expected {
  public final double[] value;
  public final double[] magnitude;
  public final int terms;

  public Expected(double[] value, double[] magnitude, int terms) {
    if (value.length != magnitude.length) {
      throw new IllegalArgumentException("value and magnitude lengths differ");
    }
    this.value = value;
    this.magnitude = magnitude;
    this.terms = Math.max(1, terms);
  }

  /** Exact data (no arithmetic): magnitude = |value|, one term. */
  public static Expected exact(float[] values) {
    double[] v = new double[values.length];
    double[] m = new double[values.length];
    for (int i = 0; i < v.length; i++) {
      v[i] = values[i];
      m[i] = Math.abs(values[i]);
    }
    return new Expected(v, m, 1);
  }

  public int length() {
    return value.length;
  }

  /** Elements {@code [from, from + count)}. */
  public Expected slice(long from, long count) {
    int f = Math.toIntExact(from);
    int n = Math.toIntExact(count);
    double[] v = new double[n];
    double[] m = new double[n];
    System.arraycopy(value, f, v, 0, n);
    System.arraycopy(magnitude, f, m, 0, n);
    return new Expected(v, m, terms);
  }
}
