package io.fusedcomm.api;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.fusedcomm.errors.BackendUnavailableException;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.jupiter.api.Test;

/**
 * The rules of device tensors that hold without a GPU: what {@code wrap} refuses before it asks
 * CUDA, that it asks CUDA (and says why not, on a host without a GPU), when an owner is closed,
 * and the GPU and stream checks of an op. The GPU side (memory and a stream from outside JCuda,
 * through ops) is io.fusedcomm.gpu.GpuForeignMemoryTest.
 */
class DeviceTensorWrapTest {
  @Test
  void wrapRefusesWhatItCanSeeBeforeAskingCuda() {
    IllegalArgumentException nul =
        assertThrows(IllegalArgumentException.class, () -> DeviceTensor.wrap(0L, DType.BF16, 4, 4));
    assertTrue(nul.getMessage().contains("cannot wrap the null address"), nul.getMessage());
    IllegalArgumentException dims =
        assertThrows(IllegalArgumentException.class, () -> DeviceTensor.wrap(0x1000L, DType.BF16, 4, -1));
    assertTrue(dims.getMessage().contains("-1"), dims.getMessage());
    assertThrows(IllegalArgumentException.class, () -> DeviceTensor.wrap(0x1000L, null, 4));
    assertThrows(IllegalArgumentException.class,
        () -> DeviceTensor.wrap(0x1000L, DType.F32, new long[] {1L << 62}, () -> {}));
  }

  @Test
  void withoutAGpuWrapAndAllocateSayWhy() {
    if (!noGpu()) {
      System.out.println("SKIPPED (a GPU is visible): io.fusedcomm.gpu.GpuForeignMemoryTest covers wrap there");
      return;
    }
    try (HostTensor host = HostTensor.allocate(DType.F32, 16)) {
      long address = host.acquire();
      try {
        BackendUnavailableException e = assertThrows(BackendUnavailableException.class,
            () -> DeviceTensor.wrap(address, DType.F32, 16));
        assertTrue(e.getMessage().contains("cudaPointerGetAttributes") && e.getMessage().contains("GPU"),
            e.getMessage());
      } finally {
        host.release();
      }
    }
    BackendUnavailableException e =
        assertThrows(BackendUnavailableException.class, () -> DeviceTensor.allocate(DType.BF16, 8));
    assertTrue(e.getMessage().contains("cudaMalloc of 16 bytes"), e.getMessage());
  }

  @Test
  void theOwnerIsClosedOnceWhenTheLastUseEnds() {
    AtomicInteger closes = new AtomicInteger();
    DeviceTensor t = new DeviceTensor(0x1000, 0, DType.BF16, new long[] {8}, false, closes::incrementAndGet);
    t.acquire();  // an op in flight on another thread
    t.close();
    assertEquals(0, closes.get(), "the owner outlives an op still using the memory");
    assertThrows(IllegalStateException.class, t::devicePointer);
    t.release();  // the op returns
    assertEquals(1, closes.get());
    t.close();
    assertEquals(1, closes.get(), "close is idempotent");

    DeviceTensor failing = new DeviceTensor(0x1000, 0, DType.BF16, new long[] {8}, false,
        () -> { throw new java.io.IOException("the buffer was already released"); });
    IllegalStateException e = assertThrows(IllegalStateException.class, failing::close);
    assertTrue(e.getCause().getMessage().contains("already released"), e.toString());
    assertTrue(failing.isClosed());
  }

  @Test
  void opsCheckTheTensorsGpuAndRefuseStreamsOnTheHostBackend() {
    DeviceTensor onGpu1 = new DeviceTensor(0x1000, 1, DType.BF16, new long[] {8}, false, null);
    IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
        () -> new OpCheck("allReduce", Backend.CUDA, 0).floating("in", onGpu1));
    assertEquals("allReduce: in is on GPU 1, but this communicator runs on GPU 0", e.getMessage());
    new OpCheck("allReduce", Backend.CUDA, 1).floating("in", onGpu1);  // its own GPU: fine
    assertTrue(onGpu1.toString().contains("GPU 1, borrowed"), onGpu1.toString());
    IllegalArgumentException stream = assertThrows(IllegalArgumentException.class,
        () -> new OpCheck("allReduce", Backend.HOST, -1).stream(0x10));
    assertTrue(stream.getMessage().contains("a CUDA stream was given"), stream.getMessage());
    new OpCheck("allReduce", Backend.HOST, -1).stream(0);  // 0: no stream
  }

  private static boolean noGpu() {
    return io.fusedcomm.runtime.NativeApi.availability().contains("cuda: unavailable: no usable NVIDIA GPU");
  }
}
