package io.fusedcomm.config;

import io.fusedcomm.api.Backend;
import io.fusedcomm.errors.ConfigException;
import java.time.Duration;
import java.util.Collections;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Objects;
import java.util.TreeMap;
import org.apache.spark.SparkConf;
import scala.Tuple2;

/**
 * fusedcomm's configuration: every {@code spark.fusedcomm.*} setting declared once, typed, with
 * default and documentation, and an immutable, validated set of values.
 *
 * <p>Creating a {@code FusedCommConf} validates everything up front: an unknown key under {@code
 * spark.fusedcomm.} (with the closest valid key suggested) or a bad value throws {@link
 * ConfigException} naming the key, the value and what is expected. Keys outside the prefix are
 * ignored. {@code docs/configs.md} and {@code conf/spark-defaults.conf.template} are generated
 * from these declarations by {@link ConfigDocs}.
 */
public final class FusedCommConf {
  /** Prefix of every fusedcomm key. */
  public static final String PREFIX = "spark.fusedcomm.";

  private static final long MIN_CHUNK = 64L << 10;
  private static final long MAX_CHUNK = 1L << 30;

  /** {@code spark.fusedcomm.backend}: which implementation runs the ops. */
  public static final ConfigEntry<Backend> BACKEND =
      ConfigEntry.builder(PREFIX + "backend")
          .doc(
              "Which implementation runs the fused ops. auto: host for now, because"
                  + " MoE and ring attention do not run on the GPU yet (it is to"
                  + " become cuda where the executor has a usable GPU); ask for cuda explicitly."
                  + " cuda: the GPU kernels; on an"
                  + " executor without a usable GPU the barrier tasks fail, saying why. host: the C++ reference"
                  + " backend on the CPU (for testing and as an oracle); never chosen silently"
                  + " where cuda was requested.")
          .enumConf(Backend.class, Backend::configName)
          .createWithDefault(Backend.AUTO);

  /** {@code spark.fusedcomm.timeout}: bound on every wait inside an op. */
  public static final ConfigEntry<Duration> TIMEOUT =
      ConfigEntry.builder(PREFIX + "timeout")
          .doc(
              "Bound on every wait inside an op (GPU flag waits, proxy and transport waits); a"
                  + " dead or stuck peer is reported, naming rank, peer, op and step, within this"
                  + " time.")
          .durationConf()
          .check(FusedCommConf::atLeastOneMs, "a duration >= 1ms such as 60s, 500ms or 2m")
          .createWithDefault(Duration.ofSeconds(60));

  /** {@code spark.fusedcomm.connectTimeout}: bound on building a communicator's connections. */
  public static final ConfigEntry<Duration> CONNECT_TIMEOUT =
      ConfigEntry.builder(PREFIX + "connectTimeout")
          .doc(
              "Bound on building a communicator's connections (transport connects, CUDA IPC"
                  + " handle import) after the barrier bootstrap.")
          .durationConf()
          .check(FusedCommConf::atLeastOneMs, "a duration >= 1ms such as 30s, 500ms or 2m")
          .createWithDefault(Duration.ofSeconds(30));

  /** {@code spark.fusedcomm.transport}: the inter-process transport. */
  public static final ConfigEntry<TransportKind> TRANSPORT =
      ConfigEntry.builder(PREFIX + "transport")
          .doc(
              "Inter-process transport between executors. auto: libfabric where it finds an"
                  + " RDMA provider (efa, or verbs on InfiniBand / RoCE), else socket; each"
                  + " executor logs its choice in the runtime's start-up line. socket: TCP"
                  + " sockets. libfabric: libfabric (1.17 or newer, opened at run time) on"
                  + " spark.fusedcomm.libfabric.provider; an executor where it cannot start"
                  + " fails at start-up with the reason. The same on every executor: a"
                  + " communicator refuses peers of another transport.")
          .enumConf(TransportKind.class, TransportKind::configName)
          .createWithDefault(TransportKind.AUTO);

  /** {@code spark.fusedcomm.libfabric.provider}: the libfabric provider. */
  public static final ConfigEntry<LibfabricProvider> LIBFABRIC_PROVIDER =
      ConfigEntry.builder(PREFIX + "libfabric.provider")
          .doc(
              "The libfabric provider of the libfabric transport. auto: efa where present,"
                  + " else verbs, else tcp. efa: AWS EFA. verbs: InfiniBand or RoCE (verbs;ofi_rxm)."
                  + " tcp: any network (tcp;ofi_rxm). shm: executors of one host only. GPU memory is"
                  + " staged through pinned host memory unless the provider registers GPU memory"
                  + " (FI_HMEM); the runtime's start-up line says which.")
          .enumConf(LibfabricProvider.class, LibfabricProvider::configName)
          .createWithDefault(LibfabricProvider.AUTO);

  /** {@code spark.fusedcomm.libfabric.rails}: NICs per executor for the libfabric transport. */
  public static final ConfigEntry<Integer> LIBFABRIC_RAILS =
      ConfigEntry.builder(PREFIX + "libfabric.rails")
          .doc(
              "NICs (libfabric domains) each executor's libfabric transport opens, in the"
                  + " provider's order; stream s between hosts (spark.fusedcomm.transport.streams)"
                  + " uses NIC s mod rails, so rails above the streams add nothing. An executor"
                  + " whose provider offers fewer NICs fails at start-up, naming the ones it has."
                  + " The same on every executor.")
          .intConf()
          .check(v -> v >= 1 && v <= 8, "a whole number from 1 to 8")
          .createWithDefault(1);

  /** {@code spark.fusedcomm.libfabric.peerTimeout}: when a silent libfabric peer fails. */
  public static final ConfigEntry<Duration> LIBFABRIC_PEER_TIMEOUT =
      ConfigEntry.builder(PREFIX + "libfabric.peerTimeout")
          .doc(
              "How long a peer of the libfabric transport may stay silent before the op waiting"
                  + " on it fails, naming it: libfabric's endpoints have no connection whose end"
                  + " would report a killed executor, so every pair sends a heartbeat (at a fifth"
                  + " of this, at most every 100ms). Silence counts only while the executor"
                  + " itself is reading its endpoint, so its own pauses do not fail its peers;"
                  + " the timeout covers the peer's (a host starved of CPU).")
          .durationConf()
          .check(
              d -> d.compareTo(Duration.ofMillis(100)) >= 0 && d.compareTo(Duration.ofMinutes(10)) <= 0,
              "a duration from 100ms to 10m such as 5s")
          .createWithDefault(Duration.ofSeconds(5));

  /** {@code spark.fusedcomm.transport.bindHost}: the address the transport listens on. */
  public static final ConfigEntry<String> TRANSPORT_BIND_HOST =
      ConfigEntry.builder(PREFIX + "transport.bindHost")
          .doc(
              "Host name or IP address the executor's transport listener binds to and"
                  + " advertises to its peers. Empty: this host's own address (its host name's"
                  + " first non-loopback address, else its first non-loopback IPv4 interface), and"
                  + " only that one. 0.0.0.0 (or ::) listens on every interface, advertising that"
                  + " same address.")
          .stringConf()
          .check(s -> s.equals(s.trim()) && !s.contains(" "), "a host name or IP address, or empty")
          .createWithDefault("");

  /** {@code spark.fusedcomm.transport.streams}: parallel streams between hosts. */
  public static final ConfigEntry<Integer> TRANSPORT_STREAMS =
      ConfigEntry.builder(PREFIX + "transport.streams")
          .doc(
              "Parallel streams per direction between two executors on different hosts (the"
                  + " cuda backend's path between hosts), and the transport's receiving threads."
                  + " Each stream has its own TCP connections, sending thread, receiving thread"
                  + " and GPU block, because one stream moves what one core copies: on one"
                  + " H100 host's loopback, 1 / 2 / 4 streams moved 4.4 / 7.5 / 9.2 GB/s per"
                  + " executor between 2 virtual hosts. An op whose blocks fit in"
                  + " spark.fusedcomm.host.chunkBytes uses one stream. The same on"
                  + " every executor: a communicator between hosts refuses to connect otherwise,"
                  + " naming this setting.")
          .intConf()
          .check(v -> v >= 1 && v <= 4, "a whole number from 1 to 4")
          .createWithDefault(2);

  /** {@code spark.fusedcomm.transport.busyPoll}: how long the threads between hosts poll. */
  public static final ConfigEntry<Duration> TRANSPORT_BUSY_POLL =
      ConfigEntry.builder(PREFIX + "transport.busyPoll")
          .doc(
              "How long the threads that carry an op between hosts (the sending thread and"
                  + " receiving thread of each stream) poll without sleeping: from the moment"
                  + " the op is enqueued until this long after their last traffic. A sleeping"
                  + " thread takes tens of microseconds to wake, several times per op. Costs"
                  + " up to one core per such thread (4 per executor at 2 streams) for the op's"
                  + " time plus this window. 0 turns it off (they sleep whenever idle). Ops"
                  + " replayed from a CUDA graph give no advance notice, so only the window"
                  + " after traffic helps them; the host backend's receiving threads also poll"
                  + " for this window after their traffic.")
          .durationConf()
          .check(
              d -> !d.isNegative() && d.compareTo(Duration.ofSeconds(1)) <= 0,
              "a duration from 0 to 1s such as 1ms or 200us")
          .createWithDefault(Duration.ofMillis(1));

  /** {@code spark.fusedcomm.host.chunkBytes}: host backend staging chunk per peer. */
  public static final ConfigEntry<Long> HOST_CHUNK_BYTES =
      ConfigEntry.builder(PREFIX + "host.chunkBytes")
          .doc(
              "Size of the staging chunk per peer used by the host backend's collectives,"
                  + " and by the cuda backend between hosts, where it is what each of the"
                  + " spark.fusedcomm.transport.streams moves per step; larger chunks mean fewer"
                  + " round trips and more memory: each host-backend communicator holds 4 x world"
                  + " size x (chunk + 512 B) of host memory (8 MiB at world 2 with 1m); a cuda"
                  + " communicator spanning H hosts pins 4 x H x streams chunks per rank (an"
                  + " outbox and an inbox of two steps in flight per host). Between hosts, parts"
                  + " below 1m per stream left too little in flight in measurements on one host's"
                  + " loopback (2 streams: 5.0 GB/s per executor with 512k, 7.5 with 1m, 7.6"
                  + " with 2m). A multiple of 16, the same on every executor: a communicator"
                  + " between hosts refuses to connect otherwise, naming this setting.")
          .bytesConf()
          .check(
              b -> b >= MIN_CHUNK && b <= MAX_CHUNK && b % 16 == 0,
              "a byte size between 64k and 1g, a multiple of 16, e.g. 4m")
          .createWithDefault(1L << 20);

  /** {@code spark.fusedcomm.cuda.symmetricBytes}: the cuda backend's symmetric data area. */
  public static final ConfigEntry<Long> CUDA_SYMMETRIC_BYTES =
      ConfigEntry.builder(PREFIX + "cuda.symmetricBytes")
          .doc(
              "Data area of the cuda backend's symmetric memory per executor GPU: the largest"
                  + " collective input (larger allReduces run in pieces; other ops must fit). The"
                  + " GPU holds twice this plus staging, for the executor's lifetime, and reuses"
                  + " it across barrier stages.")
          .bytesConf()
          .check(
              b -> b >= (1L << 20) && b <= (64L << 30) && b % 4096 == 0,
              "a byte size between 1m and 64g, a multiple of 4k, e.g. 256m")
          .createWithDefault(128L << 20);

  /** {@code spark.fusedcomm.cuda.virtualHosts}: split each host's ranks into virtual hosts. */
  public static final ConfigEntry<Integer> CUDA_VIRTUAL_HOSTS =
      ConfigEntry.builder(PREFIX + "cuda.virtualHosts")
          .doc(
              "Splits the ranks of each host into this many virtual hosts (consecutive ranks"
                  + " of the host, in rank order), which the cuda backend then connects as if"
                  + " they were separate machines: through the GPU-driven proxy and the"
                  + " transport instead of NVLink. For exercising the path between hosts on one"
                  + " machine. Each host's rank count must be a multiple of it; 1: off.")
          .intConf()
          .check(v -> v >= 1 && v <= 8, "a whole number from 1 to 8")
          .createWithDefault(1);

  /** {@code spark.fusedcomm.cuda.shareGpu}: testing only, executors of one host on one GPU. */
  public static final ConfigEntry<Boolean> CUDA_SHARE_GPU =
      ConfigEntry.builder(PREFIX + "cuda.shareGpu")
          .doc(
              "Testing only: lets several executors of one host use the same GPU, which the"
                  + " bootstrap otherwise refuses. With cuda.virtualHosts it runs the path between"
                  + " hosts on a one-GPU machine. Results are correct, timings meaningless.")
          .booleanConf()
          .createWithDefault(false);

  /** {@code spark.fusedcomm.gpu.resourceName}: the Spark resource holding the executor's GPU. */
  public static final ConfigEntry<String> GPU_RESOURCE_NAME =
      ConfigEntry.builder(PREFIX + "gpu.resourceName")
          .doc(
              "Name of the Spark resource that holds the executor's GPU (as in"
                  + " spark.executor.resource.<name>.amount).")
          .stringConf()
          .check(s -> !s.isBlank() && s.equals(s.trim()), "a non-empty resource name such as gpu")
          .createWithDefault("gpu");

  /** {@code spark.fusedcomm.native.libraryPath}: development override of the native library. */
  public static final ConfigEntry<String> NATIVE_LIBRARY_PATH =
      ConfigEntry.builder(PREFIX + "native.libraryPath")
          .doc(
              "Directory holding a libfusedcomm.so to load instead of the copy inside the jar"
                  + " (development). Empty: use the jar's copy.")
          .stringConf()
          .createWithDefault("");

  /** {@code spark.fusedcomm.debug.leakTracking}: report native handles never closed. */
  public static final ConfigEntry<Boolean> DEBUG_LEAK_TRACKING =
      ConfigEntry.builder(PREFIX + "debug.leakTracking")
          .doc(
              "Record the allocation stack of every native handle and report, with that stack,"
                  + " each one that is garbage collected or still open at executor shutdown"
                  + " without having been closed. Costs a stack capture per allocation.")
          .booleanConf()
          .createWithDefault(false);

  private static final List<ConfigEntry<?>> ENTRIES =
      List.of(
          BACKEND,
          TIMEOUT,
          CONNECT_TIMEOUT,
          TRANSPORT,
          LIBFABRIC_PROVIDER,
          LIBFABRIC_RAILS,
          LIBFABRIC_PEER_TIMEOUT,
          TRANSPORT_BIND_HOST,
          TRANSPORT_STREAMS,
          TRANSPORT_BUSY_POLL,
          HOST_CHUNK_BYTES,
          CUDA_SYMMETRIC_BYTES,
          CUDA_VIRTUAL_HOSTS,
          CUDA_SHARE_GPU,
          GPU_RESOURCE_NAME,
          NATIVE_LIBRARY_PATH,
          DEBUG_LEAK_TRACKING);

  private static final Map<String, ConfigEntry<?>> BY_KEY = index(ENTRIES);

  /** Values of every entry, explicit or default. */
  private final Map<ConfigEntry<?>, Object> values;

  /** The explicitly set fusedcomm keys, as given. */
  private final Map<String, String> explicit;

  private FusedCommConf(Map<ConfigEntry<?>, Object> values, Map<String, String> explicit) {
    this.values = values;
    this.explicit = explicit;
  }

  /**
   * The fusedcomm settings of a Spark configuration, validated.
   *
   * @throws ConfigException on an unknown {@code spark.fusedcomm.*} key or a bad value
   */
  public static FusedCommConf fromSparkConf(SparkConf conf) {
    Map<String, String> map = new HashMap<>();
    for (Tuple2<String, String> kv : conf.getAll()) {
      map.put(kv._1(), kv._2());
    }
    return fromMap(map);
  }

  /**
   * The fusedcomm settings of a key/value map, validated; keys outside {@code spark.fusedcomm.}
   * are ignored.
   *
   * @throws ConfigException on an unknown {@code spark.fusedcomm.*} key or a bad value
   */
  public static FusedCommConf fromMap(Map<String, String> settings) {
    // Sorted so that, with several problems, the one reported does not depend on map order.
    Map<String, String> explicit = new TreeMap<>();
    for (Map.Entry<String, String> e : settings.entrySet()) {
      if (e.getKey().startsWith(PREFIX)) {
        explicit.put(e.getKey(), e.getValue());
      }
    }
    Map<ConfigEntry<?>, Object> values = new LinkedHashMap<>();
    for (ConfigEntry<?> entry : ENTRIES) {
      values.put(entry, entry.defaultValue());
    }
    for (Map.Entry<String, String> e : explicit.entrySet()) {
      ConfigEntry<?> entry = BY_KEY.get(e.getKey());
      if (entry == null) {
        throw unknownKey(e.getKey(), e.getValue());
      }
      values.put(entry, entry.parse(e.getValue()));
    }
    return new FusedCommConf(
        Collections.unmodifiableMap(values), Collections.unmodifiableMap(explicit));
  }

  /** A configuration with every setting at its default. */
  public static FusedCommConf defaults() {
    return fromMap(Map.of());
  }

  /** Every declared setting, in documentation order. */
  public static List<ConfigEntry<?>> all() {
    return ENTRIES;
  }

  /** The declared setting with this key, or null. */
  public static ConfigEntry<?> entry(String key) {
    return BY_KEY.get(key);
  }

  /** The value of a setting: the configured one, else its default. */
  public <T> T get(ConfigEntry<T> entry) {
    if (!values.containsKey(entry)) {
      throw new IllegalArgumentException(entry.key() + " is not a declared fusedcomm setting");
    }
    @SuppressWarnings("unchecked")
    T value = (T) values.get(entry);
    return value;
  }

  /** True if the key was set explicitly rather than defaulted. */
  public boolean isSet(ConfigEntry<?> entry) {
    return explicit.containsKey(entry.key());
  }

  /**
   * Every setting, explicit or default, in canonical spelling, keyed by full key, in
   * documentation order. {@code fromMap(toMap())} equals this configuration.
   */
  public Map<String, String> toMap() {
    Map<String, String> out = new LinkedHashMap<>();
    for (ConfigEntry<?> entry : ENTRIES) {
      out.put(entry.key(), formatValue(entry));
    }
    return Collections.unmodifiableMap(out);
  }

  /** The requested backend ({@code auto} is resolved per executor at start-up). */
  public Backend backend() {
    return get(BACKEND);
  }

  /** Bound on every wait inside an op. */
  public Duration timeout() {
    return get(TIMEOUT);
  }

  /** Bound on building a communicator's connections. */
  public Duration connectTimeout() {
    return get(CONNECT_TIMEOUT);
  }

  /** The requested inter-process transport. */
  public TransportKind transport() {
    return get(TRANSPORT);
  }

  /** The libfabric transport's provider. */
  public LibfabricProvider libfabricProvider() {
    return get(LIBFABRIC_PROVIDER);
  }

  /** NICs per executor for the libfabric transport. */
  public int libfabricRails() {
    return get(LIBFABRIC_RAILS);
  }

  /** How long a libfabric peer may stay silent. */
  public Duration libfabricPeerTimeout() {
    return get(LIBFABRIC_PEER_TIMEOUT);
  }

  /** Address the transport binds to; empty for the executor's host. */
  public String transportBindHost() {
    return get(TRANSPORT_BIND_HOST);
  }

  /** Parallel streams per direction between hosts (and the transport's receiving threads). */
  public int transportStreams() {
    return get(TRANSPORT_STREAMS);
  }

  /** How long the threads between hosts poll without sleeping around an op (0: never). */
  public Duration transportBusyPoll() {
    return get(TRANSPORT_BUSY_POLL);
  }

  /** Host backend staging chunk per peer, in bytes. */
  public long hostChunkBytes() {
    return get(HOST_CHUNK_BYTES);
  }

  public long cudaSymmetricBytes() {
    return get(CUDA_SYMMETRIC_BYTES);
  }

  /** Virtual hosts per host for the cuda backend (1: off). */
  public int cudaVirtualHosts() {
    return get(CUDA_VIRTUAL_HOSTS);
  }

  public boolean cudaShareGpu() {
    return get(CUDA_SHARE_GPU);
  }

  /** Name of the Spark resource holding the executor's GPU. */
  public String gpuResourceName() {
    return get(GPU_RESOURCE_NAME);
  }

  /** Directory of a development native library; empty for the jar's copy. */
  public String nativeLibraryPath() {
    return get(NATIVE_LIBRARY_PATH);
  }

  /** Whether native handles record their allocation stacks. */
  public boolean leakTracking() {
    return get(DEBUG_LEAK_TRACKING);
  }

  @Override
  public boolean equals(Object o) {
    return o instanceof FusedCommConf && values.equals(((FusedCommConf) o).values);
  }

  @Override
  public int hashCode() {
    return Objects.hash(values);
  }

  @Override
  public String toString() {
    return "FusedCommConf" + toMap();
  }

  /** Timeouts reach the native side in whole milliseconds. */
  private static boolean atLeastOneMs(Duration d) {
    return d.compareTo(Duration.ofMillis(1)) >= 0;
  }

  private <T> String formatValue(ConfigEntry<T> entry) {
    return entry.format(get(entry));
  }

  private static Map<String, ConfigEntry<?>> index(List<ConfigEntry<?>> entries) {
    Map<String, ConfigEntry<?>> m = new LinkedHashMap<>();
    for (ConfigEntry<?> e : entries) {
      if (m.put(e.key(), e) != null) {
        throw new IllegalStateException("duplicate config key " + e.key());
      }
    }
    return Collections.unmodifiableMap(m);
  }

  private static ConfigException unknownKey(String key, String value) {
    String closest = closestKey(key);
    StringBuilder msg =
        new StringBuilder("Unknown configuration key ")
            .append(key)
            .append(" (value '")
            .append(value)
            .append("')");
    if (closest != null) {
      msg.append("; did you mean ").append(closest).append("?");
    } else {
      msg.append("; fusedcomm knows ").append(String.join(", ", BY_KEY.keySet())).append(".");
    }
    return new ConfigException(msg.toString(), key, value);
  }

  /** The declared key closest to {@code key} in edit distance, if close enough to be a typo. */
  static String closestKey(String key) {
    String suffix = key.substring(PREFIX.length()).toLowerCase(Locale.ROOT);
    String best = null;
    int bestDistance = Integer.MAX_VALUE;
    for (String known : BY_KEY.keySet()) {
      String knownSuffix = known.substring(PREFIX.length()).toLowerCase(Locale.ROOT);
      int d = editDistance(suffix, knownSuffix);
      if (d < bestDistance) {
        bestDistance = d;
        best = known;
      }
    }
    int allowed = Math.max(2, suffix.length() / 3);
    return bestDistance <= allowed ? best : null;
  }

  /** Levenshtein distance, two rows. */
  static int editDistance(String a, String b) {
    int[] prev = new int[b.length() + 1];
    int[] cur = new int[b.length() + 1];
    for (int j = 0; j <= b.length(); j++) {
      prev[j] = j;
    }
    for (int i = 1; i <= a.length(); i++) {
      cur[0] = i;
      for (int j = 1; j <= b.length(); j++) {
        int sub = prev[j - 1] + (a.charAt(i - 1) == b.charAt(j - 1) ? 0 : 1);
        cur[j] = Math.min(sub, Math.min(prev[j] + 1, cur[j - 1] + 1));
      }
      int[] t = prev;
      prev = cur;
      cur = t;
    }
    return prev[b.length()];
  }
}
