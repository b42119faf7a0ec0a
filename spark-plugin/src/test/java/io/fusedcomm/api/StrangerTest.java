package io.fusedcomm.api;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.fusedcomm.errors.CommTimeoutException;
import io.fusedcomm.internal.bootstrap.BootstrapExchange;
import io.fusedcomm.internal.bootstrap.RankInfo;
import io.fusedcomm.internal.bootstrap.RankInfoCodec;
import io.fusedcomm.testing.HostWorld;
import io.fusedcomm.testing.InJvmExchange;
import java.io.IOException;
import java.io.InputStream;
import java.lang.management.ManagementFactory;
import java.net.InetSocketAddress;
import java.net.Socket;
import java.net.SocketTimeoutException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.GeneralSecurityException;
import java.security.MessageDigest;
import java.security.SecureRandom;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicReference;
import java.util.function.Function;
import java.util.stream.Stream;
import javax.crypto.Mac;
import javax.crypto.spec.SecretKeySpec;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/**
 * The two rows of the safety table that strangers on the network caused, from Java, each ending
 * in a refused connection or a clear exception and a live JVM:
 *
 * <ul>
 *   <li>a stranger who sniffed the job token (it used to travel in clear text) dials rank 0 as
 *       rank 1 before the real rank 1: it is refused, the real rank connects, and rank 0's data
 *       goes to it;
 *   <li>thousands of half-open handshakes at an executor's listener: the next communicator
 *       connects and computes, an error path still throws its exception class, the listener
 *       closes the stranger's sockets, and the JVM's fds come back.
 * </ul>
 *
 * <p>The stranger speaks the socket handshake (rdma/socket/wire.h) with the key it can make: the
 * job token without the bootstrap's shares. The same proofs computed with the real key (which
 * this test can take from the blobs) verify, so the refusal is the missing shares', not a
 * mistake of this client; they are computed with the JDK's HmacSHA256, an independent check of
 * the native SHA-256.
 */
class StrangerTest {
  private static final AtomicLong NONCES = new AtomicLong(71_000);

  /** Two host-backend runtimes (5 s timeouts); this test builds their communicators itself. */
  private HostWorld world;
  private ExecutorService threads;

  @BeforeEach
  void start() {
    world = new HostWorld(2, Map.of(), 60_000);
    threads = Executors.newCachedThreadPool();
  }

  @AfterEach
  void stop() {
    threads.shutdownNow();
    world.close();
  }

  // ---- the rows --------------------------------------------------------------------------------

  @Test
  void strangerWithTheSniffedTokenDialingFirstIsRefusedAndTheRealRankConnects() throws Exception {
    AtomicReference<Attempt> attempt = new AtomicReference<>();
    List<InJvmExchange> ex = InJvmExchange.group(2, NONCES.incrementAndGet(), 30_000);
    // Rank 1 lets the stranger dial rank 0 first, between the allGather and its own connect.
    long commId = ex.get(1).commNonce();
    long token = world.runtime(0).jobToken();
    BootstrapExchange rank1 =
        new Interposed(ex.get(1), blobs -> attempt.set(dialFirst(blobs, commId, token)));
    List<float[]> sums = run(List.of(ex.get(0), rank1), StrangerTest::allReduceOfRanks);

    Attempt a = attempt.get();
    assertNotNull(a, "the stranger dialed");
    assertEquals(Wire.CHALLENGE, a.first.kind, "the stranger's hello is challenged: " + a.first);
    assertTrue(
        a.challengeVerifiesWithTheRealKey, "rank 0 proved the real key (this client speaks the protocol)");
    assertFalse(a.challengeVerifiesWithTheTokenOnly, "the sniffed token alone does not make the key");
    assertEquals(Wire.REJECT, a.second.kind, "the stranger's proof is refused: " + a.second);
    assertEquals(Wire.BAD_AUTH, a.second.reason, "because it failed authentication");
    assertEquals(0, a.bytesAfter, "and the stranger gets nothing more before the connection closes");
    for (float[] s : sums) {
      assertArrayEquals(new float[] {3, 30, 300}, s, "rank 0's data reached the real rank 1");
    }
  }

  @Test
  void thousandsOfHalfOpenHandshakesDoNotBreakTheNextCommunicator() throws Exception {
    String listener =
        run(exchanges(), comm -> endpointHost(comm.ranks().get(0).transportAddress())).get(0);
    long baseFds = openFds();
    int wanted = (int) Math.min(4600, (maxFds() - baseFds) / 2 - 200);
    assertTrue(wanted >= 1000, "room for at least 1,000 half-open connections: " + wanted);
    List<Socket> held = new ArrayList<>();
    try {
      String[] hp = splitHostPort(listener);
      for (int i = 0; i < wanted; i++) {
        Socket s = new Socket();
        try {
          s.connect(new InetSocketAddress(hp[0], Integer.parseInt(hp[1])), 2000);
          held.add(s);
        } catch (IOException e) {
          s.close();
        }
      }
      assertTrue(held.size() >= wanted * 9 / 10, "half-open connections: " + held.size() + " of " + wanted);

      // While the stranger holds them: the next communicator connects and computes.
      List<float[]> sums = run(exchanges(), StrangerTest::allReduceOfRanks);
      for (float[] s : sums) {
        assertArrayEquals(new float[] {3, 30, 300}, s);
      }
      // ... and the error path still loads and throws its exception class: rank 1 leaves after
      // the allGather, rank 0 times out naming it.
      List<InJvmExchange> ex = InJvmExchange.group(2, NONCES.incrementAndGet(), 30_000);
      BootstrapExchange leaving = new Interposed(ex.get(1), blobs -> {
        throw new IllegalStateException("rank 1 leaves before it connects");
      });
      List<Outcome<Object>> outcomes = runAll(List.of(ex.get(0), leaving), comm -> null);
      CommTimeoutException timeout = assertInstanceOf(CommTimeoutException.class, outcomes.get(0).error());
      assertTrue(timeout.getMessage().contains("rank 1"), timeout.getMessage());

      // The listener closed every one of the stranger's sockets (at most 128 were ever in a
      // handshake; each is closed 1.5 s after its accept).
      long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(5);
      int closed = 0;
      for (Socket s : held) {
        s.setSoTimeout((int) Math.max(1, TimeUnit.NANOSECONDS.toMillis(deadline - System.nanoTime())));
        closed += closedByPeer(s.getInputStream()) ? 1 : 0;
      }
      assertEquals(held.size(), closed, "the listener closed the stranger's sockets");
    } finally {
      for (Socket s : held) {
        s.close();
      }
    }
    long fds = openFds();
    long end = System.nanoTime() + TimeUnit.SECONDS.toNanos(5);
    while (fds > baseFds + 8 && System.nanoTime() < end) {
      Thread.sleep(50);
      fds = openFds();
    }
    assertTrue(fds <= baseFds + 8, "the JVM's fds came back: " + fds + " (before: " + baseFds + ")");
  }

  // ---- ranks as threads ------------------------------------------------------------------------

  private List<BootstrapExchange> exchanges() {
    return new ArrayList<>(InJvmExchange.group(2, NONCES.incrementAndGet(), 30_000));
  }

  /** Rank r contributes (r + 1) * {1, 10, 100}; the sum is {3, 30, 300} on both ranks. */
  private static float[] allReduceOfRanks(Communicator comm) {
    float k = comm.rank() + 1;
    try (HostTensor in = HostTensor.of(new float[] {k, 10 * k, 100 * k}, DType.F32, 3);
        HostTensor out = HostTensor.allocate(DType.F32, 3)) {
      comm.allReduce(in, out);
      return out.toFloatArray();
    }
  }

  /** One rank's result: the body's value, or what it threw. */
  private record Outcome<T>(T value, RuntimeException error) {}

  /** Builds a communicator per rank on its runtime (a thread each) and runs the body on it. */
  private <T> List<Outcome<T>> runAll(List<? extends BootstrapExchange> ex, Function<Communicator, T> body)
      throws Exception {
    List<Future<Outcome<T>>> futures = new ArrayList<>();
    for (int r = 0; r < ex.size(); r++) {
      final int rank = r;
      futures.add(threads.submit(() -> {
        try (Communicator comm =
            CommBootstrap.bootstrap(world.runtime(rank), ex.get(rank), CommOptions.defaults())) {
          return new Outcome<>(body.apply(comm), null);
        } catch (RuntimeException e) {
          return new Outcome<T>(null, e);
        }
      }));
    }
    List<Outcome<T>> out = new ArrayList<>();
    for (Future<Outcome<T>> f : futures) {
      out.add(f.get(60, TimeUnit.SECONDS));
    }
    return out;
  }

  /** As {@link #runAll}, returning the values; throws the first rank's error. */
  private <T> List<T> run(List<? extends BootstrapExchange> ex, Function<Communicator, T> body)
      throws Exception {
    List<T> values = new ArrayList<>();
    for (Outcome<T> o : runAll(ex, body)) {
      if (o.error() != null) {
        throw o.error();
      }
      values.add(o.value());
    }
    return values;
  }

  /** An exchange that runs {@code after} on the gathered blobs before handing them back. */
  private record Interposed(BootstrapExchange inner, java.util.function.Consumer<String[]> after)
      implements BootstrapExchange {
    @Override
    public int rank() {
      return inner.rank();
    }

    @Override
    public int world() {
      return inner.world();
    }

    @Override
    public long commNonce() {
      return inner.commNonce();
    }

    @Override
    public String[] allGather(String mine) {
      String[] all = inner.allGather(mine);
      after.accept(all);
      return all;
    }
  }

  // ---- the stranger ----------------------------------------------------------------------------

  /** What the stranger saw: the answer to its hello, the answer to its proof, what followed. */
  private record Attempt(
      Wire.Message first,
      Wire.Message second,
      long bytesAfter,
      boolean challengeVerifiesWithTheRealKey,
      boolean challengeVerifiesWithTheTokenOnly) {}

  /**
   * Dials rank 0 as rank 1 with the key the sniffed token gives (no shares). Rank 0 may still be
   * on its way to connect: a parked hello is answered once it is, or told to dial again.
   */
  private static Attempt dialFirst(String[] blobs, long commId, long token) {
    List<RankInfo> infos = RankInfoCodec.decodeAll(blobs);
    String[] addresses = infos.stream().map(i -> endpointHost(i.transportAddress())).toArray(String[]::new);
    byte[] tokenOnly = Wire.commKey(token, commId, new byte[0][]);
    byte[] real = Wire.commKey(token, commId, infos.stream().map(RankInfo::authShare).toArray(byte[][]::new));
    String[] hp = splitHostPort(addresses[0]);
    long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
    while (true) {
      try (Socket s = new Socket()) {
        s.connect(new InetSocketAddress(hp[0], Integer.parseInt(hp[1])), 2000);
        s.setSoTimeout(5000);
        byte[] nd = new byte[32];
        new SecureRandom().nextBytes(nd);
        s.getOutputStream().write(Wire.message(Wire.HELLO, commId, 1, 2, 0, 0, nd, new byte[32]));
        Wire.Message first = Wire.read(s.getInputStream());
        if (first.kind == Wire.REJECT && first.reason == Wire.NOT_READY && System.nanoTime() < deadline) {
          continue;  // rank 0 had not called connect yet: dial again
        }
        if (first.kind != Wire.CHALLENGE) {
          return new Attempt(first, first, -1, false, false);
        }
        byte[] na = first.nonce;
        byte[] acceptorProofReal = Wire.proof(real, "acceptor", commId, 1, 0, addresses, nd, na);
        byte[] acceptorProofToken = Wire.proof(tokenOnly, "acceptor", commId, 1, 0, addresses, nd, na);
        byte[] mine = Wire.proof(tokenOnly, "dialer", commId, 1, 0, addresses, nd, na);
        s.getOutputStream().write(Wire.message(Wire.PROOF, commId, 1, 2, 0, 0, new byte[32], mine));
        Wire.Message second = Wire.read(s.getInputStream());
        long after = 0;
        while (s.getInputStream().read() >= 0) {
          after++;
        }
        return new Attempt(
            first,
            second,
            after,
            MessageDigest.isEqual(acceptorProofReal, first.mac),
            MessageDigest.isEqual(acceptorProofToken, first.mac));
      } catch (IOException e) {
        throw new AssertionError("the stranger's dial failed: " + e, e);
      }
    }
  }

  /** The socket handshake's messages (rdma/socket/wire.h) and proofs (rdma/auth.h), in Java. */
  private static final class Wire {
    static final long MAGIC = 0x324d4f4344455346L;  // "FSEDCOM2"
    static final int VERSION = 3;  // kTransportApiVersion
    static final int HELLO = 1;
    static final int REJECT = 3;
    static final int CHALLENGE = 4;
    static final int PROOF = 5;
    static final int BAD_AUTH = 2;
    static final int NOT_READY = 6;
    static final int BYTES = 104;

    record Message(
        long magic,
        int version,
        int kind,
        long commId,
        int rank,
        int world,
        int target,
        int reason,
        byte[] nonce,
        byte[] mac) {
      @Override
      public String toString() {
        return "kind " + kind + " reason " + reason + " from rank " + rank;
      }
    }

    static byte[] message(
        int kind, long commId, int rank, int world, int target, int reason, byte[] nonce, byte[] mac) {
      ByteBuffer b = ByteBuffer.allocate(BYTES).order(ByteOrder.LITTLE_ENDIAN);
      b.putLong(MAGIC).putInt(VERSION).putInt(kind).putLong(commId).putInt(rank).putInt(world).putInt(target);
      b.putInt(reason).put(nonce).put(mac);
      return b.array();
    }

    static Message read(InputStream in) throws IOException {
      byte[] raw = in.readNBytes(BYTES);
      if (raw.length != BYTES) {
        throw new IOException("the connection closed after " + raw.length + " bytes of a message");
      }
      ByteBuffer b = ByteBuffer.wrap(raw).order(ByteOrder.LITTLE_ENDIAN);
      Message m =
          new Message(b.getLong(), b.getInt(), b.getInt(), b.getLong(), b.getInt(), b.getInt(),
              b.getInt(), b.getInt(), new byte[32], new byte[32]);
      b.get(m.nonce).get(m.mac);
      return m;
    }

    /** HMAC-SHA-256(job token LE; "fusedcomm comm key v1" || comm id LE || W LE || shares). */
    static byte[] commKey(long token, long commId, byte[][] shares) {
      ByteBuffer salt = ByteBuffer.allocate(8).order(ByteOrder.LITTLE_ENDIAN).putLong(token);
      ByteBuffer msg = ByteBuffer.allocate(64 + 32 * shares.length).order(ByteOrder.LITTLE_ENDIAN);
      msg.put("fusedcomm comm key v1".getBytes(StandardCharsets.US_ASCII));
      msg.putLong(commId).putInt(shares.length);
      for (byte[] s : shares) {
        msg.put(s);
      }
      return hmac(salt.array(), msg.array(), msg.position());
    }

    /**
     * HMAC-SHA-256(key; "fusedcomm handshake v1 <role>" || the transcript), as rdma/auth.h says;
     * {@code addresses}: the published ones, by rank (the world is their number).
     */
    static byte[] proof(
        byte[] key, String role, long commId, int dialer, int acceptor, String[] addresses, byte[] nd,
        byte[] na) {
      int world = addresses.length;
      byte[] da = addresses[dialer].getBytes(StandardCharsets.UTF_8);
      byte[] aa = addresses[acceptor].getBytes(StandardCharsets.UTF_8);
      ByteBuffer m = ByteBuffer.allocate(128 + da.length + aa.length).order(ByteOrder.LITTLE_ENDIAN);
      m.put(("fusedcomm handshake v1 " + role).getBytes(StandardCharsets.US_ASCII));
      m.putInt(VERSION).putLong(commId).putInt(world).putInt(dialer).putInt(acceptor);
      m.putInt(da.length).put(da).putInt(aa.length).put(aa).put(nd).put(na);
      return hmac(key, m.array(), m.position());
    }

    private static byte[] hmac(byte[] key, byte[] data, int length) {
      try {
        Mac mac = Mac.getInstance("HmacSHA256");
        mac.init(new SecretKeySpec(key, "HmacSHA256"));
        mac.update(data, 0, length);
        return mac.doFinal();
      } catch (GeneralSecurityException e) {
        throw new AssertionError(e);
      }
    }
  }

  // ---- helpers ---------------------------------------------------------------------------------

  /** "host:port#regionKey" (an endpoint) to "host:port" (the transport's address). */
  private static String endpointHost(String endpoint) {
    int hash = endpoint.lastIndexOf('#');
    return hash < 0 ? endpoint : endpoint.substring(0, hash);
  }

  private static String[] splitHostPort(String address) {
    int colon = address.lastIndexOf(':');
    return new String[] {address.substring(0, colon), address.substring(colon + 1)};
  }

  /** Whether the peer closed (EOF or reset) before the socket's timeout. */
  private static boolean closedByPeer(InputStream in) {
    try {
      return in.read() < 0;
    } catch (SocketTimeoutException e) {
      return false;
    } catch (IOException e) {
      return true;  // reset
    }
  }

  private static long openFds() throws IOException {
    try (Stream<Path> s = Files.list(Path.of("/proc/self/fd"))) {
      return s.count();
    }
  }

  private static long maxFds() {
    if (ManagementFactory.getOperatingSystemMXBean()
        instanceof com.sun.management.UnixOperatingSystemMXBean os) {
      return os.getMaxFileDescriptorCount();
    }
    return 4096;
  }
}
