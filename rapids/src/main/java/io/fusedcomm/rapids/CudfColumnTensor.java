package io.fusedcomm.rapids;

import io.fusedcomm.api.DeviceTensor;

/**
 * A device tensor in RMM memory (from {@link CudfTensors#newColumn}) that becomes a cuDF column
 * without a copy: write a result into {@link #tensor()}, then {@link #toColumnVector()}. The
 * memory is freed when both the tensor and every column made from it are closed.
 */
public final class CudfColumnTensor implements AutoCloseable {
  private final CudfAccess cudf;
  private final DeviceTensor tensor;
  private final String typeId;
  private final long rows;
  private final Object buffer;

  CudfColumnTensor(CudfAccess cudf, DeviceTensor tensor, String typeId, long rows, Object buffer) {
    this.cudf = cudf;
    this.tensor = tensor;
    this.typeId = typeId;
    this.rows = rows;
    this.buffer = buffer;
  }

  /** The tensor over the column's memory, for ops to write into. */
  public DeviceTensor tensor() {
    return tensor;
  }

  /**
   * A new {@code ai.rapids.cudf.ColumnVector} over the tensor's memory (no nulls), with its own
   * reference to the memory: the caller closes it; it stays valid after this object is closed.
   * Call it once the ops writing the tensor are done (for ops on a stream: synchronized).
   *
   * @throws IllegalStateException once the tensor is closed
   */
  public Object toColumnVector() {
    if (tensor.isClosed()) {
      throw new IllegalStateException("the column tensor is closed");
    }
    return CudfTensors.columnOf(cudf, buffer, typeId, rows);
  }

  /** Closes the tensor (its reference to the memory). */
  @Override
  public void close() {
    tensor.close();
  }
}
