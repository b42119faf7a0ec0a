package io.fusedcomm.testing;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Map;
import org.apache.spark.SparkConf;
import org.apache.spark.api.java.JavaSparkContext;

/**
 * A real {@code local-cluster[N,1,1024]} Spark application for tests, set up as the gpu-host
 * README describes: {@code spark.testing} and an empty {@code spark.test.home} so that the
 * in-process master and workers launch executor JVMs that inherit this JVM's classpath (test
 * classes, the plugin, the native library resource, JCuda), and the fusedcomm plugin on the host
 * backend.
 *
 * <p>One per test class: start-up costs seconds, and surefire gives each class its own JVM.
 */
public final class SparkCluster implements AutoCloseable {
  private final JavaSparkContext jsc;
  private final Path home;

  private SparkCluster(JavaSparkContext jsc, Path home) {
    this.jsc = jsc;
    this.home = home;
  }

  /**
   * Starts {@code local-cluster[executors,1,1024]} with the fusedcomm plugin; {@code settings}
   * are added to (and may override) the defaults: backend host, timeout 10s.
   */
  public static SparkCluster start(String name, int executors, Map<String, String> settings) {
    return start(name, executors, settings, true);
  }

  /** As above; with {@code awaitExecutors} false, returns without waiting for executors. */
  public static SparkCluster start(String name, int executors, Map<String, String> settings, boolean awaitExecutors) {
    Path home;
    try {
      home = Files.createTempDirectory("fusedcomm-spark-home");
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
    System.setProperty("spark.testing", "1");
    System.setProperty("spark.test.home", home.toString());
    SparkConf conf = new SparkConf()
        .setMaster("local-cluster[" + executors + ",1,1024]")
        .setAppName(name)
        .set("spark.executorEnv.SPARK_SCALA_VERSION", scalaBinaryVersion())
        .set("spark.plugins", "io.fusedcomm.FusedCommPlugin")
        .set("spark.fusedcomm.backend", "host")
        .set("spark.fusedcomm.timeout", "10s")
        .set("spark.ui.enabled", "false")
        .set("spark.ui.showConsoleProgress", "false")
        .set("spark.driver.host", "127.0.0.1")
        .set("spark.driver.bindAddress", "127.0.0.1")
        // A barrier stage resubmitted after an executor loss waits for slots; check every second.
        .set("spark.scheduler.barrier.maxConcurrentTasksCheck.interval", "1s")
        .set("spark.scheduler.barrier.maxConcurrentTasksCheck.maxFailures", "60");
    String lib = System.getProperty("fusedcomm.test.nativeLibraryPath", "");
    if (!lib.isEmpty()) {
      conf.set("spark.fusedcomm.native.libraryPath", lib);
    }
    settings.forEach(conf::set);
    JavaSparkContext jsc = new JavaSparkContext(conf);
    SparkCluster cluster = new SparkCluster(jsc, home);
    try {
      if (awaitExecutors) {
        cluster.awaitExecutors(executors, 120_000);
      }
    } catch (RuntimeException | Error e) {
      cluster.close();
      throw e;
    }
    return cluster;
  }

  /** "2.13" or "2.12": the Scala of the Spark build on the classpath. */
  static String scalaBinaryVersion() {
    String v = scala.util.Properties.versionNumberString();
    return v.substring(0, v.indexOf('.', v.indexOf('.') + 1));
  }

  public JavaSparkContext context() {
    return jsc;
  }

  /** The empty folder given as {@code spark.test.home}: workers keep executor logs under work/. */
  public Path home() {
    return home;
  }

  /** Number of registered executors (the driver excluded). */
  public int executors() {
    return jsc.sc().statusTracker().getExecutorInfos().length - 1;
  }

  /** Waits until {@code n} executors are registered, e.g. after one was killed. */
  public void awaitExecutors(int n, long timeoutMs) {
    long deadline = System.currentTimeMillis() + timeoutMs;
    while (executors() < n) {
      if (System.currentTimeMillis() > deadline) {
        throw new IllegalStateException("only " + executors() + " of " + n + " executors registered after " + timeoutMs + " ms");
      }
      try {
        Thread.sleep(200);
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        throw new IllegalStateException(e);
      }
    }
  }

  @Override
  public void close() {
    jsc.stop();
  }
}
