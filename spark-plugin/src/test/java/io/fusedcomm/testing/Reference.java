package io.fusedcomm.testing;

import io.fusedcomm.api.Bf16;
import io.fusedcomm.api.Split;
import io.fusedcomm.api.WeightLayout;
import java.util.ArrayList;
import java.util.List;

/**
 * Independent fp64 references for the ops of docs/ops.md, written as naive loops straight from
 * the contract (docs/ops.md, the Communicator javadoc), sharing no code with the backends. Inputs
 * are float arrays (already rounded to the op's dtype); results carry magnitudes for {@link
 * Check}.
 */
public final class Reference {
  private Reference() {}

  // ---- collectives ---------------------------------------------------------------------------

  /** The element-wise sum over ranks of {@code inputs[rank]}. */
  public static Expected sum(float[][] inputs) {
    int n = inputs[0].length;
    double[] v = new double[n];
    double[] m = new double[n];
    for (float[] in : inputs) {
      if (in.length != n) {
        throw new IllegalArgumentException("ranks disagree on the element count");
      }
      for (int i = 0; i < n; i++) {
        v[i] += in[i];
        m[i] += Math.abs(in[i]);
      }
    }
    return new Expected(v, m, inputs.length);
  }

  /** Rank {@code r}'s block of {@code n} elements split over {@code w} ranks, as [offset, count]. */
  public static long[] block(long n, int w, int r) {
    return new long[] {Split.offset(n, w, r), Split.count(n, w, r)};
  }

  /** The uneven split rule written out independently: first n % w ranks hold one more. */
  public static long count(long n, int w, int r) {
    long base = n / w;
    return r < n % w ? base + 1 : base;
  }

  /** Start of rank {@code r}'s block, by summing the counts of the ranks before it. */
  public static long offset(long n, int w, int r) {
    long at = 0;
    for (int p = 0; p < r; p++) {
      at += count(n, w, p);
    }
    return at;
  }

  // ---- GEMM ----------------------------------------------------------------------------------

  /** The shape of an n×k linear layer's weight as {@code layout} stores it: n×k (NK) or k×n (KN). */
  public static long[] weightShape(WeightLayout layout, long n, long k) {
    return layout == WeightLayout.NK ? new long[] {n, k} : new long[] {k, n};
  }

  /** Element (i, j) of op(w) as the K×N right operand: w[j][kk] for NK, w[kk][j] for KN. */
  private static double weightAt(float[] w, WeightLayout layout, int n, int k, int kk, int j) {
    return layout == WeightLayout.NK ? w[j * k + kk] : w[kk * n + j];
  }

  /** {@code a (m×k) · op(w)}, m×n. */
  public static Expected gemm(float[] a, float[] w, int m, int n, int k, WeightLayout layout) {
    return gemmSum(new float[][] {a}, new float[][] {w}, m, n, new int[] {k}, layout);
  }

  /** {@code Σ_s a_s (m×k_s) · op(w_s)}, m×n; terms = Σ k_s. */
  public static Expected gemmSum(float[][] a, float[][] w, int m, int n, int[] k, WeightLayout layout) {
    return gemmSum(a, w, m, n, k, layout, false);
  }

  /**
   * As {@link #gemmSum(float[][], float[][], int, int, int[], WeightLayout)}; bf16Partials: each
   * source's partial rounded to bf16 before the sum ({@code PartialPrecision.BF16}). The
   * implementation rounds its fp32 partial, this reference the exact one: compare with an extra
   * relative tolerance of 2^-7 (one bf16 ulp) on the magnitude.
   */
  public static Expected gemmSum(float[][] a, float[][] w, int m, int n, int[] k, WeightLayout layout,
                                 boolean bf16Partials) {
    double[] v = new double[m * n];
    double[] mag = new double[m * n];
    int terms = 0;
    for (int s = 0; s < a.length; s++) {
      terms += k[s];
      for (int i = 0; i < m; i++) {
        for (int j = 0; j < n; j++) {
          double acc = 0;
          double abs = 0;
          for (int kk = 0; kk < k[s]; kk++) {
            double p = a[s][i * k[s] + kk] * weightAt(w[s], layout, n, k[s], kk, j);
            acc += p;
            abs += Math.abs(p);
          }
          v[i * n + j] += bf16Partials ? Bf16.round((float) acc) : acc;
          mag[i * n + j] += abs;
        }
      }
    }
    return new Expected(v, mag, terms);
  }

  // ---- MoE -----------------------------------------------------------------------------------

  /** One routed row as the expert's rank sees it. */
  public static final class MoeRow {
    public final int srcRank;
    public final int token;
    public final int slot;
    public final int expert;
    public final float weight;

    MoeRow(int srcRank, int token, int slot, int expert, float weight) {
      this.srcRank = srcRank;
      this.token = token;
      this.slot = slot;
      this.expert = expert;
      this.weight = weight;
    }

    @Override
    public String toString() {
      return "row(src " + srcRank + ", token " + token + ", slot " + slot + ", expert " + expert + ")";
    }
  }

  /** Rank owning expert {@code e}: experts are split over ranks by the uneven split rule. */
  public static int expertOwner(long numExperts, int world, long e) {
    for (int p = 0; p < world; p++) {
      if (e >= offset(numExperts, world, p) && e < offset(numExperts, world, p) + count(numExperts, world, p)) {
        return p;
      }
    }
    throw new IllegalArgumentException("expert " + e + " outside [0, " + numExperts + ")");
  }

  /**
   * The rows each rank receives: expert-major over its experts; within an expert by source rank,
   * then source token, then slot. {@code ids[s]}, {@code weights[s]}: rank s's T_s × topk routing.
   */
  public static List<List<MoeRow>> moeRoute(int world, long numExperts, int topk, int[][] ids, float[][] weights) {
    List<List<MoeRow>> out = new ArrayList<>();
    for (int r = 0; r < world; r++) {
      List<MoeRow> rows = new ArrayList<>();
      long first = offset(numExperts, world, r);
      for (long e = first; e < first + count(numExperts, world, r); e++) {
        for (int s = 0; s < world; s++) {
          int tokens = ids[s].length / topk;
          for (int t = 0; t < tokens; t++) {
            for (int k = 0; k < topk; k++) {
              if (ids[s][t * topk + k] == e) {
                rows.add(new MoeRow(s, t, k, (int) e, weights[s][t * topk + k]));
              }
            }
          }
        }
      }
      out.add(rows);
    }
    return out;
  }

  /**
   * The dispatch GEMM on one rank: row i = x_{src}[token] · W1_{expert}ᵀ, {@code w1Local}: E_r ×
   * ffn × hidden, {@code firstExpert} its first global id.
   */
  public static Expected moeExpertOutput(List<MoeRow> rows, float[][] x, float[] w1Local, long firstExpert,
      int hidden, int ffn) {
    double[] v = new double[rows.size() * ffn];
    double[] m = new double[v.length];
    for (int i = 0; i < rows.size(); i++) {
      MoeRow row = rows.get(i);
      int e = (int) (row.expert - firstExpert);
      for (int f = 0; f < ffn; f++) {
        double acc = 0;
        double abs = 0;
        for (int h = 0; h < hidden; h++) {
          double p = x[row.srcRank][row.token * hidden + h] * (double) w1Local[(e * ffn + f) * hidden + h];
          acc += p;
          abs += Math.abs(p);
        }
        v[i * ffn + f] = acc;
        m[i * ffn + f] = abs;
      }
    }
    return new Expected(v, m, hidden);
  }

  /**
   * The combine at home rank {@code home}: out[t] = Σ_k weight(t, k) · expertOut_{owner}[row of
   * (home, t, k)], with {@code expertOut[p]} rank p's rows × width in {@code routes.get(p)} order.
   */
  public static Expected moeCombine(int home, int tokens, int topk, List<List<MoeRow>> routes, float[][] expertOut,
      int width) {
    double[] v = new double[tokens * width];
    double[] m = new double[v.length];
    int found = 0;
    for (int p = 0; p < routes.size(); p++) {
      List<MoeRow> rows = routes.get(p);
      for (int i = 0; i < rows.size(); i++) {
        MoeRow row = rows.get(i);
        if (row.srcRank != home) {
          continue;
        }
        found++;
        for (int c = 0; c < width; c++) {
          double term = (double) row.weight * expertOut[p][i * width + c];
          v[row.token * width + c] += term;
          m[row.token * width + c] += Math.abs(term);
        }
      }
    }
    if (found != tokens * topk) {
      throw new IllegalStateException("rank " + home + ": " + found + " routed rows for " + tokens * topk + " pairs");
    }
    return new Expected(v, m, topk);
  }

  // ---- attention -----------------------------------------------------------------------------

  /** Output and log-sum-exp of attention over the whole sequence. */
  public static final class Attention {
    /** (B, S, Hq, D). */
    public final Expected out;
    /** (B, Hq, S), natural log. */
    public final double[] lse;

    Attention(Expected out, double[] lse) {
      this.out = out;
      this.lse = lse;
    }
  }

  /**
   * Softmax attention over global {@code q: (B, S, Hq, D)}, {@code k, v: (B, S, Hkv, D)}; query
   * head h reads kv head {@code h / (Hq / Hkv)}; causal: query i sees keys j ≤ i. {@code scale}
   * 0 means 1/√D.
   */
  public static Attention attention(float[] q, float[] k, float[] v, int b, int s, int hq, int hkv, int d,
      boolean causal, double scale) {
    return attention(q, k, v, b, s, s, hq, hkv, d, causal, scale);
  }

  /**
   * Softmax attention of {@code q: (B, Lq, Hq, D)} over {@code k, v: (B, Lk, Hkv, D)}; causal:
   * query i sees keys j ≤ i (top-left aligned). A query that sees no key gets 0 and lse -inf.
   */
  public static Attention attention(float[] q, float[] k, float[] v, int b, int lq, int lk, int hq, int hkv, int d,
      boolean causal, double scale) {
    double sc = scale == 0 ? 1 / Math.sqrt(d) : scale;
    int group = hq / hkv;
    double[] o = new double[b * lq * hq * d];
    double[] mag = new double[o.length];
    double[] lse = new double[b * hq * lq];
    double[] scores = new double[lk];
    for (int bi = 0; bi < b; bi++) {
      for (int h = 0; h < hq; h++) {
        int kh = h / group;
        for (int i = 0; i < lq; i++) {
          int visible = causal ? Math.min(i + 1, lk) : lk;
          double max = Double.NEGATIVE_INFINITY;
          for (int j = 0; j < visible; j++) {
            double dot = 0;
            for (int x = 0; x < d; x++) {
              dot += (double) q[((bi * lq + i) * hq + h) * d + x] * k[((bi * lk + j) * hkv + kh) * d + x];
            }
            scores[j] = dot * sc;
            max = Math.max(max, scores[j]);
          }
          double denom = 0;
          for (int j = 0; j < visible; j++) {
            denom += Math.exp(scores[j] - max);
          }
          lse[(bi * hq + h) * lq + i] = visible == 0 ? Double.NEGATIVE_INFINITY : max + Math.log(denom);
          for (int x = 0; x < d; x++) {
            double acc = 0;
            double abs = 0;
            for (int j = 0; j < visible; j++) {
              double p = Math.exp(scores[j] - max) / denom;
              double val = v[((bi * lk + j) * hkv + kh) * d + x];
              acc += p * val;
              abs += p * Math.abs(val);
            }
            o[((bi * lq + i) * hq + h) * d + x] = acc;
            mag[((bi * lq + i) * hq + h) * d + x] = abs;
          }
        }
      }
    }
    return new Attention(new Expected(o, mag, lk + d), lse);
  }

  /** Gradients of attention: {@code dq} as q, {@code dk} and {@code dv} as k and v. */
  public static final class AttentionGrads {
    public final Expected dq;
    public final Expected dk;
    public final Expected dv;

    AttentionGrads(Expected dq, Expected dk, Expected dv) {
      this.dq = dq;
      this.dk = dk;
      this.dv = dv;
    }
  }

  /**
   * The backward of {@link #attention(float[], float[], float[], int, int, int, int, int, int,
   * boolean, double)} in fp64, from the caller's forward outputs {@code o} and {@code lse} as
   * docs/ops.md "ringAttentionBackward" writes it: {@code P = exp(scale q·k - lse)}, {@code δ =
   * dO·o}, {@code dV = Σ P dO}, {@code dS = P (dO·v - δ)}, {@code dQ = scale Σ dS k}, {@code dK =
   * scale Σ dS q}; grouped-query heads summed. Each element's magnitude bounds the fp32 error of
   * its terms: the score (through P), both dots and the sum.
   */
  public static AttentionGrads attentionBackward(float[] q, float[] k, float[] v, float[] o, float[] lse, float[] dO,
      int b, int lq, int lk, int hq, int hkv, int d, boolean causal, double scale) {
    double sc = scale == 0 ? 1 / Math.sqrt(d) : scale;
    int group = hq / hkv;
    double[] dq = new double[b * lq * hq * d];
    double[] dqMag = new double[dq.length];
    double[] dk = new double[b * lk * hkv * d];
    double[] dkMag = new double[dk.length];
    double[] dv = new double[dk.length];
    double[] dvMag = new double[dk.length];
    for (int bi = 0; bi < b; bi++) {
      for (int h = 0; h < hq; h++) {
        int kh = h / group;
        for (int i = 0; i < lq; i++) {
          int qr = ((bi * lq + i) * hq + h) * d;
          double l = lse[(bi * hq + h) * lq + i];
          double delta = 0;
          double deltaMag = 0;
          for (int x = 0; x < d; x++) {
            delta += (double) dO[qr + x] * o[qr + x];
            deltaMag += Math.abs((double) dO[qr + x] * o[qr + x]);
          }
          int visible = causal ? Math.min(i + 1, lk) : lk;
          for (int j = 0; j < visible; j++) {
            int kr = ((bi * lk + j) * hkv + kh) * d;
            double dot = 0;
            double dotMag = 0;
            double dp = 0;
            double dpMag = 0;
            for (int x = 0; x < d; x++) {
              dot += (double) q[qr + x] * k[kr + x];
              dotMag += Math.abs((double) q[qr + x] * k[kr + x]);
              dp += (double) dO[qr + x] * v[kr + x];
              dpMag += Math.abs((double) dO[qr + x] * v[kr + x]);
            }
            double p = Math.exp(dot * sc - l);
            double ds = p * (dp - delta);
            // What the fp32 error of dS scales with: the score's (through P) and both dots'.
            double dsMag = p * (dpMag + deltaMag + Math.abs(dp - delta) * (1 + Math.abs(sc) * dotMag + Math.abs(l)));
            double pMag = p * (1 + Math.abs(sc) * dotMag + Math.abs(l));
            for (int x = 0; x < d; x++) {
              dq[qr + x] += sc * ds * k[kr + x];
              dqMag[qr + x] += Math.abs(sc * k[kr + x]) * dsMag;
              dk[kr + x] += sc * ds * q[qr + x];
              dkMag[kr + x] += Math.abs(sc * q[qr + x]) * dsMag;
              dv[kr + x] += p * dO[qr + x];
              dvMag[kr + x] += pMag * Math.abs(dO[qr + x]);
            }
          }
        }
      }
    }
    int terms = Math.max(lq * group, lk) + d + 8;
    return new AttentionGrads(new Expected(dq, dqMag, terms), new Expected(dk, dkMag, terms),
        new Expected(dv, dvMag, terms));
  }

  /**
   * The global positions rank {@code r} of {@code w} holds under a sequence layout, in its
   * tensors' order, written from docs/ops.md's rule (not from {@code Split.positions}): contiguous
   * its block; zigzag chunks {@code r} and {@code 2w-1-r} of {@code 2w}.
   */
  public static int[] seqPositions(int s, int w, int r, boolean zigzag) {
    int[] first = zigzag ? new int[] {r, 2 * w - 1 - r} : new int[] {r};
    int parts = zigzag ? 2 * w : w;
    int n = 0;
    for (int c : first) {
      n += s / parts + (c < s % parts ? 1 : 0);
    }
    int[] out = new int[n];
    int at = 0;
    for (int c : first) {
      int from = c * (s / parts) + Math.min(c, s % parts);
      for (int i = 0; i < s / parts + (c < s % parts ? 1 : 0); i++) {
        out[at++] = from + i;
      }
    }
    return out;
  }

  /** Rows {@code positions} (in that order) of a (B, S, inner) tensor. */
  public static float[] seqRows(float[] full, int b, int s, int inner, int[] positions) {
    float[] out = new float[b * positions.length * inner];
    for (int bi = 0; bi < b; bi++) {
      for (int i = 0; i < positions.length; i++) {
        System.arraycopy(full, (bi * s + positions[i]) * inner, out, (bi * positions.length + i) * inner, inner);
      }
    }
    return out;
  }

  /** Rows {@code positions} (in that order) of a (B, S, inner) expectation. */
  public static Expected seqRows(Expected full, int b, int s, int inner, int[] positions) {
    double[] v = new double[b * positions.length * inner];
    double[] m = new double[v.length];
    for (int bi = 0; bi < b; bi++) {
      for (int i = 0; i < positions.length; i++) {
        System.arraycopy(full.value, (bi * s + positions[i]) * inner, v, (bi * positions.length + i) * inner, inner);
        System.arraycopy(full.magnitude, (bi * s + positions[i]) * inner, m, (bi * positions.length + i) * inner,
            inner);
      }
    }
    return new Expected(v, m, full.terms);
  }

  /** Columns {@code positions} (in that order) of the last dimension of a (rows, s) array. */
  public static double[] lastDimRows(double[] full, int rows, int s, int[] positions) {
    double[] out = new double[rows * positions.length];
    for (int r = 0; r < rows; r++) {
      for (int i = 0; i < positions.length; i++) {
        out[r * positions.length + i] = full[r * s + positions[i]];
      }
    }
    return out;
  }

  /**
   * Concatenates per-rank blocks of shape (B, S_r, inner) along dimension 1 into (B, Σ S_r,
   * inner).
   */
  public static float[] concatSeq(float[][] blocks, int b, int[] rows, int inner) {
    int total = 0;
    for (int r : rows) {
      total += r;
    }
    float[] out = new float[b * total * inner];
    for (int bi = 0; bi < b; bi++) {
      int at = 0;
      for (int p = 0; p < blocks.length; p++) {
        System.arraycopy(blocks[p], bi * rows[p] * inner, out, (bi * total + at) * inner, rows[p] * inner);
        at += rows[p];
      }
    }
    return out;
  }

  /** Rank block (B, [from, from + n), inner) of a (B, S, inner) tensor, as an Expected. */
  public static Expected seqBlock(Expected full, int b, int s, int inner, int from, int n) {
    double[] v = new double[b * n * inner];
    double[] m = new double[v.length];
    for (int bi = 0; bi < b; bi++) {
      System.arraycopy(full.value, (bi * s + from) * inner, v, bi * n * inner, n * inner);
      System.arraycopy(full.magnitude, (bi * s + from) * inner, m, bi * n * inner, n * inner);
    }
    return new Expected(v, m, full.terms);
  }

  /** Columns [from, from + n) of the last dimension of a (rows, s) array: the LSE rank block. */
  public static double[] lastDimBlock(double[] full, int rows, int s, int from, int n) {
    double[] out = new double[rows * n];
    for (int r = 0; r < rows; r++) {
      System.arraycopy(full, r * s + from, out, r * n, n);
    }
    return out;
  }
}
