package io.fusedcomm.gpu;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.List;
import java.util.concurrent.TimeUnit;
import java.util.stream.Stream;
import org.junit.jupiter.api.Test;

/**
 * Executors of one host that load JCuda's native libraries at the same instant (seen on
 * 4 x H200: the first driver-API call of two executors, in lockstep in a barrier stage, on a host
 * where JCuda had not unpacked its driver library yet; one died with SIGBUS in the dynamic loader,
 * exit code 134): {@link io.fusedcomm.runtime.JCudaNatives#load} holds a host lock while JCuda
 * unpacks and loads them. Here 8 JVMs load them together into an empty {@code java.io.tmpdir},
 * 3 times: every one must load them and reach the driver. The same without the lock runs as a
 * control and prints how many JVMs died (not asserted: the race is timing-dependent). Needs a
 * GPU (the driver library needs libcuda); skips with the reason otherwise.
 */
class JCudaNativesRaceTest {
  private static final int JVMS = 8;
  private static final int TRIALS = 3;

  @Test
  void jvmsLoadingJCudaTogetherAllSucceedUnderTheHostLock() throws Exception {
    Gpu.require();
    for (int trial = 0; trial < TRIALS; trial++) {
      List<String> bad = race("locked");
      assertTrue(bad.isEmpty(), "trial " + trial + ": " + bad);
    }
    int died = 0;
    for (int trial = 0; trial < TRIALS; trial++) {
      died += race("unlocked").size();
    }
    System.out.println("JCudaNativesRaceTest: without the lock, " + died + " of " + (JVMS * TRIALS)
        + " JVMs failed to load JCuda (" + TRIALS + " trials of " + JVMS + ")");
  }

  /** One trial: JVMS children in a fresh tmpdir, started together; the failures, described. */
  private static List<String> race(String mode) throws Exception {
    Path dir = Files.createTempDirectory("fc-jcuda-race");
    try {
      Path start = dir.resolve("start");
      String java = Path.of(System.getProperty("java.home"), "bin", "java").toString();
      List<Process> children = new ArrayList<>();
      for (int i = 0; i < JVMS; i++) {
        ProcessBuilder pb = new ProcessBuilder(java, "-Djava.io.tmpdir=" + dir, "-cp",
            System.getProperty("java.class.path"), JCudaLoadChild.class.getName(), start.toString(), mode);
        pb.directory(dir.toFile());
        pb.redirectErrorStream(true);
        children.add(pb.start());
      }
      Thread.sleep(2_000);  // every child is up and spinning on the start file
      Files.createFile(start);
      List<String> bad = new ArrayList<>();
      for (int i = 0; i < JVMS; i++) {
        Process p = children.get(i);
        if (!p.waitFor(60, TimeUnit.SECONDS)) {
          p.destroyForcibly();
          bad.add("child " + i + " (" + mode + ") did not finish in 60 s");
          continue;
        }
        String out = new String(p.getInputStream().readAllBytes());
        if (p.exitValue() != 0 || !out.contains("ok devices=")) {
          bad.add("child " + i + " (" + mode + ") exit " + p.exitValue() + ": "
              + out.lines().filter(l -> l.contains("SIG") || l.contains("Error") || l.contains("ok") || l.contains("signal"))
                  .limit(3).toList());
        }
      }
      assertEquals(JVMS, children.size());
      return bad;
    } finally {
      deleteTree(dir);
    }
  }

  private static void deleteTree(Path dir) throws IOException {
    try (Stream<Path> s = Files.walk(dir)) {
      s.sorted(Comparator.reverseOrder()).forEach(p -> p.toFile().delete());
    }
  }
}
