package io.fusedcomm.runtime;

import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicLong;

/**
 * Counts the native handles (runtimes, communicators, host tensors, MoE layouts) that are open,
 * and, when {@code spark.fusedcomm.debug.leakTracking} is on, remembers where each was created so
 * that the ones never closed can be reported with their allocation stack.
 */
public final class LeakTracker {
  private static volatile boolean recordStacks;
  private static final AtomicLong NEXT = new AtomicLong();
  private static final Map<Long, Handle> OPEN = new ConcurrentHashMap<>();

  /** What an open handle is, and (stack recording on) where it was created. */
  private record Handle(String what, StackTraceElement[] createdAt) {}

  private LeakTracker() {}

  /** Turns stack recording on or off for handles created from now on. */
  public static void recordStacks(boolean on) {
    recordStacks = on;
  }

  /** Registers a new handle; returns the id to pass to {@link #closed}. */
  public static long opened(String what) {
    long id = NEXT.incrementAndGet();
    // The stack is only taken when asked for: this runs on every tensor allocation.
    OPEN.put(id, new Handle(what, recordStacks ? Thread.currentThread().getStackTrace() : null));
    return id;
  }

  /** Marks the handle closed. */
  public static void closed(long id) {
    OPEN.remove(id);
  }

  /** How many tracked handles are open now. */
  public static int openCount() {
    return OPEN.size();
  }

  /** One description per open handle; with stack recording on, the creation stack too. */
  public static List<String> openHandles() {
    List<String> out = new ArrayList<>();
    for (Handle h : OPEN.values()) {
      StringBuilder sb = new StringBuilder(h.what());
      if (h.createdAt() != null) {
        sb.append(" created here");
        for (StackTraceElement e : h.createdAt()) {
          sb.append("\n    at ").append(e);
        }
      }
      out.add(sb.toString());
    }
    return out;
  }
}
