package io.fusedcomm.internal.metrics;

import com.codahale.metrics.Counter;
import com.codahale.metrics.Gauge;
import com.codahale.metrics.MetricRegistry;
import com.codahale.metrics.Timer;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;

/**
 * What the communicators of one executor runtime did, as Dropwizard metrics. The executor plugin
 * adds them to its {@code PluginContext.metricRegistry()}, so they reach Spark's metrics sinks
 * under {@code plugin.io.fusedcomm.FusedCommPlugin.}; docs/monitoring.md lists them.
 *
 * <p>Every metric exists from the start (Spark registers a plugin's metrics once, right after
 * its init), so a sink shows zeros rather than nothing before the first op.
 *
 * <ul>
 *   <li>{@code ops.<op>}: a timer per op kind: how many calls returned normally and how long each
 *       took on the calling thread (for the stream forms, the time to check and enqueue).
 *   <li>{@code bytes.<link>.sent} / {@code .received}: the payload the op's contract moves
 *       between this rank and each peer, counted once per peer and by the link that reaches it
 *       ({@code nvlink}: cuda backend, same host; {@code network}: the transport, directly or
 *       through the GPU-driven proxy). Not wire bytes: the algorithm may forward or repeat data.
 *   <li>{@code path.<fused op>.fused} / {@code .decomposed}: how each fused-op call ran.
 *   <li>{@code failures.timeout}, {@code failures.other}: ops that failed with a timeout or any
 *       other communicator error; {@code aborts}: {@code abort()} calls on this executor.
 *   <li>{@code communicators.created}, {@code communicators.open}, {@code symmetricMemory.bytes}
 *       (GPU memory the open communicators hold as symmetric memory).
 * </ul>
 */
public final class CommMetrics {
  /** The op kinds, as the Java API names them. */
  public static final List<String> OPS = List.of("allGather", "reduceScatter", "allReduce", "allToAll",
      "allGatherGemm", "gemmReduceScatter", "gemmAllReduce", "moeDispatchGemm", "moeCombine", "moeGemmCombine", "ringAttention",
      "ringAttentionBackward");
  /** The fused GEMM + communication ops. */
  public static final List<String> FUSED_OPS = List.of("allGatherGemm", "gemmReduceScatter", "gemmAllReduce");

  /** How a rank reaches a peer. */
  public enum Link {
    NVLINK("nvlink"),
    NETWORK("network");

    private final String label;

    Link(String label) {
      this.label = label;
    }

    public String label() {
      return label;
    }
  }

  private final MetricRegistry registry = new MetricRegistry();
  private final Map<String, Timer> ops = new TreeMap<>();
  private final Map<String, Counter> fused = new TreeMap<>();
  private final Map<String, Counter> decomposed = new TreeMap<>();
  private final Counter[] sent = new Counter[Link.values().length];
  private final Counter[] received = new Counter[Link.values().length];
  private final Counter timeouts;
  private final Counter otherFailures;
  private final Counter aborts;
  private final Counter created;
  private final AtomicLong open = new AtomicLong();
  private final AtomicLong symmetricBytes = new AtomicLong();

  public CommMetrics() {
    for (String op : OPS) {
      ops.put(op, registry.timer("ops." + op));
    }
    for (String op : FUSED_OPS) {
      fused.put(op, registry.counter("path." + op + ".fused"));
      decomposed.put(op, registry.counter("path." + op + ".decomposed"));
    }
    for (Link l : Link.values()) {
      sent[l.ordinal()] = registry.counter("bytes." + l.label() + ".sent");
      received[l.ordinal()] = registry.counter("bytes." + l.label() + ".received");
    }
    timeouts = registry.counter("failures.timeout");
    otherFailures = registry.counter("failures.other");
    aborts = registry.counter("aborts");
    created = registry.counter("communicators.created");
    registry.register("communicators.open", (Gauge<Long>) open::get);
    registry.register("symmetricMemory.bytes", (Gauge<Long>) symmetricBytes::get);
  }

  /** The metrics, by name (without Spark's prefix). */
  public MetricRegistry registry() {
    return registry;
  }

  /** An op call of kind {@code op} returned normally after {@code nanos}. */
  public void op(String op, long nanos) {
    Timer t = ops.get(op);
    if (t != null) {
      t.update(nanos, TimeUnit.NANOSECONDS);
    }
  }

  /** A fused op ran fused ({@code true}) or decomposed. */
  public void path(String op, boolean isFused) {
    Counter c = (isFused ? fused : decomposed).get(op);
    if (c != null) {
      c.inc();
    }
  }

  /** Payload to and from one peer over {@code link}. */
  public void bytes(Link link, long sentBytes, long receivedBytes) {
    sent[link.ordinal()].inc(sentBytes);
    received[link.ordinal()].inc(receivedBytes);
  }

  public void timeout() {
    timeouts.inc();
  }

  public void failure() {
    otherFailures.inc();
  }

  public void abort() {
    aborts.inc();
  }

  /** A communicator holding {@code symmetric} bytes of symmetric memory was built. */
  public void opened(long symmetric) {
    created.inc();
    open.incrementAndGet();
    symmetricBytes.addAndGet(symmetric);
  }

  /** The communicator that {@link #opened} counted was closed. */
  public void closed(long symmetric) {
    open.decrementAndGet();
    symmetricBytes.addAndGet(-symmetric);
  }
}
