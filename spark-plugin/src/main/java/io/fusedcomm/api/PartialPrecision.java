package io.fusedcomm.api;

/**
 * The precision in which {@link Communicator#gemmReduceScatter} and {@link
 * Communicator#gemmAllReduce} keep and exchange each rank's partial product
 * {@code a_r · op(w_r)}. The sum over ranks is fp32 either way, in rank order
 * (unless {@link #F32_ANY_ORDER} allows any), and rounded once to the output's dtype. Every rank
 * of an op must pass the same value (checked, as the shapes are). Mirrors {@code fc_partials_t}
 * of the native C API ({@code FC_PARTIALS_<name>}): the same names and {@link #code() values}.
 */
public enum PartialPrecision {
  /** fp32 partials: the output is rounded once (the default, and the host backend's rule). */
  F32(0),
  /**
   * bf16 partials: each rank's partial is rounded to bf16 (round to nearest even) before the
   * sum, as cuBLAS + NCCL and PyTorch's symmetric-memory op do. Half the bytes in the workspace
   * and over NVLink; at most {@code 2^-9 · Σ_r |partial_r|} more error per output element. (The
   * cuda backend's fused gemmReduceScatter kernel leaves the owning rank's own partial in fp32:
   * less error, and possibly a bf16 ulp away from the other paths' result.)
   */
  BF16(1),
  /**
   * fp32 partials, summed in any order: at world size 3 and more the cuda backend's fused
   * kernel lets the peers add their partials into the owner's memory as they arrive, so the
   * owner reads one buffer instead of {@code world - 1}; the fp32 sum's order, and rarely the
   * output's last bit, can then change from run to run. Elsewhere (world size 2, the decomposed
   * path, gemmAllReduce, the host backend) it is {@link #F32}.
   */
  F32_ANY_ORDER(2);

  private final int code;

  PartialPrecision(int code) {
    this.code = code;
  }

  /** The value of {@code FC_PARTIALS_<name>} in the native C API. */
  public int code() {
    return code;
  }
}
