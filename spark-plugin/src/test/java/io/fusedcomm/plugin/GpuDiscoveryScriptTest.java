package io.fusedcomm.plugin;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.fusedcomm.config.ConfigDocs;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Set;
import java.util.concurrent.TimeUnit;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * Runs {@code conf/gpu-discovery.sh} as Spark would (a child process of this JVM, which is then the
 * claim owner) with fake GPUs and a private claim directory.
 */
class GpuDiscoveryScriptTest {
  private static final Pattern OUTPUT =
      Pattern.compile("\\{\"name\":\"gpu\",\"addresses\":\\[(?:\"(\\d+)\")?\\]\\}");

  @TempDir Path claims;

  private record Result(String address, String stderr, int exitCode) {}

  private Process start(int fakeGpus) throws IOException {
    Path script = ConfigDocs.repoRoot().resolve("conf/gpu-discovery.sh");
    assertTrue(Files.isExecutable(script), script + " must exist and be executable");
    ProcessBuilder pb = new ProcessBuilder(script.toString());
    pb.environment().put("FUSEDCOMM_FAKE_GPUS", Integer.toString(fakeGpus));
    pb.environment().put("FUSEDCOMM_GPU_CLAIM_DIR", claims.toString());
    return pb.start();
  }

  private static Result finish(Process p) throws Exception {
    String out = new String(p.getInputStream().readAllBytes(), StandardCharsets.UTF_8).trim();
    String err = new String(p.getErrorStream().readAllBytes(), StandardCharsets.UTF_8).trim();
    assertTrue(p.waitFor(30, TimeUnit.SECONDS), "discovery script hung");
    Matcher m = OUTPUT.matcher(out);
    assertTrue(m.matches(), "unexpected discovery output: " + out + " / stderr: " + err);
    return new Result(m.group(1), err, p.exitValue());
  }

  private Result run(int fakeGpus) throws Exception {
    return finish(start(fakeGpus));
  }

  @Test
  void handsOutDistinctGpusThenNone() throws Exception {
    Set<String> got = new HashSet<>();
    for (int i = 0; i < 3; i++) {
      Result r = run(3);
      assertEquals(0, r.exitCode);
      assertTrue(r.address != null, "call " + i + " got no GPU: " + r.stderr);
      got.add(r.address);
    }
    assertEquals(Set.of("0", "1", "2"), got);

    Result none = run(3);
    assertEquals(null, none.address);
    assertEquals(0, none.exitCode);
    assertTrue(none.stderr.contains("claimed"), none.stderr);
  }

  @Test
  void concurrentCallersGetDistinctGpus() throws Exception {
    List<Process> procs = new ArrayList<>();
    for (int i = 0; i < 6; i++) {
      procs.add(start(4));
    }
    List<String> addresses = new ArrayList<>();
    int empty = 0;
    for (Process p : procs) {
      Result r = finish(p);
      if (r.address == null) {
        empty++;
      } else {
        addresses.add(r.address);
      }
    }
    assertEquals(4, addresses.size(), "addresses " + addresses);
    assertEquals(4, new HashSet<>(addresses).size(), "duplicate GPU handed out: " + addresses);
    assertEquals(2, empty);
  }

  @Test
  void claimOfExitedProcessIsReclaimed() throws Exception {
    Process dead = new ProcessBuilder("true").start();
    assertTrue(dead.waitFor(30, TimeUnit.SECONDS));
    Path stale = claims.resolve("gpu-0");
    Files.createDirectories(stale);
    Files.writeString(stale.resolve("owner"), dead.pid() + " 12345\n");

    Result r = run(1);
    assertEquals("0", r.address, r.stderr);
    String owner = Files.readString(stale.resolve("owner")).trim();
    assertTrue(
        owner.startsWith(ProcessHandle.current().pid() + " "),
        "claim should now belong to this JVM, is: " + owner);
  }

  @Test
  void claimOfLiveProcessIsKept() throws Exception {
    Path held = claims.resolve("gpu-0");
    Files.createDirectories(held);
    // This JVM is alive; no start time recorded, so only liveness is checked.
    Files.writeString(held.resolve("owner"), ProcessHandle.current().pid() + "\n");
    Result r = run(2);
    assertEquals("1", r.address, r.stderr);
    assertEquals(null, run(2).address);
  }

  @Test
  void noGpusMeansEmptyAddressesAndAReason() throws Exception {
    Result r = run(0);
    assertEquals(null, r.address);
    assertEquals(0, r.exitCode);
    assertTrue(r.stderr.contains("no GPU"), r.stderr);
  }
}
