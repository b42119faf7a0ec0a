package io.fusedcomm.api;

/**
 * A dense row-major tensor in host memory ({@link HostTensor}) or GPU memory ({@link
 * DeviceTensor}). The host backend takes host tensors, the cuda backend device tensors.
 */
public interface Tensor {
  /** Element type. */
  DType dtype();

  /** A copy of the shape. */
  long[] shape();

  /** Number of dimensions. */
  int rank();

  /** Size of dimension {@code i}. */
  long dim(int i);

  /** Number of elements. */
  long numel();

  /** Size in bytes. */
  default long byteSize() {
    return numel() * dtype().bytes();
  }

  /** True for GPU memory. */
  boolean isDevice();

  /** Address of the first element. Internal: for the native library. */
  long address();

  /** Shape as text, e.g. {@code [512, 1024]}. */
  default String shapeString() {
    return java.util.Arrays.toString(shape());
  }
}
