package io.fusedcomm.internal.bootstrap;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.fusedcomm.errors.BackendUnavailableException;
import java.util.ArrayList;
import java.util.List;
import org.junit.jupiter.api.Test;

class HostLayoutTest {
  /** A world whose rank r runs on hosts[r]. */
  private static List<RankInfo> on(String... hosts) {
    List<RankInfo> out = new ArrayList<>();
    for (int r = 0; r < hosts.length; r++) {
      final String h = hosts[r];
      out.add(RankInfos.with(RankInfos.rank(r, hosts.length), b -> b.host = h));
    }
    return out;
  }

  @Test
  void hostsAreNumberedByTheirLowestRankAndNeedNotBeContiguous() {
    HostLayout l = HostLayout.of(on("b", "a", "b", "a"), 1);
    assertArrayEquals(new int[] {0, 1, 0, 1}, l.hostIds());
    assertEquals(2, l.hosts());
    assertEquals(2, l.ranksPerHost());
    assertEquals("2 host(s) x 2 rank(s): b = ranks 0 2; a = ranks 1 3", l.toString());
  }

  @Test
  void oneHostIsOneHost() {
    HostLayout l = HostLayout.of(on("a", "a", "a"), 1);
    assertArrayEquals(new int[] {0, 0, 0}, l.hostIds());
    assertEquals(1, l.hosts());
    assertArrayEquals(new int[] {0, 0}, HostLayout.oneHost(2).hostIds());
  }

  @Test
  void virtualHostsSplitEachHostsRanksInRankOrder() {
    HostLayout l = HostLayout.of(on("a", "a", "a", "a"), 2);
    assertArrayEquals(new int[] {0, 0, 1, 1}, l.hostIds());
    assertEquals("2 host(s) x 2 rank(s): a/0 = ranks 0 1; a/1 = ranks 2 3", l.toString());
    // Two machines, interleaved ranks, each split in two: four hosts of one rank.
    l = HostLayout.of(on("a", "b", "a", "b"), 2);
    assertArrayEquals(new int[] {0, 2, 1, 3}, l.hostIds());
    assertEquals(4, l.hosts());
  }

  @Test
  void refusesWhatTheCudaBackendCannotConnect() {
    BackendUnavailableException e =
        assertThrows(BackendUnavailableException.class, () -> HostLayout.of(on("a", "a", "b"), 1));
    assertTrue(e.getMessage().contains("host b runs 1 and host a 2"), e.getMessage());
    e = assertThrows(BackendUnavailableException.class, () -> HostLayout.of(on("a", "a", "a"), 2));
    assertTrue(e.getMessage().contains("virtualHosts=2 does not divide the 3 ranks on host a"), e.getMessage());
    String[] nine = new String[9];
    for (int r = 0; r < 9; r++) {
      nine[r] = "h" + r;
    }
    e = assertThrows(BackendUnavailableException.class, () -> HostLayout.of(on(nine), 1));
    assertTrue(e.getMessage().contains("at most 8 hosts, this communicator spans 9"), e.getMessage());
    assertThrows(IllegalArgumentException.class, () -> HostLayout.of(on("a"), 0));
  }
}
