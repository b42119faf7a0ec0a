package io.fusedcomm.api;

import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.fusedcomm.errors.CommunicatorException;
import io.fusedcomm.internal.bootstrap.BootstrapExchange;
import io.fusedcomm.runtime.ExecutorRuntime;
import io.fusedcomm.spark.BarrierStage;
import io.fusedcomm.testing.SparkCluster;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * A barrier task killed while its communicator connects, on a real {@code local-cluster[2,1,1024]}
 * (host backend, {@code spark.fusedcomm.connectTimeout=60s}): rank 1 takes part in the bootstrap
 * exchange and then, two seconds later, fails without connecting, so rank 0 waits in its connect
 * for a peer that never comes. Spark then kills rank 0's task; the kill must reach the native
 * connect wait (the task's watchdog, registered by {@code Communicator.create} before the connect
 * phase, aborts it), so rank 0 fails with a CommunicatorException saying it was aborted, well
 * under the connect timeout, instead of holding its executor for the whole minute. In package
 * {@code api} to build rank 1's exchange on the task's own {@link BarrierContextExchange}.
 */
class ConnectKillTest {
  private static final long CONNECT_TIMEOUT_MS = 60_000;
  private static SparkCluster cluster;

  @BeforeAll
  static void start() {
    cluster = SparkCluster.start("ConnectKillTest", 2,
        Map.of("spark.fusedcomm.connectTimeout", CONNECT_TIMEOUT_MS + "ms"));
  }

  @AfterAll
  static void stop() {
    if (cluster != null) {
      cluster.close();
    }
  }

  /**
   * Rank 1's exchange: the task's own (so the communicator id is the one rank 0 derives and its
   * checks of the gathered blobs pass), except that two seconds after the allGather it throws,
   * before any connect.
   */
  private static final class LeavesBeforeConnect implements BootstrapExchange {
    private final BarrierContextExchange task;

    LeavesBeforeConnect(BarrierContextExchange task) {
      this.task = task;
    }

    @Override
    public int rank() {
      return task.rank();
    }

    @Override
    public int world() {
      return task.world();
    }

    @Override
    public long commNonce() {
      return task.commNonce();
    }

    @Override
    public String[] allGather(String mine) {
      task.allGather(mine);
      try {
        Thread.sleep(2_000);  // rank 0 is inside its connect wait by now
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
      }
      throw new IllegalStateException("injected: rank 1 leaves between the bootstrap exchange and its connect");
    }
  }

  private static void record(String dir, String name, String text) {
    try {
      Files.writeString(Path.of(dir, name), text, StandardCharsets.UTF_8);
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
  }

  @Test
  void taskKilledWhileConnectingStopsWellBeforeTheConnectTimeout(@TempDir Path dir) throws Exception {
    String d = dir.toString();
    long started = System.nanoTime();
    Exception job = assertThrows(Exception.class, () -> BarrierStage.mapPartitions(
        cluster.context().parallelize(List.of(0, 1), 2), (context, rows) -> {
          CommOptions options = CommOptions.defaults();
          long start = System.nanoTime();
          try {
            if (context.partitionId() == 1) {
              ExecutorRuntime runtime = ExecutorRuntime.current().orElseThrow();
              BarrierContextExchange task = new BarrierContextExchange(context, options.name());
              CommBootstrap.bootstrap(runtime, new LeavesBeforeConnect(task), options).close();
            } else {
              Communicator.create(context, options).close();
            }
            record(d, "rank" + context.partitionId(), "no error");
          } catch (RuntimeException e) {
            record(d, "rank" + context.partitionId(),
                e.getClass().getName() + "|" + (System.nanoTime() - start) / 1_000_000 + "|" + e.getMessage());
            throw e;
          }
          return List.of(context.partitionId()).iterator();
        }).collect());
    System.out.println("job: " + job);

    // Rank 0's task ends after the job has failed; wait for its record (bounded by the timeout).
    Path rank0 = dir.resolve("rank0");
    long deadline = System.nanoTime() + (CONNECT_TIMEOUT_MS + 30_000) * 1_000_000;
    while (!Files.exists(rank0) && System.nanoTime() < deadline) {
      Thread.sleep(100);
    }
    assertTrue(Files.exists(rank0), "rank 0 recorded nothing");
    Thread.sleep(100);  // the record is written in one call; let it finish
    String record = Files.readString(rank0, StandardCharsets.UTF_8);
    System.out.println("rank 0: " + record + " (" + (System.nanoTime() - started) / 1_000_000 + " ms after submit)");
    System.out.println("rank 1: " + Files.readString(dir.resolve("rank1"), StandardCharsets.UTF_8));
    String[] parts = record.split("\\|", 3);
    assertTrue(parts.length == 3, "rank 0 did not fail: " + record);
    assertTrue(CommunicatorException.class.isAssignableFrom(Class.forName(parts[0])), "rank 0 saw " + record);
    assertTrue(parts[2].contains("aborted"), "rank 0's error does not say it was aborted: " + parts[2]);
    long ms = Long.parseLong(parts[1]);
    assertTrue(ms < CONNECT_TIMEOUT_MS / 4, "rank 0 needed " + ms + " ms to stop, connect timeout " + CONNECT_TIMEOUT_MS);
  }
}
