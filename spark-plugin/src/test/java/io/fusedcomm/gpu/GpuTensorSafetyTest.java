package io.fusedcomm.gpu;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.fusedcomm.api.CommOptions;
import io.fusedcomm.api.Communicator;
import io.fusedcomm.api.DType;
import io.fusedcomm.api.DeviceTensor;
import io.fusedcomm.api.HostTensor;
import io.fusedcomm.api.InternalAccess;
import io.fusedcomm.api.WeightLayout;
import io.fusedcomm.runtime.ExecutorRuntime;
import io.fusedcomm.testing.InJvmExchange;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicReference;
import jcuda.runtime.JCuda;
import jcuda.runtime.cudaError;
import jcuda.runtime.cudaStream_t;
import org.junit.jupiter.api.Test;

/**
 * The device side of the memory-safety rules (io.fusedcomm.api.MemorySafetyTest has the host
 * side, which shares the tensors' use counting): a DeviceTensor closed while ops enqueued on a
 * CUDA stream still use it waits for them before the memory is freed, and a closed device tensor
 * is refused by ops; a tensor closed by another thread while a synchronous op runs on it ends
 * that thread's next op with a clear exception, and a second thread entering an op is refused.
 * One rank on the executor's GPU; skipped, with the reason printed, where no GPU is visible.
 */
class GpuTensorSafetyTest {
  /** A communicator of one rank on the runtime's GPU; {@code id} keeps tests' groups apart. */
  private static Communicator worldOfOne(ExecutorRuntime rt, long id) {
    return InternalAccess.bootstrap(rt, InJvmExchange.group(1, id, 30_000).get(0), CommOptions.defaults());
  }

  private static long freeDeviceBytes() {
    long[] free = new long[1];
    long[] total = new long[1];
    JCuda.cudaMemGetInfo(free, total);
    return free[0];
  }

  @Test
  void closeWithWorkQueuedOnAStreamWaitsForItBeforeFreeing() {
    Gpu.require();
    final long n = 32L << 20;  // 64 MiB of bf16 per tensor: each allReduce takes a while
    try (ExecutorRuntime rt = Gpu.cudaRuntime();
         Communicator comm = worldOfOne(rt, 41L)) {
      cudaStream_t stream = new cudaStream_t();
      JCuda.setExceptionsEnabled(true);
      JCuda.cudaStreamCreate(stream);
      try {
        DeviceTensor in = DeviceTensor.allocate(DType.BF16, n);
        DeviceTensor out = DeviceTensor.allocate(DType.BF16, n);
        Gpu.put(in, new float[(int) n]);
        long freeWhileAllocated = freeDeviceBytes();
        for (int i = 0; i < 50; i++) {
          comm.allReduce(in, out, stream);  // returns once enqueued
        }
        in.close();  // waits for the 50 queued allReduces, then frees
        assertEquals(cudaError.cudaSuccess, JCuda.cudaStreamQuery(stream),
            "close returned with work still queued on the tensor");
        out.close();
        assertTrue(freeDeviceBytes() >= freeWhileAllocated + 2 * 2 * n - (64L << 20),
            "both tensors' memory was freed");
        IllegalStateException e =
            assertThrows(IllegalStateException.class, () -> comm.allReduce(in, out, stream));
        assertTrue(e.getMessage().contains("is closed"), e.getMessage());
        assertThrows(IllegalStateException.class, in::pointer);
        comm.synchronize();  // no error was left behind
      } finally {
        JCuda.cudaStreamDestroy(stream);
      }
    }
  }

  @Test
  void aClosedDeviceTensorIsRefusedAndTheCommunicatorStaysUsable() {
    Gpu.require();
    try (ExecutorRuntime rt = Gpu.cudaRuntime();
         Communicator comm = worldOfOne(rt, 42L);
         DeviceTensor t = DeviceTensor.allocate(DType.BF16, 1024)) {
      DeviceTensor closed = DeviceTensor.allocate(DType.BF16, 1024);
      closed.close();
      IllegalStateException e = assertThrows(IllegalStateException.class, () -> comm.allReduce(t, closed));
      assertTrue(e.getMessage().contains("DeviceTensor[bf16 [1024], GPU 0] is closed"), e.getMessage());
      IllegalArgumentException huge =
          assertThrows(IllegalArgumentException.class, () -> DeviceTensor.allocate(DType.F32, 1L << 62));
      assertTrue(huge.getMessage().contains("more than a tensor can hold"), huge.getMessage());
      float[] ones = new float[1024];
      java.util.Arrays.fill(ones, 1f);
      Gpu.put(t, ones);
      comm.allReduce(t, t);
      assertEquals(1f, Gpu.download(t)[1023], "world 1: the sum is the input");
    }
  }

  // A synchronous GEMM-sized op (about a millisecond on one GPU): long enough that another
  // thread's close or op lands while it runs. A = 1, W = 1/8, so every element of C is K / 8.
  private static final int M = 4096;
  private static final int K = 8192;
  private static final int N = 4096;

  private static DeviceTensor filled(float value, long... shape) {
    DeviceTensor d = DeviceTensor.allocate(DType.BF16, shape);
    try (HostTensor h = HostTensor.allocate(DType.BF16, shape)) {
      h.fill(value);
      d.copyFrom(h);
    }
    return d;
  }

  private static void assertProduct(DeviceTensor c) {
    float[] v = Gpu.download(c);
    for (int i = 0; i < v.length; i++) {
      if (v[i] != K / 8f) {
        throw new AssertionError("C[" + i + "] = " + v[i] + ", expected " + K / 8f);
      }
    }
  }

  @Test
  void closeOnAnotherThreadWhileAnOpRunsEndsTheNextOpClearlyAndFreesTheMemory() throws Exception {
    Gpu.require();
    ExecutorService opThread = Executors.newSingleThreadExecutor(r -> new Thread(r, "gemm-thread"));
    try (ExecutorRuntime rt = Gpu.cudaRuntime();
         Communicator comm = worldOfOne(rt, 43L);
         DeviceTensor w = filled(0.125f, N, K);
         DeviceTensor c = DeviceTensor.allocate(DType.BF16, M, N)) {
      DeviceTensor a = filled(1f, M, K);
      CountDownLatch running = new CountDownLatch(1);
      AtomicInteger done = new AtomicInteger();
      Future<IllegalStateException> ops = opThread.submit(() -> {
        for (int i = 0; i < 100_000; i++) {
          try {
            comm.allGatherGemm(a, w, c, WeightLayout.NK);  // returns when done
          } catch (IllegalStateException e) {
            return e;
          }
          done.incrementAndGet();
          running.countDown();
        }
        return null;
      });
      assertTrue(running.await(60, TimeUnit.SECONDS), "the op thread never completed an op");
      long freeWithA = freeDeviceBytes();  // after the first op: its workspaces are allocated
      a.close();  // returns at once; an op that holds A frees it when it returns
      assertTrue(a.isClosed());
      IllegalStateException refused = ops.get(60, TimeUnit.SECONDS);
      assertTrue(refused != null && refused.getMessage().contains("DeviceTensor[bf16 [4096, 8192]] is closed"),
          String.valueOf(refused));
      assertTrue(done.get() >= 1);
      assertProduct(c);  // the op that ran across the close read live memory to the end
      long freed = freeDeviceBytes() - freeWithA;
      assertTrue(freed >= 2L * M * K - (16L << 20), "A's 64 MiB were freed, freed " + freed);
      try (DeviceTensor a2 = filled(1f, M, K)) {
        comm.allGatherGemm(a2, w, c, WeightLayout.NK);  // the communicator stays usable
        assertProduct(c);
      }
      comm.synchronize();
    } finally {
      opThread.shutdownNow();
    }
  }

  @Test
  void aSecondThreadEnteringAnOpWhileAGpuOpRunsIsRefused() throws Exception {
    Gpu.require();
    ExecutorService opThread = Executors.newSingleThreadExecutor(r -> new Thread(r, "first-op-thread"));
    try (ExecutorRuntime rt = Gpu.cudaRuntime();
         Communicator comm = worldOfOne(rt, 44L);
         DeviceTensor a = filled(1f, M, K);
         DeviceTensor w = filled(0.125f, N, K);
         DeviceTensor c = DeviceTensor.allocate(DType.BF16, M, N);
         DeviceTensor x = filled(2f, 1024)) {
      CountDownLatch running = new CountDownLatch(1);
      CountDownLatch stop = new CountDownLatch(1);
      AtomicReference<IllegalStateException> firstRefused = new AtomicReference<>();
      Future<Integer> ops = opThread.submit(() -> {
        int n = 0;
        while (stop.getCount() > 0 && n < 100_000) {
          try {
            comm.allGatherGemm(a, w, c, WeightLayout.NK);
            n++;
          } catch (IllegalStateException e) {  // the main thread's op was in progress: refused too
            firstRefused.compareAndSet(null, e);
          }
          running.countDown();
        }
        return n;
      });
      assertTrue(running.await(60, TimeUnit.SECONDS), "the op thread never completed an op");
      IllegalStateException refused = null;
      for (int attempt = 0; attempt < 1000 && refused == null; attempt++) {
        try {
          comm.allReduce(x, x);  // between two of the other thread's ops this one may run
        } catch (IllegalStateException e) {
          refused = e;
        }
      }
      stop.countDown();
      int completed = ops.get(60, TimeUnit.SECONDS);
      assertTrue(refused != null, "1,000 ops entered while another thread ran GEMM-sized ops");
      String m = refused.getMessage();
      assertTrue(m.contains("Communicator[rank 0 of 1, cuda]: allReduce was called on thread '")
          && m.contains("while thread 'first-op-thread' is in allGatherGemm")
          && m.contains("must be called from one thread at a time"), m);
      if (firstRefused.get() != null) {
        assertTrue(firstRefused.get().getMessage().contains("must be called from one thread at a time"),
            firstRefused.get().getMessage());
      }
      assertTrue(completed >= 1);
      assertProduct(c);
      comm.allReduce(x, x);
      assertEquals(2f, Gpu.download(x)[1023], "world 1: the sum is the input");
      comm.synchronize();
    } finally {
      opThread.shutdownNow();
    }
  }
}
