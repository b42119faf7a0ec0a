package io.fusedcomm.internal.bootstrap;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.fusedcomm.api.Backend;
import io.fusedcomm.errors.CommunicatorException;
import java.util.Arrays;
import java.util.Base64;
import java.util.List;
import java.util.Random;
import org.junit.jupiter.api.Test;

class RankInfoCodecTest {

  @Test
  void roundTrip() {
    RankInfo info = RankInfos.rank(3, 4);
    String blob = RankInfoCodec.encode(info);
    RankInfo back = RankInfoCodec.decode(blob);
    assertEquals(info, back);
    assertArrayEquals(new byte[] {1, 2, 3}, back.ipcHandles());
    assertEquals(info.hashCode(), back.hashCode());
  }

  @Test
  void roundTripExtremesAndUnicode() {
    byte[] ipc = new byte[70_000];
    new Random(1).nextBytes(ipc);
    RankInfo info =
        new RankInfo(
            RankInfoCodec.VERSION,
            "hôst-\u6771\u4eac",
            "",
            "",
            "",
            Backend.HOST,
            "[::1]:65535",
            Long.MIN_VALUE,
            -1L,
            RankInfos.share(0xbf),
            Integer.MAX_VALUE,
            Integer.MAX_VALUE - 1,
            Long.MAX_VALUE,
            "",
            ipc);
    assertEquals(info, RankInfoCodec.decode(RankInfoCodec.encode(info)));
  }

  @Test
  void decodeAllKeepsOrder() {
    List<RankInfo> world = RankInfos.world(3);
    String[] blobs = world.stream().map(RankInfoCodec::encode).toArray(String[]::new);
    assertEquals(world, RankInfoCodec.decodeAll(blobs));
  }

  @Test
  void recordCopiesIpcHandles() {
    byte[] ipc = {9, 9};
    RankInfo info = RankInfos.with(RankInfos.rank(0, 1), b -> b.ipcHandles = ipc);
    ipc[0] = 0;
    assertEquals(9, info.ipcHandles()[0]);
    info.ipcHandles()[1] = 0;
    assertEquals(9, info.ipcHandles()[1]);
    assertTrue(!info.toString().contains(Long.toString(RankInfos.TOKEN)), info.toString());
  }

  @Test
  void authShareIsCopiedCheckedAndNeverPrinted() {
    byte[] share = RankInfos.share(5);
    RankInfo info = RankInfos.with(RankInfos.rank(0, 1), b -> b.authShare = share);
    share[0] = 0;
    assertEquals(0x45, info.authShare()[0]);
    info.authShare()[1] = 0;
    assertEquals(0x45, info.authShare()[1]);
    assertArrayEquals(RankInfos.share(5), RankInfoCodec.decode(RankInfoCodec.encode(info)).authShare());
    assertTrue(!info.toString().contains("EEEE"), info.toString());
    IllegalArgumentException e =
        assertThrows(
            IllegalArgumentException.class,
            () -> RankInfos.with(RankInfos.rank(0, 1), b -> b.authShare = new byte[31]));
    assertTrue(e.getMessage().contains("32 bytes"), e.getMessage());
    RankInfo other = RankInfos.with(RankInfos.rank(0, 2), b -> b.authShare = RankInfos.share(9));
    assertTrue(!RankInfos.rank(0, 2).equals(other), "the share takes part in equals");
  }

  @Test
  void everyTruncationIsReported() {
    byte[] full = Base64.getDecoder().decode(RankInfoCodec.encode(RankInfos.rank(1, 2)));
    for (int len = 0; len < full.length; len++) {
      String cut = Base64.getEncoder().encodeToString(Arrays.copyOf(full, len));
      CommunicatorException e =
          assertThrows(CommunicatorException.class, () -> RankInfoCodec.decode(cut), "len " + len);
      assertTrue(
          e.getMessage().contains("truncated") || e.getMessage().contains("too short"),
          "len " + len + ": " + e.getMessage());
    }
  }

  @Test
  void truncationNamesFieldAndTask() {
    byte[] full = Base64.getDecoder().decode(RankInfoCodec.encode(RankInfos.rank(1, 2)));
    String cut = Base64.getEncoder().encodeToString(Arrays.copyOf(full, full.length - 2));
    String ok = RankInfoCodec.encode(RankInfos.rank(0, 2));
    CommunicatorException e =
        assertThrows(
            CommunicatorException.class, () -> RankInfoCodec.decodeAll(new String[] {ok, cut}));
    assertTrue(e.getMessage().contains("barrier task 1"), e.getMessage());
    assertTrue(e.getMessage().contains("field ipcHandles"), e.getMessage());
    assertEquals("bootstrap", e.op().orElseThrow());
  }

  @Test
  void badVersion() {
    byte[] b = Base64.getDecoder().decode(RankInfoCodec.encode(RankInfos.rank(0, 1)));
    b[2] = 1;
    CommunicatorException e =
        assertThrows(
            CommunicatorException.class,
            () -> RankInfoCodec.decode(Base64.getEncoder().encodeToString(b)));
    assertTrue(e.getMessage().contains("version 1"), e.getMessage());
    assertTrue(e.getMessage().contains("same fusedcomm jar"), e.getMessage());
  }

  @Test
  void badMagicBase64TrailingBytesAndBackend() {
    byte[] b = Base64.getDecoder().decode(RankInfoCodec.encode(RankInfos.rank(0, 1)));
    byte[] magic = b.clone();
    magic[0] = 'X';
    assertMessage("not a fusedcomm rank blob", Base64.getEncoder().encodeToString(magic));
    assertMessage("not valid Base64", "%%%not-base64");
    assertMessage("missing", null);

    byte[] trailing = Arrays.copyOf(b, b.length + 3);
    assertMessage("3 unexpected bytes", Base64.getEncoder().encodeToString(trailing));

    // host, executorId, gpuId, gpuUuid are each a 1-byte length then bytes: find the backend byte.
    int pos = 3;
    for (int i = 0; i < 4; i++) {
      pos += 1 + b[pos];
    }
    byte[] backend = b.clone();
    backend[pos] = 9;
    assertMessage("unknown backend code 9", Base64.getEncoder().encodeToString(backend));
  }

  @Test
  void malformedVarint() {
    // magic, version, then a host length varint that never ends.
    byte[] b = {
      'F', 'C', RankInfoCodec.VERSION, (byte) 0xff, (byte) 0xff, (byte) 0xff, (byte) 0xff, (byte) 0xff, 0
    };
    assertMessage("malformed number in field host", Base64.getEncoder().encodeToString(b));
  }

  @Test
  void encodeRejectsWrongVersion() {
    RankInfo info = RankInfos.with(RankInfos.rank(0, 1), b -> b.blobVersion = 7);
    assertThrows(IllegalArgumentException.class, () -> RankInfoCodec.encode(info));
  }

  private static void assertMessage(String expected, String blob) {
    CommunicatorException e =
        assertThrows(CommunicatorException.class, () -> RankInfoCodec.decode(blob));
    assertTrue(e.getMessage().contains(expected), e.getMessage());
  }
}
