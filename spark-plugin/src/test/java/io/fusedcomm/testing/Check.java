package io.fusedcomm.testing;

import io.fusedcomm.api.DType;
import java.util.ArrayList;
import java.util.List;
import org.junit.jupiter.api.Assertions;

/**
 * Per-element comparison of an op's output with an fp64 {@link Expected}; no mean-error escape
 * hatch, NaN (the poison written before each op) always fails.
 *
 * <p>Tolerance per element, with {@code m} the element's term magnitude sum and {@code n} its
 * term count: the fp32 accumulation may err by {@code acc = max(1e-5, 2·n·2⁻²⁴)·m}; an f32
 * output adds one fp32 rounding ({@code 2⁻²⁴·|ref|}), a bf16 output one bf16 rounding
 * ({@code 2⁻⁸·(|ref| + acc)}, half an ulp of 8 significant bits).
 */
public final class Check {
  private static final int SHOWN = 6;

  private Check() {}

  /** The tolerance of one element (see the class comment); {@code extraRel} widens acc. */
  public static double tolerance(DType dtype, double ref, double magnitude, int terms, double extraRel) {
    double acc = (Math.max(1e-5, 2.0 * terms * 0x1p-24) + extraRel) * magnitude + Double.MIN_NORMAL;
    double a = Math.abs(ref);
    return dtype == DType.BF16 ? 0x1p-8 * (a + acc) + acc : acc + 0x1p-24 * a;
  }

  /** Every element within {@link #tolerance}. */
  public static void close(String what, Expected exp, float[] actual, DType dtype) {
    close(what, exp, actual, dtype, 0);
  }

  /** As {@link #close(String, Expected, float[], DType)} with the accumulation bound widened. */
  public static void close(String what, Expected exp, float[] actual, DType dtype, double extraRel) {
    Assertions.assertEquals(exp.length(), actual.length, what + ": element count");
    List<String> bad = new ArrayList<>();
    int failures = 0;
    for (int i = 0; i < actual.length; i++) {
      double ref = exp.value[i];
      double tol = tolerance(dtype, ref, exp.magnitude[i], exp.terms, extraRel);
      double err = Math.abs(actual[i] - ref);
      if (!(err <= tol)) {
        failures++;
        if (bad.size() < SHOWN) {
          bad.add(String.format("[%d] expected %.9g got %s (|err| %.3g > tol %.3g)", i, ref, actual[i], err, tol));
        }
      }
    }
    if (failures > 0) {
      Assertions.fail(what + " (" + dtype.label() + "): " + failures + " of " + actual.length
          + " elements out of tolerance: " + String.join("; ", bad));
    }
  }

  /** Every element within {@code rel·|ref| + abs}; infinities must match exactly. */
  public static void closeTo(String what, double[] expected, float[] actual, double rel, double abs) {
    Assertions.assertEquals(expected.length, actual.length, what + ": element count");
    List<String> bad = new ArrayList<>();
    int failures = 0;
    for (int i = 0; i < actual.length; i++) {
      double ref = expected[i];
      boolean ok = Double.isInfinite(ref)
          ? actual[i] == ref
          : Math.abs(actual[i] - ref) <= rel * Math.abs(ref) + abs;
      if (!ok) {
        failures++;
        if (bad.size() < SHOWN) {
          bad.add(String.format("[%d] expected %.9g got %s", i, ref, actual[i]));
        }
      }
    }
    if (failures > 0) {
      Assertions.fail(what + ": " + failures + " of " + actual.length + " elements out of tolerance: "
          + String.join("; ", bad));
    }
  }

  /** Bitwise equality, for pure data movement (NaN poison never matches a finite input). */
  public static void exact(String what, float[] expected, float[] actual) {
    Assertions.assertEquals(expected.length, actual.length, what + ": element count");
    List<String> bad = new ArrayList<>();
    int failures = 0;
    for (int i = 0; i < actual.length; i++) {
      if (Float.floatToRawIntBits(expected[i]) != Float.floatToRawIntBits(actual[i])) {
        failures++;
        if (bad.size() < SHOWN) {
          bad.add("[" + i + "] expected " + expected[i] + " got " + actual[i]);
        }
      }
    }
    if (failures > 0) {
      Assertions.fail(what + ": " + failures + " of " + actual.length + " elements differ: " + String.join("; ", bad));
    }
  }
}
