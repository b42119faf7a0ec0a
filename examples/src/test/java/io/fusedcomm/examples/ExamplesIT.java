package io.fusedcomm.examples;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.UncheckedIOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;
import java.util.regex.Pattern;
import java.util.zip.ZipFile;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/**
 * Runs each numbered example the way a user does, {@code bash examples/run.sh <name>}, in a
 * subprocess on an embedded local-cluster with the host backend, and checks its exit status and
 * its success line. Runs in {@code mvn verify} (failsafe, after package), when the plugin jar, the
 * examples jar and {@code examples/target/classpath.txt} exist, so the script starts no Maven.
 */
class ExamplesIT {
  private static final long TIMEOUT_S = 240;

  private static Path root;

  @BeforeAll
  static void locate() throws IOException {
    root = Paths.get(System.getProperty("fusedcomm.repo.root", "..")).toRealPath();
    Path pluginJar = Paths.get(System.getProperty("fusedcomm.plugin.jar"));
    Path examplesJar = Paths.get(System.getProperty("fusedcomm.examples.jar"));
    Path classpath = Paths.get(System.getProperty("fusedcomm.examples.classpath"));
    for (Path p : List.of(pluginJar, examplesJar, classpath)) {
      assertTrue(Files.isRegularFile(p), p + " should have been built before the integration tests");
    }
    try (ZipFile jar = new ZipFile(pluginJar.toFile())) {
      assumeTrue(jar.getEntry("linux/amd64/libfusedcomm.so") != null,
          "skipped: " + pluginJar + " carries no native library (built with -Dnative.skip=true)");
    }
  }

  @Test
  void collectives() throws Exception {
    String out = run("01_collectives");
    assertTrue(out.contains("01_collectives: all checks passed (world=2, backend=host)"), "no success line");
    // One table row per op, dtype and size, each ok.
    for (String op : List.of("allReduce", "allGather", "reduceScatter", "allToAll")) {
      for (String dtype : List.of("f32", "bf16")) {
        for (int n : CollectivesExample.SIZES) {
          Pattern row = Pattern.compile("(?m)^" + op + "\\s+" + dtype + "\\s+" + n + "\\s+2/2\\s.*\\sok$");
          assertTrue(row.matcher(out).find(), "no passing row for " + op + " " + dtype + " n=" + n);
        }
      }
    }
  }

  @Test
  void tensorParallelMlp() throws Exception {
    String out = run("02_tensor_parallel_mlp");
    assertTrue(Pattern.compile("(?m)^02_tensor_parallel_mlp: check passed for forward\\+backward \\(world=2, M=125,"
        + " H=64, F=256, dtype=bf16, backend=host, max_abs_err Y=\\S+, dX=\\S+\\)$").matcher(out).find(),
        "no success line");
    // Every element of both outputs was checked.
    for (String tensor : List.of("Y", "dX")) {
      assertTrue(Pattern.compile("(?m)^" + tensor + ": max \\|error\\| .* 0 of 8000 elements out of bounds$")
          .matcher(out).find(), "not every element of " + tensor + " was checked");
    }
  }

  @Test
  void tensorParallelMlpF32OnThreeRanks() throws Exception {
    // Uneven splits on both M (50 = 17+17+16) and F (100 = 34+33+33), and the fp32 bounds.
    String out = run("02_tensor_parallel_mlp", "3", "50", "32", "100", "f32");
    assertTrue(out.contains("02_tensor_parallel_mlp: check passed for forward+backward (world=3, M=50, H=32, F=100,"
        + " dtype=f32, backend=host"), "no success line");
  }

  @Test
  void tensorParallelMlpInference() throws Exception {
    // Decode steps M = 1, 3, 8, 17, 64 with gemmAllReduce; every rank's Y checked and compared.
    String out = run("02_tensor_parallel_mlp", "2", "64", "64", "256", "bf16", "fresh", "infer");
    assertTrue(Pattern.compile("(?m)^02_tensor_parallel_mlp: check passed for inference \\(world=2, H=64, F=256,"
        + " dtype=bf16, backend=host, decode M=1,3,8,17,64, same bits on every rank, max_abs_err Y=\\S+\\)$")
        .matcher(out).find(), "no success line");
  }

  @Test
  void moeLayer() throws Exception {
    String out = run("03_moe_layer");
    assertTrue(Pattern.compile("(?m)^03_moe_layer: check passed for forward\\+backward \\(world=2, M=120, H=64,"
        + " F=96, E=6, topk=2, dtype=bf16, backend=host, max_abs_err Y=\\S+, dX=\\S+, dW1=\\S+, dW2=\\S+\\)$")
        .matcher(out).find(), "no success line");
    // Every element of the four outputs was checked: Y and dX (M × H), dW1 and dW2 (E × F × H).
    for (String tensor : List.of("Y", "dX")) {
      assertTrue(Pattern.compile("(?m)^" + tensor + ": max \\|error\\| .* 0 of 7680 elements out of bounds$")
          .matcher(out).find(), "not every element of " + tensor + " was checked");
    }
    for (String tensor : List.of("dW1", "dW2")) {
      assertTrue(Pattern.compile("(?m)^" + tensor + ": max \\|error\\| .* 0 of 36864 elements out of bounds$")
          .matcher(out).find(), "not every element of " + tensor + " was checked");
    }
  }

  @Test
  void moeLayerF32OnThreeRanksWithTopThree() throws Exception {
    // Uneven splits of the tokens (50 = 17+17+16) and the experts (4 = 2+1+1), three slots.
    String out = run("03_moe_layer", "3", "50", "32", "40", "4", "3", "f32");
    assertTrue(out.contains("03_moe_layer: check passed for forward+backward (world=3, M=50, H=32, F=40, E=4, topk=3,"
        + " dtype=f32, backend=host"), "no success line");
  }

  @Test
  void contextParallelAttentionTrainsOnThreeRanks() throws Exception {
    // S = 1027 over 6 zigzag chunks (172, 171 × 5), causal, GQA 4:1; every element of O and LSE
    // of every rank checked against the local op over the whole sequence. In training mode, two
    // SGD steps through ringAttentionBackward: the loss goes down at every step and every element
    // of every rank's first-step dQ, dK and dV checks against the local backward.
    String out = run("04_context_parallel_attention", "3", "1027", "8", "2", "64", "bf16", "fresh", "zigzag", "train",
        "2");
    assertTrue(Pattern.compile("(?m)^04_context_parallel_attention: check passed \\(world=3, S=1027, Hq=8, Hkv=2,"
        + " D=64, dtype=bf16, layout=zigzag, causal, backend=host, max_abs_err O=\\S+, LSE=\\S+\\)$").matcher(out)
        .find(), "no success line");
    assertTrue(Pattern.compile("(?m)^O: max \\|error\\| .* 0 of 525824 elements out of bounds$").matcher(out).find(),
        "not every element of O");
    assertTrue(out.contains("0 of 8216 elements out of bounds"), "not every element of LSE");
    assertTrue(Pattern.compile("(?m)^04_context_parallel_attention: training check passed \\(world=3, S=1027, Hq=8,"
        + " Hkv=2, D=64, dtype=bf16, layout=zigzag, causal, backend=host, steps=2, lr=0.05, loss \\S+ -> \\S+,"
        + " max_abs_err dQ=\\S+, dK=\\S+, dV=\\S+\\)$").matcher(out).find(), "no training success line");
    assertTrue(Pattern.compile("(?m)^dQ: max \\|error\\| .* 0 of 525824 elements out of bounds$").matcher(out).find(),
        "not every element of dQ");
    for (String tensor : List.of("dK", "dV")) {
      assertTrue(Pattern.compile("(?m)^" + tensor + ": max \\|error\\| .* 0 of 131456 elements out of bounds$")
          .matcher(out).find(), "not every element of " + tensor);
    }
  }

  @Test
  void rapidsEtlToTrainingOnTheCpu() throws Exception {
    // The CPU form (no RAPIDS Accelerator): Parquet ETL by Spark, rows to host tensors, 30 steps
    // of tensor-parallel training on two ranks, checked against Java's ETL and an fp64 reference.
    String out = run("05_rapids_etl_to_training", "2", "2048", "32", "30", "7");
    assertTrue(out.contains("ETL: 2048 rows, 8 features and a label each, 0 values differ from Java's"), "ETL check");
    assertTrue(out.contains("hand-off: allReduce and allGather of the y column, 0 mismatches"), "hand-off check");
    assertTrue(Pattern.compile("(?m)^05_rapids_etl_to_training: check passed \\(world=2, N=2048, K=8, F=32, steps=30,"
        + " backend=host, loss \\S+ -> \\S+, max_rel_err loss=\\S+\\)$").matcher(out).find(), "no success line");
  }

  @Test
  void unknownExampleIsRefused() throws Exception {
    Result r = exec(List.of("bash", "examples/run.sh", "03_nope"), 30);
    assertEquals(2, r.exitCode, r.output);
    assertTrue(r.output.contains("unknown example '03_nope'"), r.output);
  }

  /** Runs an example; asserts exit status 0 and that the script did not rebuild anything. */
  private static String run(String example, String... args) throws Exception {
    List<String> cmd = new ArrayList<>(List.of("bash", "examples/run.sh", example));
    cmd.addAll(List.of(args));
    Result r = exec(cmd, TIMEOUT_S);
    assertEquals(0, r.exitCode, example + " failed; its output is printed above");
    assertFalse(r.output.contains("+ mvn "), "run.sh started Maven although everything was built");
    assertTrue(r.output.contains("org.apache.spark.deploy.SparkSubmit"), "run.sh did not print its command");
    return r.output;
  }

  private record Result(int exitCode, String output) {}

  private static Result exec(List<String> cmd, long timeoutS) throws Exception {
    ProcessBuilder pb = new ProcessBuilder(cmd).directory(root.toFile()).redirectErrorStream(true);
    Map<String, String> env = pb.environment();
    // The embedded local-cluster path with the default master and the host backend, whatever the
    // caller's shell has set.
    env.remove("SPARK_HOME");
    env.remove("MASTER");
    env.remove("FUSEDCOMM_BACKEND");
    env.remove("EXTRA_SUBMIT_ARGS");
    env.putIfAbsent("JAVA_HOME", System.getProperty("java.home"));
    System.out.println("==> " + String.join(" ", cmd));
    long t0 = System.nanoTime();
    Process p = pb.start();
    ByteArrayOutputStream buf = new ByteArrayOutputStream();
    Thread pump = new Thread(() -> copy(p.getInputStream(), buf), "run.sh output");
    pump.start();
    boolean done = p.waitFor(timeoutS, TimeUnit.SECONDS);
    if (!done) {
      p.descendants().forEach(ProcessHandle::destroy);
      p.destroy();
      if (!p.waitFor(10, TimeUnit.SECONDS)) {
        p.descendants().forEach(ProcessHandle::destroyForcibly);
        p.destroyForcibly();
      }
    }
    pump.join(10_000);
    String out;
    synchronized (buf) {
      out = buf.toString(StandardCharsets.UTF_8);
    }
    System.out.println(out);
    System.out.printf("<== exit %s after %.1f s%n", done ? Integer.toString(p.exitValue()) : "timeout",
        (System.nanoTime() - t0) / 1e9);
    assertTrue(done, String.join(" ", cmd) + " did not finish within " + timeoutS + " s");
    return new Result(p.exitValue(), out);
  }

  private static void copy(InputStream in, ByteArrayOutputStream out) {
    byte[] b = new byte[8192];
    try {
      for (int n; (n = in.read(b)) > 0; ) {
        synchronized (out) {
          out.write(b, 0, n);
        }
      }
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
  }
}
