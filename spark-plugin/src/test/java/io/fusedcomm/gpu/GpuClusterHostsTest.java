package io.fusedcomm.gpu;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.fusedcomm.api.CommOptions;
import io.fusedcomm.api.Communicator;
import io.fusedcomm.api.DType;
import io.fusedcomm.api.DeviceTensor;
import io.fusedcomm.api.InternalAccess;
import io.fusedcomm.api.PartialPrecision;
import io.fusedcomm.api.WeightLayout;
import io.fusedcomm.runtime.ExecutorRuntime;
import io.fusedcomm.spark.BarrierStage;
import io.fusedcomm.testing.Data;
import io.fusedcomm.testing.SparkCluster;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Map;
import java.util.stream.Collectors;
import java.util.stream.IntStream;
import jcuda.runtime.JCuda;
import jcuda.runtime.cudaStream_t;
import org.apache.spark.api.java.JavaRDD;
import org.junit.jupiter.api.Assumptions;
import org.junit.jupiter.api.Test;

/**
 * Spark on GPUs between hosts: a {@code local-cluster} application with one executor per GPU of
 * this host and {@code spark.fusedcomm.cuda.virtualHosts=2}, so that the cuda backend connects
 * the executors as two hosts (NVLink inside each, the GPU-driven proxy and the socket transport
 * between them). In a barrier stage every rank checks:
 *
 * <ul>
 *   <li>the layout: two hosts of world / 2 ranks;
 *   <li>allReduce, allGather, reduceScatter and allToAll in bf16 and f32, synchronous and on the
 *       task's CUDA stream, at 1, 4W+1, 300001 and 1500007 elements (allReduce also one larger
 *       than the symmetric data area: pieces), fresh random inputs, outputs poisoned, every
 *       element against the fp64 reference (bf16 sums: each host's sum is rounded to bf16 before
 *       the sum across hosts, docs/ops.md, so the bound is widened by 2^-8 of the terms'
 *       magnitude);
 *   <li>allGatherGemm, gemmReduceScatter and gemmAllReduce, both weight layouts, every partial
 *       precision, against the fp64 reference; with one rank per host, that {@code
 *       describeFusedOp} names the one kernel for allGatherGemm and gemmReduceScatter;
 *   <li>the four collectives and the three GEMM-shaped ops captured in a CUDA graph on the
 *       task's stream, launched 3 times with fresh inputs, every output checked; then an
 *       allReduce.
 * </ul>
 *
 * With one GPU, two executors share it ({@code spark.fusedcomm.cuda.shareGpu}: correctness only).
 * {@code -Dfusedcomm.test.transport=libfabric} runs the hosts' link over libfabric's tcp provider
 * ({@code spark.fusedcomm.transport}; libfabric.so.1 must load in the executors).
 * Skips, with the reason printed, where no GPU is visible or the GPU count is odd and above one.
 */
class GpuClusterHostsTest {
  private static final long SYMMETRIC_BYTES = 8L << 20;

  @Test
  void collectivesBetweenVirtualHosts() {
    Gpu.require();
    int[] count = {0};
    JCuda.cudaGetDeviceCount(count);
    int gpus = count[0];
    // One GPU: two executors share it (spark.fusedcomm.cuda.shareGpu; correctness only).
    boolean shared = gpus == 1;
    int world = shared ? 2 : gpus;
    boolean runnable = world % 2 == 0;
    if (!runnable) {
      System.out.println("SKIPPED (" + gpus + " GPUs): two virtual hosts need an even number of GPUs, or one");
    }
    Assumptions.assumeTrue(runnable, "needs an even number of GPUs, or one");
    long seed = Long.getLong("fusedcomm.test.seed", System.nanoTime());
    System.out.println("GpuClusterHostsTest world " + world + (shared ? " (two executors on one GPU)" : "")
        + " seed " + seed);

    Map<String, String> settings = Gpu.clusterSettings(SYMMETRIC_BYTES);
    settings.put("spark.fusedcomm.cuda.virtualHosts", "2");
    String transport = System.getProperty("fusedcomm.test.transport");
    if (transport != null) {
      settings.put("spark.fusedcomm.transport", transport);
      settings.put("spark.fusedcomm.libfabric.provider", "tcp");
    }
    if (shared) {
      settings.put("spark.fusedcomm.cuda.shareGpu", "true");
      // conf/gpu-discovery.sh hands each executor a GPU no other holds; here both get GPU 0.
      String script = gpuZeroScript();
      settings.put("spark.worker.resource.gpu.discoveryScript", script);
      settings.put("spark.executor.resource.gpu.discoveryScript", script);
    }
    try (SparkCluster cluster = SparkCluster.start("GpuClusterHostsTest", world, settings)) {
      JavaRDD<Integer> ranks = cluster.context().parallelize(
          IntStream.range(0, world).boxed().collect(Collectors.toList()), world);
      List<String> lines = BarrierStage.withCommunicator(ranks, CommOptions.defaults(),
          (comm, ctx, rows) -> runOnRank(comm, seed).iterator()).collect();
      lines.forEach(System.out::println);
      List<String> failures = lines.stream().filter(l -> l.contains("FAIL")).toList();
      assertTrue(failures.isEmpty(), String.join("\n", failures));
      assertEquals(world, lines.stream().filter(l -> l.contains(" uuid=")).count(), "one identity line per rank");
      assertEquals(world, lines.stream().filter(l -> l.endsWith(" checks passed")).count(), "a summary per rank");
    }
  }

  /** A discovery script that reports GPU 0 to every caller. */
  private static String gpuZeroScript() {
    try {
      Path script = Files.createTempFile("fusedcomm-gpu0-", ".sh");
      Files.writeString(script, "#!/bin/sh\necho '{\"name\":\"gpu\",\"addresses\":[\"0\"]}'\n");
      script.toFile().setExecutable(true);
      script.toFile().deleteOnExit();
      return script.toAbsolutePath().toString();
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
  }

  private static List<String> runOnRank(Communicator comm, long seed) {
    ExecutorRuntime rt = ExecutorRuntime.current().orElseThrow();
    List<String> out = new ArrayList<>();
    int w = comm.world();
    int r = comm.rank();
    out.add("rank " + r + " of " + w + " executor " + rt.executorId() + " uuid=" + rt.gpuUuid()
        + " hosts: " + InternalAccess.hosts(comm));
    if (InternalAccess.hosts(comm).hosts() != 2 || InternalAccess.hosts(comm).ranksPerHost() != w / 2) {
      out.add("FAIL rank " + r + " layout " + InternalAccess.hosts(comm));
    }
    cudaStream_t stream = new cudaStream_t();
    JCuda.cudaStreamCreate(stream);
    int checks = 0;
    int trial = 0;
    try {
      int big = (int) (SYMMETRIC_BYTES / 4 * 2 + 11);
      for (String op : new String[] {"allReduce", "allGather", "reduceScatter", "allToAll"}) {
        for (DType t : new DType[] {DType.BF16, DType.F32}) {
          double extraRel = t == DType.BF16 ? 0x1p-8 : 0;
          for (int n : op.equals("allReduce") ? new int[] {1, 4 * w + 1, 300_001, 1_500_007, big}
                                              : new int[] {1, 4 * w + 1, 300_001, 1_500_007}) {
            boolean onStream = (trial++ % 2) == 1;
            try {
              GpuClusterCollectivesTest.checkCollective(
                  comm, op, t, n, Data.seed(seed, trial, 0), onStream ? stream : null, extraRel);
              checks++;
            } catch (Throwable e) {
              out.add("FAIL rank " + r + " " + op + " " + t.label() + " n=" + n + (onStream ? " on stream" : "") + ": " + e);
            }
          }
        }
      }
      // The fused ops between hosts: one kernel with one rank per host, else the decomposed path
      // (hierarchical collective + our GEMM).
      if (InternalAccess.hosts(comm).ranksPerHost() == 1) {
        for (String op : new String[] {"allGatherGemm", "gemmReduceScatter"}) {
          String said = comm.describeFusedOp(op, 128L * w + 40, 264, 264);
          if (!said.contains("fused across hosts")) {
            out.add("FAIL rank " + r + " " + op + " with one rank per host does not run as one kernel: " + said);
          }
        }
      }
      for (WeightLayout layout : WeightLayout.values()) {
        cudaStream_t on = layout == WeightLayout.KN ? stream : null;
        try {
          GpuClusterCollectivesTest.checkAllGatherGemm(comm, layout, 128 * w + 40, 264,
              Data.seed(seed, 7000 + layout.ordinal(), 0), on);
          checks++;
        } catch (Throwable e) {
          out.add("FAIL rank " + r + " allGatherGemm " + layout + ": " + e);
        }
        for (boolean all : new boolean[] {false, true}) {
          for (PartialPrecision p : PartialPrecision.values()) {
            try {
              GpuClusterCollectivesTest.checkGemmReduce(comm, all, layout, p,
                  Data.seed(seed, 7100 + (all ? 50 : 0) + 4 * layout.ordinal() + p.ordinal(), 0), on);
              checks++;
            } catch (Throwable e) {
              out.add("FAIL rank " + r + (all ? " gemmAllReduce " : " gemmReduceScatter ") + layout + " partials " + p
                  + ": " + e);
            }
          }
        }
      }
      try {
        checks += GpuClusterCollectivesTest.checkGraph(comm, Data.seed(seed, 8000, 0), stream, 0x1p-8);
      } catch (Throwable e) {
        out.add("FAIL rank " + r + " CUDA graph of the collectives and GEMM ops between hosts: " + e + " at "
            + Arrays.stream(e.getStackTrace()).limit(6).map(String::valueOf).collect(Collectors.joining(" < ")));
      }
      try {
        GpuClusterCollectivesTest.checkCollective(comm, "allReduce", DType.F32, 4097, Data.seed(seed, 99, 0), null);
        checks++;
      } catch (Throwable e) {
        out.add("FAIL rank " + r + " allReduce after the refusal: " + e);
      }
    } finally {
      JCuda.cudaStreamDestroy(stream);
    }
    out.add("rank " + r + ": " + checks + " checks passed");
    return out;
  }
}
