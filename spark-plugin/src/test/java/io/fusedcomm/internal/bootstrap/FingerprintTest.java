package io.fusedcomm.internal.bootstrap;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.charset.StandardCharsets;
import org.junit.jupiter.api.Test;

class FingerprintTest {

  private static Fingerprint agGemm(long m) {
    return Fingerprint.builder("allGatherGemm")
        .add("dtype", "bf16")
        .addShape("A", m, 1024)
        .addShape("W", 256, 1024)
        .add("world", 4)
        .add("gatherA", true)
        .build();
  }

  @Test
  void fnv1aTestVectors() {
    // Published FNV-1a 64-bit test vectors.
    assertEquals(0xcbf29ce484222325L, Fingerprint.fnv1a64(new byte[0]));
    assertEquals(0xaf63dc4c8601ec8cL, Fingerprint.fnv1a64("a".getBytes(StandardCharsets.UTF_8)));
    assertEquals(0x85944171f73967e8L, Fingerprint.fnv1a64("foobar".getBytes(StandardCharsets.UTF_8)));
  }

  @Test
  void descriptionAndStableValue() {
    Fingerprint f = agGemm(512);
    assertEquals(
        "allGatherGemm: dtype=bf16; A=512x1024; W=256x1024; world=4; gatherA=true",
        f.description());
    assertEquals(Fingerprint.fnv1a64(f.description().getBytes(StandardCharsets.UTF_8)), f.value());
    // Pinned: a change here breaks mixed-version detection and must come with a blob version bump.
    assertEquals(0xb0f787cd696e62dcL, f.value(), String.format("%016x", f.value()));
    assertEquals(f, agGemm(512));
    assertEquals(f.value(), agGemm(512).value());
  }

  @Test
  void anyParameterChangesTheValue() {
    long base = agGemm(512).value();
    assertNotEquals(base, agGemm(513).value());
    assertNotEquals(
        base,
        Fingerprint.builder("allGatherGemm")
            .add("dtype", "fp32")
            .addShape("A", 512, 1024)
            .addShape("W", 256, 1024)
            .add("world", 4)
            .add("gatherA", true)
            .build()
            .value());
    // Shapes with the same digits but other dims differ.
    assertNotEquals(
        Fingerprint.builder("x").addShape("A", 1, 11).build().value(),
        Fingerprint.builder("x").addShape("A", 11, 1).build().value());
    assertEquals("x: s=scalar", Fingerprint.builder("x").addShape("s").build().description());
    assertEquals("x:", Fingerprint.builder("x").build().description());
  }

  @Test
  void describesDifferences() {
    String d =
        Fingerprint.describeDifference(
            agGemm(256).description(), "rank 1", agGemm(512).description(), "rank 0");
    assertEquals("A is 256x1024 on rank 1 but 512x1024 on rank 0", d);

    String other = Fingerprint.builder("gemmReduceScatter").add("dtype", "bf16").build().description();
    String d2 = Fingerprint.describeDifference(other, "rank 2", agGemm(512).description(), "rank 0");
    assertTrue(d2.contains("the op is gemmReduceScatter on rank 2 but allGatherGemm on rank 0"), d2);
    assertTrue(d2.contains("A is absent on rank 2 but 512x1024 on rank 0"), d2);
    assertEquals("", Fingerprint.describeDifference("a: x=1", "r1", "a: x=1", "r0"));
    assertTrue(Fingerprint.describeDifference("junk", "r1", "a: x=1", "r0").contains("'junk'"));
  }

  @Test
  void reservedCharactersRejected() {
    assertThrows(IllegalArgumentException.class, () -> Fingerprint.builder("a:b"));
    assertThrows(IllegalArgumentException.class, () -> Fingerprint.builder(""));
    assertThrows(IllegalArgumentException.class, () -> Fingerprint.builder("op").add("k;", "v"));
    assertThrows(IllegalArgumentException.class, () -> Fingerprint.builder("op").add("k", "v;w"));
  }
}
