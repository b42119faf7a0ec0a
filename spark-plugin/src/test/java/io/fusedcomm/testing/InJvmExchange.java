package io.fusedcomm.testing;

import io.fusedcomm.internal.bootstrap.BootstrapExchange;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.BrokenBarrierException;
import java.util.concurrent.CyclicBarrier;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;

/**
 * A {@link BootstrapExchange} for ranks that are threads of one JVM: a shared slot array and a
 * {@link CyclicBarrier}. Every wait is bounded; a rank that never arrives makes the others fail
 * with an {@link IllegalStateException} after {@code timeoutMs}.
 */
public final class InJvmExchange implements BootstrapExchange {
  private final Group group;
  private final int rank;

  private InJvmExchange(Group group, int rank) {
    this.group = group;
    this.rank = rank;
  }

  /** One exchange per rank of a world, all sharing {@code nonce}. */
  public static List<InJvmExchange> group(int world, long nonce, long timeoutMs) {
    Group g = new Group(world, nonce, timeoutMs);
    List<InJvmExchange> out = new ArrayList<>();
    for (int r = 0; r < world; r++) {
      out.add(new InJvmExchange(g, r));
    }
    return out;
  }

  @Override
  public int rank() {
    return rank;
  }

  @Override
  public int world() {
    return group.slots.length;
  }

  @Override
  public long commNonce() {
    return group.nonce;
  }

  /** Number of allGather calls this rank made (the contract: exactly one per communicator). */
  public int calls() {
    synchronized (group) {
      return group.calls[rank];
    }
  }

  @Override
  public String[] allGather(String mine) {
    synchronized (group) {
      group.calls[rank]++;
      group.slots[rank] = mine;
    }
    await();
    String[] all;
    synchronized (group) {
      all = group.slots.clone();
    }
    await();  // nobody overwrites a slot before every rank has read all of them
    return all;
  }

  private void await() {
    try {
      group.barrier.await(group.timeoutMs, TimeUnit.MILLISECONDS);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new IllegalStateException("rank " + rank + ": interrupted in the bootstrap exchange", e);
    } catch (BrokenBarrierException | TimeoutException e) {
      throw new IllegalStateException("rank " + rank + ": a rank did not reach the bootstrap exchange", e);
    }
  }

  private static final class Group {
    final String[] slots;
    final int[] calls;
    final long nonce;
    final long timeoutMs;
    final CyclicBarrier barrier;

    Group(int world, long nonce, long timeoutMs) {
      this.slots = new String[world];
      this.calls = new int[world];
      this.nonce = nonce;
      this.timeoutMs = timeoutMs;
      this.barrier = new CyclicBarrier(world);
    }
  }
}
