package io.fusedcomm.spark;

import io.fusedcomm.testing.SparkCluster;
import java.util.Map;
import org.junit.jupiter.api.Test;

/** Every op on the host backend in a barrier stage on local-cluster[2,1,1024]. */
class TwoExecutorClusterOpsTest {
  @Test
  void everyOpMatchesTheReferenceOnTwoExecutors() {
    long seed = Long.getLong("fusedcomm.test.seed", System.nanoTime());
    System.out.println("TwoExecutorClusterOpsTest seed " + seed);
    try (SparkCluster cluster = SparkCluster.start("TwoExecutorClusterOpsTest", 2, Map.of())) {
      LocalClusterOpsTest.runEveryOp(cluster, 2, seed);
    }
  }
}
