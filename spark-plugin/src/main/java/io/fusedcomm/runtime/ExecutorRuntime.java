package io.fusedcomm.runtime;

import io.fusedcomm.api.Backend;
import io.fusedcomm.config.FusedCommConf;
import io.fusedcomm.errors.BackendUnavailableException;
import io.fusedcomm.internal.metrics.CommMetrics;
import java.net.InetAddress;
import java.net.UnknownHostException;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Optional;
import java.util.Set;
import java.util.concurrent.TimeUnit;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The long-lived per-executor runtime: native library, transport listener and, with the cuda
 * backend, the executor's GPU. The executor plugin creates it at init ({@link #start}) and closes
 * it at executor shutdown; communicators borrow it for their lifetime.
 *
 * <p>Backend resolution: {@code host} always works; {@code cuda} needs the one GPU Spark assigned
 * to this executor and fails with {@link BackendUnavailableException} otherwise; {@code auto}
 * picks host until the cuda backend's ops are built (the GPU runtime is opened only for {@code
 * cuda}).
 *
 * <p>Communicators hold a {@link Lease} on the runtime from before their native half exists until
 * after it is freed. {@link #close} aborts the holders still open and waits for them (bounded)
 * before it frees the native runtime, which their native halves point into.
 */
public final class ExecutorRuntime implements AutoCloseable {
  /** The longest {@link #close} waits for aborted communicators to be closed by their tasks. */
  private static final Duration MAX_CLOSE_WAIT = Duration.ofSeconds(10);
  private static final Logger LOG = LoggerFactory.getLogger(ExecutorRuntime.class);
  private static volatile ExecutorRuntime current;
  /** Why the plugin could not start the runtime of this executor, if it could not. */
  private static volatile String startFailure;

  private final FusedCommConf conf;
  private final String executorId;
  private final Optional<String> gpuAddress;
  private final long jobToken;
  private final String host;
  private final Backend backend;
  private final String gpuUuid;
  private final int gpuOrdinal;
  private final String description;
  private final long leakId;
  private long handle;
  private boolean closing;  // guarded by this: no new leases
  private final Set<Lease> leases = new HashSet<>();  // guarded by itself
  private final CommMetrics metrics = new CommMetrics();

  private ExecutorRuntime(
      FusedCommConf conf, String executorId, Optional<String> gpuAddress, long jobToken) {
    this.conf = conf;
    this.executorId = executorId;
    this.gpuAddress = gpuAddress;
    this.jobToken = jobToken;
    NativeLibrary.setDirectory(conf.nativeLibraryPath());
    LeakTracker.recordStacks(conf.leakTracking());
    int ordinal = gpuAddress.map(ExecutorRuntime::parseOrdinal).orElse(-1);
    this.gpuOrdinal = ordinal;
    Backend requested = conf.backend();
    // auto -> host while the cuda ops are not built: a GPU executor must not pick a backend that
    // refuses every op.
    Backend nativeBackend = requested == Backend.AUTO ? Backend.HOST : requested;
    this.handle =
        NativeApi.runtimeCreate(
            nativeBackend.code(),
            conf.timeout().toMillis(),
            conf.connectTimeout().toMillis(),
            conf.hostChunkBytes(),
            conf.cudaSymmetricBytes(),
            conf.transportBindHost(),
            conf.transportStreams(),
            conf.transportBusyPoll().toNanos() / 1000,
            ordinal,
            jobToken,
            conf.cudaShareGpu(),
            conf.transport().code(),
            conf.libfabricProvider().code(),
            conf.libfabricRails(),
            conf.libfabricPeerTimeout().toMillis());
    this.backend = Backend.fromCode(NativeApi.runtimeBackend(handle));
    if (backend == Backend.CUDA && JCudaNatives.onClasspath()) {
      // Where the application brought JCuda, before any of its tasks touches it: executors of one
      // host must not load its libraries at the same instant (JCudaNatives says why).
      try {
        JCudaNatives.load();
      } catch (LinkageError | RuntimeException e) {
        LOG.warn("JCuda is on the classpath but its native libraries did not load ({}); fusedcomm"
            + " does not need them, but the application's own JCuda calls will fail: use the jcuda and"
            + " jcuda-natives jars of one version that matches the CUDA driver", e.toString());
      }
    }
    this.gpuUuid = NativeApi.runtimeGpuUuid(handle);
    this.description = NativeApi.runtimeDescribe(handle);
    this.host = localHost(conf.transportBindHost());
    this.leakId = LeakTracker.opened("ExecutorRuntime(executor " + executorId + ")");
  }

  /**
   * Starts the runtime of this executor process and makes it {@link #current()}.
   *
   * @param conf validated fusedcomm configuration
   * @param executorId Spark executor id
   * @param gpuAddress the one GPU address Spark assigned this executor, if any
   * @param jobToken the application's random token, from the driver plugin
   */
  public static synchronized ExecutorRuntime start(
      FusedCommConf conf, String executorId, Optional<String> gpuAddress, long jobToken) {
    if (current != null) {
      throw new IllegalStateException(
          "the fusedcomm runtime of this executor is already started (" + current + ")");
    }
    ExecutorRuntime rt = new ExecutorRuntime(conf, executorId, gpuAddress, jobToken);
    current = rt;
    LOG.info("fusedcomm runtime started on executor {}: {}", executorId, rt.description);
    return rt;
  }

  /**
   * Creates a runtime that is not the executor's {@link #current()} one: for tests and tools that
   * run several ranks in one JVM. The caller closes it.
   */
  public static ExecutorRuntime create(
      FusedCommConf conf, String executorId, Optional<String> gpuAddress, long jobToken) {
    return new ExecutorRuntime(conf, executorId, gpuAddress, jobToken);
  }

  /**
   * Records why the executor plugin could not start the runtime: the executor stays up, and each
   * communicator its tasks ask for fails with this reason ({@link #startFailure()}); null clears
   * it.
   */
  public static void recordStartFailure(String reason) {
    startFailure = reason;
  }

  /** Why the plugin could not start this executor's runtime, if it tried and could not. */
  public static Optional<String> startFailure() {
    return Optional.ofNullable(startFailure);
  }

  /** The runtime of this executor, if the plugin started one. */
  public static Optional<ExecutorRuntime> current() {
    return Optional.ofNullable(current);
  }

  private static int parseOrdinal(String address) {
    try {
      int ordinal = Integer.parseInt(address.trim());
      if (ordinal < 0) {
        throw new NumberFormatException();
      }
      return ordinal;
    } catch (NumberFormatException e) {
      throw new BackendUnavailableException(
          "the GPU address '" + address + "' is not a device ordinal; the discovery script must"
              + " report CUDA device indices");
    }
  }

  private static String localHost(String bindHost) {
    if (!bindHost.isEmpty()) {
      return bindHost;
    }
    try {
      return InetAddress.getLocalHost().getHostName();
    } catch (UnknownHostException e) {
      return "localhost";
    }
  }

  /** The native handle. Internal. */
  public synchronized long handle() {
    if (handle == 0) {
      throw new IllegalStateException("the fusedcomm runtime of executor " + executorId + " is closed");
    }
    return handle;
  }

  /**
   * Makes this executor's GPU current on the calling thread, for the native runtime (so that
   * {@link io.fusedcomm.api.DeviceTensor#allocate} lands on it) and, where the application
   * brought JCuda, for JCuda's own CUDA runtime. A no-op with the host backend.
   */
  public void pinGpu() {
    NativeApi.runtimePinGpu(handle());
    if (backend == Backend.CUDA && JCudaNatives.loaded()) {
      JCudaNatives.setDevice(gpuOrdinal);
    }
  }

  /** The executor's GPU's total memory in bytes (cuda backend); 0 with the host backend. */
  public long gpuTotalBytes() {
    if (backend != Backend.CUDA) {
      return 0;
    }
    pinGpu();
    return NativeApi.deviceMemory()[1];
  }

  /**
   * Symmetric-memory regions (cuda backend) this executor keeps for the next communicator:
   * a communicator borrows one and returns it after a clean close.
   */
  public int pooledSymmetricRegions() {
    return NativeApi.runtimePooledRegions(handle());
  }

  /** The native runtime in one line: backend, transport and its address, GPU. */
  public String description() {
    return description;
  }

  /** What this runtime's communicators did, for the executor plugin's metric registry. Internal. */
  public CommMetrics metrics() {
    return metrics;
  }

  public FusedCommConf conf() {
    return conf;
  }

  public String executorId() {
    return executorId;
  }

  public String host() {
    return host;
  }

  /** The resolved backend: {@link Backend#CUDA} or {@link Backend#HOST}. */
  public Backend backend() {
    return backend;
  }

  public Optional<String> gpuAddress() {
    return gpuAddress;
  }

  /** The executor's GPU as a CUDA device ordinal; -1 with the host backend. */
  public int gpuOrdinal() {
    return backend == Backend.CUDA ? gpuOrdinal : -1;
  }

  /** The GPU's UUID as nvidia-smi prints it, or "" with the host backend. */
  public String gpuUuid() {
    return gpuUuid;
  }

  public long jobToken() {
    return jobToken;
  }

  /**
   * Internal: a communicator's hold on this runtime (see the class comment). Taken before the
   * communicator's native half is created, closed after it is freed.
   */
  public final class Lease implements AutoCloseable {
    private volatile Runnable abort = () -> {};

    private Lease() {}

    /** What {@link ExecutorRuntime#close} runs, from its own thread, to stop the holder's ops. */
    public void onAbort(Runnable action) {
      abort = action;
    }

    @Override
    public void close() {
      synchronized (leases) {
        if (leases.remove(this)) {
          leases.notifyAll();
        }
      }
    }
  }

  /** Internal: a hold on this runtime for a communicator; refused once the runtime closes. */
  public synchronized Lease lease() {
    if (handle == 0 || closing) {
      throw new IllegalStateException("the fusedcomm runtime of executor " + executorId + " is closed");
    }
    Lease lease = new Lease();
    synchronized (leases) {
      leases.add(lease);
    }
    return lease;
  }

  /** Communicators open on this runtime (leases held). */
  public int openCommunicators() {
    synchronized (leases) {
      return leases.size();
    }
  }

  /**
   * Frees the runtime. Communicators still open (a task that has not reached its close, e.g.
   * one still waiting for a peer that died when the executor is told to shut down) are aborted
   * first, and their tasks get up to the op timeout (at most 10 s) to close them. If some stay
   * open, the native runtime is not freed but left to the process's exit: freeing it under them
   * crashed an executor (SIGSEGV in the native close of a communicator whose runtime
   * the executor's shutdown had freed). Idempotent.
   */
  @Override
  public void close() {
    synchronized (this) {
      if (handle == 0 || closing) {
        return;
      }
      closing = true;
    }
    boolean drained = abortAndAwaitLeases();
    synchronized (this) {
      if (drained) {
        NativeApi.runtimeClose(handle);
      } else {
        LOG.warn("fusedcomm runtime of executor " + executorId + ": " + openCommunicators()
            + " communicator(s) still open " + closeWait().toMillis() + " ms after they were aborted;"
            + " the native runtime is left to the process's exit");
      }
      handle = 0;
    }
    LeakTracker.closed(leakId);
    synchronized (ExecutorRuntime.class) {
      if (current == this) {
        current = null;
      }
    }
    int open = LeakTracker.openCount();
    if (open > 0 && conf.leakTracking()) {
      for (String leak : LeakTracker.openHandles()) {
        LOG.warn("fusedcomm handle never closed: {}", leak);
      }
    }
  }

  private Duration closeWait() {
    return conf.timeout().compareTo(MAX_CLOSE_WAIT) < 0 ? conf.timeout() : MAX_CLOSE_WAIT;
  }

  /** Aborts every leaseholder and waits for all leases to be closed; false on the deadline. */
  private boolean abortAndAwaitLeases() {
    List<Lease> open;
    synchronized (leases) {
      open = new ArrayList<>(leases);
    }
    if (open.isEmpty()) {
      return true;
    }
    LOG.warn("fusedcomm runtime of executor " + executorId + " closes with " + open.size()
        + " communicator(s) open: aborting them");
    for (Lease lease : open) {
      try {
        lease.abort.run();
      } catch (RuntimeException e) {
        LOG.warn("aborting a communicator at runtime close failed", e);
      }
    }
    long deadline = System.nanoTime() + closeWait().toNanos();
    synchronized (leases) {
      while (!leases.isEmpty()) {
        long left = deadline - System.nanoTime();
        if (left <= 0) {
          return false;
        }
        try {
          TimeUnit.NANOSECONDS.timedWait(leases, left);
        } catch (InterruptedException e) {
          Thread.currentThread().interrupt();
          return false;
        }
      }
    }
    return true;
  }

  @Override
  public String toString() {
    return "ExecutorRuntime[executor " + executorId + ", " + description + "]";
  }
}
