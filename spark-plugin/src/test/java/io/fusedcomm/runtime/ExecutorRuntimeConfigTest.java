package io.fusedcomm.runtime;

import static org.junit.jupiter.api.Assertions.assertTrue;

import io.fusedcomm.testing.HostWorld;
import java.util.Map;
import org.junit.jupiter.api.Test;

/**
 * The transport settings reach the native runtime: its description (the executor's start-up log
 * line) reports what the native side was created with, so a value lost or misplaced in the JNI
 * call shows here.
 */
class ExecutorRuntimeConfigTest {

  @Test
  void transportSettingsReachTheNativeRuntime() {
    try (HostWorld w =
        new HostWorld(
            1,
            Map.of(
                "spark.fusedcomm.transport.streams", "3",
                "spark.fusedcomm.transport.busyPoll", "250us"),
            10_000)) {
      String d = w.runtime(0).toString();
      assertTrue(d.contains("backend=host"), d);
      assertTrue(d.contains("streams=3 busyPoll=250us"), d);
    }
    try (HostWorld w = new HostWorld(1, Map.of("spark.fusedcomm.transport.busyPoll", "0"), 10_000)) {
      String d = w.runtime(0).toString();
      assertTrue(d.contains("streams=2 busyPoll=0us"), d);
    }
  }
}
