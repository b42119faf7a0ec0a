package io.fusedcomm.api;

import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * What {@link HostTensor} and {@link DeviceTensor} share: the element type, the checked shape
 * and byte size, fixed at construction, and the {@link UseCount} that keeps the memory alive
 * while an op (or a view) uses it. Subclasses own the memory and free it in {@link #free}.
 */
abstract sealed class AbstractTensor implements Tensor permits HostTensor, DeviceTensor {
  private static final Logger LOG = LoggerFactory.getLogger(AbstractTensor.class);

  final DType dtype;
  final long[] shape;
  final long numel;
  final long byteSize;
  final UseCount uses = new UseCount();

  AbstractTensor(DType dtype, long[] shape) {
    this.dtype = Shapes.requireDtype(dtype);
    this.shape = Shapes.checked(shape);
    this.numel = Shapes.numel(this.shape);
    this.byteSize = Shapes.byteSize(dtype, this.shape);
  }

  @Override
  public DType dtype() {
    return dtype;
  }

  @Override
  public long[] shape() {
    return shape.clone();
  }

  @Override
  public int rank() {
    return shape.length;
  }

  @Override
  public long dim(int i) {
    return shape[i];
  }

  @Override
  public long numel() {
    return numel;
  }

  @Override
  public long byteSize() {
    return byteSize;
  }

  @Override
  public boolean isClosed() {
    return uses.isClosed();
  }

  /** The address of the first element; only valid between {@link #acquire} and {@link #release}. */
  abstract long address();

  /** Frees the memory; called exactly once, when the tensor is closed and nothing uses it. */
  abstract void free();

  /**
   * Holds the tensor for a native call and returns its address; throws {@link
   * IllegalStateException} once closed. Every acquire is paired with one {@link #release}.
   */
  final long acquire() {
    uses.acquire(this);
    try {
      return address();
    } catch (RuntimeException | Error e) {
      release();
      throw e;
    }
  }

  /**
   * Ends a hold. The last one after {@code close()} frees the memory here, on the op's thread; a
   * failure of that free belongs to the close, not to the op, so it is logged rather than thrown.
   */
  final void release() {
    if (uses.release()) {
      try {
        free();
      } catch (RuntimeException e) {
        LOG.warn("freeing {} after its last use failed", this, e);
      }
    }
  }

  /** Drops the owner's hold: frees now, or leaves the free to the last op or view still holding it. */
  final void closeUses() {
    if (uses.close()) {
      free();
    }
  }
}
