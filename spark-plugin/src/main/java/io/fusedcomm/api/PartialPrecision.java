package io.fusedcomm.api;

/**
 * The precision in which {@link Communicator#gemmReduceScatter} keeps and exchanges each rank's
 * partial product {@code a_r · op(w_r)}. The sum over ranks is fp32 either way, in rank order,
 * and rounded once to the output's dtype. The ordinal is the native code. Every rank of an op
 * must pass the same value (checked, as the shapes are).
 */
public enum PartialPrecision {
  /** fp32 partials: the output is rounded once (the default, and the host backend's rule). */
  F32,
  /**
   * bf16 partials: each rank's partial is rounded to bf16 (round to nearest even) before the
   * sum, as cuBLAS + NCCL and PyTorch's symmetric-memory op do. Half the bytes in the workspace
   * and over NVLink; at most {@code 2^-9 · Σ_r |partial_r|} more error per output element.
   */
  BF16
}
