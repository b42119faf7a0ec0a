package io.fusedcomm.errors;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.Optional;
import java.util.OptionalInt;
import java.util.OptionalLong;
import org.junit.jupiter.api.Test;

class CommunicatorExceptionTest {

  @Test
  void contextIsAppendedToTheMessage() {
    CommTimeoutException e =
        new CommTimeoutException("peer did not arrive within 60s", 1, 3, "allGatherGemm", 7, null);
    assertEquals(
        "peer did not arrive within 60s (rank 1, peer 3, op allGatherGemm, step 7)",
        e.getMessage());
    assertEquals("peer did not arrive within 60s", e.detail());
    assertEquals(OptionalInt.of(1), e.rank());
    assertEquals(OptionalInt.of(3), e.peer());
    assertEquals(Optional.of("allGatherGemm"), e.op());
    assertEquals(OptionalLong.of(7), e.step());
  }

  @Test
  void unknownFieldsAreLeftOut() {
    TransportException e =
        new TransportException("connection reset", 2, CommunicatorException.UNKNOWN, null, -1, null);
    assertEquals("connection reset (rank 2)", e.getMessage());
    assertEquals(OptionalInt.empty(), e.peer());
    assertEquals(Optional.empty(), e.op());
    assertEquals(OptionalLong.empty(), e.step());
    assertEquals("plain", new FatalGpuException("plain").getMessage());
    assertEquals(
        "op only (op allReduce)",
        new CommunicatorException("op only", -1, -1, "allReduce", -1, null).getMessage());
  }

  @Test
  void familyIsUnchecked() {
    RuntimeException cause = new IllegalStateException("x");
    CommunicatorException[] family = {
      new CommTimeoutException("t", cause),
      new TransportException("t", cause),
      new FatalGpuException("t", cause),
      new BackendUnavailableException("t")
    };
    for (CommunicatorException e : family) {
      assertTrue(e instanceof RuntimeException);
    }
    assertSame(cause, family[0].getCause());
  }

  @Test
  void backendUnavailableNamesBackend() {
    BackendUnavailableException e =
        new BackendUnavailableException("cuda", "libcuda.so.1 could not be opened", null);
    assertEquals("backend 'cuda' is unavailable: libcuda.so.1 could not be opened", e.getMessage());
    assertEquals("cuda", e.backend());
  }

  @Test
  void configExceptionIsAnIllegalArgument() {
    ConfigException e = ConfigException.invalidValue("spark.fusedcomm.timeout", "x", "a duration");
    assertTrue(e instanceof IllegalArgumentException);
    assertEquals("Invalid value 'x' for spark.fusedcomm.timeout: expected a duration.", e.getMessage());
  }
}
