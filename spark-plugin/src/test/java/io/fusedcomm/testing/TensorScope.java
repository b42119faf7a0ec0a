package io.fusedcomm.testing;

import io.fusedcomm.api.DType;
import io.fusedcomm.api.HostTensor;
import java.util.ArrayList;
import java.util.List;

/** Host tensors of one test body, all closed together. */
public final class TensorScope implements AutoCloseable {
  private final List<HostTensor> tensors = new ArrayList<>();

  /** A tensor holding {@code values}. */
  public HostTensor of(float[] values, DType dtype, long... shape) {
    return keep(HostTensor.of(values, dtype, shape));
  }

  /** An I32 tensor holding {@code values}. */
  public HostTensor ints(int[] values, long... shape) {
    return keep(HostTensor.ofInts(values, shape));
  }

  /** A floating-point tensor filled with NaN, the poison an op must overwrite. */
  public HostTensor poisoned(DType dtype, long... shape) {
    HostTensor t = keep(HostTensor.allocate(dtype, shape));
    t.fill(Float.NaN);
    return t;
  }

  /** A zero-filled tensor. */
  public HostTensor zeros(DType dtype, long... shape) {
    return keep(HostTensor.allocate(dtype, shape));
  }

  private HostTensor keep(HostTensor t) {
    tensors.add(t);
    return t;
  }

  @Override
  public void close() {
    for (HostTensor t : tensors) {
      t.close();
    }
    tensors.clear();
  }
}
