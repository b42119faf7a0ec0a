package io.fusedcomm.spark;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.codahale.metrics.MetricRegistry;
import io.fusedcomm.api.CommOptions;
import io.fusedcomm.api.DType;
import io.fusedcomm.api.HostTensor;
import io.fusedcomm.config.FusedCommConf;
import io.fusedcomm.errors.BackendUnavailableException;
import io.fusedcomm.errors.CommunicatorException;
import io.fusedcomm.plugin.FusedCommDriverPlugin;
import io.fusedcomm.plugin.FusedCommExecutorPlugin;
import io.fusedcomm.runtime.ExecutorRuntime;
import io.fusedcomm.testing.SparkCluster;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import org.apache.spark.SparkConf;
import org.apache.spark.api.java.JavaRDD;
import org.apache.spark.api.plugin.PluginContext;
import org.apache.spark.resource.ResourceInformation;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.Assumptions;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.MethodOrderer;
import org.junit.jupiter.api.Order;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestMethodOrder;
import org.junit.jupiter.api.io.TempDir;

/**
 * Failures inside barrier stages on a real {@code local-cluster[2,1,1024]} (host backend,
 * {@code spark.fusedcomm.timeout=10s}, Spark's default stage retries): a rank that throws, an
 * executor that dies, ranks that disagree on shapes, and the cuda backend without a GPU.
 *
 * <p>Spark retries a failed barrier stage only when it is a shuffle map stage ("Could not recover
 * from a failed barrier ResultStage" otherwise), so the retried stages here feed a shuffle.
 * Spark cancels the other barrier tasks once one fails, so each task writes what it observed
 * into a file of a temporary folder (same host) before rethrowing; the driver reads them after
 * the retried stage has succeeded.
 */
@TestMethodOrder(MethodOrderer.OrderAnnotation.class)
class FailureInjectionTest {
  private static final long TIMEOUT_MS = 10_000;
  private static SparkCluster cluster;

  @BeforeAll
  static void start() {
    cluster = SparkCluster.start("FailureInjectionTest", 2, Map.of("spark.fusedcomm.timeout", TIMEOUT_MS + "ms"));
  }

  @AfterAll
  static void stop() {
    if (cluster != null) {
      cluster.close();
    }
  }

  private static JavaRDD<Integer> twoPartitions() {
    return cluster.context().parallelize(List.of(0, 1), 2);
  }

  static void record(String dir, String name, String text) {
    try {
      Files.writeString(Path.of(dir, name), text, StandardCharsets.UTF_8);
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
  }

  static String read(Path dir, String name) throws IOException {
    Path p = dir.resolve(name);
    assertTrue(Files.exists(p), "no record " + name + " in " + dir + ": " + list(dir));
    return Files.readString(p, StandardCharsets.UTF_8);
  }

  private static List<String> list(Path dir) throws IOException {
    try (var s = Files.list(dir)) {
      return s.map(p -> p.getFileName().toString()).sorted().toList();
    }
  }

  /** What a failure does to a rank in the middle of a sequence of ops. */
  enum Injection {
    THROW,
    HALT
  }

  /**
   * Six in-place allReduces per rank; on stage attempt 0, rank 1 fails before its third. Every
   * rank records "class|elapsed ms|message" of the error it sees; returns "attempt:rank:value".
   */
  private static List<String> runWithInjection(Path dir, Injection injection) {
    String d = dir.toString();
    return BarrierStage.withCommunicator(twoPartitions(), CommOptions.defaults(), (comm, ctx, rows) -> {
      int attempt = ctx.stageAttemptNumber();
      int rank = comm.rank();
      try (HostTensor x = HostTensor.of(new float[] {rank + 1}, DType.F32, 1)) {
        long start = System.nanoTime();
        try {
          for (int i = 0; i < 6; i++) {
            if (attempt == 0 && rank == 1 && i == 2) {
              record(d, "attempt" + attempt + "-rank" + rank, "injected " + injection);
              if (injection == Injection.HALT) {
                Runtime.getRuntime().halt(1);
              }
              throw new IllegalStateException("injected failure on rank 1");
            }
            comm.allReduce(x, x);
          }
        } catch (RuntimeException e) {
          record(d, "attempt" + attempt + "-rank" + rank,
              e.getClass().getName() + "|" + (System.nanoTime() - start) / 1_000_000 + "|" + e.getMessage());
          throw e;
        }
        return List.of(attempt + ":" + rank + ":" + x.getFloat(0)).iterator();
      }
    }).repartition(1).collect();
  }

  /**
   * Runs {@link #runWithInjection}, prints what came back, the time it took and the records, and
   * checks that the retried stage succeeded.
   */
  private static void runAndAssertRetrySucceeded(Path dir, Injection injection, String label) throws IOException {
    long start = System.nanoTime();
    List<String> results = runWithInjection(dir, injection);
    System.out.println(label + ": " + results + " after " + (System.nanoTime() - start) / 1_000_000 + " ms; records "
        + list(dir));
    assertRetrySucceeded(results);
  }

  /**
   * Prints the survivor's (rank 0's) record of attempt 0 and checks it: a CommunicatorException
   * naming rank 1, well within the timeout.
   */
  private static void assertSurvivorNamedThePeer(Path dir) throws IOException {
    String record = read(dir, "attempt0-rank0");
    System.out.println("rank 0 on attempt 0: " + record);
    String[] parts = record.split("\\|", 3);
    assertEquals(3, parts.length, "record: " + record);
    try {
      assertTrue(CommunicatorException.class.isAssignableFrom(Class.forName(parts[0])), "rank 0 saw " + record);
    } catch (ClassNotFoundException e) {
      throw new AssertionError("rank 0 saw " + record, e);
    }
    assertTrue(parts[2].contains("rank 1 "), "rank 0's error does not name rank 1: " + parts[2]);
    long ms = Long.parseLong(parts[1]);
    assertTrue(ms < TIMEOUT_MS, "rank 0 needed " + ms + " ms to notice, timeout " + TIMEOUT_MS);
  }

  private static void assertRetrySucceeded(List<String> results) {
    // 1 + 2 = 3, then doubled five times.
    assertEquals(2, results.size(), String.valueOf(results));
    for (String r : results) {
      String[] p = r.split(":");
      assertTrue(Integer.parseInt(p[0]) >= 1, "result from attempt " + p[0] + ": " + results);
      assertEquals(96f, Float.parseFloat(p[2]), "rank " + p[1] + ": " + results);
    }
  }

  @Test
  @Order(1)
  void rankThatThrowsFailsThePeerAndTheRetriedStageSucceeds(@TempDir Path dir) throws IOException {
    runAndAssertRetrySucceeded(dir, Injection.THROW, "throw");
    assertTrue(read(dir, "attempt0-rank1").contains("injected failure on rank 1"), read(dir, "attempt0-rank1"));
    assertSurvivorNamedThePeer(dir);
  }

  @Test
  @Order(2)
  void inconsistentShapesGiveAClearErrorOnEveryRank() {
    List<String> messages = BarrierStage.withCommunicator(twoPartitions(), CommOptions.defaults(), (comm, ctx, rows) -> {
      int n = comm.rank() == 1 ? 9 : 8;
      try (HostTensor x = HostTensor.allocate(DType.F32, n)) {
        comm.allReduce(x, x);
        return List.of(comm.rank() + "|no error").iterator();
      } catch (CommunicatorException e) {
        return List.of(comm.rank() + "|" + e.getMessage()).iterator();
      }
    }).collect();
    System.out.println("inconsistent shapes: " + messages);
    assertEquals(2, messages.size());
    boolean mismatchNamed = false;
    for (String m : messages) {
      int rank = Integer.parseInt(m.substring(0, 1));
      String other = "rank " + (1 - rank) + " ";
      assertTrue(m.contains(other), "rank " + rank + " does not name " + other + ": " + m);
      mismatchNamed |= m.contains("differ across ranks") && m.contains("count=8") && m.contains("count=9");
    }
    assertTrue(mismatchNamed, "no rank reported both counts: " + messages);
  }

  @Test
  @Order(3)
  void executorKilledMidSequenceFailsThePeerAndTheRetriedStageSucceeds(@TempDir Path dir) throws IOException {
    runAndAssertRetrySucceeded(dir, Injection.HALT, "halt");
    assertEquals("injected HALT", read(dir, "attempt0-rank1"));
    assertSurvivorNamedThePeer(dir);
    cluster.awaitExecutors(2, 60_000);
  }

  // ---- the cuda backend on a host without a GPU ------------------------------------------------

  /**
   * A Spark executor with {@code backend=cuda} and no GPU assigned does not start the runtime:
   * the executor plugin's init records a sentence naming the settings to fix (which every
   * communicator asked for there then throws, see FailFastClusterTest) and returns, so the
   * executor stays up instead of being relaunched. Tested on the plugin directly.
   */
  @Test
  @Order(4)
  void cudaBackendWithoutAGpuLeavesTheReasonForTheExecutorsTasks() {
    SparkConf conf = new SparkConf(false).set("spark.fusedcomm.backend", "cuda");
    try {
      FusedCommExecutorPlugin plugin = new FusedCommExecutorPlugin();
      plugin.init(pluginContext(conf, Map.of()), Map.of(FusedCommDriverPlugin.JOB_TOKEN_KEY, "42"));
      String reason = ExecutorRuntime.startFailure().orElseThrow();
      System.out.println("cuda without GPU: " + reason);
      assertTrue(reason.contains("spark.fusedcomm.backend=cuda"), reason);
      assertTrue(reason.contains("spark.executor.resource.gpu.amount=1"), reason);
      assertTrue(ExecutorRuntime.current().isEmpty(), "no runtime was started");
      plugin.shutdown();

      // Two GPUs for one executor are refused as well.
      Map<String, ResourceInformation> two = Map.of("gpu", new ResourceInformation("gpu", new String[] {"0", "1"}));
      new FusedCommExecutorPlugin().init(pluginContext(conf, two), Map.of(FusedCommDriverPlugin.JOB_TOKEN_KEY, "42"));
      String twoReason = ExecutorRuntime.startFailure().orElseThrow();
      assertTrue(twoReason.contains("exactly one GPU"), twoReason);
    } finally {
      ExecutorRuntime.recordStartFailure(null);
    }
  }

  /**
   * A GPU address that Spark assigned but the host cannot open (no GPU, or a wrong discovery
   * script) fails the runtime with a clear reason; skipped where a GPU is present.
   */
  @Test
  @Order(5)
  void cudaRuntimeWithoutAGpuFailsWithAReason() {
    Map<String, String> settings = new HashMap<>();
    settings.put("spark.fusedcomm.backend", "cuda");
    String lib = System.getProperty("fusedcomm.test.nativeLibraryPath", "");
    if (!lib.isEmpty()) {
      settings.put("spark.fusedcomm.native.libraryPath", lib);
    }
    FusedCommConf conf = FusedCommConf.fromMap(settings);
    ExecutorRuntime rt;
    try {
      rt = ExecutorRuntime.create(conf, "exec-cuda", Optional.of("0"), 42);
    } catch (BackendUnavailableException e) {
      System.out.println("cuda runtime without GPU: " + e.getMessage());
      assertTrue(e.getMessage() != null && e.getMessage().length() > 20, "an explanation: " + e.getMessage());
      assertTrue(e.getMessage().toLowerCase().contains("cuda") || e.getMessage().toLowerCase().contains("gpu"),
          e.getMessage());
      return;
    }
    rt.close();
    Assumptions.assumeTrue(false, "a usable GPU 0 is present on this host: nothing to refuse");
  }

  private static PluginContext pluginContext(SparkConf conf, Map<String, ResourceInformation> resources) {
    return new PluginContext() {
      @Override
      public MetricRegistry metricRegistry() {
        return new MetricRegistry();
      }

      @Override
      public SparkConf conf() {
        return conf;
      }

      @Override
      public String executorID() {
        return "test-executor";
      }

      @Override
      public String hostname() {
        return "localhost";
      }

      @Override
      public Map<String, ResourceInformation> resources() {
        return resources;
      }

      @Override
      public void send(Object message) {}

      @Override
      public Object ask(Object message) {
        return null;
      }
    };
  }
}
