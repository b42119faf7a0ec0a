package io.fusedcomm.api;

import java.util.ArrayList;
import java.util.List;

/**
 * One op call, from its first check to its return (try-with-resources). On a communicator it
 * holds the communicator's op slot for the calling thread ({@link Communicator} refuses a second
 * thread meanwhile: ranks pair ops by their order, so overlapping calls would pair wrongly). It
 * holds every tensor and MoE dispatch whose native address or handle it hands out, so a {@code
 * close()} on another thread cannot free memory under the op, and releases them when it ends.
 */
final class OpCall implements AutoCloseable {
  final String op;
  final Thread thread = Thread.currentThread();
  /** When the call began (its checks included), for the op's time. */
  final long startNanos = System.nanoTime();
  private final Communicator comm;  // null for the single-rank gemm
  private final boolean onStream;
  private final List<AbstractTensor> tensors = new ArrayList<>(6);
  private final List<MoeDispatch> dispatches = new ArrayList<>(1);

  OpCall(Communicator comm, String op, boolean onStream) {
    this.comm = comm;
    this.op = op;
    this.onStream = onStream;
  }

  /**
   * The address of {@code t} (0 for null), held until the call ends; a device tensor used by an
   * op enqueued on a stream remembers the communicator, whose work its close waits for.
   *
   * @throws IllegalStateException if {@code t} is closed
   */
  long address(Tensor t) {
    if (t == null) {
      return 0;
    }
    AbstractTensor a = (AbstractTensor) t;  // Tensor is sealed: always one of ours
    long address = a.acquire();
    tensors.add(a);
    if (onStream && comm != null && a instanceof DeviceTensor d) {
      d.enqueuedBy(comm);
    }
    return address;
  }

  /** The native handle of {@code d}, held until the call ends. */
  long handle(MoeDispatch d) {
    long h = d.acquire();
    dispatches.add(d);
    return h;
  }

  @Override
  public void close() {
    try {
      for (int i = tensors.size() - 1; i >= 0; i--) {
        tensors.get(i).release();
      }
      for (MoeDispatch d : dispatches) {
        d.release();
      }
    } finally {
      if (comm != null) {
        comm.leave(this);
      }
    }
  }
}
