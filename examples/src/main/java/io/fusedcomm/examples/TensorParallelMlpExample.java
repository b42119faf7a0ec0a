/*
 * 02_tensor_parallel_mlp: the forward pass of a tensor-parallel (Megatron-style, sequence-parallel
 * activations) MLP block, Y = GELU(X · W1ᵀ) · W2ᵀ, over the tasks of one barrier stage:
 *
 *   rank r holds   X_r  : rows Split(M) of X (M × H)            (sequence-parallel activations)
 *                  W1_r : rows Split(F) of W1 (F × H), NK layout (column shard of the first linear)
 *                  W2_r : columns Split(F) of W2 (H × F), stored H × F_r, NK layout (row shard)
 *   1. allGatherGemm      Z_r = [X_0; …; X_{W-1}] · W1_rᵀ        : M × F_r
 *   2. GELU (tanh form), elementwise in Java on the host tensor  : M × F_r
 *   3. gemmReduceScatter  Y_r = rows Split(M) of Σ_s A_s · W2_sᵀ : Split(M) × H
 *
 * The driver computes the whole Y in fp64 from the same seeded X, W1, W2 and checks every element of
 * every rank's Y_r against a per-element error bound (see Reference).
 *
 * Run (from the repository root; examples/run.sh builds what is missing and prints this line):
 *
 *   $SPARK_HOME/bin/spark-submit --master 'local-cluster[2,1,1024]' \
 *     --jars spark-plugin/target/fusedcomm-0.1.0-SNAPSHOT.jar \
 *     --conf spark.plugins=io.fusedcomm.FusedCommPlugin \
 *     --conf spark.fusedcomm.backend=host \
 *     --class io.fusedcomm.examples.TensorParallelMlpExample \
 *     examples/target/fusedcomm-examples-0.1.0-SNAPSHOT.jar [world=2] [M=125] [H=64] [F=256] [dtype=bf16] [seed=fresh]
 *
 * or, with no Spark installation:  examples/run.sh 02_tensor_parallel_mlp [world] [M] [H] [F] [dtype] [seed]
 *
 * Exit status 0 when every element is within its bound, 1 otherwise.
 */
package io.fusedcomm.examples;

import io.fusedcomm.api.CommOptions;
import io.fusedcomm.api.Communicator;
import io.fusedcomm.api.DType;
import io.fusedcomm.api.HostTensor;
import io.fusedcomm.api.Split;
import io.fusedcomm.api.WeightLayout;
import io.fusedcomm.spark.BarrierStage;
import java.io.Serializable;
import java.util.Comparator;
import java.util.List;
import java.util.Locale;
import java.util.stream.Collectors;

/** Example 02: a tensor-parallel MLP forward with the fused ops, checked against fp64. */
public final class TensorParallelMlpExample {
  static final String NAME = "02_tensor_parallel_mlp";

  private TensorParallelMlpExample() {}

  /** Global problem: shapes, dtype and seed; every rank derives its shards from it. */
  record Problem(int world, int m, int h, int f, DType dtype, long seed) implements Serializable {
    float[] x() {
      return SeededValues.uniform(SeededValues.seed(seed, 1), m * h, 1.0, dtype);
    }

    /** W1: F × H, scaled so that Z has unit-order entries. */
    float[] w1() {
      return SeededValues.uniform(SeededValues.seed(seed, 2), f * h, Math.sqrt(3.0 / h), dtype);
    }

    /** W2: H × F. */
    float[] w2() {
      return SeededValues.uniform(SeededValues.seed(seed, 3), h * f, Math.sqrt(3.0 / f), dtype);
    }

    String describe() {
      return String.format(Locale.ROOT, "world=%d, M=%d, H=%d, F=%d, dtype=%s", world, m, h, f, dtype.label());
    }
  }

  /** One rank's output rows and timings. */
  record Shard(int rank, int rowOffset, int rows, float[] y, String backend, double agGemmMs, double actMs,
      double gemmRsMs) implements Serializable {}

  public static void main(String[] args) throws Exception {
    int world = Math.toIntExact(ExampleContext.positiveArg(args, 0, "world", 2));
    int m = Math.toIntExact(ExampleContext.positiveArg(args, 1, "M", 125));
    int h = Math.toIntExact(ExampleContext.positiveArg(args, 2, "H", 64));
    int f = Math.toIntExact(ExampleContext.positiveArg(args, 3, "F", 256));
    DType dtype = args.length > 4 ? parseDType(args[4]) : DType.BF16;
    long seed = args.length > 5 ? Long.parseLong(args[5].trim()) : System.nanoTime();
    Problem p = new Problem(world, m, h, f, dtype, seed);

    ExampleContext.run(NAME, world, (sc, tasks) -> {
      System.out.printf(Locale.ROOT, "%s: %s seed=%d master=%s%n", NAME, p.describe(), seed, sc.master());
      CommOptions options = CommOptions.defaults().name("tp-mlp")
          .expectOp("allGatherGemm", dtype, m, f, h)
          .expectOp("gemmReduceScatter", dtype, m, h, f);
      List<Shard> shards =
          BarrierStage.withCommunicator(tasks, options, (comm, context, rows) -> List.of(forward(comm, p)).iterator())
              .collect();
      return check(p, shards);
    });
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

  /** The tensor-parallel forward on one rank. */
  static Shard forward(Communicator comm, Problem p) {
    int w = comm.world();
    int r = comm.rank();
    if (w != p.world()) {
      throw new IllegalStateException("the stage has " + w + " tasks, the problem expects " + p.world());
    }
    int rowOffset = (int) Split.offset(p.m(), w, r);
    int rows = (int) Split.count(p.m(), w, r);
    int fOffset = (int) Split.offset(p.f(), w, r);
    int fLocal = (int) Split.count(p.f(), w, r);

    float[] x = p.x();
    float[] w1 = p.w1();
    float[] w2 = p.w2();
    float[] xLocal = java.util.Arrays.copyOfRange(x, rowOffset * p.h(), (rowOffset + rows) * p.h());
    // W1 rows fOffset.. (F_r × H): contiguous in row-major W1.
    float[] w1Local = java.util.Arrays.copyOfRange(w1, fOffset * p.h(), (fOffset + fLocal) * p.h());
    // W2 columns fOffset.. (H × F_r): one strided slice per row of W2.
    float[] w2Local = new float[p.h() * fLocal];
    for (int i = 0; i < p.h(); i++) {
      System.arraycopy(w2, i * p.f() + fOffset, w2Local, i * fLocal, fLocal);
    }

    DType d = p.dtype();
    try (HostTensor xT = HostTensor.of(xLocal, d, rows, p.h());
        HostTensor w1T = HostTensor.of(w1Local, d, fLocal, p.h());
        HostTensor w2T = HostTensor.of(w2Local, d, p.h(), fLocal);
        HostTensor z = HostTensor.allocate(d, p.m(), fLocal);
        HostTensor y = HostTensor.allocate(d, rows, p.h())) {
      z.fill(Float.NaN);
      y.fill(Float.NaN);

      long t0 = System.nanoTime();
      comm.allGatherGemm(xT, w1T, z, WeightLayout.NK);
      long t1 = System.nanoTime();
      float[] a = z.toFloatArray();
      for (int i = 0; i < a.length; i++) {
        a[i] = (float) gelu(a[i]);
      }
      z.copyFrom(a); // rounds to the dtype, as a bf16 activation tensor would be stored
      long t2 = System.nanoTime();
      comm.gemmReduceScatter(z, w2T, y, WeightLayout.NK);
      long t3 = System.nanoTime();

      return new Shard(r, rowOffset, rows, y.toFloatArray(), comm.backend().configName(),
          (t1 - t0) / 1e6, (t2 - t1) / 1e6, (t3 - t2) / 1e6);
    }
  }

  /** GELU, tanh approximation: 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))). */
  static double gelu(double x) {
    return 0.5 * x * (1.0 + Math.tanh(Math.sqrt(2.0 / Math.PI) * (x + 0.044715 * x * x * x)));
  }

  /** The single-process reference, in fp64 from the same (dtype-rounded) inputs. */
  static final class Reference {
    /** L ≥ max |GELU'(x)| over all x (the tanh form peaks at about 1.129). */
    static final double GELU_LIPSCHITZ = 1.13;

    /**
     * Confidence factor of the probabilistic bounds: by Hoeffding's inequality a sum of
     * independent zero-mean errors |e_f| ≤ b_f exceeds λ·√(Σ b_f²) with probability at most
     * 2·exp(-λ²/2) ≈ 4.6e-11 for λ = 7, i.e. under 1e-6 per run of a few thousand elements.
     */
    static final double LAMBDA = 7.0;

    final double[] y;
    final double[] tolerance;

    /**
     * Y = GELU(X·W1ᵀ)·W2ᵀ (M × H) and, per element, a bound on how far the distributed path may
     * land from it. Rounding errors are modelled as independent, zero-mean and bounded (the
     * probabilistic analysis of Higham and Mary, SIAM J. Sci. Comput. 41(5), 2019), since
     * worst-case bounds grow with F where real errors grow with √F and would let a wrong answer
     * pass. u = the dtype's unit roundoff, v = 2^-24 (fp32), S1_f = Σ_k |x_k·W1_fk|, p_r = rank
     * r's partial Σ_{f in shard r} A_f·W2_if:
     *
     * <pre>
     *   |δZ_f| ≤ b_f = u·|Z_f| + λ·√H·v·S1_f              allGatherGemm: accumulate, round Z
     *   |δA_f| ≤ a_f = L·b_f + (u + v)·|A_f|             GELU is L-Lipschitz; float, then dtype
     *   |δY_i| ≤ λ·√(Σ_f (W2_if·a_f)²)                   activation errors, independent over f
     *          + λ·√F·v·Σ_f |A_f·W2_if|                  fp32 accumulation of the second GEMM
     *          + w·u·Σ_r |p_r|                           each partial and each reduction step rounded
     *          + u·|Y_i|                                  the output rounded
     * </pre>
     *
     * No averaging anywhere: every element must be within its own bound.
     */
    Reference(Problem p) {
      float[] x = p.x();
      float[] w1 = p.w1();
      float[] w2 = p.w2();
      int m = p.m();
      int h = p.h();
      int f = p.f();
      int w = p.world();
      double u = SeededValues.unitRoundoff(p.dtype());
      double v = 0x1p-24;
      y = new double[m * h];
      tolerance = new double[m * h];
      double[] act = new double[f];
      double[] dAct = new double[f];
      double[] partial = new double[w];
      for (int row = 0; row < m; row++) {
        for (int j = 0; j < f; j++) {
          double z = 0;
          double s1 = 0;
          for (int k = 0; k < h; k++) {
            double t = (double) x[row * h + k] * w1[j * h + k];
            z += t;
            s1 += Math.abs(t);
          }
          act[j] = gelu(z);
          double dz = u * Math.abs(z) + LAMBDA * Math.sqrt(h) * v * s1;
          dAct[j] = GELU_LIPSCHITZ * dz + (u + v) * Math.abs(act[j]);
        }
        for (int i = 0; i < h; i++) {
          double propagated = 0;
          double magnitude = 0;
          for (int r = 0; r < w; r++) {
            int from = (int) Split.offset(f, w, r);
            int to = from + (int) Split.count(f, w, r);
            double sum = 0;
            for (int j = from; j < to; j++) {
              double wij = w2[i * f + j];
              sum += act[j] * wij;
              propagated += (wij * dAct[j]) * (wij * dAct[j]);
              magnitude += Math.abs(act[j] * wij);
            }
            partial[r] = sum;
          }
          double total = 0;
          double partials = 0;
          for (int r = 0; r < w; r++) {
            total += partial[r];
            partials += Math.abs(partial[r]);
          }
          y[row * h + i] = total;
          tolerance[row * h + i] = LAMBDA * Math.sqrt(propagated) + LAMBDA * Math.sqrt(f) * v * magnitude
              + w * u * partials + u * Math.abs(total);
        }
      }
    }
  }

  /** Checks every element of every shard; prints the per-rank table, the error and the final line. */
  static boolean check(Problem p, List<Shard> shards) {
    Reference ref = new Reference(p);
    List<Shard> sorted = shards.stream().sorted(Comparator.comparingInt(Shard::rank)).collect(Collectors.toList());
    System.out.printf(Locale.ROOT, "%-5s %9s %18s %10s %21s%n", "rank", "Y rows", "allGatherGemm ms", "gelu ms",
        "gemmReduceScatter ms");
    boolean passed = sorted.size() == p.world();
    long bad = 0;
    double maxErr = 0;
    double tolAtMax = 0;
    double worstRatio = 0;
    int nextRow = 0;
    for (int s = 0; s < sorted.size(); s++) {
      Shard shard = sorted.get(s);
      System.out.printf(Locale.ROOT, "%-5d %9s %18.3f %10.3f %21.3f%n", shard.rank(),
          shard.rowOffset() + ".." + (shard.rowOffset() + shard.rows() - 1), shard.agGemmMs(), shard.actMs(),
          shard.gemmRsMs());
      // Shards must tile Y's rows in rank order by the Split rule.
      if (shard.rank() != s || shard.rowOffset() != nextRow
          || shard.rows() != Split.count(p.m(), p.world(), s) || shard.y().length != shard.rows() * p.h()) {
        System.out.println("  rank " + shard.rank() + " returned the wrong rows or shape");
        passed = false;
        continue;
      }
      nextRow += shard.rows();
      for (int i = 0; i < shard.y().length; i++) {
        int at = shard.rowOffset() * p.h() + i;
        double got = shard.y()[i];
        double err = Double.isNaN(got) ? Double.POSITIVE_INFINITY : Math.abs(got - ref.y[at]);
        if (!(err <= ref.tolerance[at])) {
          if (bad < 5) {
            System.out.printf(Locale.ROOT, "  mismatch Y[%d][%d]: got %.6g, reference %.6g, tolerance %.3g%n",
                at / p.h(), at % p.h(), got, ref.y[at], ref.tolerance[at]);
          }
          bad++;
        }
        if (err > maxErr) {
          maxErr = err;
          tolAtMax = ref.tolerance[at];
        }
        worstRatio = Math.max(worstRatio, err / ref.tolerance[at]);
      }
    }
    passed &= nextRow == p.m() && bad == 0;
    double maxRef = java.util.Arrays.stream(ref.y).map(Math::abs).max().orElse(0);
    String backend = shards.stream().map(Shard::backend).distinct().collect(Collectors.joining(","));
    System.out.printf(Locale.ROOT, "max |error| %.3e (tolerance there %.3e), worst error/tolerance %.3f,"
        + " max |Y| %.3f, %d of %d elements out of bounds%n", maxErr, tolAtMax, worstRatio, maxRef, bad,
        (long) p.m() * p.h());
    if (passed) {
      System.out.printf(Locale.ROOT, "%s: check passed (%s, backend=%s, max_abs_err=%.3e)%n", NAME, p.describe(),
          backend, maxErr);
    } else {
      System.out.printf(Locale.ROOT, "%s: FAILED (%s, backend=%s, %d elements out of bounds, %d of %d ranks"
          + " reported)%n", NAME, p.describe(), backend, bad, shards.size(), p.world());
    }
    return passed;
  }
}
