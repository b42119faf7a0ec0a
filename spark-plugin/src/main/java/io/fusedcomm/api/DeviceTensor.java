package io.fusedcomm.api;

import io.fusedcomm.runtime.LeakTracker;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.List;
import java.util.Set;
import java.util.WeakHashMap;
import jcuda.Pointer;

/**
 * A tensor in GPU memory: a device address, a dtype and a row-major shape. Device tensors are
 * what the cuda backend's ops take. Three ways to get one:
 *
 * <ul>
 *   <li>{@link #allocate}: the tensor owns new memory (cudaMalloc on the calling thread's current
 *       GPU, which the executor plugin pins to the executor's GPU) and frees it.
 *   <li>{@link #wrap(long, DType, long...)}: borrows memory someone else allocated and keeps
 *       alive, given as a raw device address: cuDF's {@code ColumnView.getData().getAddress()},
 *       RMM's {@code DeviceMemoryBuffer.getAddress()}, PyTorch's {@code tensor.data_ptr()}, a
 *       JCuda pointer ({@link #fromJCuda(Pointer, DType, long...)}). The tensor never frees it.
 *   <li>{@link #wrap(long, DType, long[], AutoCloseable)}: as {@code wrap}, and the tensor takes
 *       over an owner (e.g. the cuDF column or RMM buffer the address belongs to) and closes it
 *       when the memory is no longer used.
 * </ul>
 *
 * A wrapped address is checked through CUDA's pointer attributes: it must be GPU memory
 * (device or managed), the allocation holding it must be large enough for the shape where CUDA
 * knows its size, and each op checks that the tensor is on the communicator's GPU. No JCuda is
 * needed for any of this; JCuda users keep {@link #fromJCuda(Pointer, DType, long...)} and {@link
 * #pointer()}.
 *
 * <p>Lifetime: {@link #close()} ends the tensor at once (ops refuse it from then on). The memory
 * is released (freed, or the owner closed) only when nothing still uses it: an op running on
 * another thread releases it when it returns, and work that ops enqueued on CUDA streams with it
 * is waited for first (each communicator that did is synchronized), so no kernel of ours runs on
 * released memory. Work of the caller's own on its streams is the caller's to finish, as with
 * {@code cudaFree}. A borrowed address must stay valid until the tensor is closed and the ops
 * given it have completed (for ops on a caller's stream: until that stream has passed them).
 */
public final class DeviceTensor extends AbstractTensor implements AutoCloseable {
  private final long address;
  private final int device;
  private final boolean allocated;
  private final AutoCloseable owner;
  private final long leakId;
  /** Communicators whose ops were enqueued on a stream with this tensor; guarded by itself. */
  private final Set<Communicator> streamUsers = Collections.newSetFromMap(new WeakHashMap<>());

  /**
   * A tensor over {@code address} on GPU {@code device}; {@code allocated}: ours to free;
   * {@code owner}: closed on release (may be null). Checks nothing about the address: the
   * factories do.
   */
  DeviceTensor(long address, int device, DType dtype, long[] shape, boolean allocated, AutoCloseable owner) {
    super(dtype, shape);
    this.address = address;
    this.device = device;
    this.allocated = allocated;
    this.owner = owner;
    this.leakId = allocated || owner != null ? LeakTracker.opened("DeviceTensor" + Arrays.toString(shape)) : 0;
  }

  /**
   * Allocates uninitialised device memory for the shape on the calling thread's current GPU.
   *
   * @throws IllegalArgumentException for a negative dimension or a size in bytes that overflows a
   *     long (checked before anything is allocated)
   * @throws IllegalStateException when the GPU has not that much memory free
   * @throws io.fusedcomm.errors.BackendUnavailableException without a usable GPU
   */
  public static DeviceTensor allocate(DType dtype, long... shape) {
    long bytes = Shapes.byteSize(Shapes.requireDtype(dtype), Shapes.checked(shape));
    long address = NativeOps.deviceAlloc(bytes);
    try {
      return new DeviceTensor(address, (int) NativeOps.pointerInfo(address)[1], dtype, shape, true, null);
    } catch (RuntimeException | Error e) {
      NativeOps.deviceFree(address);
      throw e;
    }
  }

  /**
   * Borrows the GPU memory at {@code devicePtr}, which someone else allocated and keeps alive
   * (see the class comment for how long); the tensor never frees it.
   *
   * @param devicePtr the device address of the first element (e.g. cuDF's {@code
   *     getData().getAddress()}, PyTorch's {@code data_ptr()})
   * @throws IllegalArgumentException for a null address, an address that is not GPU memory, or an
   *     allocation smaller than the shape needs
   * @throws io.fusedcomm.errors.BackendUnavailableException without a usable GPU
   */
  public static DeviceTensor wrap(long devicePtr, DType dtype, long... shape) {
    return wrap(devicePtr, dtype, shape, null);
  }

  /**
   * As {@link #wrap(long, DType, long...)}, and the tensor takes over {@code owner}: it is closed
   * when the memory is released, after {@link #close()} once no op uses the tensor and the work
   * enqueued with it on CUDA streams is done. If the wrap itself fails, the owner stays the
   * caller's.
   *
   * @param owner what keeps the memory alive (a cuDF column, an RMM buffer, a close callback);
   *     null: none, as {@link #wrap(long, DType, long...)}. A failure of its {@code close()} is
   *     thrown by the tensor's {@code close()} when the release happens there, else logged.
   */
  public static DeviceTensor wrap(long devicePtr, DType dtype, long[] shape, AutoCloseable owner) {
    long bytes = Shapes.byteSize(Shapes.requireDtype(dtype), Shapes.checked(shape));
    return new DeviceTensor(devicePtr, checkedDevice(devicePtr, bytes), dtype, shape, false, owner);
  }

  /**
   * Borrows device memory the caller owns through JCuda; the tensor never frees it. Checked as
   * {@link #wrap(long, DType, long...)}. (A separate name, not a {@code wrap} overload, so that
   * code calling {@code wrap} compiles without JCuda on its classpath.)
   */
  public static DeviceTensor fromJCuda(Pointer devicePointer, DType dtype, long... shape) {
    if (devicePointer == null) {
      throw new IllegalArgumentException("pointer must not be null");
    }
    return wrap(JCudaInterop.address(devicePointer), dtype, shape);
  }

  /**
   * A new {@code rows × columns.length} row-major tensor whose column {@code c} is the {@code
   * rows} elements at device address {@code columns[c]}: columns as column stores keep them
   * (cuDF, Arrow on the GPU), packed into the row-major layout the ops take. The GPU interleaves
   * them (one strided device-to-device copy per column; nothing passes through the host). The
   * columns are only read, and may be freed once this returns. Synchronous.
   *
   * @throws IllegalArgumentException for no columns, a negative row count, or an address that
   *     is not GPU memory holding {@code rows} elements
   */
  public static DeviceTensor packColumns(DType dtype, long rows, long... columns) {
    if (columns == null || columns.length == 0) {
      throw new IllegalArgumentException("packColumns needs at least one column");
    }
    long bytes = Shapes.byteSize(Shapes.requireDtype(dtype), Shapes.checked(new long[] {rows}));
    int[] devices = new int[columns.length];
    for (int c = 0; c < columns.length; c++) {
      devices[c] = checkedDevice(columns[c], bytes);
    }
    DeviceTensor out = allocate(dtype, rows, columns.length);
    try {
      long es = dtype.bytes();
      for (int c = 0; c < columns.length; c++) {
        if (devices[c] != out.device) {
          throw new IllegalArgumentException("column " + c + " is on GPU " + devices[c] + ", but the packed tensor"
              + " is allocated on the current GPU " + out.device);
        }
        NativeOps.deviceCopy2d(out.address + c * es, columns.length * es, columns[c], es, es, rows);
      }
      return out;
    } catch (RuntimeException | Error e) {
      out.close();
      throw e;
    }
  }

  /** The GPU of the memory at {@code address}, after checking it can hold {@code bytes}. */
  private static int checkedDevice(long address, long bytes) {
    if (address == 0) {
      throw new IllegalArgumentException("a device tensor cannot wrap the null address");
    }
    long[] info = NativeOps.pointerInfo(address);
    MemoryType type = MemoryType.fromCode(info[0]);
    String at = "0x" + Long.toHexString(address);
    if (type != MemoryType.DEVICE && type != MemoryType.MANAGED) {
      throw new IllegalArgumentException(at + " is " + (type == MemoryType.HOST ? "page-locked host memory"
          : "not memory CUDA knows (pageable host memory, or no memory at all)")
          + ", not GPU memory: a DeviceTensor wraps device or managed memory (use HostTensor for host data)");
    }
    long base = info[2];
    long size = info[3];
    if (size > 0 && bytes > base + size - address) {
      throw new IllegalArgumentException("the allocation holding " + at + " has " + (base + size - address)
          + " bytes from there, but the tensor needs " + bytes);
    }
    return (int) info[1];
  }

  /** Copies a host tensor of the same dtype and size into this one (synchronous). */
  public void copyFrom(HostTensor src) {
    copy(src, true);
  }

  /** Copies this tensor into a host tensor of the same dtype and size (synchronous). */
  public void copyTo(HostTensor dst) {
    copy(dst, false);
  }

  /** Both tensors are held for the copy. */
  private void copy(HostTensor host, boolean toDevice) {
    if (host == null || host.dtype() != dtype || host.numel() != numel) {
      throw new IllegalArgumentException(
          "copy between " + this + " and " + host + ": dtype and element count must match");
    }
    long d = acquire();
    try {
      long h = host.acquire();
      try {
        if (toDevice) {
          NativeOps.deviceCopy(d, h, byteSize);
        } else {
          NativeOps.deviceCopy(h, d, byteSize);
        }
      } finally {
        host.release();
      }
    } finally {
      release();
    }
  }

  /**
   * The device address of the first element, for the caller's own CUDA code (cuDF, PyTorch,
   * kernels of its own): valid until {@link #close()}, and not kept alive by the tensor after.
   *
   * @throws IllegalStateException once closed
   */
  public long devicePointer() {
    if (isClosed()) {
      throw new IllegalStateException(this + " is closed");
    }
    return address;
  }

  /** The GPU the memory is on (the process's CUDA device ordinal). */
  public int device() {
    return device;
  }

  /**
   * {@link #devicePointer()} as a JCuda pointer, for the caller's own JCuda code (needs JCuda on
   * the classpath).
   *
   * @throws IllegalStateException once closed
   */
  public Pointer pointer() {
    return JCudaInterop.pointer(devicePointer());
  }

  @Override
  public boolean isDevice() {
    return true;
  }

  @Override
  long address() {
    return address;
  }

  /** Records that {@code comm} enqueued an op using this tensor on a CUDA stream. */
  void enqueuedBy(Communicator comm) {
    synchronized (streamUsers) {
      streamUsers.add(comm);
    }
  }

  /**
   * Waits for the work that communicators enqueued with this tensor, then releases the memory:
   * frees it (allocated) or closes the owner. A failure that the wait reports is thrown after
   * the release: the wait ends either way (every wait of our kernels is bounded).
   */
  @Override
  void free() {
    if (!allocated && owner == null) {
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
        failure = first(failure, e);
      }
    }
    try {
      if (allocated) {
        NativeOps.deviceFree(address);
      } else {
        owner.close();
      }
    } catch (RuntimeException e) {
      failure = first(failure, e);
    } catch (Exception e) {
      failure = first(failure, new IllegalStateException("closing the owner of " + this + " failed", e));
    }
    if (failure != null) {
      throw failure;
    }
  }

  private static RuntimeException first(RuntimeException failure, RuntimeException e) {
    if (failure == null) {
      return e;
    }
    failure.addSuppressed(e);
    return failure;
  }

  /**
   * Ends the tensor: ops refuse it from now on. Its memory is released now, after the work
   * enqueued with it on CUDA streams is done, or when an op still using it on another thread
   * returns. Idempotent.
   */
  @Override
  public void close() {
    if (isClosed()) {
      return;
    }
    if (leakId != 0) {
      LeakTracker.closed(leakId);
    }
    closeUses();
  }

  @Override
  public String toString() {
    return "DeviceTensor[" + dtype.label() + " " + shapeString() + ", GPU " + device
        + (allocated ? "" : owner != null ? ", wrapped with its owner" : ", borrowed") + "]";
  }
}
