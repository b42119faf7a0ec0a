package io.fusedcomm.config;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.fusedcomm.api.Backend;
import io.fusedcomm.errors.ConfigException;
import java.lang.reflect.Field;
import java.lang.reflect.Modifier;
import java.time.Duration;
import java.util.HashMap;
import java.util.HashSet;
import java.util.Map;
import java.util.Set;
import org.apache.spark.SparkConf;
import org.junit.jupiter.api.Test;

class FusedCommConfTest {

  @Test
  void defaults() {
    FusedCommConf c = FusedCommConf.defaults();
    assertEquals(Backend.AUTO, c.backend());
    assertEquals(Duration.ofSeconds(60), c.timeout());
    assertEquals(Duration.ofSeconds(30), c.connectTimeout());
    assertEquals(TransportKind.AUTO, c.transport());
    assertEquals(LibfabricProvider.AUTO, c.libfabricProvider());
    assertEquals(1, c.libfabricRails());
    assertEquals(Duration.ofSeconds(5), c.libfabricPeerTimeout());
    assertEquals("", c.transportBindHost());
    assertEquals(1L << 20, c.hostChunkBytes());
    assertEquals(2, c.transportStreams());
    assertEquals(Duration.ofMillis(1), c.transportBusyPoll());
    assertEquals("gpu", c.gpuResourceName());
    assertEquals("", c.nativeLibraryPath());
    assertFalse(c.leakTracking());
    assertFalse(c.isSet(FusedCommConf.TIMEOUT));
    assertEquals("60s", FusedCommConf.TIMEOUT.defaultString());
    assertEquals("1m", FusedCommConf.HOST_CHUNK_BYTES.defaultString());
    assertEquals("auto", FusedCommConf.BACKEND.defaultString());
  }

  @Test
  void parsesEveryKey() {
    FusedCommConf c =
        FusedCommConf.fromMap(
            Map.ofEntries(
                Map.entry("spark.fusedcomm.backend", "CUDA"),
                Map.entry("spark.fusedcomm.timeout", "500ms"),
                Map.entry("spark.fusedcomm.connectTimeout", "2m"),
                Map.entry("spark.fusedcomm.transport", "libfabric"),
                Map.entry("spark.fusedcomm.libfabric.provider", "Verbs"),
                Map.entry("spark.fusedcomm.libfabric.rails", "2"),
                Map.entry("spark.fusedcomm.libfabric.peerTimeout", "30s"),
                Map.entry("spark.fusedcomm.transport.bindHost", "10.0.0.7"),
                Map.entry("spark.fusedcomm.transport.streams", "4"),
                Map.entry("spark.fusedcomm.transport.busyPoll", "250us"),
                Map.entry("spark.fusedcomm.host.chunkBytes", "64k"),
                Map.entry("spark.fusedcomm.gpu.resourceName", "nvidia.com/gpu"),
                Map.entry("spark.fusedcomm.native.libraryPath", "/opt/fc/lib"),
                Map.entry("spark.fusedcomm.debug.leakTracking", "True"),
                Map.entry("spark.executor.cores", "not ours, ignored")));
    assertEquals(Backend.CUDA, c.backend());
    assertEquals(Duration.ofMillis(500), c.timeout());
    assertEquals(Duration.ofMinutes(2), c.connectTimeout());
    assertEquals(TransportKind.LIBFABRIC, c.transport());
    assertEquals(LibfabricProvider.VERBS, c.libfabricProvider());
    assertEquals(2, c.libfabricRails());
    assertEquals(Duration.ofSeconds(30), c.libfabricPeerTimeout());
    assertEquals("10.0.0.7", c.transportBindHost());
    assertEquals(4, c.transportStreams());
    assertEquals(Duration.ofNanos(250_000), c.transportBusyPoll());
    assertEquals(65536L, c.hostChunkBytes());
    assertEquals("nvidia.com/gpu", c.gpuResourceName());
    assertEquals("/opt/fc/lib", c.nativeLibraryPath());
    assertTrue(c.leakTracking());
    assertTrue(c.isSet(FusedCommConf.BACKEND));
    assertEquals(Backend.CUDA, c.get(FusedCommConf.BACKEND));
  }

  @Test
  void plainNumbersAreMillisecondsAndBytes() {
    FusedCommConf c =
        FusedCommConf.fromMap(
            Map.of(
                "spark.fusedcomm.timeout", "1500",
                "spark.fusedcomm.host.chunkBytes", "131072"));
    assertEquals(Duration.ofMillis(1500), c.timeout());
    assertEquals(131072L, c.hostChunkBytes());
  }

  @Test
  void unitSpellingsAreSparks() {
    // The spellings of Spark's own settings (JavaUtils.timeStringAs / byteStringAsBytes).
    assertEquals(Duration.ofHours(1), ConfigEntry.parseDuration(" 1h "));
    assertEquals(Duration.ofMinutes(3), ConfigEntry.parseDuration("3min"));
    assertEquals(Duration.ofSeconds(7), ConfigEntry.parseDuration("7S"));
    assertEquals(Duration.ofDays(2), ConfigEntry.parseDuration("2d"));
    assertEquals(Duration.ofNanos(200_000), ConfigEntry.parseDuration("200us"));
    assertEquals(Duration.ofMillis(1500), ConfigEntry.parseDuration("1500"));
    assertEquals("200us", ConfigEntry.formatDuration(Duration.ofNanos(200_000)));
    assertEquals("1001us", ConfigEntry.formatDuration(Duration.ofNanos(1_001_000)));
    assertEquals("1ms", ConfigEntry.formatDuration(Duration.ofNanos(1_000_000)));
    assertEquals("0ms", ConfigEntry.formatDuration(Duration.ZERO));
    assertEquals("1500ms", ConfigEntry.formatDuration(Duration.ofMillis(1500)));
    assertEquals("120s", ConfigEntry.formatDuration(Duration.ofMinutes(2)));
    assertEquals(1L << 30, ConfigEntry.parseBytes("1g"));
    assertEquals(3L << 20, ConfigEntry.parseBytes("3MB"));
    assertEquals(4L << 40, ConfigEntry.parseBytes("4t"));
    assertEquals(17L, ConfigEntry.parseBytes("17b"));
    assertEquals(1000L, ConfigEntry.parseBytes("1000"));
    assertEquals("1g", ConfigEntry.formatBytes(1L << 30));
    assertEquals("65k", ConfigEntry.formatBytes(65L << 10));
    assertEquals("1000", ConfigEntry.formatBytes(1000));
    // Every formatted value reads back.
    for (long b : new long[] {0, 1, 1000, 65L << 10, 3L << 20, 1L << 30}) {
      assertEquals(b, ConfigEntry.parseBytes(ConfigEntry.formatBytes(b)));
    }
    for (Duration d :
        new Duration[] {Duration.ZERO, Duration.ofNanos(200_000), Duration.ofMillis(1500)}) {
      assertEquals(d, ConfigEntry.parseDuration(ConfigEntry.formatDuration(d)));
    }
    // Spark refuses what it does not read, and so do we.
    assertThrows(IllegalArgumentException.class, () -> ConfigEntry.parseDuration("1.5s"));
    assertThrows(IllegalArgumentException.class, () -> ConfigEntry.parseDuration("7 s"));
    assertThrows(IllegalArgumentException.class, () -> ConfigEntry.parseDuration("5 weeks"));
    assertThrows(IllegalArgumentException.class, () -> ConfigEntry.parseBytes("5KiB"));
    assertThrows(IllegalArgumentException.class, () -> ConfigEntry.parseBytes("1.5g"));
    assertThrows(
        IllegalArgumentException.class, () -> ConfigEntry.parseBytes("99999999999999999g"));
    assertThrows(ArithmeticException.class, () -> ConfigEntry.parseDuration("999999999999999d"));
  }

  @Test
  void badValuesNameKeyValueAndExpectation() {
    ConfigException e = bad("spark.fusedcomm.timeout", "soon");
    assertEquals("spark.fusedcomm.timeout", e.key());
    assertEquals("soon", e.value());
    assertTrue(e.getMessage().contains("'soon'"), e.getMessage());
    assertTrue(e.getMessage().contains("spark.fusedcomm.timeout"), e.getMessage());
    assertTrue(e.getMessage().contains("a duration >= 1ms"), e.getMessage());

    assertTrue(bad("spark.fusedcomm.backend", "gpu").getMessage().contains("auto|cuda|host"));
    assertTrue(bad("spark.fusedcomm.transport", "rdma").getMessage().contains("auto|socket|libfabric"));
    assertTrue(
        bad("spark.fusedcomm.libfabric.provider", "psm3").getMessage().contains("auto|efa|verbs|tcp|shm"));
    assertTrue(bad("spark.fusedcomm.libfabric.rails", "9").getMessage().contains("from 1 to 8"));
    bad("spark.fusedcomm.libfabric.rails", "0");
    assertTrue(bad("spark.fusedcomm.libfabric.peerTimeout", "50ms").getMessage().contains("from 100ms to 10m"));
    bad("spark.fusedcomm.libfabric.peerTimeout", "11m");
    assertTrue(bad("spark.fusedcomm.debug.leakTracking", "yes").getMessage().contains("true or false"));
    assertTrue(bad("spark.fusedcomm.transport.bindHost", "a b").getMessage().contains("host name"));
    assertTrue(bad("spark.fusedcomm.gpu.resourceName", "").getMessage().contains("non-empty"));
    // Overflow is a bad value, not an ArithmeticException.
    bad("spark.fusedcomm.timeout", "999999999999999999h");
  }

  @Test
  void bounds() {
    bad("spark.fusedcomm.timeout", "0s");
    // Timeouts reach the native side in whole milliseconds: below 1ms would be 0.
    bad("spark.fusedcomm.timeout", "999us");
    assertTrue(bad("spark.fusedcomm.transport.busyPoll", "2s").getMessage().contains("from 0 to 1s"));
    assertEquals(
        Duration.ZERO,
        FusedCommConf.fromMap(Map.of("spark.fusedcomm.transport.busyPoll", "0")).transportBusyPoll());
    bad("spark.fusedcomm.connectTimeout", "0");
    ConfigException small = bad("spark.fusedcomm.host.chunkBytes", "32k");
    assertTrue(small.getMessage().contains("between 64k and 1g"), small.getMessage());
    bad("spark.fusedcomm.host.chunkBytes", "2g");
    bad("spark.fusedcomm.host.chunkBytes", "65535");
    assertTrue(bad("spark.fusedcomm.transport.streams", "0").getMessage().contains("from 1 to 4"));
    bad("spark.fusedcomm.transport.streams", "5");
    assertEquals(
        1L << 30,
        FusedCommConf.fromMap(Map.of("spark.fusedcomm.host.chunkBytes", "1g")).hostChunkBytes());
    assertEquals(
        64L << 10,
        FusedCommConf.fromMap(Map.of("spark.fusedcomm.host.chunkBytes", "65536")).hostChunkBytes());
    assertEquals(
        Duration.ofMillis(1),
        FusedCommConf.fromMap(Map.of("spark.fusedcomm.timeout", "1")).timeout());
  }

  @Test
  void typoSuggestsClosestKey() {
    ConfigException e = bad("spark.fusedcomm.timout", "10s");
    assertTrue(e.getMessage().contains("Unknown configuration key spark.fusedcomm.timout"), e.getMessage());
    assertTrue(e.getMessage().contains("did you mean spark.fusedcomm.timeout?"), e.getMessage());
    assertEquals("spark.fusedcomm.timout", e.key());

    assertTrue(
        bad("spark.fusedcomm.connecttimeout", "1s").getMessage()
            .contains("did you mean spark.fusedcomm.connectTimeout?"));
    assertTrue(
        bad("spark.fusedcomm.host.chunkSize", "4m").getMessage()
            .contains("did you mean spark.fusedcomm.host.chunkBytes?"));
    assertTrue(
        bad("spark.fusedcomm.gpu.resource", "gpu").getMessage()
            .contains("did you mean spark.fusedcomm.gpu.resourceName?"));
  }

  @Test
  void unrelatedUnknownKeyListsKnownKeys() {
    ConfigException e = bad("spark.fusedcomm.somethingElseEntirely", "1");
    assertFalse(e.getMessage().contains("did you mean"), e.getMessage());
    for (ConfigEntry<?> entry : FusedCommConf.all()) {
      assertTrue(e.getMessage().contains(entry.key()), e.getMessage());
    }
    assertNull(FusedCommConf.closestKey("spark.fusedcomm.zzzzzzzzzzzzzzzzzzzz"));
  }

  @Test
  void editDistance() {
    assertEquals(0, FusedCommConf.editDistance("abc", "abc"));
    assertEquals(1, FusedCommConf.editDistance("timout", "timeout"));
    assertEquals(3, FusedCommConf.editDistance("kitten", "sitting"));
    assertEquals(4, FusedCommConf.editDistance("", "abcd"));
  }

  @Test
  void fromSparkConf() {
    SparkConf sc =
        new SparkConf(false)
            .set("spark.fusedcomm.backend", "host")
            .set("spark.fusedcomm.timeout", "5s")
            .set("spark.app.name", "x");
    FusedCommConf c = FusedCommConf.fromSparkConf(sc);
    assertEquals(Backend.HOST, c.backend());
    assertEquals(Duration.ofSeconds(5), c.timeout());

    SparkConf typo = new SparkConf(false).set("spark.fusedcomm.backnd", "host");
    ConfigException e = assertThrows(ConfigException.class, () -> FusedCommConf.fromSparkConf(typo));
    assertTrue(e.getMessage().contains("did you mean spark.fusedcomm.backend?"), e.getMessage());
  }

  @Test
  void toMapRoundTripsAndListsEveryKey() {
    Map<String, String> in = new HashMap<>();
    in.put("spark.fusedcomm.timeout", "2m");
    in.put("spark.fusedcomm.host.chunkBytes", "1048576");
    in.put("spark.fusedcomm.backend", "Host");
    FusedCommConf c = FusedCommConf.fromMap(in);
    Map<String, String> out = c.toMap();
    assertEquals(FusedCommConf.all().size(), out.size());
    assertEquals("120s", out.get("spark.fusedcomm.timeout"));
    assertEquals("1m", out.get("spark.fusedcomm.host.chunkBytes"));
    assertEquals("host", out.get("spark.fusedcomm.backend"));
    assertEquals("30s", out.get("spark.fusedcomm.connectTimeout"));
    assertEquals(c, FusedCommConf.fromMap(out));
    assertEquals(c.hashCode(), FusedCommConf.fromMap(out).hashCode());
    assertEquals(FusedCommConf.defaults(), FusedCommConf.fromMap(FusedCommConf.defaults().toMap()));
  }

  @Test
  void everyDeclaredEntryIsRegisteredOnceAndDocumented() throws Exception {
    Set<ConfigEntry<?>> declared = new HashSet<>();
    for (Field f : FusedCommConf.class.getDeclaredFields()) {
      if (Modifier.isStatic(f.getModifiers()) && f.getType() == ConfigEntry.class) {
        declared.add((ConfigEntry<?>) f.get(null));
      }
    }
    assertEquals(declared, new HashSet<>(FusedCommConf.all()));
    for (ConfigEntry<?> e : FusedCommConf.all()) {
      assertTrue(e.key().startsWith(FusedCommConf.PREFIX), e.key());
      assertFalse(e.doc().isBlank(), e.key() + " has no doc");
      assertEquals(e, FusedCommConf.entry(e.key()));
      // Every default survives its own format/parse round trip.
      assertEquals(e.defaultValue(), e.parse(e.defaultString()), e.key());
    }
  }

  @Test
  void getOfForeignEntryFails() {
    ConfigEntry<String> foreign =
        ConfigEntry.builder("spark.fusedcomm.notDeclared").doc("x").stringConf().createWithDefault("");
    assertThrows(IllegalArgumentException.class, () -> FusedCommConf.defaults().get(foreign));
  }

  @Test
  void defaultViolatingBoundsIsAProgrammingError() {
    assertThrows(
        IllegalStateException.class,
        () ->
            ConfigEntry.builder("spark.fusedcomm.x")
                .doc("x")
                .bytesConf()
                .check(b -> b > 10, "> 10")
                .createWithDefault(1L));
  }

  private static ConfigException bad(String key, String value) {
    return assertThrows(ConfigException.class, () -> FusedCommConf.fromMap(Map.of(key, value)));
  }
}
