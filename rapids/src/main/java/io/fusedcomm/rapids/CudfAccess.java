package io.fusedcomm.rapids;

/**
 * The few cuDF operations the adapter needs, on cuDF's objects passed as {@code Object}. {@link
 * ReflectiveCudf} implements them on the real classes where cuDF is on the classpath; tests
 * implement them on stand-ins, so the adapter's rules run without cuDF or a GPU.
 */
interface CudfAccess {
  /** The column's cuDF type id, e.g. {@code FLOAT32} ({@code DType.getTypeId().name()}). */
  String typeId(Object column);

  long rows(Object column);

  long nullCount(Object column);

  /** The device address of the column's data, 0 when it has none (no rows). */
  long dataAddress(Object column);

  /** The bytes of the column's data buffer. */
  long dataBytes(Object column);

  /** True for a {@code ColumnVector} (reference-counted), false for a bare view. */
  boolean isReferenceCounted(Object column);

  /** Takes one more reference to a {@code ColumnVector} ({@code incRefCount}); closing it drops it. */
  AutoCloseable retain(Object columnVector);

  /** The child (element) column of a {@code LIST} column ({@code getChildColumnView(0)}). */
  Object listChild(Object listColumn);

  /**
   * The smallest and the largest list length of a {@code LIST} column, computed by cuDF on the GPU
   * ({@code countElements()} and its {@code min()} / {@code max()}); two numbers come back.
   */
  long[] listLengthRange(Object listColumn);

  int columnCount(Object table);

  /** The table's column {@code i}, a {@code ColumnVector} the table owns. */
  Object column(Object table, int i);

  /** A new RMM device buffer ({@code DeviceMemoryBuffer.allocate}) and its address. */
  Object allocate(long bytes);

  long bufferAddress(Object buffer);

  /** Takes one more reference to a device buffer; closing it drops it. */
  AutoCloseable retainBuffer(Object buffer);

  /**
   * A new {@code ColumnVector} of type {@code typeId} and {@code rows} rows, no nulls, that takes
   * over one reference to {@code buffer} as its data.
   */
  Object newColumn(String typeId, long rows, Object buffer);
}
