package io.fusedcomm.spark;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.fusedcomm.testing.SparkCluster;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.concurrent.CopyOnWriteArrayList;
import org.apache.logging.log4j.Level;
import org.apache.logging.log4j.LogManager;
import org.apache.logging.log4j.core.LogEvent;
import org.apache.logging.log4j.core.LoggerContext;
import org.apache.logging.log4j.core.appender.AbstractAppender;
import org.apache.logging.log4j.core.config.Property;
import org.junit.jupiter.api.Assumptions;
import org.junit.jupiter.api.Test;

/**
 * A real local-cluster application asking for the cuda backend on a host without GPUs: every
 * executor's plugin refuses to start with the actionable sentence, Spark (4.x) carries that
 * sentence to the driver's log (where users look), and no executor runs without its GPU.
 */
class CudaWithoutGpuClusterTest {
  @Test
  void theDriverLogSaysWhyExecutorsCannotStart() throws InterruptedException {
    List<String> errors = new CopyOnWriteArrayList<>();
    AbstractAppender capture =
        new AbstractAppender("capture-driver-errors", null, null, true, Property.EMPTY_ARRAY) {
          @Override
          public void append(LogEvent event) {
            errors.add(event.getMessage().getFormattedMessage());
          }
        };
    capture.start();
    LoggerContext logs = (LoggerContext) LogManager.getContext(false);
    logs.getConfiguration().getRootLogger().addAppender(capture, Level.ERROR, null);
    logs.updateLoggers();
    try (SparkCluster cluster =
        SparkCluster.start("cuda-without-gpu", 1, Map.of("spark.fusedcomm.backend", "cuda"), false)) {
      String version = cluster.context().version();
      if (version.startsWith("3.")) {
        System.out.println("SKIPPED on Spark " + version + ": it does not report why an executor failed to"
            + " start to the driver (the reason is in the executor's stderr)");
      }
      Assumptions.assumeFalse(version.startsWith("3."), "Spark " + version + " keeps the reason in executor logs");
      Optional<String> reason = Optional.empty();
      long deadline = System.nanoTime() + 90_000_000_000L;
      while (reason.isEmpty() && System.nanoTime() < deadline) {
        Thread.sleep(200);
        reason = errors.stream().filter(m -> m.contains("backend 'cuda' is unavailable")).findFirst();
      }
      assertTrue(reason.isPresent(), "the driver never logged why executors fail: " + errors);
      System.out.println("driver log: " + reason.get());
      assertTrue(reason.get().contains("spark.fusedcomm.backend=cuda"), reason.get());
      assertTrue(reason.get().contains("spark.executor.resource.gpu.amount=1"), reason.get());
      // No executor stays up without its GPU. One registers briefly before its plugin refuses
      // to start (and the worker relaunches it), so wait until only the driver is known.
      long until = System.nanoTime() + 30_000_000_000L;
      int known = cluster.context().sc().statusTracker().getExecutorInfos().length;
      while (known != 1 && System.nanoTime() < until) {
        Thread.sleep(100);
        known = cluster.context().sc().statusTracker().getExecutorInfos().length;
      }
      assertEquals(1, known, "an executor without its GPU stayed registered");
    } finally {
      logs.getConfiguration().getRootLogger().removeAppender("capture-driver-errors");
      logs.updateLoggers();
      capture.stop();
    }
  }
}
