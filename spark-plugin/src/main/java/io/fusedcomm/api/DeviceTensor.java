package io.fusedcomm.api;

import io.fusedcomm.runtime.LeakTracker;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Set;
import java.util.WeakHashMap;
import jcuda.Pointer;
import jcuda.runtime.JCuda;
import jcuda.runtime.cudaMemcpyKind;

/**
 * A tensor in GPU memory, held as a JCuda {@link Pointer}. {@link #allocate} owns its memory
 * (cudaMalloc on the calling thread's current device, which the executor plugin pins to the
 * executor's GPU); {@link #wrap} borrows a pointer the caller owns, e.g. from JCuda code of the
 * user's own, and never frees it. Device tensors are what the cuda backend's ops take.
 *
 * <p>Lifetime: {@link #close()} ends the tensor at once (ops refuse it from then on). An owned
 * tensor's memory is freed only when nothing still uses it: an op running on another thread
 * frees it when it returns, and work that ops enqueued on CUDA streams with it is waited for
 * first (each communicator that did is synchronized), so no kernel of ours runs on freed memory.
 * Work of the caller's own on its streams is the caller's to finish, as with {@code cudaFree}.
 */
public final class DeviceTensor extends AbstractTensor implements AutoCloseable {
  private final boolean owned;
  private final long leakId;
  private final Pointer pointer;
  private long address;  // cached: a tensor's pointer never changes; guarded by this
  /** Communicators whose ops were enqueued on a stream with this tensor; guarded by itself. */
  private final Set<Communicator> streamUsers = Collections.newSetFromMap(new WeakHashMap<>());

  private DeviceTensor(Pointer pointer, DType dtype, long[] shape, boolean owned) {
    super(dtype, shape);
    this.pointer = pointer;
    this.owned = owned;
    this.leakId = owned ? LeakTracker.opened("DeviceTensor" + java.util.Arrays.toString(shape)) : 0;
  }

  /**
   * Allocates uninitialised device memory for the shape.
   *
   * @throws IllegalArgumentException for a negative dimension or a size in bytes that overflows a
   *     long (checked before anything is allocated)
   */
  public static DeviceTensor allocate(DType dtype, long... shape) {
    long bytes = Shapes.byteSize(Shapes.requireDtype(dtype), Shapes.checked(shape));
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
    copy(src, cudaMemcpyKind.cudaMemcpyHostToDevice);
  }

  /** Copies this tensor into a host tensor of the same dtype and size (synchronous). */
  public void copyTo(HostTensor dst) {
    copy(dst, cudaMemcpyKind.cudaMemcpyDeviceToHost);
  }

  /** Both tensors are held for the copy, which goes one host view (at most 1 GiB) at a time. */
  private void copy(HostTensor host, int kind) {
    if (host == null || host.dtype() != dtype || host.numel() != numel) {
      throw new IllegalArgumentException(
          "copy between " + this + " and " + host + ": dtype and element count must match");
    }
    acquire();
    try {
      long esize = dtype.bytes();
      host.eachPage((page, first, n) -> {
        Pointer device = pointer.withByteOffset(first * esize);
        Pointer hostPart = Pointer.to(page);
        if (kind == cudaMemcpyKind.cudaMemcpyHostToDevice) {
          JCuda.cudaMemcpy(device, hostPart, n * esize, kind);
        } else {
          JCuda.cudaMemcpy(hostPart, device, n * esize, kind);
        }
      });
    } finally {
      release();
    }
  }

  /**
   * The JCuda pointer, for the caller's own JCuda code. It is a raw device pointer: valid until
   * {@link #close()}, and not kept alive by the tensor after that.
   *
   * @throws IllegalStateException once closed
   */
  public Pointer pointer() {
    if (isClosed()) {
      throw new IllegalStateException(this + " is closed");
    }
    return pointer;
  }

  @Override
  public boolean isDevice() {
    return true;
  }

  @Override
  synchronized long address() {
    if (address == 0) {
      address = NativeOps.pointerAddress(pointer);
    }
    return address;
  }

  /** Records that {@code comm} enqueued an op using this tensor on a CUDA stream. */
  void enqueuedBy(Communicator comm) {
    synchronized (streamUsers) {
      streamUsers.add(comm);
    }
  }

  /**
   * Waits for the work that communicators enqueued with this tensor, then frees the memory (an
   * owned tensor's). A failure that the wait reports is thrown after the free: the wait ends
   * either way (every wait of our kernels is bounded).
   */
  @Override
  void free() {
    if (!owned) {
      return;
    }
    List<Communicator> users;
    synchronized (streamUsers) {
      users = new ArrayList<>(streamUsers);
      streamUsers.clear();
    }
    RuntimeException failure = null;
    for (Communicator c : users) {
      try {
        c.synchronizeIfOpen();
      } catch (RuntimeException e) {
        if (failure == null) {
          failure = e;
        } else {
          failure.addSuppressed(e);
        }
      }
    }
    JCuda.cudaFree(pointer);
    if (failure != null) {
      throw failure;
    }
  }

  /**
   * Ends the tensor: ops refuse it from now on. An owned tensor's memory is freed now, after the
   * work enqueued with it on CUDA streams is done, or when an op still using it on another
   * thread returns. Idempotent.
   */
  @Override
  public void close() {
    if (isClosed()) {
      return;
    }
    if (owned) {
      LeakTracker.closed(leakId);
    }
    closeUses();
  }

  @Override
  public String toString() {
    return "DeviceTensor[" + dtype.label() + " " + shapeString() + (owned ? "" : ", borrowed") + "]";
  }
}
