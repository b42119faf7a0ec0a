package io.fusedcomm.rapids;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.fusedcomm.api.DType;
import java.util.ArrayList;
import java.util.List;
import org.junit.jupiter.api.Test;

/**
 * The cuDF adapter's shape, dtype and ownership rules on stand-ins for cuDF's columns, tables
 * and buffers (no cuDF, no GPU): what the tensor gets (address, dtype, shape), what it owns, and
 * when references are taken and dropped. The same rules run on real cuDF objects through
 * ReflectiveCudf on a GPU host.
 */
class CudfTensorsTest {
  /** A column: type, rows, nulls, data; reference-counted like a ColumnVector unless a view. */
  static final class Column {
    final String type;
    final long rows;
    final long nulls;
    final long address;
    final long bytes;
    final boolean vector;
    int refs = 1;
    /** LIST columns: the child (elements) and the shortest and longest list. */
    Column child;
    long[] lengths;

    Column(String type, long rows, long nulls, long address, long bytes, boolean vector) {
      this.type = type;
      this.rows = rows;
      this.nulls = nulls;
      this.address = address;
      this.bytes = bytes;
      this.vector = vector;
    }
  }

  static final class Buffer implements AutoCloseable {
    final long address;
    int refs = 1;

    Buffer(long address) {
      this.address = address;
    }

    @Override
    public void close() {
      refs--;
    }
  }

  /** A child column view as cuDF hands it out: closed by whoever asked for it. */
  record ChildView(Column column, FakeCudf cudf) implements AutoCloseable {
    @Override
    public void close() {
      cudf.childViewsOpen--;
    }
  }

  static Column col(Object c) {
    return c instanceof ChildView v ? v.column() : (Column) c;
  }

  static final class FakeCudf implements CudfAccess {
    final List<Buffer> buffers = new ArrayList<>();
    final List<Object[]> newColumns = new ArrayList<>();
    boolean failNewColumn;

    @Override
    public String typeId(Object c) {
      return col(c).type;
    }

    @Override
    public long rows(Object c) {
      return col(c).rows;
    }

    @Override
    public long nullCount(Object c) {
      return col(c).nulls;
    }

    @Override
    public long dataAddress(Object c) {
      return col(c).address;
    }

    @Override
    public long dataBytes(Object c) {
      return col(c).bytes;
    }

    @Override
    public boolean isReferenceCounted(Object c) {
      return ((Column) c).vector;
    }

    @Override
    public AutoCloseable retain(Object c) {
      Column col = (Column) c;
      col.refs++;
      return () -> col.refs--;
    }

    int childViewsOpen;

    @Override
    public Object listChild(Object c) {
      childViewsOpen++;
      Column child = ((Column) c).child;
      // cuDF hands out a new view that the caller closes.
      return new ChildView(child, this);
    }

    @Override
    public long[] listLengthRange(Object c) {
      return ((Column) c).lengths.clone();
    }

    @Override
    public int columnCount(Object table) {
      return ((Column[]) table).length;
    }

    @Override
    public Object column(Object table, int i) {
      return ((Column[]) table)[i];
    }

    @Override
    public Object allocate(long bytes) {
      Buffer b = new Buffer(0x9000_0000L + 0x1000L * buffers.size());
      buffers.add(b);
      return b;
    }

    @Override
    public long bufferAddress(Object buffer) {
      return ((Buffer) buffer).address;
    }

    @Override
    public AutoCloseable retainBuffer(Object buffer) {
      ((Buffer) buffer).refs++;
      return (Buffer) buffer;
    }

    @Override
    public Object newColumn(String typeId, long rows, Object buffer) {
      if (failNewColumn) {
        throw new IllegalStateException("no column today");
      }
      newColumns.add(new Object[] {typeId, rows, buffer});
      return "column over " + buffer;
    }
  }

  /** What a tensor would have been made of; its owner is closed when "released". */
  record Made(long address, DType dtype, long[] shape, AutoCloseable owner, long[] packed) {
    void release() throws Exception {
      if (owner != null) {
        owner.close();
      }
    }
  }

  static final class Maker implements CudfTensors.TensorMaker<Made> {
    boolean fail;

    @Override
    public Made wrap(long address, DType dtype, long[] shape, AutoCloseable owner) {
      if (fail) {
        throw new IllegalArgumentException("not GPU memory");
      }
      return new Made(address, dtype, shape, owner, null);
    }

    @Override
    public Made pack(DType dtype, long rows, long[] columns) {
      return new Made(0, dtype, new long[] {rows, columns.length}, null, columns);
    }
  }

  private final FakeCudf cudf = new FakeCudf();
  private final Maker maker = new Maker();

  private static Column f32(long rows, long address) {
    return new Column("FLOAT32", rows, 0, address, rows * 4, true);
  }

  @Test
  void aFloatColumnIsAnF32VectorOverItsData() throws Exception {
    Column c = f32(1000, 0x7000_0000L);
    Made borrowed = CudfTensors.fromColumn(cudf, maker, c, false);
    assertEquals(0x7000_0000L, borrowed.address());
    assertEquals(DType.F32, borrowed.dtype());
    assertArrayEquals(new long[] {1000}, borrowed.shape());
    assertNull(borrowed.owner(), "a borrowed column is not the tensor's to close");
    assertEquals(1, c.refs);

    Made ints = CudfTensors.fromColumn(cudf, maker, new Column("INT32", 5, 0, 0x10, 20, false), false);
    assertEquals(DType.I32, ints.dtype());
  }

  @Test
  void aRetainedColumnOutlivesItsTable() throws Exception {
    Column c = f32(10, 0x7000_0000L);
    Made t = CudfTensors.fromColumn(cudf, maker, c, true);
    assertEquals(2, c.refs, "the tensor took a reference");
    c.refs--;  // the table closes its column
    assertEquals(1, c.refs, "the tensor's reference keeps the memory");
    t.release();
    assertEquals(0, c.refs, "released with the tensor's memory");

    Column view = new Column("FLOAT32", 10, 0, 0x10, 40, false);
    assertTrue(assertThrows(IllegalArgumentException.class, () -> CudfTensors.fromColumn(cudf, maker, view, true))
        .getMessage().contains("bare ColumnView"));
  }

  @Test
  void aFailedWrapDropsTheReferenceItTook() {
    Column c = f32(10, 0x7000_0000L);
    maker.fail = true;
    assertThrows(IllegalArgumentException.class, () -> CudfTensors.fromColumn(cudf, maker, c, true));
    assertEquals(1, c.refs);
  }

  @Test
  void unsupportedTypesNullsShortAndEmptyColumnsAreRefused() {
    String m = assertThrows(IllegalArgumentException.class, () -> CudfTensors.fromColumn(cudf, maker,
        new Column("FLOAT64", 10, 0, 0x10, 80, true), false)).getMessage();
    assertTrue(m.contains("FLOAT64") && m.contains("FLOAT32"), m);
    m = assertThrows(IllegalArgumentException.class, () -> CudfTensors.fromColumn(cudf, maker,
        new Column("FLOAT32", 10, 3, 0x10, 40, true), false)).getMessage();
    assertTrue(m.contains("3 nulls"), m);
    m = assertThrows(IllegalArgumentException.class, () -> CudfTensors.fromColumn(cudf, maker,
        new Column("FLOAT32", 10, 0, 0x10, 39, true), false)).getMessage();
    assertTrue(m.contains("39 bytes"), m);
    m = assertThrows(IllegalArgumentException.class, () -> CudfTensors.fromColumn(cudf, maker,
        new Column("FLOAT32", 0, 0, 0, 0, true), false)).getMessage();
    assertTrue(m.contains("no rows"), m);
  }

  @Test
  void severalTableColumnsArePackedRowMajorAndOneIsRetained() throws Exception {
    Column[] table = {f32(100, 0x1000), f32(100, 0x2000), f32(100, 0x3000)};
    Made packed = CudfTensors.fromTable(cudf, maker, table, 2, 0);
    assertArrayEquals(new long[] {100, 2}, packed.shape());
    assertArrayEquals(new long[] {0x3000, 0x1000}, packed.packed(), "columns in the order asked for");
    assertEquals(DType.F32, packed.dtype());
    for (Column c : table) {
      assertEquals(1, c.refs, "packing copies: no references kept");
    }
    Made all = CudfTensors.fromTable(cudf, maker, table);
    assertArrayEquals(new long[] {100, 3}, all.shape());

    Made one = CudfTensors.fromTable(cudf, maker, table, 1);
    assertArrayEquals(new long[] {100}, one.shape());
    assertEquals(2, table[1].refs, "one column: retained, no copy");
    one.release();
    assertEquals(1, table[1].refs);
  }

  @Test
  void packedColumnsShareTypeAndRows() {
    Column[] mixed = {f32(100, 0x1000), new Column("INT32", 100, 0, 0x2000, 400, true)};
    assertTrue(assertThrows(IllegalArgumentException.class, () -> CudfTensors.fromTable(cudf, maker, mixed))
        .getMessage().contains("share one type and row count"));
    Column[] ragged = {f32(100, 0x1000), f32(99, 0x2000)};
    assertThrows(IllegalArgumentException.class, () -> CudfTensors.fromTable(cudf, maker, ragged));
    assertTrue(assertThrows(IllegalArgumentException.class, () -> CudfTensors.fromTable(cudf, maker, ragged, 2))
        .getMessage().contains("not in a table of 2 columns"));
  }

  @Test
  void aResultColumnSharesTheTensorsMemory() throws Exception {
    assertEquals("FLOAT32", CudfTensors.columnType(DType.F32, 10));
    assertThrows(IllegalArgumentException.class, () -> CudfTensors.columnType(DType.BF16, 10));
    assertThrows(IllegalArgumentException.class, () -> CudfTensors.columnType(DType.F32, 0));

    Buffer buffer = (Buffer) cudf.allocate(40);
    Made t = CudfTensors.wrapBuffer(cudf, maker, DType.F32, 10, buffer);
    assertEquals(buffer.address, t.address());
    assertSame(buffer, t.owner(), "the tensor owns the allocation's first reference");
    Object column = CudfTensors.columnOf(cudf, buffer, "FLOAT32", 10);
    assertEquals("column over " + buffer, column);
    assertEquals(2, buffer.refs, "the column took a reference of its own");
    t.release();
    assertEquals(1, buffer.refs, "the memory stays with the column");

    cudf.failNewColumn = true;
    assertThrows(IllegalStateException.class, () -> CudfTensors.columnOf(cudf, buffer, "FLOAT32", 10));
    assertEquals(1, buffer.refs, "a failed column gives its reference back");

    Buffer other = (Buffer) cudf.allocate(40);
    maker.fail = true;
    assertThrows(IllegalArgumentException.class, () -> CudfTensors.wrapBuffer(cudf, maker, DType.F32, 10, other));
    assertEquals(0, other.refs, "a failed wrap frees the new buffer");
  }

  private static Column list(long rows, long k, String elementType, int elementBytes, long address) {
    Column l = new Column("LIST", rows, 0, 0, 0, true);
    l.child = new Column(elementType, rows * k, 0, address, rows * k * elementBytes, false);
    l.lengths = new long[] {k, k};
    return l;
  }

  @Test
  void aListColumnOfEqualLengthsIsARowMajorMatrixOverItsElements() {
    Column l = list(1000, 8, "INT16", 2, 0x7100_0000L);
    Made t = CudfTensors.fromListColumn(cudf, maker, l, DType.BF16);
    assertEquals(0x7100_0000L, t.address(), "the tensor is the child's memory, no copy");
    assertEquals(DType.BF16, t.dtype());
    assertArrayEquals(new long[] {1000, 8}, t.shape());
    assertNull(t.owner(), "borrowed, like fromColumn");
    assertEquals(0, cudf.childViewsOpen, "the child view was closed");
    assertEquals(DType.F32, CudfTensors.fromListColumn(cudf, maker, list(3, 2, "FLOAT32", 4, 0x10), DType.F32).dtype());
    assertEquals(DType.BF16, CudfTensors.fromListColumn(cudf, maker, list(3, 2, "UINT16", 2, 0x10), DType.BF16).dtype());
  }

  @Test
  void listColumnsATensorCannotBeAreRefused() {
    String ragged = refused(list(10, 4, "INT16", 2, 0x10), DType.BF16, l -> l.lengths = new long[] {3, 5});
    assertTrue(ragged.contains("3 to 5 elements"), ragged);
    String floats = refused(list(10, 4, "FLOAT32", 4, 0x10), DType.BF16, l -> { });
    assertTrue(floats.contains("INT16") && floats.contains("bit patterns"), floats);
    assertTrue(refused(list(10, 4, "INT16", 2, 0x10), DType.F32, l -> { }).contains("FLOAT32"));
    String nullLists = refused(new Column("LIST", 10, 2, 0, 0, true), DType.F32, l -> { });
    assertTrue(nullLists.contains("2 null lists"), nullLists);
    String nullElements = refused(list(10, 4, "FLOAT32", 4, 0x10), DType.F32,
        l -> l.child = new Column("FLOAT32", 40, 1, 0x10, 160, false));
    assertTrue(nullElements.contains("1 null elements"), nullElements);
    String slice = refused(list(10, 4, "FLOAT32", 4, 0x10), DType.F32,
        l -> l.child = new Column("FLOAT32", 80, 0, 0x10, 320, false));
    assertTrue(slice.contains("a slice"), slice);
    String notList = assertThrows(IllegalArgumentException.class,
        () -> CudfTensors.fromListColumn(cudf, maker, f32(10, 0x10), DType.F32)).getMessage();
    assertTrue(notList.contains("not LIST"), notList);
    assertThrows(IllegalArgumentException.class,
        () -> CudfTensors.fromListColumn(cudf, maker, list(10, 4, "FLOAT32", 4, 0x10), null));
    assertEquals(0, cudf.childViewsOpen, "every child view was closed, refusals too");
  }

  private String refused(Column l, DType dtype, java.util.function.Consumer<Column> change) {
    change.accept(l);
    return assertThrows(IllegalArgumentException.class, () -> CudfTensors.fromListColumn(cudf, maker, l, dtype))
        .getMessage();
  }

  @Test
  void withoutCudfTheErrorSaysWhatToAdd() {
    IllegalStateException e = assertThrows(IllegalStateException.class, ReflectiveCudf::get);
    assertTrue(e.getMessage().contains("rapids-4-spark"), e.getMessage());
    System.out.println("without cuDF: " + e.getMessage());
  }
}
