package io.fusedcomm.api;

import io.fusedcomm.runtime.LeakTracker;
import jcuda.Pointer;
import jcuda.runtime.JCuda;
import jcuda.runtime.cudaMemcpyKind;

/**
 * A tensor in GPU memory, held as a JCuda {@link Pointer}. {@link #allocate} owns its memory
 * (cudaMalloc on the calling thread's current device, which the executor plugin pins to the
 * executor's GPU); {@link #wrap} borrows a pointer the caller owns, e.g. from JCuda code of the
 * user's own, and never frees it. Device tensors are what the cuda backend's ops take.
 */
public final class DeviceTensor extends AbstractTensor implements AutoCloseable {
  private final boolean owned;
  private final long leakId;
  private Pointer pointer;
  private long address;  // cached: a tensor's pointer never changes

  private DeviceTensor(Pointer pointer, DType dtype, long[] shape, boolean owned) {
    super(dtype, shape);
    this.pointer = pointer;
    this.owned = owned;
    this.leakId = owned ? LeakTracker.opened("DeviceTensor" + java.util.Arrays.toString(shape)) : 0;
  }

  /** Allocates uninitialised device memory for the shape. */
  public static DeviceTensor allocate(DType dtype, long... shape) {
    if (dtype == null) {
      throw new IllegalArgumentException("dtype must not be null");
    }
    long bytes = Shapes.numel(Shapes.checked(shape)) * dtype.bytes();
    Pointer p = new Pointer();
    JCuda.setExceptionsEnabled(true);
    JCuda.cudaMalloc(p, Math.max(bytes, 1));
    return new DeviceTensor(p, dtype, shape, true);
  }

  /** Borrows device memory the caller owns; the tensor never frees it. */
  public static DeviceTensor wrap(Pointer devicePointer, DType dtype, long... shape) {
    if (devicePointer == null || dtype == null) {
      throw new IllegalArgumentException("pointer and dtype must not be null");
    }
    return new DeviceTensor(devicePointer, dtype, shape, false);
  }

  /** Copies a host tensor of the same dtype and size into this one (synchronous). */
  public void copyFrom(HostTensor src) {
    checkSameSize(src);
    JCuda.cudaMemcpy(pointer(), Pointer.to(src.buffer()), byteSize(), cudaMemcpyKind.cudaMemcpyHostToDevice);
  }

  /** Copies this tensor into a host tensor of the same dtype and size (synchronous). */
  public void copyTo(HostTensor dst) {
    checkSameSize(dst);
    JCuda.cudaMemcpy(Pointer.to(dst.buffer()), pointer(), byteSize(), cudaMemcpyKind.cudaMemcpyDeviceToHost);
  }

  private void checkSameSize(HostTensor other) {
    if (other.dtype() != dtype || other.numel() != numel) {
      throw new IllegalArgumentException(
          "copy between " + this + " and " + other + ": dtype and element count must match");
    }
  }

  /** The JCuda pointer (valid until {@link #close()}). */
  public synchronized Pointer pointer() {
    if (pointer == null) {
      throw new IllegalStateException("the device tensor is closed");
    }
    return pointer;
  }

  @Override
  public boolean isDevice() {
    return true;
  }

  @Override
  public synchronized long address() {
    if (address == 0) {
      address = NativeOps.pointerAddress(pointer());
    }
    return address;
  }

  @Override
  public synchronized void close() {
    if (pointer != null) {
      if (owned) {
        JCuda.cudaFree(pointer);
        LeakTracker.closed(leakId);
      }
      pointer = null;
      address = 0;
    }
  }

  @Override
  public String toString() {
    return "DeviceTensor[" + dtype.label() + " " + shapeString() + (owned ? "" : ", borrowed") + "]";
  }
}
