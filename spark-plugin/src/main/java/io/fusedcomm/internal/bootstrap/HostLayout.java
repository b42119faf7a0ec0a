package io.fusedcomm.internal.bootstrap;

import io.fusedcomm.errors.BackendUnavailableException;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.StringJoiner;

/**
 * Which host each rank of a cuda communicator is on. Ranks of one host share symmetric memory
 * (NVLink through CUDA IPC); ranks on different hosts reach their counterparts (the ranks with
 * the same position on the other hosts) through the GPU-driven proxy and the transport. Hosts
 * are numbered in the order of their lowest rank; ranks need not be contiguous per host (Spark
 * places barrier tasks freely), but every host must hold the same number of ranks.
 *
 * <p>With {@code spark.fusedcomm.cuda.virtualHosts} = V greater than 1, the ranks of each host,
 * in rank order, are split into V consecutive groups, each then treated as a host of its own:
 * the path between hosts, exercised on one machine.
 *
 * <p>Every rank computes the layout from the same bootstrap blobs, so a refusal is the same
 * exception on every rank.
 */
public final class HostLayout {
  /** The most hosts one communicator spans (the proxy collectives' limit, kernels/proxy/proxy.h). */
  public static final int MAX_HOSTS = 8;

  private final int[] hostOf;
  private final List<String> names;  // by host id

  private HostLayout(int[] hostOf, List<String> names) {
    this.hostOf = hostOf;
    this.names = List.copyOf(names);
  }

  /** {@code world} ranks on one host (the host backend, which never uses the layout). */
  public static HostLayout oneHost(int world) {
    return new HostLayout(new int[world], List.of("(all)"));
  }

  /**
   * The layout of {@code infos} (by rank) with each host split into {@code virtualHosts}.
   *
   * @throws BackendUnavailableException when hosts hold different numbers of ranks, when {@code
   *     virtualHosts} does not divide a host's rank count, or past {@link #MAX_HOSTS} hosts
   */
  public static HostLayout of(List<RankInfo> infos, int virtualHosts) {
    if (virtualHosts < 1) {
      throw new IllegalArgumentException("virtualHosts must be at least 1, got " + virtualHosts);
    }
    Map<String, List<Integer>> ranksOf = new LinkedHashMap<>();  // in order of lowest rank
    for (int r = 0; r < infos.size(); r++) {
      ranksOf.computeIfAbsent(infos.get(r).host(), h -> new ArrayList<>()).add(r);
    }
    int[] hostOf = new int[infos.size()];
    List<String> names = new ArrayList<>();
    int perHost = -1;  // ranks per (virtual) host, from the first host
    for (Map.Entry<String, List<Integer>> e : ranksOf.entrySet()) {
      List<Integer> ranks = e.getValue();
      if (ranks.size() % virtualHosts != 0) {
        throw new BackendUnavailableException(
            "spark.fusedcomm.cuda.virtualHosts="
                + virtualHosts
                + " does not divide the "
                + ranks.size()
                + " ranks on host "
                + e.getKey()
                + "; choose a divisor of every host's rank count");
      }
      int per = ranks.size() / virtualHosts;
      String first = virtualHosts == 1 ? e.getKey() : e.getKey() + "/0";
      if (perHost >= 0 && per != perHost) {
        throw new BackendUnavailableException(
            "the cuda backend needs the same number of ranks on every host: host "
                + first
                + " runs "
                + per
                + " and host "
                + names.get(0)
                + " "
                + perHost
                + "; give every host the same number of executors, or use"
                + " spark.fusedcomm.backend=host");
      }
      perHost = per;
      for (int v = 0; v < virtualHosts; v++) {
        names.add(virtualHosts == 1 ? e.getKey() : e.getKey() + "/" + v);
        for (int i = v * per; i < (v + 1) * per; i++) {
          hostOf[ranks.get(i)] = names.size() - 1;
        }
      }
    }
    if (names.size() > MAX_HOSTS) {
      throw new BackendUnavailableException(
          "the cuda backend connects at most "
              + MAX_HOSTS
              + " hosts, this communicator spans "
              + names.size());
    }
    return new HostLayout(hostOf, names);
  }

  /** Rank r's host id, 0..{@link #hosts()}-1 (a copy). */
  public int[] hostIds() {
    return hostOf.clone();
  }

  /** Number of (virtual) hosts. */
  public int hosts() {
    return names.size();
  }

  /** Ranks on each host. */
  public int ranksPerHost() {
    return hostOf.length / hosts();
  }

  /** "2 host(s) x 2 rank(s): a = ranks 0 2; b = ranks 1 3", for logs. */
  @Override
  public String toString() {
    StringJoiner all = new StringJoiner("; ", hosts() + " host(s) x " + ranksPerHost() + " rank(s): ", "");
    for (int h = 0; h < hosts(); h++) {
      StringJoiner ranks = new StringJoiner(" ", names.get(h) + " = ranks ", "");
      for (int r = 0; r < hostOf.length; r++) {
        if (hostOf[r] == h) {
          ranks.add(Integer.toString(r));
        }
      }
      all.add(ranks.toString());
    }
    return all.toString();
  }
}
