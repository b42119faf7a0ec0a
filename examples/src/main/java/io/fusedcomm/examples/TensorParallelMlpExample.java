/*
 * 02_tensor_parallel_mlp: the forward and backward (activation gradients) of a tensor-parallel
 * (Megatron-style, sequence-parallel activations) MLP block, Y = GELU(X · W1ᵀ) · W2ᵀ, over the tasks
 * of one barrier stage, with the two fused ops in both GEMM forms:
 *
 *   rank r holds   X_r  : rows Split(M) of X (M × H)            (sequence-parallel activations)
 *                  dY_r : rows Split(M) of dY (M × H)           (the upstream gradient, seeded)
 *                  W1_r : rows Split(F) of W1 (F × H)           (column shard of the first linear)
 *                  W2_r : columns Split(F) of W2 (H × F), stored H × F_r (row shard of the second)
 *   forward (NK layout, C = A · wᵀ)
 *   1. allGatherGemm      Z_r = [X_0; …; X_{W-1}] · W1_rᵀ                 : M × F_r
 *   2. GELU (tanh form), elementwise in Java on the host: A_r = GELU(Z_r)  : M × F_r
 *   3. gemmReduceScatter  Y_r = rows Split(M) of Σ_s A_s · W2_sᵀ          : Split(M) × H
 *   backward (KN layout, C = A · w, on the same stored shards)
 *   4. allGatherGemm      dA_r = [dY_0; …; dY_{W-1}] · W2_r                : M × F_r
 *   5. dZ_r = dA_r ⊙ GELU'(Z_r), elementwise in Java on the host          : M × F_r
 *   6. gemmReduceScatter  dX_r = rows Split(M) of Σ_s dZ_s · W1_s         : Split(M) × H
 *
 * The driver computes the whole Y and dX in fp64 from the same seeded inputs and checks every
 * element of every rank's Y_r and dX_r against its own error bound (see Reference).
 *
 * Inference mode (mode=infer): a few decode steps of the same block as tensor-parallel inference
 * runs it, activations replicated on every rank, with the decode batch M_t in 1, 3, 8, 17, 64
 * (those up to M):
 *
 *   rank r holds   X_t  : M_t × H, the same on every rank     (a step's hidden states, seeded)
 *                  W1_r, W2_r as above
 *   1. GEMM (local)       Z_r = X_t · W1_rᵀ                                : M_t × F_r
 *   2. GELU, in Java on the host: A_r = GELU(Z_r)                         : M_t × F_r
 *   3. gemmAllReduce      Y_t = Σ_s A_s · W2_sᵀ, on every rank            : M_t × H
 *
 * The driver checks every element of every rank's Y_t against the fp64 reference (Reference's Y
 * bound: the same roundings) and that every rank got the same bits. describeFusedOp says which
 * path each step's gemmAllReduce took (on cuda with 2 GPUs, the one-shot kernel at these sizes).
 *
 * Backends: the example asks the communicator (comm.backend()) at run time. With
 * spark.fusedcomm.backend=host the ops take HostTensors; with cuda they take DeviceTensors on the
 * executor's GPU: the shards are uploaded, Z and dA come back to the host for steps 2 and 5 and
 * go up again, Y and dX are downloaded at the end. On cuda the fused ops take bf16 only, and H and
 * every rank's F_r = Split.count(F, world, r) must be positive multiples of 8 (e.g. F divisible by
 * 8 · world); other problems are refused before the job starts.
 *
 * Run (from the repository root; examples/run.sh builds what is missing and prints this line):
 *
 *   $SPARK_HOME/bin/spark-submit --master 'local-cluster[2,1,1024]' \
 *     --jars spark-plugin/target/fusedcomm-0.1.0-SNAPSHOT.jar \
 *     --conf spark.plugins=io.fusedcomm.FusedCommPlugin \
 *     --conf spark.fusedcomm.backend=host \
 *     --class io.fusedcomm.examples.TensorParallelMlpExample \
 *     examples/target/fusedcomm-examples-0.1.0-SNAPSHOT.jar [world=2] [M=125] [H=64] [F=256] [dtype=bf16]
 *     [seed=fresh] [mode=train|infer]
 *
 * or, with no Spark installation:  examples/run.sh 02_tensor_parallel_mlp [world] [M] [H] [F] [dtype] [seed] [mode]
 *
 * On one host's GPUs (one executor per GPU), the same with the cuda backend and Spark's GPU
 * scheduling:
 *
 *   FUSEDCOMM_BACKEND=cuda EXTRA_SUBMIT_ARGS="--conf spark.worker.resource.gpu.amount=1
 *     --conf spark.worker.resource.gpu.discoveryScript=$PWD/conf/gpu-discovery.sh
 *     --conf spark.executor.resource.gpu.amount=1
 *     --conf spark.executor.resource.gpu.discoveryScript=$PWD/conf/gpu-discovery.sh
 *     --conf spark.task.resource.gpu.amount=1" examples/run.sh 02_tensor_parallel_mlp 2 125 64 256 bf16
 *
 * Exit status 0 when every element of Y and dX (inference: of every step's Y, the same bits on
 * every rank) is within its bound, 1 otherwise.
 */
package io.fusedcomm.examples;

import io.fusedcomm.api.Backend;
import io.fusedcomm.api.CommOptions;
import io.fusedcomm.api.Communicator;
import io.fusedcomm.api.DType;
import io.fusedcomm.api.DeviceTensor;
import io.fusedcomm.api.HostTensor;
import io.fusedcomm.api.RankPlacement;
import io.fusedcomm.api.Split;
import io.fusedcomm.api.Tensor;
import io.fusedcomm.api.WeightLayout;
import io.fusedcomm.config.FusedCommConf;
import io.fusedcomm.spark.BarrierStage;
import java.io.Serializable;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Comparator;
import java.util.Deque;
import java.util.List;
import java.util.Locale;
import java.util.function.Function;
import java.util.stream.Collectors;
import java.util.stream.IntStream;
import org.apache.spark.SparkConf;

/** Example 02: a tensor-parallel MLP forward and backward with the fused ops, checked against fp64. */
public final class TensorParallelMlpExample {
  static final String NAME = "02_tensor_parallel_mlp";

  private TensorParallelMlpExample() {}

  /** Global problem: shapes, dtype and seed; every rank derives its shards from it. */
  record Problem(int world, int m, int h, int f, DType dtype, long seed, int step) implements Serializable {
    /** The training problem (step 0). */
    Problem(int world, int m, int h, int f, DType dtype, long seed) {
      this(world, m, h, f, dtype, seed, 0);
    }

    /** Decode step {@code step} (from 1) with batch {@code batch}: the same weights, its own X. */
    Problem decodeStep(int step, int batch) {
      return new Problem(world, batch, h, f, dtype, seed, step);
    }

    float[] x() {
      return SeededValues.uniform(SeededValues.seed(seed, step == 0 ? 1 : 100 + step), m * h, 1.0, dtype);
    }

    /** W1: F × H, scaled so that Z has unit-order entries. */
    float[] w1() {
      return SeededValues.uniform(SeededValues.seed(seed, 2), f * h, Math.sqrt(3.0 / h), dtype);
    }

    /** W2: H × F. */
    float[] w2() {
      return SeededValues.uniform(SeededValues.seed(seed, 3), h * f, Math.sqrt(3.0 / f), dtype);
    }

    /** dY: M × H, the gradient of the loss with respect to Y. */
    float[] dy() {
      return SeededValues.uniform(SeededValues.seed(seed, 4), m * h, 1.0, dtype);
    }

    String describe() {
      return String.format(Locale.ROOT, "world=%d, M=%d, H=%d, F=%d, dtype=%s", world, m, h, f, dtype.label());
    }
  }

  /** Wall time of one pass's three steps on one rank, in ms. */
  record Timings(double allGatherGemmMs, double elementwiseMs, double gemmReduceScatterMs) implements Serializable {}

  /**
   * One rank's output rows of Y and dX, where it ran (executor and GPU), its timings, and how its
   * backend ran the two fused ops ({@link Communicator#describeFusedOp}: the backward's calls have
   * the forward's sizes, so the same lines).
   */
  record Shard(int rank, int rowOffset, int rows, float[] y, float[] dx, String backend, String device,
      Timings forward, Timings backward, List<String> paths) implements Serializable {}

  /**
   * Runs the example (driver side): {@code [world=2] [M=125] [H=64] [F=256] [dtype=bf16|f32]
   * [seed=fresh]}; exits 1 unless every element of Y and dX is within its bound.
   */
  public static void main(String[] args) throws Exception {
    int world = Math.toIntExact(ExampleContext.positiveArg(args, 0, "world", 2));
    int m = Math.toIntExact(ExampleContext.positiveArg(args, 1, "M", 125));
    int h = Math.toIntExact(ExampleContext.positiveArg(args, 2, "H", 64));
    int f = Math.toIntExact(ExampleContext.positiveArg(args, 3, "F", 256));
    DType dtype = args.length > 4 ? parseDType(args[4]) : DType.BF16;
    long seed = args.length > 5 && !args[5].trim().equals("fresh") ? Long.parseLong(args[5].trim()) : System.nanoTime();
    boolean infer = args.length > 6 && parseMode(args[6]);
    Problem p = new Problem(world, m, h, f, dtype, seed);
    // spark-submit hands its --conf settings to the driver as system properties, which a fresh
    // SparkConf reads: a problem the requested backend cannot run fails here, before any
    // executor starts. (auto is resolved on the executors; each rank checks again.)
    requireSupported(p, FusedCommConf.fromSparkConf(new SparkConf()).backend());
    if (infer) {
      infer(p);
      return;
    }

    ExampleContext.run(NAME, world, (sc, tasks) -> {
      System.out.printf(Locale.ROOT, "%s: %s seed=%d master=%s%n", NAME, p.describe(), seed, sc.master());
      // The four op calls in order; the backward ones have the same global shapes as the forward.
      CommOptions options = CommOptions.defaults().name("tp-mlp")
          .expectOp("allGatherGemm", dtype, m, f, h)
          .expectOp("gemmReduceScatter", dtype, m, h, f)
          .expectOp("allGatherGemm", dtype, m, f, h)
          .expectOp("gemmReduceScatter", dtype, m, h, f);
      List<Shard> shards = BarrierStage.withCommunicator(tasks, options,
          (comm, context, rows) -> List.of(forwardAndBackward(comm, p)).iterator()).collect();
      return check(p, shards);
    });
  }

  /** Decode batches of the inference mode: those of 1, 3, 8, 17, 64 up to {@code m}. */
  static List<Integer> decodeBatches(int m) {
    return IntStream.of(1, 3, 8, 17, 64).filter(b -> b <= m).boxed().collect(Collectors.toList());
  }

  /** The inference mode's job (driver side); exits 1 unless every step checks. */
  static void infer(Problem p) throws Exception {
    List<Integer> batches = decodeBatches(p.m());
    ExampleContext.run(NAME, p.world(), (sc, tasks) -> {
      System.out.printf(Locale.ROOT, "%s: inference, %s, decode batches %s, seed=%d master=%s%n", NAME, p.describe(),
          batches, p.seed(), sc.master());
      CommOptions options = CommOptions.defaults().name("tp-decode");
      for (int b : batches) {
        options.expectOp("gemmAllReduce", p.dtype(), b, p.h(), p.f());
      }
      List<DecodeShard> shards = BarrierStage.withCommunicator(tasks, options,
          (comm, context, rows) -> List.of(decode(comm, p, batches)).iterator()).collect();
      return checkDecode(p, batches, shards);
    });
  }

  /** train (the default) or infer. */
  static boolean parseMode(String s) {
    switch (s.trim().toLowerCase(Locale.ROOT)) {
      case "train":
        return false;
      case "infer":
        return true;
      default:
        throw new IllegalArgumentException("mode must be train or infer, got '" + s + "'");
    }
  }

  static DType parseDType(String s) {
    switch (s.trim().toLowerCase(Locale.ROOT)) {
      case "bf16":
        return DType.BF16;
      case "f32":
      case "fp32":
        return DType.F32;
      default:
        throw new IllegalArgumentException("dtype must be bf16 or f32, got '" + s + "'");
    }
  }

  /**
   * Refuses a problem that {@code backend}'s fused ops cannot run, with a message naming the
   * sizes: the cuda kernels take bf16 only, with N and K multiples of 8, which here means H and
   * every rank's F_r. The host backend runs any sizes.
   */
  static void requireSupported(Problem p, Backend backend) {
    if (backend != Backend.CUDA) {
      return;
    }
    if (p.dtype() != DType.BF16) {
      throw new IllegalArgumentException(NAME + ": the cuda backend's fused ops take bf16 only, got dtype="
          + p.dtype().label() + " (use bf16, or spark.fusedcomm.backend=host for f32)");
    }
    List<String> bad = new ArrayList<>();
    if (p.h() % 8 != 0) {
      bad.add("H=" + p.h());
    }
    for (int r = 0; r < p.world(); r++) {
      long fr = Split.count(p.f(), p.world(), r);
      if (fr == 0 || fr % 8 != 0) {
        bad.add("F_" + r + "=" + fr);
      }
    }
    if (!bad.isEmpty()) {
      throw new IllegalArgumentException(NAME + ": on the cuda backend H and every rank's F_r = Split.count(F, world, r)"
          + " must be positive multiples of 8 (e.g. F divisible by 8·world = " + 8 * p.world() + "); "
          + p.describe() + " gives " + String.join(", ", bad));
    }
  }

  /** The tensor-parallel forward and backward on one rank, on the communicator's backend. */
  static Shard forwardAndBackward(Communicator comm, Problem p) {
    int w = comm.world();
    int r = comm.rank();
    if (w != p.world()) {
      throw new IllegalStateException("the stage has " + w + " tasks, the problem expects " + p.world());
    }
    requireSupported(p, comm.backend());
    int m = p.m();
    int h = p.h();
    int rowOffset = (int) Split.offset(m, w, r);
    int rows = (int) Split.count(m, w, r);
    int fOffset = (int) Split.offset(p.f(), w, r);
    int fLocal = (int) Split.count(p.f(), w, r);

    float[] xLocal = Arrays.copyOfRange(p.x(), rowOffset * h, (rowOffset + rows) * h);
    float[] dyLocal = Arrays.copyOfRange(p.dy(), rowOffset * h, (rowOffset + rows) * h);
    // W1 rows fOffset.. (F_r × H): contiguous in row-major W1.
    float[] w1Local = Arrays.copyOfRange(p.w1(), fOffset * h, (fOffset + fLocal) * h);
    // W2 columns fOffset.. (H × F_r): one strided slice per row of W2.
    float[] w2 = p.w2();
    float[] w2Local = new float[h * fLocal];
    for (int i = 0; i < h; i++) {
      System.arraycopy(w2, i * p.f() + fOffset, w2Local, i * fLocal, fLocal);
    }

    try (OpTensors t = new OpTensors(comm.backend(), p.dtype())) {
      Tensor x = t.of(xLocal, rows, h);
      Tensor dy = t.of(dyLocal, rows, h);
      Tensor w1T = t.of(w1Local, fLocal, h);   // NK: N × K = F_r × H;  KN: K_r × N = F_r × H
      Tensor w2T = t.of(w2Local, h, fLocal);   // NK: N × K_r = H × F_r; KN: K × N_r = H × F_r
      Tensor hidden = t.output(m, fLocal);     // Z, then A = GELU(Z) in place
      Tensor grad = t.output(m, fLocal);       // dA, then dZ in place
      Tensor y = t.output(rows, h);
      Tensor dx = t.output(rows, h);

      long t0 = System.nanoTime();
      comm.allGatherGemm(x, w1T, hidden, WeightLayout.NK);
      long t1 = System.nanoTime();
      float[] z = t.read(hidden); // kept for GELU'(Z) in the backward
      float[] a = new float[z.length];
      for (int i = 0; i < a.length; i++) {
        a[i] = (float) gelu(z[i]);
      }
      t.write(hidden, a); // rounds to the dtype, as a bf16 activation tensor would be stored
      long t2 = System.nanoTime();
      comm.gemmReduceScatter(hidden, w2T, y, WeightLayout.NK);
      long t3 = System.nanoTime();

      comm.allGatherGemm(dy, w2T, grad, WeightLayout.KN);
      long t4 = System.nanoTime();
      float[] g = t.read(grad);
      for (int i = 0; i < g.length; i++) {
        g[i] = (float) (g[i] * geluGrad(z[i]));
      }
      t.write(grad, g); // rounded to the dtype like the forward activation
      long t5 = System.nanoTime();
      comm.gemmReduceScatter(grad, w1T, dx, WeightLayout.KN);
      long t6 = System.nanoTime();

      RankPlacement me = comm.placements().get(r);
      String device = "executor " + me.executorId()
          + (me.gpuUuid().isEmpty() ? ", no GPU" : ", GPU " + me.gpuAddress() + " " + me.gpuUuid());
      List<String> paths = List.of(comm.describeFusedOp("allGatherGemm", m, fLocal, h),
          comm.describeFusedOp("gemmReduceScatter", m, h, fLocal));
      return new Shard(r, rowOffset, rows, t.read(y), t.read(dx), comm.backend().configName(), device,
          new Timings((t1 - t0) / 1e6, (t2 - t1) / 1e6, (t3 - t2) / 1e6),
          new Timings((t4 - t3) / 1e6, (t5 - t4) / 1e6, (t6 - t5) / 1e6), paths);
    }
  }

  /** One decode step on one rank: its Y (all rows), and the wall time of its three steps in ms. */
  record DecodeStep(int batch, float[] y, double gemmMs, double geluMs, double gemmAllReduceMs, String path)
      implements Serializable {}

  /** One rank's decode steps and where it ran. */
  record DecodeShard(int rank, String backend, String device, List<DecodeStep> steps) implements Serializable {}

  /**
   * The decode steps on one rank (inference mode): per step the local GEMM with its W1 shard,
   * GELU, then gemmAllReduce with its W2 shard; the weights stay in place across steps.
   */
  static DecodeShard decode(Communicator comm, Problem p, List<Integer> batches) {
    int w = comm.world();
    int r = comm.rank();
    if (w != p.world()) {
      throw new IllegalStateException("the stage has " + w + " tasks, the problem expects " + p.world());
    }
    requireSupported(p, comm.backend());
    int h = p.h();
    int fOffset = (int) Split.offset(p.f(), w, r);
    int fLocal = (int) Split.count(p.f(), w, r);
    float[] w1Local = Arrays.copyOfRange(p.w1(), fOffset * h, (fOffset + fLocal) * h);
    float[] w2 = p.w2();
    float[] w2Local = new float[h * fLocal];
    for (int i = 0; i < h; i++) {
      System.arraycopy(w2, i * p.f() + fOffset, w2Local, i * fLocal, fLocal);
    }
    List<DecodeStep> steps = new ArrayList<>();
    try (OpTensors t = new OpTensors(comm.backend(), p.dtype())) {
      Tensor w1T = t.of(w1Local, fLocal, h);  // NK: F_r × H
      Tensor w2T = t.of(w2Local, h, fLocal);  // NK: H × F_r
      for (int s = 0; s < batches.size(); s++) {
        int b = batches.get(s);
        Problem step = p.decodeStep(s + 1, b);
        Tensor x = t.of(step.x(), b, h);
        Tensor hidden = t.output(b, fLocal);
        Tensor y = t.output(b, h);
        long t0 = System.nanoTime();
        Communicator.gemm(x, w1T, hidden, WeightLayout.NK);
        long t1 = System.nanoTime();
        float[] z = t.read(hidden);
        for (int i = 0; i < z.length; i++) {
          z[i] = (float) gelu(z[i]);
        }
        t.write(hidden, z);
        long t2 = System.nanoTime();
        comm.gemmAllReduce(hidden, w2T, y, WeightLayout.NK);
        float[] out = t.read(y);
        long t3 = System.nanoTime();
        steps.add(new DecodeStep(b, out, (t1 - t0) / 1e6, (t2 - t1) / 1e6, (t3 - t2) / 1e6,
            comm.describeFusedOp("gemmAllReduce", b, h, fLocal)));
      }
    }
    RankPlacement me = comm.placements().get(r);
    String device = "executor " + me.executorId()
        + (me.gpuUuid().isEmpty() ? ", no GPU" : ", GPU " + me.gpuAddress() + " " + me.gpuUuid());
    return new DecodeShard(r, comm.backend().configName(), device, steps);
  }

  /**
   * Checks every step's Y on every rank against the fp64 reference, and that every rank got the
   * same bits; prints the per-step table, the paths and the final line.
   */
  static boolean checkDecode(Problem p, List<Integer> batches, List<DecodeShard> shards) {
    List<DecodeShard> sorted =
        shards.stream().sorted(Comparator.comparingInt(DecodeShard::rank)).collect(Collectors.toList());
    boolean passed = sorted.size() == p.world();
    for (DecodeShard shard : sorted) {
      System.out.printf(Locale.ROOT, "rank %d ran on %s (%s backend)%n", shard.rank(), shard.device(), shard.backend());
      passed &= shard.steps().size() == batches.size();
    }
    System.out.println("decode: Z = gemm(X, W1), A = GELU(Z), Y = gemmAllReduce(A, W2)");
    System.out.printf(Locale.ROOT, "%-5s %5s %9s %9s %18s%n", "rank", "M", "gemm ms", "gelu ms", "gemmAllReduce ms");
    for (DecodeShard shard : sorted) {
      for (DecodeStep st : shard.steps()) {
        System.out.printf(Locale.ROOT, "%-5d %5d %9.3f %9.3f %18.3f%n", shard.rank(), st.batch(), st.gemmMs(),
            st.geluMs(), st.gemmAllReduceMs());
      }
    }
    double maxErr = 0;
    long bad = 0;
    for (int s = 0; s < batches.size() && passed; s++) {
      Problem step = p.decodeStep(s + 1, batches.get(s));
      Reference ref = new Reference(step);
      float[] first = sorted.get(0).steps().get(s).y();
      for (DecodeShard shard : sorted) {
        DecodeStep st = shard.steps().get(s);
        if (shard.rank() == 0) {
          System.out.println("  " + st.path());
        }
        if (!Arrays.equals(st.y(), first)) {
          System.out.printf(Locale.ROOT, "  step %d (M=%d): rank %d's Y differs from rank 0's%n", s + 1, st.batch(),
              shard.rank());
          passed = false;
        }
        Errors e = compareRows("Y (step " + (s + 1) + ", rank " + shard.rank() + ")", st.y(), ref.y, ref.yTolerance);
        bad += e.bad();
        maxErr = Math.max(maxErr, e.maxErr());
      }
    }
    passed &= bad == 0;
    String backend = shards.stream().map(DecodeShard::backend).distinct().collect(Collectors.joining(","));
    String steps = batches.stream().map(String::valueOf).collect(Collectors.joining(","));
    if (passed) {
      System.out.printf(Locale.ROOT, "%s: check passed for inference (world=%d, H=%d, F=%d, dtype=%s, backend=%s,"
          + " decode M=%s, same bits on every rank, max_abs_err Y=%.3e)%n", NAME, p.world(), p.h(), p.f(),
          p.dtype().label(), backend, steps, maxErr);
    } else {
      System.out.printf(Locale.ROOT, "%s: FAILED inference (world=%d, H=%d, F=%d, dtype=%s, backend=%s, decode M=%s:"
          + " %d elements out of bounds, %d of %d ranks reported)%n", NAME, p.world(), p.h(), p.f(), p.dtype().label(),
          backend, steps, bad, shards.size(), p.world());
    }
    return passed;
  }

  /** Every element of one all-rows output against the reference; prints the first mismatches. */
  private static Errors compareRows(String name, float[] got, double[] ref, double[] tolerance) {
    long bad = 0;
    double maxErr = 0;
    if (got.length != ref.length) {
      System.out.printf(Locale.ROOT, "  %s: %d elements, expected %d%n", name, got.length, ref.length);
      return new Errors(Math.max(1, ref.length), Double.POSITIVE_INFINITY);
    }
    for (int i = 0; i < got.length; i++) {
      double err = Double.isNaN(got[i]) ? Double.POSITIVE_INFINITY : Math.abs(got[i] - ref[i]);
      if (!(err <= tolerance[i])) {
        if (bad < 5) {
          System.out.printf(Locale.ROOT, "  mismatch %s[%d]: got %.6g, reference %.6g, tolerance %.3g%n", name, i,
              got[i], ref[i], tolerance[i]);
        }
        bad++;
      }
      maxErr = Math.max(maxErr, err);
    }
    return new Errors(bad, maxErr);
  }

  /**
   * The 2-D tensors one rank's ops take, in the memory of the communicator's backend: {@link
   * HostTensor}s on host, {@link DeviceTensor}s on the executor's GPU on cuda, filled and read
   * through host staging tensors there. It owns every tensor it makes; closing it frees them all.
   */
  static final class OpTensors implements AutoCloseable {
    private final boolean device;
    private final DType dtype;
    private final Deque<Runnable> closers = new ArrayDeque<>();

    OpTensors(Backend backend, DType dtype) {
      this.device = backend == Backend.CUDA;
      this.dtype = dtype;
    }

    /** A {@code rows × cols} tensor holding {@code values} rounded to the dtype. */
    Tensor of(float[] values, int rows, int cols) {
      if (!device) {
        HostTensor t = HostTensor.of(values, dtype, rows, cols);
        closers.push(t::close);
        return t;
      }
      DeviceTensor t = DeviceTensor.allocate(dtype, rows, cols);
      closers.push(t::close);
      write(t, values);
      return t;
    }

    /** An output tensor filled with NaN, so that an element the op never writes fails the check. */
    Tensor output(int rows, int cols) {
      float[] nan = new float[Math.multiplyExact(rows, cols)];
      Arrays.fill(nan, Float.NaN);
      return of(nan, rows, cols);
    }

    /** Overwrites {@code t} with {@code values} rounded to the dtype. */
    void write(Tensor t, float[] values) {
      if (t instanceof HostTensor host) {
        host.copyFrom(values);
        return;
      }
      try (HostTensor staging = HostTensor.of(values, dtype, t.shape())) {
        ((DeviceTensor) t).copyFrom(staging);
      }
    }

    /** The elements of {@code t}, widened to float. */
    float[] read(Tensor t) {
      if (t instanceof HostTensor host) {
        return host.toFloatArray();
      }
      try (HostTensor staging = HostTensor.allocate(dtype, t.shape())) {
        ((DeviceTensor) t).copyTo(staging);
        return staging.toFloatArray();
      }
    }

    @Override
    public void close() {
      while (!closers.isEmpty()) {
        closers.pop().run();
      }
    }
  }

  /** GELU, tanh approximation: 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))). */
  static double gelu(double x) {
    return 0.5 * x * (1.0 + Math.tanh(Math.sqrt(2.0 / Math.PI) * (x + 0.044715 * x * x * x)));
  }

  /** GELU' of the tanh form: 0.5·(1 + t) + 0.5·x·(1 − t²)·√(2/π)·(1 + 3·0.044715·x²), t = tanh(…). */
  static double geluGrad(double x) {
    double c = Math.sqrt(2.0 / Math.PI);
    double t = Math.tanh(c * (x + 0.044715 * x * x * x));
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c * (1.0 + 3 * 0.044715 * x * x);
  }

  /** The single-process reference, in fp64 from the same (dtype-rounded) inputs. */
  static final class Reference {
    /** L ≥ max |GELU'(x)| over all x (the tanh form peaks at about 1.129). */
    static final double GELU_LIPSCHITZ = 1.13;

    /** L2 ≥ max |GELU''(x)| over all x (the tanh form peaks at x = 0 with √(2/π) ≈ 0.7979). */
    static final double GELU_GRAD_LIPSCHITZ = 0.8;

    /**
     * Confidence factor of the probabilistic bounds: by Hoeffding's inequality a sum of
     * independent zero-mean errors |e_f| ≤ b_f exceeds λ·√(Σ b_f²) with probability at most
     * 2·exp(-λ²/2) ≈ 4.6e-11 for λ = 7, i.e. under 1e-6 per run of a few thousand elements.
     */
    static final double LAMBDA = 7.0;

    final double[] y;
    final double[] yTolerance;
    final double[] dx;
    final double[] dxTolerance;

    /**
     * Y = GELU(X·W1ᵀ)·W2ᵀ and dX = ((dY·W2) ⊙ GELU'(X·W1ᵀ))·W1 (both M × H) and, per element, a
     * bound on how far the distributed path may land from them. Rounding errors are modelled as
     * independent, zero-mean and bounded (the probabilistic analysis of Higham and Mary, SIAM J.
     * Sci. Comput. 41(5), 2019), since worst-case bounds grow with F where real errors grow with
     * √F and would let a wrong answer pass. Second-order terms (products of two roundings) are
     * left out except where noted; λ leaves ample room for them. u = the dtype's unit roundoff,
     * v = 2^-24 (fp32). Per row of X (one token), for f in [0, F):
     *
     * <pre>
     * forward, S1_f = Σ_k |X_k·W1_fk|, p_r = rank r's partial Σ_{f in shard r} A_f·W2_if:
     *   |δZ_f| ≤ b_f = u·|Z_f| + λ·√H·v·S1_f              allGatherGemm: accumulate, round Z
     *   |δA_f| ≤ a_f = L·b_f + (u + v)·|A_f|             GELU is L-Lipschitz; float, then dtype
     *   |δY_i| ≤ λ·√(Σ_f (W2_if·a_f)²)                   activation errors, independent over f
     *          + λ·√F·v·Σ_f |A_f·W2_if|                  fp32 accumulation of the second GEMM
     *          + w·u·Σ_r |p_r|                           each partial and each reduction step rounded
     *          + u·|Y_i|                                  the output rounded
     *
     * backward, G = GELU', S2_f = Σ_i |dY_i·W2_if|, q_r = Σ_{f in shard r} dZ_f·W1_fk:
     *   |δdA_f| ≤ c_f = u·|dA_f| + λ·√H·v·S2_f            allGatherGemm (KN): accumulate, round dA
     *   |δG_f|  ≤ L2·b_f                                  G evaluated at the stored Z; |G''| ≤ L2
     *                                                     (G itself is computed in fp64: exact enough)
     *   |δdZ_f| ≤ e_f = (|G_f| + L2·b_f)·c_f              dA's error times the perturbed G
     *                 + L2·b_f·|dA_f|                     G's error times dA
     *                 + (u + v)·|dZ_f|                    the product: float, then dtype
     *   |δdX_k| ≤ λ·√(Σ_f (W1_fk·e_f)²)                   dZ errors, independent over f
     *           + λ·√F·v·Σ_f |dZ_f·W1_fk|                 fp32 accumulation of gemmReduceScatter (KN)
     *           + w·u·Σ_r |q_r|                           partials and reduction steps rounded
     *           + u·|dX_k|                                the output rounded
     * </pre>
     *
     * No averaging anywhere: every element must be within its own bound.
     */
    Reference(Problem p) {
      this(p, true);
    }

    /**
     * With {@code parallel}, rows (tokens) on the common fork-join pool: each row's values and
     * bounds are computed by the same sums in the same order either way, so the results are
     * identical (a test compares them). The weights are read through transposed copies so that
     * every sum walks memory contiguously: with W1 and W2 as given, the dX and dA sums stride by
     * H or F elements, and at M = 2048, H = 4096, F = 2048 the single-threaded strided check did
     * not finish in 300 s on the GPU host.
     */
    Reference(Problem p, boolean parallel) {
      float[] x = p.x();
      float[] w1 = p.w1();
      float[] w2 = p.w2();
      float[] dy = p.dy();
      int m = p.m();
      int h = p.h();
      int f = p.f();
      float[] w1t = transpose(w1, f, h);  // W1ᵀ: H × F, W1_fk at w1t[k·F + f]
      float[] w2t = transpose(w2, h, f);  // W2ᵀ: F × H, W2_if at w2t[f·H + i]
      double u = SeededValues.unitRoundoff(p.dtype());
      double v = 0x1p-24;
      y = new double[m * h];
      yTolerance = new double[m * h];
      dx = new double[m * h];
      dxTolerance = new double[m * h];
      IntStream rows = IntStream.range(0, m);
      (parallel ? rows.parallel() : rows).forEach(row -> {
        double[] act = new double[f];
        double[] actErr = new double[f];
        double[] dz = new double[f];
        double[] dzErr = new double[f];
        for (int j = 0; j < f; j++) {
          // Z_f = Σ_k X_k·W1_fk: W1_fk at w1[f·H + k].
          Dot zDot = Dot.of(x, row * h, w1, j * h, h, u, v);
          double z = zDot.value();
          double zErr = zDot.bound();
          act[j] = gelu(z);
          actErr[j] = GELU_LIPSCHITZ * zErr + (u + v) * Math.abs(act[j]);

          // dA_f = Σ_i dY_i·W2_if: W2_if at w2t[f·H + i].
          Dot daDot = Dot.of(dy, row * h, w2t, j * h, h, u, v);
          double da = daDot.value();
          double daErr = daDot.bound();
          double g = geluGrad(z);
          double gErr = GELU_GRAD_LIPSCHITZ * zErr;
          dz[j] = da * g;
          dzErr[j] = (Math.abs(g) + gErr) * daErr + gErr * Math.abs(da) + (u + v) * Math.abs(dz[j]);
        }
        for (int i = 0; i < h; i++) {
          // Y_i = Σ_f A_f·W2_if: weight f at w2[i·F + f].
          reduce(p, act, actErr, w2, i * f, y, yTolerance, row * h + i);
          // dX_k = Σ_f dZ_f·W1_fk: weight f at w1t[k·F + f].
          reduce(p, dz, dzErr, w1t, i * f, dx, dxTolerance, row * h + i);
        }
      });
    }

    /** The {@code cols × rows} transpose of a row-major {@code rows × cols} matrix. */
    private static float[] transpose(float[] a, int rows, int cols) {
      float[] t = new float[a.length];
      for (int r = 0; r < rows; r++) {
        for (int c = 0; c < cols; c++) {
          t[c * rows + r] = a[r * cols + c];
        }
      }
      return t;
    }

    /**
     * The first GEMM of a pass for one element: {@code value = Σ_k a[aBase + k]·b[bBase + k]}
     * over {@code k < n}, in fp64, and {@code bound}, the first line of its bounds above
     * ({@code u·|value| + λ·√n·v·Σ_k |a·b|}: the dtype GEMM accumulates, then rounds).
     */
    private record Dot(double value, double bound) {
      static Dot of(float[] a, int aBase, float[] b, int bBase, int n, double u, double v) {
        double sum = 0;
        double abs = 0;
        for (int k = 0; k < n; k++) {
          double t = (double) a[aBase + k] * b[bBase + k];
          sum += t;
          abs += Math.abs(t);
        }
        return new Dot(sum, u * Math.abs(sum) + LAMBDA * Math.sqrt(n) * v * abs);
      }
    }

    /**
     * The second GEMM of a pass for one output element: {@code out[at] = Σ_f in_f·wt_f} with
     * weight f at {@code wt[base + f]}, F split over the ranks by {@link Split} as the ops split
     * it, and in {@code tolerance[at]} the last four lines of the bounds above, given
     * {@code inErr_f}, the bound on input f's error.
     */
    private static void reduce(Problem p, double[] in, double[] inErr, float[] wt, int base,
        double[] out, double[] tolerance, int at) {
      int f = p.f();
      int w = p.world();
      double u = SeededValues.unitRoundoff(p.dtype());
      double v = 0x1p-24;
      double propagated = 0;
      double magnitude = 0;
      double total = 0;
      double partials = 0;
      for (int r = 0; r < w; r++) {
        int from = (int) Split.offset(f, w, r);
        int to = from + (int) Split.count(f, w, r);
        double partial = 0;
        for (int j = from; j < to; j++) {
          double wj = wt[base + j];
          partial += in[j] * wj;
          propagated += (wj * inErr[j]) * (wj * inErr[j]);
          magnitude += Math.abs(in[j] * wj);
        }
        total += partial;
        partials += Math.abs(partial);
      }
      out[at] = total;
      tolerance[at] = LAMBDA * Math.sqrt(propagated) + LAMBDA * Math.sqrt(f) * v * magnitude
          + w * u * partials + u * Math.abs(total);
    }
  }

  /** How one checked tensor (Y or dX) compares with the reference: elements out of bounds, max |error|. */
  private record Errors(long bad, double maxErr) {}

  /**
   * Checks every element of Y and dX of every shard; prints the per-rank timing tables, the errors
   * and the final line.
   */
  static boolean check(Problem p, List<Shard> shards) {
    Reference ref = new Reference(p);
    List<Shard> sorted = shards.stream().sorted(Comparator.comparingInt(Shard::rank)).collect(Collectors.toList());
    for (Shard shard : sorted) {
      System.out.printf(Locale.ROOT, "rank %d ran on %s (%s backend)%n", shard.rank(), shard.device(), shard.backend());
    }
    for (Shard shard : sorted) {
      for (String path : shard.paths()) {
        System.out.println("  " + path);
      }
    }
    printTimings("forward (NK): Z = allGatherGemm(X, W1), A = GELU(Z), Y = gemmReduceScatter(A, W2)", "Y rows",
        "gelu ms", sorted, Shard::forward);
    printTimings("backward (KN): dA = allGatherGemm(dY, W2), dZ = dA ⊙ GELU'(Z), dX = gemmReduceScatter(dZ, W1)",
        "dX rows", "gelu' ms", sorted, Shard::backward);

    // Shards must tile the rows in rank order by the Split rule; a malformed one is not compared.
    boolean passed = sorted.size() == p.world();
    List<Shard> wellFormed = new ArrayList<>();
    int nextRow = 0;
    for (int s = 0; s < sorted.size(); s++) {
      Shard shard = sorted.get(s);
      int elements = shard.rows() * p.h();
      if (shard.rank() != s || shard.rowOffset() != nextRow || shard.rows() != Split.count(p.m(), p.world(), s)
          || shard.y().length != elements || shard.dx().length != elements) {
        System.out.println("  rank " + shard.rank() + " returned the wrong rows or shape");
        passed = false;
        continue;
      }
      nextRow += shard.rows();
      wellFormed.add(shard);
    }
    passed &= nextRow == p.m();
    Errors y = compare("Y", p, wellFormed, Shard::y, ref.y, ref.yTolerance);
    Errors dx = compare("dX", p, wellFormed, Shard::dx, ref.dx, ref.dxTolerance);
    passed &= y.bad() == 0 && dx.bad() == 0;

    String backend = shards.stream().map(Shard::backend).distinct().collect(Collectors.joining(","));
    if (passed) {
      System.out.printf(Locale.ROOT, "%s: check passed for forward+backward (%s, backend=%s, max_abs_err Y=%.3e,"
          + " dX=%.3e)%n", NAME, p.describe(), backend, y.maxErr(), dx.maxErr());
    } else {
      System.out.printf(Locale.ROOT, "%s: FAILED forward+backward (%s, backend=%s, out of bounds: %d elements of Y,"
          + " %d of dX; %d of %d ranks reported)%n", NAME, p.describe(), backend, y.bad(), dx.bad(), shards.size(),
          p.world());
    }
    return passed;
  }

  private static void printTimings(String title, String rowsHeader, String elementwiseHeader, List<Shard> sorted,
      Function<Shard, Timings> pass) {
    System.out.println(title);
    System.out.printf(Locale.ROOT, "%-5s %9s %18s %10s %21s%n", "rank", rowsHeader, "allGatherGemm ms",
        elementwiseHeader, "gemmReduceScatter ms");
    for (Shard shard : sorted) {
      Timings t = pass.apply(shard);
      System.out.printf(Locale.ROOT, "%-5d %9s %18.3f %10.3f %21.3f%n", shard.rank(),
          shard.rowOffset() + ".." + (shard.rowOffset() + shard.rows() - 1), t.allGatherGemmMs(), t.elementwiseMs(),
          t.gemmReduceScatterMs());
    }
  }

  /** Compares one tensor element by element, prints its first mismatches and its error line. */
  private static Errors compare(String name, Problem p, List<Shard> shards, Function<Shard, float[]> values,
      double[] ref, double[] tolerance) {
    long bad = 0;
    double maxErr = 0;
    double tolAtMax = 0;
    double worstRatio = 0;
    for (Shard shard : shards) {
      float[] got = values.apply(shard);
      for (int i = 0; i < got.length; i++) {
        int at = shard.rowOffset() * p.h() + i;
        double err = Double.isNaN(got[i]) ? Double.POSITIVE_INFINITY : Math.abs(got[i] - ref[at]);
        if (!(err <= tolerance[at])) {
          if (bad < 5) {
            System.out.printf(Locale.ROOT, "  mismatch %s[%d][%d]: got %.6g, reference %.6g, tolerance %.3g%n", name,
                at / p.h(), at % p.h(), got[i], ref[at], tolerance[at]);
          }
          bad++;
        }
        if (err > maxErr) {
          maxErr = err;
          tolAtMax = tolerance[at];
        }
        worstRatio = Math.max(worstRatio, err / tolerance[at]);
      }
    }
    double maxRef = Arrays.stream(ref).map(Math::abs).max().orElse(0);
    System.out.printf(Locale.ROOT, "%s: max |error| %.3e (tolerance there %.3e), worst error/tolerance %.3f,"
        + " max |%s| %.3f, %d of %d elements out of bounds%n", name, maxErr, tolAtMax, worstRatio, name, maxRef, bad,
        (long) p.m() * p.h());
    return new Errors(bad, maxErr);
  }
}
