package io.fusedcomm.spark;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.fusedcomm.runtime.ExecutorRuntime;
import io.fusedcomm.runtime.NativeApi;
import io.fusedcomm.testing.SparkCluster;
import java.util.List;
import java.util.Map;
import java.util.stream.Collectors;
import java.util.stream.IntStream;
import org.junit.jupiter.api.Assumptions;
import org.junit.jupiter.api.Test;

/**
 * Every op of the host backend on local-cluster[3,1,1024] with the libfabric transport on its tcp
 * provider (spark.fusedcomm.transport=libfabric, spark.fusedcomm.libfabric.provider=tcp): the
 * executors' runtimes must say they run libfabric, and the driver checks every element against
 * the fp64 reference, at W = 2 and 3. Skipped, with the probe's reason printed, where libfabric or
 * its tcp provider is absent.
 */
class LibfabricClusterOpsTest {
  /** The availability report's libfabric line, and whether it offers tcp. */
  private static void requireLibfabricTcp() {
    String line = "";
    for (String l : NativeApi.availability().split("\n")) {
      if (l.startsWith("transport.libfabric:")) {
        line = l;
      }
    }
    boolean tcp = line.startsWith("transport.libfabric: available") && line.contains("tcp: tcp");
    if (!tcp) {
      System.out.println("SKIPPED LibfabricClusterOpsTest: no libfabric tcp provider here: " + line);
    }
    Assumptions.assumeTrue(tcp, "no libfabric tcp provider here: " + line);
  }

  @Test
  void everyOpMatchesTheReferenceOverLibfabricTcp() {
    requireLibfabricTcp();
    long seed = Long.getLong("fusedcomm.test.seed", System.nanoTime());
    System.out.println("LibfabricClusterOpsTest seed " + seed);
    Map<String, String> settings =
        Map.of("spark.fusedcomm.transport", "libfabric", "spark.fusedcomm.libfabric.provider", "tcp");
    try (SparkCluster cluster = SparkCluster.start("LibfabricClusterOpsTest", 3, settings)) {
      List<String> runtimes =
          cluster
              .context()
              .parallelize(IntStream.range(0, 3).boxed().collect(Collectors.toList()), 3)
              .map(i -> ExecutorRuntime.current().map(Object::toString).orElse("no runtime"))
              .collect();
      assertEquals(3, runtimes.size());
      for (String r : runtimes) {
        assertTrue(r.contains("transport=libfabric (libfabric: as configured; libfabric tcp;ofi_rxm"), r);
      }
      System.out.println("executor runtime: " + runtimes.get(0));
      LocalClusterOpsTest.runEveryOp(cluster, 2, seed);
      LocalClusterOpsTest.runEveryOp(cluster, 3, seed + 3);
    }
  }
}
