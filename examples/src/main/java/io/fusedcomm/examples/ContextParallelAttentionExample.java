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
 * With mode=train the ranks also train: Q, K and V themselves are the parameters (each rank
 * keeps its rows in fp32 and rounds them to the dtype for every step), the loss is
 * L = ½ Σ (O - T)² over the whole sequence with a fixed target T (one vector per K/V head,
 * from the seed, at every position and for every query head of the group: V rows all equal to
 * it reach L = 0), and each step is
 *   2. ringAttention           O_r, LSE_r as above
 *   3. dO_r = O_r - T_r        on the rank, rounded to the dtype
 *   4. ringAttentionBackward   dQ_r, dK_r, dV_r; K/V blocks pass around the ring again and their
 *                              dK/dV partials travel with them back to the rank that holds them
 *   5. SGD                     Q_r -= lr·dQ_r, K_r -= lr·dK_r, V_r -= lr·dV_r
 * The driver checks the first step's O and LSE as above, every element of every rank's first
 * step gradients against the local backward (Communicator.attentionBackward on the host) over
 * the whole sequence from the ranks' O, LSE and dO, and that the loss (summed over the ranks)
 * goes down at every step.
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
 *     [dtype=bf16] [seed=fresh] [layout=zigzag|contiguous] [mode=check|train] [steps=4] [lr=0.05]
 *
 * or, with no Spark installation:  examples/run.sh 04_context_parallel_attention [world] [S] [Hq] [Hkv] [D] [dtype] [seed] [layout] [mode] [steps] [lr]
 *
 * On one host's GPUs (one executor per GPU), the same with the cuda backend and Spark's GPU
 * scheduling (see examples/README.md):
 *
 *   FUSEDCOMM_BACKEND=cuda EXTRA_SUBMIT_ARGS="--conf spark.worker.resource.gpu.amount=1 ..." \
 *     examples/run.sh 04_context_parallel_attention 2 16384 16 2 128 bf16
 *     examples/run.sh 04_context_parallel_attention 2 4099 16 2 128 bf16 fresh zigzag train
 *
 * Exit status 0 when every element of every rank's O and LSE (and with mode=train, of its
 * gradients) is within its bound and the loss went down at every step, 1 otherwise.
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

  /** The training mode's settings: SGD steps and learning rate. */
  record Training(int steps, double lr) implements Serializable {}

  /**
   * One rank's training: the first step's forward ({@code forward}: O, LSE) with its dO, dQ, dK
   * and dV (its positions' rows), the rank's share of the loss before each step and after the
   * last ({@code steps + 1} values), and the first step's ringAttentionBackward time.
   */
  record TrainShard(Shard forward, float[] dO, float[] dq, float[] dk, float[] dv, double[] losses,
                    double backwardMs) implements Serializable {}

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
    boolean train = args.length > 8 && parseMode(args[8]);
    int steps = Math.toIntExact(ExampleContext.positiveArg(args, 9, "steps", 4));
    double lr = args.length > 10 ? parseLearningRate(args[10]) : 0.05;
    Problem p = new Problem(world, s, hq, hkv, d, dtype, seed, layout);
    requireSupported(p, FusedCommConf.fromSparkConf(new SparkConf()).backend());
    Training tr = new Training(steps, lr);

    ExampleContext.run(NAME, world, (sc, tasks) -> {
      System.out.printf(Locale.ROOT, "%s: %s seed=%d master=%s%s%n", NAME, p.describe(), seed, sc.master(),
          train ? String.format(Locale.ROOT, " mode=train steps=%d lr=%s", steps, lr) : "");
      CommOptions options = CommOptions.defaults().name("context-parallel");
      if (!train) {
        List<Shard> shards = BarrierStage.withCommunicator(tasks, options,
            (comm, context, rows) -> List.of(attend(comm, p)).iterator()).collect();
        return check(p, shards);
      }
      List<TrainShard> shards = BarrierStage.withCommunicator(tasks, options,
          (comm, context, rows) -> List.of(train(comm, p, tr)).iterator()).collect();
      boolean forward = check(p, shards.stream().map(TrainShard::forward).collect(Collectors.toList()));
      return checkTraining(p, tr, shards) && forward;
    });
  }

  static boolean parseMode(String s) {
    switch (s.trim().toLowerCase(Locale.ROOT)) {
      case "check":
        return false;
      case "train":
        return true;
      default:
        throw new IllegalArgumentException("mode must be check or train, got '" + s + "'");
    }
  }

  static double parseLearningRate(String s) {
    double lr;
    try {
      lr = Double.parseDouble(s.trim());
    } catch (NumberFormatException e) {
      throw new IllegalArgumentException("lr must be a number, got '" + s + "'", e);
    }
    if (!(lr > 0) || Double.isInfinite(lr)) {
      throw new IllegalArgumentException("lr must be positive and finite, got " + lr);
    }
    return lr;
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

  /**
   * The training target's rows at {@code positions} (positions × Hq × D): one vector per K/V
   * head (tensor 4, row 0, from the seed, in the dtype), the same at every position and for every
   * query head of the K/V head's group.
   */
  static float[] targetRows(Problem p, int[] positions) {
    float[] perKvHead = SeededValues.uniform(SeededValues.seed(p.seed(), 4, 0), p.hkv() * p.d(), 1.0, p.dtype());
    int group = p.hq() / p.hkv();
    int width = p.hq() * p.d();
    float[] out = new float[Math.multiplyExact(positions.length, width)];
    for (int i = 0; i < positions.length; i++) {
      for (int h = 0; h < p.hq(); h++) {
        System.arraycopy(perKvHead, (h / group) * p.d(), out, i * width + h * p.d(), p.d());
      }
    }
    return out;
  }

  /**
   * One rank's training (see the class comment): {@code tr.steps()} SGD steps of forward,
   * loss, backward and update on its rows of Q, K and V, then one more forward for the final
   * loss. Every rank runs the same ops in the same order.
   */
  static TrainShard train(Communicator comm, Problem p, Training tr) {
    int w = comm.world();
    int r = comm.rank();
    if (w != p.world()) {
      throw new IllegalStateException("the stage has " + w + " tasks, the problem expects " + p.world());
    }
    requireSupported(p, comm.backend());
    int[] pos = p.positions(r);
    int n = pos.length;
    AttentionOptions options = AttentionOptions.sequence(p.s()).causal(true).layout(p.layout());
    float[][] params = {p.rows(1, pos), p.rows(2, pos), p.rows(3, pos)};  // fp32 masters of Q, K, V
    float[] target = targetRows(p, pos);
    double[] losses = new double[tr.steps() + 1];
    Shard first = null;
    float[][] firstGrads = null;
    double backwardMs = 0;
    RankPlacement me = comm.placements().get(r);
    String device = "executor " + me.executorId()
        + (me.gpuUuid().isEmpty() ? ", no GPU" : ", GPU " + me.gpuAddress() + " " + me.gpuUuid());
    for (int step = 0; step <= tr.steps(); step++) {
      try (TensorMaker t = new TensorMaker(comm.backend())) {
        Tensor q = t.of(params[0], p.dtype(), 1, n, p.hq(), p.d());
        Tensor k = t.of(params[1], p.dtype(), 1, n, p.hkv(), p.d());
        Tensor v = t.of(params[2], p.dtype(), 1, n, p.hkv(), p.d());
        Tensor o = t.nan(p.dtype(), 1, n, p.hq(), p.d());
        Tensor lse = t.nan(DType.F32, 1, p.hq(), n);
        long t0 = System.nanoTime();
        comm.ringAttention(q, k, v, o, lse, options);
        double forwardMs = (System.nanoTime() - t0) / 1e6;
        float[] out = t.read(o);
        float[] dO = new float[out.length];
        double loss = 0;
        for (int i = 0; i < out.length; i++) {
          double diff = (double) out[i] - target[i];
          loss += 0.5 * diff * diff;
          dO[i] = (float) diff;
        }
        losses[step] = loss;
        if (step == tr.steps()) {
          break;
        }
        Tensor gradO = t.of(dO, p.dtype(), 1, n, p.hq(), p.d());
        Tensor dq = t.nan(p.dtype(), 1, n, p.hq(), p.d());
        Tensor dk = t.nan(p.dtype(), 1, n, p.hkv(), p.d());
        Tensor dv = t.nan(p.dtype(), 1, n, p.hkv(), p.d());
        t0 = System.nanoTime();
        comm.ringAttentionBackward(q, k, v, o, lse, gradO, dq, dk, dv, options);
        double ms = (System.nanoTime() - t0) / 1e6;
        float[][] grads = {t.read(dq), t.read(dk), t.read(dv)};
        if (step == 0) {
          first = new Shard(r, pos, out, t.read(lse), comm.backend().configName(), device, forwardMs);
          firstGrads = new float[][] {t.read(gradO), grads[0], grads[1], grads[2]};
          backwardMs = ms;
        }
        for (int x = 0; x < 3; x++) {
          for (int i = 0; i < params[x].length; i++) {
            params[x][i] -= (float) (tr.lr() * grads[x][i]);
          }
        }
      }
    }
    return new TrainShard(first, firstGrads[0], firstGrads[1], firstGrads[2], firstGrads[3], losses, backwardMs);
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

  /**
   * Per-element bound of a rank's gradient against the local backward from the same O, LSE and
   * dO rows: each side rounds once to the dtype (2u·|ref|), and the fp32 sums run in another
   * order (1e-4 of the tensor's largest |ref|); in bf16 2^-7 of it instead (the GPU kernel may
   * hold P and dS in bf16 for its products). A row of another position is off by the order of
   * the gradients and fails.
   */
  static double gradTolerance(DType dtype, double ref, double maxAbsRef) {
    double products = dtype == DType.BF16 ? 0x1p-7 : 1e-4;
    return 2 * SeededValues.unitRoundoff(dtype) * Math.abs(ref) + products * maxAbsRef;
  }

  /**
   * Checks one gradient of every rank (positions × width, in the rank's order) against the
   * reference's rows (S × width).
   */
  static Verdict checkGrad(Problem p, float[] ref, List<TrainShard> shards, int width,
                           java.util.function.Function<TrainShard, float[]> grad) {
    double maxAbsRef = 0;
    for (float x : ref) {
      maxAbsRef = Math.max(maxAbsRef, Math.abs(x));
    }
    long checked = 0;
    long bad = 0;
    double maxErr = 0;
    double worst = 0;
    for (TrainShard sh : shards) {
      int[] pos = sh.forward().positions();
      float[] got = grad.apply(sh);
      for (int i = 0; i < pos.length; i++) {
        for (int x = 0; x < width; x++) {
          double want = ref[pos[i] * width + x];
          double err = Math.abs(got[i * width + x] - want);
          double tol = gradTolerance(p.dtype(), want, maxAbsRef);
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

  /** The local backward over the whole sequence, on the host: dQ, dK, dV (S rows each). */
  static float[][] referenceGradients(Problem p, float[] o, float[] lse, float[] dO) {
    int[] all = java.util.stream.IntStream.range(0, p.s()).toArray();
    try (HostTensor q = HostTensor.of(p.rows(1, all), p.dtype(), 1, p.s(), p.hq(), p.d());
        HostTensor k = HostTensor.of(p.rows(2, all), p.dtype(), 1, p.s(), p.hkv(), p.d());
        HostTensor v = HostTensor.of(p.rows(3, all), p.dtype(), 1, p.s(), p.hkv(), p.d());
        HostTensor ot = HostTensor.of(o, p.dtype(), 1, p.s(), p.hq(), p.d());
        HostTensor lt = HostTensor.of(lse, DType.F32, 1, p.hq(), p.s());
        HostTensor gt = HostTensor.of(dO, p.dtype(), 1, p.s(), p.hq(), p.d());
        HostTensor dq = HostTensor.allocate(p.dtype(), 1, p.s(), p.hq(), p.d());
        HostTensor dk = HostTensor.allocate(p.dtype(), 1, p.s(), p.hkv(), p.d());
        HostTensor dv = HostTensor.allocate(p.dtype(), 1, p.s(), p.hkv(), p.d())) {
      Communicator.attentionBackward(q, k, v, ot, lt, gt, dq, dk, dv, true, 0f);
      return new float[][] {dq.toFloatArray(), dk.toFloatArray(), dv.toFloatArray()};
    }
  }

  /**
   * The training checks: the loss (summed over the ranks) per step, going down at every step;
   * every rank's first-step gradients against the local backward over the whole sequence, fed
   * with the ranks' own O, LSE and dO rows (so both sides differ only in fp32 summation order
   * and the GPU kernel's precision).
   */
  static boolean checkTraining(Problem p, Training tr, List<TrainShard> shards) {
    shards = shards.stream().sorted(Comparator.comparingInt(sh -> sh.forward().rank())).collect(Collectors.toList());
    if (shards.size() != p.world()) {
      System.out.println(NAME + ": FAILED: expected " + p.world() + " ranks' training results, got " + shards.size());
      return false;
    }
    long elements = (long) p.s() * p.hq() * p.d();
    double[] loss = new double[tr.steps() + 1];
    for (TrainShard sh : shards) {
      for (int i = 0; i < loss.length; i++) {
        loss[i] += sh.losses()[i];
      }
    }
    System.out.printf(Locale.ROOT, "%-5s %18s%n", "step", "loss per element");
    boolean down = true;
    for (int i = 0; i < loss.length; i++) {
      System.out.printf(Locale.ROOT, "%-5s %18.6f%n", i == tr.steps() ? "final" : Integer.toString(i),
          loss[i] / elements);
      down &= i == 0 || loss[i] < loss[i - 1];
    }
    for (TrainShard sh : shards) {
      System.out.printf(Locale.ROOT, "rank %d: ringAttentionBackward %.3f ms%n", sh.forward().rank(), sh.backwardMs());
    }
    // The whole sequence's O, LSE and dO, assembled from the ranks' first step.
    int widthQ = p.hq() * p.d();
    int widthKv = p.hkv() * p.d();
    float[] o = new float[p.s() * widthQ];
    float[] dO = new float[p.s() * widthQ];
    float[] lse = new float[p.hq() * p.s()];
    for (TrainShard sh : shards) {
      int[] pos = sh.forward().positions();
      for (int i = 0; i < pos.length; i++) {
        System.arraycopy(sh.forward().o(), i * widthQ, o, pos[i] * widthQ, widthQ);
        System.arraycopy(sh.dO(), i * widthQ, dO, pos[i] * widthQ, widthQ);
        for (int h = 0; h < p.hq(); h++) {
          lse[h * p.s() + pos[i]] = sh.forward().lse()[h * pos.length + i];
        }
      }
    }
    long t0 = System.nanoTime();
    float[][] ref = referenceGradients(p, o, lse, dO);
    System.out.printf(Locale.ROOT,
        "reference: Communicator.attentionBackward over the whole sequence on the host, %.0f ms%n",
        (System.nanoTime() - t0) / 1e6);
    Verdict dq = checkGrad(p, ref[0], shards, widthQ, TrainShard::dq);
    Verdict dk = checkGrad(p, ref[1], shards, widthKv, TrainShard::dk);
    Verdict dv = checkGrad(p, ref[2], shards, widthKv, TrainShard::dv);
    String[] names = {"dQ", "dK", "dV"};
    Verdict[] all = {dq, dk, dv};
    for (int i = 0; i < 3; i++) {
      System.out.printf(Locale.ROOT, "%s: max |error| %.3e, worst error/tolerance %.3f, %d of %d elements out of bounds%n",
          names[i], all[i].maxAbsErr(), all[i].worstRatio(), all[i].bad(), all[i].checked());
    }
    boolean ok = down && dq.bad() == 0 && dk.bad() == 0 && dv.bad() == 0 && dq.checked() == (long) p.s() * widthQ
        && dk.checked() == (long) p.s() * widthKv && dv.checked() == (long) p.s() * widthKv;
    String backend = shards.get(0).forward().backend();
    if (ok) {
      System.out.printf(Locale.ROOT, "%s: training check passed (%s, backend=%s, steps=%d, lr=%s, loss %.6f -> %.6f,"
          + " max_abs_err dQ=%.3e, dK=%.3e, dV=%.3e)%n", NAME, p.describe(), backend, tr.steps(), tr.lr(),
          loss[0] / elements, loss[tr.steps()] / elements, dq.maxAbsErr(), dk.maxAbsErr(), dv.maxAbsErr());
    } else {
      System.out.printf(Locale.ROOT, "%s: training FAILED (%s, backend=%s): loss %s at every step; %d dQ, %d dK and"
          + " %d dV elements out of bounds%n", NAME, p.describe(), backend, down ? "went down" : "did not go down",
          dq.bad(), dk.bad(), dv.bad());
    }
    return ok;
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
