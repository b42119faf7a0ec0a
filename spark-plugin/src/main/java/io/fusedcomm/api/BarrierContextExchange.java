package io.fusedcomm.api;

import io.fusedcomm.internal.bootstrap.BootstrapExchange;
import io.fusedcomm.internal.bootstrap.Fingerprint;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import org.apache.spark.BarrierTaskContext;
import org.apache.spark.util.TaskCompletionListener;
import org.apache.spark.util.TaskFailureListener;

/**
 * {@link BootstrapExchange} over a barrier task's context: rank = partition id, world = number of
 * barrier tasks, one {@code allGather}. The communicator id is derived from the stage, its attempt,
 * the communicator's name and its creation order in the task, so every rank computes the same id
 * and a retried stage never pairs with the tasks of an earlier attempt.
 *
 * <p>It also ties the communicator to the task: a failed task aborts it, a completed task closes
 * what the user forgot to close, and a watchdog aborts it when Spark kills the task (a kill only
 * interrupts the Java thread, which does not reach a native wait), from before the exchange and
 * the connect (a task killed while its peers never connect stops at once, not after the connect
 * timeout) until the task ends.
 *
 * <p>Internal to {@link Communicator#create(BarrierTaskContext, CommOptions)}; it lives in this
 * package so that {@code io.fusedcomm.api} does not depend on {@code io.fusedcomm.spark} (which
 * depends on the API).
 */
final class BarrierContextExchange implements BootstrapExchange {
  private static final Map<Long, AtomicInteger> CREATED = new ConcurrentHashMap<>();
  private static final Map<Communicator, BarrierTaskContext> WATCHED = new ConcurrentHashMap<>();
  /** Aborts of communicators still in {@link Communicator#create}, by the task they belong to. */
  private static final Map<Runnable, BarrierTaskContext> BOOTSTRAPPING = new ConcurrentHashMap<>();
  private static final ScheduledExecutorService WATCHDOG =
      Executors.newSingleThreadScheduledExecutor(
          r -> {
            Thread t = new Thread(r, "fusedcomm-task-kill-watchdog");
            t.setDaemon(true);
            return t;
          });

  static {
    WATCHDOG.scheduleWithFixedDelay(BarrierContextExchange::abortKilled, 100, 100, TimeUnit.MILLISECONDS);
  }

  private final BarrierTaskContext context;
  private final long nonce;

  /** An exchange for {@code context}; {@code name} distinguishes several communicators of a task. */
  BarrierContextExchange(BarrierTaskContext context, String name) {
    this.context = context;
    long attemptId = context.taskAttemptId();
    int sequence = CREATED.computeIfAbsent(attemptId, id -> {
      context.addTaskCompletionListener((TaskCompletionListener) c -> CREATED.remove(id));
      return new AtomicInteger();
    }).getAndIncrement();
    this.nonce =
        Fingerprint.builder("comm")
            .add("stage", context.stageId())
            .add("attempt", context.stageAttemptNumber())
            .add("name", name)
            .add("sequence", sequence)
            .build()
            .value();
  }

  @Override
  public int rank() {
    return context.partitionId();
  }

  @Override
  public int world() {
    return context.getTaskInfos().length;
  }

  @Override
  public long commNonce() {
    return nonce;
  }

  @Override
  public String[] allGather(String mine) {
    return context.allGather(mine);
  }

  /**
   * Runs {@code abort} (the native communicator's, safe at any moment) if the task is killed
   * before the watch ends; returns what ends it.
   */
  Runnable watchBootstrap(Runnable abort) {
    BOOTSTRAPPING.put(abort, context);
    return () -> BOOTSTRAPPING.remove(abort);
  }

  /** Ties {@code comm}'s life to the task (see the class comment). */
  void watch(Communicator comm) {
    WATCHED.put(comm, context);
    context.addTaskFailureListener((TaskFailureListener) (c, error) -> comm.abort());
    context.addTaskCompletionListener(
        (TaskCompletionListener) c -> {
          WATCHED.remove(comm);
          if (!comm.isClosed()) {
            comm.abort();
            comm.close();
          }
        });
  }

  private static void abortKilled() {
    for (Map.Entry<Runnable, BarrierTaskContext> e : BOOTSTRAPPING.entrySet()) {
      if (e.getValue().isInterrupted() && BOOTSTRAPPING.remove(e.getKey()) != null) {
        e.getKey().run();
      }
    }
    for (Map.Entry<Communicator, BarrierTaskContext> e : WATCHED.entrySet()) {
      if (e.getValue().isInterrupted() || e.getKey().isClosed()) {
        WATCHED.remove(e.getKey());
        e.getKey().abort();
      }
    }
  }
}
