package io.fusedcomm.runtime;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.fusedcomm.api.CommOptions;
import io.fusedcomm.api.Communicator;
import io.fusedcomm.api.DType;
import io.fusedcomm.api.HostTensor;
import io.fusedcomm.api.InternalAccess;
import io.fusedcomm.config.FusedCommConf;
import io.fusedcomm.testing.InJvmExchange;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;

/**
 * An executor told to shut down closes its runtime while a task may still hold a communicator
 * (seen on 4 x H200: a task waiting for a peer that had died reached its communicator's close
 * after the shutdown had freed the runtime: SIGSEGV in native code). The runtime now aborts the
 * communicators still open, waits (bounded) for their tasks to close them, and frees itself only
 * when none is left; otherwise it leaves the native runtime to the process's exit. Host backend:
 * the same JNI runtime and communicator code as the cuda backend's host half.
 */
class RuntimeCloseWithOpenCommunicatorsTest {

  private static FusedCommConf conf(String timeout) {
    String lib = System.getProperty("fusedcomm.test.nativeLibraryPath", "");
    return FusedCommConf.fromMap(lib.isEmpty()
        ? Map.of("spark.fusedcomm.backend", "host", "spark.fusedcomm.timeout", timeout)
        : Map.of("spark.fusedcomm.backend", "host", "spark.fusedcomm.timeout", timeout,
            "spark.fusedcomm.native.libraryPath", lib));
  }

  /** Communicators of world {@code runtimes.length}, one per runtime, bootstrapped in threads. */
  private static Communicator[] bootstrap(ExecutorRuntime... runtimes) throws Exception {
    List<InJvmExchange> ex = InJvmExchange.group(runtimes.length, System.nanoTime(), 20_000);
    @SuppressWarnings("unchecked")
    CompletableFuture<Communicator>[] f = new CompletableFuture[runtimes.length];
    for (int r = 0; r < runtimes.length; r++) {
      int rank = r;
      f[r] = CompletableFuture.supplyAsync(
          () -> InternalAccess.bootstrap(runtimes[rank], ex.get(rank), CommOptions.defaults()));
    }
    Communicator[] out = new Communicator[runtimes.length];
    for (int r = 0; r < runtimes.length; r++) {
      out[r] = f[r].get(30, TimeUnit.SECONDS);
    }
    return out;
  }

  @Test
  void closingTheRuntimeAbortsAnOpWaitingForAPeerAndWaitsForItsClose() throws Exception {
    // A 60 s op timeout: the op below must end by the abort, long before it.
    ExecutorRuntime rt0 = ExecutorRuntime.create(conf("60s"), "exec-0", Optional.empty(), 77L);
    ExecutorRuntime rt1 = ExecutorRuntime.create(conf("60s"), "exec-1", Optional.empty(), 77L);
    try {
      Communicator[] comms = bootstrap(rt0, rt1);
      assertEquals(1, rt0.openCommunicators());
      // Rank 0 enters an allReduce that rank 1 never joins, then closes its communicator when
      // the op fails, as a task's finally does.
      CompletableFuture<Throwable> task = CompletableFuture.supplyAsync(() -> {
        try (Communicator c = comms[0];
            HostTensor in = HostTensor.of(new float[] {1, 2, 3, 4}, DType.F32, 4);
            HostTensor out = HostTensor.allocate(DType.F32, 4)) {
          c.allReduce(in, out);
          return null;
        } catch (Throwable t) {
          return t;
        }
      });
      Thread.sleep(300);  // rank 0 is waiting inside the op
      long t0 = System.nanoTime();
      rt0.close();  // as the executor plugin's shutdown does
      long closeMs = (System.nanoTime() - t0) / 1_000_000;
      Throwable failure = task.get(10, TimeUnit.SECONDS);
      assertNotNull(failure, "the allReduce without its peer must fail once aborted");
      assertTrue(closeMs < 10_000, "runtime close took " + closeMs + " ms");
      assertEquals(0, rt0.openCommunicators(), "the task closed its communicator before the runtime freed itself");
      assertThrows(IllegalStateException.class, rt0::handle, "the runtime is closed");
      comms[1].abort();
      comms[1].close();
    } finally {
      rt0.close();
      rt1.close();
    }
  }

  @Test
  void aCommunicatorNeverClosedLeavesTheNativeRuntimeToTheProcessExit() throws Exception {
    // The wait for open communicators is the op timeout (at most 10 s): 1 s here.
    ExecutorRuntime rt = ExecutorRuntime.create(conf("1s"), "exec-0", Optional.empty(), 78L);
    Communicator comm = bootstrap(rt)[0];
    long t0 = System.nanoTime();
    rt.close();
    long closeMs = (System.nanoTime() - t0) / 1_000_000;
    assertTrue(closeMs >= 900 && closeMs < 5_000, "runtime close waited " + closeMs + " ms for the open communicator");
    assertEquals(1, rt.openCommunicators());
    assertThrows(IllegalStateException.class, rt::handle, "the runtime is closed");
    assertThrows(IllegalStateException.class, () -> InternalAccess.bootstrap(rt,
        InJvmExchange.group(1, 5L, 1_000).get(0), CommOptions.defaults()), "no new communicator on a closed runtime");
    // The late close reaches a native runtime that still exists (it was not freed under it).
    comm.close();
    assertEquals(0, rt.openCommunicators());
  }

  @Test
  void aRuntimeWithoutOpenCommunicatorsClosesAtOnce() throws Exception {
    ExecutorRuntime rt = ExecutorRuntime.create(conf("30s"), "exec-0", Optional.empty(), 79L);
    Communicator comm = bootstrap(rt)[0];
    comm.close();
    long t0 = System.nanoTime();
    rt.close();
    long closeMs = (System.nanoTime() - t0) / 1_000_000;
    assertTrue(closeMs < 2_000, "runtime close took " + closeMs + " ms");
    assertEquals(0, rt.openCommunicators());
  }
}
