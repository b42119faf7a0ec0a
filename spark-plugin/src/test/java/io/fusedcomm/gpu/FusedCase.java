package io.fusedcomm.gpu;

import io.fusedcomm.api.Communicator;
import io.fusedcomm.api.DType;
import io.fusedcomm.api.DeviceTensor;
import io.fusedcomm.api.PartialPrecision;
import io.fusedcomm.api.Split;
import io.fusedcomm.api.WeightLayout;
import io.fusedcomm.testing.Check;
import io.fusedcomm.testing.Data;
import io.fusedcomm.testing.Expected;
import io.fusedcomm.testing.Reference;
import jcuda.runtime.cudaStream_t;

/**
 * One rank's side of a GEMM-shaped op in the GPU cluster tests: its device tensors, allocated
 * once, so that the same case can run eagerly and inside a captured CUDA graph.
 * {@link #load} writes fresh inputs (every rank draws every rank's, for the reference) and
 * poisons the outputs with NaN; {@link #enqueue} runs the op; {@link #verify} checks the
 * outputs against the fp64 reference of the last {@link #load}.
 */
abstract class FusedCase implements AutoCloseable {
  final Communicator comm;
  final WeightLayout layout;
  final int w;
  final int r;

  FusedCase(Communicator comm, WeightLayout layout) {
    this.comm = comm;
    this.layout = layout;
    this.w = comm.world();
    this.r = comm.rank();
  }

  abstract String name();

  abstract void load(long seed);

  /** Enqueues the op; with a null stream it runs synchronously. */
  abstract void enqueue(cudaStream_t stream);

  abstract void verify();

  /** Frees the device tensors (no checked exception, unlike AutoCloseable's). */
  @Override
  public abstract void close();

  /** Load, run once (synchronised when on a stream) and check. */
  final void check(long seed, cudaStream_t stream) {
    load(seed);
    enqueue(stream);
    if (stream != null) {
      comm.synchronize();
    }
    verify();
  }

  /** allGatherGemm with the gathered A output: M split by the rule, N_r = 136 + 8r. */
  static final class AllGatherGemm extends FusedCase {
    private final int m;
    private final int k;
    private final int n;
    private final DeviceTensor a;
    private final DeviceTensor wt;
    private final DeviceTensor c;
    private final DeviceTensor g;
    private float[] full;
    private float[] wr;

    AllGatherGemm(Communicator comm, WeightLayout layout, int m, int k) {
      super(comm, layout);
      this.m = m;
      this.k = k;
      this.n = 136 + 8 * r;
      this.a = DeviceTensor.allocate(DType.BF16, Split.count(m, w, r), k);
      this.wt = DeviceTensor.allocate(DType.BF16, Reference.weightShape(layout, n, k));
      this.c = DeviceTensor.allocate(DType.BF16, m, n);
      this.g = DeviceTensor.allocate(DType.BF16, m, k);
    }

    @Override
    String name() {
      return "allGatherGemm " + layout + " M=" + m + " K=" + k;
    }

    @Override
    void load(long seed) {
      float[][] shards = new float[w][];
      for (int p = 0; p < w; p++) {
        shards[p] = Data.uniform(Data.seed(seed, p, 0), (int) (Split.count(m, w, p) * k), DType.BF16);
      }
      full = Data.concat(shards);
      wr = Data.uniform(Data.seed(seed, r, 1), n * k, DType.BF16);
      Gpu.put(a, shards[r]);
      Gpu.put(wt, wr);
      Gpu.poison(c);
      Gpu.poison(g);
    }

    @Override
    void enqueue(cudaStream_t stream) {
      comm.allGatherGemm(a, wt, c, g, layout, stream);
    }

    @Override
    void verify() {
      Check.exact("allGatherGemm gathered A", full, Gpu.download(g));
      Check.close("allGatherGemm C", Reference.gemm(full, wr, m, n, k, layout), Gpu.download(c), DType.BF16);
    }

    @Override
    public void close() {
      a.close();
      wt.close();
      c.close();
      g.close();
    }
  }

  /**
   * gemmReduceScatter, or with {@code all} gemmAllReduce: M = 128W + 40, N = 200, K_r = 64 + 8r,
   * the given partial precision (bf16 partials widen the tolerance by 2^-7).
   */
  static final class GemmReduce extends FusedCase {
    private static final int N = 200;
    private final boolean all;
    private final PartialPrecision partials;
    private final int m;
    private final int[] kr;
    private final long rows;
    private final DeviceTensor da;
    private final DeviceTensor dw;
    private final DeviceTensor dc;
    private float[][] a;
    private float[][] wts;

    GemmReduce(Communicator comm, boolean all, WeightLayout layout, PartialPrecision partials) {
      super(comm, layout);
      this.all = all;
      this.partials = partials;
      this.m = 128 * w + 40;
      this.kr = new int[w];
      for (int p = 0; p < w; p++) {
        kr[p] = 64 + 8 * p;
      }
      this.rows = all ? m : Split.count(m, w, r);
      this.da = DeviceTensor.allocate(DType.BF16, m, kr[r]);
      this.dw = DeviceTensor.allocate(DType.BF16, Reference.weightShape(layout, N, kr[r]));
      this.dc = DeviceTensor.allocate(DType.BF16, rows, N);
    }

    @Override
    String name() {
      return (all ? "gemmAllReduce " : "gemmReduceScatter ") + layout + " partials " + partials;
    }

    @Override
    void load(long seed) {
      a = new float[w][];
      wts = new float[w][];
      for (int p = 0; p < w; p++) {
        a[p] = Data.uniform(Data.seed(seed, p, 0), m * kr[p], DType.BF16);
        wts[p] = Data.uniform(Data.seed(seed, p, 1), N * kr[p], DType.BF16);
      }
      Gpu.put(da, a[r]);
      Gpu.put(dw, wts[r]);
      Gpu.poison(dc);
    }

    @Override
    void enqueue(cudaStream_t stream) {
      if (all) {
        comm.gemmAllReduce(da, dw, dc, layout, partials, stream);
      } else {
        comm.gemmReduceScatter(da, dw, dc, layout, partials, stream);
      }
    }

    @Override
    void verify() {
      boolean bf16 = partials == PartialPrecision.BF16;
      Expected sum = Reference.gemmSum(a, wts, m, N, kr, layout, bf16);
      Check.close(all ? "gemmAllReduce" : "gemmReduceScatter",
          all ? sum : sum.slice(Reference.offset(m, w, r) * N, rows * N), Gpu.download(dc), DType.BF16,
          bf16 ? 0x1p-7 : 0);
    }

    @Override
    public void close() {
      da.close();
      dw.close();
      dc.close();
    }
  }
}
