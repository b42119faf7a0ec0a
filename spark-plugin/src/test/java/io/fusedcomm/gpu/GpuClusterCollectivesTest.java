package io.fusedcomm.gpu;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.fusedcomm.api.CommOptions;
import io.fusedcomm.api.Communicator;
import io.fusedcomm.api.DType;
import io.fusedcomm.api.DeviceTensor;
import io.fusedcomm.api.HostTensor;
import io.fusedcomm.api.InternalAccess;
import io.fusedcomm.api.PartialPrecision;
import io.fusedcomm.api.Split;
import io.fusedcomm.api.WeightLayout;
import io.fusedcomm.runtime.ExecutorRuntime;
import io.fusedcomm.spark.BarrierStage;
import io.fusedcomm.testing.Check;
import io.fusedcomm.testing.Data;
import io.fusedcomm.testing.Reference;
import io.fusedcomm.testing.SparkCluster;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Map;
import java.util.stream.Collectors;
import java.util.stream.IntStream;
import jcuda.driver.CUgraph;
import jcuda.driver.CUgraphExec;
import jcuda.driver.CUstream;
import jcuda.driver.CUstreamCaptureMode;
import jcuda.driver.JCudaDriver;
import jcuda.runtime.JCuda;
import jcuda.runtime.cudaStream_t;
import org.apache.spark.api.java.JavaRDD;
import org.junit.jupiter.api.Assumptions;
import org.junit.jupiter.api.Test;

/**
 * Spark on GPUs: a {@code local-cluster} application with one executor per GPU of this host
 * (the discovery script hands each executor its own GPU), the cuda backend, and barrier stages
 * whose tasks run the GPU collectives on device tensors (JCuda memory):
 *
 * <ul>
 *   <li>every executor plugin opened the cuda runtime on a different GPU (UUIDs printed);
 *   <li>allGather, reduceScatter, allReduce and allToAll in bf16 and f32, synchronous and on
 *       the task's own CUDA stream, at sizes 1, 4W+1, 300001 and 1500007 (one-shot and
 *       two-phase kernels), fresh random inputs, outputs poisoned with NaN, every element checked
 *       against the fp64 reference on every rank (exact for data movement);
 *   <li>an allReduce larger than the symmetric data area (run in pieces), and a reduceScatter
 *       too large for it, refused on every rank with the same message, the communicator usable
 *       after;
 *   <li>allGatherGemm (with the gathered A; uneven M, one shape the fused kernel takes at
 *       W = 2), gemmReduceScatter and gemmAllReduce with every partial precision, both weight
 *       layouts (KN on the task's stream), against the fp64 reference (the gathered A exactly);
 *   <li>{@code describeFusedOp} names the path each fused op's size rule picks (fused or
 *       decomposed, the exchange) and a size the data area cannot hold;
 *   <li>the four collectives and the three GEMM-shaped ops captured in a CUDA graph on the
 *       task's stream and the graph launched 3 times with fresh inputs, every output checked
 *       after each launch;
 *   <li>Java-initiated minus native-initiated time per 4 KiB allReduce (the acceptance bound is
 *       5 µs);
 *   <li>a second barrier stage reuses the symmetric memory the first one gave back.
 * </ul>
 *
 * Skips, with the reason printed, on hosts with fewer than two GPUs unless asked for one
 * executor. World size: every GPU, or {@code -Dfusedcomm.test.gpuWorld=N} (N = 1 runs the
 * same checks with one executor on a one-GPU host: the Java path to the kernels, no NVLink).
 */
class GpuClusterCollectivesTest {
  private static final int[] SIZES_BASE = {1, 300_001, 1_500_007};
  private static final long SYMMETRIC_BYTES = 8L << 20;

  @Test
  void collectivesOnDeviceTensorsInBarrierStages() {
    Gpu.require();
    int[] count = {0};
    JCuda.cudaGetDeviceCount(count);
    int requested = Integer.getInteger("fusedcomm.test.gpuWorld", count[0]);
    boolean runnable = count[0] >= 2 || (count[0] == 1 && requested == 1);
    if (!runnable) {
      System.out.println("SKIPPED (" + count[0] + " GPU): the cluster test needs at least 2 GPUs "
          + "(or one, with -Dfusedcomm.test.gpuWorld=1)");
    }
    Assumptions.assumeTrue(runnable, "needs at least 2 GPUs, or -Dfusedcomm.test.gpuWorld=1 and one");
    int world = Math.max(1, Math.min(count[0], requested));
    long seed = Long.getLong("fusedcomm.test.seed", System.nanoTime());
    System.out.println("GpuClusterCollectivesTest world " + world + " seed " + seed);

    Map<String, String> settings = Gpu.clusterSettings(SYMMETRIC_BYTES);
    try (SparkCluster cluster = SparkCluster.start("GpuClusterCollectivesTest", world, settings)) {
      JavaRDD<Integer> ranks = cluster.context().parallelize(
          IntStream.range(0, world).boxed().collect(Collectors.toList()), world);

      List<String> first = BarrierStage.withCommunicator(ranks, CommOptions.defaults(),
          (comm, ctx, rows) -> runOnRank(comm, seed).iterator()).collect();
      first.forEach(System.out::println);
      List<String> failures = first.stream().filter(l -> l.contains("FAIL")).toList();
      assertTrue(failures.isEmpty(), String.join("\n", failures));

      List<String> gpus = first.stream().filter(l -> l.contains(" uuid=")).toList();
      assertEquals(world, gpus.size(), "one identity line per rank");
      long distinctUuids = gpus.stream().map(l -> l.replaceAll(".*uuid=(\\S+).*", "$1")).distinct().count();
      assertEquals(world, distinctUuids, "every executor has its own GPU: " + gpus);
      for (String l : first.stream().filter(l -> l.startsWith("overhead ")).toList()) {
        double us = Double.parseDouble(l.replaceAll(".*java-minus-native=(\\S+)us.*", "$1"));
        assertTrue(us <= 5.0, "Java-initiated minus native-initiated time per 4 KiB allReduce: " + l);
      }

      // A second stage on the same executors: the region the first communicator gave back is
      // borrowed (pool 1 -> 0 while open) and returned (-> 1).
      List<String> second = BarrierStage.mapPartitions(ranks, (ctx, rows) -> {
        ExecutorRuntime rt = ExecutorRuntime.current().orElseThrow();
        int before = rt.pooledSymmetricRegions();
        int during;
        String check;
        try (Communicator comm = Communicator.create(ctx)) {
          during = rt.pooledSymmetricRegions();
          check = allReduceOnes(comm, 1000);
        }
        int after = rt.pooledSymmetricRegions();
        return List.of("stage 2 rank " + ctx.partitionId() + " pooled regions before/during/after "
            + before + "/" + during + "/" + after + " " + check).iterator();
      }).collect();
      second.forEach(System.out::println);
      for (String l : second) {
        assertTrue(l.contains("pooled regions before/during/after 1/0/1") && l.endsWith(" ok"), l);
      }
    }
  }

  /** Everything one rank checks; lines containing FAIL are failures. */
  private static List<String> runOnRank(Communicator comm, long seed) {
    ExecutorRuntime rt = ExecutorRuntime.current().orElseThrow();
    List<String> out = new ArrayList<>();
    int w = comm.world();
    int r = comm.rank();
    out.add("rank " + r + " of " + w + " executor " + rt.executorId() + " gpu "
        + rt.gpuAddress().orElse("?") + " uuid=" + rt.gpuUuid() + " backend=" + comm.backend());
    cudaStream_t stream = new cudaStream_t();
    JCuda.cudaStreamCreate(stream);
    int checks = 0;
    try {
      int[] sizes = IntStream.concat(Arrays.stream(SIZES_BASE), IntStream.of(4 * w + 1)).toArray();
      int trial = 0;
      for (DType t : new DType[] {DType.BF16, DType.F32}) {
        for (int n : sizes) {
          for (String op : new String[] {"allGather", "reduceScatter", "allReduce", "allToAll"}) {
            boolean onStream = (trial++ % 2) == 1;
            String what = op + " " + t.label() + " n=" + n + (onStream ? " on stream" : "");
            progress(r, what);
            try {
              checkCollective(comm, op, t, n, Data.seed(seed, trial, 0), onStream ? stream : null);
              checks++;
            } catch (Throwable e) {
              out.add("FAIL rank " + r + " " + what + ": " + e);
            }
          }
        }
      }
      // Larger than the data area: allReduce runs in pieces; reduceScatter is refused everywhere.
      int big = (int) (SYMMETRIC_BYTES / 4 * 2 + 11);
      progress(r, "allReduce in pieces n=" + big);
      try {
        checkCollective(comm, "allReduce", DType.F32, big, Data.seed(seed, 9999, 0), null);
        checks++;
      } catch (Throwable e) {
        out.add("FAIL rank " + r + " allReduce in pieces n=" + big + ": " + e);
      }
      try {
        checkCollective(comm, "reduceScatter", DType.F32, big, Data.seed(seed, 9998, 0), null);
        out.add("FAIL rank " + r + " a reduceScatter larger than the data area was not refused");
      } catch (IllegalArgumentException e) {
        if (!e.getMessage().contains("spark.fusedcomm.cuda.symmetricBytes")) {
          out.add("FAIL rank " + r + " refusal does not name the config key: " + e.getMessage());
        }
      } catch (Throwable e) {
        out.add("FAIL rank " + r + " unexpected failure for an oversized reduceScatter: " + e);
      }
      String after = allReduceOnes(comm, 4097);
      if (!after.equals("ok")) {
        out.add("FAIL rank " + r + " communicator after a refused op: " + after);
      }
      // The fused ops (kAuto picks the fused kernel or our GEMM + collective by size, the same
      // choice on every rank); the KN forms on the task's stream.
      for (WeightLayout layout : WeightLayout.values()) {
        cudaStream_t on = layout == WeightLayout.KN ? stream : null;
        // The second shape (a gathered A of M*K*2 = 16 MiB) is one the fused kernel takes at
        // W = 2; its shard (8 MiB at W = 2, less above) just fits SYMMETRIC_BYTES.
        int[][] shapes = w >= 2 ? new int[][] {{128 * w + 40, 264}, {2048, 4096}} : new int[][] {{128 * w + 40, 264}};
        for (int[] mk : shapes) {
          String what = "allGatherGemm " + layout + " M=" + mk[0] + " K=" + mk[1];
          progress(r, what);
          try {
            checkAllGatherGemm(comm, layout, mk[0], mk[1], Data.seed(seed, 7000 + mk[1] + layout.ordinal(), 0), on);
            checks++;
          } catch (Throwable e) {
            out.add("FAIL rank " + r + " " + what + ": " + e);
          }
        }
        for (boolean all : new boolean[] {false, true}) {
          for (PartialPrecision p : PartialPrecision.values()) {
            String what = (all ? "gemmAllReduce " : "gemmReduceScatter ") + layout + " partials " + p;
            progress(r, what);
            try {
              checkGemmReduce(comm, all, layout, p,
                  Data.seed(seed, 7100 + (all ? 50 : 0) + 4 * layout.ordinal() + p.ordinal(), 0), on);
              checks++;
            } catch (Throwable e) {
              out.add("FAIL rank " + r + " " + what + ": " + e);
            }
          }
        }
      }
      progress(r, "describeFusedOp");
      try {
        checks += checkDescriptions(comm, out);
      } catch (Throwable e) {
        out.add("FAIL rank " + r + " describeFusedOp: " + e);
      }
      progress(r, "CUDA graph");
      try {
        checks += checkGraph(comm, Data.seed(seed, 8000, 0), stream, 0);
      } catch (Throwable e) {
        out.add("FAIL rank " + r + " CUDA graph of the collectives and GEMM ops: " + e);
      }
      out.add("rank " + r + " checks passed: " + checks);
      progress(r, "overhead");
      out.add(overhead(comm));
    } finally {
      JCuda.cudaStreamDestroy(stream);
    }
    return out;
  }

  /**
   * The check a rank starts, on the executor's stderr (its worker keeps it): the lines this
   * rank returns are lost if its executor dies, and this says which check was in flight.
   */
  private static void progress(int rank, String what) {
    System.err.println("GpuClusterCollectivesTest rank " + rank + " starts: " + what);
    System.err.flush();
  }

  /** Runs one collective on device tensors and compares every element with the reference. */
  static void checkCollective(Communicator comm, String op, DType t, int n, long seed, cudaStream_t stream) {
    checkCollective(comm, op, t, n, seed, stream, 0);
  }

  /** As above, with the reductions' accumulation bound widened by {@code extraRel} (Check.close). */
  static void checkCollective(Communicator comm, String op, DType t, int n, long seed, cudaStream_t stream,
                              double extraRel) {
    int w = comm.world();
    int r = comm.rank();
    float[][] inputs = inputs(op, t, n, w, seed);
    try (DeviceTensor in = DeviceTensor.allocate(t, inputs[r].length);
        DeviceTensor dout = DeviceTensor.allocate(t, outputLength(op, n, w, r))) {
      Gpu.put(in, inputs[r]);
      Gpu.poison(dout);
      enqueue(comm, op, in, dout, stream);
      if (stream != null) {
        comm.synchronize();
      }
      verify(op, t, n, w, r, inputs, Gpu.download(dout), extraRel);
    }
  }

  /** Every rank's input of a collective of n elements (allGather: the rank's block). */
  private static float[][] inputs(String op, DType t, int n, int w, long seed) {
    float[][] inputs = new float[w][];
    for (int p = 0; p < w; p++) {
      inputs[p] = Data.uniform(Data.seed(seed, p, 1), inputLength(op, n, w, p), t);
    }
    return inputs;
  }

  private static int inputLength(String op, int n, int w, int r) {
    return op.equals("allGather") ? (int) Split.count(n, w, r) : n;
  }

  private static int outputLength(String op, int n, int w, int r) {
    return switch (op) {
      case "allGather", "allReduce" -> n;
      case "reduceScatter" -> (int) Split.count(n, w, r);
      default -> (int) (w * Split.count(n, w, r));
    };
  }

  private static void enqueue(Communicator comm, String op, DeviceTensor in, DeviceTensor out, cudaStream_t stream) {
    switch (op) {
      case "allGather" -> comm.allGather(in, out, stream);
      case "reduceScatter" -> comm.reduceScatter(in, out, stream);
      case "allReduce" -> comm.allReduce(in, out, stream);
      default -> comm.allToAll(in, out, stream);
    }
  }

  /** Rank r's output against the fp64 reference (exact for data movement). */
  private static void verify(String op, DType t, int n, int w, int r, float[][] inputs, float[] got,
                             double extraRel) {
    switch (op) {
      case "allGather" -> Check.exact(op, Data.concat(inputs), got);
      case "reduceScatter" -> {
        long[] b = Reference.block(n, w, r);
        Check.close(op, Reference.sum(inputs).slice(b[0], b[1]), got, t, extraRel);
      }
      case "allReduce" -> Check.close(op, Reference.sum(inputs), got, t, extraRel);
      default -> {
        long[] b = Reference.block(n, w, r);
        List<float[]> blocks = new ArrayList<>();
        for (float[] in2 : inputs) {
          blocks.add(Arrays.copyOfRange(in2, (int) b[0], (int) (b[0] + b[1])));
        }
        Check.exact(op, Data.concat(blocks.toArray(new float[0][])), got);
      }
    }
  }

  /**
   * CUDA graphs from Java: the four collectives and the three GEMM-shaped ops, each twice,
   * captured on {@code stream} (JCuda's driver API) after one eager run, the graph launched 3
   * times with fresh inputs copied in (outputs poisoned) before each launch, and every output
   * checked after each. {@code extraRel} widens the collectives' reduction bound. Returns the
   * checks passed.
   */
  static int checkGraph(Communicator comm, long seed, cudaStream_t stream, double extraRel) {
    String[] ops = {"allReduce", "allGather", "reduceScatter", "allToAll"};
    DType[] types = {DType.BF16, DType.F32, DType.BF16, DType.F32};
    int n = 65_539;
    int w = comm.world();
    int r = comm.rank();
    List<AutoCloseable> owned = new ArrayList<>();
    CUstream cs = new CUstream(stream);
    CUgraph graph = new CUgraph();
    CUgraphExec exec = new CUgraphExec();
    boolean captured = false;
    boolean instantiated = false;
    int checks = 0;
    try {
      DeviceTensor[] in = new DeviceTensor[ops.length];
      DeviceTensor[] out = new DeviceTensor[ops.length];
      for (int i = 0; i < ops.length; i++) {
        in[i] = DeviceTensor.allocate(types[i], inputLength(ops[i], n, w, r));
        out[i] = DeviceTensor.allocate(types[i], outputLength(ops[i], n, w, r));
        owned.add(in[i]);
        owned.add(out[i]);
      }
      List<FusedCase> fused = new ArrayList<>();
      for (FusedCase c : new FusedCase[] {
          new FusedCase.AllGatherGemm(comm, WeightLayout.NK, 128 * w + 40, 264),
          new FusedCase.GemmReduce(comm, false, WeightLayout.KN, PartialPrecision.BF16),
          new FusedCase.GemmReduce(comm, true, WeightLayout.NK, PartialPrecision.F32)}) {
        fused.add(c);
        owned.add(c);
      }
      // Eager first: sizes any workspace, and across hosts each op must run once before capture.
      Runnable enqueueAll = () -> {
        for (int i = 0; i < ops.length; i++) {
          enqueue(comm, ops[i], in[i], out[i], stream);
        }
        for (FusedCase c : fused) {
          c.enqueue(stream);
        }
      };
      enqueueAll.run();
      comm.synchronize();
      JCudaDriver.setExceptionsEnabled(true);
      JCudaDriver.cuStreamBeginCapture(cs, CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
      try {
        enqueueAll.run();
        enqueueAll.run();
      } catch (RuntimeException | Error e) {
        try {
          JCudaDriver.cuStreamEndCapture(cs, graph);
          captured = true;
        } catch (RuntimeException ended) {
          e.addSuppressed(ended);  // the op's error is the one to report
        }
        throw e;
      }
      JCudaDriver.cuStreamEndCapture(cs, graph);
      captured = true;
      JCudaDriver.cuGraphInstantiate(exec, graph, 0);
      instantiated = true;
      for (int launch = 0; launch < 3; launch++) {
        float[][][] inputs = new float[ops.length][][];
        for (int i = 0; i < ops.length; i++) {
          inputs[i] = inputs(ops[i], types[i], n, w, Data.seed(seed, 500 + launch, i));
          Gpu.put(in[i], inputs[i][r]);
          Gpu.poison(out[i]);
        }
        for (int i = 0; i < fused.size(); i++) {
          fused.get(i).load(Data.seed(seed, 600 + launch, i));
        }
        JCudaDriver.cuGraphLaunch(exec, cs);
        JCudaDriver.cuStreamSynchronize(cs);
        comm.synchronize();
        for (int i = 0; i < ops.length; i++) {
          verify(ops[i], types[i], n, w, r, inputs[i], Gpu.download(out[i]), extraRel);
          checks++;
        }
        for (FusedCase c : fused) {
          try {
            c.verify();
          } catch (AssertionError e) {
            throw new AssertionError("graph launch " + launch + ", " + c.name() + ": " + e.getMessage(), e);
          }
          checks++;
        }
      }
    } finally {
      // Only what was made: destroying a graph that never was would hide the error that ended
      // the capture behind its own.
      if (instantiated) {
        JCudaDriver.cuGraphExecDestroy(exec);
      }
      if (captured) {
        JCudaDriver.cuGraphDestroy(graph);
      }
      for (AutoCloseable c : owned) {
        try {
          c.close();
        } catch (Exception e) {
          throw new IllegalStateException(e);
        }
      }
    }
    return checks;
  }

  /**
   * {@link Communicator#describeFusedOp} against the size rules (kernels/common/fused_choice.h,
   * and ag_uses_ce in kernels/ag_gemm/ag_gemm.cu): the small allGatherGemm above runs
   * decomposed; the 16 MiB one fused at W = 2 and 4 (with one executor per GPU, the copy
   * engines at W = 2, pulling CTAs at W = 4) and decomposed at other worlds; a
   * gemmReduceScatter whose fused workspace cannot fit
   * SYMMETRIC_BYTES is said to be refused, naming the key; sizes the op refuses throw. Each
   * description goes to the rank's lines. Returns the checks passed.
   */
  private static int checkDescriptions(Communicator comm, List<String> out) {
    int w = comm.world();
    int r = comm.rank();
    int nLocal = 136 + 8 * r;  // FusedCase.AllGatherGemm's N_r
    String small = comm.describeFusedOp("allGatherGemm", 128L * w + 40, nLocal, 264);
    String large = comm.describeFusedOp("allGatherGemm", 2048, nLocal, 4096);
    String refused = comm.describeFusedOp("gemmReduceScatter", 4096, 4096, 1024, PartialPrecision.F32);
    for (String d : new String[] {small, large, refused}) {
      out.add("rank " + r + " " + d);
    }
    List<String> bad = new ArrayList<>();
    if (!small.contains(": decomposed")) {
      bad.add("the small allGatherGemm is not decomposed: " + small);
    }
    boolean fusedWorld = w == 2 || w == 4;
    if (fusedWorld != large.contains(": fused: ")) {
      bad.add("the 16 MiB allGatherGemm at W=" + w + (fusedWorld ? " is not fused: " : " is fused: ") + large);
    }
    if (fusedWorld && !large.contains(w == 2 ? "the copy engines move the peers' rows" : "CTAs pull the peers' rows")) {
      bad.add("the 16 MiB allGatherGemm at W=" + w + " does not name its exchange: " + large);
    }
    if (w > 1 && !(refused.contains("refused") && refused.contains("spark.fusedcomm.cuda.symmetricBytes"))) {
      bad.add("a gemmReduceScatter past the data area is not said to be refused: " + refused);
    }
    try {
      comm.describeFusedOp("gemmReduceScatter", 100, 12, 8);
      bad.add("N = 12 (not a multiple of 8) was described, not refused");
    } catch (IllegalArgumentException expected) {
      // the op itself refuses N = 12 on the GPU
    }
    if (!bad.isEmpty()) {
      throw new AssertionError(String.join("; ", bad));
    }
    return 1;
  }

  /** allGatherGemm (FusedCase.AllGatherGemm) once; stream may be null. */
  static void checkAllGatherGemm(Communicator comm, WeightLayout layout, int m, int k, long seed,
                                 cudaStream_t stream) {
    try (FusedCase c = new FusedCase.AllGatherGemm(comm, layout, m, k)) {
      c.check(seed, stream);
    }
  }

  /** gemmReduceScatter, or with {@code all} gemmAllReduce (FusedCase.GemmReduce) once; stream may be null. */
  static void checkGemmReduce(Communicator comm, boolean all, WeightLayout layout, PartialPrecision partials,
                              long seed, cudaStream_t stream) {
    try (FusedCase c = new FusedCase.GemmReduce(comm, all, layout, partials)) {
      c.check(seed, stream);
    }
  }

  /** allReduce of ones: every element must equal the world size. */
  private static String allReduceOnes(Communicator comm, int n) {
    try (HostTensor h = HostTensor.allocate(DType.F32, n);
        DeviceTensor d = DeviceTensor.allocate(DType.F32, n)) {
      h.fill(1f);
      d.copyFrom(h);
      comm.allReduce(d, d);
      d.copyTo(h);
      float[] got = h.toFloatArray();
      for (int i = 0; i < n; i++) {
        if (got[i] != comm.world()) {
          return "element " + i + " is " + got[i] + ", expected " + comm.world();
        }
      }
      return "ok";
    }
  }

  /**
   * Per-op time of a synchronous 4 KiB (2048 × bf16) allReduce initiated from Java (the public
   * API, checks included) and from native code (same path after the checks), alternating in 5
   * rounds of 2000 ops after 500 warm-up ops; medians over the rounds.
   */
  private static String overhead(Communicator comm) {
    int n = 2048;
    int iters = 2000;
    try (HostTensor h = HostTensor.of(Data.uniform(7, n, DType.BF16), DType.BF16, n);
        DeviceTensor in = DeviceTensor.allocate(DType.BF16, n);
        DeviceTensor out = DeviceTensor.allocate(DType.BF16, n)) {
      in.copyFrom(h);
      for (int i = 0; i < 500; i++) {
        comm.allReduce(in, out);
      }
      InternalAccess.nativeAllReduceNanos(comm, in, out, 500);
      double[] java = new double[5];
      double[] nat = new double[5];
      for (int round = 0; round < 5; round++) {
        long t0 = System.nanoTime();
        for (int i = 0; i < iters; i++) {
          comm.allReduce(in, out);
        }
        java[round] = (System.nanoTime() - t0) / 1e3 / iters;
        nat[round] = InternalAccess.nativeAllReduceNanos(comm, in, out, iters) / 1e3 / iters;
      }
      double j = median(java);
      double v = median(nat);
      return String.format("overhead rank %d: 4 KiB allReduce java=%.2fus native=%.2fus java-minus-native=%.2fus"
              + " (rounds java %s native %s)", comm.rank(), j, v, j - v, fmt(java), fmt(nat));
    }
  }

  private static double median(double[] a) {
    double[] s = a.clone();
    Arrays.sort(s);
    return s[s.length / 2];
  }

  private static String fmt(double[] a) {
    return Arrays.stream(a).mapToObj(x -> String.format("%.2f", x)).collect(Collectors.joining(",", "[", "]"));
  }
}
