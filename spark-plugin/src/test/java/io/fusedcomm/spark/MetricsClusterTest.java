package io.fusedcomm.spark;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.fusedcomm.api.CommOptions;
import io.fusedcomm.api.DType;
import io.fusedcomm.api.HostTensor;
import io.fusedcomm.testing.SparkCluster;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.stream.Collectors;
import java.util.stream.Stream;
import org.apache.spark.api.java.JavaRDD;
import org.apache.spark.scheduler.AccumulableInfo;
import org.apache.spark.scheduler.SparkListener;
import org.apache.spark.scheduler.SparkListenerStageCompleted;
import org.junit.jupiter.api.Test;

/**
 * The executor metrics as a user reads them: a local-cluster application with Spark's CSV sink
 * (configured as docs/monitoring.md shows) runs a known barrier job of 2 ranks; each executor's
 * files then hold the op counts and bytes that job implies, and the driver's op-time accumulator
 * exists with a value.
 */
class MetricsClusterTest {
  private static final String PREFIX = "plugin.io.fusedcomm.FusedCommPlugin.";

  @Test
  void aKnownJobShowsInTheSinkAndTheAccumulator() throws Exception {
    Path sink = Files.createTempDirectory("fusedcomm-metrics");
    Map<String, String> settings = new HashMap<>();
    settings.put("spark.metrics.conf.executor.sink.csv.class", "org.apache.spark.metrics.sink.CsvSink");
    settings.put("spark.metrics.conf.executor.sink.csv.period", "1");
    settings.put("spark.metrics.conf.executor.sink.csv.unit", "seconds");
    settings.put("spark.metrics.conf.executor.sink.csv.directory", sink.toString());
    try (SparkCluster cluster = SparkCluster.start("metrics", 2, settings)) {
      // What the stage page shows: each completed stage's named accumulators and their values.
      List<Object[]> stageAccumulables = new CopyOnWriteArrayList<>();
      cluster.context().sc().addSparkListener(new SparkListener() {
        @Override
        public void onStageCompleted(SparkListenerStageCompleted done) {
          scala.collection.Iterator<AccumulableInfo> it = done.stageInfo().accumulables().values().iterator();
          while (it.hasNext()) {
            AccumulableInfo a = it.next();
            if (a.name().isDefined() && a.value().isDefined()) {
              stageAccumulables.add(new Object[] {a.name().get(), a.value().get()});
            }
          }
        }
      });
      long n = 1000;  // f32 over 2 ranks: 500 each
      JavaRDD<Integer> rdd = cluster.context().parallelize(List.of(0, 1), 2);
      List<String> executors = BarrierStage.withCommunicator(rdd, CommOptions.defaults(), (comm, ctx, rows) -> {
        try (HostTensor x = HostTensor.allocate(DType.F32, n);
             HostTensor half = HostTensor.allocate(DType.F32, n / 2)) {
          x.fill(1f);
          half.fill(1f);
          for (int i = 0; i < 3; i++) {
            comm.allReduce(x, x);
          }
          comm.allGather(half, x);
          comm.allGather(half, x);
        }
        return List.of(org.apache.spark.SparkEnv.get().executorId()).iterator();
      }).collect();
      assertEquals(2, executors.size());

      // Per executor: 3 allReduce of (500 + 500) f32 to and from the one peer, 2 allGather of 500.
      long bytes = 3 * 1000 * 4 + 2 * 500 * 4;
      for (String exec : executors) {
        awaitValue(sink, exec, "ops.allReduce", 3);
        awaitValue(sink, exec, "ops.allGather", 2);
        awaitValue(sink, exec, "bytes.network.sent", bytes);
        awaitValue(sink, exec, "bytes.network.received", bytes);
        awaitValue(sink, exec, "communicators.created", 1);
        assertEquals(0, lastCount(sink, exec, "ops.allToAll"));
        assertEquals(0, lastCount(sink, exec, "failures.timeout"));
      }

      List<Object> opTimes = List.of();
      long until = System.nanoTime() + 10_000_000_000L;  // listener events arrive asynchronously
      while (opTimes.isEmpty() && System.nanoTime() < until) {
        opTimes = stageAccumulables.stream().filter(a -> a[0].equals(BarrierStage.OP_TIME_ACCUMULATOR))
            .map(a -> a[1]).collect(Collectors.toList());
        Thread.sleep(100);
      }
      assertEquals(1, opTimes.size(), "one barrier stage with the op-time accumulator: " + stageAccumulables.size()
          + " accumulables seen");
      assertTrue(opTimes.get(0) instanceof Long && (Long) opTimes.get(0) >= 0, "op time " + opTimes.get(0));
      System.out.println("stage accumulator '" + BarrierStage.OP_TIME_ACCUMULATOR + "' = " + opTimes.get(0));
    }
  }

  /** Waits (bounded) until the executor's CSV file for {@code metric} shows {@code expected}. */
  private static void awaitValue(Path sink, String exec, String metric, long expected) throws InterruptedException {
    long deadline = System.nanoTime() + 30_000_000_000L;
    long last = -1;
    while (System.nanoTime() < deadline) {
      last = lastCount(sink, exec, metric);
      if (last == expected) {
        return;
      }
      Thread.sleep(200);
    }
    throw new AssertionError("executor " + exec + " metric " + metric + ": " + last + ", expected " + expected
        + " (files: " + list(sink) + ")");
  }

  /**
   * The count column of the last line of the executor's CSV file for {@code metric} (-1 before the
   * file exists): a counter's value, a timer's number of calls.
   */
  private static long lastCount(Path sink, String exec, String metric) {
    String suffix = "." + exec + "." + PREFIX + metric + ".csv";
    try (Stream<Path> files = Files.list(sink)) {
      Path file = files.filter(p -> p.getFileName().toString().endsWith(suffix)).findFirst().orElse(null);
      if (file == null) {
        return -1;
      }
      List<String> lines = Files.readAllLines(file);
      if (lines.size() < 2) {
        return -1;
      }
      String[] header = lines.get(0).split(",");
      String[] row = lines.get(lines.size() - 1).split(",");
      for (int i = 0; i < header.length; i++) {
        if (header[i].equals("count") || header[i].equals("value")) {
          return (long) Double.parseDouble(row[i]);
        }
      }
      throw new AssertionError(file + " has no count column: " + lines.get(0));
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
  }

  private static String list(Path sink) {
    try (Stream<Path> files = Files.list(sink)) {
      return files.map(p -> p.getFileName().toString()).filter(s -> s.contains("fusedcomm"))
          .collect(Collectors.joining(", "));
    } catch (IOException e) {
      return e.toString();
    }
  }
}
