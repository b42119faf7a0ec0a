package io.fusedcomm.api;

/**
 * What {@link HostTensor} and {@link DeviceTensor} share: the element type and the checked
 * shape, fixed at construction. Subclasses own the memory and its lifetime.
 */
abstract class AbstractTensor implements Tensor {
  final DType dtype;
  final long[] shape;
  final long numel;

  AbstractTensor(DType dtype, long[] shape) {
    if (dtype == null) {
      throw new IllegalArgumentException("dtype must not be null");
    }
    this.dtype = dtype;
    this.shape = Shapes.checked(shape);
    this.numel = Shapes.numel(this.shape);
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
}
