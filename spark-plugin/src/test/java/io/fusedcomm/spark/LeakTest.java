package io.fusedcomm.spark;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.fusedcomm.api.CommOptions;
import io.fusedcomm.api.Communicator;
import io.fusedcomm.api.DType;
import io.fusedcomm.api.Split;
import io.fusedcomm.api.WeightLayout;
import io.fusedcomm.runtime.NativeApi;
import io.fusedcomm.testing.SparkCluster;
import io.fusedcomm.testing.TensorScope;
import java.io.File;
import java.io.IOException;
import java.io.Serializable;
import java.nio.file.Files;
import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/**
 * Nothing grows with the number of ops or communicators, measured inside the executor processes
 * of a {@code local-cluster[2,1,1024]}: open file descriptors (and sockets among them), threads,
 * and the native runtime's live host bytes and allocations.
 */
class LeakTest {
  /** Slack for JVM noise in fds/threads; native counters must match exactly. */
  private static final int JVM_SLACK = 0;
  private static SparkCluster cluster;

  @BeforeAll
  static void start() {
    cluster = SparkCluster.start("LeakTest", 2, Map.of());
  }

  @AfterAll
  static void stop() {
    if (cluster != null) {
      cluster.close();
    }
  }

  /** One sample of this process's resources. */
  static final class Sample implements Serializable {
    private static final long serialVersionUID = 1L;
    final int fds;
    final int sockets;
    final int threads;
    final long nativeBytes;
    final long nativeAllocations;

    Sample(int fds, int sockets, int threads, long nativeBytes, long nativeAllocations) {
      this.fds = fds;
      this.sockets = sockets;
      this.threads = threads;
      this.nativeBytes = nativeBytes;
      this.nativeAllocations = nativeAllocations;
    }

    static Sample take() {
      int fds = 0;
      int sockets = 0;
      File[] entries = new File("/proc/self/fd").listFiles();
      for (File f : entries == null ? new File[0] : entries) {
        try {
          fds++;
          if (Files.readSymbolicLink(f.toPath()).toString().startsWith("socket:")) {
            sockets++;
          }
        } catch (IOException e) {
          // the fd listFiles itself used, closed meanwhile
        }
      }
      String[] tasks = new File("/proc/self/task").list();
      long[] mem = NativeApi.memStats();
      return new Sample(fds, sockets, tasks == null ? -1 : tasks.length, mem[0], mem[1]);
    }

    @Override
    public String toString() {
      return "fds " + fds + " (sockets " + sockets + "), threads " + threads + ", native " + nativeBytes + " bytes in "
          + nativeAllocations + " allocations";
    }
  }

  private static void assertNoGrowth(String what, Sample before, Sample after) {
    assertEquals(before.nativeBytes, after.nativeBytes, what + ": native live bytes, " + before + " -> " + after);
    assertEquals(before.nativeAllocations, after.nativeAllocations, what + ": native allocations, " + before + " -> " + after);
    assertTrue(after.fds <= before.fds + JVM_SLACK, what + ": fds " + before + " -> " + after);
    assertTrue(after.sockets <= before.sockets + JVM_SLACK, what + ": sockets " + before + " -> " + after);
    assertTrue(after.threads <= before.threads + JVM_SLACK, what + ": threads " + before + " -> " + after);
  }

  /** One op of the mix: allReduce, allGather, gemmReduceScatter in turn. */
  private static void op(Communicator comm, int i, io.fusedcomm.api.HostTensor[] t) {
    switch (i % 3) {
      case 0 -> comm.allReduce(t[0], t[1]);
      case 1 -> comm.allGather(t[2], t[3]);
      default -> comm.gemmReduceScatter(t[4], t[5], t[6], WeightLayout.NK);
    }
  }

  @Test
  void thousandOpsInOneStageLeakNothing() {
    List<Sample[]> samples = BarrierStage.withCommunicator(cluster.context().parallelize(List.of(0, 1), 2),
        CommOptions.defaults(), (comm, ctx, rows) -> {
          int w = comm.world();
          int r = comm.rank();
          try (TensorScope s = new TensorScope()) {
            io.fusedcomm.api.HostTensor[] t = {
              s.zeros(DType.F32, 33), s.zeros(DType.F32, 33),
              s.zeros(DType.F32, Split.count(17, w, r)), s.zeros(DType.F32, 17),
              s.zeros(DType.BF16, 9, 8), s.zeros(DType.BF16, 6, 8), s.zeros(DType.BF16, Split.count(9, w, r), 6)};
            for (int i = 0; i < 100; i++) {
              op(comm, i, t);
            }
            comm.finish();
            Sample warm = Sample.take();
            for (int i = 100; i < 1000; i++) {
              op(comm, i, t);
            }
            comm.finish();
            Sample end = Sample.take();
            return List.<Sample[]>of(new Sample[] {warm, end}).iterator();
          }
        }).collect();
    assertEquals(2, samples.size());
    for (int r = 0; r < 2; r++) {
      System.out.println("rank " + r + " after 100 ops: " + samples.get(r)[0] + "; after 1000: " + samples.get(r)[1]);
      assertNoGrowth("rank " + r + ", ops 100 -> 1000", samples.get(r)[0], samples.get(r)[1]);
    }
  }

  @Test
  void communicatorsCreatedAndClosedLeakNothing() {
    List<Sample[]> samples = BarrierStage.mapPartitions(cluster.context().parallelize(List.of(0, 1), 2),
        (ctx, rows) -> {
          Sample[] at = new Sample[2];
          try (TensorScope s = new TensorScope()) {
            io.fusedcomm.api.HostTensor x = s.zeros(DType.F32, 5);
            for (int i = 0; i < 7; i++) {
              if (i == 2) {
                at[0] = Sample.take();  // after two warm-up communicators
              }
              try (Communicator comm = Communicator.create(ctx, CommOptions.defaults().name("leak" + i))) {
                comm.allReduce(x, x);
              }
            }
            at[1] = Sample.take();
          }
          return List.<Sample[]>of(at).iterator();
        }).collect();
    for (int r = 0; r < 2; r++) {
      System.out.println("rank " + r + " after 2 communicators: " + samples.get(r)[0] + "; after 7: " + samples.get(r)[1]);
      assertNoGrowth("rank " + r + ", communicators 2 -> 7", samples.get(r)[0], samples.get(r)[1]);
    }
  }
}
