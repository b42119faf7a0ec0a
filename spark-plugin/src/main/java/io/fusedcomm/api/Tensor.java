package io.fusedcomm.api;

/**
 * A dense row-major tensor in host memory ({@link HostTensor}) or GPU memory ({@link
 * DeviceTensor}). The host backend takes host tensors, the cuda backend device tensors.
 *
 * <p>Sealed: ops hand a tensor's memory to native code, so only the project's own tensor
 * classes, which own that memory and keep it alive while an op uses it, can be passed to them.
 * Its memory address is not part of the API.
 */
public sealed interface Tensor permits AbstractTensor {
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

  /** Size in bytes (checked at construction to fit in a {@code long}). */
  long byteSize();

  /** True for GPU memory. */
  boolean isDevice();

  /** True once {@code close()} was called; ops then refuse the tensor. */
  boolean isClosed();

  /** Shape as text, e.g. {@code [512, 1024]}. */
  default String shapeString() {
    return java.util.Arrays.toString(shape());
  }
}
