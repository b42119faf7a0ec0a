package io.fusedcomm.gpu;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.fail;

import io.fusedcomm.api.Bf16;
import io.fusedcomm.api.Communicator;
import io.fusedcomm.api.DType;
import io.fusedcomm.api.DeviceTensor;
import io.fusedcomm.api.HostTensor;
import io.fusedcomm.testing.Reference;
import java.lang.reflect.Method;
import java.util.Random;
import jcuda.NativePointerObject;
import jcuda.runtime.JCuda;
import jcuda.runtime.cudaStream_t;
import org.junit.jupiter.api.Test;

/**
 * The single-rank attention backward on the GPU ({@code Communicator.attentionBackward} with
 * device tensors) against the host backend's on the same bf16 inputs (q, k, v, dO and the host
 * forward's o and lse): head dims 64 and 128, causal and not, grouped-query ratios 1, 4 and 8
 * and multi-query, query and key lengths that are not multiples of a tile and differ from each
 * other; gradients poisoned first and every element of dQ, dK and dV compared; synchronous and
 * on a CUDA stream (JCuda and raw handle forms); the default (fastest) and the deterministic
 * setting, the latter bit for bit the same on a second launch, and dK, dV the same bits in both.
 */
class GpuAttentionBackwardTest {
  /** (B, Lq, Lk, Hq, Hkv, D). */
  private static final int[][] SHAPES = {
    {1, 128, 128, 4, 4, 64}, {2, 333, 333, 8, 2, 128}, {1, 200, 517, 8, 1, 64}, {4, 64, 64, 16, 2, 128},
    {1, 517, 200, 8, 1, 64}, {1, 1, 77, 8, 8, 128}, {1, 300, 300, 4, 4, 64},
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
    String what = "attentionBackward B=" + b + " Lq=" + lq + " Lk=" + lk + " Hq=" + hq + " Hkv=" + hkv + " D=" + d
        + (causal ? " causal" : "") + (stream != null ? " on a stream" : "");
    float[] q = random(rnd, b * lq * hq * d);
    float[] k = random(rnd, b * lk * hkv * d);
    float[] v = random(rnd, b * lk * hkv * d);
    float[] dO = random(rnd, b * lq * hq * d);
    float[] o;
    float[] lse;
    float[][] host;
    try (HostTensor hq4 = HostTensor.of(q, DType.BF16, b, lq, hq, d);
        HostTensor hk = HostTensor.of(k, DType.BF16, b, lk, hkv, d);
        HostTensor hv = HostTensor.of(v, DType.BF16, b, lk, hkv, d);
        HostTensor hdo = HostTensor.of(dO, DType.BF16, b, lq, hq, d);
        HostTensor ho = HostTensor.allocate(DType.BF16, b, lq, hq, d);
        HostTensor hl = HostTensor.allocate(DType.F32, b, hq, lq);
        HostTensor hdq = HostTensor.allocate(DType.BF16, b, lq, hq, d);
        HostTensor hdk = HostTensor.allocate(DType.BF16, b, lk, hkv, d);
        HostTensor hdv = HostTensor.allocate(DType.BF16, b, lk, hkv, d)) {
      Communicator.attention(hq4, hk, hv, ho, hl, causal, 0f);
      o = ho.toFloatArray();
      lse = hl.toFloatArray();
      Communicator.attentionBackward(hq4, hk, hv, ho, hl, hdo, hdq, hdk, hdv, causal, 0f);
      host = new float[][] {hdq.toFloatArray(), hdk.toFloatArray(), hdv.toFloatArray()};
    }
    // Magnitudes of each gradient element's terms, for its tolerance.
    Reference.AttentionGrads ref = Reference.attentionBackward(q, k, v, o, lse, dO, b, lq, lk, hq, hkv, d, causal, 0);
    double[][] mags = {ref.dq.magnitude, ref.dk.magnitude, ref.dv.magnitude};
    try (DeviceTensor gq = DeviceTensor.allocate(DType.BF16, b, lq, hq, d);
        DeviceTensor gk = DeviceTensor.allocate(DType.BF16, b, lk, hkv, d);
        DeviceTensor gv = DeviceTensor.allocate(DType.BF16, b, lk, hkv, d);
        DeviceTensor go = DeviceTensor.allocate(DType.BF16, b, lq, hq, d);
        DeviceTensor gl = DeviceTensor.allocate(DType.F32, b, hq, lq);
        DeviceTensor gdo = DeviceTensor.allocate(DType.BF16, b, lq, hq, d);
        DeviceTensor gdq = DeviceTensor.allocate(DType.BF16, b, lq, hq, d);
        DeviceTensor gdk = DeviceTensor.allocate(DType.BF16, b, lk, hkv, d);
        DeviceTensor gdv = DeviceTensor.allocate(DType.BF16, b, lk, hkv, d)) {
      Gpu.put(gq, q);
      Gpu.put(gk, k);
      Gpu.put(gv, v);
      Gpu.put(go, o);
      Gpu.put(gl, lse);
      Gpu.put(gdo, dO);
      DeviceTensor[] grads = {gdq, gdk, gdv};
      for (DeviceTensor g : grads) {
        Gpu.poison(g);
      }
      String[] names = {"dQ", "dK", "dV"};
      float[][] fast = null;
      float[][] det = null;
      // The default path, then the deterministic one twice (the second with the raw handle).
      for (int pass = 0; pass < 3; pass++) {
        boolean deterministic = pass > 0;
        String tag = what + (deterministic ? ", deterministic" : "");
        for (DeviceTensor g : grads) {
          Gpu.poison(g);
        }
        run(gq, gk, gv, go, gl, gdo, gdq, gdk, gdv, causal, stream, pass == 2, deterministic);
        float[][] got = new float[3][];
        int bad = 0;
        String first = null;
        for (int g = 0; g < 3; g++) {
          got[g] = Gpu.download(grads[g]);
          for (int i = 0; i < got[g].length; i++) {
            // Both round the gradient to bf16 once (2^-8 relative each); the kernel may also keep
            // P and dS in bf16 for its matmuls, which moves a gradient by up to 2^-8 of the sum of
            // its terms' magnitudes each.
            double tol = 0x1p-7 * Math.abs(host[g][i]) + 0x1p-6 * mags[g][i] + 1e-5;
            if (!(Math.abs(got[g][i] - host[g][i]) <= tol) && bad++ == 0) {
              first = names[g] + "[" + i + "] = " + got[g][i] + ", host " + host[g][i] + " ± " + tol;
            }
          }
        }
        assertEquals(0, bad, tag + ": " + bad + " elements differ from the host op, first " + first);
        if (pass == 0) {
          fast = got;
          continue;
        }
        // dK and dV have one owner on every path: the same bits; dQ too between deterministic runs.
        for (int g = pass == 1 ? 1 : 0; g < 3; g++) {
          float[] want = pass == 1 ? fast[g] : det[g];
          for (int i = 0; i < want.length; i++) {
            if (Float.floatToRawIntBits(got[g][i]) != Float.floatToRawIntBits(want[i])) {
              fail(tag + ": " + names[g] + "[" + i + "] = " + got[g][i] + ", an earlier launch gave " + want[i]);
            }
          }
        }
        det = got;
      }
    }
  }

  private static void run(DeviceTensor q, DeviceTensor k, DeviceTensor v, DeviceTensor o, DeviceTensor lse,
                          DeviceTensor dO, DeviceTensor dQ, DeviceTensor dK, DeviceTensor dV, boolean causal,
                          cudaStream_t stream, boolean rawHandle, boolean deterministic) {
    if (stream == null) {
      if (deterministic) {
        Communicator.attentionBackward(q, k, v, o, lse, dO, dQ, dK, dV, causal, 0f, true);
      } else {
        Communicator.attentionBackward(q, k, v, o, lse, dO, dQ, dK, dV, causal, 0f);
      }
    } else {
      if (rawHandle) {
        Communicator.attentionBackward(q, k, v, o, lse, dO, dQ, dK, dV, causal, 0f, deterministic,
            rawHandle(stream));
      } else if (deterministic) {
        Communicator.attentionBackward(q, k, v, o, lse, dO, dQ, dK, dV, causal, 0f, true, stream);
      } else {
        Communicator.attentionBackward(q, k, v, o, lse, dO, dQ, dK, dV, causal, 0f, stream);
      }
      JCuda.cudaStreamSynchronize(stream);
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
