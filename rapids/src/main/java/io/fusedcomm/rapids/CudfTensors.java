package io.fusedcomm.rapids;

import io.fusedcomm.api.DType;
import io.fusedcomm.api.DeviceTensor;
import java.util.Map;
import java.util.Set;

/**
 * cuDF columns and tables as fusedcomm device tensors, and tensors back as cuDF columns, on the
 * executor's GPU and without copies where the layout allows. cuDF's classes are passed as {@code
 * Object} (this module compiles and loads without cuDF; see {@link ReflectiveCudf}).
 *
 * <p>Types: fixed-width columns whose type an op takes: cuDF {@code FLOAT32} is {@link DType#F32},
 * {@code INT32} is {@link DType#I32}. Columns with nulls are refused (a tensor has no validity
 * mask: fill them first, e.g. {@code replaceNulls}), and so are empty ones.
 *
 * <p>Ownership, following cuDF's rules (a {@code Table} closes its columns; a {@code ColumnVector}
 * is reference-counted; a bare {@code ColumnView} owns nothing):
 *
 * <ul>
 *   <li>{@link #fromColumn}: the tensor borrows the column's data; the caller keeps the column
 *       (and the table it came from) open until the tensor is closed and its ops are done.
 *   <li>{@link #retainColumn}: the tensor takes its own reference to a {@code ColumnVector}
 *       ({@code incRefCount}) and drops it when its memory is released, so the table may be
 *       closed at any time after the call.
 *   <li>{@link #fromTable}: one column is {@link #retainColumn}; several are packed into a new
 *       row-major {@code rows × columns} tensor by the GPU ({@link DeviceTensor#packColumns}),
 *       which owns its memory; either way the table may be closed after the call.
 *   <li>{@link #fromListColumn}: a {@code LIST} column of equal-length lists (Spark's {@code
 *       array(f1, ..., fK)}) is already a row-major {@code rows × K} matrix in its child column:
 *       the tensor borrows that memory, without a copy, like {@link #fromColumn}.
 *   <li>{@link #newColumn}: a tensor in memory from RMM (the Accelerator's pool), to write a
 *       result into and hand to cuDF as a {@code ColumnVector} without a copy.
 * </ul>
 */
public final class CudfTensors {
  /** cuDF type id to tensor dtype, for the types the adapter takes. */
  static final Map<String, DType> DTYPES = Map.of("FLOAT32", DType.F32, "INT32", DType.I32);

  /**
   * Element types {@link #fromListColumn} takes, by tensor dtype. cuDF has no bfloat16 type: bf16
   * values travel as their 16-bit patterns in an {@code INT16} (Spark {@code smallint}) or {@code
   * UINT16} column.
   */
  static final Map<DType, Set<String>> LIST_ELEMENTS = Map.of(DType.F32, Set.of("FLOAT32"), DType.I32,
      Set.of("INT32"), DType.BF16, Set.of("INT16", "UINT16"));

  /** How tensors are made: the real {@link DeviceTensor}s, or stand-ins in tests. */
  interface TensorMaker<T> {
    T wrap(long address, DType dtype, long[] shape, AutoCloseable owner);

    T pack(DType dtype, long rows, long[] columns);
  }

  static final TensorMaker<DeviceTensor> DEVICE = new TensorMaker<>() {
    @Override
    public DeviceTensor wrap(long address, DType dtype, long[] shape, AutoCloseable owner) {
      return DeviceTensor.wrap(address, dtype, shape, owner);
    }

    @Override
    public DeviceTensor pack(DType dtype, long rows, long[] columns) {
      return DeviceTensor.packColumns(dtype, rows, columns);
    }
  };

  private CudfTensors() {}

  /**
   * A tensor of {@code rows} elements over the column's data, borrowed: the column stays the
   * caller's (see the class comment).
   *
   * @param column an {@code ai.rapids.cudf.ColumnView} or {@code ColumnVector}
   */
  public static DeviceTensor fromColumn(Object column) {
    return fromColumn(ReflectiveCudf.get(), DEVICE, column, false);
  }

  /**
   * A tensor of {@code rows} elements over the column's data, holding its own reference to the
   * column, released with the tensor's memory.
   *
   * @param columnVector an {@code ai.rapids.cudf.ColumnVector} (a bare view cannot be retained)
   */
  public static DeviceTensor retainColumn(Object columnVector) {
    return fromColumn(ReflectiveCudf.get(), DEVICE, columnVector, true);
  }

  /**
   * A {@code rows × K} row-major tensor over the elements of a {@code LIST} column whose lists
   * all have K elements (e.g. Spark's {@code array(f1, ..., fK)} as the RAPIDS Accelerator hands
   * it over): its child column holds exactly that matrix, so the tensor borrows the child's data
   * (no copy; the caller keeps the column open, as with {@link #fromColumn}).
   *
   * @param listColumn an {@code ai.rapids.cudf.ColumnView} of type {@code LIST}, no nulls at either
   *     level, not a slice
   * @param dtype the tensor's dtype: {@code F32} for {@code FLOAT32} elements, {@code I32} for
   *     {@code INT32}, {@code BF16} for bf16 bit patterns in {@code INT16} / {@code UINT16}
   */
  public static DeviceTensor fromListColumn(Object listColumn, DType dtype) {
    return fromListColumn(ReflectiveCudf.get(), DEVICE, listColumn, dtype);
  }

  /**
   * Column {@code i} of a cuDF {@code Table} ({@code getColumn(i)}: the table still owns it), for
   * code that compiles without cuDF.
   */
  public static Object column(Object table, int i) {
    CudfAccess cudf = ReflectiveCudf.get();
    int n = cudf.columnCount(table);
    if (i < 0 || i >= n) {
      throw new IllegalArgumentException("column " + i + " is not in a table of " + n + " columns");
    }
    return cudf.column(table, i);
  }

  /**
   * The device address of a column's data, for a {@code LIST} column that of its elements: what
   * {@link #fromColumn} and {@link #fromListColumn} wrap (to show that a tensor is the column's
   * memory, not a copy).
   */
  public static long dataAddress(Object column) {
    CudfAccess cudf = ReflectiveCudf.get();
    if (!"LIST".equals(cudf.typeId(column))) {
      return cudf.dataAddress(column);
    }
    Object child = cudf.listChild(column);
    try {
      return cudf.dataAddress(child);
    } finally {
      closeView(child);
    }
  }

  /**
   * Columns {@code columns} of {@code table} (all of them when none are named) as one tensor:
   * {@code [rows]} for one column (no copy), {@code [rows, columns]} row-major for several (packed
   * on the GPU). All columns must have the same type. The table may be closed after the call.
   *
   * @param table an {@code ai.rapids.cudf.Table}
   */
  public static DeviceTensor fromTable(Object table, int... columns) {
    return fromTable(ReflectiveCudf.get(), DEVICE, table, columns);
  }

  /**
   * An uninitialised {@code [rows]} tensor of {@code dtype} in memory from RMM (the RAPIDS
   * Accelerator's pool), for a result that goes back to cuDF through {@link
   * CudfColumnTensor#toColumnVector()}.
   */
  public static CudfColumnTensor newColumn(DType dtype, long rows) {
    return newColumn(ReflectiveCudf.get(), DEVICE, dtype, rows);
  }

  // ---- the rules, on any CudfAccess and TensorMaker --------------------------------------------

  static <T> T fromColumn(CudfAccess cudf, TensorMaker<T> maker, Object column, boolean retain) {
    DType dtype = checkedType(cudf, column, "column");
    long rows = cudf.rows(column);
    long address = cudf.dataAddress(column);
    long need = rows * dtype.bytes();
    if (cudf.dataBytes(column) < need) {
      throw new IllegalArgumentException("the column's data buffer has " + cudf.dataBytes(column) + " bytes for "
          + rows + " rows of " + dtype.label() + " (" + need + " bytes)");
    }
    if (!retain) {
      return maker.wrap(address, dtype, new long[] {rows}, null);
    }
    if (!cudf.isReferenceCounted(column)) {
      throw new IllegalArgumentException("a bare ColumnView owns nothing to retain: pass the ColumnVector it"
          + " views, or use fromColumn and keep the column open");
    }
    AutoCloseable reference = cudf.retain(column);
    try {
      return maker.wrap(address, dtype, new long[] {rows}, reference);
    } catch (RuntimeException | Error e) {
      closeQuietly(reference, e);
      throw e;
    }
  }

  static <T> T fromListColumn(CudfAccess cudf, TensorMaker<T> maker, Object column, DType dtype) {
    Set<String> elements = dtype == null ? null : LIST_ELEMENTS.get(dtype);
    if (elements == null) {
      throw new IllegalArgumentException("a list column becomes a tensor of " + LIST_ELEMENTS.keySet() + ", not "
          + (dtype == null ? "null" : dtype.label()));
    }
    String type = cudf.typeId(column);
    if (!"LIST".equals(type)) {
      throw new IllegalArgumentException("the column is " + type + ", not LIST (Spark: array(f1, ..., fK))");
    }
    long rows = cudf.rows(column);
    if (rows < 1) {
      throw new IllegalArgumentException("the list column has no rows");
    }
    if (cudf.nullCount(column) > 0) {
      throw new IllegalArgumentException("the list column has " + cudf.nullCount(column) + " null lists: a tensor"
          + " row cannot be null (filter them or fill them first)");
    }
    // The child view is cuDF's object (closed here); its data is the parent column's.
    Object child = cudf.listChild(column);
    try {
      String childType = cudf.typeId(child);
      if (!elements.contains(childType)) {
        throw new IllegalArgumentException("the lists hold " + childType + ": a " + dtype.label() + " tensor takes "
            + elements + " elements" + (dtype == DType.BF16 ? " (bf16 bit patterns)" : ""));
      }
      if (cudf.nullCount(child) > 0) {
        throw new IllegalArgumentException("the lists hold " + cudf.nullCount(child) + " null elements, which a tensor"
            + " cannot hold");
      }
      long[] range = cudf.listLengthRange(column);
      if (range[0] != range[1] || range[0] < 1) {
        throw new IllegalArgumentException("the lists have " + range[0] + " to " + range[1] + " elements: a tensor"
            + " needs them all of one length, at least 1");
      }
      long k = range[0];
      long childRows = cudf.rows(child);
      if (childRows != rows * k) {
        throw new IllegalArgumentException("the list column's child has " + childRows + " elements for " + rows
            + " lists of " + k + " (a slice of a larger column?): copy the slice first");
      }
      long need = childRows * dtype.bytes();
      if (cudf.dataBytes(child) < need || cudf.dataAddress(child) == 0) {
        throw new IllegalArgumentException("the list column's child data has " + cudf.dataBytes(child) + " bytes for "
            + childRows + " elements of " + dtype.label() + " (" + need + " bytes)");
      }
      return maker.wrap(cudf.dataAddress(child), dtype, new long[] {rows, k}, null);
    } finally {
      closeView(child);
    }
  }

  private static void closeView(Object view) {
    if (view instanceof AutoCloseable c) {
      try {
        c.close();
      } catch (Exception e) {
        throw new IllegalStateException("cuDF could not close a child column view", e);
      }
    }
  }

  static <T> T fromTable(CudfAccess cudf, TensorMaker<T> maker, Object table, int... columns) {
    int n = cudf.columnCount(table);
    int[] picked = columns == null || columns.length == 0 ? java.util.stream.IntStream.range(0, n).toArray() : columns;
    if (picked.length == 0) {
      throw new IllegalArgumentException("the table has no columns");
    }
    for (int c : picked) {
      if (c < 0 || c >= n) {
        throw new IllegalArgumentException("column " + c + " is not in a table of " + n + " columns");
      }
    }
    if (picked.length == 1) {
      return fromColumn(cudf, maker, cudf.column(table, picked[0]), true);
    }
    DType dtype = null;
    long rows = -1;
    long[] addresses = new long[picked.length];
    for (int i = 0; i < picked.length; i++) {
      Object column = cudf.column(table, picked[i]);
      DType t = checkedType(cudf, column, "column " + picked[i]);
      long r = cudf.rows(column);
      if (dtype != null && (t != dtype || r != rows)) {
        throw new IllegalArgumentException("column " + picked[i] + " is " + cudf.typeId(column) + " with " + r
            + " rows, column " + picked[0] + " " + dtype.label() + " with " + rows + ": packed columns share"
            + " one type and row count");
      }
      dtype = t;
      rows = r;
      addresses[i] = cudf.dataAddress(column);
    }
    return maker.pack(dtype, rows, addresses);
  }

  static CudfColumnTensor newColumn(CudfAccess cudf, TensorMaker<DeviceTensor> maker, DType dtype, long rows) {
    String typeId = columnType(dtype, rows);
    Object buffer = cudf.allocate(Math.multiplyExact(rows, (long) dtype.bytes()));
    return new CudfColumnTensor(cudf, wrapBuffer(cudf, maker, dtype, rows, buffer), typeId, rows, buffer);
  }

  /** The cuDF type id for a column of {@code dtype}, after checking {@code rows}. */
  static String columnType(DType dtype, long rows) {
    String typeId = DTYPES.entrySet().stream().filter(e -> e.getValue() == dtype).map(Map.Entry::getKey)
        .findFirst().orElseThrow(() -> new IllegalArgumentException("cuDF has no column type for "
            + (dtype == null ? "null" : dtype.label()) + ": columns are " + DTYPES.keySet()));
    if (rows < 1) {
      throw new IllegalArgumentException("a column tensor needs at least one row, got " + rows);
    }
    return typeId;
  }

  /**
   * A tensor over a new RMM buffer that takes over the buffer's first reference (closed with the
   * tensor's memory); on failure the buffer is closed.
   */
  static <T> T wrapBuffer(CudfAccess cudf, TensorMaker<T> maker, DType dtype, long rows, Object buffer) {
    AutoCloseable first = (AutoCloseable) buffer;
    try {
      return maker.wrap(cudf.bufferAddress(buffer), dtype, new long[] {rows}, first);
    } catch (RuntimeException | Error e) {
      closeQuietly(first, e);
      throw e;
    }
  }

  /**
   * A new cuDF column over {@code buffer} that holds a reference of its own (taken here, given
   * to the column); on failure that reference is dropped again.
   */
  static Object columnOf(CudfAccess cudf, Object buffer, String typeId, long rows) {
    AutoCloseable reference = cudf.retainBuffer(buffer);
    try {
      return cudf.newColumn(typeId, rows, buffer);
    } catch (RuntimeException | Error e) {
      closeQuietly(reference, e);
      throw e;
    }
  }

  private static DType checkedType(CudfAccess cudf, Object column, String what) {
    String typeId = cudf.typeId(column);
    DType dtype = DTYPES.get(typeId);
    if (dtype == null) {
      throw new IllegalArgumentException(what + " is " + typeId + ": a tensor takes " + DTYPES.keySet()
          + " columns (cast first, e.g. ColumnView.castTo(DType.FLOAT32))");
    }
    long nulls = cudf.nullCount(column);
    if (nulls > 0) {
      throw new IllegalArgumentException(what + " has " + nulls + " nulls, which a tensor cannot hold: replace"
          + " them first (ColumnView.replaceNulls) or filter the rows");
    }
    if (cudf.rows(column) < 1 || cudf.dataAddress(column) == 0) {
      throw new IllegalArgumentException(what + " has no rows");
    }
    return dtype;
  }

  static void closeQuietly(AutoCloseable c, Throwable into) {
    try {
      c.close();
    } catch (Exception e) {
      into.addSuppressed(e);
    }
  }
}
