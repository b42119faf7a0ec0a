package io.fusedcomm.rapids;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.ArrayList;
import java.util.List;
import org.junit.jupiter.api.Test;

/** The table rules of ColumnarBarrierStage, and its error without the RAPIDS Accelerator. */
class ColumnarBarrierStageTest {
  static final class Table implements AutoCloseable {
    final List<String> closed;
    final String name;

    Table(List<String> closed, String name) {
      this.closed = closed;
      this.name = name;
    }

    @Override
    public void close() {
      closed.add(name);
    }
  }

  @Test
  void everyTableIsClosedOnceTakenOrNot() throws Exception {
    List<String> closed = new ArrayList<>();
    List<Table> tables = List.of(new Table(closed, "a"), new Table(closed, "b"), new Table(closed, "c"));
    ColumnarBarrierStage.ClosingIterator it = new ColumnarBarrierStage.ClosingIterator(tables.iterator());
    it.next();
    assertEquals(List.of(), closed, "nothing is closed while the function runs");
    it.closeAll();
    assertEquals(List.of("a", "b", "c"), closed);
    it.closeAll();
    assertEquals(3, closed.size(), "closed once");
  }

  @Test
  void aFailingCloseIsReportedAfterTheOthersClose() {
    List<String> closed = new ArrayList<>();
    AutoCloseable bad = () -> {
      throw new IllegalStateException("close failed");
    };
    ColumnarBarrierStage.ClosingIterator it =
        new ColumnarBarrierStage.ClosingIterator(List.of(bad, new Table(closed, "b")).iterator());
    assertThrows(IllegalStateException.class, it::closeAll);
    assertEquals(List.of("b"), closed);
  }

  @Test
  void withoutTheAcceleratorTheErrorSaysWhatToAdd() {
    IllegalStateException e =
        assertThrows(IllegalStateException.class, () -> ColumnarBarrierStage.columnarRdd(new Object()));
    assertTrue(e.getMessage().contains("rapids-4-spark_2.13") && e.getMessage().contains("SQLPlugin"),
        e.getMessage());
  }
}
