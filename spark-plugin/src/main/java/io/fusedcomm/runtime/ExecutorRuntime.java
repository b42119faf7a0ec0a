package io.fusedcomm.runtime;

import io.fusedcomm.api.Backend;
import io.fusedcomm.config.FusedCommConf;
import io.fusedcomm.errors.BackendUnavailableException;
import java.net.InetAddress;
import java.net.UnknownHostException;
import java.util.Optional;
import java.util.logging.Logger;

/**
 * The long-lived per-executor runtime: native library, transport listener and, with the cuda
 * backend, the executor's GPU. The executor plugin creates it at init ({@link #start}) and closes
 * it at executor shutdown; communicators borrow it for their lifetime.
 *
 * <p>Backend resolution: {@code host} always works; {@code cuda} needs the one GPU Spark assigned
 * to this executor and fails with {@link BackendUnavailableException} otherwise; {@code auto}
 * picks host until the cuda backend's ops are built (the GPU runtime is opened only for {@code
 * cuda}).
 */
public final class ExecutorRuntime implements AutoCloseable {
  private static final Logger LOG = Logger.getLogger(ExecutorRuntime.class.getName());
  private static volatile ExecutorRuntime current;

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
            nativeBackend.ordinal(),
            conf.timeout().toMillis(),
            conf.connectTimeout().toMillis(),
            conf.hostChunkBytes(),
            conf.cudaSymmetricBytes(),
            conf.transportBindHost(),
            conf.transportStreams(),
            conf.transportBusyPoll().toNanos() / 1000,
            ordinal,
            jobToken,
            conf.cudaShareGpu());
    this.backend = Backend.values()[NativeApi.runtimeBackend(handle)];
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
    LOG.info("fusedcomm runtime started on executor " + executorId + ": " + rt.description);
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
   * Makes this executor's GPU current on the calling thread, for the native runtime and for
   * JCuda (whose own CUDA runtime keeps its own current device per thread), so that {@link
   * io.fusedcomm.api.DeviceTensor#allocate} lands on it. A no-op with the host backend.
   */
  public void pinGpu() {
    NativeApi.runtimePinGpu(handle());
    if (backend == Backend.CUDA) {
      jcuda.runtime.JCuda.cudaSetDevice(gpuOrdinal);
    }
  }

  /**
   * Symmetric-memory regions (cuda backend) this executor keeps for the next communicator:
   * a communicator borrows one and returns it after a clean close.
   */
  public int pooledSymmetricRegions() {
    return NativeApi.runtimePooledRegions(handle());
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

  /** The GPU's UUID as nvidia-smi prints it, or "" with the host backend. */
  public String gpuUuid() {
    return gpuUuid;
  }

  public long jobToken() {
    return jobToken;
  }

  @Override
  public synchronized void close() {
    if (handle == 0) {
      return;
    }
    NativeApi.runtimeClose(handle);
    handle = 0;
    LeakTracker.closed(leakId);
    synchronized (ExecutorRuntime.class) {
      if (current == this) {
        current = null;
      }
    }
    int open = LeakTracker.openCount();
    if (open > 0 && conf.leakTracking()) {
      for (String leak : LeakTracker.openHandles()) {
        LOG.warning("fusedcomm handle never closed: " + leak);
      }
    }
  }

  @Override
  public String toString() {
    return "ExecutorRuntime[executor " + executorId + ", " + description + "]";
  }
}
