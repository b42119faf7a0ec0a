package io.fusedcomm.spark;

import static org.junit.jupiter.api.Assertions.assertEquals;

import io.fusedcomm.api.CommOptions;
import io.fusedcomm.api.DType;
import io.fusedcomm.api.RankPlacement;
import io.fusedcomm.testing.OpSuite;
import io.fusedcomm.testing.SparkCluster;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.stream.Collectors;
import java.util.stream.IntStream;
import org.apache.spark.api.java.JavaRDD;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.ValueSource;

/**
 * Every op through the whole Spark path on a real {@code local-cluster[4,1,1024]}: executor JVMs
 * with the fusedcomm plugin (host backend), the barrier bootstrap, the socket transport between
 * executor processes. Each barrier stage of W tasks (W = 2, 3, 4: one task per executor) runs
 * {@link OpSuite} in f32 and bf16 and returns its outputs; the driver rebuilds every rank's
 * inputs from the seed and checks every element against the fp64 reference.
 * {@link TwoExecutorClusterOpsTest} runs the same on local-cluster[2,1,1024].
 */
class LocalClusterOpsTest {
  private static final long SEED = Long.getLong("fusedcomm.test.seed", System.nanoTime());
  private static SparkCluster cluster;

  @BeforeAll
  static void start() {
    System.out.println("LocalClusterOpsTest seed " + SEED);
    cluster = SparkCluster.start("LocalClusterOpsTest", 4, Map.of());
  }

  @AfterAll
  static void stop() {
    if (cluster != null) {
      cluster.close();
    }
  }

  /** What one barrier task saw and computed. */
  static final class TaskOutput implements java.io.Serializable {
    private static final long serialVersionUID = 1L;
    int partition;
    int rank;
    int world;
    String executor;
    List<String> executorsByRank;
    OpSuite.Result f32;
    OpSuite.Result bf16;
  }

  @ParameterizedTest(name = "W={0}")
  @ValueSource(ints = {2, 3, 4})
  void everyOpMatchesTheReference(int w) {
    runEveryOp(cluster, w, SEED + w);
  }

  /** One barrier stage of {@code w} tasks running every op; the driver checks every element. */
  static void runEveryOp(SparkCluster cluster, int w, long seed) {
    JavaRDD<Integer> rdd = cluster.context().parallelize(IntStream.range(0, w).boxed().collect(Collectors.toList()), w);
    long start = System.nanoTime();
    List<TaskOutput> outs = BarrierStage.withCommunicator(rdd, CommOptions.defaults(), (comm, ctx, rows) -> {
      TaskOutput o = new TaskOutput();
      o.partition = ctx.partitionId();
      o.rank = comm.rank();
      o.world = comm.world();
      o.executor = org.apache.spark.SparkEnv.get().executorId();
      o.executorsByRank = comm.placements().stream().map(RankPlacement::executorId).collect(Collectors.toList());
      o.f32 = OpSuite.run(comm, DType.F32, seed);
      o.bf16 = OpSuite.run(comm, DType.BF16, seed);
      return List.of(o).iterator();
    }).collect();
    System.out.println("W=" + w + " barrier stage with every op in f32 and bf16: " + (System.nanoTime() - start) / 1_000_000 + " ms");

    assertEquals(w, outs.size());
    List<OpSuite.Result> f32 = new ArrayList<>();
    List<OpSuite.Result> bf16 = new ArrayList<>();
    for (TaskOutput o : outs) {
      assertEquals(o.partition, o.rank, "rank = partition id");
      assertEquals(w, o.world);
      assertEquals(o.executor, o.executorsByRank.get(o.rank), "rank " + o.rank + " announced its own executor");
      assertEquals(outs.get(0).executorsByRank, o.executorsByRank, "every rank saw the same bootstrap");
      f32.add(o.f32);
      bf16.add(o.bf16);
    }
    assertEquals(w, new HashSet<>(outs.get(0).executorsByRank).size(), "one rank per executor process");
    OpSuite.verify(DType.F32, seed, f32);
    OpSuite.verify(DType.BF16, seed, bf16);
  }
}
