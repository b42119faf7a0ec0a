package io.fusedcomm.testing;

import io.fusedcomm.api.CommOptions;
import io.fusedcomm.api.Communicator;
import io.fusedcomm.api.InternalAccess;
import io.fusedcomm.config.FusedCommConf;
import io.fusedcomm.runtime.ExecutorRuntime;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicReferenceArray;

/**
 * Up to {@code maxWorld} "executors" in one JVM: one host-backend {@link ExecutorRuntime} each,
 * and ranks as threads that bootstrap a {@link Communicator} over an {@link InJvmExchange}.
 * Each {@link #run} builds fresh communicators on the first {@code world} runtimes, runs the body
 * on every rank, and closes them (aborting first where the body threw, as BarrierStage does).
 */
public final class HostWorld implements AutoCloseable {
  private static final AtomicLong NONCES = new AtomicLong(1000);
  private final List<ExecutorRuntime> runtimes = new ArrayList<>();
  private final ExecutorService threads;
  private final long limitMs;

  /** A body run on every rank. */
  @FunctionalInterface
  public interface RankBody<T> {
    T call(Communicator comm) throws Exception;
  }

  /** One rank's result: a value or the error it threw, and how long the body took. */
  public static final class Outcome<T> {
    public final int rank;
    public final T value;
    public final Throwable error;
    public final long millis;

    Outcome(int rank, T value, Throwable error, long millis) {
      this.rank = rank;
      this.value = value;
      this.error = error;
      this.millis = millis;
    }

    @Override
    public String toString() {
      return "rank " + rank + ": " + (error == null ? "ok " + value : error) + " after " + millis + " ms";
    }
  }

  /**
   * @param maxWorld number of runtimes
   * @param settings extra {@code spark.fusedcomm.*} settings (backend=host is the default here)
   * @param limitMs bound on one {@link #run}, beyond which the test fails instead of hanging
   */
  public HostWorld(int maxWorld, Map<String, String> settings, long limitMs) {
    Map<String, String> conf = new HashMap<>();
    conf.put("spark.fusedcomm.backend", "host");
    conf.put("spark.fusedcomm.timeout", "5s");
    conf.put("spark.fusedcomm.connectTimeout", "5s");
    // Development hook: -Dfusedcomm.test.nativeLibraryPath=DIR loads DIR/libfusedcomm.so.
    String lib = System.getProperty("fusedcomm.test.nativeLibraryPath", "");
    if (!lib.isEmpty()) {
      conf.put("spark.fusedcomm.native.libraryPath", lib);
    }
    conf.putAll(settings);
    FusedCommConf c = FusedCommConf.fromMap(conf);
    try {
      for (int r = 0; r < maxWorld; r++) {
        runtimes.add(ExecutorRuntime.create(c, "exec-" + r, Optional.empty(), 0x5eed_1234L));
      }
    } catch (RuntimeException e) {
      close();
      throw e;
    }
    this.threads = Executors.newCachedThreadPool(r -> {
      Thread t = new Thread(r, "host-world-rank");
      t.setDaemon(true);
      return t;
    });
    this.limitMs = limitMs;
  }

  public ExecutorRuntime runtime(int rank) {
    return runtimes.get(rank);
  }

  /** Runs {@code body} on every rank of a fresh world; returns each rank's outcome. */
  public <T> List<Outcome<T>> runAll(int world, RankBody<T> body) {
    return runAll(world, CommOptions.defaults(), body);
  }

  /** As {@link #runAll(int, RankBody)} with communicator options. */
  public <T> List<Outcome<T>> runAll(int world, CommOptions options, RankBody<T> body) {
    if (world > runtimes.size()) {
      throw new IllegalArgumentException("world " + world + " > " + runtimes.size() + " runtimes");
    }
    List<InJvmExchange> exchanges = InJvmExchange.group(world, NONCES.incrementAndGet(), limitMs);
    AtomicReferenceArray<Communicator> comms = new AtomicReferenceArray<>(world);
    List<Future<Outcome<T>>> futures = new ArrayList<>();
    for (int r = 0; r < world; r++) {
      final int rank = r;
      futures.add(threads.submit(() -> {
        long start = System.nanoTime();
        try (Communicator comm = InternalAccess.bootstrap(runtimes.get(rank), exchanges.get(rank), options)) {
          comms.set(rank, comm);
          try {
            T value = body.call(comm);
            return new Outcome<>(rank, value, null, (System.nanoTime() - start) / 1_000_000);
          } catch (Throwable t) {
            comm.abort();
            return new Outcome<>(rank, null, t, (System.nanoTime() - start) / 1_000_000);
          }
        } catch (Throwable t) {
          return new Outcome<>(rank, null, t, (System.nanoTime() - start) / 1_000_000);
        }
      }));
    }
    List<Outcome<T>> out = new ArrayList<>();
    long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(limitMs);
    for (int r = 0; r < world; r++) {
      try {
        out.add(futures.get(r).get(Math.max(1, deadline - System.nanoTime()), TimeUnit.NANOSECONDS));
      } catch (TimeoutException e) {
        for (int p = 0; p < world; p++) {
          Communicator c = comms.get(p);
          if (c != null) {
            c.abort();
          }
        }
        throw new AssertionError("rank " + r + " of " + world + " did not finish within " + limitMs + " ms");
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        throw new AssertionError("interrupted", e);
      } catch (ExecutionException e) {
        throw new AssertionError("rank " + r + " failed outside its body", e.getCause());
      }
    }
    return out;
  }

  /** Runs {@code body} on every rank and returns the values; fails on any rank's error. */
  public <T> List<T> run(int world, RankBody<T> body) {
    List<Outcome<T>> outcomes = runAll(world, body);
    List<T> values = new ArrayList<>();
    for (Outcome<T> o : outcomes) {
      if (o.error != null) {
        AssertionError e = new AssertionError("rank " + o.rank + " of " + world + " failed: " + o.error, o.error);
        for (Outcome<T> other : outcomes) {
          if (other != o && other.error != null) {
            e.addSuppressed(other.error);
          }
        }
        throw e;
      }
      values.add(o.value);
    }
    return values;
  }

  @Override
  public void close() {
    if (threads != null) {
      threads.shutdownNow();
    }
    for (ExecutorRuntime r : runtimes) {
      r.close();
    }
    runtimes.clear();
  }
}
