package io.fusedcomm.api;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.File;
import java.io.IOException;
import java.io.InputStream;
import java.io.StringWriter;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Arrays;
import java.util.List;
import java.util.concurrent.TimeUnit;
import java.util.stream.Collectors;
import javax.tools.JavaCompiler;
import javax.tools.ToolProvider;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * JCuda is optional: application code that passes raw device addresses and stream handles
 * compiles against the plugin without JCuda, and the API runs in a JVM that has none (the
 * plugin jar does not carry it).
 */
class WithoutJCudaTest {
  /** This JVM's test classpath without JCuda's jars. */
  private static String classpathWithoutJCuda() {
    String cp = System.getProperty("surefire.test.class.path", System.getProperty("java.class.path"));
    List<String> kept = Arrays.stream(cp.split(File.pathSeparator))
        .filter(e -> !e.contains(File.separator + "jcuda"))
        .collect(Collectors.toList());
    assertTrue(kept.size() < cp.split(File.pathSeparator).length, "the test classpath has JCuda to leave out");
    return String.join(File.pathSeparator, kept);
  }

  @Test
  void rawAddressAndStreamCodeCompilesWithoutJCuda(@TempDir Path dir) throws IOException {
    Path source = dir.resolve("UserCode.java");
    Files.writeString(source, String.join("\n",
        "import io.fusedcomm.api.*;",
        "public class UserCode {",
        "  static long run(Communicator comm, long devicePtr, long stream, AutoCloseable owner) {",
        "    try (DeviceTensor t = DeviceTensor.wrap(devicePtr, DType.BF16, 64, 64);",
        "         DeviceTensor u = DeviceTensor.wrap(devicePtr, DType.BF16, new long[] {64, 64}, owner)) {",
        "      comm.allReduce(t, u, stream);",
        "      comm.allGather(t, u, stream);",
        "      comm.allGatherGemm(t, u, t, null, WeightLayout.NK, stream);",
        "      comm.gemmReduceScatter(t, u, t, WeightLayout.NK, PartialPrecision.F32, stream);",
        "      comm.allReduce(t, u);",
        "      return t.devicePointer() + t.device();",
        "    }",
        "  }",
        "}"));
    JavaCompiler javac = ToolProvider.getSystemJavaCompiler();
    StringWriter out = new StringWriter();
    boolean ok = javac.getTask(out, null, null,
        List.of("-classpath", classpathWithoutJCuda(), "-d", dir.toString(), "-proc:none"), null,
        javac.getStandardFileManager(null, null, null).getJavaFileObjects(source.toFile())).call();
    assertTrue(ok, "javac without JCuda on the classpath:\n" + out);
  }

  @Test
  void theApiRunsWithoutJCuda() throws IOException, InterruptedException {
    String java = Path.of(System.getProperty("java.home"), "bin", "java").toString();
    String lib = System.getProperty("fusedcomm.test.nativeLibraryPath", "");
    Process child = new ProcessBuilder(java, "-cp", classpathWithoutJCuda(), WithoutJCudaChild.class.getName(), lib)
        .redirectErrorStream(true).start();
    String out;
    try (InputStream in = child.getInputStream()) {
      out = new String(in.readAllBytes(), StandardCharsets.UTF_8);
    }
    System.out.println(out);
    assertTrue(child.waitFor(120, TimeUnit.SECONDS), "the child did not exit: " + out);
    assertEquals(0, child.exitValue(), out);
    assertTrue(out.contains("no JCuda on the classpath") && out.contains("\nOK"), out);
  }
}
