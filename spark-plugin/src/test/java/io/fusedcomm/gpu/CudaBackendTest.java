package io.fusedcomm.gpu;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.fusedcomm.api.Backend;
import io.fusedcomm.config.FusedCommConf;
import io.fusedcomm.errors.BackendUnavailableException;
import io.fusedcomm.runtime.ExecutorRuntime;
import java.util.Map;
import java.util.Optional;
import org.junit.jupiter.api.Assumptions;
import org.junit.jupiter.api.Test;

/** The cuda backend's start-up: a clear refusal without a GPU, a pinned and self-tested GPU with one. */
class CudaBackendTest {
  private static FusedCommConf cuda() {
    return FusedCommConf.fromMap(Map.of("spark.fusedcomm.backend", "cuda"));
  }

  @Test
  void cudaWithoutAssignedGpuIsRefusedWithASentence() {
    BackendUnavailableException e =
        assertThrows(BackendUnavailableException.class, () -> ExecutorRuntime.create(cuda(), "0", Optional.empty(), 1L));
    assertTrue(e.getMessage().contains("no GPU assigned"), e.getMessage());
    assertTrue(e.getMessage().contains("spark.executor.resource.gpu.amount"), e.getMessage());
  }

  @Test
  void cudaOnAHostWithoutGpuIsRefusedWithTheProbeReason() {
    if (Gpu.present()) {
      System.out.println("SKIPPED (a GPU is present): this test checks the refusal on GPU-less hosts");
    }
    Assumptions.assumeFalse(Gpu.present(), "a GPU is present");
    BackendUnavailableException e =
        assertThrows(BackendUnavailableException.class, () -> ExecutorRuntime.create(cuda(), "0", Optional.of("0"), 1L));
    assertTrue(e.getMessage().contains("cuda backend is unavailable"), e.getMessage());
    assertTrue(e.getMessage().contains("backend=host"), e.getMessage());
  }

  @Test
  void autoFallsBackToHostWithoutAGpu() {
    FusedCommConf auto = FusedCommConf.fromMap(Map.of("spark.fusedcomm.backend", "auto"));
    try (ExecutorRuntime rt = ExecutorRuntime.create(auto, "0", Optional.empty(), 1L)) {
      assertEquals(Backend.HOST, rt.backend());
      assertEquals("", rt.gpuUuid());
    }
  }

  @Test
  void cudaOpensTheAssignedGpu() {
    Gpu.require();
    try (ExecutorRuntime rt = ExecutorRuntime.create(cuda(), "0", Optional.of("0"), 1L)) {
      assertEquals(Backend.CUDA, rt.backend());
      assertTrue(rt.gpuUuid().startsWith("GPU-"), rt.gpuUuid());
      System.out.println("cuda runtime opened: " + rt);
    }
  }
}
