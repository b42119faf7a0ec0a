package io.fusedcomm.plugin;

import static org.junit.jupiter.api.Assertions.assertDoesNotThrow;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.fusedcomm.api.Backend;
import io.fusedcomm.errors.BackendUnavailableException;
import io.fusedcomm.errors.CommunicatorException;
import java.security.SecureRandom;
import java.util.HashSet;
import java.util.Map;
import java.util.Optional;
import java.util.Set;
import org.apache.spark.resource.ResourceInformation;
import org.junit.jupiter.api.Test;

class GpuAssignmentTest {

  private static Map<String, ResourceInformation> gpus(String name, String... addresses) {
    return Map.of(name, new ResourceInformation(name, addresses));
  }

  @Test
  void oneGpu() {
    GpuAssignment a = GpuAssignment.fromResources(gpus("gpu", "3"), "gpu");
    assertEquals(Optional.of("3"), a.address());
    assertEquals("gpu", a.resourceName());
    for (Backend b : Backend.values()) {
      assertDoesNotThrow(() -> a.checkBackend(b));
    }
  }

  @Test
  void customResourceName() {
    Map<String, ResourceInformation> res = gpus("nvidia.com/gpu", "1");
    assertEquals(Optional.of("1"), GpuAssignment.fromResources(res, "nvidia.com/gpu").address());
    assertEquals(Optional.empty(), GpuAssignment.fromResources(res, "gpu").address());
  }

  @Test
  void noGpuIsFineForHostAndAuto() {
    for (Map<String, ResourceInformation> res :
        java.util.List.of(Map.<String, ResourceInformation>of(), gpus("gpu"))) {
      GpuAssignment a = GpuAssignment.fromResources(res, "gpu");
      assertEquals(Optional.empty(), a.address());
      assertDoesNotThrow(() -> a.checkBackend(Backend.HOST));
      assertDoesNotThrow(() -> a.checkBackend(Backend.AUTO));
    }
    assertEquals(Optional.empty(), GpuAssignment.fromResources(null, "gpu").address());
  }

  @Test
  void cudaWithoutGpuSaysHowToGetOne() {
    GpuAssignment a = GpuAssignment.fromResources(Map.of(), "gpu");
    BackendUnavailableException e =
        assertThrows(BackendUnavailableException.class, () -> a.checkBackend(Backend.CUDA));
    assertEquals("cuda", e.backend());
    String m = e.getMessage();
    assertTrue(m.contains("spark.executor.resource.gpu.amount=1"), m);
    assertTrue(m.contains("discoveryScript"), m);
    assertTrue(m.contains("gpu-discovery.sh"), m);
    assertTrue(m.contains("spark.fusedcomm.backend=host"), m);
    assertTrue(e instanceof CommunicatorException);
  }

  @Test
  void twoGpusRefused() {
    IllegalStateException e =
        assertThrows(
            IllegalStateException.class,
            () -> GpuAssignment.fromResources(gpus("gpu", "0", "1"), "gpu"));
    assertTrue(e.getMessage().contains("exactly one GPU per executor"), e.getMessage());
    assertTrue(e.getMessage().contains("[0, 1]"), e.getMessage());
    assertTrue(e.getMessage().contains("spark.executor.resource.gpu.amount=1"), e.getMessage());
  }

  @Test
  void jobTokenFromDriver() {
    assertEquals(
        -42L, FusedCommExecutorPlugin.jobToken(Map.of(FusedCommDriverPlugin.JOB_TOKEN_KEY, "-42")));
    IllegalStateException missing =
        assertThrows(IllegalStateException.class, () -> FusedCommExecutorPlugin.jobToken(Map.of()));
    assertTrue(missing.getMessage().contains("spark.plugins=io.fusedcomm.FusedCommPlugin"));
    assertThrows(
        IllegalStateException.class,
        () -> FusedCommExecutorPlugin.jobToken(Map.of(FusedCommDriverPlugin.JOB_TOKEN_KEY, "x")));
  }

  @Test
  void jobTokensAreRandomAndNonZero() {
    SecureRandom random = new SecureRandom();
    Set<Long> seen = new HashSet<>();
    for (int i = 0; i < 100; i++) {
      long t = FusedCommDriverPlugin.newJobToken(random);
      assertNotEquals(0L, t);
      seen.add(t);
    }
    assertEquals(100, seen.size());
  }
}
