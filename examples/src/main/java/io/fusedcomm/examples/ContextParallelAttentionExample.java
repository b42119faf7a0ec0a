/*
 * 04_context_parallel_attention: the attention of one long sequence (causal, grouped-query heads)
 * split over the tasks of one barrier stage, context-parallel, with ringAttention:
 *
 *   the sequence of S positions is cut into 2W chunks by the Split rule; under the zigzag layout
 *   rank r holds chunks r and 2W-1-r (Split.positions), so every rank has about the same causal
 *   work (contiguous: rank r holds Split block r, and the last rank the most)
 *   rank r holds   Q_r : its positions of Q (S × Hq × D)
 *                  K_r, V_r : its positions of K and V (S × Hkv × D), Hq a multiple of Hkv
 *   1. ringAttention      O_r, LSE_r = attention of Q_r over the whole K, V (causal by global
 *                         position), the K/V blocks passed around the ring
 *
 * Every rank derives its rows from the seed alone (row p of a tensor from (seed, tensor, p)).
 * The driver computes the single-rank reference with the local attention op
 * (Communicator.attention, the host backend) over the whole sequence and checks every element of
 * every rank's O_r and LSE_r against the reference's rows at that rank's positions.
 *
 * Backends: the example asks the communicator (comm.backend()) at run time. With
 * spark.fusedcomm.backend=host the op takes HostTensors; with cuda it takes DeviceTensors on the
 * executor's GPU (bf16, head dim 64 or 128; other problems are refused before the job starts).
 *
 * Run (from the repository root; examples/run.sh builds what is missing and prints this line):
 *
 *   $SPARK_HOME/bin/spark-submit --master 'local-cluster[2,1,1024]' \
 *     --jars spark-plugin/target/fusedcomm-0.1.0-SNAPSHOT.jar \
 *     --conf spark.plugins=io.fusedcomm.FusedCommPlugin \
 *     --conf spark.fusedcomm.backend=host \
 *     --class io.fusedcomm.examples.ContextParallelAttentionExample \
 *     examples/target/fusedcomm-examples-0.1.0-SNAPSHOT.jar [world=2] [S=1027] [Hq=8] [Hkv=2] [D=64]
 *     [dtype=bf16] [seed=fresh] [layout=zigzag|contiguous]
 *
 * or, with no Spark installation:  examples/run.sh 04_context_parallel_attention [world] [S] [Hq] [Hkv] [D] [dtype] [seed] [layout]
 *
 * On one host's GPUs (one executor per GPU), the same with the cuda backend and Spark's GPU
 * scheduling (see examples/README.md):
 *
 *   FUSEDCOMM_BACKEND=cuda EXTRA_SUBMIT_ARGS="--conf spark.worker.resource.gpu.amount=1 ..." \
 *     examples/run.sh 04_context_parallel_attention 2 16384 16 2 128 bf16
 *
 * Exit status 0 when every element of every rank's O and LSE is within its bound, 1 otherwise.
 */
package io.fusedcomm.examples;

import io.fusedcomm.api.AttentionOptions;
import io.fusedcomm.api.Backend;
import io.fusedcomm.api.CommOptions;
import io.fusedcomm.api.Communicator;
import io.fusedcomm.api.DType;
import io.fusedcomm.api.DeviceTensor;
import io.fusedcomm.api.HostTensor;
import io.fusedcomm.api.RankPlacement;
import io.fusedcomm.api.SequenceLayout;
import io.fusedcomm.api.Split;
import io.fusedcomm.api.Tensor;
import io.fusedcomm.config.FusedCommConf;
import io.fusedcomm.spark.BarrierStage;
import java.io.Serializable;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Comparator;
import java.util.List;
import java.util.Locale;
import java.util.stream.Collectors;
import org.apache.spark.SparkConf;

/** Example 04: context-parallel causal attention with ringAttention, checked against the local op. */
public final class ContextParallelAttentionExample {
  static final String NAME = "04_context_parallel_attention";

  private ContextParallelAttentionExample() {}

  /** Global problem: one sequence (batch 1), heads, dtype, seed and layout. */
  record Problem(int world, int s, int hq, int hkv, int d, DType dtype, long seed, SequenceLayout layout)
      implements Serializable {
    /** Row {@code p} (all heads) of Q (tensor 1), K (2) or V (3): uniform in [-1, 1), in the dtype. */
    float[] row(int tensor, int p) {
      int heads = tensor == 1 ? hq : hkv;
      return SeededValues.uniform(SeededValues.seed(seed, tensor, p), heads * d, 1.0, dtype);
    }

    /** Rows {@code positions} of a tensor, (positions × heads × D) row-major. */
    float[] rows(int tensor, int[] positions) {
      int width = (tensor == 1 ? hq : hkv) * d;
      float[] out = new float[Math.multiplyExact(positions.length, width)];
      for (int i = 0; i < positions.length; i++) {
        System.arraycopy(row(tensor, positions[i]), 0, out, i * width, width);
      }
      return out;
    }

    /** Rank r's positions under the layout, in the order its tensors hold them. */
    int[] positions(int r) {
      List<Split.Run> runs = Split.positions(s, world, r, layout);
      return runs.stream().flatMapToInt(run -> java.util.stream.IntStream.range((int) run.offset(),
          (int) (run.offset() + run.count()))).toArray();
    }

    String describe() {
      return String.format(Locale.ROOT, "world=%d, S=%d, Hq=%d, Hkv=%d, D=%d, dtype=%s, layout=%s, causal", world, s,
          hq, hkv, d, dtype.label(), layout.name().toLowerCase(Locale.ROOT));
    }
  }

  /** One rank's outputs (O: positions × Hq × D, LSE: Hq × positions), where it ran and its time. */
  record Shard(int rank, int[] positions, float[] o, float[] lse, String backend, String device, double ms)
      implements Serializable {}

  /**
   * Runs the example (driver side): {@code [world=2] [S=1027] [Hq=8] [Hkv=2] [D=64]
   * [dtype=bf16|f32] [seed=fresh] [layout=zigzag|contiguous]}; exits 1 unless every element
   * checks.
   */
  public static void main(String[] args) throws Exception {
    int world = Math.toIntExact(ExampleContext.positiveArg(args, 0, "world", 2));
    int s = Math.toIntExact(ExampleContext.positiveArg(args, 1, "S", 1027));
    int hq = Math.toIntExact(ExampleContext.positiveArg(args, 2, "Hq", 8));
    int hkv = Math.toIntExact(ExampleContext.positiveArg(args, 3, "Hkv", 2));
    int d = Math.toIntExact(ExampleContext.positiveArg(args, 4, "D", 64));
    DType dtype = args.length > 5 ? TensorParallelMlpExample.parseDType(args[5]) : DType.BF16;
    long seed = args.length > 6 && !args[6].trim().equals("fresh") ? Long.parseLong(args[6].trim()) : System.nanoTime();
    SequenceLayout layout = args.length > 7 ? parseLayout(args[7]) : SequenceLayout.ZIGZAG;
    Problem p = new Problem(world, s, hq, hkv, d, dtype, seed, layout);
    requireSupported(p, FusedCommConf.fromSparkConf(new SparkConf()).backend());

    ExampleContext.run(NAME, world, (sc, tasks) -> {
      System.out.printf(Locale.ROOT, "%s: %s seed=%d master=%s%n", NAME, p.describe(), seed, sc.master());
      CommOptions options = CommOptions.defaults().name("context-parallel");
      List<Shard> shards = BarrierStage.withCommunicator(tasks, options,
          (comm, context, rows) -> List.of(attend(comm, p)).iterator()).collect();
      return check(p, shards);
    });
  }

  static SequenceLayout parseLayout(String s) {
    switch (s.trim().toLowerCase(Locale.ROOT)) {
      case "zigzag":
        return SequenceLayout.ZIGZAG;
      case "contiguous":
        return SequenceLayout.CONTIGUOUS;
      default:
        throw new IllegalArgumentException("layout must be zigzag or contiguous, got '" + s + "'");
    }
  }

  /**
   * Refuses what {@code backend} cannot run, naming the sizes: Hq a multiple of Hkv everywhere;
   * on cuda bf16 with head dim 64 or 128.
   */
  static void requireSupported(Problem p, Backend backend) {
    if (p.hq() % p.hkv() != 0) {
      throw new IllegalArgumentException(NAME + ": Hq must be a multiple of Hkv, got Hq=" + p.hq() + ", Hkv=" + p.hkv());
    }
    if (backend != Backend.CUDA) {
      return;
    }
    if (p.dtype() != DType.BF16 || (p.d() != 64 && p.d() != 128)) {
      throw new IllegalArgumentException(NAME + ": the cuda backend's attention takes bf16 with head dim 64 or 128,"
          + " got dtype=" + p.dtype().label() + ", D=" + p.d() + " (or use spark.fusedcomm.backend=host)");
    }
  }

  /** One rank: its rows of Q, K and V, then ringAttention on the communicator's backend. */
  static Shard attend(Communicator comm, Problem p) {
    int w = comm.world();
    int r = comm.rank();
    if (w != p.world()) {
      throw new IllegalStateException("the stage has " + w + " tasks, the problem expects " + p.world());
    }
    requireSupported(p, comm.backend());
    int[] pos = p.positions(r);
    int n = pos.length;
    AttentionOptions options = AttentionOptions.sequence(p.s()).causal(true).layout(p.layout());
    try (TensorMaker t = new TensorMaker(comm.backend())) {
      Tensor q = t.of(p.rows(1, pos), p.dtype(), 1, n, p.hq(), p.d());
      Tensor k = t.of(p.rows(2, pos), p.dtype(), 1, n, p.hkv(), p.d());
      Tensor v = t.of(p.rows(3, pos), p.dtype(), 1, n, p.hkv(), p.d());
      Tensor o = t.nan(p.dtype(), 1, n, p.hq(), p.d());
      Tensor lse = t.nan(DType.F32, 1, p.hq(), n);
      long t0 = System.nanoTime();
      comm.ringAttention(q, k, v, o, lse, options);
      double ms = (System.nanoTime() - t0) / 1e6;
      RankPlacement me = comm.placements().get(r);
      String device = "executor " + me.executorId()
          + (me.gpuUuid().isEmpty() ? ", no GPU" : ", GPU " + me.gpuAddress() + " " + me.gpuUuid());
      return new Shard(r, pos, t.read(o), t.read(lse), comm.backend().configName(), device, ms);
    }
  }

  /** Host or device tensors for the communicator's backend, closed together. */
  static final class TensorMaker implements AutoCloseable {
    private final boolean device;
    private final List<AutoCloseable> open = new ArrayList<>();

    TensorMaker(Backend backend) {
      this.device = backend == Backend.CUDA;
    }

    Tensor of(float[] values, DType dtype, long... shape) {
      HostTensor h = HostTensor.of(values, dtype, shape);
      if (!device) {
        open.add(h);
        return h;
      }
      try (h) {
        DeviceTensor dt = DeviceTensor.allocate(dtype, shape);
        open.add(dt);
        dt.copyFrom(h);
        return dt;
      }
    }

    /** Filled with NaN, so that an element the op never writes fails the check. */
    Tensor nan(DType dtype, long... shape) {
      float[] v = new float[Math.toIntExact(Arrays.stream(shape).reduce(1, Math::multiplyExact))];
      Arrays.fill(v, Float.NaN);
      return of(v, dtype, shape);
    }

    float[] read(Tensor t) {
      if (t instanceof HostTensor h) {
        return h.toFloatArray();
      }
      try (HostTensor h = HostTensor.allocate(t.dtype(), t.shape())) {
        ((DeviceTensor) t).copyTo(h);
        return h.toFloatArray();
      }
    }

    @Override
    public void close() throws RuntimeException {
      for (int i = open.size() - 1; i >= 0; i--) {
        try {
          open.get(i).close();
        } catch (Exception e) {
          throw new IllegalStateException("closing a tensor", e);
        }
      }
    }
  }

  /** The reference of the whole sequence: O (S × Hq × D) and LSE (Hq × S), from the local op. */
  record Reference(float[] o, float[] lse) {}

  /** The single-rank op over the whole sequence, on the host (the reference backend). */
  static Reference reference(Problem p) {
    int[] all = java.util.stream.IntStream.range(0, p.s()).toArray();
    try (HostTensor q = HostTensor.of(p.rows(1, all), p.dtype(), 1, p.s(), p.hq(), p.d());
        HostTensor k = HostTensor.of(p.rows(2, all), p.dtype(), 1, p.s(), p.hkv(), p.d());
        HostTensor v = HostTensor.of(p.rows(3, all), p.dtype(), 1, p.s(), p.hkv(), p.d());
        HostTensor o = HostTensor.allocate(p.dtype(), 1, p.s(), p.hq(), p.d());
        HostTensor lse = HostTensor.allocate(DType.F32, 1, p.hq(), p.s())) {
      Communicator.attention(q, k, v, o, lse, true, 0f);
      return new Reference(o.toFloatArray(), lse.toFloatArray());
    }
  }

  /**
   * Per-element bounds of a rank's result against the reference: both are fp32 online softmaxes
   * of the same inputs, merged in other groups of keys, and each O is rounded once to the dtype.
   * O: 2u·|ref| (each side's rounding, u the dtype's unit roundoff) + 1e-5·max|V| (fp32 sums),
   * and in bf16 2^-8·max|V| more (the GPU kernel may hold the softmax weights in bf16 for the
   * second product); LSE (fp32 on both sides): 2^-10·(1 + |ref|). A row of another position,
   * or of no position, is off by order max|V| and fails.
   */
  static double oTolerance(DType dtype, double ref, double maxAbsV) {
    double weights = dtype == DType.BF16 ? 0x1p-8 : 0;
    return 2 * SeededValues.unitRoundoff(dtype) * Math.abs(ref) + (weights + 1e-5) * maxAbsV;
  }

  static double lseTolerance(double ref) {
    return 0x1p-10 * (1 + Math.abs(ref));
  }

  /** Result of checking one tensor over all ranks. */
  record Verdict(long checked, long bad, double maxAbsErr, double worstRatio) {}

  /** Checks every rank's O against the reference rows at its positions. */
  static Verdict checkO(Problem p, Reference ref, List<Shard> shards, double maxAbsV) {
    int width = p.hq() * p.d();
    long checked = 0;
    long bad = 0;
    double maxErr = 0;
    double worst = 0;
    for (Shard sh : shards) {
      for (int i = 0; i < sh.positions().length; i++) {
        for (int x = 0; x < width; x++) {
          double want = ref.o()[sh.positions()[i] * width + x];
          double got = sh.o()[i * width + x];
          double err = Math.abs(got - want);
          double tol = oTolerance(p.dtype(), want, maxAbsV);
          checked++;
          if (!(err <= tol)) {
            bad++;
          } else {
            maxErr = Math.max(maxErr, err);
            worst = Math.max(worst, err / tol);
          }
        }
      }
    }
    return new Verdict(checked, bad, maxErr, worst);
  }

  /** Checks every rank's LSE (Hq × its positions) against the reference's columns. */
  static Verdict checkLse(Problem p, Reference ref, List<Shard> shards) {
    long checked = 0;
    long bad = 0;
    double maxErr = 0;
    double worst = 0;
    for (Shard sh : shards) {
      int n = sh.positions().length;
      for (int h = 0; h < p.hq(); h++) {
        for (int i = 0; i < n; i++) {
          double want = ref.lse()[h * p.s() + sh.positions()[i]];
          double got = sh.lse()[h * n + i];
          double err = Math.abs(got - want);
          double tol = lseTolerance(want);
          checked++;
          if (!(err <= tol)) {
            bad++;
          } else {
            maxErr = Math.max(maxErr, err);
            worst = Math.max(worst, err / tol);
          }
        }
      }
    }
    return new Verdict(checked, bad, maxErr, worst);
  }

  /** The causal (query, key) pairs of the queries at {@code positions}: Σ (p + 1). */
  static long causalPairs(int[] positions) {
    long n = 0;
    for (int p : positions) {
      n += p + 1L;
    }
    return n;
  }

  /** The largest rank's causal work over the mean, under {@code layout}: 1.0 is perfect balance. */
  static double imbalance(int s, int world, SequenceLayout layout) {
    Problem q = new Problem(world, s, 1, 1, 1, DType.F32, 0, layout);
    long most = 0;
    long total = 0;
    for (int r = 0; r < world; r++) {
      long pairs = causalPairs(q.positions(r));
      most = Math.max(most, pairs);
      total += pairs;
    }
    return total == 0 ? 1.0 : most * (double) world / total;
  }

  /** Prints each rank's positions and time, checks every element, prints the verdict. */
  static boolean check(Problem p, List<Shard> shards) {
    shards = shards.stream().sorted(Comparator.comparingInt(Shard::rank)).collect(Collectors.toList());
    if (shards.size() != p.world()) {
      System.out.println(NAME + ": FAILED: expected " + p.world() + " ranks' results, got " + shards.size());
      return false;
    }
    System.out.printf(Locale.ROOT, "%-5s %-26s %9s %14s %18s  %s%n", "rank", "positions", "rows", "causal pairs",
        "ringAttention ms", "ran on");
    for (Shard sh : shards) {
      String runs = Split.positions(p.s(), p.world(), sh.rank(), p.layout()).stream()
          .filter(run -> run.count() > 0)
          .map(run -> run.offset() + ".." + (run.offset() + run.count() - 1))
          .collect(Collectors.joining(", "));
      System.out.printf(Locale.ROOT, "%-5d %-26s %9d %14d %18.3f  %s%n", sh.rank(), runs.isEmpty() ? "-" : runs,
          sh.positions().length, causalPairs(sh.positions()), sh.ms(), sh.device());
    }
    System.out.printf(Locale.ROOT, "causal work, largest rank over the mean: %.3f with %s (zigzag %.3f, contiguous %.3f)%n",
        imbalance(p.s(), p.world(), p.layout()), p.layout().name().toLowerCase(Locale.ROOT),
        imbalance(p.s(), p.world(), SequenceLayout.ZIGZAG), imbalance(p.s(), p.world(), SequenceLayout.CONTIGUOUS));
    long t0 = System.nanoTime();
    Reference ref = reference(p);
    System.out.printf(Locale.ROOT, "reference: Communicator.attention over the whole sequence on the host, %.0f ms%n",
        (System.nanoTime() - t0) / 1e6);
    double maxAbsV = 0;
    for (int pos = 0; pos < p.s(); pos++) {
      for (float x : p.row(3, pos)) {
        maxAbsV = Math.max(maxAbsV, Math.abs(x));
      }
    }
    Verdict o = checkO(p, ref, shards, maxAbsV);
    Verdict lse = checkLse(p, ref, shards);
    System.out.printf(Locale.ROOT, "O: max |error| %.3e, worst error/tolerance %.3f, %d of %d elements out of bounds%n",
        o.maxAbsErr(), o.worstRatio(), o.bad(), o.checked());
    System.out.printf(Locale.ROOT, "LSE: max |error| %.3e, worst error/tolerance %.3f, %d of %d elements out of bounds%n",
        lse.maxAbsErr(), lse.worstRatio(), lse.bad(), lse.checked());
    long expectedO = (long) p.s() * p.hq() * p.d();
    long expectedLse = (long) p.s() * p.hq();
    boolean ok = o.bad() == 0 && lse.bad() == 0 && o.checked() == expectedO && lse.checked() == expectedLse;
    String backend = shards.get(0).backend();
    if (ok) {
      System.out.printf(Locale.ROOT, "%s: check passed (%s, backend=%s, max_abs_err O=%.3e, LSE=%.3e)%n", NAME,
          p.describe(), backend, o.maxAbsErr(), lse.maxAbsErr());
    } else {
      System.out.printf(Locale.ROOT, "%s: FAILED (%s, backend=%s): %d O and %d LSE elements out of bounds,"
          + " %d of %d positions checked%n", NAME, p.describe(), backend, o.bad(), lse.bad(),
          o.checked() / Math.max(1, (long) p.hq() * p.d()), p.s());
    }
    return ok;
  }
}
