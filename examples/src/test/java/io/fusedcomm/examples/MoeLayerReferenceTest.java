package io.fusedcomm.examples;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.fusedcomm.api.Backend;
import io.fusedcomm.api.Bf16;
import io.fusedcomm.api.DType;
import io.fusedcomm.api.Split;
import io.fusedcomm.examples.MoeLayerExample.Problem;
import io.fusedcomm.examples.MoeLayerExample.Reference;
import io.fusedcomm.examples.MoeLayerExample.Routing;
import io.fusedcomm.examples.MoeLayerExample.Shard;
import io.fusedcomm.examples.MoeLayerExample.Timings;
import java.util.ArrayList;
import java.util.List;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.CsvSource;

/**
 * Example 03's checker, without Spark or the native library: a Java model of the distributed
 * forward and backward that rounds wherever an implementation does (H1, the activation, O, Y, G,
 * dH1, dXr, dX, the weighted rows and the weight gradients, fp32 sums) must pass; a dropped slot,
 * a backward without SiLU', swapped weight gradients, a NaN, or one element a little outside its
 * bound must not.
 */
class MoeLayerReferenceTest {
  private static final Timings NO_TIME = new Timings(0, 0, 0, 0, 0);

  @ParameterizedTest
  @CsvSource({"2, 120, 64, 96, 6, 2, bf16", "3, 50, 32, 40, 4, 3, f32", "4, 37, 16, 24, 3, 2, bf16",
      "1, 9, 8, 16, 2, 2, bf16", "2, 64, 24, 32, 8, 4, bf16"})
  void modelOfTheDistributedPathPasses(int world, int m, int h, int f, int e, int topk, String dtype) {
    for (long seed = 1; seed <= 3; seed++) {
      Problem p = new Problem(world, m, h, f, e, topk, TensorParallelMlpExample.parseDType(dtype), seed);
      assertTrue(MoeLayerExample.check(p, simulate(p, Fault.NONE)), p.describe() + " seed " + seed);
    }
  }

  @Test
  void routingIsTheTopKBySoftmaxWeights() {
    // Two tokens, three experts, H = 2: logits (x · Wrᵀ) are (1, 3, 2) and (5, 0, 5).
    float[] x = {1, 0, 0, 1};
    float[] router = {1, 5, 3, 0, 2, 5};
    Routing r = MoeLayerExample.route(x, 2, router, 2, 3, 2);
    assertArrayEquals(new int[] {1, 2, 0, 2}, r.ids(), "top-2 by logit, the lower id first on a tie");
    double e = Math.exp(-1);
    assertEquals(1 / (1 + e), r.weights()[0], 1e-7);
    assertEquals(e / (1 + e), r.weights()[1], 1e-7);
    assertEquals(0.5, r.weights()[2], 1e-7);
    assertEquals(0.5, r.weights()[3], 1e-7);
  }

  @Test
  void siluGradIsTheDerivativeOfSilu() {
    for (double x = -6; x <= 6; x += 0.25) {
      double dq = (MoeLayerExample.silu(x + 1e-6) - MoeLayerExample.silu(x - 1e-6)) / 2e-6;
      assertEquals(dq, MoeLayerExample.siluGrad(x), 1e-6, "x = " + x);
      assertTrue(Math.abs(MoeLayerExample.siluGrad(x)) <= Reference.SILU_LIPSCHITZ);
    }
  }

  @Test
  void aDroppedSlotFails() {
    Problem p = new Problem(2, 60, 32, 40, 4, 2, DType.BF16, 7);
    assertFalse(MoeLayerExample.check(p, simulate(p, Fault.DROP_SLOT)));
  }

  @Test
  void aBackwardWithoutSiluGradFails() {
    Problem p = new Problem(2, 60, 32, 40, 4, 2, DType.BF16, 7);
    assertFalse(MoeLayerExample.check(p, simulate(p, Fault.NO_SILU_GRAD)));
  }

  @Test
  void swappedWeightGradientsFail() {
    Problem p = new Problem(2, 60, 32, 40, 4, 2, DType.BF16, 7);
    List<Shard> shards = simulate(p, Fault.NONE);
    Shard s = shards.get(1);
    shards.set(1, new Shard(s.rank(), s.tokenOffset(), s.tokens(), s.y(), s.dx(), s.firstExpert(), s.localExperts(),
        s.dw2(), s.dw1(), s.expertRows(), s.backend(), s.device(), s.forward(), s.backward()));
    assertFalse(MoeLayerExample.check(p, shards));
  }

  @Test
  void oneElementJustOutsideItsBoundFailsAndJustInsidePasses() {
    Problem p = new Problem(2, 60, 32, 40, 4, 2, DType.BF16, 11);
    Reference ref = new Reference(p);
    for (String tensor : List.of("Y", "dX", "dW1", "dW2")) {
      for (double factor : new double[] {1.5, 0.5}) {
        List<Shard> shards = simulate(p, Fault.NONE);
        Shard s = shards.get(1);
        int i = 3;
        float[] values;
        double exact;
        double tol;
        switch (tensor) {
          case "Y" -> {
            values = s.y();
            exact = ref.y[s.tokenOffset() * p.h() + i];
            tol = ref.yTolerance[s.tokenOffset() * p.h() + i];
          }
          case "dX" -> {
            values = s.dx();
            exact = ref.dx[s.tokenOffset() * p.h() + i];
            tol = ref.dxTolerance[s.tokenOffset() * p.h() + i];
          }
          case "dW1" -> {
            values = s.dw1();
            exact = ref.dw1[s.firstExpert() * p.f() * p.h() + i];
            tol = ref.dw1Tolerance[s.firstExpert() * p.f() * p.h() + i];
          }
          default -> {
            values = s.dw2();
            exact = ref.dw2[s.firstExpert() * p.f() * p.h() + i];
            tol = ref.dw2Tolerance[s.firstExpert() * p.f() * p.h() + i];
          }
        }
        values[i] = (float) (exact + factor * tol);
        assertEquals(factor < 1, MoeLayerExample.check(p, shards), tensor + " at " + factor + " x its bound");
      }
    }
  }

  @Test
  void aNaNFails() {
    Problem p = new Problem(3, 40, 16, 24, 5, 2, DType.F32, 3);
    List<Shard> shards = simulate(p, Fault.NONE);
    shards.get(2).dw1()[0] = Float.NaN;
    assertFalse(MoeLayerExample.check(p, shards));
  }

  @Test
  void cudaRefusesWhatItsOpsCannotRun() {
    Problem f32 = new Problem(2, 60, 32, 40, 4, 2, DType.F32, 1);
    assertThrows(IllegalArgumentException.class, () -> MoeLayerExample.requireSupported(f32, Backend.CUDA));
    Problem odd = new Problem(2, 60, 32, 36, 4, 2, DType.BF16, 1);
    assertThrows(IllegalArgumentException.class, () -> MoeLayerExample.requireSupported(odd, Backend.CUDA));
    Problem wide = new Problem(2, 60, 32, 40, 100, 65, DType.BF16, 1);
    assertThrows(IllegalArgumentException.class, () -> MoeLayerExample.requireSupported(wide, Backend.CUDA));
    MoeLayerExample.requireSupported(f32, Backend.HOST);
    MoeLayerExample.requireSupported(new Problem(2, 60, 32, 40, 4, 2, DType.BF16, 1), Backend.CUDA);
  }

  private enum Fault { NONE, DROP_SLOT, NO_SILU_GRAD }

  /**
   * Every rank's results as the distributed path computes them: the same routing, fp32 sums in
   * the order the ops take them, each stored tensor rounded to the dtype.
   */
  static List<Shard> simulate(Problem p, Fault fault) {
    int m = p.m();
    int h = p.h();
    int f = p.f();
    int topk = p.topk();
    float[] x = p.x();
    float[] dy = p.dy();
    float[] w1 = p.w1();
    float[] w2 = p.w2();
    Routing routing = MoeLayerExample.route(x, m, p.router(), h, p.experts(), topk);
    float[] y = new float[m * h];
    float[] dx = new float[m * h];
    float[] dw1Acc = new float[p.experts() * f * h];  // fp32 sums in row order, rounded at the end
    float[] dw2Acc = new float[p.experts() * f * h];
    long[] rowsOf = new long[p.experts()];
    float[] o = new float[h];
    float[] r = new float[h];
    float[] act = new float[f];
    float[] dh1 = new float[f];
    // Rows at an expert's rank are in (source rank, token, slot) order: the global token order.
    for (int t = 0; t < m; t++) {
      float[] ySum = new float[h];
      float[] dxSum = new float[h];
      for (int k = 0; k < topk; k++) {
        int e = routing.ids()[t * topk + k];
        float wt = routing.weights()[t * topk + k];
        rowsOf[e]++;
        int we = e * f * h;
        for (int c = 0; c < f; c++) {
          float s = 0;
          float g = 0;
          for (int i = 0; i < h; i++) {
            s += x[t * h + i] * w1[we + c * h + i];
            g += dy[t * h + i] * w2[we + c * h + i];
          }
          float h1 = round(p, s);
          act[c] = round(p, (float) MoeLayerExample.silu(h1));
          float gr = round(p, g);
          dh1[c] = round(p, fault == Fault.NO_SILU_GRAD ? gr : (float) (gr * MoeLayerExample.siluGrad(h1)));
        }
        for (int j = 0; j < h; j++) {
          float so = 0;
          float sr = 0;
          for (int c = 0; c < f; c++) {
            so += act[c] * w2[we + c * h + j];
            sr += dh1[c] * w1[we + c * h + j];
          }
          o[j] = round(p, so);
          r[j] = round(p, sr);
          for (int c = 0; c < f; c++) {
            dw2Acc[we + c * h + j] += round(p, wt * act[c]) * dy[t * h + j];
            dw1Acc[we + c * h + j] += round(p, wt * dh1[c]) * x[t * h + j];
          }
        }
        if (fault == Fault.DROP_SLOT && t == 0 && k == 1) {
          continue;
        }
        for (int j = 0; j < h; j++) {
          float wo = wt * o[j];
          ySum[j] += wo;
          float wr = wt * r[j];
          dxSum[j] += wr;
        }
      }
      for (int j = 0; j < h; j++) {
        y[t * h + j] = round(p, ySum[j]);
        dx[t * h + j] = round(p, dxSum[j]);
      }
    }
    List<Shard> shards = new ArrayList<>();
    int fh = f * h;
    for (int rank = 0; rank < p.world(); rank++) {
      int tokenOffset = (int) Split.offset(m, p.world(), rank);
      int tokens = (int) Split.count(m, p.world(), rank);
      int first = (int) Split.offset(p.experts(), p.world(), rank);
      int local = (int) Split.count(p.experts(), p.world(), rank);
      float[] dw1 = new float[local * fh];
      float[] dw2 = new float[local * fh];
      for (int i = 0; i < dw1.length; i++) {
        dw1[i] = round(p, dw1Acc[first * fh + i]);
        dw2[i] = round(p, dw2Acc[first * fh + i]);
      }
      long[] rows = new long[local];
      System.arraycopy(rowsOf, first, rows, 0, local);
      shards.add(new Shard(rank, tokenOffset, tokens, slice(y, tokenOffset * h, tokens * h),
          slice(dx, tokenOffset * h, tokens * h), first, local, dw1, dw2, rows, "model", "no device", NO_TIME,
          NO_TIME));
    }
    return shards;
  }

  private static float[] slice(float[] a, int from, int n) {
    float[] out = new float[n];
    System.arraycopy(a, from, out, 0, n);
    return out;
  }

  private static float round(Problem p, float v) {
    return p.dtype() == DType.BF16 ? Bf16.round(v) : v;
  }
}
