/*
 * 03_moe_layer: the forward and backward of an expert-parallel mixture-of-experts layer over the
 * tasks of one barrier stage, Y = Σ_slot w · (SiLU(x · W1_eᵀ) · W2_e) over each token's top-k
 * experts e, with the experts split over the ranks (rank r owns experts Split(E, W, r)):
 *
 *   rank r holds   X_r  : rows Split(M) of X (M × H)          (its tokens)
 *                  dY_r : rows Split(M) of dY (M × H)         (the upstream gradient, seeded)
 *                  W1_e : F × H for its experts               (up projection, a linear layer's weight)
 *                  W2_e : F × H for its experts               (down projection, input-major: O = A · W2_e)
 *                  Wr   : E × H, every rank                   (the router)
 *   forward
 *   1. router, in Java on the host: logits = X_r · Wrᵀ, the top-k experts of each token and the
 *      softmax of their logits as weights (moeDispatchGemm takes topk ids and weights, so the
 *      router is the caller's; routing is held fixed in the backward: no router gradient)
 *   2. moeDispatchGemm   every (token, slot) row to its expert's rank; H1 = x · W1_eᵀ       : rows × F
 *   3. SiLU, in Java on the host: A = SiLU(H1)                                             : rows × F
 *   4. groupedGemm (KN)  O = A · W2_e over the dispatch's expert segments                   : rows × H
 *   5. moeCombine        Y_r[t] = Σ_slot w · O(t, slot), back at the token's rank           : T_r × H
 *   backward (dispatch's backward is a combine, combine's backward a dispatch)
 *   6. moeDispatchGemm   dY rows to the experts with the same routing; G = dy · W2_eᵀ       : rows × F
 *   7. dH1' = G ⊙ SiLU'(H1), in Java on the host (dH1 = w · dH1')                           : rows × F
 *   8. groupedGemm (KN)  dXr = dH1' · W1_e over the expert segments                         : rows × H
 *   9. moeCombine        dX_r[t] = Σ_slot w · dXr(t, slot)                                  : T_r × H
 *  10. gemm (KN), per local expert: dW2_e = (w ⊙ A_e)ᵀ · dy_e, dW1_e = (w ⊙ dH1'_e)ᵀ · x_e  : F × H
 *
 * The driver computes Y, dX, dW1 and dW2 for the whole batch and every expert in one process
 * (fp64 from the same dtype-rounded inputs and the same routing) and checks every element of
 * every rank's results against its own error bound (see Reference).
 *
 * Backends: the example asks the communicator (comm.backend()) at run time. With
 * spark.fusedcomm.backend=host the ops take HostTensors; with cuda they take DeviceTensors on the
 * executor's GPU (the ranks of one host): the dispatch's outputs (device tensors over the
 * dispatch's GPU memory) are copied to the host for SiLU and SiLU', which go up again for the
 * grouped GEMM; the dW GEMMs take each expert's rows transposed and padded with zero rows to a multiple of
 * 8. On cuda the ops take bf16 only, and H and F must be positive multiples of 8 (E at most
 * 1024, topk at most 64); other problems are refused before the job starts. Every rank's
 * received rows must fit its symmetric data area (H · 2 + 16 bytes a row,
 * spark.fusedcomm.cuda.symmetricBytes).
 *
 * Run (from the repository root; examples/run.sh builds what is missing and prints this line):
 *
 *   $SPARK_HOME/bin/spark-submit --master 'local-cluster[2,1,1024]' \
 *     --jars spark-plugin/target/fusedcomm_2.13-0.1.0-SNAPSHOT.jar \
 *     --conf spark.plugins=io.fusedcomm.FusedCommPlugin \
 *     --conf spark.fusedcomm.backend=host \
 *     --class io.fusedcomm.examples.MoeLayerExample \
 *     examples/target/fusedcomm-examples-0.1.0-SNAPSHOT.jar [world=2] [M=120] [H=64] [F=96] [E=6] [topk=2]
 *     [dtype=bf16] [seed=fresh]
 *
 * or, with no Spark installation:  examples/run.sh 03_moe_layer [world] [M] [H] [F] [E] [topk] [dtype] [seed]
 *
 * On one host's GPUs (one executor per GPU), the same with the cuda backend and Spark's GPU
 * scheduling:
 *
 *   FUSEDCOMM_BACKEND=cuda EXTRA_SUBMIT_ARGS="--conf spark.worker.resource.gpu.amount=1
 *     --conf spark.worker.resource.gpu.discoveryScript=$PWD/conf/gpu-discovery.sh
 *     --conf spark.executor.resource.gpu.amount=1
 *     --conf spark.executor.resource.gpu.discoveryScript=$PWD/conf/gpu-discovery.sh
 *     --conf spark.task.resource.gpu.amount=1" examples/run.sh 03_moe_layer 2 120 64 96 6 2 bf16
 *
 * Exit status 0 when every element of Y, dX, dW1 and dW2 is within its bound, 1 otherwise.
 */
package io.fusedcomm.examples;

import io.fusedcomm.api.Backend;
import io.fusedcomm.api.CommOptions;
import io.fusedcomm.api.Communicator;
import io.fusedcomm.api.DType;
import io.fusedcomm.api.DeviceTensor;
import io.fusedcomm.api.HostTensor;
import io.fusedcomm.api.MoeDispatch;
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
import org.apache.spark.SparkConf;

/** Example 03: an expert-parallel MoE layer forward and backward, checked against one process. */
public final class MoeLayerExample {
  static final String NAME = "03_moe_layer";

  private MoeLayerExample() {}

  /** Global problem: shapes, dtype and seed; every rank derives its tokens and experts from it. */
  record Problem(int world, int m, int h, int f, int experts, int topk, DType dtype, long seed)
      implements Serializable {
    float[] x() {
      return SeededValues.uniform(SeededValues.seed(seed, 1), m * h, 1.0, dtype);
    }

    /** The router, E × H. */
    float[] router() {
      return SeededValues.uniform(SeededValues.seed(seed, 2), experts * h, Math.sqrt(3.0 / h), dtype);
    }

    /** W1 of every expert, E × F × H (each F × H, NK). */
    float[] w1() {
      return SeededValues.uniform(SeededValues.seed(seed, 3), experts * f * h, Math.sqrt(3.0 / h), dtype);
    }

    /** W2 of every expert, E × F × H (each F × H: O = A · W2_e). */
    float[] w2() {
      return SeededValues.uniform(SeededValues.seed(seed, 4), experts * f * h, Math.sqrt(3.0 / f), dtype);
    }

    float[] dy() {
      return SeededValues.uniform(SeededValues.seed(seed, 5), m * h, 1.0, dtype);
    }

    String describe() {
      return String.format(Locale.ROOT, "world=%d, M=%d, H=%d, F=%d, E=%d, topk=%d, dtype=%s", world, m, h, f,
          experts, topk, dtype.label());
    }
  }

  /** Each token's top-k expert ids and weights (token-major, {@code tokens × topk}). */
  record Routing(int[] ids, float[] weights) implements Serializable {}

  /**
   * The router: logits = x · Wrᵀ in fp64, the top-k experts by logit (the lower id first on a
   * tie), and the softmax over those k logits as fp32 weights. The driver's reference calls the
   * same function on the same inputs, so both see the very same routing.
   */
  static Routing route(float[] x, int tokens, float[] router, int h, int experts, int topk) {
    int[] ids = new int[tokens * topk];
    float[] weights = new float[tokens * topk];
    double[] logits = new double[experts];
    boolean[] taken = new boolean[experts];
    for (int t = 0; t < tokens; t++) {
      for (int e = 0; e < experts; e++) {
        double s = 0;
        for (int i = 0; i < h; i++) {
          s += (double) x[t * h + i] * router[e * h + i];
        }
        logits[e] = s;
        taken[e] = false;
      }
      double max = Double.NEGATIVE_INFINITY;
      for (int k = 0; k < topk; k++) {
        int best = -1;
        for (int e = 0; e < experts; e++) {
          if (!taken[e] && (best < 0 || logits[e] > logits[best])) {
            best = e;
          }
        }
        taken[best] = true;
        ids[t * topk + k] = best;
        max = Math.max(max, logits[best]);
      }
      double sum = 0;
      for (int k = 0; k < topk; k++) {
        sum += Math.exp(logits[ids[t * topk + k]] - max);
      }
      for (int k = 0; k < topk; k++) {
        weights[t * topk + k] = (float) (Math.exp(logits[ids[t * topk + k]] - max) / sum);
      }
    }
    return new Routing(ids, weights);
  }

  /** Wall time of one rank's steps, in ms. */
  record Timings(double dispatchMs, double elementwiseMs, double groupedGemmMs, double combineMs, double weightGradMs)
      implements Serializable {}

  /**
   * One rank's results: its tokens' Y and dX, its experts' dW1 and dW2, how many rows each of
   * its experts received, where it ran, and its timings.
   */
  record Shard(int rank, int tokenOffset, int tokens, float[] y, float[] dx, int firstExpert, int localExperts,
      float[] dw1, float[] dw2, long[] expertRows, String backend, String device, Timings forward, Timings backward)
      implements Serializable {}

  /**
   * Runs the example (driver side): {@code [world=2] [M=120] [H=64] [F=96] [E=6] [topk=2]
   * [dtype=bf16|f32] [seed=fresh]}; exits 1 unless every element is within its bound.
   */
  public static void main(String[] args) throws Exception {
    int world = Math.toIntExact(ExampleContext.positiveArg(args, 0, "world", 2));
    int m = Math.toIntExact(ExampleContext.positiveArg(args, 1, "M", 120));
    int h = Math.toIntExact(ExampleContext.positiveArg(args, 2, "H", 64));
    int f = Math.toIntExact(ExampleContext.positiveArg(args, 3, "F", 96));
    int experts = Math.toIntExact(ExampleContext.positiveArg(args, 4, "E", 6));
    int topk = Math.toIntExact(ExampleContext.positiveArg(args, 5, "topk", 2));
    DType dtype = args.length > 6 ? TensorParallelMlpExample.parseDType(args[6]) : DType.BF16;
    long seed = args.length > 7 && !args[7].trim().equals("fresh") ? Long.parseLong(args[7].trim()) : System.nanoTime();
    if (topk > experts) {
      throw new IllegalArgumentException(NAME + ": topk (" + topk + ") must not exceed E (" + experts + ")");
    }
    Problem p = new Problem(world, m, h, f, experts, topk, dtype, seed);
    // spark-submit's --conf settings reach the driver as system properties: a problem the
    // requested backend cannot run fails here, before any executor starts.
    requireSupported(p, FusedCommConf.fromSparkConf(new SparkConf()).backend());

    ExampleContext.run(NAME, world, (sc, tasks) -> {
      System.out.printf(Locale.ROOT, "%s: %s seed=%d master=%s%n", NAME, p.describe(), seed, sc.master());
      List<Shard> shards = BarrierStage.withCommunicator(tasks, CommOptions.defaults().name("moe-layer"),
          (comm, context, rows) -> List.of(forwardAndBackward(comm, p)).iterator()).collect();
      return check(p, shards);
    });
  }

  /**
   * Refuses a problem that {@code backend} cannot run, naming the sizes: on cuda the MoE ops and
   * the grouped GEMM take bf16 with H and F positive multiples of 8, at most 1024 experts and a
   * top-k of at most 64.
   */
  static void requireSupported(Problem p, Backend backend) {
    if (backend != Backend.CUDA) {
      return;
    }
    if (p.dtype() != DType.BF16) {
      throw new IllegalArgumentException(NAME + ": the cuda backend's MoE ops take bf16 only, got dtype="
          + p.dtype().label() + " (use bf16, or spark.fusedcomm.backend=host for f32)");
    }
    if (p.h() % 8 != 0 || p.f() % 8 != 0 || p.experts() > 1024 || p.topk() > 64) {
      throw new IllegalArgumentException(NAME + ": on the cuda backend H and F must be positive multiples of 8,"
          + " E at most 1024 and topk at most 64; " + p.describe() + " does not fit");
    }
  }

  /** The layer's forward and backward on one rank, on the communicator's backend. */
  static Shard forwardAndBackward(Communicator comm, Problem p) {
    int w = comm.world();
    int r = comm.rank();
    if (w != p.world()) {
      throw new IllegalStateException("the stage has " + w + " tasks, the problem expects " + p.world());
    }
    requireSupported(p, comm.backend());
    int h = p.h();
    int f = p.f();
    int tokenOffset = (int) Split.offset(p.m(), w, r);
    int tokens = (int) Split.count(p.m(), w, r);
    int firstExpert = (int) Split.offset(p.experts(), w, r);
    int localExperts = (int) Split.count(p.experts(), w, r);
    float[] x = Arrays.copyOfRange(p.x(), tokenOffset * h, (tokenOffset + tokens) * h);
    float[] dyLocal = Arrays.copyOfRange(p.dy(), tokenOffset * h, (tokenOffset + tokens) * h);
    float[] w1Local = Arrays.copyOfRange(p.w1(), firstExpert * f * h, (firstExpert + localExperts) * f * h);
    float[] w2Local = Arrays.copyOfRange(p.w2(), firstExpert * f * h, (firstExpert + localExperts) * f * h);

    try (Tensors t = new Tensors(comm.backend(), p.dtype())) {
      Routing routing = route(x, tokens, p.router(), h, p.experts(), p.topk());
      Tensor xT = t.of(x, tokens, h);
      Tensor dyT = t.of(dyLocal, tokens, h);
      Tensor ids = t.ints(routing.ids(), tokens, p.topk());
      Tensor weights = t.f32(routing.weights(), tokens, p.topk());
      Tensor w1 = t.of(w1Local, localExperts, f, h);
      Tensor w2 = t.of(w2Local, localExperts, f, h);
      Tensor y = t.output(tokens, h);
      Tensor dx = t.output(tokens, h);
      long t1 = System.nanoTime();
      try (MoeDispatch d = comm.moeDispatchGemm(xT, ids, weights, p.experts(), w1)) {
        // Forward.
        long t2 = System.nanoTime();
        int rows = Math.toIntExact(d.rows());
        long[] offsets = d.expertOffsets();
        float[] h1 = t.read(d.expertOutput());
        float[] act = new float[h1.length];
        for (int i = 0; i < act.length; i++) {
          act[i] = (float) silu(h1[i]);
        }
        Tensor a = t.of(act, rows, f);  // rounded to the dtype, as a stored activation
        long t3 = System.nanoTime();
        Tensor o = t.output(rows, h);
        Communicator.groupedGemm(a, w2, o, offsets, WeightLayout.KN);
        long t4 = System.nanoTime();
        comm.moeCombine(d, o, y);
        long t5 = System.nanoTime();

        // Backward: the combine's backward is a dispatch of dY with the same routing (its rows
        // line up with the forward's), and its GEMM with W2 in the NK form gives G = dy · W2_eᵀ.
        try (MoeDispatch g = comm.moeDispatchGemm(dyT, ids, weights, p.experts(), w2)) {
          long t6 = System.nanoTime();
          requireSameRows(d, g);
          float[] grad = t.read(g.expertOutput());
          float[] dh1 = new float[grad.length];
          for (int i = 0; i < dh1.length; i++) {
            dh1[i] = (float) (grad[i] * siluGrad(h1[i]));
          }
          Tensor dh1T = t.of(dh1, rows, f);
          long t7 = System.nanoTime();
          Tensor dxr = t.output(rows, h);
          Communicator.groupedGemm(dh1T, w1, dxr, offsets, WeightLayout.KN);
          long t8 = System.nanoTime();
          // The dispatch's backward is a combine: dX[t] = Σ_slot w · dXr(t, slot).
          comm.moeCombine(d, dxr, dx);
          long t9 = System.nanoTime();
          float[] actStored = t.read(a);
          float[] dh1Stored = t.read(dh1T);
          float[] routedX = t.read(d.routedTokens());
          float[] routedDy = t.read(g.routedTokens());
          float[] dw1 = new float[localExperts * f * h];
          float[] dw2 = new float[localExperts * f * h];
          long[] expertRows = new long[localExperts];
          for (int e = 0; e < localExperts; e++) {
            int from = (int) offsets[e];
            int n = (int) (offsets[e + 1] - from);
            expertRows[e] = n;
            float[] rowWeights = new float[n];
            for (int i = 0; i < n; i++) {
              rowWeights[i] = d.weight(from + i);
            }
            weightGrad(t, actStored, routedDy, rowWeights, from, n, f, h, dw2, e * f * h);
            weightGrad(t, dh1Stored, routedX, rowWeights, from, n, f, h, dw1, e * f * h);
          }
          long t10 = System.nanoTime();

          RankPlacement me = comm.placements().get(r);
          String device = "executor " + me.executorId()
              + (me.gpuUuid().isEmpty() ? ", no GPU" : ", GPU " + me.gpuAddress() + " " + me.gpuUuid());
          return new Shard(r, tokenOffset, tokens, t.read(y), t.read(dx), firstExpert, localExperts, dw1, dw2,
              expertRows, comm.backend().configName(), device,
              new Timings((t2 - t1) / 1e6, (t3 - t2) / 1e6, (t4 - t3) / 1e6, (t5 - t4) / 1e6, 0),
              new Timings((t6 - t5) / 1e6, (t7 - t6) / 1e6, (t8 - t7) / 1e6, (t9 - t8) / 1e6, (t10 - t9) / 1e6));
        }
      }
    }
  }

  /** The two dispatches of one routing received the same rows in the same order. */
  private static void requireSameRows(MoeDispatch d, MoeDispatch g) {
    boolean same = d.rows() == g.rows() && Arrays.equals(d.expertOffsets(), g.expertOffsets());
    for (long i = 0; same && i < d.rows(); i++) {
      same = d.sourceRank(i) == g.sourceRank(i) && d.sourceToken(i) == g.sourceToken(i) && d.slot(i) == g.slot(i);
    }
    if (!same) {
      throw new IllegalStateException(NAME + ": the gradient's dispatch received other rows than the forward's");
    }
  }

  /**
   * {@code out[base + f·H + j] = Σ_i (w_i · left[from + i][f]) · right[from + i][j]} over the
   * expert's {@code n} rows, as one {@link Communicator#gemm} (KN) of the weighted left rows
   * transposed ({@code F × n8}) and the right rows ({@code n8 × H}), n8 = n rounded up to a
   * multiple of 8 with zero rows (the GPU GEMM's K); the weighted rows are rounded to the dtype
   * as a stored tensor would be.
   */
  private static void weightGrad(Tensors t, float[] left, float[] right, float[] rowWeights, int from, int n, int f,
      int h, float[] out, int base) {
    if (n == 0) {
      return;  // no row: the gradient is 0
    }
    int n8 = (n + 7) / 8 * 8;
    float[] lt = new float[f * n8];
    float[] rp = new float[n8 * h];
    for (int i = 0; i < n; i++) {
      for (int c = 0; c < f; c++) {
        lt[c * n8 + i] = rowWeights[i] * left[(from + i) * f + c];
      }
      System.arraycopy(right, (from + i) * h, rp, i * h, h);
    }
    Tensor a = t.of(lt, f, n8);
    Tensor b = t.of(rp, n8, h);
    Tensor c = t.output(f, h);
    Communicator.gemm(a, b, c, WeightLayout.KN);
    System.arraycopy(t.read(c), 0, out, base, f * h);
  }

  /** SiLU: x · σ(x). */
  static double silu(double x) {
    return x / (1.0 + Math.exp(-x));
  }

  /** SiLU': σ(x) · (1 + x · (1 − σ(x))). */
  static double siluGrad(double x) {
    double s = 1.0 / (1.0 + Math.exp(-x));
    return s * (1.0 + x * (1.0 - s));
  }

  /**
   * The single-process reference, in fp64 from the same dtype-rounded inputs and the same
   * routing, with a per-element error bound for each output.
   */
  static final class Reference {
    /** L1 ≥ max |SiLU'| (about 1.0998). */
    static final double SILU_LIPSCHITZ = 1.1;

    /** L2 ≥ max |SiLU''| (0.5, at 0). */
    static final double SILU_GRAD_LIPSCHITZ = 0.5;

    /**
     * Confidence factor of the probabilistic terms, as in example 02: a sum of independent
     * zero-mean errors |e_i| ≤ b_i exceeds λ·√(Σ b_i²) with probability at most 2·exp(-λ²/2).
     */
    static final double LAMBDA = 7.0;

    final double[] y;
    final double[] yTolerance;
    final double[] dx;
    final double[] dxTolerance;
    final double[] dw1;
    final double[] dw1Tolerance;
    final double[] dw2;
    final double[] dw2Tolerance;

    /**
     * Y, dX (M × H), dW1 and dW2 (E × F × H) and their bounds. Rounding errors are modelled as
     * independent, zero-mean and bounded (the probabilistic analysis example 02 uses: Higham and
     * Mary, SIAM J. Sci. Comput. 41(5), 2019), first order; u = the dtype's unit roundoff, v =
     * 2^-24 (fp32), S(·) the sum's terms in absolute value. Per routed row (token t, slot k,
     * expert e, weight w):
     *
     * <pre>
     *   H1_f = Σ_i x_i·W1_fi          δH1_f ≤ u·|H1_f| + λ·√H·v·S(H1_f)       dispatch GEMM, stored
     *   A_f  = SiLU(H1_f)             δA_f  ≤ L1·δH1_f + (u + v)·|A_f|         in fp32, then the dtype
     *   O_j  = Σ_f A_f·W2_fj          δO_j  ≤ λ·√(Σ_f (W2_fj·δA_f)²)           groupedGemm
     *                                         + λ·√F·v·S(O_j) + u·|O_j|
     *   Y_j  = Σ_k w·O_j              δY_j  ≤ Σ_k w·δO_j + k·v·Σ_k w·|O_j| + u·|Y_j|   moeCombine
     *   G_f  = Σ_j dy_j·W2_fj         δG_f  ≤ u·|G_f| + λ·√H·v·S(G_f)         the gradient's dispatch
     *   D_f  = G_f·SiLU'(H1_f)        δD_f  ≤ |SiLU'|·δG_f + L2·δH1_f·|G_f| + (u + v)·|D_f|
     *   R_j  = Σ_f D_f·W1_fj          δR_j  ≤ λ·√(Σ_f (W1_fj·δD_f)²) + λ·√F·v·S(R_j) + u·|R_j|
     *   dX_j = Σ_k w·R_j              δdX_j ≤ Σ_k w·δR_j + k·v·Σ_k w·|R_j| + u·|dX_j|
     *   dW2_fj = Σ_rows P_f·dy_j, P = w·A (stored): δP_f ≤ w·δA_f + (u + v)·|P_f|
     *                                 δ ≤ λ·√(Σ_rows (dy_j·δP_f)²) + λ·√n·v·S + u·|dW2_fj|
     *   dW1_fj = Σ_rows Q_f·x_j,  Q = w·D (stored): the same with δQ_f ≤ w·δD_f + (u + v)·|Q_f|
     * </pre>
     *
     * (n: the expert's rows.) The routing weights are the same fp32 numbers on both sides. No
     * averaging: every element must be within its own bound.
     */
    Reference(Problem p) {
      int m = p.m();
      int h = p.h();
      int f = p.f();
      int topk = p.topk();
      float[] x = p.x();
      float[] dy = p.dy();
      float[] w1 = p.w1();
      float[] w2 = p.w2();
      Routing routing = route(x, m, p.router(), h, p.experts(), topk);
      double u = SeededValues.unitRoundoff(p.dtype());
      double v = 0x1p-24;
      double lambda = LAMBDA;
      y = new double[m * h];
      yTolerance = new double[m * h];
      dx = new double[m * h];
      dxTolerance = new double[m * h];
      int weights = p.experts() * f * h;
      dw1 = new double[weights];
      dw1Tolerance = new double[weights];  // Σ_rows (x_j·δQ_f)² until the end
      dw2 = new double[weights];
      dw2Tolerance = new double[weights];  // Σ_rows (dy_j·δP_f)² until the end
      double[] dw1Abs = new double[weights];
      double[] dw2Abs = new double[weights];
      long[] rowsOf = new long[p.experts()];
      for (int id : routing.ids()) {
        rowsOf[id]++;
      }
      double[] h1Err = new double[f];
      double[] act = new double[f];
      double[] actErr = new double[f];
      double[] d = new double[f];
      double[] dErr = new double[f];
      double[] yAbs = new double[h];
      double[] dxAbs = new double[h];
      for (int t = 0; t < m; t++) {
        Arrays.fill(yAbs, 0);
        Arrays.fill(dxAbs, 0);
        for (int k = 0; k < topk; k++) {
          int e = routing.ids()[t * topk + k];
          double wt = routing.weights()[t * topk + k];
          int we = e * f * h;
          for (int c = 0; c < f; c++) {
            double s = 0;
            double sa = 0;
            double g = 0;
            double ga = 0;
            for (int i = 0; i < h; i++) {
              double a1 = (double) x[t * h + i] * w1[we + c * h + i];
              s += a1;
              sa += Math.abs(a1);
              double a2 = (double) dy[t * h + i] * w2[we + c * h + i];
              g += a2;
              ga += Math.abs(a2);
            }
            h1Err[c] = u * Math.abs(s) + lambda * Math.sqrt(h) * v * sa;
            act[c] = silu(s);
            actErr[c] = SILU_LIPSCHITZ * h1Err[c] + (u + v) * Math.abs(act[c]);
            double gErr = u * Math.abs(g) + lambda * Math.sqrt(h) * v * ga;
            double sg = siluGrad(s);
            d[c] = g * sg;
            dErr[c] = Math.abs(sg) * gErr + SILU_GRAD_LIPSCHITZ * h1Err[c] * Math.abs(g) + (u + v) * Math.abs(d[c]);
          }
          for (int j = 0; j < h; j++) {
            double o = 0;
            double oa = 0;
            double oSq = 0;
            double r = 0;
            double ra = 0;
            double rSq = 0;
            double dyj = dy[t * h + j];
            double xj = x[t * h + j];
            for (int c = 0; c < f; c++) {
              int at = we + c * h + j;
              double w2v = w2[at];
              double w1v = w1[at];
              o += act[c] * w2v;
              oa += Math.abs(act[c] * w2v);
              oSq += (w2v * actErr[c]) * (w2v * actErr[c]);
              r += d[c] * w1v;
              ra += Math.abs(d[c] * w1v);
              rSq += (w1v * dErr[c]) * (w1v * dErr[c]);
              // The weight gradients of expert e: this row's term of element (c, j).
              double pc = wt * act[c];
              double pErr = wt * actErr[c] + (u + v) * Math.abs(pc);
              dw2[at] += pc * dyj;
              dw2Abs[at] += Math.abs(pc * dyj);
              dw2Tolerance[at] += (dyj * pErr) * (dyj * pErr);
              double qc = wt * d[c];
              double qErr = wt * dErr[c] + (u + v) * Math.abs(qc);
              dw1[at] += qc * xj;
              dw1Abs[at] += Math.abs(qc * xj);
              dw1Tolerance[at] += (xj * qErr) * (xj * qErr);
            }
            double oErr = lambda * Math.sqrt(oSq) + lambda * Math.sqrt(f) * v * oa + u * Math.abs(o);
            double rErr = lambda * Math.sqrt(rSq) + lambda * Math.sqrt(f) * v * ra + u * Math.abs(r);
            y[t * h + j] += wt * o;
            yTolerance[t * h + j] += wt * oErr;
            yAbs[j] += wt * Math.abs(o);
            dx[t * h + j] += wt * r;
            dxTolerance[t * h + j] += wt * rErr;
            dxAbs[j] += wt * Math.abs(r);
          }
        }
        for (int j = 0; j < h; j++) {
          int at = t * h + j;
          yTolerance[at] += topk * v * yAbs[j] + u * Math.abs(y[at]);
          dxTolerance[at] += topk * v * dxAbs[j] + u * Math.abs(dx[at]);
        }
      }
      for (int e = 0; e < p.experts(); e++) {
        double accumulation = lambda * Math.sqrt(Math.max(rowsOf[e], 1)) * v;
        for (int i = e * f * h; i < (e + 1) * f * h; i++) {
          dw1Tolerance[i] = lambda * Math.sqrt(dw1Tolerance[i]) + accumulation * dw1Abs[i] + u * Math.abs(dw1[i]);
          dw2Tolerance[i] = lambda * Math.sqrt(dw2Tolerance[i]) + accumulation * dw2Abs[i] + u * Math.abs(dw2[i]);
        }
      }
    }
  }

  /** How one checked tensor compares with the reference: elements out of bounds, max |error|. */
  record Errors(long bad, double maxErr) {}

  /** Checks every element of every shard; prints the tables, the errors and the final line. */
  static boolean check(Problem p, List<Shard> shards) {
    Reference ref = new Reference(p);
    List<Shard> sorted = shards.stream().sorted(Comparator.comparingInt(Shard::rank)).collect(Collectors.toList());
    for (Shard s : sorted) {
      System.out.printf(Locale.ROOT, "rank %d ran on %s (%s backend): tokens %s, experts %s, rows per expert %s%n",
          s.rank(), s.device(), s.backend(), range(s.tokenOffset(), s.tokens()), range(s.firstExpert(), s.localExperts()),
          Arrays.toString(s.expertRows()));
    }
    System.out.println("forward: Z = moeDispatchGemm(X, W1), A = SiLU(Z), O = groupedGemm(A, W2), Y = moeCombine(O)");
    System.out.println("backward: G = moeDispatchGemm(dY, W2), D = G ⊙ SiLU'(Z), R = groupedGemm(D, W1),"
        + " dX = moeCombine(R), dW = gemm per expert");
    System.out.printf(Locale.ROOT, "%-5s %-9s %12s %14s %16s %11s %9s%n", "rank", "pass", "dispatch ms",
        "elementwise ms", "groupedGemm ms", "combine ms", "dW ms");
    for (Shard s : sorted) {
      for (boolean fwd : new boolean[] {true, false}) {
        Timings t = fwd ? s.forward() : s.backward();
        System.out.printf(Locale.ROOT, "%-5d %-9s %12.3f %14.3f %16.3f %11.3f %9.3f%n", s.rank(),
            fwd ? "forward" : "backward", t.dispatchMs(), t.elementwiseMs(), t.groupedGemmMs(), t.combineMs(),
            t.weightGradMs());
      }
    }

    // Shards must tile the tokens and the experts in rank order by the Split rule.
    boolean passed = sorted.size() == p.world();
    List<Shard> wellFormed = new ArrayList<>();
    for (int i = 0; i < sorted.size(); i++) {
      Shard s = sorted.get(i);
      int tokens = (int) Split.count(p.m(), p.world(), i);
      int experts = (int) Split.count(p.experts(), p.world(), i);
      boolean ok = s.rank() == i && s.tokenOffset() == Split.offset(p.m(), p.world(), i) && s.tokens() == tokens
          && s.firstExpert() == Split.offset(p.experts(), p.world(), i) && s.localExperts() == experts
          && s.y().length == tokens * p.h() && s.dx().length == tokens * p.h()
          && s.dw1().length == experts * p.f() * p.h() && s.dw2().length == experts * p.f() * p.h();
      if (!ok) {
        System.out.println("  rank " + s.rank() + " returned the wrong tokens, experts or shapes");
        passed = false;
        continue;
      }
      wellFormed.add(s);
    }
    int fh = p.f() * p.h();
    Errors y = compare("Y", wellFormed, Shard::y, s -> s.tokenOffset() * p.h(), ref.y, ref.yTolerance, p.h());
    Errors dx = compare("dX", wellFormed, Shard::dx, s -> s.tokenOffset() * p.h(), ref.dx, ref.dxTolerance, p.h());
    Errors dw1 = compare("dW1", wellFormed, Shard::dw1, s -> s.firstExpert() * fh, ref.dw1, ref.dw1Tolerance, p.h());
    Errors dw2 = compare("dW2", wellFormed, Shard::dw2, s -> s.firstExpert() * fh, ref.dw2, ref.dw2Tolerance, p.h());
    passed &= y.bad() == 0 && dx.bad() == 0 && dw1.bad() == 0 && dw2.bad() == 0;

    String backend = shards.stream().map(Shard::backend).distinct().collect(Collectors.joining(","));
    if (passed) {
      System.out.printf(Locale.ROOT, "%s: check passed for forward+backward (%s, backend=%s, max_abs_err Y=%.3e,"
          + " dX=%.3e, dW1=%.3e, dW2=%.3e)%n", NAME, p.describe(), backend, y.maxErr(), dx.maxErr(), dw1.maxErr(),
          dw2.maxErr());
    } else {
      System.out.printf(Locale.ROOT, "%s: FAILED forward+backward (%s, backend=%s, out of bounds: %d elements of Y,"
          + " %d of dX, %d of dW1, %d of dW2; %d of %d ranks reported)%n", NAME, p.describe(), backend, y.bad(),
          dx.bad(), dw1.bad(), dw2.bad(), shards.size(), p.world());
    }
    return passed;
  }

  private static String range(int first, int count) {
    return count == 0 ? "none" : first + ".." + (first + count - 1);
  }

  /** Every element of one tensor over all shards; prints the first mismatches and the error line. */
  private static Errors compare(String name, List<Shard> shards, Function<Shard, float[]> values,
      Function<Shard, Integer> base, double[] ref, double[] tolerance, int cols) {
    long bad = 0;
    long checked = 0;
    double maxErr = 0;
    double tolAtMax = 0;
    double worstRatio = 0;
    for (Shard s : shards) {
      float[] got = values.apply(s);
      int b = base.apply(s);
      for (int i = 0; i < got.length; i++) {
        int at = b + i;
        double err = Double.isNaN(got[i]) ? Double.POSITIVE_INFINITY : Math.abs(got[i] - ref[at]);
        checked++;
        if (!(err <= tolerance[at])) {
          if (bad < 5) {
            System.out.printf(Locale.ROOT, "  mismatch %s[%d][%d]: got %.6g, reference %.6g, tolerance %.3g%n", name,
                at / cols, at % cols, got[i], ref[at], tolerance[at]);
          }
          bad++;
        }
        if (err > maxErr) {
          maxErr = err;
          tolAtMax = tolerance[at];
        }
        worstRatio = Math.max(worstRatio, tolerance[at] > 0 ? err / tolerance[at] : (err > 0 ? 1e9 : 0));
      }
    }
    System.out.printf(Locale.ROOT, "%s: max |error| %.3e (tolerance there %.3e), worst error/tolerance %.3f,"
        + " %d of %d elements out of bounds%n", name, maxErr, tolAtMax, worstRatio, bad, checked);
    return new Errors(bad, maxErr);
  }

  /**
   * The tensors one rank's ops take, in the memory of the communicator's backend: {@link
   * HostTensor}s on host, {@link DeviceTensor}s on the executor's GPU on cuda (filled and read
   * through host staging tensors). It owns every tensor it makes; closing it frees them all.
   */
  static final class Tensors implements AutoCloseable {
    private final boolean device;
    private final DType dtype;
    private final Deque<Runnable> closers = new ArrayDeque<>();

    Tensors(Backend backend, DType dtype) {
      this.device = backend == Backend.CUDA;
      this.dtype = dtype;
    }

    /** A tensor of the dtype holding {@code values} rounded to it. */
    Tensor of(float[] values, long... shape) {
      return place(HostTensor.of(values, dtype, shape));
    }

    /** An fp32 tensor (routing weights). */
    Tensor f32(float[] values, long... shape) {
      return place(HostTensor.of(values, DType.F32, shape));
    }

    /** An int32 tensor (expert ids). */
    Tensor ints(int[] values, long... shape) {
      return place(HostTensor.ofInts(values, shape));
    }

    /** An output tensor filled with NaN, so that an element the op never writes fails the check. */
    Tensor output(long... shape) {
      HostTensor nan = HostTensor.allocate(dtype, shape);
      nan.fill(Float.NaN);
      return place(nan);
    }

    /** The elements of {@code t}, widened to float. */
    float[] read(Tensor t) {
      if (t instanceof HostTensor host) {
        return host.toFloatArray();
      }
      try (HostTensor staging = HostTensor.allocate(t.dtype(), t.shape())) {
        ((DeviceTensor) t).copyTo(staging);
        return staging.toFloatArray();
      }
    }

    /** {@code host} itself on the host backend; on cuda a device copy, and {@code host} closed. */
    private Tensor place(HostTensor host) {
      if (!device) {
        closers.push(host::close);
        return host;
      }
      try (host) {
        DeviceTensor d = DeviceTensor.allocate(host.dtype(), host.shape());
        closers.push(d::close);
        d.copyFrom(host);
        return d;
      }
    }

    @Override
    public void close() {
      while (!closers.isEmpty()) {
        closers.pop().run();
      }
    }
  }
}
