package io.fusedcomm.gpu;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.fail;

import io.fusedcomm.api.Bf16;
import io.fusedcomm.api.Communicator;
import io.fusedcomm.api.DType;
import io.fusedcomm.api.DeviceTensor;
import io.fusedcomm.api.HostTensor;
import io.fusedcomm.errors.BackendUnavailableException;
import io.fusedcomm.testing.Reference;
import java.lang.reflect.Method;
import java.util.Random;
import jcuda.NativePointerObject;
import jcuda.runtime.JCuda;
import jcuda.runtime.cudaStream_t;
import org.junit.jupiter.api.Assumptions;
import org.junit.jupiter.api.Test;

/**
 * The single-rank attention op on the GPU ({@code Communicator.attention} with device tensors)
 * against the host backend's op on the same bf16 inputs: head dims 64 and 128, causal and not,
 * grouped-query ratios 1, 4 and 8 and multi-query, query and key lengths that are not multiples
 * of a tile and differ from each other, batch 1 to 4; outputs poisoned first, every element of
 * {@code o} and {@code lse} compared; with and without lse, synchronous and on a CUDA stream
 * (JCuda and raw handle forms), and a second launch bit for bit the same.
 */
class GpuAttentionTest {
  /** (B, Lq, Lk, Hq, Hkv, D). */
  private static final int[][] SHAPES = {
    {1, 128, 128, 4, 4, 64}, {2, 333, 333, 8, 2, 128}, {1, 200, 517, 8, 1, 64}, {4, 64, 64, 16, 2, 128},
    {1, 1000, 1000, 4, 4, 128}, {1, 517, 200, 8, 1, 64}, {1, 1, 77, 8, 8, 128},
  };

  @Test
  void matchesTheHostOpOnTheSameInputs() {
    Gpu.require();
    JCuda.cudaSetDevice(0);
    Random rnd = new Random(System.nanoTime());
    for (int[] s : SHAPES) {
      for (boolean causal : new boolean[] {false, true}) {
        check(rnd, s[0], s[1], s[2], s[3], s[4], s[5], causal, null);
      }
    }
  }

  @Test
  void runsOnTheCallersStream() {
    Gpu.require();
    JCuda.cudaSetDevice(0);
    cudaStream_t stream = new cudaStream_t();
    JCuda.cudaStreamCreate(stream);
    try {
      Random rnd = new Random(System.nanoTime());
      check(rnd, 2, 300, 300, 8, 2, 128, true, stream);
      check(rnd, 1, 129, 257, 4, 1, 64, false, stream);
    } finally {
      JCuda.cudaStreamDestroy(stream);
    }
  }

  private static void check(Random rnd, int b, int lq, int lk, int hq, int hkv, int d, boolean causal,
                            cudaStream_t stream) {
    String what = "attention B=" + b + " Lq=" + lq + " Lk=" + lk + " Hq=" + hq + " Hkv=" + hkv + " D=" + d
        + (causal ? " causal" : "") + (stream != null ? " on a stream" : "");
    float[] q = random(rnd, b * lq * hq * d);
    float[] k = random(rnd, b * lk * hkv * d);
    float[] v = random(rnd, b * lk * hkv * d);
    float[] hostO;
    float[] hostLse;
    try (HostTensor hq4 = HostTensor.of(q, DType.BF16, b, lq, hq, d);
        HostTensor hk = HostTensor.of(k, DType.BF16, b, lk, hkv, d);
        HostTensor hv = HostTensor.of(v, DType.BF16, b, lk, hkv, d);
        HostTensor ho = HostTensor.allocate(DType.BF16, b, lq, hq, d);
        HostTensor hl = HostTensor.allocate(DType.F32, b, hq, lq)) {
      Communicator.attention(hq4, hk, hv, ho, hl, causal, 0f);
      hostO = ho.toFloatArray();
      hostLse = hl.toFloatArray();
    }
    // Magnitudes Σ p·|v| of each output element, for its tolerance.
    double[] mag = Reference.attention(q, k, v, b, lq, lk, hq, hkv, d, causal, 0).out.magnitude;
    try (DeviceTensor dq = DeviceTensor.allocate(DType.BF16, b, lq, hq, d);
        DeviceTensor dk = DeviceTensor.allocate(DType.BF16, b, lk, hkv, d);
        DeviceTensor dv = DeviceTensor.allocate(DType.BF16, b, lk, hkv, d);
        DeviceTensor o = DeviceTensor.allocate(DType.BF16, b, lq, hq, d);
        DeviceTensor lse = DeviceTensor.allocate(DType.F32, b, hq, lq)) {
      Gpu.put(dq, q);
      Gpu.put(dk, k);
      Gpu.put(dv, v);
      Gpu.poison(o);
      Gpu.poison(lse);
      run(dq, dk, dv, o, lse, causal, stream, false);
      float[] gotO = Gpu.download(o);
      float[] gotLse = Gpu.download(lse);
      int bad = 0;
      String first = null;
      for (int i = 0; i < gotO.length; i++) {
        // Both round o to bf16 once (2^-8 relative each); the kernel may also keep P in bf16
        // for the second matmul, which moves o by up to 2^-8 of Σ p·|v|.
        double tol = 0x1p-7 * Math.abs(hostO[i]) + 0x1p-7 * mag[i] + 1e-6;
        if (!(Math.abs(gotO[i] - hostO[i]) <= tol) && bad++ == 0) {
          first = "o[" + i + "] = " + gotO[i] + ", host " + hostO[i] + " ± " + tol;
        }
      }
      for (int i = 0; i < gotLse.length; i++) {
        double tol = 1e-3 * Math.abs(hostLse[i]) + 1e-3;
        if (!(Math.abs(gotLse[i] - hostLse[i]) <= tol) && bad++ == 0) {
          first = "lse[" + i + "] = " + gotLse[i] + ", host " + hostLse[i] + " ± " + tol;
        }
      }
      assertEquals(0, bad, what + ": " + bad + " elements differ from the host op, first " + first);
      // Again, without lse and with the raw handle on a stream: the same bits.
      Gpu.poison(o);
      run(dq, dk, dv, o, null, causal, stream, true);
      float[] again = Gpu.download(o);
      for (int i = 0; i < again.length; i++) {
        if (Float.floatToRawIntBits(again[i]) != Float.floatToRawIntBits(gotO[i])) {
          fail(what + ": a second launch (no lse) gave o[" + i + "] = " + again[i] + " after " + gotO[i]);
        }
      }
    }
  }

  private static void run(DeviceTensor q, DeviceTensor k, DeviceTensor v, DeviceTensor o, DeviceTensor lse,
                          boolean causal, cudaStream_t stream, boolean rawHandle) {
    try {
      if (stream == null) {
        Communicator.attention(q, k, v, o, lse, causal, 0f);
      } else {
        if (rawHandle) {
          Communicator.attention(q, k, v, o, lse, causal, 0f, rawHandle(stream));
        } else {
          Communicator.attention(q, k, v, o, lse, causal, 0f, stream);
        }
        JCuda.cudaStreamSynchronize(stream);
      }
    } catch (BackendUnavailableException e) {
      // A build without the kernel says so; nothing else may be unavailable on a GPU host.
      Assumptions.assumeFalse(e.getMessage().contains("the attention kernel is not in this build"),
          "SKIPPED: " + e.getMessage());
      throw e;
    }
  }

  /** The {@code cudaStream_t} a JCuda stream holds, as PyTorch or cuDF would hand it over. */
  private static long rawHandle(NativePointerObject o) {
    try {
      Method m = NativePointerObject.class.getDeclaredMethod("getNativePointer");
      m.setAccessible(true);
      return (long) m.invoke(o);
    } catch (ReflectiveOperationException e) {
      throw new IllegalStateException("JCuda's stream handle", e);
    }
  }

  private static float[] random(Random rnd, int n) {
    float[] x = new float[n];
    for (int i = 0; i < n; i++) {
      x[i] = Bf16.round((float) rnd.nextGaussian());
    }
    return x;
  }
}
