package io.fusedcomm.api;

import io.fusedcomm.runtime.LeakTracker;

/**
 * The result of {@link Communicator#moeDispatchGemm}: this rank's routed rows (expert-major;
 * within an expert ordered by source rank, source token, slot), their GEMM output, and the layout
 * {@link Communicator#moeCombine} needs to send results home. Owns native memory: close it after
 * the combine. A combine running on another thread holds it: a close meanwhile frees the layout
 * when that combine returns, and a closed dispatch is refused.
 */
public final class MoeDispatch implements AutoCloseable {
  private final Communicator owner;
  private final long rows;
  private final long firstLocalExpert;
  private final long[] expertOffsets;
  private final long tokens;
  private final int topk;
  private final HostTensor expertOutput;
  private final HostTensor routedTokens;
  private final long leakId;
  private final long handle;  // valid while uses holds it
  private final UseCount uses = new UseCount();
  private int[] srcRank;
  private int[] srcToken;
  private int[] slot;
  private float[] weight;

  MoeDispatch(Communicator owner, long handle, DType dtype, long hidden, long ffn) {
    this.owner = owner;
    this.handle = handle;
    long[] info = NativeOps.moeInfo(handle);
    this.rows = info[0];
    this.firstLocalExpert = info[1];
    int localExperts = Math.toIntExact(info[2]);
    this.tokens = info[3];
    this.topk = Math.toIntExact(info[4]);
    this.expertOffsets = java.util.Arrays.copyOfRange(info, 5, 5 + localExperts + 1);
    this.expertOutput = HostTensor.allocate(dtype, rows, ffn);
    this.routedTokens = HostTensor.allocate(dtype, rows, hidden);
    try (OpCall copy = new OpCall(null, "moeDispatchGemm", false)) {
      NativeOps.moeCopy(handle, copy.address(expertOutput), copy.address(routedTokens));
    }
    this.leakId = LeakTracker.opened("MoeDispatch(" + rows + " rows)");
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

  /** {@code rows × ffn}: each routed row times its expert's {@code W1ᵀ}. */
  public HostTensor expertOutput() {
    return expertOutput;
  }

  /** {@code rows × hidden}: the routed token rows as received. */
  public HostTensor routedTokens() {
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

  /** Frees the layout (now, or when a combine using it returns) and closes both tensors. */
  @Override
  public void close() {
    if (uses.isClosed()) {
      return;
    }
    LeakTracker.closed(leakId);
    expertOutput.close();
    routedTokens.close();
    if (uses.close()) {
      NativeOps.moeFree(handle);
    }
  }
}
