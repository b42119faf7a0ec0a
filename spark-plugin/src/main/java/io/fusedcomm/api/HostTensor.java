package io.fusedcomm.api;

import io.fusedcomm.runtime.LeakTracker;
import java.lang.ref.Cleaner;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.util.Objects;

/**
 * A tensor in host memory allocated by the native runtime (128-byte aligned, zero-filled). It
 * owns its memory: close it (try-with-resources). Ops use the memory where it lies (no copy).
 *
 * <p>Element access: the methods below (any size), or little-endian {@link ByteBuffer} views
 * over the same memory: {@link #buffer()} for the whole tensor up to 2 GiB - 1 bytes (a
 * ByteBuffer's limit; larger tensors are refused, never wrapped) and {@link #buffer(long, int)}
 * for a window of any tensor.
 *
 * <p>Lifetime and threads: {@link #close()} ends the tensor at once: ops and new views refuse it
 * with {@link IllegalStateException}. The memory itself lives on while something still uses it:
 * an op running on another thread (it is freed when that op returns) or a view obtained before
 * the close (it is freed when the tensor is closed and its views are garbage). A view so never
 * reads or writes freed memory, and ops still take the native address, with no copy: the
 * alternative, Java-owned direct buffers, are limited to 2 GiB each and count against the JVM's
 * direct-memory limit, and views cannot be invalidated once handed out.
 */
public final class HostTensor extends AbstractTensor implements AutoCloseable {
  /** Internal views cover 1 GiB each, so no element straddles two of them. */
  private static final int PAGE_SHIFT = 30;

  private static final long PAGE_BYTES = 1L << PAGE_SHIFT;

  private final long leakId;
  private final long address;  // valid while uses holds it
  private ByteBuffer[] pages;  // internal views, used only while held and never handed out; guarded by this
  private ByteBuffer view;  // the root of buffer()'s views, registered with VIEWS; guarded by this

  /** Frees the memory of a closed tensor when the last view handed out becomes unreachable. */
  private static final class Views {
    static final Cleaner CLEANER = Cleaner.create();
  }

  private HostTensor(DType dtype, long[] shape) {
    super(dtype, shape);
    this.address = NativeOps.memAlloc(byteSize);
    this.leakId = LeakTracker.opened("HostTensor" + java.util.Arrays.toString(shape));
  }

  /**
   * A zero-filled tensor.
   *
   * @throws IllegalArgumentException for a negative dimension, or a size in bytes that overflows
   *     a long or is more than the runtime allocates (1 TiB)
   */
  public static HostTensor allocate(DType dtype, long... shape) {
    return new HostTensor(dtype, shape);
  }

  /** A tensor holding {@code values} (rounded to bf16 for {@link DType#BF16}). */
  public static HostTensor of(float[] values, DType dtype, long... shape) {
    HostTensor t = new HostTensor(dtype, shape);
    if (values.length != t.numel) {
      t.close();
      throw new IllegalArgumentException(values.length + " values for shape " + t.shapeString());
    }
    t.copyFrom(values);
    return t;
  }

  /** An {@link DType#I32} tensor holding {@code values}. */
  public static HostTensor ofInts(int[] values, long... shape) {
    HostTensor t = new HostTensor(DType.I32, shape);
    if (values.length != t.numel) {
      t.close();
      throw new IllegalArgumentException(values.length + " values for shape " + t.shapeString());
    }
    t.eachPage((page, first, n) -> page.asIntBuffer().put(values, Math.toIntExact(first), n));
    return t;
  }

  /** Writes {@code values} into this floating-point tensor, rounding for bf16. */
  public void copyFrom(float[] values) {
    requireFloating();
    if (values.length != numel) {
      throw new IllegalArgumentException(values.length + " values for shape " + shapeString());
    }
    eachPage((page, first, n) -> {
      int from = Math.toIntExact(first);
      if (dtype == DType.F32) {
        page.asFloatBuffer().put(values, from, n);
      } else {
        for (int i = 0; i < n; i++) {
          page.putShort(2 * i, Bf16.fromFloat(values[from + i]));
        }
      }
    });
  }

  /** The elements widened to float. */
  public float[] toFloatArray() {
    requireFloating();
    float[] out = new float[arrayLength()];
    eachPage((page, first, n) -> {
      int to = Math.toIntExact(first);
      if (dtype == DType.F32) {
        page.asFloatBuffer().get(out, to, n);
      } else {
        for (int i = 0; i < n; i++) {
          out[to + i] = Bf16.toFloat(page.getShort(2 * i));
        }
      }
    });
    return out;
  }

  /** The elements of an {@link DType#I32} tensor. */
  public int[] toIntArray() {
    if (dtype != DType.I32) {
      throw new IllegalStateException("toIntArray on a " + dtype.label() + " tensor");
    }
    int[] out = new int[arrayLength()];
    eachPage((page, first, n) -> page.asIntBuffer().get(out, Math.toIntExact(first), n));
    return out;
  }

  /** Element {@code i} (flat index) widened to float. */
  public float getFloat(long i) {
    requireFloating();
    Objects.checkIndex(i, numel);
    long at = i * dtype.bytes();
    acquire();
    try {
      ByteBuffer page = page((int) (at >>> PAGE_SHIFT));
      int offset = (int) (at & (PAGE_BYTES - 1));
      return dtype == DType.F32 ? page.getFloat(offset) : Bf16.toFloat(page.getShort(offset));
    } finally {
      release();
    }
  }

  /** Sets every element to {@code value} (NaN is a good poison before an op). */
  public void fill(float value) {
    requireFloating();
    eachPage((page, first, n) -> {
      if (dtype == DType.F32) {
        for (int i = 0; i < n; i++) {
          page.putFloat(4 * i, value);
        }
      } else {
        short bits = Bf16.fromFloat(value);
        for (int i = 0; i < n; i++) {
          page.putShort(2 * i, bits);
        }
      }
    });
  }

  /**
   * A little-endian view of the whole memory. It stays valid after {@link #close()} (the memory
   * is freed once the tensor is closed and its views are garbage), but shows nothing an op writes
   * after the close.
   *
   * @throws IllegalStateException once closed, or when the tensor is larger than a ByteBuffer can
   *     view ({@link Integer#MAX_VALUE} bytes): use {@link #buffer(long, int)} then
   */
  public ByteBuffer buffer() {
    if (byteSize > Integer.MAX_VALUE) {
      throw new IllegalStateException(this + " is " + byteSize + " bytes, more than one ByteBuffer can view ("
          + Integer.MAX_VALUE + "): use buffer(offset, length) for windows of it");
    }
    synchronized (this) {
      if (view == null) {
        view = trackedView(0, (int) byteSize);
      }
      return view.duplicate().order(ByteOrder.LITTLE_ENDIAN);
    }
  }

  /**
   * A little-endian view of {@code length} bytes starting {@code offset} bytes into the memory,
   * for tensors of any size; it keeps the memory alive as {@link #buffer()} does.
   *
   * @throws IndexOutOfBoundsException unless {@code 0 <= offset <= offset + length <= byteSize()}
   * @throws IllegalStateException once closed
   */
  public ByteBuffer buffer(long offset, int length) {
    Objects.checkFromIndexSize(offset, length, byteSize);
    return trackedView(offset, length).order(ByteOrder.LITTLE_ENDIAN);
  }

  /** A view whose reachability holds the memory: released by the cleaner once it is garbage. */
  private ByteBuffer trackedView(long offset, int length) {
    acquire();
    try {
      ByteBuffer root = NativeOps.memView(address + offset, length);
      // Buffers derived from root (duplicates, slices, asFloatBuffer) reference it, so root
      // becomes unreachable only when all of them are.
      Views.CLEANER.register(root, this::release);
      return root;
    } catch (RuntimeException | Error e) {
      release();
      throw e;
    }
  }

  /** One internal view per GiB; the caller holds the tensor. */
  private synchronized ByteBuffer page(int p) {
    if (pages == null) {
      pages = new ByteBuffer[(int) ((byteSize + PAGE_BYTES - 1) >>> PAGE_SHIFT)];
    }
    if (pages[p] == null) {
      long start = (long) p << PAGE_SHIFT;
      pages[p] = NativeOps.memView(address + start, Math.min(PAGE_BYTES, byteSize - start))
          .order(ByteOrder.LITTLE_ENDIAN);
    }
    return pages[p];
  }

  /** What {@link #eachPage} runs on each internal view: {@code n} elements from flat index {@code first}. */
  @FunctionalInterface
  interface PageBody {
    void run(ByteBuffer page, long first, int n);
  }

  /** Runs {@code body} over the memory, one internal view at a time, holding the tensor. */
  void eachPage(PageBody body) {
    acquire();
    try {
      long perPage = PAGE_BYTES / dtype.bytes();
      for (long first = 0; first < numel; first += perPage) {
        body.run(page((int) (first / perPage)), first, (int) Math.min(perPage, numel - first));
      }
    } finally {
      release();
    }
  }

  private int arrayLength() {
    if (numel > Integer.MAX_VALUE - 8) {
      throw new IllegalStateException(this + " has " + numel + " elements, more than a Java array holds:"
          + " use buffer(offset, length) for windows of it");
    }
    return (int) numel;
  }

  private void requireFloating() {
    if (!dtype.isFloating()) {
      throw new IllegalStateException("float access on a " + dtype.label() + " tensor");
    }
  }

  @Override
  public boolean isDevice() {
    return false;
  }

  @Override
  long address() {
    return address;
  }

  @Override
  void free() {
    NativeOps.memFree(address);
  }

  /**
   * Ends the tensor: ops and new views refuse it from now on. The memory is freed now, or when
   * the op still using it on another thread returns, or when the views handed out are garbage.
   * Idempotent.
   */
  @Override
  public void close() {
    synchronized (this) {
      if (isClosed()) {
        return;
      }
      view = null;  // its derived buffers keep it reachable as long as they are
      pages = null;
    }
    LeakTracker.closed(leakId);
    closeUses();
  }

  @Override
  public String toString() {
    return "HostTensor[" + dtype.label() + " " + shapeString() + "]";
  }
}
