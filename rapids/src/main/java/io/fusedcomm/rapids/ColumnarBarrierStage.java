package io.fusedcomm.rapids;

import io.fusedcomm.api.CommOptions;
import io.fusedcomm.api.Communicator;
import io.fusedcomm.spark.BarrierStage;
import java.io.Serializable;
import java.lang.reflect.InvocationTargetException;
import java.util.ArrayList;
import java.util.Iterator;
import java.util.List;
import org.apache.spark.BarrierTaskContext;
import org.apache.spark.api.java.JavaRDD;
import org.apache.spark.rdd.RDD;
import scala.reflect.ClassTag;
import scala.reflect.ClassTag$;

/**
 * A barrier stage with a communicator over the GPU tables of a DataFrame that the RAPIDS
 * Accelerator computed: {@code com.nvidia.spark.rapids.ColumnarRdd(df)} hands each partition's
 * data on as {@code ai.rapids.cudf.Table}s already on the executor's GPU (the hand-off the
 * Accelerator's ML-integration guide describes), and {@link CudfTensors} turns their columns
 * into tensors without host copies.
 *
 * <pre>{@code
 * JavaRDD<String> out = ColumnarBarrierStage.withCommunicator(df, CommOptions.defaults(),
 *     (comm, ctx, tables) -> {
 *       while (tables.hasNext()) {
 *         try (DeviceTensor x = CudfTensors.fromTable(tables.next(), 0, 1, 2)) {  // rows x 3
 *           comm.allReduce(x, x);
 *         }
 *       }
 *       return List.of("ok").iterator();
 *     });
 * }</pre>
 *
 * Tables: each table the iterator hands out is closed by the stage after the function returns
 * (tensors made with {@link CudfTensors#retainColumn}, {@link CudfTensors#fromTable} or packed
 * copies stay valid after that; tensors from {@link CudfTensors#fromColumn} must be closed
 * inside the function). Tables the function never took are closed as well.
 */
public final class ColumnarBarrierStage {
  private static final String COLUMNAR_RDD = "com.nvidia.spark.rapids.ColumnarRdd";

  private ColumnarBarrierStage() {}

  /** A partition function over the partition's GPU tables (as {@code Object}: cuDF's Table). */
  @FunctionalInterface
  public interface TableFunction<R> extends Serializable {
    Iterator<R> call(Communicator comm, BarrierTaskContext context, Iterator<Object> tables) throws Exception;
  }

  /**
   * Runs {@code f} in a barrier stage over {@code ColumnarRdd(dataFrame)}, one task per
   * partition, each with a communicator (see {@link BarrierStage#withCommunicator}).
   *
   * @param dataFrame a {@code Dataset<Row>} whose plan the RAPIDS Accelerator runs on the GPU
   * @throws IllegalStateException without the RAPIDS Accelerator on the classpath
   */
  public static <R> JavaRDD<R> withCommunicator(Object dataFrame, CommOptions options, TableFunction<R> f) {
    return withCommunicator(columnarRdd(dataFrame), options, f);
  }

  /**
   * As above, over any RDD of cuDF tables (e.g. one the caller already got from {@code
   * ColumnarRdd}); its elements are closed as the class comment says.
   */
  public static <R> JavaRDD<R> withCommunicator(JavaRDD<?> tables, CommOptions options, TableFunction<R> f) {
    return BarrierStage.withCommunicator(tables, options, (comm, ctx, rows) -> {
      ClosingIterator it = new ClosingIterator(rows);
      try {
        List<R> out = new ArrayList<>();
        f.call(comm, ctx, it).forEachRemaining(out::add);
        return out.iterator();
      } finally {
        it.closeAll();
      }
    });
  }

  /** {@code ColumnarRdd(dataFrame)} of the RAPIDS Accelerator, through its Scala object. */
  static JavaRDD<Object> columnarRdd(Object dataFrame) {
    Class<?> columnarRdd;
    try {
      columnarRdd = Class.forName(COLUMNAR_RDD, true, loader());
    } catch (ClassNotFoundException | LinkageError e) {
      throw new IllegalStateException("the RAPIDS Accelerator is not on the classpath (" + COLUMNAR_RDD + "): add"
          + " its jar (com.nvidia:rapids-4-spark_2.13) with --jars and set"
          + " spark.plugins=com.nvidia.spark.SQLPlugin,io.fusedcomm.FusedCommPlugin", e);
    }
    java.lang.reflect.Method apply = null;
    for (java.lang.reflect.Method m : columnarRdd.getMethods()) {
      if (m.getName().equals("apply") && m.getParameterCount() == 1 && m.getParameterTypes()[0].isInstance(dataFrame)) {
        apply = m;
      }
    }
    if (apply == null) {
      throw new IllegalArgumentException("ColumnarRdd takes a DataFrame (Dataset<Row>), got "
          + (dataFrame == null ? "null" : dataFrame.getClass().getName()));
    }
    try {
      @SuppressWarnings("unchecked")
      RDD<Object> tables = (RDD<Object>) apply.invoke(null, dataFrame);
      ClassTag<Object> tag = ClassTag$.MODULE$.apply(Object.class);
      return new JavaRDD<>(tables, tag);
    } catch (InvocationTargetException e) {
      Throwable cause = e.getCause();
      throw cause instanceof RuntimeException re ? re : new IllegalStateException("ColumnarRdd failed", cause);
    } catch (IllegalAccessException e) {
      throw new IllegalStateException("cannot call ColumnarRdd.apply", e);
    }
  }

  private static ClassLoader loader() {
    ClassLoader l = Thread.currentThread().getContextClassLoader();
    return l != null ? l : ColumnarBarrierStage.class.getClassLoader();
  }

  /** Hands out the partition's tables and closes each of them (and the rest) at the end. */
  static final class ClosingIterator implements Iterator<Object> {
    private final Iterator<?> tables;
    private final List<AutoCloseable> handedOut = new ArrayList<>();

    ClosingIterator(Iterator<?> tables) {
      this.tables = tables;
    }

    @Override
    public boolean hasNext() {
      return tables.hasNext();
    }

    @Override
    public Object next() {
      Object t = tables.next();
      if (t instanceof AutoCloseable c) {
        handedOut.add(c);
      }
      return t;
    }

    /** Closes every table handed out, then drains and closes the ones never taken. */
    void closeAll() throws Exception {
      Exception first = null;
      while (tables.hasNext()) {
        next();
      }
      for (AutoCloseable c : handedOut) {
        try {
          c.close();
        } catch (Exception e) {
          if (first == null) {
            first = e;
          } else {
            first.addSuppressed(e);
          }
        }
      }
      handedOut.clear();
      if (first != null) {
        throw first;
      }
    }
  }
}
