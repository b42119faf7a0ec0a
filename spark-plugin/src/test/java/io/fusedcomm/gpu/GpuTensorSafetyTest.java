package io.fusedcomm.gpu;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.fusedcomm.api.CommOptions;
import io.fusedcomm.api.Communicator;
import io.fusedcomm.api.DType;
import io.fusedcomm.api.DeviceTensor;
import io.fusedcomm.config.FusedCommConf;
import io.fusedcomm.runtime.ExecutorRuntime;
import io.fusedcomm.testing.InJvmExchange;
import java.util.HashMap;
import java.util.Map;
import java.util.Optional;
import jcuda.runtime.JCuda;
import jcuda.runtime.cudaError;
import jcuda.runtime.cudaStream_t;
import org.junit.jupiter.api.Test;

/**
 * The device side of the memory-safety rules (io.fusedcomm.api.MemorySafetyTest has the host
 * side, which shares the tensors' use counting): a DeviceTensor closed while ops enqueued on a
 * CUDA stream still use it waits for them before the memory is freed, and a closed device tensor
 * is refused by ops. One rank on the executor's GPU; skipped, with the reason printed, where no
 * GPU is visible.
 */
class GpuTensorSafetyTest {
  private static ExecutorRuntime cudaRuntime() {
    Map<String, String> conf = new HashMap<>(Map.of("spark.fusedcomm.backend", "cuda",
        "spark.fusedcomm.timeout", "30s"));
    String lib = System.getProperty("fusedcomm.test.nativeLibraryPath", "");
    if (!lib.isEmpty()) {
      conf.put("spark.fusedcomm.native.libraryPath", lib);
    }
    return ExecutorRuntime.create(FusedCommConf.fromMap(conf), "0", Optional.of("0"), 1L);
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
    try (ExecutorRuntime rt = cudaRuntime();
         Communicator comm = Communicator.bootstrap(rt, InJvmExchange.group(1, 41L, 30_000).get(0),
             CommOptions.defaults())) {
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
    try (ExecutorRuntime rt = cudaRuntime();
         Communicator comm = Communicator.bootstrap(rt, InJvmExchange.group(1, 42L, 30_000).get(0),
             CommOptions.defaults());
         DeviceTensor t = DeviceTensor.allocate(DType.BF16, 1024)) {
      DeviceTensor closed = DeviceTensor.allocate(DType.BF16, 1024);
      closed.close();
      IllegalStateException e = assertThrows(IllegalStateException.class, () -> comm.allReduce(t, closed));
      assertTrue(e.getMessage().contains("DeviceTensor[bf16 [1024]] is closed"), e.getMessage());
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
}
