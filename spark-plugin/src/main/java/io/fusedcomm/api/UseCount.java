package io.fusedcomm.api;

/**
 * Who still uses one native resource (a tensor's memory, a MoE layout): its owner until {@code
 * close()}, each op running on it, and each live view of it. The resource is freed exactly once,
 * by whichever of these lets go last, so no thread can free it while native code reads it.
 *
 * <p>{@link #acquire} refuses a closed resource, so nothing new starts on it after {@code
 * close()}; {@link #release} and {@link #close} return true to the one caller that must free it.
 * Nothing here waits: a {@code close()} racing an op on another thread returns at once and the
 * op, bounded by {@code spark.fusedcomm.timeout}, frees the memory when it returns.
 */
final class UseCount {
  private int holds = 1;  // the owner's, dropped by close()
  private boolean closed;

  /**
   * Adds a use; throws {@link IllegalStateException} naming {@code what} once closed.
   *
   * @param what the resource as a user knows it, e.g. {@code HostTensor[f32 [4, 8]]}
   */
  synchronized void acquire(Object what) {
    if (closed) {
      throw new IllegalStateException(what + " is closed");
    }
    holds++;
  }

  /** Drops a use taken by {@link #acquire}; true when the caller must now free the resource. */
  synchronized boolean release() {
    if (holds <= 0) {
      throw new IllegalStateException("a use of a native resource was released twice");
    }
    return --holds == 0;
  }

  /**
   * Forbids new uses and drops the owner's; true when the caller must now free the resource
   * (nothing else used it), false when it is already closed or the last use will free it.
   */
  synchronized boolean close() {
    if (closed) {
      return false;
    }
    closed = true;
    return --holds == 0;
  }

  synchronized boolean isClosed() {
    return closed;
  }

  /** True while anything besides the owner (an op, a view) still uses the resource. */
  synchronized boolean inUse() {
    return holds > (closed ? 0 : 1);
  }
}
