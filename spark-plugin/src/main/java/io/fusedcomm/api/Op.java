package io.fusedcomm.api;

import java.util.ArrayList;
import java.util.List;

/**
 * The ops of a communicator, as the native C API numbers them: mirrors {@code fc_op_t} of {@code
 * fusedcomm.h} ({@code FC_OP_<name>}), the same names and {@link #code() values}, checked by a
 * unit test. Crosses the JNI where a call names an op (describeFusedOp, native timing).
 */
enum Op {
  ALL_GATHER(1, "allGather"),
  REDUCE_SCATTER(2, "reduceScatter"),
  ALL_REDUCE(3, "allReduce"),
  ALL_TO_ALL(4, "allToAll"),
  ALL_GATHER_GEMM(5, "allGatherGemm"),
  GEMM_REDUCE_SCATTER(6, "gemmReduceScatter"),
  GEMM_ALL_REDUCE(7, "gemmAllReduce"),
  MOE_DISPATCH_GEMM(8, "moeDispatchGemm"),
  MOE_COMBINE(9, "moeCombine"),
  RING_ATTENTION(10, "ringAttention");

  private final int code;
  private final String label;

  Op(int code, String label) {
    this.code = code;
    this.label = label;
  }

  /** The value of {@code FC_OP_<name>} in the native C API. */
  int code() {
    return code;
  }

  /** The op's name in the Java API and in messages ({@code allGather}, ...). */
  String label() {
    return label;
  }

  /** allGatherGemm, gemmReduceScatter or gemmAllReduce: the fused GEMM + communication ops. */
  boolean isFused() {
    return this == ALL_GATHER_GEMM || this == GEMM_REDUCE_SCATTER || this == GEMM_ALL_REDUCE;
  }

  /** The labels of the fused ops, in code order. */
  static List<String> fusedLabels() {
    List<String> labels = new ArrayList<>();
    for (Op op : values()) {
      if (op.isFused()) {
        labels.add(op.label);
      }
    }
    return List.copyOf(labels);
  }

  /** The fused op called {@code label}, or null. */
  static Op fusedByLabel(String label) {
    for (Op op : values()) {
      if (op.isFused() && op.label.equals(label)) {
        return op;
      }
    }
    return null;
  }
}
