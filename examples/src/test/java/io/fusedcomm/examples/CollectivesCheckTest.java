package io.fusedcomm.examples;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.fusedcomm.api.Bf16;
import io.fusedcomm.api.DType;
import io.fusedcomm.examples.CollectivesExample.Check;
import io.fusedcomm.examples.CollectivesExample.Sums;
import java.util.ArrayList;
import java.util.List;
import org.junit.jupiter.api.Test;

/** The collectives example's element checks and its report, without Spark or the native library. */
class CollectivesCheckTest {

  @Test
  void seededInputsAreReproducibleAndRounded() {
    float[] a = SeededValues.uniform(SeededValues.seed(42, 1, 2, 3), 1000, 1.0, DType.BF16);
    float[] b = SeededValues.uniform(SeededValues.seed(42, 1, 2, 3), 1000, 1.0, DType.BF16);
    float[] c = SeededValues.uniform(SeededValues.seed(42, 1, 2, 4), 1000, 1.0, DType.BF16);
    assertEquals(java.util.Arrays.toString(a), java.util.Arrays.toString(b));
    assertFalse(java.util.Arrays.equals(a, c));
    for (float v : a) {
      assertEquals(Bf16.round(v), v);
      assertTrue(v >= -1 && v <= 1);
    }
  }

  @Test
  void bf16SumRoundedOncePassesAndAMissingRankFails() {
    int world = 3;
    int n = 1001;
    float[][] in = new float[world][];
    for (int s = 0; s < world; s++) {
      in[s] = SeededValues.uniform(SeededValues.seed(9, s), n, 1.0, DType.BF16);
    }
    Sums ref = Sums.over(in, 0, n);
    double[] tol = ref.tolerance(DType.BF16, world);
    float[] good = new float[n];
    float[] partial = new float[n];
    for (int i = 0; i < n; i++) {
      // Worst plausible order: round after every step.
      good[i] = Bf16.round(Bf16.round(in[0][i] + in[1][i]) + in[2][i]);
      partial[i] = Bf16.round(in[0][i] + in[1][i]);
    }
    Check ok = CollectivesExample.compare("allReduce", DType.BF16, n, 0, world, "test", 0, good, ref.sum, tol);
    assertEquals(0, ok.badElements());
    assertTrue(ok.worstErrOverTol() <= 1);
    Check bad = CollectivesExample.compare("allReduce", DType.BF16, n, 0, world, "test", 0, partial, ref.sum, tol);
    assertTrue(bad.badElements() > n * 9 / 10, bad.badElements() + " of " + n);
  }

  @Test
  void exactChecksAreBitwiseAndNanFails() {
    double[] expected = {1.0, -0.0, 0.5};
    Check same = CollectivesExample.compare("allGather", DType.F32, 3, 0, 1, "t", 0, new float[] {1f, -0f, 0.5f},
        expected, null);
    assertEquals(0, same.badElements());
    Check signedZero = CollectivesExample.compare("allGather", DType.F32, 3, 0, 1, "t", 0,
        new float[] {1f, 0f, 0.5f}, expected, null);
    assertEquals(1, signedZero.badElements());
    Check nan = CollectivesExample.compare("allToAll", DType.F32, 3, 0, 1, "t", 0,
        new float[] {1f, -0f, Float.NaN}, expected, null);
    assertEquals(1, nan.badElements());
    Check shortOutput = CollectivesExample.compare("allToAll", DType.F32, 3, 0, 1, "t", 0, new float[] {1f, -0f},
        expected, null);
    assertEquals(1, shortOutput.badElements());
    Check nanWithTolerance = CollectivesExample.compare("allReduce", DType.F32, 1, 0, 1, "t", 0,
        new float[] {Float.NaN}, new double[] {1.0}, new double[] {1e9});
    assertEquals(1, nanWithTolerance.badElements());
  }

  @Test
  void reportNeedsEveryRankOfEveryCheck() {
    List<Check> all = new ArrayList<>();
    for (String dtype : List.of("f32", "bf16")) {
      for (int n : CollectivesExample.SIZES) {
        for (String op : List.of("allReduce", "allGather", "reduceScatter", "allToAll")) {
          for (int r = 0; r < 2; r++) {
            all.add(new Check(op, dtype, n, r, 2, "host", 0, 0, false, 0, 1));
          }
        }
      }
    }
    assertTrue(CollectivesExample.report(all, 2));
    assertFalse(CollectivesExample.report(all.subList(1, all.size()), 2), "a missing rank must fail");
    List<Check> oneBad = new ArrayList<>(all);
    Check c = oneBad.get(5);
    oneBad.set(5, new Check(c.op(), c.dtype(), c.n(), c.rank(), 2, "host", 1, 2, false, 1, 1));
    assertFalse(CollectivesExample.report(oneBad, 2), "a bad element must fail");
  }
}
