package io.fusedcomm.spark;

import io.fusedcomm.api.CommOptions;
import io.fusedcomm.api.Communicator;
import java.io.Serializable;
import java.util.ArrayList;
import java.util.Iterator;
import java.util.List;
import org.apache.spark.BarrierTaskContext;
import org.apache.spark.api.java.JavaRDD;
import org.apache.spark.rdd.RDD;
import org.apache.spark.util.LongAccumulator;
import scala.reflect.ClassTag;
import scala.reflect.ClassTag$;
import scala.runtime.AbstractFunction1;

/**
 * Barrier stages from Java, which has no {@code JavaRDD.barrier()}.
 *
 * <pre>{@code
 * JavaRDD<String> out = BarrierStage.withCommunicator(rdd, CommOptions.defaults(),
 *     (comm, ctx, rows) -> { comm.allReduce(x, x); return List.of("ok").iterator(); });
 * }</pre>
 *
 * Barrier stages need as many free task slots as partitions; all tasks start together and are
 * retried together. Spark retries a failed barrier stage only when it is a shuffle map stage: a
 * barrier stage whose result goes straight to an action ({@code collect()}, {@code count()})
 * fails the job on its first failure. To keep it retryable (a killed executor, a peer that threw),
 * put a shuffle after it, e.g. {@code BarrierStage.withCommunicator(rdd, ...).repartition(1)}.
 *
 * <p>{@link #withCommunicator} adds each task's time in communicator ops to the accumulator
 * {@value #OP_TIME_ACCUMULATOR}, which the Spark UI's stage page shows per task and per stage.
 */
public final class BarrierStage {
  /** The name of the accumulator of milliseconds that tasks spent in communicator ops. */
  public static final String OP_TIME_ACCUMULATOR = "fusedcomm: time in communicator ops (ms)";

  private BarrierStage() {}

  /** A partition function that sees its barrier context. */
  @FunctionalInterface
  public interface TaskFunction<T, R> extends Serializable {
    Iterator<R> call(BarrierTaskContext context, Iterator<T> rows) throws Exception;
  }

  /** A partition function that runs with a communicator of the stage's tasks. */
  @FunctionalInterface
  public interface CommFunction<T, R> extends Serializable {
    Iterator<R> call(Communicator comm, BarrierTaskContext context, Iterator<T> rows) throws Exception;
  }

  /** {@code rdd.barrier().mapPartitions(f)}. */
  public static <T, R> JavaRDD<R> mapPartitions(JavaRDD<T> rdd, TaskFunction<T, R> f) {
    ClassTag<R> tag = anyRef();
    RDD<R> out = rdd.rdd().barrier().mapPartitions(new PartitionFunction<>(f), false, tag);
    return new JavaRDD<>(out, tag);
  }

  /**
   * Runs {@code f} in a barrier stage with a {@link Communicator} built for it and closed after
   * (aborted if {@code f} throws). The partition's output is materialised before the communicator
   * closes. The task's {@link Communicator#opTime()} goes to a new accumulator named {@value
   * #OP_TIME_ACCUMULATOR}.
   */
  public static <T, R> JavaRDD<R> withCommunicator(JavaRDD<T> rdd, CommOptions options, CommFunction<T, R> f) {
    LongAccumulator opTime = rdd.context().longAccumulator(OP_TIME_ACCUMULATOR);
    return mapPartitions(rdd, (context, rows) -> {
      List<R> results = new ArrayList<>();
      try (Communicator comm = Communicator.create(context, options)) {
        try {
          f.call(comm, context, rows).forEachRemaining(results::add);
        } catch (Throwable t) {
          comm.abort();
          throw t;
        } finally {
          opTime.add(comm.opTime().toMillis());
        }
      }
      return results.iterator();
    });
  }

  @SuppressWarnings("unchecked")
  private static <R> ClassTag<R> anyRef() {
    return (ClassTag<R>) ClassTag$.MODULE$.apply(Object.class);
  }

  private static final class PartitionFunction<T, R>
      extends AbstractFunction1<scala.collection.Iterator<T>, scala.collection.Iterator<R>>
      implements Serializable {
    private static final long serialVersionUID = 1L;
    private final TaskFunction<T, R> f;

    PartitionFunction(TaskFunction<T, R> f) {
      this.f = f;
    }

    @Override
    public scala.collection.Iterator<R> apply(scala.collection.Iterator<T> rows) {
      try {
        return toScala(f.call(BarrierTaskContext.get(), toJava(rows)));
      } catch (RuntimeException | Error e) {
        throw e;
      } catch (Exception e) {
        throw new RuntimeException(e);
      }
    }
  }

  // Iterator adapters written here rather than taken from Scala's converters, whose package
  // differs between Scala 2.12 and 2.13: the same class file serves both builds.

  private static <T> java.util.Iterator<T> toJava(scala.collection.Iterator<T> it) {
    return new java.util.Iterator<T>() {
      @Override
      public boolean hasNext() {
        return it.hasNext();
      }

      @Override
      public T next() {
        return it.next();
      }
    };
  }

  private static <T> scala.collection.Iterator<T> toScala(java.util.Iterator<T> it) {
    return new scala.collection.AbstractIterator<T>() {
      @Override
      public boolean hasNext() {
        return it.hasNext();
      }

      @Override
      public T next() {
        return it.next();
      }
    };
  }
}
