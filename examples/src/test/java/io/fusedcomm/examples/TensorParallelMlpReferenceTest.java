package io.fusedcomm.examples;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.fusedcomm.api.Bf16;
import io.fusedcomm.api.DType;
import io.fusedcomm.api.Split;
import io.fusedcomm.examples.TensorParallelMlpExample.Problem;
import io.fusedcomm.examples.TensorParallelMlpExample.Reference;
import io.fusedcomm.examples.TensorParallelMlpExample.Shard;
import java.util.ArrayList;
import java.util.List;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.CsvSource;

/**
 * The example's checker, without Spark or the native library: a Java model of the distributed
 * forward that rounds wherever an implementation may (Z, the activation, every partial sum and
 * every reduction step) must pass; a result missing a rank, a shard in the wrong place, a NaN or
 * one element off by a little more than its bound must not.
 */
class TensorParallelMlpReferenceTest {

  @ParameterizedTest
  @CsvSource({"2, 125, 64, 256, bf16", "3, 50, 32, 100, f32", "4, 37, 48, 130, bf16", "1, 9, 16, 24, bf16"})
  void modelOfTheDistributedPathPasses(int world, int m, int h, int f, String dtype) {
    for (long seed = 1; seed <= 3; seed++) {
      Problem p = new Problem(world, m, h, f, TensorParallelMlpExample.parseDType(dtype), seed);
      assertTrue(TensorParallelMlpExample.check(p, simulate(p, -1)), "seed " + seed);
    }
  }

  @ParameterizedTest
  @CsvSource({"2, 125, 64, 256, bf16", "3, 50, 32, 100, f32"})
  void missingRankContributionFails(int world, int m, int h, int f, String dtype) {
    Problem p = new Problem(world, m, h, f, TensorParallelMlpExample.parseDType(dtype), 7);
    List<Shard> shards = simulate(p, 1);
    assertFalse(TensorParallelMlpExample.check(p, shards));
    // Not a borderline failure: nearly every element is out of bounds.
    Reference ref = new Reference(p);
    int out = 0;
    int total = 0;
    for (Shard s : shards) {
      for (int i = 0; i < s.y().length; i++) {
        int at = s.rowOffset() * p.h() + i;
        total++;
        if (Math.abs(s.y()[i] - ref.y[at]) > ref.tolerance[at]) {
          out++;
        }
      }
    }
    assertTrue(out > 0.8 * total, out + " of " + total + " out of bounds");
  }

  @ParameterizedTest
  @CsvSource({"2, 125, 64, 256, bf16, 0.2", "3, 50, 32, 100, f32, 0.001"})
  void toleranceIsSmallAgainstTheOutput(int world, int m, int h, int f, String dtype, double ratio) {
    Problem p = new Problem(world, m, h, f, TensorParallelMlpExample.parseDType(dtype), 11);
    Reference ref = new Reference(p);
    double[] tol = ref.tolerance.clone();
    double[] y = new double[ref.y.length];
    for (int i = 0; i < y.length; i++) {
      y[i] = Math.abs(ref.y[i]);
    }
    java.util.Arrays.sort(tol);
    java.util.Arrays.sort(y);
    double medianTol = tol[tol.length / 2];
    double medianY = y[y.length / 2];
    assertTrue(medianTol > 0);
    assertTrue(medianTol < ratio * medianY, "median tolerance " + medianTol + " vs median |Y| " + medianY);
  }

  @org.junit.jupiter.api.Test
  void misplacedShardNanAndSingleElementFail() {
    Problem p = new Problem(2, 125, 64, 256, DType.BF16, 5);
    Reference ref = new Reference(p);

    List<Shard> swapped = simulate(p, -1);
    Shard a = swapped.get(0);
    Shard b = swapped.get(1);
    // Rank 1's values reported at rank 0's rows (same row count would be needed to tile, so the
    // rows/offsets mismatch is caught, as well as the values).
    swapped.set(0, new Shard(0, a.rowOffset(), a.rows(), copyRows(b.y(), a.y().length), "host", 0, 0, 0));
    assertFalse(TensorParallelMlpExample.check(p, swapped));

    List<Shard> poisoned = simulate(p, -1);
    poisoned.get(1).y()[17] = Float.NaN;
    assertFalse(TensorParallelMlpExample.check(p, poisoned));

    List<Shard> nudged = simulate(p, -1);
    Shard s = nudged.get(1);
    int at = s.rowOffset() * p.h() + 40;
    s.y()[40] = (float) (ref.y[at] + 1.5 * ref.tolerance[at]);
    assertFalse(TensorParallelMlpExample.check(p, nudged));

    List<Shard> missing = simulate(p, -1);
    missing.remove(1);
    assertFalse(TensorParallelMlpExample.check(p, missing));
  }

  private static float[] copyRows(float[] from, int length) {
    float[] out = new float[length];
    System.arraycopy(from, 0, out, 0, Math.min(from.length, length));
    return out;
  }

  /**
   * The distributed forward in Java, rounding to the dtype after the Z GEMM, after GELU, after
   * each rank's partial GEMM and after every step of the cross-rank sum. {@code dropRank >= 0}
   * leaves that rank's partial out (a broken reduce).
   */
  static List<Shard> simulate(Problem p, int dropRank) {
    int w = p.world();
    int m = p.m();
    int h = p.h();
    int f = p.f();
    float[] x = p.x();
    float[] w1 = p.w1();
    float[] w2 = p.w2();
    float[][] act = new float[m][f];
    for (int row = 0; row < m; row++) {
      for (int j = 0; j < f; j++) {
        float z = 0;
        for (int k = 0; k < h; k++) {
          z += x[row * h + k] * w1[j * h + k];
        }
        act[row][j] = round(p, (float) TensorParallelMlpExample.gelu(round(p, z)));
      }
    }
    float[] y = new float[m * h];
    for (int row = 0; row < m; row++) {
      for (int i = 0; i < h; i++) {
        float sum = 0;
        for (int r = 0; r < w; r++) {
          if (r == dropRank) {
            continue;
          }
          int from = (int) Split.offset(f, w, r);
          int to = from + (int) Split.count(f, w, r);
          float partial = 0;
          for (int j = from; j < to; j++) {
            partial += act[row][j] * w2[i * f + j];
          }
          sum = round(p, sum + round(p, partial));
        }
        y[row * h + i] = sum;
      }
    }
    List<Shard> shards = new ArrayList<>();
    for (int r = 0; r < w; r++) {
      int off = (int) Split.offset(m, w, r);
      int rows = (int) Split.count(m, w, r);
      float[] mine = new float[rows * h];
      System.arraycopy(y, off * h, mine, 0, mine.length);
      shards.add(new Shard(r, off, rows, mine, "model", 0, 0, 0));
    }
    assertEquals(m, shards.stream().mapToInt(Shard::rows).sum());
    return shards;
  }

  private static float round(Problem p, float v) {
    return p.dtype() == DType.BF16 ? Bf16.round(v) : v;
  }
}
