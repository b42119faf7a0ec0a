package io.fusedcomm.rapids;

import java.lang.reflect.InvocationTargetException;
import java.lang.reflect.Method;
import java.util.Optional;

/**
 * {@link CudfAccess} on the real cuDF classes, found by name in the application's class loader:
 * {@code ai.rapids.cudf.ColumnView}, {@code ColumnVector}, {@code Table}, {@code DType}, {@code
 * DeviceMemoryBuffer}, {@code BaseDeviceMemoryBuffer}. Loaded on first use only; without cuDF it
 * fails with a sentence saying which jar to add.
 */
final class ReflectiveCudf implements CudfAccess {
  private static volatile ReflectiveCudf instance;

  private final Class<?> columnView;
  private final Class<?> columnVector;
  private final Class<?> dtype;
  private final Class<?> deviceBuffer;
  private final Method getType;
  private final Method getTypeId;
  private final Method getRowCount;
  private final Method getNullCount;
  private final Method getData;
  private final Method getAddress;
  private final Method getLength;
  private final Method incRefCount;
  private final Method getNumberOfColumns;
  private final Method getColumn;
  private final Method allocate;
  private final Method bufferIncRefCount;
  private final Method getChildColumnView;
  private final Method countElements;
  private final Method min;
  private final Method max;
  private final Method scalarGetInt;

  private ReflectiveCudf(ClassLoader loader) throws ReflectiveOperationException {
    columnView = Class.forName("ai.rapids.cudf.ColumnView", false, loader);
    columnVector = Class.forName("ai.rapids.cudf.ColumnVector", false, loader);
    Class<?> table = Class.forName("ai.rapids.cudf.Table", false, loader);
    dtype = Class.forName("ai.rapids.cudf.DType", false, loader);
    deviceBuffer = Class.forName("ai.rapids.cudf.DeviceMemoryBuffer", false, loader);
    Class<?> baseBuffer = Class.forName("ai.rapids.cudf.BaseDeviceMemoryBuffer", false, loader);
    getType = columnView.getMethod("getType");
    getTypeId = dtype.getMethod("getTypeId");
    getRowCount = columnView.getMethod("getRowCount");
    getNullCount = columnView.getMethod("getNullCount");
    getData = columnView.getMethod("getData");
    getAddress = baseBuffer.getMethod("getAddress");
    getLength = baseBuffer.getMethod("getLength");
    incRefCount = columnVector.getMethod("incRefCount");
    getNumberOfColumns = table.getMethod("getNumberOfColumns");
    getColumn = table.getMethod("getColumn", int.class);
    allocate = deviceBuffer.getMethod("allocate", long.class);
    bufferIncRefCount = deviceBuffer.getMethod("incRefCount");
    getChildColumnView = columnView.getMethod("getChildColumnView", int.class);
    countElements = columnView.getMethod("countElements");
    min = columnView.getMethod("min");
    max = columnView.getMethod("max");
    scalarGetInt = Class.forName("ai.rapids.cudf.Scalar", false, loader).getMethod("getInt");
  }

  /** The access for the calling thread's class loader (cuDF comes with the application). */
  static ReflectiveCudf get() {
    ReflectiveCudf r = instance;
    if (r == null) {
      synchronized (ReflectiveCudf.class) {
        if (instance == null) {
          ClassLoader loader = Thread.currentThread().getContextClassLoader();
          try {
            instance = new ReflectiveCudf(loader != null ? loader : ReflectiveCudf.class.getClassLoader());
          } catch (ReflectiveOperationException | LinkageError e) {
            throw new IllegalStateException("cuDF is not on the classpath (or not a version with the"
                + " ColumnView/Table API this module uses): run with the RAPIDS Accelerator's jar"
                + " (com.nvidia:rapids-4-spark_2.13), which carries ai.rapids.cudf (" + e + ")", e);
          }
        }
        r = instance;
      }
    }
    return r;
  }

  private static Object call(Method m, Object target, Object... args) {
    try {
      return m.invoke(target, args);
    } catch (InvocationTargetException e) {
      Throwable cause = e.getCause();
      if (cause instanceof RuntimeException re) {
        throw re;
      }
      if (cause instanceof Error err) {
        throw err;
      }
      throw new IllegalStateException("cuDF's " + m.getName() + " failed", cause);
    } catch (IllegalAccessException e) {
      throw new IllegalStateException("cannot call cuDF's " + m.getName(), e);
    }
  }

  private Object view(Object column) {
    if (!columnView.isInstance(column)) {
      throw new IllegalArgumentException("expected an ai.rapids.cudf.ColumnView (or ColumnVector), got "
          + (column == null ? "null" : column.getClass().getName()));
    }
    return column;
  }

  @Override
  public String typeId(Object column) {
    return ((Enum<?>) call(getTypeId, call(getType, view(column)))).name();
  }

  @Override
  public long rows(Object column) {
    return (Long) call(getRowCount, view(column));
  }

  @Override
  public long nullCount(Object column) {
    return (Long) call(getNullCount, view(column));
  }

  @Override
  public long dataAddress(Object column) {
    Object data = call(getData, view(column));
    return data == null ? 0 : (Long) call(getAddress, data);
  }

  @Override
  public long dataBytes(Object column) {
    Object data = call(getData, view(column));
    return data == null ? 0 : (Long) call(getLength, data);
  }

  @Override
  public boolean isReferenceCounted(Object column) {
    return columnVector.isInstance(column);
  }

  @Override
  public AutoCloseable retain(Object column) {
    return (AutoCloseable) call(incRefCount, column);
  }

  @Override
  public Object listChild(Object listColumn) {
    return call(getChildColumnView, view(listColumn), 0);
  }

  @Override
  public long[] listLengthRange(Object listColumn) {
    // countElements: a new INT32 column of the list lengths; min and max: scalars. All three are
    // cuDF resources, closed here.
    try (AutoCloseable lengths = (AutoCloseable) call(countElements, view(listColumn));
         AutoCloseable lo = (AutoCloseable) call(min, lengths);
         AutoCloseable hi = (AutoCloseable) call(max, lengths)) {
      return new long[] {(Integer) call(scalarGetInt, lo), (Integer) call(scalarGetInt, hi)};
    } catch (RuntimeException e) {
      throw e;
    } catch (Exception e) {
      throw new IllegalStateException("cuDF could not free a temporary column or scalar", e);
    }
  }

  @Override
  public int columnCount(Object table) {
    return (Integer) call(getNumberOfColumns, table);
  }

  @Override
  public Object column(Object table, int i) {
    return call(getColumn, table, i);
  }

  @Override
  public Object allocate(long bytes) {
    return call(allocate, null, bytes);
  }

  @Override
  public long bufferAddress(Object buffer) {
    return (Long) call(getAddress, buffer);
  }

  @Override
  public AutoCloseable retainBuffer(Object buffer) {
    return (AutoCloseable) call(bufferIncRefCount, buffer);
  }

  @Override
  public Object newColumn(String typeId, long rows, Object buffer) {
    try {
      Object type = dtype.getField(typeId).get(null);
      return columnVector
          .getConstructor(dtype, long.class, Optional.class, deviceBuffer, deviceBuffer, deviceBuffer)
          .newInstance(type, rows, Optional.of(0L), buffer, null, null);
    } catch (InvocationTargetException e) {
      throw new IllegalStateException("cuDF could not make a column of the tensor", e.getCause());
    } catch (ReflectiveOperationException e) {
      throw new IllegalStateException("this cuDF has no ColumnVector(DType, long, Optional, DeviceMemoryBuffer x3)", e);
    }
  }
}
