package io.fusedcomm.api;

import io.fusedcomm.runtime.LeakTracker;

/**
 * The result of {@link Communicator#moeDispatchGemm}: this rank's routed rows (expert-major;
 * within an expert ordered by source rank, source token, slot), their GEMM output, and the layout
 * {@link Communicator#moeCombine} needs to send results home. Owns native memory: close it after
 * the combine. A combine running on another thread holds it: a close meanwhile frees the layout
 * when that combine returns, and a closed dispatch is refused.
 *
 * <p>Where the rows live follows the backend: on cuda {@link #expertOutput()} and {@link
 * #routedTokens()} are {@link DeviceTensor}s over the dispatch's own GPU memory (no copy; they
 * end with the dispatch, and the memory is released once the dispatch and every op using them
 * are done); on host they are {@link HostTensor}s. Reading GPU rows on the host is an explicit
 * copy ({@link DeviceTensor#copyTo}); so is the per-row layout ({@link #sourceRank} and the
 * others copy it to the host on first use).
 */
public final class MoeDispatch implements AutoCloseable {
  private final Communicator owner;
  private final long rows;
  private final long firstLocalExpert;
  private final long[] expertOffsets;
  private final long tokens;
  private final int topk;
  private final AbstractTensor expertOutput;
  private final AbstractTensor routedTokens;
  private final long leakId;
  private final long handle;  // valid while uses holds it
  private final UseCount uses = new UseCount();
  private int[] srcRank;
  private int[] srcToken;
  private int[] slot;
  private float[] weight;

  /** {@code gpu}: the GPU of the dispatch's rows on the cuda backend, -1 on the host backend. */
  MoeDispatch(Communicator owner, long handle, DType dtype, long hidden, long ffn, int gpu) {
    this.owner = owner;
    this.handle = handle;
    long[] info = NativeOps.moeInfo(handle);
    this.rows = info[0];
    this.firstLocalExpert = info[1];
    int localExperts = Math.toIntExact(info[2]);
    this.tokens = info[3];
    this.topk = Math.toIntExact(info[4]);
    this.expertOffsets = java.util.Arrays.copyOfRange(info, 5, 5 + localExperts + 1);
    if (gpu >= 0) {
      long[] at = NativeOps.moeDeviceRows(handle);
      this.expertOutput = view(at[0], gpu, dtype, rows, ffn);
      this.routedTokens = view(at[1], gpu, dtype, rows, hidden);
    } else {
      HostTensor out = HostTensor.allocate(dtype, rows, ffn);
      HostTensor routed = HostTensor.allocate(dtype, rows, hidden);
      this.expertOutput = out;
      this.routedTokens = routed;
      try (OpCall copy = new OpCall(null, "moeDispatchGemm", false)) {
        NativeOps.moeCopy(handle, copy.address(out), copy.address(routed));
      }
    }
    this.leakId = LeakTracker.opened("MoeDispatch(" + rows + " rows)");
  }

  /** A tensor over the dispatch's GPU memory that holds a use of the dispatch until released. */
  private DeviceTensor view(long address, int gpu, DType dtype, long... shape) {
    uses.acquire("the MoE dispatch");
    return new DeviceTensor(address, gpu, dtype, shape, false, this::release);
  }

  /** Rows routed to this rank's experts. */
  public long rows() {
    return rows;
  }

  /** Global id of this rank's first expert. */
  public long firstLocalExpert() {
    return firstLocalExpert;
  }

  /** Number of experts this rank owns. */
  public int localExperts() {
    return expertOffsets.length - 1;
  }

  /** Rows of local expert {@code e} are {@code [expertOffset(e), expertOffset(e + 1))}. */
  public long expertOffset(int e) {
    return expertOffsets[e];
  }

  /**
   * The {@code localExperts() + 1} row offsets of the local experts' segments (a copy): the
   * {@code offsets} of {@link Communicator#groupedGemm} over this dispatch's rows.
   */
  public long[] expertOffsets() {
    return expertOffsets.clone();
  }

  /** This rank's token count (the combine's output rows). */
  public long tokens() {
    return tokens;
  }

  public int topk() {
    return topk;
  }

  /**
   * {@code rows × ffn}: each routed row times its expert's {@code W1ᵀ}; a {@link DeviceTensor} on
   * cuda (the dispatch's memory, closed with it), a {@link HostTensor} on host.
   */
  public Tensor expertOutput() {
    return expertOutput;
  }

  /** {@code rows × hidden}: the routed token rows as received; held as {@link #expertOutput()}. */
  public Tensor routedTokens() {
    return routedTokens;
  }

  /** The rank the row's token lives on. */
  public int sourceRank(long row) {
    meta();
    return srcRank[Math.toIntExact(row)];
  }

  /** The row's token index on its home rank. */
  public int sourceToken(long row) {
    meta();
    return srcToken[Math.toIntExact(row)];
  }

  /** Which of the token's top-k choices the row is. */
  public int slot(long row) {
    meta();
    return slot[Math.toIntExact(row)];
  }

  /** The routing weight of the row. */
  public float weight(long row) {
    meta();
    return weight[Math.toIntExact(row)];
  }

  private synchronized void meta() {
    if (srcRank == null) {
      int n = Math.toIntExact(rows);
      srcRank = new int[n];
      srcToken = new int[n];
      slot = new int[n];
      weight = new float[n];
      long h = acquire();
      try {
        NativeOps.moeRowMeta(h, srcRank, srcToken, slot, weight);
      } finally {
        release();
      }
    }
  }

  Communicator owner() {
    return owner;
  }

  /** Holds the dispatch for a native call and returns its handle; {@link #release} after. */
  long acquire() {
    uses.acquire("the MoE dispatch");
    return handle;
  }

  void release() {
    if (uses.release()) {
      NativeOps.moeFree(handle);
    }
  }

  /**
   * Closes both tensors and frees the layout and the rows: now, or when the last op using them
   * (a combine on another thread, work enqueued on a stream with the GPU rows) is done.
   */
  @Override
  public void close() {
    if (uses.isClosed()) {
      return;
    }
    LeakTracker.closed(leakId);
    closeTensor(expertOutput);
    closeTensor(routedTokens);
    if (uses.close()) {
      NativeOps.moeFree(handle);
    }
  }

  private static void closeTensor(AbstractTensor t) {
    if (t instanceof DeviceTensor d) {
      d.close();
    } else {
      ((HostTensor) t).close();
    }
  }
}
