package io.fusedcomm.api;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.io.InputStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.util.List;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;

/**
 * The exception classes the native error path throws are loaded when the library loads, so an
 * error met when the process is out of file descriptors arrives as itself, not as a {@code
 * NoClassDefFoundError} for its class (which needs a descriptor to be read). Runs {@link
 * FdExhaustionChild} in a JVM of its own with a small descriptor limit.
 */
class ErrorClassesLoadedTest {
  @Test
  void anErrorAfterTooManyOpenFilesArrivesAsItself() throws IOException, InterruptedException {
    String java = Path.of(System.getProperty("java.home"), "bin", "java").toString();
    String classpath = System.getProperty("surefire.test.class.path", System.getProperty("java.class.path"));
    String lib = System.getProperty("fusedcomm.test.nativeLibraryPath", "");
    // A small soft limit keeps the exhaustion quick; -MaxFDLimit stops the JVM raising it again.
    List<String> command = List.of("bash", "-c", "ulimit -Sn 1024 2>/dev/null; exec \"$@\"", "child", java,
        "-XX:-MaxFDLimit", "-cp", classpath, FdExhaustionChild.class.getName(), lib);
    Process child = new ProcessBuilder(command).redirectErrorStream(true).start();
    String out;
    try (InputStream in = child.getInputStream()) {
      out = new String(in.readAllBytes(), StandardCharsets.UTF_8);
    }
    System.out.println(out);
    assertTrue(child.waitFor(120, TimeUnit.SECONDS), "the child did not exit: " + out);
    assertEquals(0, child.exitValue(), out);
    assertTrue(out.contains("EXHAUSTED after opening files: ") && out.contains("Too many open files"), out);
    assertTrue(out.contains("THROWN io.fusedcomm.errors."),
        "the native error arrived as fusedcomm's: " + out);
    assertFalse(out.contains("NoClassDefFoundError"), out);
  }
}
