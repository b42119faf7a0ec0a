package io.fusedcomm.testing;

import io.fusedcomm.api.AttentionOptions;
import io.fusedcomm.api.Communicator;
import io.fusedcomm.api.DType;
import io.fusedcomm.api.HostTensor;
import io.fusedcomm.api.MoeDispatch;
import io.fusedcomm.api.SequenceLayout;
import io.fusedcomm.api.Split;
import io.fusedcomm.api.WeightLayout;
import java.io.Serializable;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.SplittableRandom;
import org.junit.jupiter.api.Assertions;

/**
 * Every op once or twice, with inputs that each rank derives from (seed, rank) alone, so that a
 * barrier task can run them and the driver can rebuild every rank's inputs and check every
 * element against the fp64 {@link Reference}. Shapes divide by the world size and do not.
 */
public final class OpSuite {
  private static final int HIDDEN = 6;
  private static final int FFN = 4;
  private static final int WIDTH = 5;
  private static final int TOPK = 2;
  private static final long EXPERTS = 5;

  private OpSuite() {}

  /** One rank's outputs, by name; serialisable so that a Spark task can return it. */
  public static final class Result implements Serializable {
    private static final long serialVersionUID = 1L;
    public final int rank;
    public final int world;
    public final LinkedHashMap<String, float[]> outputs = new LinkedHashMap<>();

    public Result(int rank, int world) {
      this.rank = rank;
      this.world = world;
    }
  }

  private static float[] input(long seed, int rank, int tensor, int n, DType t) {
    return Data.uniform(Data.seed(seed, rank, tensor), n, t);
  }

  private static int count(long n, int w, int r) {
    return (int) Split.count(n, w, r);
  }

  private static long[] counts(int w) {
    return new long[] {4L * w, 4L * w + 1};
  }

  private static int[] moeIds(long seed, int r, int tokens) {
    SplittableRandom rnd = new SplittableRandom(Data.seed(seed, r, 90));
    int[] ids = new int[tokens * TOPK];
    for (int i = 0; i < ids.length; i++) {
      ids[i] = rnd.nextInt((int) EXPERTS);
    }
    ids[0] = r % (int) EXPERTS;  // token 0 routes both slots to one expert
    ids[1] = r % (int) EXPERTS;
    return ids;
  }

  private static int moeTokens(int r) {
    return 2 + r;
  }

  /** Runs every op on {@code comm} in dtype {@code t}; outputs are poisoned before each op. */
  public static Result run(Communicator comm, DType t, long seed) {
    int w = comm.world();
    int r = comm.rank();
    Result res = new Result(r, w);
    try (TensorScope s = new TensorScope()) {
      int tensor = 0;
      for (long n : counts(w)) {
        HostTensor full = s.of(input(seed, r, tensor++, (int) n, t), t, n);
        HostTensor mine = s.of(input(seed, r, tensor++, count(n, w, r), t), t, count(n, w, r));
        HostTensor ag = s.poisoned(t, n);
        comm.allGather(mine, ag);
        res.outputs.put("allGather/" + n, ag.toFloatArray());
        HostTensor rs = s.poisoned(t, count(n, w, r));
        comm.reduceScatter(full, rs);
        res.outputs.put("reduceScatter/" + n, rs.toFloatArray());
        HostTensor ar = s.poisoned(t, n);
        comm.allReduce(full, ar);
        res.outputs.put("allReduce/" + n, ar.toFloatArray());
        HostTensor a2a = s.poisoned(t, (long) w * count(n, w, r));
        comm.allToAll(full, a2a);
        res.outputs.put("allToAll/" + n, a2a.toFloatArray());
      }
      for (int m : new int[] {2 * w, 2 * w + 1}) {
        WeightLayout layout = m % 2 == 0 ? WeightLayout.NK : WeightLayout.KN;
        int k = 8;
        int nr = 3 + r;
        HostTensor a = s.of(input(seed, r, 10 + m, count(m, w, r) * k, t), t, count(m, w, r), k);
        HostTensor wt = s.of(input(seed, r, 20 + m, nr * k, t), t, Reference.weightShape(layout, nr, k));
        HostTensor c = s.poisoned(t, m, nr);
        HostTensor gathered = s.poisoned(t, m, k);
        comm.allGatherGemm(a, wt, c, gathered, layout);
        res.outputs.put("allGatherGemm/" + m, c.toFloatArray());
        res.outputs.put("allGatherGemm.gatheredA/" + m, gathered.toFloatArray());

        int kr = 4 + r;
        int n = 5;
        HostTensor a2 = s.of(input(seed, r, 30 + m, m * kr, t), t, m, kr);
        HostTensor w2 = s.of(input(seed, r, 40 + m, n * kr, t), t, Reference.weightShape(layout, n, kr));
        HostTensor crs = s.poisoned(t, count(m, w, r), n);
        comm.gemmReduceScatter(a2, w2, crs, layout);
        res.outputs.put("gemmReduceScatter/" + m, crs.toFloatArray());
        HostTensor car = s.poisoned(t, m, n);
        comm.gemmAllReduce(a2, w2, car, layout);
        res.outputs.put("gemmAllReduce/" + m, car.toFloatArray());
      }
      int tokens = moeTokens(r);
      HostTensor x = s.of(input(seed, r, 50, tokens * HIDDEN, t), t, tokens, HIDDEN);
      HostTensor ids = s.ints(moeIds(seed, r, tokens), tokens, TOPK);
      HostTensor weights = s.of(Data.positive(Data.seed(seed, r, 51), tokens * TOPK, DType.F32), DType.F32, tokens, TOPK);
      HostTensor w1 = s.of(input(seed, r, 52, count(EXPERTS, w, r) * FFN * HIDDEN, t), t, count(EXPERTS, w, r), FFN, HIDDEN);
      try (MoeDispatch d = comm.moeDispatchGemm(x, ids, weights, EXPERTS, w1)) {
        int rows = Math.toIntExact(d.rows());
        float[] meta = new float[rows * 3];
        for (int i = 0; i < rows; i++) {
          meta[3 * i] = d.sourceRank(i);
          meta[3 * i + 1] = d.sourceToken(i);
          meta[3 * i + 2] = d.slot(i);
        }
        res.outputs.put("moe.meta", meta);
        res.outputs.put("moe.expertOutput", ((HostTensor) d.expertOutput()).toFloatArray());
        HostTensor y = s.of(input(seed, r, 53, rows * WIDTH, t), t, rows, WIDTH);
        HostTensor out = s.poisoned(t, tokens, WIDTH);
        comm.moeCombine(d, y, out);
        res.outputs.put("moe.combine", out.toFloatArray());
      }
      int seq = 2 * w + 1;
      int sr = count(seq, w, r);
      for (boolean causal : new boolean[] {false, true}) {
        HostTensor q = s.of(input(seed, r, 60, sr * 4 * 4, t), t, 1, sr, 4, 4);
        HostTensor kk = s.of(input(seed, r, 61, sr * 2 * 4, t), t, 1, sr, 2, 4);
        HostTensor v = s.of(input(seed, r, 62, sr * 2 * 4, t), t, 1, sr, 2, 4);
        HostTensor o = s.poisoned(t, 1, sr, 4, 4);
        HostTensor lse = s.poisoned(DType.F32, 1, 4, sr);
        comm.ringAttention(q, kk, v, o, lse, AttentionOptions.sequence(seq).causal(causal));
        res.outputs.put("ringAttention.o/" + causal, o.toFloatArray());
        res.outputs.put("ringAttention.lse/" + causal, lse.toFloatArray());
      }
      // Causal, zigzag: rank r holds chunks r and 2W-1-r of 2W; S not a multiple of 2W.
      int zseq = 4 * w + 3;
      int zr = (int) Split.count(zseq, w, r, SequenceLayout.ZIGZAG);
      HostTensor zq = s.of(input(seed, r, 63, zr * 4 * 4, t), t, 1, zr, 4, 4);
      HostTensor zk = s.of(input(seed, r, 64, zr * 2 * 4, t), t, 1, zr, 2, 4);
      HostTensor zv = s.of(input(seed, r, 65, zr * 2 * 4, t), t, 1, zr, 2, 4);
      HostTensor zo = s.poisoned(t, 1, zr, 4, 4);
      HostTensor zlse = s.poisoned(DType.F32, 1, 4, zr);
      comm.ringAttention(zq, zk, zv, zo, zlse,
          AttentionOptions.sequence(zseq).causal(true).layout(SequenceLayout.ZIGZAG));
      res.outputs.put("ringAttention.zigzag.o", zo.toFloatArray());
      res.outputs.put("ringAttention.zigzag.lse", zlse.toFloatArray());
    }
    return res;
  }

  /** Checks every rank's outputs of {@link #run} against the fp64 reference. */
  public static void verify(DType t, long seed, List<Result> byRank) {
    int w = byRank.size();
    Result[] res = new Result[w];
    for (Result r : byRank) {
      Assertions.assertEquals(w, r.world, "world of rank " + r.rank);
      res[r.rank] = r;
    }
    String tag = " (W=" + w + ", " + t.label() + ", seed " + seed + ")";
    int tensor = 0;
    for (long n : counts(w)) {
      float[][] full = new float[w][];
      float[][] mine = new float[w][];
      for (int r = 0; r < w; r++) {
        full[r] = input(seed, r, tensor, (int) n, t);
        mine[r] = input(seed, r, tensor + 1, count(n, w, r), t);
      }
      tensor += 2;
      Expected sum = Reference.sum(full);
      for (int r = 0; r < w; r++) {
        Map<String, float[]> out = res[r].outputs;
        String at = " rank " + r + " n=" + n + tag;
        Check.exact("allGather" + at, Data.concat(mine), out.get("allGather/" + n));
        Check.close("reduceScatter" + at, sum.slice(Reference.offset(n, w, r), Reference.count(n, w, r)),
            out.get("reduceScatter/" + n), t);
        Check.close("allReduce" + at, sum, out.get("allReduce/" + n), t);
        float[][] blocks = new float[w][];
        for (int src = 0; src < w; src++) {
          blocks[src] = Data.slice(full[src], Reference.offset(n, w, r), Reference.count(n, w, r));
        }
        Check.exact("allToAll" + at, Data.concat(blocks), out.get("allToAll/" + n));
      }
    }
    for (int m : new int[] {2 * w, 2 * w + 1}) {
      WeightLayout layout = m % 2 == 0 ? WeightLayout.NK : WeightLayout.KN;
      int k = 8;
      float[][] a = new float[w][];
      float[][] a2 = new float[w][];
      float[][] w2 = new float[w][];
      int[] kr = new int[w];
      for (int r = 0; r < w; r++) {
        a[r] = input(seed, r, 10 + m, count(m, w, r) * k, t);
        kr[r] = 4 + r;
        a2[r] = input(seed, r, 30 + m, m * kr[r], t);
        w2[r] = input(seed, r, 40 + m, 5 * kr[r], t);
      }
      float[] fullA = Data.concat(a);
      Expected sum = Reference.gemmSum(a2, w2, m, 5, kr, layout);
      for (int r = 0; r < w; r++) {
        Map<String, float[]> out = res[r].outputs;
        String at = " rank " + r + " M=" + m + " " + layout + tag;
        float[] wt = input(seed, r, 20 + m, (3 + r) * k, t);
        Check.close("allGatherGemm" + at, Reference.gemm(fullA, wt, m, 3 + r, k, layout), out.get("allGatherGemm/" + m), t);
        Check.exact("allGatherGemm gatheredA" + at, fullA, out.get("allGatherGemm.gatheredA/" + m));
        Check.close("gemmReduceScatter" + at, sum.slice(Reference.offset(m, w, r) * 5, Reference.count(m, w, r) * 5),
            out.get("gemmReduceScatter/" + m), t);
        Check.close("gemmAllReduce" + at, sum, out.get("gemmAllReduce/" + m), t);
      }
    }
    // MoE
    int[][] ids = new int[w][];
    float[][] weights = new float[w][];
    float[][] x = new float[w][];
    for (int r = 0; r < w; r++) {
      int tokens = moeTokens(r);
      ids[r] = moeIds(seed, r, tokens);
      weights[r] = Data.positive(Data.seed(seed, r, 51), tokens * TOPK, DType.F32);
      x[r] = input(seed, r, 50, tokens * HIDDEN, t);
    }
    List<List<Reference.MoeRow>> routes = Reference.moeRoute(w, EXPERTS, TOPK, ids, weights);
    float[][] y = new float[w][];
    for (int r = 0; r < w; r++) {
      List<Reference.MoeRow> rows = routes.get(r);
      String at = " rank " + r + tag;
      float[] meta = res[r].outputs.get("moe.meta");
      Assertions.assertEquals(rows.size() * 3, meta.length, "moe rows" + at);
      for (int i = 0; i < rows.size(); i++) {
        Reference.MoeRow row = rows.get(i);
        Assertions.assertArrayEquals(new float[] {row.srcRank, row.token, row.slot},
            new float[] {meta[3 * i], meta[3 * i + 1], meta[3 * i + 2]}, "moe row " + i + at);
      }
      float[] w1 = input(seed, r, 52, count(EXPERTS, w, r) * FFN * HIDDEN, t);
      Check.close("moe expert output" + at,
          Reference.moeExpertOutput(rows, x, w1, Reference.offset(EXPERTS, w, r), HIDDEN, FFN),
          res[r].outputs.get("moe.expertOutput"), t);
      y[r] = input(seed, r, 53, rows.size() * WIDTH, t);
    }
    for (int r = 0; r < w; r++) {
      Check.close("moe combine rank " + r + tag, Reference.moeCombine(r, moeTokens(r), TOPK, routes, y, WIDTH),
          res[r].outputs.get("moe.combine"), t);
    }
    // Ring attention
    int seq = 2 * w + 1;
    int[] sr = new int[w];
    float[][] q = new float[w][];
    float[][] kk = new float[w][];
    float[][] v = new float[w][];
    for (int r = 0; r < w; r++) {
      sr[r] = count(seq, w, r);
      q[r] = input(seed, r, 60, sr[r] * 16, t);
      kk[r] = input(seed, r, 61, sr[r] * 8, t);
      v[r] = input(seed, r, 62, sr[r] * 8, t);
    }
    for (boolean causal : new boolean[] {false, true}) {
      Reference.Attention ref = Reference.attention(Reference.concatSeq(q, 1, sr, 16), Reference.concatSeq(kk, 1, sr, 8),
          Reference.concatSeq(v, 1, sr, 8), 1, seq, 4, 2, 4, causal, 0);
      for (int r = 0; r < w; r++) {
        String at = " rank " + r + " causal=" + causal + tag;
        int from = (int) Reference.offset(seq, w, r);
        Check.close("ringAttention O" + at, Reference.seqBlock(ref.out, 1, seq, 16, from, sr[r]),
            res[r].outputs.get("ringAttention.o/" + causal), t, 1e-5);
        Check.closeTo("ringAttention LSE" + at, Reference.lastDimBlock(ref.lse, 4, seq, from, sr[r]),
            res[r].outputs.get("ringAttention.lse/" + causal), 2e-6, 2e-6);
      }
    }
    // Ring attention, zigzag: the whole sequence put together from the ranks' rows.
    int zseq = 4 * w + 3;
    float[] zq = new float[zseq * 16];
    float[] zk = new float[zseq * 8];
    float[] zv = new float[zseq * 8];
    int[][] zpos = new int[w][];
    for (int r = 0; r < w; r++) {
      zpos[r] = Reference.seqPositions(zseq, w, r, true);
      int n = zpos[r].length;
      float[] rq = input(seed, r, 63, n * 16, t);
      float[] rk = input(seed, r, 64, n * 8, t);
      float[] rv = input(seed, r, 65, n * 8, t);
      for (int i = 0; i < n; i++) {
        System.arraycopy(rq, i * 16, zq, zpos[r][i] * 16, 16);
        System.arraycopy(rk, i * 8, zk, zpos[r][i] * 8, 8);
        System.arraycopy(rv, i * 8, zv, zpos[r][i] * 8, 8);
      }
    }
    Reference.Attention zref = Reference.attention(zq, zk, zv, 1, zseq, 4, 2, 4, true, 0);
    for (int r = 0; r < w; r++) {
      String at = " rank " + r + " zigzag causal" + tag;
      Check.close("ringAttention O" + at, Reference.seqRows(zref.out, 1, zseq, 16, zpos[r]),
          res[r].outputs.get("ringAttention.zigzag.o"), t, 1e-5);
      Check.closeTo("ringAttention LSE" + at, Reference.lastDimRows(zref.lse, 4, zseq, zpos[r]),
          res[r].outputs.get("ringAttention.zigzag.lse"), 2e-6, 2e-6);
    }
  }
}
