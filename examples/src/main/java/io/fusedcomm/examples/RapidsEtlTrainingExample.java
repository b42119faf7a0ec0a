/*
 * 05_rapids_etl_to_training: ETL with DataFrames, handed to a barrier stage that trains a small
 * tensor-parallel model with the fused ops. With the RAPIDS Accelerator (com.nvidia.spark.SQLPlugin
 * in spark.plugins) the Parquet scan and the feature engineering run on the GPU and the result
 * reaches the ops as cuDF memory, without copies:
 *
 *   ColumnarRdd(features)  ->  one cuDF Table per partition  ->  DeviceTensors over its columns
 *
 * (the tensors' device addresses are the columns' data addresses; the example checks it). Without
 * the Accelerator the same ETL runs on the CPU and the rows become host tensors.
 *
 *   data     seeded raw records (ints, a nullable int, a string category), written as Parquet,
 *            one file of N / world rows per rank
 *   ETL      Parquet scan; features: scaled ints, a product, null filled plus a null indicator,
 *            one-hot categories, a centred count, each quantized to a multiple of 1/16 below 16
 *            in magnitude, so exactly a bfloat16; x = array(f1, ..., f8) of their bf16 bit
 *            patterns (cuDF has no bf16 type: smallint), y = a float label
 *   model    p = relu(X · W1ᵀ) · w2, W1: F × 8 (bf16), w2: F (fp32); rank r holds rows Split(F)
 *            of W1 and of w2 (tensor-parallel hidden layer) and rows Split(N) of X and y
 *   a step   1. allGatherGemm   Z_r = [X_0; …; X_{W-1}] · W1_rᵀ             : N × F_r (bf16)
 *            2. host: A_r = relu(Z_r), partial predictions A_r · w2_r         : N
 *            3. allReduce       p = Σ_r A_r · w2_r                            : N (fp32)
 *            4. host: loss ½·mean((p − y)²) and the gradients of W1_r, w2_r (from the
 *               gathered X, kept from step 1 of the first step), a gradient-descent update
 *   hand-off check, once: allReduce of the y column (fed from cuDF directly) and allGather of it
 *
 * The driver checks, from the raw Parquet rows: every feature and label the ETL produced, bit for
 * bit, against the same computation in Java; the hand-off check's sums; and the loss of every
 * step and the trained weights against an fp64 reference of the same training (same bf16
 * roundings of Z and W1), and that the loss fell to below a tenth.
 *
 * Run (from the repository root; examples/run.sh builds what is missing and prints this line):
 *
 *   examples/run.sh 05_rapids_etl_to_training [world=2] [N=2048] [F=32] [steps=30] [seed=fresh]
 *
 * With the RAPIDS Accelerator on one host's GPUs: see README, "With the RAPIDS Accelerator".
 * On the cuda backend every rank's F_r = Split.count(F, world, r) must be a multiple of 8.
 * Exit status 0 when every check passes, 1 otherwise.
 */
package io.fusedcomm.examples;

import io.fusedcomm.api.Backend;
import io.fusedcomm.api.Bf16;
import io.fusedcomm.api.CommOptions;
import io.fusedcomm.api.Communicator;
import io.fusedcomm.api.DType;
import io.fusedcomm.api.DeviceTensor;
import io.fusedcomm.api.HostTensor;
import io.fusedcomm.api.RankPlacement;
import io.fusedcomm.api.Split;
import io.fusedcomm.api.Tensor;
import io.fusedcomm.api.WeightLayout;
import io.fusedcomm.spark.BarrierStage;
import java.io.IOException;
import java.io.Serializable;
import java.io.UncheckedIOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Comparator;
import java.util.HashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.stream.Collectors;
import java.util.stream.Stream;
import org.apache.spark.api.java.JavaSparkContext;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.SparkSession;

/** Example 05: Parquet ETL (on the GPU with the RAPIDS Accelerator) feeding tensor-parallel training. */
public final class RapidsEtlTrainingExample {
  static final String NAME = "05_rapids_etl_to_training";
  static final String RAPIDS_PLUGIN = "com.nvidia.spark.SQLPlugin";
  /** Features per row. */
  static final int K = 8;
  static final double LEARNING_RATE = 0.005;

  private RapidsEtlTrainingExample() {}

  /** The global problem; every rank derives its shards from it. */
  record Problem(int world, int rows, int f, int steps, long seed) implements Serializable {
    int localRows() {
      return rows / world;
    }

    String describe() {
      return String.format(Locale.ROOT, "world=%d, N=%d, K=%d, F=%d, steps=%d", world, rows, K, f, steps);
    }

    /** W1 (F × K), rounded to bf16: the same on every rank and in the reference. */
    float[] w1() {
      return SeededValues.uniform(SeededValues.seed(seed, 51), f * K, Math.sqrt(3.0 / K) / 4, DType.BF16);
    }

    /** w2 (F). */
    float[] w2() {
      return SeededValues.uniform(SeededValues.seed(seed, 52), f, Math.sqrt(3.0 / f), DType.F32);
    }
  }

  /** One rank's result: its loss curve, trained shards, hand-off check and where it ran. */
  record Shard(int rank, int rows, double[] losses, float[] w1, float[] w2, float[] ySum, float[] yGathered,
      String handoff, String device, String path) implements Serializable {}

  /** {@code [world=2] [N=2048] [F=32] [steps=30] [seed=fresh]}; exits 1 unless every check passes. */
  public static void main(String[] args) throws Exception {
    int world = Math.toIntExact(ExampleContext.positiveArg(args, 0, "world", 2));
    int rows = Math.toIntExact(ExampleContext.positiveArg(args, 1, "N", 2048));
    int f = Math.toIntExact(ExampleContext.positiveArg(args, 2, "F", 32));
    int steps = Math.toIntExact(ExampleContext.positiveArg(args, 3, "steps", 30));
    long seed = args.length > 4 && !args[4].trim().equals("fresh") ? Long.parseLong(args[4].trim()) : System.nanoTime();
    if (rows % world != 0 || f < world) {
      throw new IllegalArgumentException(NAME + ": N must be a multiple of world and F at least world; got N=" + rows
          + ", F=" + f + ", world=" + world);
    }
    Problem p = new Problem(world, rows, f, steps, seed);

    SparkSession spark = SparkSession.builder().appName(NAME)
        .config("spark.scheduler.barrier.maxConcurrentTasksCheck.interval", "1s")
        // Integer features never overflow; the legacy (non-ANSI) rules keep the plan the same on
        // Spark 3.5 and 4.x.
        .config("spark.sql.ansi.enabled", "false")
        .getOrCreate();
    boolean passed = false;
    Path dir = Files.createTempDirectory("fusedcomm-05-");
    try {
      JavaSparkContext sc = JavaSparkContext.fromSparkContext(spark.sparkContext());
      boolean rapids = Arrays.stream(sc.getConf().get("spark.plugins", "").split(",")).map(String::trim)
          .anyMatch(RAPIDS_PLUGIN::equals);
      System.out.printf(Locale.ROOT, "%s: %s seed=%d master=%s, ETL %s%n", NAME, p.describe(), seed, sc.master(),
          rapids ? "by the RAPIDS Accelerator (GPU), hand-off ColumnarRdd -> cuDF Table -> DeviceTensor"
              : "by Spark (CPU), hand-off rows -> host tensors");
      ExampleContext.awaitExecutors(sc, world, 120_000);
      String raw = dir.resolve("raw").toString();
      rawRecords(spark, p).write().parquet(raw);
      Dataset<Row> features = features(spark.read().parquet(raw));
      String plan = features.queryExecution().executedPlan().toString();
      System.out.println("ETL plan:\n" + plan);
      if (rapids && !(plan.contains("GpuProject") && plan.contains("GpuFileGpuScan") && !plan.contains("RowToColumnar"))) {
        throw new IllegalStateException("the RAPIDS Accelerator did not run the whole ETL on the GPU (plan above)");
      }
      CommOptions options = CommOptions.defaults().name("etl-train").expectOp("allGatherGemm", DType.BF16, rows, f, K);
      List<Shard> shards = rapids ? RapidsHandOff.train(features, p, options) : trainOnRows(features, p, options);
      passed = check(p, spark.read().parquet(raw).collectAsList(), features.collectAsList(), shards);
    } catch (Exception e) {
      System.out.println(NAME + ": FAILED: " + e);
      e.printStackTrace();
    } finally {
      spark.stop();
      deleteTree(dir);
    }
    if (!passed) {
      System.exit(1);
    }
  }

  // ---- data and ETL ---------------------------------------------------------------------------

  /** Seeded raw records, one range partition (so one Parquet file) of N / world rows per rank. */
  static Dataset<Row> rawRecords(SparkSession spark, Problem p) {
    long s = p.seed();
    return spark.range(0, p.rows(), 1, p.world()).selectExpr("id",
        "cast(pmod(hash(id, " + s + "L), 201) - 100 as int) as ia",
        "cast(pmod(hash(id, " + (s + 1) + "L), 201) - 100 as int) as ib",
        "CASE WHEN pmod(id, 7) = 0 THEN NULL ELSE cast(pmod(hash(id, " + (s + 2) + "L), 201) - 100 as int) END as d",
        "cast(pmod(hash(id, " + (s + 3) + "L), 50) as int) as c",
        "CASE pmod(hash(id, " + (s + 4) + "L), 3) WHEN 0 THEN 'red' WHEN 1 THEN 'green' ELSE 'blue' END as cat");
  }

  /**
   * The feature engineering: eight features as multiples of 1/16 (q / 16 with |q| < 256), their
   * bf16 bit patterns as {@code x: array<smallint>}, the label {@code y: float}, and the record id.
   */
  static Dataset<Row> features(Dataset<Row> raw) {
    Dataset<Row> q = raw.selectExpr("id",
        "2 * ia as q1",
        "2 * ib as q2",
        "(ia * ib) div 64 as q3",
        "2 * coalesce(d, 0) as q4",
        "CASE WHEN d IS NULL THEN 16 ELSE 0 END as q5",
        "CASE WHEN cat = 'red' THEN 16 ELSE 0 END as q6",
        "CASE WHEN cat = 'green' THEN 16 ELSE 0 END as q7",
        "4 * c - 98 as q8");
    StringBuilder x = new StringBuilder("array(");
    for (int j = 1; j <= K; j++) {
      x.append(j > 1 ? ", " : "").append(bf16Bits("q" + j));
    }
    return q.selectExpr(x.append(") as x").toString(),
        "cast((8 * q1 - 4 * q2 + 2 * q3 + 4 * q4 - 24 * q5 + 16 * q6 - 8 * q7 + 2 * q8 + 4 * abs(q1)) / 64D as float) as y",
        "id");
  }

  /**
   * SQL for the bf16 bit pattern of {@code q / 16} (an int column, |q| < 256) as a smallint: sign,
   * exponent {@code floor(log2|q|) − 4 + 127}, the 7 bits below the leading one.
   */
  static String bf16Bits(String q) {
    String a = "abs(" + q + ")";
    StringBuilder log2 = new StringBuilder("CASE");
    for (int l = 7; l >= 1; l--) {
      log2.append(" WHEN ").append(a).append(" >= ").append(1 << l).append(" THEN ").append(l);
    }
    log2.append(" ELSE 0 END");
    return "cast(CASE WHEN " + q + " = 0 THEN 0 ELSE (" + log2 + " + 123) * 128 + (shiftleft(" + a + ", 7 - (" + log2
        + ")) & 127) - CASE WHEN " + q + " < 0 THEN 32768 ELSE 0 END END as smallint)";
  }

  /** The features of one raw record in Java (the check's side of the ETL): q1..q8 and y. */
  static int[] javaFeatures(Row raw) {
    int ia = raw.getInt(raw.fieldIndex("ia"));
    int ib = raw.getInt(raw.fieldIndex("ib"));
    Integer d = raw.isNullAt(raw.fieldIndex("d")) ? null : raw.getInt(raw.fieldIndex("d"));
    int c = raw.getInt(raw.fieldIndex("c"));
    String cat = raw.getString(raw.fieldIndex("cat"));
    return new int[] {2 * ia, 2 * ib, (ia * ib) / 64, 2 * (d == null ? 0 : d), d == null ? 16 : 0,
        cat.equals("red") ? 16 : 0, cat.equals("green") ? 16 : 0, 4 * c - 98};
  }

  static float javaLabel(int[] q) {
    return (float) ((8 * q[0] - 4 * q[1] + 2 * q[2] + 4 * q[3] - 24 * q[4] + 16 * q[5] - 8 * q[6] + 2 * q[7]
        + 4 * Math.abs(q[0])) / 64.0);
  }

  /** The bf16 bit pattern of {@code q / 16} as Java computes it (Float's bits, top half). */
  static short javaBf16Bits(int q) {
    return (short) (Float.floatToRawIntBits(q / 16f) >>> 16);
  }

  static float bf16Value(short bits) {
    return Float.intBitsToFloat((bits & 0xffff) << 16);
  }

  // ---- the CPU hand-off -----------------------------------------------------------------------

  /** Without the Accelerator: each partition's rows become host tensors (one copy, on the host). */
  static List<Shard> trainOnRows(Dataset<Row> features, Problem p, CommOptions options) {
    return BarrierStage.withCommunicator(features.javaRDD(), options, (comm, context, rows) -> {
      List<Row> mine = new ArrayList<>();
      rows.forEachRemaining(mine::add);
      float[] x = new float[mine.size() * K];
      float[] y = new float[mine.size()];
      for (int i = 0; i < mine.size(); i++) {
        List<Object> bits = mine.get(i).getList(0);
        for (int j = 0; j < K; j++) {
          x[i * K + j] = bf16Value((Short) bits.get(j));
        }
        y[i] = mine.get(i).getFloat(1);
      }
      try (HostTensor xt = HostTensor.of(x, DType.BF16, mine.size(), K);
           HostTensor yt = HostTensor.of(y, DType.F32, mine.size())) {
        return List.of(train(comm, p, xt, yt, "rows -> host tensors")).iterator();
      }
    }).collect();
  }

  // ---- training (any backend) ------------------------------------------------------------------

  /**
   * The hand-off check and {@code p.steps()} gradient-descent steps on one rank, from its rows of
   * X ({@code m × K} bf16) and y ({@code m} fp32), host or device tensors as the backend takes.
   */
  static Shard train(Communicator comm, Problem p, Tensor x, Tensor y, String handoff) throws Exception {
    int w = comm.world();
    int r = comm.rank();
    if (w != p.world()) {
      throw new IllegalStateException("the stage has " + w + " tasks, the problem expects " + p.world());
    }
    int n = p.rows();
    int m = p.localRows();
    if (x.dim(0) != m || y.dim(0) != m || x.dim(1) != K) {
      throw new IllegalStateException("rank " + r + " got " + x.dim(0) + " rows (x " + Arrays.toString(x.shape())
          + "), expected " + m + " × " + K + ": one Parquet file of N / world rows per partition");
    }
    int fr = (int) Split.count(p.f(), w, r);
    int fOff = (int) Split.offset(p.f(), w, r);
    if (comm.backend() == Backend.CUDA && fr % 8 != 0) {
      throw new IllegalArgumentException(NAME + ": on the cuda backend F_r = Split.count(F, world, r) must be a"
          + " multiple of 8; F=" + p.f() + " gives F_" + r + "=" + fr);
    }
    float[] w1 = Arrays.copyOfRange(p.w1(), fOff * K, (fOff + fr) * K);
    float[] w2 = Arrays.copyOfRange(p.w2(), fOff, fOff + fr);
    double[] losses = new double[p.steps()];
    try (Tensors tensors = new Tensors(comm.backend())) {
      // The hand-off check: the y column itself through two collectives.
      Tensor ySum = tensors.output(DType.F32, m);
      comm.allReduce(y, ySum);
      Tensor yAll = tensors.output(DType.F32, n);
      comm.allGather(y, yAll);
      float[] ySumHost = tensors.read(ySum);
      float[] yh = tensors.read(yAll);

      Tensor w1t = tensors.of(w1, DType.BF16, fr, K);
      Tensor z = tensors.output(DType.BF16, n, fr);
      Tensor xAll = tensors.output(DType.BF16, n, K);
      Tensor part = tensors.output(DType.F32, n);
      Tensor pred = tensors.output(DType.F32, n);
      float[] xh = null;
      for (int t = 0; t < p.steps(); t++) {
        comm.allGatherGemm(x, w1t, z, t == 0 ? xAll : null, WeightLayout.NK);
        if (t == 0) {
          xh = tensors.read(xAll);
        }
        float[] zh = tensors.read(z);
        float[] partial = new float[n];
        for (int i = 0; i < n; i++) {
          double s = 0;
          for (int j = 0; j < fr; j++) {
            s += Math.max(zh[i * fr + j], 0f) * (double) w2[j];
          }
          partial[i] = (float) s;
        }
        tensors.write(part, partial);
        comm.allReduce(part, pred);
        float[] ph = tensors.read(pred);
        Step g = Step.gradients(zh, ph, yh, xh, w2, n, fr);
        losses[t] = g.loss;
        for (int i = 0; i < w1.length; i++) {
          w1[i] = (float) (w1[i] - LEARNING_RATE * g.dw1[i]);
        }
        for (int j = 0; j < fr; j++) {
          w2[j] = (float) (w2[j] - LEARNING_RATE * g.dw2[j]);
        }
        tensors.write(w1t, w1);
        w1 = tensors.read(w1t); // the weights as the next step's GEMM sees them: bf16
      }
      RankPlacement me = comm.placements().get(r);
      String device = "executor " + me.executorId()
          + (me.gpuUuid().isEmpty() ? ", no GPU" : ", GPU " + me.gpuAddress() + " " + me.gpuUuid());
      return new Shard(r, m, losses, w1, w2, ySumHost, yh, handoff, device,
          comm.describeFusedOp("allGatherGemm", n, fr, K));
    }
  }

  /** One step's loss and gradients from Z (N × F_r), the predictions, the labels and X. */
  static final class Step {
    double loss;
    double[] dw1;
    double[] dw2;

    static Step gradients(float[] z, float[] p, float[] y, float[] x, float[] w2, int n, int fr) {
      Step s = new Step();
      s.dw1 = new double[fr * K];
      s.dw2 = new double[fr];
      double sq = 0;
      for (int i = 0; i < n; i++) {
        double e = (double) p[i] - y[i];
        sq += e * e;
        double g = e / n;
        for (int j = 0; j < fr; j++) {
          double zij = z[i * fr + j];
          if (zij > 0) {
            s.dw2[j] += zij * g;
            double dz = g * w2[j];
            for (int k = 0; k < K; k++) {
              s.dw1[j * K + k] += dz * x[i * K + k];
            }
          }
        }
      }
      s.loss = 0.5 * sq / n;
      return s;
    }
  }

  // ---- the driver's checks --------------------------------------------------------------------

  static boolean check(Problem p, List<Row> raw, List<Row> features, List<Shard> shards) {
    boolean ok = true;
    // 1. The ETL against Java, bit for bit, by record id.
    Map<Long, Row> byId = new HashMap<>();
    for (Row row : raw) {
      byId.put(row.getLong(row.fieldIndex("id")), row);
    }
    int wrong = 0;
    for (Row row : features) {
      int[] q = javaFeatures(byId.get(row.getLong(2)));
      List<Object> bits = row.getList(0);
      for (int j = 0; j < K; j++) {
        if ((Short) bits.get(j) != javaBf16Bits(q[j])) {
          wrong++;
        }
      }
      if (Float.floatToRawIntBits(row.getFloat(1)) != Float.floatToRawIntBits(javaLabel(q))) {
        wrong++;
      }
    }
    System.out.printf(Locale.ROOT, "ETL: %d rows, %d features and a label each, %d values differ from Java's%n",
        features.size(), K, wrong);
    ok &= features.size() == p.rows() && wrong == 0;

    // The features in partition (= rank) order, as the ranks saw them.
    int n = p.rows();
    float[] x = new float[n * K];
    float[] y = new float[n];
    for (int i = 0; i < n; i++) {
      List<Object> bits = features.get(i).getList(0);
      for (int j = 0; j < K; j++) {
        x[i * K + j] = bf16Value((Short) bits.get(j));
      }
      y[i] = features.get(i).getFloat(1);
    }
    shards = shards.stream().sorted(Comparator.comparingInt(Shard::rank)).collect(Collectors.toList());
    for (Shard s : shards) {
      System.out.printf(Locale.ROOT, "rank %d: %d rows, %s; hand-off: %s; %s%n", s.rank(), s.rows(), s.device(),
          s.handoff(), s.path());
    }

    // 2. The hand-off check: allReduce and allGather of y.
    int m = p.localRows();
    int bad = 0;
    for (Shard s : shards) {
      for (int i = 0; i < m; i++) {
        double sum = 0;
        for (int r = 0; r < p.world(); r++) {
          sum += y[r * m + i];
        }
        if (Math.abs(s.ySum()[i] - sum) > 1e-5 * (1 + Math.abs(sum))) {
          bad++;
        }
      }
      if (!Arrays.equals(s.yGathered(), y)) {
        bad++;
      }
    }
    System.out.printf(Locale.ROOT, "hand-off: allReduce and allGather of the y column, %d mismatches%n", bad);
    ok &= bad == 0;

    // 3. Training against the fp64 reference.
    Reference ref = Reference.train(p, x, y);
    double lossErr = 0;
    for (Shard s : shards) {
      for (int t = 0; t < p.steps(); t++) {
        lossErr = Math.max(lossErr, Math.abs(s.losses()[t] - ref.losses[t]) / ref.losses[t]);
      }
    }
    double w1Err = 0;
    double w1Max = 0;
    double w2Err = 0;
    double w2Max = 0;
    for (Shard s : shards) {
      int off = (int) Split.offset(p.f(), p.world(), s.rank());
      for (int i = 0; i < s.w1().length; i++) {
        w1Err = Math.max(w1Err, Math.abs(s.w1()[i] - ref.w1[off * K + i]));
        w1Max = Math.max(w1Max, Math.abs(ref.w1[off * K + i]));
      }
      for (int j = 0; j < s.w2().length; j++) {
        w2Err = Math.max(w2Err, Math.abs(s.w2()[j] - ref.w2[off + j]));
        w2Max = Math.max(w2Max, Math.abs(ref.w2[off + j]));
      }
    }
    double[] l = shards.get(0).losses();
    System.out.printf(Locale.ROOT, "loss: step 0 %.4f, step %d %.4f, last %.4f (reference %.4f, %.4f, %.4f);"
        + " max relative difference over steps and ranks %.2e%n", l[0], p.steps() / 2, l[p.steps() / 2],
        l[p.steps() - 1], ref.losses[0], ref.losses[p.steps() / 2], ref.losses[p.steps() - 1], lossErr);
    System.out.printf(Locale.ROOT, "weights: max |W1 - ref| %.2e (max |W1| %.3f), max |w2 - ref| %.2e (max |w2| %.3f)%n",
        w1Err, w1Max, w2Err, w2Max);
    // Bounds: bf16 rounding of Z and W1 where the reference's fp64 sum and the GEMM's fp32 sum
    // round to neighbouring bf16 values moves a weight by one bf16 step (2^-8 relative); the loss
    // curve and the weights stay within these of the reference.
    boolean trained = l[p.steps() - 1] < 0.1 * l[0];
    ok &= lossErr <= 1e-2 && w1Err <= 2e-2 * w1Max && w2Err <= 2e-2 * w2Max && trained;
    System.out.println(ok
        ? String.format(Locale.ROOT, "%s: check passed (%s, backend=%s, loss %.3f -> %.3f, max_rel_err loss=%.1e)", NAME,
            p.describe(), shards.get(0).device().contains("no GPU") ? "host" : "cuda", l[0], l[p.steps() - 1], lossErr)
        : NAME + ": CHECK FAILED" + (trained ? "" : " (the loss did not fall below a tenth)"));
    return ok;
  }

  /** The same training in fp64 on the driver, with the bf16 roundings of Z and W1 the ranks have. */
  static final class Reference {
    double[] losses;
    float[] w1;
    float[] w2;

    static Reference train(Problem p, float[] x, float[] y) {
      int n = p.rows();
      int f = p.f();
      Reference ref = new Reference();
      ref.losses = new double[p.steps()];
      ref.w1 = p.w1();
      ref.w2 = p.w2();
      for (int t = 0; t < p.steps(); t++) {
        float[] z = new float[n * f];
        float[] pred = new float[n];
        for (int i = 0; i < n; i++) {
          double s = 0;
          for (int j = 0; j < f; j++) {
            double a = 0;
            for (int k = 0; k < K; k++) {
              a += (double) x[i * K + k] * ref.w1[j * K + k];
            }
            z[i * f + j] = roundBf16((float) a);
            s += Math.max(z[i * f + j], 0f) * (double) ref.w2[j];
          }
          pred[i] = (float) s;
        }
        Step g = Step.gradients(z, pred, y, x, ref.w2, n, f);
        ref.losses[t] = g.loss;
        for (int i = 0; i < ref.w1.length; i++) {
          ref.w1[i] = roundBf16((float) (ref.w1[i] - LEARNING_RATE * g.dw1[i]));
        }
        for (int j = 0; j < f; j++) {
          ref.w2[j] = (float) (ref.w2[j] - LEARNING_RATE * g.dw2[j]);
        }
      }
      return ref;
    }
  }

  /** Round to nearest even bf16, as the tensors store it. */
  static float roundBf16(float v) {
    return Bf16.round(v);
  }

  /** Host or device tensors of any shape, as the communicator's backend takes; closed together. */
  static final class Tensors implements AutoCloseable {
    private final boolean device;
    private final List<AutoCloseable> open = new ArrayList<>();

    Tensors(Backend backend) {
      this.device = backend == Backend.CUDA;
    }

    /** A tensor holding {@code values} rounded to {@code dtype}. */
    Tensor of(float[] values, DType dtype, long... shape) {
      if (!device) {
        HostTensor t = HostTensor.of(values, dtype, shape);
        open.add(t);
        return t;
      }
      DeviceTensor t = DeviceTensor.allocate(dtype, shape);
      open.add(t);
      write(t, values);
      return t;
    }

    /** An output filled with NaN, so that an element an op never writes fails the checks. */
    Tensor output(DType dtype, long... shape) {
      float[] nan = new float[Math.toIntExact(Arrays.stream(shape).reduce(1, Math::multiplyExact))];
      Arrays.fill(nan, Float.NaN);
      return of(nan, dtype, shape);
    }

    void write(Tensor t, float[] values) {
      if (t instanceof HostTensor host) {
        host.copyFrom(values);
        return;
      }
      try (HostTensor staging = HostTensor.of(values, t.dtype(), t.shape())) {
        ((DeviceTensor) t).copyFrom(staging);
      }
    }

    float[] read(Tensor t) {
      if (t instanceof HostTensor host) {
        return host.toFloatArray();
      }
      try (HostTensor staging = HostTensor.allocate(t.dtype(), t.shape())) {
        ((DeviceTensor) t).copyTo(staging);
        return staging.toFloatArray();
      }
    }

    @Override
    public void close() throws Exception {
      for (int i = open.size() - 1; i >= 0; i--) {
        open.get(i).close();
      }
    }
  }

  private static void deleteTree(Path dir) {
    try (Stream<Path> paths = Files.walk(dir)) {
      paths.sorted(Comparator.reverseOrder()).forEach(q -> q.toFile().delete());
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
  }
}
