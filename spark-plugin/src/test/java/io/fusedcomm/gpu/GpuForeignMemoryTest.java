package io.fusedcomm.gpu;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.fusedcomm.api.Bf16;
import io.fusedcomm.api.CommOptions;
import io.fusedcomm.api.Communicator;
import io.fusedcomm.api.DType;
import io.fusedcomm.api.DeviceTensor;
import io.fusedcomm.api.InternalAccess;
import io.fusedcomm.api.PartialPrecision;
import io.fusedcomm.api.WeightLayout;
import io.fusedcomm.runtime.ExecutorRuntime;
import io.fusedcomm.testing.InJvmExchange;
import java.lang.reflect.Method;
import java.util.Random;
import java.util.concurrent.atomic.AtomicInteger;
import jcuda.NativePointerObject;
import jcuda.Pointer;
import jcuda.runtime.JCuda;
import jcuda.runtime.cudaError;
import jcuda.runtime.cudaStream_t;
import org.junit.jupiter.api.Test;

/**
 * Anyone's GPU memory and streams, as cuDF, RMM or PyTorch hand them over: raw device addresses
 * and raw {@code cudaStream_t} handles, not JCuda objects. Memory from the runtime's own
 * allocator is wrapped by address (with its owner handed over), ops run on CUDA's per-thread
 * default stream and on a stream passed by its raw handle, and every element is checked; what
 * wrap refuses (page-locked host memory, a shape past the allocation) and a stream of another
 * GPU are refused with the reason. One rank on GPU 0; skipped, with the reason printed, where no
 * GPU is visible.
 */
class GpuForeignMemoryTest {
  /** CUDA's {@code cudaStreamPerThread} handle: a real stream on every thread, made by nobody. */
  private static final long PER_THREAD_STREAM = 0x2;

  /** The raw handle inside a JCuda object, as a foreign library would hold it. */
  private static long rawHandle(NativePointerObject o) throws ReflectiveOperationException {
    Method m = NativePointerObject.class.getDeclaredMethod("getNativePointer");
    m.setAccessible(true);
    return (long) m.invoke(o);
  }

  @Test
  void rawAddressesAndRawStreamsRunOpsWithCheckedResults() throws Exception {
    Gpu.require();
    final int m = 96;
    final int n = 64;
    final int k = 128;
    Random rnd = new Random(7);
    float[] a = new float[m * k];
    float[] w = new float[n * k];
    for (int i = 0; i < a.length; i++) {
      a[i] = Bf16.round((float) rnd.nextGaussian());
    }
    for (int i = 0; i < w.length; i++) {
      w[i] = Bf16.round((float) rnd.nextGaussian());
    }
    try (ExecutorRuntime rt = Gpu.cudaRuntime();
         Communicator comm = InternalAccess.bootstrap(rt, InJvmExchange.group(1, 43L, 30_000).get(0),
             CommOptions.defaults())) {
      AtomicInteger released = new AtomicInteger();
      // Memory of the runtime's own allocator, handed over by address with its owner, as a cuDF
      // column would be: the wrapper closes the allocation when it is released.
      DeviceTensor aMem = DeviceTensor.allocate(DType.BF16, m, k);
      DeviceTensor wMem = DeviceTensor.allocate(DType.BF16, n, k);
      DeviceTensor cMem = DeviceTensor.allocate(DType.BF16, m, n);
      Gpu.put(aMem, a);
      Gpu.put(wMem, w);
      Gpu.poison(cMem);
      try (DeviceTensor ta = DeviceTensor.wrap(aMem.devicePointer(), DType.BF16, new long[] {m, k},
               () -> { aMem.close(); released.incrementAndGet(); });
           DeviceTensor tw = DeviceTensor.wrap(wMem.devicePointer(), DType.BF16, new long[] {n, k}, wMem);
           DeviceTensor tc = DeviceTensor.wrap(cMem.devicePointer(), DType.BF16, m, n);
           DeviceTensor copy = DeviceTensor.allocate(DType.BF16, m, k)) {
        assertEquals(aMem.devicePointer(), ta.devicePointer(), "no copy: the same device address");
        assertEquals(0, ta.device());
        // CUDA's per-thread default stream, by its raw handle.
        comm.gemmAllReduce(ta, tw, tc, WeightLayout.NK, PartialPrecision.F32, PER_THREAD_STREAM);
        comm.allReduce(ta, copy, PER_THREAD_STREAM);
        comm.synchronize();
        checkGemm(Gpu.download(tc), a, w, m, n, k);
        float[] copied = Gpu.download(copy);
        for (int i = 0; i < a.length; i++) {
          assertEquals(Float.floatToRawIntBits(a[i]), Float.floatToRawIntBits(copied[i]), "world 1 allReduce copies");
        }
        // A stream someone else created, passed by its raw handle.
        cudaStream_t stream = new cudaStream_t();
        JCuda.setExceptionsEnabled(true);
        JCuda.cudaStreamCreate(stream);
        try {
          Gpu.poison(tc);
          comm.gemmAllReduce(ta, tw, tc, WeightLayout.NK, PartialPrecision.F32, rawHandle(stream));
          ta.close();  // releases after the op queued on the stream is done
          assertEquals(cudaError.cudaSuccess, JCuda.cudaStreamQuery(stream), "released with work still queued");
          assertEquals(1, released.get(), "the owner was closed once");
          checkGemm(Gpu.download(tc), a, w, m, n, k);
        } finally {
          JCuda.cudaStreamDestroy(stream);
        }
        // What wrap refuses.
        IllegalArgumentException past = assertThrows(IllegalArgumentException.class,
            () -> DeviceTensor.wrap(tw.devicePointer(), DType.BF16, n, k + 8));
        assertTrue(past.getMessage().contains("bytes from there, but the tensor needs"), past.getMessage());
        DeviceTensor.wrap(tw.devicePointer() + 2L * k, DType.BF16, n - 1, k).close();  // a row in: fits
        Pointer pinned = new Pointer();
        JCuda.cudaMallocHost(pinned, 4096);
        try {
          IllegalArgumentException host = assertThrows(IllegalArgumentException.class,
              () -> DeviceTensor.fromJCuda(pinned, DType.F32, 16));
          assertTrue(host.getMessage().contains("page-locked host memory"), host.getMessage());
        } finally {
          JCuda.cudaFreeHost(pinned);
        }
        otherGpusStreamIsRefused(comm, tc);
      }
      assertTrue(aMem.isClosed() && wMem.isClosed(), "the owners handed over were closed");
      cMem.close();
    }
  }

  private static void otherGpusStreamIsRefused(Communicator comm, DeviceTensor t) throws Exception {
    int[] count = new int[1];
    JCuda.cudaGetDeviceCount(count);
    if (count[0] < 2) {
      System.out.println("one GPU visible: the stream-of-another-GPU check needs two");
      return;
    }
    cudaStream_t other = new cudaStream_t();
    JCuda.cudaSetDevice(1);
    JCuda.cudaStreamCreate(other);
    JCuda.cudaSetDevice(0);
    try {
      long handle = rawHandle(other);
      IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> comm.allReduce(t, t, handle));
      assertTrue(e.getMessage().contains("belongs to GPU 1, but this communicator runs on GPU 0"), e.getMessage());
    } finally {
      JCuda.cudaStreamDestroy(other);
    }
  }

  /** Every element of c against an fp64 reference of the bf16 inputs (c = a · wᵀ). */
  private static void checkGemm(float[] c, float[] a, float[] w, int m, int n, int k) {
    int bad = 0;
    String first = null;
    for (int i = 0; i < m; i++) {
      for (int j = 0; j < n; j++) {
        double ref = 0;
        double mag = 0;
        for (int p = 0; p < k; p++) {
          ref += (double) a[i * k + p] * w[j * k + p];
          mag += Math.abs((double) a[i * k + p] * w[j * k + p]);
        }
        double tol = Math.abs(ref) * 0x1p-8 + mag * 1e-6 * Math.sqrt(k) + 1e-6;
        if (!(Math.abs(c[i * n + j] - ref) <= tol) && bad++ == 0) {
          first = "C[" + i + "," + j + "] = " + c[i * n + j] + ", expected " + ref + " ± " + tol;
        }
      }
    }
    assertEquals(0, bad, bad + " bad elements, first " + first);
  }
}
