package io.fusedcomm.internal.bootstrap;

import io.fusedcomm.api.Backend;
import io.fusedcomm.errors.BackendUnavailableException;
import io.fusedcomm.errors.CommunicatorException;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

/**
 * Validates the gathered {@link RankInfo}s of all ranks before a communicator is built.
 *
 * <p>Every rank runs this on the same gathered list, and the checks depend only on that list and
 * the expected world size, so every rank fails identically: same exception type, same message.
 * Checks run in a fixed order and the first failure is reported, naming the offending rank (also
 * set as the exception's {@code rank}, with op {@code bootstrap}):
 *
 * <ol>
 *   <li>the number of blobs equals the expected world size;
 *   <li>every rank expects that world size;
 *   <li>every barrier task claims its own partition id as rank, no rank twice;
 *   <li>every rank has rank 0's job token (same application);
 *   <li>every rank has rank 0's communicator nonce (same communicator instance);
 *   <li>every rank requested the same op parameters (fingerprint), naming what differs;
 *   <li>every rank runs the same resolved backend;
 *   <li>with the cuda backend, no two ranks on one host use the same GPU.
 * </ol>
 */
public final class BootstrapCheck {
  private static final String OP = "bootstrap";

  private BootstrapCheck() {}

  /**
   * Validates the gathered infos.
   *
   * @param infos every rank's info, in barrier task (partition id) order
   * @param expectedWorld the world size of the barrier stage
   * @param myRank the calling rank (only checked for range: the outcome does not depend on it)
   * @throws CommunicatorException on the first mismatch, with the same message on every rank
   * @throws IllegalArgumentException if {@code expectedWorld} or {@code myRank} is out of range
   */
  public static void check(List<RankInfo> infos, int expectedWorld, int myRank) {
    check(infos, expectedWorld, myRank, true);
  }

  /**
   * As {@link #check(List, int, int)}; {@code distinctGpus} false skips the one-GPU-per-rank rule
   * ({@code spark.fusedcomm.cuda.shareGpu}, testing only).
   */
  public static void check(List<RankInfo> infos, int expectedWorld, int myRank, boolean distinctGpus) {
    if (expectedWorld < 1 || myRank < 0 || myRank >= expectedWorld) {
      throw new IllegalArgumentException(
          "bad world size " + expectedWorld + " or rank " + myRank + " for bootstrap check");
    }
    if (infos.size() != expectedWorld) {
      throw fail(
          CommunicatorException.UNKNOWN,
          "the barrier stage gathered "
              + infos.size()
              + " rank blobs but the communicator expects world size "
              + expectedWorld);
    }
    for (int i = 0; i < expectedWorld; i++) {
      int w = infos.get(i).world();
      if (w != expectedWorld) {
        throw fail(
            i,
            "barrier task "
                + i
                + " asked for world size "
                + w
                + " but the barrier stage has "
                + expectedWorld
                + " tasks");
      }
    }
    checkRanks(infos, expectedWorld);

    RankInfo first = infos.get(0);
    for (int i = 1; i < expectedWorld; i++) {
      if (infos.get(i).jobToken() != first.jobToken()) {
        throw fail(
            i,
            "rank "
                + i
                + "'s job token differs from rank 0's: the tasks belong to different"
                + " applications or fusedcomm plugin instances (every executor must load"
                + " spark.plugins=io.fusedcomm.FusedCommPlugin of the same application)");
      }
    }
    for (int i = 1; i < expectedWorld; i++) {
      if (infos.get(i).commNonce() != first.commNonce()) {
        throw fail(
            i,
            "rank "
                + i
                + "'s communicator nonce differs from rank 0's: the tasks were set up for"
                + " different communicators (different stages or stage attempts)");
      }
    }
    for (int i = 1; i < expectedWorld; i++) {
      RankInfo r = infos.get(i);
      if (r.fingerprint() != first.fingerprint()) {
        String diff =
            Fingerprint.describeDifference(
                r.opDescription(), "rank " + i, first.opDescription(), "rank 0");
        if (diff.isEmpty()) {
          diff =
              String.format(
                  "fingerprint %016x on rank %d but %016x on rank 0 for '%s'",
                  r.fingerprint(), i, first.fingerprint(), first.opDescription());
        }
        throw fail(i, "rank " + i + "'s op parameters differ from rank 0's: " + diff);
      }
    }
    for (int i = 0; i < expectedWorld; i++) {
      RankInfo r = infos.get(i);
      if (!r.backend().isResolved()) {
        throw fail(i, "rank " + i + " did not resolve its backend (it sent 'auto')");
      }
      if (r.backend() != first.backend()) {
        throw fail(
            i,
            "mixed backends: rank "
                + i
                + " runs "
                + r.backend()
                + " but rank 0 runs "
                + first.backend()
                + "; give every executor a GPU, or set spark.fusedcomm.backend explicitly so"
                + " all executors use the same backend");
      }
    }
    if (distinctGpus) {
      checkDistinctGpus(infos);
    }
  }

  /**
   * What the cuda backend can connect, after {@link #check} passed: every rank with its
   * symmetric-memory handle, and a {@link HostLayout} it supports (the same number of ranks on
   * every host, at most {@link HostLayout#MAX_HOSTS} hosts). The same exception on every rank.
   *
   * @param virtualHosts {@code spark.fusedcomm.cuda.virtualHosts}
   * @return the layout; every rank on host 0 with the host backend
   * @throws BackendUnavailableException naming the rank or host that cannot be connected
   */
  public static HostLayout checkCudaReachable(List<RankInfo> infos, int virtualHosts) {
    RankInfo first = infos.get(0);
    if (first.backend() != Backend.CUDA) {
      return HostLayout.oneHost(infos.size());
    }
    for (int i = 0; i < infos.size(); i++) {
      if (infos.get(i).ipcHandles().length == 0) {
        throw new BackendUnavailableException(
            "rank " + i + " runs the cuda backend but sent no symmetric-memory handle");
      }
    }
    return HostLayout.of(infos, virtualHosts);
  }

  private static void checkRanks(List<RankInfo> infos, int world) {
    Map<Integer, Integer> claimedBy = new HashMap<>();
    for (int i = 0; i < world; i++) {
      int r = infos.get(i).rank();
      if (r < 0 || r >= world) {
        throw fail(
            i, "barrier task " + i + " claims rank " + r + ", outside 0.." + (world - 1));
      }
      Integer other = claimedBy.putIfAbsent(r, i);
      if (other != null) {
        throw fail(i, "barrier tasks " + other + " and " + i + " both claim rank " + r);
      }
    }
    for (int i = 0; i < world; i++) {
      int r = infos.get(i).rank();
      if (r != i) {
        throw fail(
            i,
            "barrier task "
                + i
                + " claims rank "
                + r
                + "; a rank must equal its barrier task's partition id");
      }
    }
  }

  private static void checkDistinctGpus(List<RankInfo> infos) {
    Map<String, Integer> owner = new HashMap<>();
    for (int i = 0; i < infos.size(); i++) {
      RankInfo r = infos.get(i);
      if (r.backend() != Backend.CUDA) {
        continue;
      }
      // The UUID names the physical GPU; the index only where no UUID was reported.
      String gpu = !r.gpuUuid().isEmpty() ? r.gpuUuid() : r.gpuId();
      if (gpu.isEmpty()) {
        throw fail(i, "rank " + i + " runs the cuda backend but reported no GPU");
      }
      Integer other = owner.putIfAbsent(r.host() + '\0' + gpu, i);
      if (other != null) {
        RankInfo o = infos.get(other);
        throw fail(
            i,
            "ranks "
                + other
                + " and "
                + i
                + " both use GPU "
                + gpu
                + " on host "
                + r.host()
                + " (executors "
                + o.executorId()
                + " and "
                + r.executorId()
                + "); every executor needs its own GPU: set"
                + " spark.executor.resource.gpu.amount=1 with a discovery script that hands"
                + " each executor on a host a different GPU (conf/gpu-discovery.sh)");
      }
    }
  }

  private static CommunicatorException fail(int rank, String detail) {
    return new CommunicatorException(
        detail, rank, CommunicatorException.UNKNOWN, OP, CommunicatorException.UNKNOWN, null);
  }
}
