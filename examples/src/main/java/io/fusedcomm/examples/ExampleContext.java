package io.fusedcomm.examples;

import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.apache.spark.SparkConf;
import java.util.stream.Collectors;
import java.util.stream.IntStream;
import org.apache.spark.api.java.JavaRDD;
import org.apache.spark.api.java.JavaSparkContext;

/**
 * The Spark side every example shares: a context from the spark-submit configuration (master,
 * jars and plugin come from the command line, nothing is hard-coded), and a wait for the
 * executors a barrier stage needs.
 */
final class ExampleContext {
  private static final Pattern LOCAL_CLUSTER = Pattern.compile("local-cluster\\[\\s*(\\d+)\\s*,.*\\]");

  private ExampleContext() {}

  /** A context named {@code appName} from spark-submit's configuration. */
  /** One example's driver body: gets the context and the task RDD, returns whether its check passed. */
  interface Body {
    boolean run(JavaSparkContext sc, JavaRDD<Integer> tasks) throws Exception;
  }

  /**
   * Runs an example's driver: creates the context, waits for {@code world} executors, hands the
   * body one task per rank, prints a failure with its stack, stops the context, and exits 1 if
   * the check failed (the run script and the integration test read the exit code).
   */
  static void run(String name, int world, Body body) {
    JavaSparkContext sc = create(name);
    boolean passed = false;
    try {
      awaitExecutors(sc, world, 120_000);
      JavaRDD<Integer> tasks = sc.parallelize(IntStream.range(0, world).boxed().collect(Collectors.toList()), world);
      passed = body.run(sc, tasks);
    } catch (Exception e) {
      System.out.println(name + ": FAILED: " + e);
      e.printStackTrace();
    } finally {
      sc.stop();
    }
    if (!passed) {
      System.exit(1);
    }
  }

  static JavaSparkContext create(String appName) {
    SparkConf conf = new SparkConf().setAppName(appName);
    // A barrier job submitted before enough executors registered is re-checked at this interval
    // (Spark's default is 15 s, which dominates a small example).
    conf.setIfMissing("spark.scheduler.barrier.maxConcurrentTasksCheck.interval", "1s");
    return new JavaSparkContext(conf);
  }

  /**
   * Waits until {@code world} task slots are likely present: on local-cluster it waits for
   * min(world, workers) executors (each local-cluster worker runs one); elsewhere Spark's barrier
   * check does the waiting.
   */
  static void awaitExecutors(JavaSparkContext sc, int world, long timeoutMs) throws InterruptedException {
    Matcher m = LOCAL_CLUSTER.matcher(sc.master().replace(" ", ""));
    if (!m.matches()) {
      return;
    }
    int expected = Math.min(world, Integer.parseInt(m.group(1)));
    long deadline = System.currentTimeMillis() + timeoutMs;
    // getExecutorInfos() lists the driver too.
    while (sc.sc().statusTracker().getExecutorInfos().length - 1 < expected) {
      if (System.currentTimeMillis() > deadline) {
        throw new IllegalStateException(
            expected + " executors did not register within " + timeoutMs + " ms; see the executor logs"
                + " under the worker's work directory");
      }
      Thread.sleep(100);
    }
  }

  /** Parses argument {@code i} as a positive number, or returns {@code fallback} if absent. */
  static long positiveArg(String[] args, int i, String name, long fallback) {
    if (args.length <= i) {
      return fallback;
    }
    long v;
    try {
      v = Long.parseLong(args[i].trim());
    } catch (NumberFormatException e) {
      throw new IllegalArgumentException(name + " must be a number, got '" + args[i] + "'", e);
    }
    if (v < 1) {
      throw new IllegalArgumentException(name + " must be at least 1, got " + v);
    }
    return v;
  }
}
