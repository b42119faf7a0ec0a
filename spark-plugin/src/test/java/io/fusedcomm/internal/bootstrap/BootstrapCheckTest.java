package io.fusedcomm.internal.bootstrap;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertDoesNotThrow;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.fusedcomm.api.Backend;
import io.fusedcomm.errors.BackendUnavailableException;
import io.fusedcomm.errors.CommunicatorException;
import java.util.List;
import java.util.OptionalInt;
import org.junit.jupiter.api.Test;

class BootstrapCheckTest {
  private static final int W = 4;

  /**
   * Runs the check as every rank would and asserts all fail with the same message; returns it.
   */
  private static CommunicatorException failsOnEveryRank(List<RankInfo> infos, int world) {
    CommunicatorException first = null;
    for (int me = 0; me < world; me++) {
      int myRank = me;
      CommunicatorException e =
          assertThrows(
              CommunicatorException.class, () -> BootstrapCheck.check(infos, world, myRank));
      if (first == null) {
        first = e;
      } else {
        assertEquals(first.getMessage(), e.getMessage(), "rank " + me + " saw a different message");
        assertEquals(first.rank(), e.rank());
      }
      assertEquals("bootstrap", e.op().orElseThrow());
    }
    return first;
  }

  private static void assertMessage(String expected, CommunicatorException e) {
    assertTrue(e.getMessage().contains(expected), e.getMessage());
  }

  @Test
  void consistentWorldPasses() {
    for (int w = 1; w <= 5; w++) {
      List<RankInfo> infos = RankInfos.world(w);
      for (int me = 0; me < w; me++) {
        int world = w;
        int myRank = me;
        assertDoesNotThrow(() -> BootstrapCheck.check(infos, world, myRank));
      }
    }
  }

  @Test
  void wrongNumberOfBlobs() {
    CommunicatorException e = failsOnEveryRank(RankInfos.world(3), W);
    assertEquals(
        "the barrier stage gathered 3 rank blobs but the communicator expects world size 4"
            + " (op bootstrap)",
        e.getMessage());
    assertEquals(OptionalInt.empty(), e.rank());
  }

  @Test
  void rankExpectingAnotherWorldSize() {
    CommunicatorException e = failsOnEveryRank(RankInfos.worldWith(W, 2, b -> b.world = 5), W);
    assertMessage("barrier task 2 asked for world size 5 but the barrier stage has 4 tasks", e);
    assertEquals(OptionalInt.of(2), e.rank());
  }

  @Test
  void duplicateRank() {
    CommunicatorException e = failsOnEveryRank(RankInfos.worldWith(W, 2, b -> b.rank = 1), W);
    assertMessage("barrier tasks 1 and 2 both claim rank 1", e);
    assertEquals(OptionalInt.of(2), e.rank());
  }

  @Test
  void rankOutOfRange() {
    CommunicatorException e = failsOnEveryRank(RankInfos.worldWith(W, 3, b -> b.rank = 9), W);
    assertMessage("barrier task 3 claims rank 9, outside 0..3", e);
  }

  @Test
  void rankNotEqualToPartition() {
    List<RankInfo> infos = RankInfos.world(W);
    infos.set(1, RankInfos.with(infos.get(1), b -> b.rank = 2));
    infos.set(2, RankInfos.with(infos.get(2), b -> b.rank = 1));
    CommunicatorException e = failsOnEveryRank(infos, W);
    assertMessage("barrier task 1 claims rank 2; a rank must equal its barrier task's partition id", e);
    assertEquals(OptionalInt.of(1), e.rank());
  }

  @Test
  void differentJobToken() {
    CommunicatorException e = failsOnEveryRank(RankInfos.worldWith(W, 3, b -> b.jobToken = 1), W);
    assertMessage("rank 3's job token differs from rank 0's", e);
    assertFalse(e.getMessage().contains(Long.toString(RankInfos.TOKEN)), "token leaked in message");
    assertFalse(e.getMessage().contains(Long.toHexString(RankInfos.TOKEN)), "token leaked in message");
    assertEquals(OptionalInt.of(3), e.rank());
  }

  @Test
  void differentCommNonce() {
    CommunicatorException e = failsOnEveryRank(RankInfos.worldWith(W, 1, b -> b.commNonce = 78), W);
    assertMessage("rank 1's communicator nonce differs from rank 0's", e);
  }

  @Test
  void differentOpParameters() {
    Fingerprint other =
        Fingerprint.builder("allGatherGemm").add("dtype", "bf16").addShape("A", 256, 1024).build();
    List<RankInfo> infos =
        RankInfos.worldWith(
            W,
            1,
            b -> {
              b.fingerprint = other.value();
              b.opDescription = other.description();
            });
    CommunicatorException e = failsOnEveryRank(infos, W);
    assertEquals(
        "rank 1's op parameters differ from rank 0's: A is 256x1024 on rank 1 but 512x1024 on"
            + " rank 0 (rank 1, op bootstrap)",
        e.getMessage());
    assertEquals(OptionalInt.of(1), e.rank());
  }

  @Test
  void differentFingerprintWithSameDescription() {
    CommunicatorException e =
        failsOnEveryRank(RankInfos.worldWith(W, 2, b -> b.fingerprint = 5), W);
    assertMessage("rank 2's op parameters differ from rank 0's: fingerprint 0000000000000005", e);
  }

  @Test
  void mixedBackends() {
    CommunicatorException e =
        failsOnEveryRank(RankInfos.worldWith(W, 2, b -> b.backend = Backend.HOST), W);
    assertMessage("mixed backends: rank 2 runs host but rank 0 runs cuda", e);
    assertMessage("spark.fusedcomm.backend", e);
  }

  @Test
  void unresolvedBackend() {
    CommunicatorException e =
        failsOnEveryRank(RankInfos.worldWith(W, 0, b -> b.backend = Backend.AUTO), W);
    assertMessage("rank 0 did not resolve its backend", e);
  }

  @Test
  void twoRanksOnOneGpu() {
    List<RankInfo> infos =
        RankInfos.worldWith(
            W,
            1,
            b -> {
              b.gpuId = "0";
              b.gpuUuid = "GPU-uuid-host0-0";
            });
    CommunicatorException e = failsOnEveryRank(infos, W);
    assertMessage(
        "ranks 0 and 1 both use GPU GPU-uuid-host0-0 on host host0 (executors exec-0 and exec-1)",
        e);
    assertMessage("conf/gpu-discovery.sh", e);
    assertEquals(OptionalInt.of(1), e.rank());
    // spark.fusedcomm.cuda.shareGpu (testing only) lifts exactly this rule.
    for (int r = 0; r < W; r++) {
      int rank = r;
      assertDoesNotThrow(() -> BootstrapCheck.check(infos, W, rank, false));
    }
  }

  @Test
  void sameGpuIndexWithoutUuidOnOneHost() {
    List<RankInfo> infos = RankInfos.world(W);
    for (int r = 0; r < W; r++) {
      infos.set(r, RankInfos.with(infos.get(r), b -> b.gpuUuid = ""));
    }
    assertDoesNotThrow(() -> BootstrapCheck.check(infos, W, 0));
    infos.set(3, RankInfos.with(infos.get(3), b -> b.gpuId = "0"));
    assertMessage("ranks 2 and 3 both use GPU 0 on host host1", failsOnEveryRank(infos, W));
  }

  @Test
  void sameGpuOnDifferentHostsOrWithHostBackendIsFine() {
    // Fixture: host0 and host1 both have GPUs 0 and 1 (same index, different hosts).
    assertDoesNotThrow(() -> BootstrapCheck.check(RankInfos.world(W), W, 0));
    List<RankInfo> infos = RankInfos.world(2);
    for (int r = 0; r < 2; r++) {
      infos.set(
          r,
          RankInfos.with(
              infos.get(r),
              b -> {
                b.backend = Backend.HOST;
                b.gpuId = "0";
                b.gpuUuid = "same";
              }));
    }
    assertDoesNotThrow(() -> BootstrapCheck.check(infos, 2, 1));
  }

  @Test
  void cudaRanksSendTheirHandlesAndSpanUniformHosts() {
    // The fixture's cuda world: ranks 0, 1 on host0 and 2, 3 on host1.
    HostLayout two = BootstrapCheck.checkCudaReachable(RankInfos.world(W), 1);
    assertArrayEquals(new int[] {0, 0, 1, 1}, two.hostIds());
    List<RankInfo> missing = RankInfos.worldWith(W, 1, b -> b.ipcHandles = new byte[0]);
    BackendUnavailableException e =
        assertThrows(
            BackendUnavailableException.class, () -> BootstrapCheck.checkCudaReachable(missing, 1));
    assertTrue(e.getMessage().contains("rank 1 runs the cuda backend but sent no symmetric-memory handle"), e.getMessage());
    List<RankInfo> uneven = RankInfos.worldWith(W, 1, b -> b.host = "host1");
    e =
        assertThrows(
            BackendUnavailableException.class, () -> BootstrapCheck.checkCudaReachable(uneven, 1));
    assertTrue(e.getMessage().contains("same number of ranks on every host: host host1 runs 3 and host host0 1"), e.getMessage());
    List<RankInfo> hostBackend = RankInfos.worldWith(W, 0, b -> {});
    for (int r = 0; r < W; r++) {
      hostBackend.set(r, RankInfos.with(hostBackend.get(r), b -> b.backend = Backend.HOST));
    }
    assertEquals(1, BootstrapCheck.checkCudaReachable(hostBackend, 2).hosts());
  }

  @Test
  void cudaRankWithoutGpu() {
    CommunicatorException e =
        failsOnEveryRank(
            RankInfos.worldWith(
                W,
                3,
                b -> {
                  b.gpuId = "";
                  b.gpuUuid = "";
                }),
            W);
    assertMessage("rank 3 runs the cuda backend but reported no GPU", e);
  }

  @Test
  void firstProblemInFixedOrderIsReported() {
    // Rank 3 has a wrong token and rank 1 a wrong fingerprint: the token check comes first.
    List<RankInfo> infos = RankInfos.worldWith(W, 1, b -> b.fingerprint = 5);
    infos.set(3, RankInfos.with(infos.get(3), b -> b.jobToken = 1));
    assertMessage("rank 3's job token", failsOnEveryRank(infos, W));
  }

  @Test
  void badArguments() {
    List<RankInfo> infos = RankInfos.world(2);
    assertThrows(IllegalArgumentException.class, () -> BootstrapCheck.check(infos, 2, 2));
    assertThrows(IllegalArgumentException.class, () -> BootstrapCheck.check(infos, 0, 0));
    assertThrows(IllegalArgumentException.class, () -> BootstrapCheck.check(infos, 2, -1));
  }
}
