package io.fusedcomm.api;

import io.fusedcomm.runtime.LeakTracker;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;

/**
 * A tensor in host memory allocated by the native runtime (64-byte aligned, zero-filled). It
 * owns its memory: close it (try-with-resources). Element access goes through a little-endian
 * {@link ByteBuffer} view, so a single tensor's view is limited to 2 GiB; ops themselves have no
 * such limit.
 */
public final class HostTensor extends AbstractTensor implements AutoCloseable {
  private final long leakId;
  private long address;
  private ByteBuffer view;

  private HostTensor(DType dtype, long[] shape) {
    super(dtype, shape);
    this.address = NativeOps.memAlloc(numel * dtype.bytes());
    this.leakId = LeakTracker.opened("HostTensor" + java.util.Arrays.toString(shape));
  }

  /** A zero-filled tensor. */
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
    t.buffer().asIntBuffer().put(values);
    return t;
  }

  /** Writes {@code values} into this floating-point tensor, rounding for bf16. */
  public void copyFrom(float[] values) {
    requireFloating();
    if (values.length != numel) {
      throw new IllegalArgumentException(values.length + " values for shape " + shapeString());
    }
    ByteBuffer b = buffer();
    if (dtype == DType.F32) {
      b.asFloatBuffer().put(values);
    } else {
      for (int i = 0; i < values.length; i++) {
        b.putShort(2 * i, Bf16.fromFloat(values[i]));
      }
    }
  }

  /** The elements widened to float. */
  public float[] toFloatArray() {
    requireFloating();
    float[] out = new float[Math.toIntExact(numel)];
    ByteBuffer b = buffer();
    if (dtype == DType.F32) {
      b.asFloatBuffer().get(out);
    } else {
      for (int i = 0; i < out.length; i++) {
        out[i] = Bf16.toFloat(b.getShort(2 * i));
      }
    }
    return out;
  }

  /** The elements of an {@link DType#I32} tensor. */
  public int[] toIntArray() {
    if (dtype != DType.I32) {
      throw new IllegalStateException("toIntArray on a " + dtype.label() + " tensor");
    }
    int[] out = new int[Math.toIntExact(numel)];
    buffer().asIntBuffer().get(out);
    return out;
  }

  /** Element {@code i} (flat index) widened to float. */
  public float getFloat(long i) {
    requireFloating();
    int at = Math.toIntExact(i);
    return dtype == DType.F32 ? buffer().getFloat(4 * at) : Bf16.toFloat(buffer().getShort(2 * at));
  }

  /** Sets every element to {@code value} (NaN is a good poison before an op). */
  public void fill(float value) {
    requireFloating();
    ByteBuffer b = buffer();
    for (int i = 0; i < numel; i++) {
      if (dtype == DType.F32) {
        b.putFloat(4 * i, value);
      } else {
        b.putShort(2 * i, Bf16.fromFloat(value));
      }
    }
  }

  /** A little-endian view of the memory, valid until {@link #close()}. */
  public synchronized ByteBuffer buffer() {
    checkOpen();
    if (view == null) {
      view = NativeOps.memView(address, byteSize()).order(ByteOrder.LITTLE_ENDIAN);
    }
    return view.duplicate().order(ByteOrder.LITTLE_ENDIAN);
  }

  private void requireFloating() {
    if (!dtype.isFloating()) {
      throw new IllegalStateException("float access on a " + dtype.label() + " tensor");
    }
  }

  private void checkOpen() {
    if (address == 0) {
      throw new IllegalStateException("the tensor is closed");
    }
  }

  @Override
  public boolean isDevice() {
    return false;
  }

  @Override
  public synchronized long address() {
    checkOpen();
    return address;
  }

  @Override
  public synchronized void close() {
    if (address != 0) {
      NativeOps.memFree(address);
      address = 0;
      view = null;
      LeakTracker.closed(leakId);
    }
  }

  @Override
  public String toString() {
    return "HostTensor[" + dtype.label() + " " + shapeString() + "]";
  }
}
