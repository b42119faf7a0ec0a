package io.fusedcomm.examples;

import io.fusedcomm.api.Bf16;
import io.fusedcomm.api.DType;
import java.util.SplittableRandom;

/**
 * Deterministic example inputs: the same (seed, parts...) gives the same values in every JVM, so
 * the driver and each task can rebuild any rank's inputs and the reference needs no data shipped.
 */
final class SeededValues {
  private SeededValues() {}

  /** A seed derived from a base seed and identifying parts (op, dtype, rank, tensor, ...). */
  static long seed(long base, long... parts) {
    long h = base;
    for (long p : parts) {
      h = new SplittableRandom(h ^ (p * 0x9E3779B97F4A7C15L)).nextLong();
    }
    return h;
  }

  /**
   * {@code count} values uniform in {@code [-scale, scale)}, already rounded to {@code dtype}, so
   * the values a tensor holds and the values a reference uses are the same numbers.
   */
  static float[] uniform(long seed, int count, double scale, DType dtype) {
    SplittableRandom random = new SplittableRandom(seed);
    float[] v = new float[count];
    for (int i = 0; i < count; i++) {
      float f = (float) (scale * (2.0 * random.nextDouble() - 1.0));
      v[i] = dtype == DType.BF16 ? Bf16.round(f) : f;
    }
    return v;
  }

  /** Unit roundoff of the storage type: 2^-8 for bf16 (8 significant bits), 2^-24 for f32. */
  static double unitRoundoff(DType dtype) {
    return dtype == DType.BF16 ? 0x1p-8 : 0x1p-24;
  }
}
