package io.fusedcomm.gpu;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import io.fusedcomm.api.Bf16;
import io.fusedcomm.api.Communicator;
import io.fusedcomm.api.DType;
import io.fusedcomm.api.DeviceTensor;
import io.fusedcomm.api.WeightLayout;
import io.fusedcomm.testing.Reference;
import java.util.Random;
import jcuda.runtime.JCuda;
import org.junit.jupiter.api.Test;

/**
 * The GPU GEMM engine reached from Java: JCuda device tensors in, every element of the result
 * checked against an fp64 reference of the bf16-rounded inputs, output poisoned first, and a
 * second launch on the same inputs bit for bit the same.
 */
class GpuGemmTest {
  private static final long[][] SHAPES = {
    {1, 8, 8}, {1, 4096, 4096}, {7, 136, 264}, {128, 256, 64}, {300, 520, 1032}, {1000, 1024, 8}, {2048, 1536, 4096},
  };

  /**
   * Small M with long K, where the launch runs stream-K (kernels/gemm.h) with the workspace the
   * first GEMM on the device allocated: checked against the reference, and a second launch on
   * the same inputs must give the same bits (the partials are summed in K order).
   */
  private static final long[][] STREAM_K_SHAPES = {{1, 8192, 8192}, {64, 2560, 8192}, {33, 4096, 8200}};

  @Test
  void streamKShapesMatchTheReferenceAndRepeatBitForBit() {
    checkAll(STREAM_K_SHAPES);
  }

  @Test
  void bothLayoutsMatchTheReferenceIncludingTails() {
    checkAll(SHAPES);
  }

  private static void checkAll(long[][] shapes) {
    Gpu.require();
    JCuda.cudaSetDevice(0);
    Random rnd = new Random(System.nanoTime());
    for (long[] s : shapes) {
      for (WeightLayout layout : WeightLayout.values()) {
        check(rnd, (int) s[0], (int) s[1], (int) s[2], layout);
      }
    }
  }

  private static void check(Random rnd, int m, int n, int k, WeightLayout layout) {
    float[] a = random(rnd, m * k);
    float[] w = random(rnd, n * k);
    try (DeviceTensor da = DeviceTensor.allocate(DType.BF16, m, k);
        DeviceTensor dw = DeviceTensor.allocate(DType.BF16, Reference.weightShape(layout, n, k));
        DeviceTensor dc = DeviceTensor.allocate(DType.BF16, m, n)) {
      Gpu.put(da, a);
      Gpu.put(dw, w);
      Gpu.poison(dc);
      Communicator.gemm(da, dw, dc, layout);
      float[] c = Gpu.download(dc);
      // The same launch again: every launch's result is a function of its inputs alone.
      Gpu.poison(dc);
      Communicator.gemm(da, dw, dc, layout);
      float[] again = Gpu.download(dc);
      for (int i = 0; i < c.length; i++) {
        if (Float.floatToRawIntBits(c[i]) != Float.floatToRawIntBits(again[i])) {
          fail("gemm " + m + "x" + n + "x" + k + " " + layout + ": a second launch gave C["
              + i / n + "," + i % n + "] = " + again[i] + " after " + c[i]);
        }
      }
      // random() draws bf16 values, so a and w are exactly what the GPU holds.
      int bad = 0;
      String first = null;
      for (int i = 0; i < m; i++) {
        for (int j = 0; j < n; j++) {
          double ref = 0;
          double mag = 0;
          for (int p = 0; p < k; p++) {
            double wv = layout == WeightLayout.NK ? w[j * k + p] : w[p * n + j];
            ref += a[i * k + p] * wv;
            mag += Math.abs(a[i * k + p] * wv);
          }
          // bf16 output rounding (2^-8 relative) plus fp32 accumulation over k terms.
          double tol = Math.abs(ref) * 0x1p-8 + mag * 1e-6 * Math.sqrt(k) + 1e-6;
          float got = c[i * n + j];
          if (!(Math.abs(got - ref) <= tol)) {
            if (bad++ == 0) {
              first = "C[" + i + "," + j + "] = " + got + ", expected " + ref + " ± " + tol;
            }
          }
        }
      }
      assertEquals(0, bad, "gemm " + m + "x" + n + "x" + k + " " + layout + ": " + bad + " bad elements, first " + first);
      assertTrue(Float.isFinite(c[c.length - 1]));
    }
  }

  private static float[] random(Random rnd, int n) {
    float[] v = new float[n];
    for (int i = 0; i < n; i++) {
      v[i] = Bf16.round((float) rnd.nextGaussian());
    }
    return v;
  }
}
