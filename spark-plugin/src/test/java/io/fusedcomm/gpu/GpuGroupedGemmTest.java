package io.fusedcomm.gpu;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.fail;

import io.fusedcomm.api.Bf16;
import io.fusedcomm.api.Communicator;
import io.fusedcomm.api.DType;
import io.fusedcomm.api.DeviceTensor;
import io.fusedcomm.api.HostTensor;
import io.fusedcomm.api.WeightLayout;
import java.util.Arrays;
import java.util.Random;
import jcuda.runtime.JCuda;
import org.junit.jupiter.api.Test;

/**
 * The GPU grouped GEMM reached from Java ({@link Communicator#groupedGemm} on device tensors)
 * against the host backend's grouped GEMM on the same bf16 inputs and offsets, both weight
 * layouts: every element of every group within one bf16 rounding of the host's result (both
 * accumulate in fp32 and round once; only the order of the sum differs) and within its bound of
 * an fp64 reference; rows outside every group keep their poison; empty groups, groups shorter
 * and longer than the engine's 128-row blocks, N and K not multiples of the tiles; a second
 * launch bit for bit the same.
 */
class GpuGroupedGemmTest {
  /** rows, n, k, then the group lengths (the first group starts at row `lead`, the last entry). */
  private static final int[][] CASES = {
    // rows, n, k, lead, lengths...
    {1, 8, 8, 0, 1},
    {300, 136, 264, 0, 0, 100, 0, 200, 0},
    {700, 264, 520, 3, 129, 1, 0, 255, 128, 127, 7},
    {1000, 1024, 64, 0, 1000},
    {513, 520, 136, 0, 0, 0, 0, 513},
  };

  @Test
  void bothLayoutsMatchTheHostBackendWithEmptyGroups() {
    Gpu.require();
    JCuda.cudaSetDevice(0);
    Random rnd = new Random(System.nanoTime());
    for (int[] c : CASES) {
      long[] offsets = new long[c.length - 4 + 1];
      offsets[0] = c[3];
      for (int g = 4; g < c.length; g++) {
        offsets[g - 3] = offsets[g - 4] + c[g];
      }
      for (WeightLayout layout : WeightLayout.values()) {
        check(rnd, c[0], c[1], c[2], offsets, layout);
      }
    }
  }

  /** 64 groups of random lengths (about one in four empty), as a routed MoE batch gives them. */
  @Test
  void manyGroupsOfRandomLengths() {
    Gpu.require();
    JCuda.cudaSetDevice(0);
    Random rnd = new Random(System.nanoTime());
    long[] offsets = new long[65];
    for (int g = 0; g < 64; g++) {
      offsets[g + 1] = offsets[g] + (rnd.nextInt(4) == 0 ? 0 : rnd.nextInt(300));
    }
    int rows = (int) offsets[64];
    for (WeightLayout layout : WeightLayout.values()) {
      check(rnd, rows, 256, 128, offsets, layout);
    }
  }

  private static void check(Random rnd, int rows, int n, int k, long[] offsets, WeightLayout layout) {
    int groups = offsets.length - 1;
    String what = "groupedGemm rows=" + rows + " n=" + n + " k=" + k + " " + layout + " offsets="
        + Arrays.toString(offsets);
    float[] a = random(rnd, rows * k);
    float[] w = random(rnd, groups * n * k);
    long[] wShape = layout == WeightLayout.NK ? new long[] {groups, n, k} : new long[] {groups, k, n};
    float[] host;
    try (HostTensor ha = HostTensor.of(a, DType.BF16, rows, k);
        HostTensor hw = HostTensor.of(w, DType.BF16, wShape);
        HostTensor hc = HostTensor.allocate(DType.BF16, rows, n)) {
      hc.fill(Float.NaN);
      Communicator.groupedGemm(ha, hw, hc, offsets, layout);
      host = hc.toFloatArray();
    }
    float[] gpu;
    try (DeviceTensor da = DeviceTensor.allocate(DType.BF16, rows, k);
        DeviceTensor dw = DeviceTensor.allocate(DType.BF16, wShape);
        DeviceTensor dc = DeviceTensor.allocate(DType.BF16, rows, n)) {
      Gpu.put(da, a);
      Gpu.put(dw, w);
      Gpu.poison(dc);
      Communicator.groupedGemm(da, dw, dc, offsets, layout);
      gpu = Gpu.download(dc);
      Gpu.poison(dc);
      Communicator.groupedGemm(da, dw, dc, offsets, layout);
      float[] again = Gpu.download(dc);
      for (int i = 0; i < gpu.length; i++) {
        if (Float.floatToRawIntBits(gpu[i]) != Float.floatToRawIntBits(again[i])) {
          fail(what + ": a second launch gave C[" + i / n + "," + i % n + "] = " + again[i] + " after " + gpu[i]);
        }
      }
    }
    int bad = 0;
    String first = null;
    int group = 0;
    for (int i = 0; i < rows; i++) {
      while (group < groups && i >= offsets[group + 1]) {
        group++;
      }
      boolean inGroup = group < groups && i >= offsets[group];
      for (int j = 0; j < n; j++) {
        float got = gpu[i * n + j];
        float expectedHost = host[i * n + j];
        String problem = null;
        if (!inGroup) {
          if (!Float.isNaN(got) || !Float.isNaN(expectedHost)) {
            problem = "row " + i + " is in no group but C[" + i + "," + j + "] = " + got + " (host " + expectedHost + ")";
          }
        } else {
          double ref = 0;
          double mag = 0;
          for (int p = 0; p < k; p++) {
            double wv = layout == WeightLayout.NK ? w[(group * n + j) * k + p] : w[(group * k + p) * n + j];
            ref += a[i * k + p] * wv;
            mag += Math.abs(a[i * k + p] * wv);
          }
          double accumulation = mag * 1e-6 * Math.sqrt(k) + 1e-6;
          double tolRef = Math.abs(ref) * 0x1p-8 + accumulation;
          // Two results of one rounding each: at most one bf16 step apart, plus the accumulation.
          double tolHost = Math.max(Math.abs(got), Math.abs(expectedHost)) * 0x1p-7 + 2 * accumulation;
          if (!(Math.abs(got - ref) <= tolRef)) {
            problem = "C[" + i + "," + j + "] (group " + group + ") = " + got + ", expected " + ref + " ± " + tolRef;
          } else if (!(Math.abs(got - expectedHost) <= tolHost)) {
            problem = "C[" + i + "," + j + "] (group " + group + ") = " + got + ", host " + expectedHost + " ± " + tolHost;
          }
        }
        if (problem != null && bad++ == 0) {
          first = problem;
        }
      }
    }
    assertEquals(0, bad, what + ": " + bad + " bad elements, first " + first);
  }

  private static float[] random(Random rnd, int n) {
    float[] v = new float[n];
    for (int i = 0; i < n; i++) {
      v[i] = Bf16.round((float) rnd.nextGaussian());
    }
    return v;
  }
}
