package io.fusedcomm.testing;

import io.fusedcomm.api.Bf16;
import io.fusedcomm.api.DType;
import java.util.SplittableRandom;

/**
 * Deterministic test inputs. Values are already representable in the requested dtype, so the
 * op sees exactly what the fp64 reference sees and only the op's own arithmetic is measured.
 */
public final class Data {
  private Data() {}

  /** {@code n} values uniform in [-1, 1), rounded to {@code dtype}. */
  public static float[] uniform(long seed, int n, DType dtype) {
    SplittableRandom rnd = new SplittableRandom(seed);
    float[] out = new float[n];
    for (int i = 0; i < n; i++) {
      out[i] = representable((float) (2 * rnd.nextDouble() - 1), dtype);
    }
    return out;
  }

  /** {@code n} values uniform in (0, 1], rounded to {@code dtype} (routing weights). */
  public static float[] positive(long seed, int n, DType dtype) {
    SplittableRandom rnd = new SplittableRandom(seed);
    float[] out = new float[n];
    for (int i = 0; i < n; i++) {
      out[i] = representable((float) (1 - rnd.nextDouble()), dtype);
    }
    return out;
  }

  /** {@code x} rounded to the nearest value {@code dtype} holds. */
  public static float representable(float x, DType dtype) {
    return dtype == DType.BF16 ? Bf16.round(x) : x;
  }

  /** A seed for (test, rank, tensor) triples that does not collide for small arguments. */
  public static long seed(long test, int rank, int tensor) {
    return test * 1_000_003L + rank * 1_009L + tensor;
  }

  /** The sub-array {@code [from, from + count)}. */
  public static float[] slice(float[] a, long from, long count) {
    float[] out = new float[Math.toIntExact(count)];
    System.arraycopy(a, Math.toIntExact(from), out, 0, out.length);
    return out;
  }

  /** The rows {@code [row, row + rows)} of a row-major matrix with {@code cols} columns. */
  public static float[] rows(float[] a, long cols, long row, long rows) {
    return slice(a, row * cols, rows * cols);
  }

  /** Concatenation, in order. */
  public static float[] concat(float[]... parts) {
    int n = 0;
    for (float[] p : parts) {
      n += p.length;
    }
    float[] out = new float[n];
    int at = 0;
    for (float[] p : parts) {
      System.arraycopy(p, 0, out, at, p.length);
      at += p.length;
    }
    return out;
  }
}
