package io.fusedcomm.internal.bootstrap;

/**
 * The one collective a communicator needs from its launcher: every rank contributes a string and
 * gets all of them, by rank. Inside Spark this is {@code BarrierTaskContext.allGather}, called
 * exactly once per communicator; tests and tools can supply their own.
 */
public interface BootstrapExchange {
  /** This rank, in {@code [0, world())}. */
  int rank();

  /** Number of ranks. */
  int world();

  /**
   * Identifies the communicator: the same value on every rank of it, different for every other
   * communicator of the job (Spark: derived from stage, attempt and creation order).
   */
  long commNonce();

  /** Contributes {@code mine}; returns every rank's contribution, indexed by rank. */
  String[] allGather(String mine);
}
