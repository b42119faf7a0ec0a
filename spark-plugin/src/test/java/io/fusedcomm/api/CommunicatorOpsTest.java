package io.fusedcomm.api;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.fusedcomm.testing.Check;
import io.fusedcomm.testing.Data;
import io.fusedcomm.testing.Expected;
import io.fusedcomm.testing.HostWorld;
import io.fusedcomm.testing.Reference;
import io.fusedcomm.testing.TensorScope;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Map;
import java.util.SplittableRandom;
import java.util.stream.Stream;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.Arguments;
import org.junit.jupiter.params.provider.MethodSource;

/**
 * Every op of the Communicator on the host backend, W = 1..4 ranks as threads of this JVM (one
 * ExecutorRuntime each, real transport between them), f32 and bf16, sizes that do and do not
 * divide by W: fresh random inputs, outputs poisoned with NaN, every element checked against the
 * fp64 {@link Reference}. The seed is printed and can be fixed with -Dfusedcomm.test.seed=N.
 *
 * <p>Validation and failure behaviour live in {@link CommunicatorValidationTest}.
 */
class CommunicatorOpsTest {
  static final long SEED = Long.getLong("fusedcomm.test.seed", System.nanoTime());
  private static HostWorld world;

  @BeforeAll
  static void start() {
    System.out.println("CommunicatorOpsTest seed " + SEED + " (-Dfusedcomm.test.seed=" + SEED + " reproduces)");
    // 64k chunks (the minimum): the larger sizes below span several chunks per peer.
    world = new HostWorld(4, Map.of("spark.fusedcomm.host.chunkBytes", "64k"), 120_000);
  }

  @AfterAll
  static void stop() {
    if (world != null) {
      world.close();
    }
  }

  static Stream<Arguments> worldsAndTypes() {
    List<Arguments> out = new ArrayList<>();
    for (int w = 1; w <= 4; w++) {
      for (DType t : new DType[] {DType.F32, DType.BF16}) {
        out.add(Arguments.of(w, t));
      }
    }
    return out.stream();
  }

  /** Element counts: divisible by W, not divisible, fewer than W (ranks with nothing), multi-chunk. */
  static long[] counts(int w) {
    return new long[] {8L * w, 8L * w + 1, Math.max(1, 2L * w - 1), 40_009};
  }

  private static String ctx(String op, int w, DType t, Object... more) {
    StringBuilder s = new StringBuilder(op).append(" W=").append(w).append(' ').append(t.label());
    for (Object m : more) {
      s.append(' ').append(m);
    }
    return s.append(" seed=").append(SEED).toString();
  }

  private static float[][] perRank(int w, long test, int tensor, java.util.function.IntUnaryOperator size, DType t) {
    float[][] out = new float[w][];
    for (int r = 0; r < w; r++) {
      out[r] = Data.uniform(Data.seed(SEED + test, r, tensor), size.applyAsInt(r), t);
    }
    return out;
  }

  // ---- collectives ---------------------------------------------------------------------------

  @ParameterizedTest(name = "W={0} {1}")
  @MethodSource("worldsAndTypes")
  void allGather(int w, DType t) {
    for (long n : counts(w)) {
      float[][] in = perRank(w, 1 + n, 0, r -> (int) Reference.count(n, w, r), t);
      float[] expected = Data.concat(in);
      List<float[]> outs = world.run(w, comm -> {
        try (TensorScope s = new TensorScope()) {
          HostTensor out = s.poisoned(t, n);
          comm.allGather(s.of(in[comm.rank()], t, in[comm.rank()].length), out);
          return out.toFloatArray();
        }
      });
      for (int r = 0; r < w; r++) {
        Check.exact(ctx("allGather", w, t, "n=" + n, "rank " + r), expected, outs.get(r));
      }
    }
  }

  @ParameterizedTest(name = "W={0} {1}")
  @MethodSource("worldsAndTypes")
  void reduceScatter(int w, DType t) {
    for (long n : counts(w)) {
      float[][] in = perRank(w, 2 + n, 0, r -> (int) n, t);
      Expected sum = Reference.sum(in);
      List<float[]> outs = world.run(w, comm -> {
        try (TensorScope s = new TensorScope()) {
          HostTensor out = s.poisoned(t, Reference.count(n, w, comm.rank()));
          comm.reduceScatter(s.of(in[comm.rank()], t, n), out);
          return out.toFloatArray();
        }
      });
      for (int r = 0; r < w; r++) {
        Expected block = sum.slice(Reference.offset(n, w, r), Reference.count(n, w, r));
        Check.close(ctx("reduceScatter", w, t, "n=" + n, "rank " + r), block, outs.get(r), t);
      }
    }
  }

  @ParameterizedTest(name = "W={0} {1}")
  @MethodSource("worldsAndTypes")
  void allReduceOutOfPlaceAndInPlace(int w, DType t) {
    for (long n : counts(w)) {
      float[][] in = perRank(w, 3 + n, 0, r -> (int) n, t);
      Expected sum = Reference.sum(in);
      List<float[][]> outs = world.run(w, comm -> {
        try (TensorScope s = new TensorScope()) {
          HostTensor x = s.of(in[comm.rank()], t, n);
          HostTensor out = s.poisoned(t, n);
          comm.allReduce(x, out);
          float[] untouched = x.toFloatArray();
          comm.allReduce(x, x);
          return new float[][] {out.toFloatArray(), x.toFloatArray(), untouched};
        }
      });
      for (int r = 0; r < w; r++) {
        String c = ctx("allReduce", w, t, "n=" + n, "rank " + r);
        Check.close(c + " out of place", sum, outs.get(r)[0], t);
        Check.exact(c + " in place equals out of place", outs.get(r)[0], outs.get(r)[1]);
        Check.exact(c + " input left alone", in[r], outs.get(r)[2]);
        Check.exact(c + " same bits on every rank", outs.get(0)[0], outs.get(r)[0]);
      }
    }
  }

  @ParameterizedTest(name = "W={0} {1}")
  @MethodSource("worldsAndTypes")
  void allToAll(int w, DType t) {
    for (long n : counts(w)) {
      float[][] in = perRank(w, 4 + n, 0, r -> (int) n, t);
      List<float[]> outs = world.run(w, comm -> {
        try (TensorScope s = new TensorScope()) {
          HostTensor out = s.poisoned(t, w * Reference.count(n, w, comm.rank()));
          comm.allToAll(s.of(in[comm.rank()], t, n), out);
          return out.toFloatArray();
        }
      });
      for (int r = 0; r < w; r++) {
        float[][] blocks = new float[w][];
        for (int src = 0; src < w; src++) {
          blocks[src] = Data.slice(in[src], Reference.offset(n, w, r), Reference.count(n, w, r));
        }
        Check.exact(ctx("allToAll", w, t, "n=" + n, "rank " + r), Data.concat(blocks), outs.get(r));
      }
    }
  }

  // ---- fused GEMM + communication ----------------------------------------------------------

  @ParameterizedTest(name = "W={0} {1}")
  @MethodSource("worldsAndTypes")
  void allGatherGemm(int w, DType t) {
    final int k = 19;
    for (int m : new int[] {4 * w, 4 * w + 1}) {
      for (WeightLayout layout : WeightLayout.values()) {
        long test = 5 + m * 7L + layout.ordinal();
        float[][] a = perRank(w, test, 0, r -> (int) Reference.count(m, w, r) * k, t);
        // N_r differs per rank: the contract fixes M and K only.
        float[][] wt = perRank(w, test, 1, r -> (5 + r) * k, t);
        float[] full = Data.concat(a);
        List<float[][]> outs = world.run(w, comm -> {
          int r = comm.rank();
          int nr = 5 + r;
          try (TensorScope s = new TensorScope()) {
            HostTensor c = s.poisoned(t, m, nr);
            HostTensor c2 = s.poisoned(t, m, nr);
            HostTensor gathered = s.poisoned(t, m, k);
            HostTensor wr = s.of(wt[r], t, Reference.weightShape(layout, nr, k));
            HostTensor ar = s.of(a[r], t, Reference.count(m, w, r), k);
            comm.allGatherGemm(ar, wr, c, gathered, layout);
            comm.allGatherGemm(ar, wr, c2, layout);
            return new float[][] {c.toFloatArray(), gathered.toFloatArray(), c2.toFloatArray()};
          }
        });
        for (int r = 0; r < w; r++) {
          String c = ctx("allGatherGemm", w, t, "M=" + m, layout, "rank " + r);
          Check.close(c, Reference.gemm(full, wt[r], m, 5 + r, k, layout), outs.get(r)[0], t);
          Check.exact(c + " gatheredA", full, outs.get(r)[1]);
          Check.exact(c + " without gatheredA", outs.get(r)[0], outs.get(r)[2]);
        }
      }
    }
  }

  @ParameterizedTest(name = "W={0} {1}")
  @MethodSource("worldsAndTypes")
  void gemmReduceScatterAndAllReduce(int w, DType t) {
    final int n = 6;
    for (int m : new int[] {3 * w, 3 * w + 1, Math.max(1, w - 1)}) {
      for (WeightLayout layout : WeightLayout.values()) {
        long test = 6 + m * 7L + layout.ordinal();
        int[] kr = new int[w];
        for (int r = 0; r < w; r++) {
          kr[r] = 8 + 3 * r;  // K_r differs per rank
        }
        float[][] a = perRank(w, test, 0, r -> m * kr[r], t);
        float[][] wt = perRank(w, test, 1, r -> n * kr[r], t);
        Expected sum = Reference.gemmSum(a, wt, m, n, kr, layout);
        List<float[][]> outs = world.run(w, comm -> {
          int r = comm.rank();
          try (TensorScope s = new TensorScope()) {
            HostTensor ar = s.of(a[r], t, m, kr[r]);
            HostTensor wr = s.of(wt[r], t, Reference.weightShape(layout, n, kr[r]));
            HostTensor rs = s.poisoned(t, Reference.count(m, w, r), n);
            HostTensor ar2 = s.poisoned(t, m, n);
            comm.gemmReduceScatter(ar, wr, rs, layout);
            comm.gemmAllReduce(ar, wr, ar2, layout);
            return new float[][] {rs.toFloatArray(), ar2.toFloatArray()};
          }
        });
        for (int r = 0; r < w; r++) {
          String c = ctx("gemm+collective", w, t, "M=" + m, layout, "rank " + r);
          Expected block = sum.slice(Reference.offset(m, w, r) * n, Reference.count(m, w, r) * n);
          Check.close(c + " gemmReduceScatter", block, outs.get(r)[0], t);
          Check.close(c + " gemmAllReduce", sum, outs.get(r)[1], t);
          Check.exact(c + " gemmAllReduce same bits on every rank", outs.get(0)[1], outs.get(r)[1]);
          // Both ops round the same fp32 sum once: the scatter block equals the all-reduce rows.
          Check.exact(c + " gemmReduceScatter block = gemmAllReduce rows",
              Data.rows(outs.get(r)[1], n, Reference.offset(m, w, r), Reference.count(m, w, r)), outs.get(r)[0]);
        }
      }
    }
  }

  @ParameterizedTest(name = "W={0} {1}")
  @MethodSource("worldsAndTypes")
  void gemmReduceScatterAndAllReduceWithBf16Partials(int w, DType t) {
    final int n = 5;
    for (int m : new int[] {2 * w + 1, 1}) {
      for (WeightLayout layout : WeightLayout.values()) {
        long test = 60 + m * 7L + layout.ordinal();
        int[] kr = new int[w];
        for (int r = 0; r < w; r++) {
          kr[r] = 9 + 2 * r;
        }
        float[][] a = perRank(w, test, 0, r -> m * kr[r], t);
        float[][] wt = perRank(w, test, 1, r -> n * kr[r], t);
        Expected sum = Reference.gemmSum(a, wt, m, n, kr, layout, true);
        List<float[][]> outs = world.run(w, comm -> {
          int r = comm.rank();
          try (TensorScope s = new TensorScope()) {
            HostTensor rs = s.poisoned(t, Reference.count(m, w, r), n);
            HostTensor all = s.poisoned(t, m, n);
            HostTensor ar = s.of(a[r], t, m, kr[r]);
            HostTensor wr = s.of(wt[r], t, Reference.weightShape(layout, n, kr[r]));
            comm.gemmReduceScatter(ar, wr, rs, layout, PartialPrecision.BF16);
            comm.gemmAllReduce(ar, wr, all, layout, PartialPrecision.BF16);
            return new float[][] {rs.toFloatArray(), all.toFloatArray()};
          }
        });
        for (int r = 0; r < w; r++) {
          String c = ctx("bf16 partials", w, t, "M=" + m, layout, "rank " + r);
          Check.close(c + " gemmReduceScatter", sum.slice(Reference.offset(m, w, r) * n, Reference.count(m, w, r) * n),
              outs.get(r)[0], t, 0x1p-7);
          Check.close(c + " gemmAllReduce", sum, outs.get(r)[1], t, 0x1p-7);
          Check.exact(c + " gemmAllReduce same bits on every rank", outs.get(0)[1], outs.get(r)[1]);
        }
      }
    }
  }

  /**
   * A gemmReduceScatter whose partials are one fp32 value per rank ({@code x[rank]}, in every
   * one of {@code w} rows) run once per precision; per rank, each run's one output element.
   */
  private List<float[]> scalarPartials(int w, float[] x, PartialPrecision... precisions) {
    return world.run(w, comm -> {
      try (TensorScope s = new TensorScope()) {
        float[] rows = new float[w];
        Arrays.fill(rows, x[comm.rank()]);
        HostTensor a = s.of(rows, DType.F32, w, 1);
        HostTensor wt = s.of(new float[] {1f}, DType.F32, 1, 1);
        float[] out = new float[precisions.length];
        for (int i = 0; i < precisions.length; i++) {
          HostTensor c = s.poisoned(DType.F32, 1, 1);
          comm.gemmReduceScatter(a, wt, c, WeightLayout.NK, precisions[i]);
          out[i] = c.toFloatArray()[0];
        }
        return out;
      }
    });
  }

  /** Each rank's only partial is 1 + 2^-10: bf16 partials round it to 1 first (sum 2), fp32 ones do not. */
  @Test
  void bf16PartialsAreRoundedBeforeTheSum() {
    final float x = 1f + 0x1p-10f;
    List<float[]> outs = scalarPartials(2, new float[] {x, x}, PartialPrecision.F32, PartialPrecision.BF16);
    for (int r = 0; r < 2; r++) {
      assertEquals(2f + 0x1p-9f, outs.get(r)[0], "rank " + r + ": fp32 partials");
      assertEquals(2f, outs.get(r)[1], "rank " + r + ": bf16 partials");
    }
  }

  /**
   * F32_ANY_ORDER allows any order of the fp32 sum; the host backend keeps rank order, so its
   * results are F32's bit for bit. Partials 1, 2^-24, -1 (three ranks): rank order gives
   * (1 + 2^-24) - 1 = 0 in fp32, another order 2^-24, so the order shows.
   */
  @Test
  void anyOrderPartialsOnTheHostBackendAreRankOrder() {
    List<float[]> outs = scalarPartials(3, new float[] {1f, 0x1p-24f, -1f}, PartialPrecision.F32,
        PartialPrecision.F32_ANY_ORDER);
    for (int r = 0; r < 3; r++) {
      assertEquals(0f, outs.get(r)[0], "rank " + r + ": fp32 partials in rank order");
      assertEquals(Float.floatToRawIntBits(outs.get(r)[0]), Float.floatToRawIntBits(outs.get(r)[1]),
          "rank " + r + ": any order = rank order here");
    }
  }

  @ParameterizedTest(name = "{0}")
  @MethodSource("types")
  void staticGemm(DType t) {
    int m = 7;
    int n = 5;
    int k = 13;
    for (WeightLayout layout : WeightLayout.values()) {
      float[] a = Data.uniform(SEED + 70, m * k, t);
      float[] wt = Data.uniform(SEED + 71, n * k, t);
      try (TensorScope s = new TensorScope()) {
        HostTensor c = s.poisoned(t, m, n);
        Communicator.gemm(s.of(a, t, m, k), s.of(wt, t, Reference.weightShape(layout, n, k)),
            c, layout);
        Check.close(ctx("gemm", 1, t, layout), Reference.gemm(a, wt, m, n, k, layout), c.toFloatArray(), t);
      }
    }
  }

  /**
   * The static grouped GEMM on the host backend: groups of 3, 0, 5, 1 and 0 rows over rows 1..9
   * of 11 (rows 0 and 10 in no group), both weight layouts; each group's rows against its own
   * fp64 GEMM, the rows outside every group still holding their poison.
   */
  @ParameterizedTest(name = "{0}")
  @MethodSource("types")
  void staticGroupedGemm(DType t) {
    int rows = 11;
    int n = 6;
    int k = 13;
    long[] offsets = {1, 4, 4, 9, 10, 10};
    int groups = offsets.length - 1;
    for (WeightLayout layout : WeightLayout.values()) {
      float[] a = Data.uniform(SEED + 72, rows * k, t);
      float[] w = Data.uniform(SEED + 73, groups * n * k, t);
      try (TensorScope s = new TensorScope()) {
        HostTensor c = s.poisoned(t, rows, n);
        long[] shape = Reference.weightShape(layout, n, k);
        Communicator.groupedGemm(s.of(a, t, rows, k), s.of(w, t, groups, shape[0], shape[1]), c, offsets, layout);
        float[] got = c.toFloatArray();
        for (int g = 0; g < groups; g++) {
          int from = (int) offsets[g];
          int len = (int) (offsets[g + 1] - from);
          Check.close(ctx("groupedGemm", 1, t, layout, "group " + g), Reference.gemm(Data.rows(a, k, from, len),
              Data.slice(w, (long) g * n * k, (long) n * k), len, n, k, layout), Data.rows(got, n, from, len), t);
        }
        for (int row : new int[] {0, rows - 1}) {
          for (int j = 0; j < n; j++) {
            assertEquals(true, Float.isNaN(got[row * n + j]), "row " + row + " is in no group: not written");
          }
        }
      }
    }
  }

  static Stream<DType> types() {
    return Stream.of(DType.F32, DType.BF16);
  }

  // ---- MoE ---------------------------------------------------------------------------------

  /** What one rank saw of a dispatch and combine. */
  static final class MoeSeen {
    boolean gemmCombineSame;  // moeGemmCombine bit for bit moeCombine(groupedGemm) on this rank
    long rows;
    long firstLocalExpert;
    int localExperts;
    long[] offsets;
    long tokens;
    int topk;
    int[] srcRank;
    int[] srcToken;
    int[] slot;
    float[] weight;
    float[] routed;
    float[] expertOutput;
    float[] combined;
  }

  @ParameterizedTest(name = "W={0} {1}")
  @MethodSource("worldsAndTypes")
  void moeDispatchAndCombine(int w, DType t) {
    final long experts = 5;  // not divisible by 2, 3 or 4: ranks own 3+2, 2+2+1, 2+1+1+1 experts
    final int hidden = 12;
    final int ffn = 7;
    final int width = 9;
    final int topk = 2;
    int[] tokens = new int[w];
    int[][] ids = new int[w][];
    float[][] weights = new float[w][];
    float[][] x = new float[w][];
    float[][] w1 = new float[w][];
    for (int r = 0; r < w; r++) {
      tokens[r] = 3 + 2 * r;  // T differs per rank
      SplittableRandom rnd = new SplittableRandom(SEED + 80 + r);
      ids[r] = new int[tokens[r] * topk];
      for (int i = 0; i < ids[r].length; i++) {
        ids[r][i] = rnd.nextInt((int) experts);
      }
      // Token 0 sends both of its choices to one expert; token 1 (when there) to two different ones.
      ids[r][0] = r % (int) experts;
      ids[r][1] = r % (int) experts;
      ids[r][2] = (r + 1) % (int) experts;
      ids[r][3] = (r + 3) % (int) experts;
      weights[r] = Data.positive(SEED + 90 + r, tokens[r] * topk, DType.F32);
      x[r] = Data.uniform(SEED + 100 + r, tokens[r] * hidden, t);
      w1[r] = Data.uniform(SEED + 110 + r, (int) Reference.count(experts, w, r) * ffn * hidden, t);
    }
    List<List<Reference.MoeRow>> routes = Reference.moeRoute(w, experts, topk, ids, weights);
    float[][] y = new float[w][];
    for (int r = 0; r < w; r++) {
      y[r] = Data.uniform(SEED + 120 + r, routes.get(r).size() * width, t);
    }

    List<MoeSeen> seen = world.run(w, comm -> {
      int r = comm.rank();
      try (TensorScope s = new TensorScope()) {
        HostTensor xr = s.of(x[r], t, tokens[r], hidden);
        HostTensor idr = s.ints(ids[r], tokens[r], topk);
        HostTensor wr = s.of(weights[r], DType.F32, tokens[r], topk);
        HostTensor w1r = s.of(w1[r], t, Reference.count(experts, w, r), ffn, hidden);
        try (MoeDispatch d = comm.moeDispatchGemm(xr, idr, wr, experts, w1r)) {
          MoeSeen m = new MoeSeen();
          m.rows = d.rows();
          m.firstLocalExpert = d.firstLocalExpert();
          m.localExperts = d.localExperts();
          m.offsets = new long[m.localExperts + 1];
          for (int e = 0; e <= m.localExperts; e++) {
            m.offsets[e] = d.expertOffset(e);
          }
          m.tokens = d.tokens();
          m.topk = d.topk();
          int rows = Math.toIntExact(d.rows());
          m.srcRank = new int[rows];
          m.srcToken = new int[rows];
          m.slot = new int[rows];
          m.weight = new float[rows];
          for (int i = 0; i < rows; i++) {
            m.srcRank[i] = d.sourceRank(i);
            m.srcToken[i] = d.sourceToken(i);
            m.slot[i] = d.slot(i);
            m.weight[i] = d.weight(i);
          }
          m.routed = ((HostTensor) d.routedTokens()).toFloatArray();
          m.expertOutput = ((HostTensor) d.expertOutput()).toFloatArray();
          if (rows != y[r].length / width) {
            throw new AssertionError("rank " + r + " has " + rows + " rows, the reference " + y[r].length / width);
          }
          HostTensor out = s.poisoned(t, tokens[r], width);
          comm.moeCombine(d, s.of(y[r], t, rows, width), out);
          m.combined = out.toFloatArray();
          // moeGemmCombine with y as h (K = width) and 8 outputs per row: bit for bit the grouped
          // GEMM over the dispatch's expert offsets, then the combine.
          final int outW = 8;
          HostTensor h = s.of(y[r], t, rows, width);
          HostTensor w2 = s.of(Data.uniform(SEED + 130 + r, m.localExperts * outW * width, t), t,
              m.localExperts, outW, width);
          HostTensor expertRows = s.poisoned(t, rows, outW);
          Communicator.groupedGemm(h, w2, expertRows, d.expertOffsets(), WeightLayout.NK);
          HostTensor want = s.poisoned(t, tokens[r], outW);
          comm.moeCombine(d, expertRows, want);
          HostTensor got = s.poisoned(t, tokens[r], outW);
          comm.moeGemmCombine(h, w2, d, got);
          m.gemmCombineSame = Arrays.equals(want.toFloatArray(), got.toFloatArray());
          return m;
        }
      }
    });

    for (int r = 0; r < w; r++) {
      String c = ctx("moe", w, t, "rank " + r);
      MoeSeen m = seen.get(r);
      List<Reference.MoeRow> rows = routes.get(r);
      long first = Reference.offset(experts, w, r);
      int local = (int) Reference.count(experts, w, r);
      assertEquals(rows.size(), m.rows, c + ": rows");
      assertEquals(first, m.firstLocalExpert, c + ": first local expert");
      assertEquals(local, m.localExperts, c + ": local experts");
      assertEquals(tokens[r], m.tokens, c + ": tokens");
      assertEquals(topk, m.topk, c + ": topk");
      long[] offsets = new long[local + 1];
      for (Reference.MoeRow row : rows) {
        offsets[(int) (row.expert - first) + 1]++;
      }
      for (int e = 0; e < local; e++) {
        offsets[e + 1] += offsets[e];
      }
      assertArrayEquals(offsets, m.offsets, c + ": expert offsets");
      float[] routed = new float[rows.size() * hidden];
      for (int i = 0; i < rows.size(); i++) {
        Reference.MoeRow row = rows.get(i);
        String at = c + " row " + i + " (expected " + row + ")";
        assertEquals(row.srcRank, m.srcRank[i], at + ": source rank");
        assertEquals(row.token, m.srcToken[i], at + ": source token");
        assertEquals(row.slot, m.slot[i], at + ": slot");
        assertEquals(Float.floatToIntBits(row.weight), Float.floatToIntBits(m.weight[i]), at + ": weight");
        System.arraycopy(x[row.srcRank], row.token * hidden, routed, i * hidden, hidden);
      }
      Check.exact(c + " routed tokens", routed, m.routed);
      Check.close(c + " expert output", Reference.moeExpertOutput(rows, x, w1[r], first, hidden, ffn), m.expertOutput, t);
      Check.close(c + " combine", Reference.moeCombine(r, tokens[r], topk, routes, y, width), m.combined, t);
      assertTrue(m.gemmCombineSame, c + ": moeGemmCombine = moeCombine(groupedGemm) bit for bit");
    }
    // The token routed twice to one expert arrives as two rows, slots 0 and 1, adjacent.
    for (int home = 0; home < w; home++) {
      int owner = Reference.expertOwner(experts, w, home % experts);
      int twice = 0;
      for (int i = 0; i < seen.get(owner).rows; i++) {
        if (seen.get(owner).srcRank[i] == home && seen.get(owner).srcToken[i] == 0) {
          twice++;
        }
      }
      assertEquals(2, twice, ctx("moe", w, t, "token 0 of rank " + home + " at rank " + owner));
    }
  }

  /**
   * maxRecvRows: every rank routes its tokens to expert 0 (rank 0's), so rank 0 receives every
   * row. A bound one below that fails on every rank with the same IllegalArgumentException
   * naming rank 0, its rows and the bound (before any row moves); the next dispatch, bounded at
   * exactly those rows, works on the same communicator and routes every row.
   */
  @ParameterizedTest(name = "W={0}")
  @MethodSource("moeWorlds")
  void moeReceiveBound(int w) {
    final long experts = 2L * w;
    final int hidden = 8;
    final int ffn = 4;
    final int topk = 1;
    int total = 0;
    for (int r = 0; r < w; r++) {
      total += 2 + r;
    }
    final int rows = total;
    List<String[]> seen = world.run(w, comm -> {
      int r = comm.rank();
      int tokens = 2 + r;
      int[] ids = new int[tokens * topk];  // all 0
      try (TensorScope s = new TensorScope()) {
        HostTensor x = s.of(Data.uniform(SEED + 130 + r, tokens * hidden, DType.F32), DType.F32, tokens, hidden);
        HostTensor idr = s.ints(ids, tokens, topk);
        HostTensor wr = s.of(Data.positive(SEED + 140 + r, tokens * topk, DType.F32), DType.F32, tokens, topk);
        HostTensor w1 = s.of(Data.uniform(SEED + 150 + r, (int) Reference.count(experts, w, r) * ffn * hidden,
            DType.F32), DType.F32, Reference.count(experts, w, r), ffn, hidden);
        String refused = "";
        try (MoeDispatch d = comm.moeDispatchGemm(x, idr, wr, experts, w1, rows - 1)) {
          refused = "no error";
        } catch (IllegalArgumentException e) {
          refused = e.getMessage();
        }
        try (MoeDispatch d = comm.moeDispatchGemm(x, idr, wr, experts, w1, rows)) {
          return new String[] {refused, Long.toString(d.rows())};
        }
      }
    });
    String want = "rank 0 would receive " + rows + " routed rows, more than maxRecvRows = " + (rows - 1);
    for (int r = 0; r < w; r++) {
      String c = "maxRecvRows W=" + w + " rank " + r;
      assertTrue(seen.get(r)[0].contains(want), c + ": '" + want + "' in '" + seen.get(r)[0] + "'");
      assertEquals(seen.get(0)[0], seen.get(r)[0], c + ": the same message on every rank");
      assertEquals(r == 0 ? rows : 0, Long.parseLong(seen.get(r)[1]), c + ": rows after the refused op");
    }
  }

  static Stream<Arguments> moeWorlds() {
    return Stream.of(Arguments.of(1), Arguments.of(2), Arguments.of(3));
  }

  // ---- ring attention ----------------------------------------------------------------------

  static Stream<Arguments> attentionCases() {
    List<Arguments> out = new ArrayList<>();
    for (Arguments a : worldsAndTypes().toList()) {
      for (boolean causal : new boolean[] {false, true}) {
        for (SequenceLayout layout : SequenceLayout.values()) {
          out.add(Arguments.of(a.get()[0], a.get()[1], causal, layout));
        }
      }
    }
    return out.stream();
  }

  @ParameterizedTest(name = "W={0} {1} causal={2} {3}")
  @MethodSource("attentionCases")
  void ringAttention(int w, DType t, boolean causal, SequenceLayout layout) {
    final int b = 2;
    final int d = 8;
    // (Hq, Hkv): grouped-query and plain multi-head; S even over 2W, uneven, and short.
    int[][] heads = {{4, 2}, {3, 3}};
    int[] seqs = {4 * w, 4 * w + 1, 2 * w + 3, Math.max(1, 2 * w - 1)};
    for (int[] h : heads) {
      for (int seq : seqs) {
        float scale = seq % 2 == 0 ? 0f : 0.41f;
        runAttention(w, t, causal, layout, b, seq, h[0], h[1], d, scale);
      }
    }
  }

  private void runAttention(int w, DType t, boolean causal, SequenceLayout layout, int b, int seq, int hq, int hkv,
                            int d, float scale) {
    long test = 130 + seq * 31L + hq * 7L + (causal ? 1 : 0);
    // The whole sequence, dealt to the ranks by the layout.
    float[] q = Data.uniform(Data.seed(SEED + test, 0, 0), b * seq * hq * d, t);
    float[] k = Data.uniform(Data.seed(SEED + test, 0, 1), b * seq * hkv * d, t);
    float[] v = Data.uniform(Data.seed(SEED + test, 0, 2), b * seq * hkv * d, t);
    int[][] pos = new int[w][];
    for (int r = 0; r < w; r++) {
      pos[r] = Reference.seqPositions(seq, w, r, layout == SequenceLayout.ZIGZAG);
      assertEquals(pos[r].length, Split.count(seq, w, r, layout), "Split.count under " + layout);
    }
    Reference.Attention ref = Reference.attention(q, k, v, b, seq, hq, hkv, d, causal, scale);
    AttentionOptions options = AttentionOptions.sequence(seq).causal(causal).scale(scale).layout(layout);
    List<float[][]> outs = world.run(w, comm -> {
      int r = comm.rank();
      int sr = pos[r].length;
      try (TensorScope s = new TensorScope()) {
        HostTensor o = s.poisoned(t, b, sr, hq, d);
        HostTensor lse = s.poisoned(DType.F32, b, hq, sr);
        comm.ringAttention(s.of(Reference.seqRows(q, b, seq, hq * d, pos[r]), t, b, sr, hq, d),
            s.of(Reference.seqRows(k, b, seq, hkv * d, pos[r]), t, b, sr, hkv, d),
            s.of(Reference.seqRows(v, b, seq, hkv * d, pos[r]), t, b, sr, hkv, d), o, lse, options);
        return new float[][] {o.toFloatArray(), lse.toFloatArray()};
      }
    });
    // The single-rank op over the whole sequence: the same result within the same bounds.
    float[][] whole;
    try (TensorScope s = new TensorScope()) {
      HostTensor o = s.poisoned(t, b, seq, hq, d);
      HostTensor lse = s.poisoned(DType.F32, b, hq, seq);
      Communicator.attention(s.of(q, t, b, seq, hq, d), s.of(k, t, b, seq, hkv, d), s.of(v, t, b, seq, hkv, d), o,
          lse, causal, scale);
      whole = new float[][] {o.toFloatArray(), lse.toFloatArray()};
    }
    String all = ctx("attention", 1, t, "causal=" + causal, "S=" + seq, "Hq=" + hq, "Hkv=" + hkv, "scale=" + scale);
    Check.close(all + " O", ref.out, whole[0], t, 1e-5);
    Check.closeTo(all + " LSE", ref.lse, whole[1], 2e-6, 2e-6);
    for (int r = 0; r < w; r++) {
      String c = ctx("ringAttention", w, t, "causal=" + causal, layout, "S=" + seq, "Hq=" + hq, "Hkv=" + hkv,
          "scale=" + scale, "rank " + r);
      // exp() and the division add a few fp32 ulps relative to the output's magnitude.
      Check.close(c + " O", Reference.seqRows(ref.out, b, seq, hq * d, pos[r]), outs.get(r)[0], t, 1e-5);
      Check.closeTo(c + " LSE", Reference.lastDimRows(ref.lse, b * hq, seq, pos[r]), outs.get(r)[1], 2e-6, 2e-6);
    }
  }

  @ParameterizedTest(name = "W={0} {1} causal={2} {3}")
  @MethodSource("attentionCases")
  void ringAttentionBackward(int w, DType t, boolean causal, SequenceLayout layout) {
    // (Hq, Hkv): grouped-query and multi-query; S uneven over W and 2W, and short.
    int[][] heads = {{4, 2}, {3, 1}};
    int[] seqs = {4 * w + 1, 2 * w + 3, Math.max(1, 2 * w - 1)};
    for (int[] h : heads) {
      for (int seq : seqs) {
        runAttentionBackward(w, t, causal, layout, 2, seq, h[0], h[1], seq % 2 == 0 ? 8 : 5,
            seq % 2 == 0 ? 0f : 0.37f);
      }
    }
  }

  private void runAttentionBackward(int w, DType t, boolean causal, SequenceLayout layout, int b, int seq, int hq,
                                    int hkv, int d, float scale) {
    long test = 170 + seq * 31L + hq * 7L + (causal ? 1 : 0);
    float[] q = Data.uniform(Data.seed(SEED + test, 0, 0), b * seq * hq * d, t);
    float[] k = Data.uniform(Data.seed(SEED + test, 0, 1), b * seq * hkv * d, t);
    float[] v = Data.uniform(Data.seed(SEED + test, 0, 2), b * seq * hkv * d, t);
    float[] dO = Data.uniform(Data.seed(SEED + test, 0, 3), b * seq * hq * d, t);
    // The forward and backward over the whole sequence by the single-rank ops; every rank gets
    // the same o and lse rows, so the ring differs from them only in fp32 summation order.
    float[] o;
    float[] lse;
    float[][] whole;
    try (TensorScope s = new TensorScope()) {
      HostTensor qt = s.of(q, t, b, seq, hq, d);
      HostTensor kt = s.of(k, t, b, seq, hkv, d);
      HostTensor vt = s.of(v, t, b, seq, hkv, d);
      HostTensor ot = s.poisoned(t, b, seq, hq, d);
      HostTensor lt = s.poisoned(DType.F32, b, hq, seq);
      Communicator.attention(qt, kt, vt, ot, lt, causal, scale);
      o = ot.toFloatArray();
      lse = lt.toFloatArray();
      HostTensor dq = s.poisoned(t, b, seq, hq, d);
      HostTensor dk = s.poisoned(t, b, seq, hkv, d);
      HostTensor dv = s.poisoned(t, b, seq, hkv, d);
      Communicator.attentionBackward(qt, kt, vt, ot, lt, s.of(dO, t, b, seq, hq, d), dq, dk, dv, causal, scale);
      whole = new float[][] {dq.toFloatArray(), dk.toFloatArray(), dv.toFloatArray()};
      // The deterministic setting: the host backend is reproducible either way, the same bits.
      HostTensor[] again = {s.poisoned(t, b, seq, hq, d), s.poisoned(t, b, seq, hkv, d), s.poisoned(t, b, seq, hkv, d)};
      Communicator.attentionBackward(qt, kt, vt, ot, lt, s.of(dO, t, b, seq, hq, d), again[0], again[1], again[2],
          causal, scale, true);
      for (int g = 0; g < 3; g++) {
        assertArrayEquals(whole[g], again[g].toFloatArray(), "attentionBackward deterministic, gradient " + g);
      }
    }
    Reference.AttentionGrads ref = Reference.attentionBackward(q, k, v, o, lse, dO, b, seq, seq, hq, hkv, d, causal,
        scale);
    String all = ctx("attentionBackward", 1, t, "causal=" + causal, "S=" + seq, "Hq=" + hq, "Hkv=" + hkv, "D=" + d);
    Check.close(all + " dQ", ref.dq, whole[0], t);
    Check.close(all + " dK", ref.dk, whole[1], t);
    Check.close(all + " dV", ref.dv, whole[2], t);
    int[][] pos = new int[w][];
    for (int r = 0; r < w; r++) {
      pos[r] = Reference.seqPositions(seq, w, r, layout == SequenceLayout.ZIGZAG);
    }
    AttentionOptions options = AttentionOptions.sequence(seq).causal(causal).scale(scale).layout(layout);
    List<float[][]> outs = world.run(w, comm -> {
      int r = comm.rank();
      int sr = pos[r].length;
      try (TensorScope s = new TensorScope()) {
        HostTensor dq = s.poisoned(t, b, sr, hq, d);
        HostTensor dk = s.poisoned(t, b, sr, hkv, d);
        HostTensor dv = s.poisoned(t, b, sr, hkv, d);
        float[] lseRows = new float[b * hq * sr];
        for (int row = 0; row < b * hq; row++) {
          for (int i = 0; i < sr; i++) {
            lseRows[row * sr + i] = lse[row * seq + pos[r][i]];
          }
        }
        comm.ringAttentionBackward(s.of(Reference.seqRows(q, b, seq, hq * d, pos[r]), t, b, sr, hq, d),
            s.of(Reference.seqRows(k, b, seq, hkv * d, pos[r]), t, b, sr, hkv, d),
            s.of(Reference.seqRows(v, b, seq, hkv * d, pos[r]), t, b, sr, hkv, d),
            s.of(Reference.seqRows(o, b, seq, hq * d, pos[r]), t, b, sr, hq, d),
            s.of(lseRows, DType.F32, b, hq, sr),
            s.of(Reference.seqRows(dO, b, seq, hq * d, pos[r]), t, b, sr, hq, d), dq, dk, dv, options);
        return new float[][] {dq.toFloatArray(), dk.toFloatArray(), dv.toFloatArray()};
      }
    });
    for (int r = 0; r < w; r++) {
      String c = ctx("ringAttentionBackward", w, t, "causal=" + causal, layout, "S=" + seq, "Hq=" + hq,
          "Hkv=" + hkv, "D=" + d, "rank " + r);
      Check.close(c + " dQ", Reference.seqRows(ref.dq, b, seq, hq * d, pos[r]), outs.get(r)[0], t);
      Check.close(c + " dK", Reference.seqRows(ref.dk, b, seq, hkv * d, pos[r]), outs.get(r)[1], t);
      Check.close(c + " dV", Reference.seqRows(ref.dv, b, seq, hkv * d, pos[r]), outs.get(r)[2], t);
    }
  }

  /** Split.positions: the worked example of docs/ops.md and the cover of the sequence. */
  @Test
  void zigzagPositionsCoverTheSequence() {
    assertEquals(List.of(new Split.Run(0, 3), new Split.Run(8, 2)), Split.positions(10, 2, 0, SequenceLayout.ZIGZAG));
    assertEquals(List.of(new Split.Run(3, 3), new Split.Run(6, 2)), Split.positions(10, 2, 1, SequenceLayout.ZIGZAG));
    assertEquals(List.of(new Split.Run(5, 5)), Split.positions(10, 2, 1, SequenceLayout.CONTIGUOUS));
    for (int w = 1; w <= 5; w++) {
      for (long n : new long[] {0, 1, 2L * w - 1, 2L * w, 7L * w + 3}) {
        for (SequenceLayout layout : SequenceLayout.values()) {
          boolean[] seen = new boolean[(int) n];
          for (int r = 0; r < w; r++) {
            long count = 0;
            for (Split.Run run : Split.positions(n, w, r, layout)) {
              for (long p = run.offset(); p < run.offset() + run.count(); p++) {
                assertFalse(seen[(int) p], layout + " n=" + n + " w=" + w + ": position " + p + " held twice");
                seen[(int) p] = true;
              }
              count += run.count();
            }
            assertEquals(count, Split.count(n, w, r, layout));
            if (n > 0) {
              assertEquals(count, AttentionOptions.sequence(n).layout(layout).localLength(w, r));
            }
          }
          for (int p = 0; p < n; p++) {
            assertTrue(seen[p], layout + " n=" + n + " w=" + w + ": position " + p + " held by nobody");
          }
        }
      }
    }
  }

  // ---- single-rank attention ---------------------------------------------------------------

  static Stream<Arguments> typesAndMasks() {
    List<Arguments> out = new ArrayList<>();
    for (DType t : new DType[] {DType.F32, DType.BF16}) {
      for (boolean causal : new boolean[] {false, true}) {
        out.add(Arguments.of(t, causal));
      }
    }
    return out.stream();
  }

  @ParameterizedTest(name = "{0} causal={1}")
  @MethodSource("typesAndMasks")
  void localAttention(DType t, boolean causal) {
    // (B, Lq, Lk, Hq, Hkv, D): square GQA, more keys than queries (MQA), fewer keys, no key.
    int[][] shapes = {{2, 9, 9, 4, 2, 8}, {1, 5, 12, 3, 1, 16}, {3, 10, 4, 2, 2, 4}, {1, 3, 0, 2, 1, 8}};
    for (int[] sh : shapes) {
      int b = sh[0];
      int lq = sh[1];
      int lk = sh[2];
      int hq = sh[3];
      int hkv = sh[4];
      int d = sh[5];
      long test = 700 + lq * 13L + lk;
      float[] q = Data.uniform(Data.seed(SEED + test, 0, 0), b * lq * hq * d, t);
      float[] k = Data.uniform(Data.seed(SEED + test, 0, 1), b * lk * hkv * d, t);
      float[] v = Data.uniform(Data.seed(SEED + test, 0, 2), b * lk * hkv * d, t);
      float scale = lk % 2 == 0 ? 0f : 0.3f;
      Reference.Attention ref = Reference.attention(q, k, v, b, lq, lk, hq, hkv, d, causal, scale);
      String c = ctx("attention", 1, t, "causal=" + causal, "B=" + b, "Lq=" + lq, "Lk=" + lk, "Hq=" + hq,
          "Hkv=" + hkv, "D=" + d);
      try (TensorScope s = new TensorScope()) {
        HostTensor o = s.poisoned(t, b, lq, hq, d);
        HostTensor lse = s.poisoned(DType.F32, b, hq, lq);
        HostTensor qt = s.of(q, t, b, lq, hq, d);
        HostTensor kt = s.of(k, t, b, lk, hkv, d);
        HostTensor vt = s.of(v, t, b, lk, hkv, d);
        Communicator.attention(qt, kt, vt, o, lse, causal, scale);
        Check.close(c + " O", ref.out, o.toFloatArray(), t, 1e-5);
        Check.closeTo(c + " LSE", ref.lse, lse.toFloatArray(), 2e-6, 2e-6);
        // Without lse: the same output, bit for bit.
        HostTensor o2 = s.poisoned(t, b, lq, hq, d);
        Communicator.attention(qt, kt, vt, o2, null, causal, scale);
        Check.exact(c + " O without lse", o.toFloatArray(), o2.toFloatArray());
      }
    }
  }

  @ParameterizedTest(name = "{0} causal={1}")
  @MethodSource("typesAndMasks")
  void localAttentionBackward(DType t, boolean causal) {
    // (B, Lq, Lk, Hq, Hkv, D): square GQA, more keys than queries (MQA), fewer keys, no key.
    int[][] shapes = {{2, 9, 9, 4, 2, 8}, {1, 5, 12, 3, 1, 16}, {3, 10, 4, 2, 2, 4}, {1, 3, 0, 2, 1, 8}};
    for (int[] sh : shapes) {
      int b = sh[0];
      int lq = sh[1];
      int lk = sh[2];
      int hq = sh[3];
      int hkv = sh[4];
      int d = sh[5];
      long test = 900 + lq * 13L + lk;
      float[] q = Data.uniform(Data.seed(SEED + test, 0, 0), b * lq * hq * d, t);
      float[] k = Data.uniform(Data.seed(SEED + test, 0, 1), b * lk * hkv * d, t);
      float[] v = Data.uniform(Data.seed(SEED + test, 0, 2), b * lk * hkv * d, t);
      float[] dO = Data.uniform(Data.seed(SEED + test, 0, 3), b * lq * hq * d, t);
      float scale = lk % 2 == 0 ? 0f : 0.3f;
      String c = ctx("attentionBackward", 1, t, "causal=" + causal, "B=" + b, "Lq=" + lq, "Lk=" + lk, "Hq=" + hq,
          "Hkv=" + hkv, "D=" + d);
      try (TensorScope s = new TensorScope()) {
        HostTensor qt = s.of(q, t, b, lq, hq, d);
        HostTensor kt = s.of(k, t, b, lk, hkv, d);
        HostTensor vt = s.of(v, t, b, lk, hkv, d);
        HostTensor o = s.poisoned(t, b, lq, hq, d);
        HostTensor lse = s.poisoned(DType.F32, b, hq, lq);
        Communicator.attention(qt, kt, vt, o, lse, causal, scale);
        HostTensor dq = s.poisoned(t, b, lq, hq, d);
        HostTensor dk = s.poisoned(t, b, lk, hkv, d);
        HostTensor dv = s.poisoned(t, b, lk, hkv, d);
        Communicator.attentionBackward(qt, kt, vt, o, lse, s.of(dO, t, b, lq, hq, d), dq, dk, dv, causal, scale);
        Reference.AttentionGrads ref = Reference.attentionBackward(q, k, v, o.toFloatArray(), lse.toFloatArray(), dO,
            b, lq, lk, hq, hkv, d, causal, scale);
        Check.close(c + " dQ", ref.dq, dq.toFloatArray(), t);
        Check.close(c + " dK", ref.dk, dk.toFloatArray(), t);
        Check.close(c + " dV", ref.dv, dv.toFloatArray(), t);
      }
    }
  }

  // ---- bootstrap ---------------------------------------------------------------------------

  @ParameterizedTest(name = "W={0}")
  @org.junit.jupiter.params.provider.ValueSource(ints = {1, 2, 3, 4})
  void communicatorDescribesItsWorld(int w) {
    List<String> seen = world.run(w, comm -> {
      assertEquals(w, comm.world());
      assertEquals(Backend.HOST, comm.backend());
      assertEquals(w, comm.placements().size());
      assertFalse(comm.isClosed());
      return comm.rank() + ":" + comm.placements().get(comm.rank()).executorId();
    });
    for (int r = 0; r < w; r++) {
      assertEquals(r + ":exec-" + r, seen.get(r), "rank " + r + " runs on runtime " + r);
    }
  }
}
