/*
 * 01_collectives: allReduce, allGather, reduceScatter and allToAll among the tasks of one barrier
 * stage, in f32 and bf16, on a size every world divides and on a prime size (uneven split), each
 * result checked element by element against a reference built from the same seeded inputs.
 *
 * Run (from the repository root; examples/run.sh builds what is missing and prints this line):
 *
 *   $SPARK_HOME/bin/spark-submit --master 'local-cluster[2,1,1024]' \
 *     --jars spark-plugin/target/fusedcomm-0.1.0-SNAPSHOT.jar \
 *     --conf spark.plugins=io.fusedcomm.FusedCommPlugin \
 *     --conf spark.fusedcomm.backend=host \
 *     --class io.fusedcomm.examples.CollectivesExample \
 *     examples/target/fusedcomm-examples-0.1.0-SNAPSHOT.jar [world=2] [seed=fresh]
 *
 * or, with no Spark installation:  examples/run.sh 01_collectives [world] [seed]
 *
 * Arguments: world = number of barrier tasks (one per executor; the master needs that many task
 * slots), seed = input seed (default: a fresh one each run, printed so a failure can be replayed).
 * Exit status 0 when every check passes, 1 otherwise.
 */
package io.fusedcomm.examples;

import io.fusedcomm.api.CommOptions;
import io.fusedcomm.api.Communicator;
import io.fusedcomm.api.DType;
import io.fusedcomm.api.HostTensor;
import io.fusedcomm.api.Split;
import io.fusedcomm.spark.BarrierStage;
import java.io.Serializable;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.stream.Collectors;

/** Example 01: the four plain collectives in a barrier stage, self-checked. */
public final class CollectivesExample {
  static final String NAME = "01_collectives";

  /** Sizes every op runs on: one that 2, 4, 8, 16 divide, and a prime (uneven split for w > 1). */
  static final int[] SIZES = {1 << 16, 10007};

  private static final DType[] DTYPES = {DType.F32, DType.BF16};

  private CollectivesExample() {}

  /** One op's outcome on one rank. */
  record Check(
      String op,
      String dtype,
      int n,
      int rank,
      int world,
      String backend,
      double maxAbsErr,
      double worstErrOverTol,
      boolean exact,
      long badElements,
      double millis)
      implements Serializable {}

  public static void main(String[] args) throws Exception {
    int world = Math.toIntExact(ExampleContext.positiveArg(args, 0, "world", 2));
    long seed = args.length > 1 ? Long.parseLong(args[1].trim()) : System.nanoTime();
    ExampleContext.run(NAME, world, (sc, tasks) -> {
      System.out.printf(Locale.ROOT, "%s: world=%d seed=%d master=%s%n", NAME, world, seed, sc.master());
      List<Check> checks =
          BarrierStage.withCommunicator(
                  tasks,
                  CommOptions.defaults().name("collectives"),
                  (comm, context, rows) -> runAll(comm, seed).iterator())
              .collect();
      return report(checks, world);
    });
  }

  /** Every op, dtype and size on this rank, in the same order on every rank. */
  static List<Check> runAll(Communicator comm, long seed) {
    List<Check> out = new ArrayList<>();
    for (DType dtype : DTYPES) {
      for (int n : SIZES) {
        out.add(allReduce(comm, seed, dtype, n));
        out.add(allGather(comm, seed, dtype, n));
        out.add(reduceScatter(comm, seed, dtype, n));
        out.add(allToAll(comm, seed, dtype, n));
      }
    }
    return out;
  }

  /** Rank {@code s}'s input for {@code op}: n values in [-1, 1), rounded to dtype. */
  private static float[] input(long seed, String op, DType dtype, int n, int s) {
    return SeededValues.uniform(SeededValues.seed(seed, op.hashCode(), dtype.ordinal(), n, s), n, 1.0, dtype);
  }

  static Check allReduce(Communicator comm, long seed, DType dtype, int n) {
    int w = comm.world();
    float[][] in = new float[w][];
    for (int s = 0; s < w; s++) {
      in[s] = input(seed, "allReduce", dtype, n, s);
    }
    try (HostTensor x = HostTensor.of(in[comm.rank()], dtype, n);
        HostTensor y = HostTensor.allocate(dtype, n)) {
      y.fill(Float.NaN);
      long t0 = System.nanoTime();
      comm.allReduce(x, y);
      double ms = (System.nanoTime() - t0) / 1e6;
      Sums ref = Sums.over(in, 0, n);
      return compare(comm, "allReduce", dtype, n, ms, y.toFloatArray(), ref.sum, ref.tolerance(dtype, w));
    }
  }

  static Check reduceScatter(Communicator comm, long seed, DType dtype, int n) {
    int w = comm.world();
    int r = comm.rank();
    float[][] in = new float[w][];
    for (int s = 0; s < w; s++) {
      in[s] = input(seed, "reduceScatter", dtype, n, s);
    }
    int count = (int) Split.count(n, w, r);
    try (HostTensor x = HostTensor.of(in[r], dtype, n);
        HostTensor y = HostTensor.allocate(dtype, count)) {
      y.fill(Float.NaN);
      long t0 = System.nanoTime();
      comm.reduceScatter(x, y);
      double ms = (System.nanoTime() - t0) / 1e6;
      Sums ref = Sums.over(in, (int) Split.offset(n, w, r), count);
      return compare(comm, "reduceScatter", dtype, n, ms, y.toFloatArray(), ref.sum, ref.tolerance(dtype, w));
    }
  }

  static Check allGather(Communicator comm, long seed, DType dtype, int n) {
    int w = comm.world();
    int r = comm.rank();
    // The gathered vector; rank s holds its Split block.
    float[] whole = input(seed, "allGather", dtype, n, 0);
    int offset = (int) Split.offset(n, w, r);
    float[] mine = java.util.Arrays.copyOfRange(whole, offset, offset + (int) Split.count(n, w, r));
    try (HostTensor x = HostTensor.of(mine, dtype, mine.length);
        HostTensor y = HostTensor.allocate(dtype, n)) {
      y.fill(Float.NaN);
      long t0 = System.nanoTime();
      comm.allGather(x, y);
      double ms = (System.nanoTime() - t0) / 1e6;
      return compare(comm, "allGather", dtype, n, ms, y.toFloatArray(), widen(whole), null);
    }
  }

  static Check allToAll(Communicator comm, long seed, DType dtype, int n) {
    int w = comm.world();
    int r = comm.rank();
    float[][] in = new float[w][];
    for (int s = 0; s < w; s++) {
      in[s] = input(seed, "allToAll", dtype, n, s);
    }
    // Block r of every rank s, in rank order.
    int count = (int) Split.count(n, w, r);
    int offset = (int) Split.offset(n, w, r);
    double[] expected = new double[w * count];
    for (int s = 0; s < w; s++) {
      for (int i = 0; i < count; i++) {
        expected[s * count + i] = in[s][offset + i];
      }
    }
    try (HostTensor x = HostTensor.of(in[r], dtype, n);
        HostTensor y = HostTensor.allocate(dtype, (long) w * count)) {
      y.fill(Float.NaN);
      long t0 = System.nanoTime();
      comm.allToAll(x, y);
      double ms = (System.nanoTime() - t0) / 1e6;
      return compare(comm, "allToAll", dtype, n, ms, y.toFloatArray(), expected, null);
    }
  }

  /** Per-element sums over ranks in fp64 with the magnitudes that bound their rounding error. */
  static final class Sums {
    final double[] sum;
    final double[] magnitude;

    private Sums(int count) {
      sum = new double[count];
      magnitude = new double[count];
    }

    static Sums over(float[][] inputs, int offset, int count) {
      Sums s = new Sums(count);
      for (float[] in : inputs) {
        for (int i = 0; i < count; i++) {
          s.sum[i] += in[offset + i];
          s.magnitude[i] += Math.abs(in[offset + i]);
        }
      }
      return s;
    }

    /**
     * Per element 2·w·u·Σ_s|x_s|: covers fp32 accumulation plus the final rounding (and even a
     * rounding to dtype after each of the w-1 reduction steps), with a factor 2 to spare.
     */
    double[] tolerance(DType dtype, int world) {
      double u = SeededValues.unitRoundoff(dtype);
      double[] t = new double[magnitude.length];
      for (int i = 0; i < t.length; i++) {
        t[i] = 2.0 * world * u * magnitude[i];
      }
      return t;
    }
  }

  private static double[] widen(float[] v) {
    double[] d = new double[v.length];
    for (int i = 0; i < v.length; i++) {
      d[i] = v[i];
    }
    return d;
  }

  /**
   * Every element against the reference: bit-exact when {@code tolerance} is null (pure data
   * movement), else {@code |got - expected| <= tolerance} element by element. NaN (the poison
   * left in an element the op never wrote) always fails.
   */
  static Check compare(
      Communicator comm, String op, DType dtype, int n, double ms, float[] got, double[] expected, double[] tolerance) {
    return compare(op, dtype, n, comm.rank(), comm.world(), comm.backend().configName(), ms, got, expected, tolerance);
  }

  static Check compare(String op, DType dtype, int n, int rank, int world, String backend, double ms, float[] got,
      double[] expected, double[] tolerance) {
    double maxErr = 0;
    double worst = 0;
    long bad = got.length == expected.length ? 0 : Math.abs(got.length - expected.length);
    for (int i = 0; i < Math.min(got.length, expected.length); i++) {
      double err = Float.isNaN(got[i]) ? Double.POSITIVE_INFINITY : Math.abs(got[i] - expected[i]);
      maxErr = Math.max(maxErr, err);
      boolean ok;
      if (tolerance == null) {
        ok = Float.floatToIntBits(got[i]) == Float.floatToIntBits((float) expected[i]);
      } else {
        ok = err <= tolerance[i];
        worst = Math.max(worst, tolerance[i] > 0 ? err / tolerance[i] : (err == 0 ? 0 : Double.POSITIVE_INFINITY));
      }
      if (!ok) {
        bad++;
      }
    }
    return new Check(op, dtype.label(), n, rank, world, backend, maxErr, worst, tolerance == null, bad, ms);
  }

  /** Prints the per-op table and the final line; true when every rank passed every check. */
  static boolean report(List<Check> checks, int world) {
    Map<String, List<Check>> byOp = new LinkedHashMap<>();
    for (Check c : checks) {
      byOp.computeIfAbsent(c.op() + "/" + c.dtype() + "/" + c.n(), k -> new ArrayList<>()).add(c);
    }
    int expectedRows = DTYPES.length * SIZES.length * 4;
    boolean passed = byOp.size() == expectedRows;
    System.out.printf(Locale.ROOT, "%-14s %-5s %7s %6s %11s %10s %8s %9s  %s%n",
        "op", "dtype", "n", "ranks", "max|err|", "err/tol", "bad", "max ms", "result");
    for (List<Check> rows : byOp.values()) {
      Check first = rows.get(0);
      double maxErr = rows.stream().mapToDouble(Check::maxAbsErr).max().orElse(0);
      double worst = rows.stream().mapToDouble(Check::worstErrOverTol).max().orElse(0);
      long bad = rows.stream().mapToLong(Check::badElements).sum();
      double ms = rows.stream().mapToDouble(Check::millis).max().orElse(0);
      boolean ok = rows.size() == world && bad == 0
          && rows.stream().map(Check::rank).distinct().count() == world;
      passed &= ok;
      System.out.printf(Locale.ROOT, "%-14s %-5s %7d %6s %11.3e %10s %8d %9.3f  %s%n",
          first.op(), first.dtype(), first.n(), rows.size() + "/" + world, maxErr,
          first.exact() ? "exact" : String.format(Locale.ROOT, "%.3f", worst), bad, ms, ok ? "ok" : "FAIL");
    }
    String backend = checks.stream().map(Check::backend).distinct().collect(Collectors.joining(","));
    boolean worldAgrees = checks.stream().allMatch(c -> c.world() == world);
    passed &= worldAgrees;
    if (passed) {
      System.out.printf(Locale.ROOT, "%s: all checks passed (world=%d, backend=%s)%n", NAME, world, backend);
    } else {
      long failed = byOp.values().stream()
          .filter(rows -> rows.size() != world || rows.stream().anyMatch(c -> c.badElements() > 0)).count();
      System.out.printf(Locale.ROOT, "%s: FAILED (%d of %d checks failed%s, world=%d, backend=%s)%n", NAME,
          failed + Math.max(0, expectedRows - byOp.size()), expectedRows,
          worldAgrees ? "" : "; tasks disagree on the world size", world, backend);
    }
    return passed;
  }
}
