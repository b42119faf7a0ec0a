package io.fusedcomm.internal.metrics;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.codahale.metrics.Counter;
import com.codahale.metrics.Gauge;
import com.codahale.metrics.MetricRegistry;
import io.fusedcomm.api.DType;
import io.fusedcomm.api.HostTensor;
import io.fusedcomm.api.WeightLayout;
import io.fusedcomm.errors.CommunicatorException;
import io.fusedcomm.testing.HostWorld;
import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.Test;

/**
 * The executor metrics after known ops on the host backend (3 ranks in one JVM, one runtime
 * each): calls and payload per rank as docs/monitoring.md defines them, fused-op paths,
 * communicators, aborts.
 */
class CommMetricsTest {
  @Test
  void countsWhatTheOpsDid() throws Exception {
    int w = 3;
    long n = 1000;  // f32; Split over 3 ranks: 334, 333, 333
    long[] counts = {334, 333, 333};
    try (HostWorld world = new HostWorld(w, Map.of(), 60_000)) {
      world.run(w, comm -> {
        try (HostTensor x = HostTensor.allocate(DType.F32, n);
             HostTensor part = HostTensor.allocate(DType.F32, counts[comm.rank()]);
             HostTensor all = HostTensor.allocate(DType.F32, n)) {
          x.fill(1f);
          part.fill(1f);
          for (int i = 0; i < 2; i++) {
            comm.allReduce(x, x);
          }
          comm.allGather(part, all);
          comm.reduceScatter(x, part);
          // allGatherGemm M=6 (2 rows per rank), K=8, N_r=8.
          try (HostTensor a = HostTensor.allocate(DType.F32, 2, 8);
               HostTensor wt = HostTensor.allocate(DType.F32, 8, 8);
               HostTensor c = HostTensor.allocate(DType.F32, 6, 8)) {
            a.fill(1f);
            wt.fill(1f);
            comm.allGatherGemm(a, wt, c, WeightLayout.NK);
          }
          // A refused call is not an op.
          assertThrows(IllegalArgumentException.class, () -> comm.allReduce(x, part));
          assertTrue(comm.opTime().toNanos() > 0);
        }
        return null;
      });
      for (int r = 0; r < w; r++) {
        MetricRegistry m = world.runtime(r).metrics().registry();
        assertEquals(2, m.timer("ops.allReduce").getCount(), "rank " + r);
        assertEquals(1, m.timer("ops.allGather").getCount());
        assertEquals(1, m.timer("ops.reduceScatter").getCount());
        assertEquals(1, m.timer("ops.allGatherGemm").getCount());
        assertEquals(0, m.timer("ops.allToAll").getCount());
        long sent = 0;
        long received = 0;
        for (int p = 0; p < w; p++) {
          if (p != r) {
            sent += 2 * (counts[p] + counts[r]) * 4;  // allReduce
            received += 2 * (counts[p] + counts[r]) * 4;
            sent += counts[r] * 4;                      // allGather
            received += counts[p] * 4;
            sent += counts[p] * 4;                      // reduceScatter
            received += counts[r] * 4;
            sent += 2 * 8 * 4;                          // allGatherGemm: 2 rows of 8 f32 each
            received += 2 * 8 * 4;
          }
        }
        assertEquals(sent, counter(m, "bytes.network.sent"), "rank " + r);
        assertEquals(received, counter(m, "bytes.network.received"), "rank " + r);
        assertEquals(0, counter(m, "bytes.nvlink.sent"), "the host backend has no NVLink");
        // The host backend's fused ops run as a collective and a GEMM.
        assertEquals(1, counter(m, "path.allGatherGemm.decomposed"));
        assertEquals(0, counter(m, "path.allGatherGemm.fused"));
        assertEquals(1, counter(m, "communicators.created"));
        assertEquals(0L, gauge(m, "communicators.open"), "closed after the run");
        assertEquals(0L, gauge(m, "symmetricMemory.bytes"));
        assertEquals(0, counter(m, "failures.timeout"));
        assertEquals(0, counter(m, "failures.other"));
        assertEquals(0, counter(m, "aborts"));
      }

      // A rank that throws while its peer waits in an op: BarrierStage's rule aborts it, and the
      // peer's op fails with a communicator error (not a timeout here).
      List<HostWorld.Outcome<Object>> outcomes = world.runAll(2, comm -> {
        if (comm.rank() == 1) {
          Thread.sleep(1000);  // rank 0 is inside its allReduce by then
          throw new IllegalStateException("rank 1 fails on purpose");
        }
        try (HostTensor x = HostTensor.allocate(DType.F32, 8)) {
          comm.allReduce(x, x);
        }
        return null;
      });
      assertTrue(outcomes.get(0).error instanceof CommunicatorException, "rank 0: " + outcomes.get(0));
      assertEquals(1, counter(world.runtime(1).metrics().registry(), "aborts"));
      assertEquals(1, counter(world.runtime(0).metrics().registry(), "failures.other")
          + counter(world.runtime(0).metrics().registry(), "failures.timeout"));
      assertEquals(2, world.runtime(0).metrics().registry().timer("ops.allReduce").getCount(),
          "the failed op is not counted as done");
    }
  }

  private static long counter(MetricRegistry m, String name) {
    Counter c = m.getCounters().get(name);
    assertTrue(c != null, "no counter " + name + " in " + m.getNames());
    return c.getCount();
  }

  private static Object gauge(MetricRegistry m, String name) {
    @SuppressWarnings("rawtypes")
    Gauge g = m.getGauges().get(name);
    assertTrue(g != null, "no gauge " + name + " in " + m.getNames());
    return g.getValue();
  }
}
