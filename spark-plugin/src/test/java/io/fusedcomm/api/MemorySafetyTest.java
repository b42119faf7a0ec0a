package io.fusedcomm.api;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.fusedcomm.config.FusedCommConf;
import io.fusedcomm.errors.CommunicatorException;
import io.fusedcomm.runtime.ExecutorRuntime;
import io.fusedcomm.runtime.NativeApi;
import io.fusedcomm.testing.HostWorld;
import io.fusedcomm.testing.InJvmExchange;
import java.lang.ref.Reference;
import java.lang.reflect.Method;
import java.lang.reflect.Modifier;
import java.nio.ByteBuffer;
import java.nio.FloatBuffer;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.CyclicBarrier;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import javax.tools.DiagnosticCollector;
import javax.tools.JavaCompiler;
import javax.tools.JavaFileObject;
import javax.tools.SimpleJavaFileObject;
import javax.tools.ToolProvider;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/**
 * Uses of the public API that once crashed the JVM or corrupted memory, each now ending in a
 * clear exception with the JVM alive (host backend, ranks as threads of this JVM): sizes that
 * overflow, a tensor closed by another thread while an op uses it, a view read after close, a
 * tensor class of the user's own, views over 2 GiB, two threads in ops on one communicator, and
 * two ranks of one stage on one executor. GPU variants: io.fusedcomm.gpu.GpuTensorSafetyTest;
 * the exception classes loaded at start: ErrorClassesLoadedTest.
 */
class MemorySafetyTest {
  private static final long LIMIT_MS = 60_000;
  private static HostWorld world;

  @BeforeAll
  static void start() {
    world = new HostWorld(2, Map.of(), LIMIT_MS);
  }

  @AfterAll
  static void stop() {
    if (world != null) {
      world.close();
    }
  }

  private static long liveBytes() {
    return NativeApi.memStats()[0];
  }

  private static float[] iota(int n, float base) {
    float[] v = new float[n];
    for (int i = 0; i < n; i++) {
      v[i] = base + i;
    }
    return v;
  }

  // ---- sizes --------------------------------------------------------------------------------

  @Test
  void sizesThatOverflowAreRefusedAndTheCommunicatorStaysUsable() {
    List<float[]> results = world.run(2, comm -> {
      IllegalArgumentException e =
          assertThrows(IllegalArgumentException.class, () -> HostTensor.allocate(DType.F32, 1L << 62));
      assertTrue(e.getMessage().contains("18446744073709551616 bytes, more than a tensor can hold"),
          e.getMessage());
      e = assertThrows(IllegalArgumentException.class,
          () -> HostTensor.allocate(DType.BF16, 1L << 40, 1L << 40));
      assertTrue(e.getMessage().contains("elements, more than a tensor can hold"), e.getMessage());
      e = assertThrows(IllegalArgumentException.class, () -> HostTensor.allocate(DType.F32, 1L << 40));
      assertTrue(e.getMessage().contains("is too large"), "the native allocator's bound: " + e.getMessage());
      // No GPU is touched: the size is checked before cudaMalloc.
      e = assertThrows(IllegalArgumentException.class, () -> DeviceTensor.allocate(DType.F32, 1L << 62));
      assertTrue(e.getMessage().contains("more than a tensor can hold"), e.getMessage());
      // The entries under the tensors refuse what would wrap, too.
      assertThrows(IllegalArgumentException.class, () -> NativeOps.memAlloc(1L << 62));
      assertThrows(IllegalArgumentException.class, () -> NativeOps.memAlloc(-1));
      try (HostTensor in = HostTensor.of(iota(6, 10 * comm.rank()), DType.F32, 6);
           HostTensor out = HostTensor.allocate(DType.F32, 6)) {
        comm.allToAll(in, out);
        return out.toFloatArray();
      }
    });
    assertArrayEquals(new float[] {0, 1, 2, 10, 11, 12}, results.get(0));
    assertArrayEquals(new float[] {3, 4, 5, 13, 14, 15}, results.get(1));
  }

  // ---- a tensor closed while an op uses it ---------------------------------------------------

  @Test
  void closeOnAnotherThreadWhileAnOpUsesTheTensorFreesItWhenTheOpReturns() throws Exception {
    final int n = 1 << 16;
    CyclicBarrier allocated = new CyclicBarrier(2);
    CountDownLatch closed = new CountDownLatch(1);
    CyclicBarrier measured = new CyclicBarrier(2);
    ExecutorService opThread = Executors.newSingleThreadExecutor();
    try {
      List<float[]> results = world.run(2, comm -> {
        HostTensor t = HostTensor.of(iota(n, comm.rank()), DType.F32, n);
        allocated.await(10, TimeUnit.SECONDS);
        if (comm.rank() == 1) {
          closed.await(10, TimeUnit.SECONDS);  // rank 0's op waits for this rank meanwhile
          comm.allReduce(t, t);
          float[] sum = t.toFloatArray();
          measured.await(10, TimeUnit.SECONDS);
          t.close();
          return sum;
        }
        Future<?> op = opThread.submit(() -> comm.allReduce(t, t));
        awaitHeld(t);
        long before = liveBytes();
        t.close();  // returns at once: the op holds the tensor
        assertTrue(t.isClosed());
        assertEquals(before, liveBytes(), "the memory stays while the op uses it");
        IllegalStateException e = assertThrows(IllegalStateException.class, t::toFloatArray);
        assertTrue(e.getMessage().contains("HostTensor[f32 [65536]] is closed"), e.getMessage());
        assertThrows(IllegalStateException.class, t::buffer);
        closed.countDown();
        op.get(30, TimeUnit.SECONDS);  // the op itself completes normally
        assertEquals(before - 4L * n, liveBytes(), "freed when the op returned");
        measured.await(10, TimeUnit.SECONDS);
        // A closed tensor is refused before anything moves, and the communicator stays usable.
        e = assertThrows(IllegalStateException.class, () -> comm.allReduce(t, t));
        assertTrue(e.getMessage().contains("is closed"), e.getMessage());
        return null;
      });
      float[] expected = new float[n];
      for (int i = 0; i < n; i++) {
        expected[i] = 2 * i + 1;
      }
      assertArrayEquals(expected, results.get(1),
          "rank 1 got the sum: rank 0's memory was intact during the op");
      assertNull(results.get(0));
    } finally {
      opThread.shutdownNow();
    }
  }

  /** Waits until an op on another thread holds {@code t}. */
  private static void awaitHeld(AbstractTensor t) throws InterruptedException {
    long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
    while (!t.uses.inUse()) {
      assertTrue(System.nanoTime() < deadline, "no op took " + t);
      Thread.sleep(1);
    }
  }

  private static void awaitOp(Communicator comm, String op) throws InterruptedException {
    long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
    while (!op.equals(comm.opInProgress())) {
      assertTrue(System.nanoTime() < deadline, op + " never started");
      Thread.sleep(1);
    }
  }

  @Test
  void anOpRefusesATensorClosedBeforeItAndTheCommunicatorStaysUsable() {
    List<float[]> results = world.run(2, comm -> {
      HostTensor closed = HostTensor.allocate(DType.F32, 4);
      closed.close();
      try (HostTensor t = HostTensor.of(new float[] {1, 2, 3, 4}, DType.F32, 4)) {
        IllegalStateException e = assertThrows(IllegalStateException.class, () -> comm.allReduce(t, closed));
        assertTrue(e.getMessage().contains("HostTensor[f32 [4]] is closed"), e.getMessage());
        assertNull(comm.opInProgress(), "the refused call left the op slot");
        comm.allReduce(t, t);
        return t.toFloatArray();
      }
    });
    assertArrayEquals(new float[] {2, 4, 6, 8}, results.get(0));
  }

  // ---- views --------------------------------------------------------------------------------

  @Test
  void aViewReadAfterCloseSeesLiveMemoryAndTheMemoryIsFreedWithTheView() throws Exception {
    final int n = 16 << 20;  // 64 MiB: freed with munmap, so a read after a free would fault
    long baseline = liveBytes();
    ByteBuffer[] view = new ByteBuffer[1];
    FloatBuffer floats = viewThenClose(n, view);
    try {
      assertEquals(baseline + 4L * n, liveBytes(), "the views keep the memory of the closed tensor");
      assertEquals(7f, floats.get(7));
      assertEquals(n - 1f, floats.get(n - 1));
      view[0].putFloat(0, 42f);  // writes are safe too: the memory is the tensor's, still allocated
      assertEquals(42f, floats.get(0));
    } finally {
      Reference.reachabilityFence(floats);
      Reference.reachabilityFence(view);
    }
    floats = null;
    view[0] = null;
    awaitLiveBytes(baseline, "the closed tensor whose views became garbage");
  }

  /** Collects garbage until the live native bytes are back to {@code expected} (bounded). */
  private static void awaitLiveBytes(long expected, String what) throws InterruptedException {
    long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(20);
    while (liveBytes() != expected) {
      assertTrue(System.nanoTime() < deadline,
          what + " was not freed: " + liveBytes() + " live bytes, expected " + expected);
      System.gc();
      Thread.sleep(20);
    }
  }

  /** A tensor's views (a float view of a whole view, a window), then the tensor closed. */
  private static FloatBuffer viewThenClose(int n, ByteBuffer[] window) {
    HostTensor t = HostTensor.of(iota(n, 0), DType.F32, n);
    FloatBuffer floats = t.buffer().asFloatBuffer();
    window[0] = t.buffer(0, 64);
    t.close();
    IllegalStateException e = assertThrows(IllegalStateException.class, t::buffer);
    assertTrue(e.getMessage().contains("is closed"), e.getMessage());
    assertThrows(IllegalStateException.class, () -> t.buffer(0, 4));
    assertThrows(IllegalStateException.class, () -> t.getFloat(0));
    return floats;
  }

  @Test
  void viewsOver2GiBAreRefusedAndWindowsReachEveryByte() throws InterruptedException {
    long baseline = liveBytes();
    windowsOfALargeTensor();
    awaitLiveBytes(baseline, "the 2 GiB tensor");
  }

  private static void windowsOfALargeTensor() {
    // 2 GiB + 4 bytes: one f32 element past what a ByteBuffer can view.
    long n = (1L << 29) + 1;
    try (HostTensor t = HostTensor.allocate(DType.F32, n)) {
      assertEquals((1L << 31) + 4, t.byteSize());
      IllegalStateException e = assertThrows(IllegalStateException.class, t::buffer);
      assertTrue(e.getMessage().contains("more than one ByteBuffer can view")
          && e.getMessage().contains("buffer(offset, length)"), e.getMessage());
      ByteBuffer tail = t.buffer(t.byteSize() - 8, 8);
      assertEquals(8, tail.capacity(), "never wrapped");
      tail.putFloat(4, 3.5f);
      assertEquals(3.5f, t.getFloat(n - 1), "the window and the element access address the same byte");
      assertEquals(0f, t.getFloat(n - 2));
      assertThrows(IndexOutOfBoundsException.class, () -> t.buffer(t.byteSize() - 4, 8));
      assertThrows(IndexOutOfBoundsException.class, () -> t.buffer(-1, 4));
      assertThrows(IndexOutOfBoundsException.class, () -> t.getFloat(n));
      // The native view entry refuses a capacity a ByteBuffer cannot hold instead of wrapping it.
      long address = t.acquire();
      try {
        IllegalArgumentException refused =
            assertThrows(IllegalArgumentException.class, () -> NativeOps.memView(address, 1L << 32));
        assertTrue(refused.getMessage().contains("a ByteBuffer holds 0 to 2147483647"), refused.getMessage());
      } finally {
        t.release();
      }
    }
  }

  // ---- sealed tensors, no public raw addresses ------------------------------------------------

  @Test
  void onlyTheProjectsTensorsAreTensors() {
    assertTrue(Tensor.class.isSealed());
    assertEquals(List.of(AbstractTensor.class), Arrays.asList(Tensor.class.getPermittedSubclasses()));
    assertEquals(List.of(HostTensor.class, DeviceTensor.class),
        Arrays.asList(AbstractTensor.class.getPermittedSubclasses()));
    assertTrue(Modifier.isFinal(HostTensor.class.getModifiers()));
    assertTrue(Modifier.isFinal(DeviceTensor.class.getModifiers()));
    // A user's class implementing Tensor does not compile.
    String user = "class UserTensor implements io.fusedcomm.api.Tensor {"
        + " public io.fusedcomm.api.DType dtype() { return null; }"
        + " public long[] shape() { return new long[0]; }"
        + " public int rank() { return 0; }"
        + " public long dim(int i) { return 0; }"
        + " public long numel() { return 0; }"
        + " public long byteSize() { return 0; }"
        + " public boolean isDevice() { return false; }"
        + " public boolean isClosed() { return false; }"
        + " }";
    JavaCompiler javac = ToolProvider.getSystemJavaCompiler();
    DiagnosticCollector<JavaFileObject> diagnostics = new DiagnosticCollector<>();
    JavaFileObject source = new SimpleJavaFileObject(java.net.URI.create("string:///UserTensor.java"),
        JavaFileObject.Kind.SOURCE) {
      @Override
      public CharSequence getCharContent(boolean ignoreEncodingErrors) {
        return user;
      }
    };
    String classpath = System.getProperty("surefire.test.class.path", System.getProperty("java.class.path"));
    List<String> options = List.of("-classpath", classpath, "-proc:none",
        "-d", System.getProperty("java.io.tmpdir"));
    boolean compiled = javac.getTask(null, null, diagnostics, options, null, List.of(source)).call();
    assertFalse(compiled, "a user class implementing the sealed Tensor must not compile");
    String errors = diagnostics.getDiagnostics().toString();
    assertTrue(errors.contains("sealed"), errors);
  }

  @Test
  void noPublicEntryTakesARawAddress() {
    assertFalse(Modifier.isPublic(NativeOps.class.getModifiers()), "NativeOps is package-private");
    for (Method m : NativeApi.class.getDeclaredMethods()) {
      if (Modifier.isPublic(m.getModifiers())) {
        assertEquals(0, m.getParameterCount(),
            "public NativeApi." + m.getName() + " takes no handle or address");
      }
    }
    for (Method m : Tensor.class.getMethods()) {
      assertFalse(m.getName().equals("address"), "Tensor does not expose its address");
    }
    for (Class<?> c : List.of(HostTensor.class, DeviceTensor.class)) {
      for (Method m : c.getMethods()) {
        assertFalse(m.getName().equals("address"), c.getSimpleName() + " does not expose its address");
      }
    }
  }

  // ---- one thread per communicator -----------------------------------------------------------

  @Test
  void aSecondThreadEnteringAnOpIsRefusedAndTheOpsStayPaired() throws Exception {
    CountDownLatch refused = new CountDownLatch(1);
    ExecutorService opThread = Executors.newSingleThreadExecutor(r -> new Thread(r, "first-op-thread"));
    try {
      List<float[]> results = world.run(2, comm -> {
        try (HostTensor a = HostTensor.of(new float[] {1 + comm.rank(), 2}, DType.F32, 2);
             HostTensor b = HostTensor.of(new float[] {10 * (1 + comm.rank())}, DType.F32, 1);
             HostTensor gathered = HostTensor.allocate(DType.F32, 2)) {
          if (comm.rank() == 1) {
            refused.await(10, TimeUnit.SECONDS);
            comm.allReduce(a, a);
            comm.allGather(b, gathered);
          } else {
            Future<?> first = opThread.submit(() -> comm.allReduce(a, a));
            awaitOp(comm, "allReduce");
            IllegalStateException e =
                assertThrows(IllegalStateException.class, () -> comm.allGather(b, gathered));
            String m = e.getMessage();
            assertTrue(m.contains("Communicator[rank 0 of 2, host]: allGather was called on thread '")
                && m.contains("while thread 'first-op-thread' is in allReduce")
                && m.contains("must be called from one thread at a time"), m);
            refused.countDown();
            first.get(30, TimeUnit.SECONDS);
            comm.allGather(b, gathered);
          }
          float[] out = new float[4];
          System.arraycopy(a.toFloatArray(), 0, out, 0, 2);
          System.arraycopy(gathered.toFloatArray(), 0, out, 2, 2);
          return out;
        }
      });
      for (float[] r : results) {
        assertArrayEquals(new float[] {3, 4, 10, 20}, r, "every op paired with its counterpart");
      }
    } finally {
      opThread.shutdownNow();
    }
  }

  // ---- one rank per executor -----------------------------------------------------------------

  @Test
  void twoRanksOfOneStageOnOneExecutorNameTheCauseAndTheFix() throws Exception {
    Map<String, String> conf = new HashMap<>(Map.of("spark.fusedcomm.backend", "host",
        "spark.fusedcomm.timeout", "5s", "spark.fusedcomm.connectTimeout", "5s"));
    String lib = System.getProperty("fusedcomm.test.nativeLibraryPath", "");
    if (!lib.isEmpty()) {
      conf.put("spark.fusedcomm.native.libraryPath", lib);
    }
    FusedCommConf host = FusedCommConf.fromMap(conf);
    try (ExecutorRuntime shared = ExecutorRuntime.create(host, "7", Optional.empty(), 9L)) {
      List<InJvmExchange> exchanges = InJvmExchange.group(2, 77L, 20_000);
      ExecutorService ranks = Executors.newFixedThreadPool(2);
      try {
        List<Future<Communicator>> futures = new ArrayList<>();
        for (InJvmExchange ex : exchanges) {
          futures.add(ranks.submit(() -> CommBootstrap.bootstrap(shared, ex, CommOptions.defaults())));
        }
        for (Future<Communicator> f : futures) {
          java.util.concurrent.ExecutionException e =
              assertThrows(java.util.concurrent.ExecutionException.class, () -> f.get(30, TimeUnit.SECONDS));
          assertTrue(e.getCause() instanceof CommunicatorException, String.valueOf(e.getCause()));
          String m = e.getCause().getMessage();
          assertTrue(m.contains("ranks 0 and 1 of this barrier stage run as tasks of one executor"
                  + " (executor 7")
              && m.contains("one task per executor")
              && m.contains("set spark.task.cpus to spark.executor.cores")
              && m.contains("spark.task.resource.gpu.amount=1"), m);
        }
      } finally {
        ranks.shutdownNow();
      }
      assertEquals(0, shared.openCommunicators(), "both failed bootstraps released the runtime");
    }
  }
}
