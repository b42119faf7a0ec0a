package io.fusedcomm.examples;

import static org.junit.jupiter.api.Assertions.assertDoesNotThrow;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.fusedcomm.api.Backend;
import io.fusedcomm.api.Bf16;
import io.fusedcomm.api.DType;
import io.fusedcomm.api.Split;
import io.fusedcomm.examples.TensorParallelMlpExample.DecodeShard;
import io.fusedcomm.examples.TensorParallelMlpExample.DecodeStep;
import io.fusedcomm.examples.TensorParallelMlpExample.Problem;
import io.fusedcomm.examples.TensorParallelMlpExample.Reference;
import io.fusedcomm.examples.TensorParallelMlpExample.Shard;
import io.fusedcomm.examples.TensorParallelMlpExample.Timings;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.function.Function;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.CsvSource;

/**
 * The example's checker, without Spark or the native library: a Java model of the distributed
 * forward and backward that rounds wherever an implementation may (Z, the activation, dA, dZ,
 * every partial sum and every reduction step) must pass; a result missing a rank, a shard in the
 * wrong place, a NaN or one element off by a little more than its bound, in Y or in dX, must not.
 */
class TensorParallelMlpReferenceTest {
  private static final Timings NO_TIME = new Timings(0, 0, 0);

  @ParameterizedTest
  @CsvSource({"2, 125, 64, 256, bf16", "3, 50, 32, 100, f32", "4, 37, 48, 130, bf16", "1, 9, 16, 24, bf16",
      "3, 130, 64, 200, f32", "2, 3, 8, 16, bf16"})
  void modelOfTheDistributedPathPasses(int world, int m, int h, int f, String dtype) {
    for (long seed = 1; seed <= 3; seed++) {
      Problem p = new Problem(world, m, h, f, TensorParallelMlpExample.parseDType(dtype), seed);
      assertTrue(TensorParallelMlpExample.check(p, simulate(p, -1)), "seed " + seed);
    }
  }

  /** The reference's rows on the fork-join pool give the very bits of the sequential loop. */
  @ParameterizedTest
  @CsvSource({"2, 125, 64, 256, bf16", "3, 50, 32, 100, f32", "4, 37, 48, 130, bf16"})
  void parallelReferenceIsIdenticalToSequential(int world, int m, int h, int f, String dtype) {
    Problem p = new Problem(world, m, h, f, TensorParallelMlpExample.parseDType(dtype), 5);
    Reference seq = new Reference(p, false);
    Reference par = new Reference(p, true);
    assertTrue(Arrays.equals(seq.y, par.y) && Arrays.equals(seq.yTolerance, par.yTolerance), "Y");
    assertTrue(Arrays.equals(seq.dx, par.dx) && Arrays.equals(seq.dxTolerance, par.dxTolerance), "dX");
  }

  /**
   * Y and dX against a direct fp64 evaluation of the formulas (W1 and W2 read as given, not
   * through the reference's transposed copies), to the last bits a different summation order
   * may move.
   */
  @Test
  void referenceMatchesTheFormulas() {
    Problem p = new Problem(2, 7, 24, 40, DType.F32, 3);
    Reference ref = new Reference(p);
    float[] x = p.x();
    float[] w1 = p.w1();
    float[] w2 = p.w2();
    float[] dy = p.dy();
    int h = p.h();
    int f = p.f();
    for (int row = 0; row < p.m(); row++) {
      double[] act = new double[f];
      double[] dz = new double[f];
      for (int j = 0; j < f; j++) {
        double z = 0;
        double da = 0;
        for (int k = 0; k < h; k++) {
          z += (double) x[row * h + k] * w1[j * h + k];
          da += (double) dy[row * h + k] * w2[k * f + j];
        }
        act[j] = TensorParallelMlpExample.gelu(z);
        dz[j] = da * TensorParallelMlpExample.geluGrad(z);
      }
      for (int i = 0; i < h; i++) {
        double yi = 0;
        double dxi = 0;
        for (int j = 0; j < f; j++) {
          yi += act[j] * w2[i * f + j];
          dxi += dz[j] * w1[j * h + i];
        }
        assertEquals(yi, ref.y[row * h + i], 1e-12 * (1 + Math.abs(yi)), "Y row " + row + " col " + i);
        assertEquals(dxi, ref.dx[row * h + i], 1e-12 * (1 + Math.abs(dxi)), "dX row " + row + " col " + i);
      }
    }
  }

  @ParameterizedTest
  @CsvSource({"2, 125, 64, 256, bf16", "3, 50, 32, 100, f32"})
  void missingRankContributionFails(int world, int m, int h, int f, String dtype) {
    Problem p = new Problem(world, m, h, f, TensorParallelMlpExample.parseDType(dtype), 7);
    List<Shard> shards = simulate(p, 1);
    assertFalse(TensorParallelMlpExample.check(p, shards));
    // Not a borderline failure: nearly every element of Y and of dX is out of bounds.
    Reference ref = new Reference(p);
    assertTrue(outOfBounds(p, shards, Shard::y, ref.y, ref.yTolerance) > 0.8, "Y");
    assertTrue(outOfBounds(p, shards, Shard::dx, ref.dx, ref.dxTolerance) > 0.8, "dX");
  }

  @ParameterizedTest
  @CsvSource({"2, 125, 64, 256, bf16, 0.2", "3, 50, 32, 100, f32, 0.001"})
  void toleranceIsSmallAgainstTheOutput(int world, int m, int h, int f, String dtype, double ratio) {
    Problem p = new Problem(world, m, h, f, TensorParallelMlpExample.parseDType(dtype), 11);
    Reference ref = new Reference(p);
    assertMedianBelow(ref.yTolerance, ref.y, ratio, "Y");
    assertMedianBelow(ref.dxTolerance, ref.dx, ratio, "dX");
  }

  @Test
  void misplacedShardNanAndSingleElementFail() {
    Problem p = new Problem(2, 125, 64, 256, DType.BF16, 5);
    Reference ref = new Reference(p);

    List<Shard> swapped = simulate(p, -1);
    Shard a = swapped.get(0);
    Shard b = swapped.get(1);
    // Rank 1's values reported at rank 0's rows (same row count would be needed to tile, so the
    // rows/offsets mismatch is caught, as well as the values).
    swapped.set(0, new Shard(0, a.rowOffset(), a.rows(), copyRows(b.y(), a.y().length),
        copyRows(b.dx(), a.dx().length), "model", "test", NO_TIME, NO_TIME, List.of()));
    assertFalse(TensorParallelMlpExample.check(p, swapped));

    for (Function<Shard, float[]> tensor : List.<Function<Shard, float[]>>of(Shard::y, Shard::dx)) {
      List<Shard> poisoned = simulate(p, -1);
      tensor.apply(poisoned.get(1))[17] = Float.NaN;
      assertFalse(TensorParallelMlpExample.check(p, poisoned));
    }

    List<Shard> nudgedY = simulate(p, -1);
    Shard s = nudgedY.get(1);
    int at = s.rowOffset() * p.h() + 40;
    s.y()[40] = (float) (ref.y[at] + 1.5 * ref.yTolerance[at]);
    assertFalse(TensorParallelMlpExample.check(p, nudgedY));

    List<Shard> nudgedDx = simulate(p, -1);
    s = nudgedDx.get(0);
    at = s.rowOffset() * p.h() + 23;
    s.dx()[23] = (float) (ref.dx[at] - 1.5 * ref.dxTolerance[at]);
    assertFalse(TensorParallelMlpExample.check(p, nudgedDx));

    List<Shard> missing = simulate(p, -1);
    missing.remove(1);
    assertFalse(TensorParallelMlpExample.check(p, missing));
  }

  @Test
  void backwardWithoutGeluGradFails() {
    // dX computed as if GELU were the identity (dZ = dA): a plausible bug the check must catch.
    Problem p = new Problem(2, 64, 32, 64, DType.BF16, 3);
    List<Shard> shards = simulate(p, -1, false);
    assertFalse(TensorParallelMlpExample.check(p, shards));
    Reference ref = new Reference(p);
    assertTrue(outOfBounds(p, shards, Shard::dx, ref.dx, ref.dxTolerance) > 0.8);
  }

  @Test
  void cudaRefusesF32AndSizesThatAreNotMultiplesOfEight() {
    Problem f32 = new Problem(2, 125, 64, 256, DType.F32, 1);
    IllegalArgumentException e =
        assertThrows(IllegalArgumentException.class, () -> TensorParallelMlpExample.requireSupported(f32, Backend.CUDA));
    assertTrue(e.getMessage().contains("bf16 only, got dtype=f32"), e.getMessage());

    // 200 over 3 ranks is 67, 67, 66; H = 60 is not a multiple of 8 either.
    Problem uneven = new Problem(3, 130, 60, 200, DType.BF16, 1);
    e = assertThrows(IllegalArgumentException.class,
        () -> TensorParallelMlpExample.requireSupported(uneven, Backend.CUDA));
    assertTrue(e.getMessage().contains("H=60, F_0=67, F_1=67, F_2=66"), e.getMessage());
    assertTrue(e.getMessage().contains("F divisible by 8·world = 24"), e.getMessage());

    // F < 8·world leaves a rank an F_r below 8.
    Problem small = new Problem(4, 16, 64, 16, DType.BF16, 1);
    assertThrows(IllegalArgumentException.class, () -> TensorParallelMlpExample.requireSupported(small, Backend.CUDA));

    assertDoesNotThrow(() -> TensorParallelMlpExample.requireSupported(
        new Problem(2, 125, 64, 256, DType.BF16, 1), Backend.CUDA));
    // 264 over 2 ranks is 132 + 132: not a multiple of 8 per rank although 264 is.
    assertThrows(IllegalArgumentException.class, () -> TensorParallelMlpExample.requireSupported(
        new Problem(2, 125, 64, 264, DType.BF16, 1), Backend.CUDA));
    // The host backend runs anything.
    assertDoesNotThrow(() -> TensorParallelMlpExample.requireSupported(uneven, Backend.HOST));
    assertDoesNotThrow(() -> TensorParallelMlpExample.requireSupported(f32, Backend.HOST));
  }

  @Test
  void geluGradIsTheDerivativeOfGelu() {
    for (double x = -6; x <= 6; x += 0.25) {
      double h = 1e-5;
      double numeric = (TensorParallelMlpExample.gelu(x + h) - TensorParallelMlpExample.gelu(x - h)) / (2 * h);
      assertEquals(numeric, TensorParallelMlpExample.geluGrad(x), 1e-8, "x = " + x);
    }
  }

  private static void assertMedianBelow(double[] tolerance, double[] values, double ratio, String name) {
    double[] tol = tolerance.clone();
    double[] abs = Arrays.stream(values).map(Math::abs).toArray();
    Arrays.sort(tol);
    Arrays.sort(abs);
    double medianTol = tol[tol.length / 2];
    double medianValue = abs[abs.length / 2];
    assertTrue(medianTol > 0, name);
    assertTrue(medianTol < ratio * medianValue,
        name + ": median tolerance " + medianTol + " vs median |" + name + "| " + medianValue);
  }

  /** The fraction of the elements of one tensor that are out of bounds. */
  private static double outOfBounds(Problem p, List<Shard> shards, Function<Shard, float[]> tensor, double[] ref,
      double[] tolerance) {
    int out = 0;
    int total = 0;
    for (Shard s : shards) {
      float[] got = tensor.apply(s);
      for (int i = 0; i < got.length; i++) {
        int at = s.rowOffset() * p.h() + i;
        total++;
        if (Math.abs(got[i] - ref[at]) > tolerance[at]) {
          out++;
        }
      }
    }
    return (double) out / total;
  }

  private static float[] copyRows(float[] from, int length) {
    float[] out = new float[length];
    System.arraycopy(from, 0, out, 0, Math.min(from.length, length));
    return out;
  }

  static List<Shard> simulate(Problem p, int dropRank) {
    return simulate(p, dropRank, true);
  }

  /**
   * The distributed forward and backward in Java, rounding to the dtype after each GEMM (Z, dA),
   * after GELU and after the GELU' product, after each rank's partial GEMM and after every step of
   * the cross-rank sum. {@code dropRank >= 0} leaves that rank's partials out (a broken reduce);
   * {@code withGeluGrad = false} skips the GELU' factor (a broken backward).
   */
  static List<Shard> simulate(Problem p, int dropRank, boolean withGeluGrad) {
    int m = p.m();
    int h = p.h();
    int f = p.f();
    float[] x = p.x();
    float[] w1 = p.w1();
    float[] w2 = p.w2();
    float[] dy = p.dy();
    float[][] act = new float[m][f];
    float[][] dz = new float[m][f];
    for (int row = 0; row < m; row++) {
      for (int j = 0; j < f; j++) {
        float z = 0;
        float da = 0;
        for (int k = 0; k < h; k++) {
          z += x[row * h + k] * w1[j * h + k];
          da += dy[row * h + k] * w2[k * f + j];
        }
        z = round(p, z);
        da = round(p, da);
        act[row][j] = round(p, (float) TensorParallelMlpExample.gelu(z));
        dz[row][j] = withGeluGrad ? round(p, (float) (da * TensorParallelMlpExample.geluGrad(z))) : da;
      }
    }
    float[] y = reduceScatter(p, act, w2, f, 1, dropRank);
    float[] dx = reduceScatter(p, dz, w1, 1, h, dropRank);
    List<Shard> shards = new ArrayList<>();
    for (int r = 0; r < p.world(); r++) {
      int off = (int) Split.offset(m, p.world(), r);
      int rows = (int) Split.count(m, p.world(), r);
      shards.add(new Shard(r, off, rows, Arrays.copyOfRange(y, off * h, (off + rows) * h),
          Arrays.copyOfRange(dx, off * h, (off + rows) * h), "model", "test", NO_TIME, NO_TIME, List.of()));
    }
    assertEquals(m, shards.stream().mapToInt(Shard::rows).sum());
    return shards;
  }

  /**
   * out[row][c] = Σ_j in[row][j]·wt[c·outStride + j·inStride], partials per rank's F shard in
   * fp32, each rounded, summed in rank order with a rounding after every step.
   */
  private static float[] reduceScatter(Problem p, float[][] in, float[] wt, int outStride, int inStride,
      int dropRank) {
    int w = p.world();
    int h = p.h();
    int f = p.f();
    float[] out = new float[p.m() * h];
    for (int row = 0; row < p.m(); row++) {
      for (int c = 0; c < h; c++) {
        float sum = 0;
        for (int r = 0; r < w; r++) {
          if (r == dropRank) {
            continue;
          }
          int from = (int) Split.offset(f, w, r);
          int to = from + (int) Split.count(f, w, r);
          float partial = 0;
          for (int j = from; j < to; j++) {
            partial += in[row][j] * wt[c * outStride + j * inStride];
          }
          sum = round(p, sum + round(p, partial));
        }
        out[row * h + c] = sum;
      }
    }
    return out;
  }

  private static float round(Problem p, float v) {
    return p.dtype() == DType.BF16 ? Bf16.round(v) : v;
  }

  /**
   * The inference mode's checker: every step's Y within its bound on every rank passes; one
   * element one ulp off on one rank (still within its bound) fails, since every rank must get
   * the same bits; a missing step fails.
   */
  @Test
  void decodeCheckNeedsEveryStepAndTheSameBitsOnEveryRank() {
    Problem p = new Problem(2, 64, 32, 64, DType.BF16, 3);
    List<Integer> batches = TensorParallelMlpExample.decodeBatches(p.m());
    assertEquals(List.of(1, 3, 8, 17, 64), batches);
    assertEquals(List.of(1, 3, 8), TensorParallelMlpExample.decodeBatches(10));
    List<DecodeShard> shards = new ArrayList<>();
    for (int r = 0; r < p.world(); r++) {
      List<DecodeStep> steps = new ArrayList<>();
      for (int s = 0; s < batches.size(); s++) {
        Reference ref = new Reference(p.decodeStep(s + 1, batches.get(s)));
        float[] y = new float[ref.y.length];
        for (int i = 0; i < y.length; i++) {
          y[i] = (float) ref.y[i];
        }
        steps.add(new DecodeStep(batches.get(s), y, 0, 0, 0, "path"));
      }
      shards.add(new DecodeShard(r, "host", "here", steps));
    }
    assertTrue(TensorParallelMlpExample.checkDecode(p, batches, shards));
    float[] y = shards.get(1).steps().get(4).y();
    y[5] = Math.nextUp(y[5]);
    assertFalse(TensorParallelMlpExample.checkDecode(p, batches, shards));
    y[5] = Math.nextDown(y[5]);
    assertTrue(TensorParallelMlpExample.checkDecode(p, batches, shards));
    shards.get(0).steps().remove(4);
    assertFalse(TensorParallelMlpExample.checkDecode(p, batches, shards));
  }

  @Test
  void decodeStepsShareTheWeightsNotTheInputs() {
    Problem p = new Problem(2, 64, 32, 64, DType.BF16, 3);
    Problem s1 = p.decodeStep(1, 8);
    Problem s2 = p.decodeStep(2, 8);
    assertTrue(Arrays.equals(p.w1(), s1.w1()) && Arrays.equals(p.w2(), s2.w2()));
    assertFalse(Arrays.equals(s1.x(), s2.x()));
    assertEquals(8 * 32, s1.x().length);
    assertThrows(IllegalArgumentException.class, () -> TensorParallelMlpExample.parseMode("decode"));
    assertTrue(TensorParallelMlpExample.parseMode("infer"));
    assertFalse(TensorParallelMlpExample.parseMode("train"));
  }
}
