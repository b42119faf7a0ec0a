package io.fusedcomm.gpu;

import io.fusedcomm.api.DeviceTensor;
import io.fusedcomm.api.HostTensor;
import io.fusedcomm.config.FusedCommConf;
import io.fusedcomm.runtime.ExecutorRuntime;
import io.fusedcomm.runtime.NativeApi;
import java.nio.file.Path;
import java.util.HashMap;
import java.util.Map;
import java.util.Optional;
import org.junit.jupiter.api.Assumptions;

/** GPU test gate: skips (with the probe's reason, printed) where the cuda backend is unavailable. */
final class Gpu {
  private Gpu() {}

  /**
   * An executor runtime of the cuda backend on GPU 0 (executor "0"), a 30 s timeout, the native
   * library named by {@code fusedcomm.test.nativeLibraryPath} where set.
   */
  static ExecutorRuntime cudaRuntime() {
    Map<String, String> conf = new HashMap<>(Map.of("spark.fusedcomm.backend", "cuda",
        "spark.fusedcomm.timeout", "30s"));
    String lib = System.getProperty("fusedcomm.test.nativeLibraryPath", "");
    if (!lib.isEmpty()) {
      conf.put("spark.fusedcomm.native.libraryPath", lib);
    }
    return ExecutorRuntime.create(FusedCommConf.fromMap(conf), "0", Optional.of("0"), 1L);
  }

  /** The probe's line for the cuda backend, e.g. "cuda: unavailable: no usable NVIDIA GPU ...". */
  static String cudaLine() {
    for (String line : NativeApi.availability().split("\n")) {
      if (line.startsWith("cuda:")) {
        return line;
      }
    }
    throw new AssertionError("the availability report has no cuda line: " + NativeApi.availability());
  }

  static boolean present() {
    return cudaLine().startsWith("cuda: available");
  }

  static void require() {
    if (!present()) {
      System.out.println("SKIPPED (no GPU): " + cudaLine());
    }
    Assumptions.assumeTrue(present(), "no GPU: " + cudaLine());
  }

  /**
   * Settings of a GPU {@code local-cluster}: the cuda backend, a 30 s timeout, the given
   * symmetric data area, one GPU per worker / executor / task from conf/gpu-discovery.sh, and
   * the folder where JCuda unpacks its native libraries on the executors' library path (the
   * executors load them under JCudaNatives' host lock). A mutable copy: callers add their own
   * keys.
   */
  static Map<String, String> clusterSettings(long symmetricBytes) {
    String script = Path.of(System.getProperty("fusedcomm.repo.root", "..")).resolve("conf/gpu-discovery.sh")
        .toAbsolutePath().toString();
    return new HashMap<>(Map.ofEntries(
        Map.entry("spark.fusedcomm.backend", "cuda"),
        Map.entry("spark.fusedcomm.timeout", "30s"),
        Map.entry("spark.fusedcomm.cuda.symmetricBytes", Long.toString(symmetricBytes)),
        Map.entry("spark.worker.resource.gpu.amount", "1"),
        Map.entry("spark.worker.resource.gpu.discoveryScript", script),
        Map.entry("spark.executor.resource.gpu.amount", "1"),
        Map.entry("spark.executor.resource.gpu.discoveryScript", script),
        Map.entry("spark.task.resource.gpu.amount", "1"),
        Map.entry("spark.executor.extraLibraryPath", System.getProperty("java.io.tmpdir"))));
  }

  /** Copies {@code values} into {@code d} (as its dtype; one value per element). */
  static void put(DeviceTensor d, float[] values) {
    try (HostTensor h = HostTensor.of(values, d.dtype(), d.shape())) {
      d.copyFrom(h);
    }
  }

  /** Fills {@code d} with NaN, so that an element an op never writes fails its check. */
  static void poison(DeviceTensor d) {
    try (HostTensor h = HostTensor.allocate(d.dtype(), d.shape())) {
      h.fill(Float.NaN);
      d.copyFrom(h);
    }
  }

  /** The device tensor's values, as floats. */
  static float[] download(DeviceTensor d) {
    try (HostTensor h = HostTensor.allocate(d.dtype(), d.shape())) {
      d.copyTo(h);
      return h.toFloatArray();
    }
  }
}
