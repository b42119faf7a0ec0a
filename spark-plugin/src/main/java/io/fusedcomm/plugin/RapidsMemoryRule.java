package io.fusedcomm.plugin;

import io.fusedcomm.errors.BackendUnavailableException;
import java.util.Arrays;
import java.util.Optional;
import org.apache.spark.SparkConf;
import org.apache.spark.network.util.JavaUtils;

/**
 * The GPU memory rule beside the RAPIDS Accelerator, decided once at executor start (cuda
 * backend). The Accelerator's RMM pool takes {@code spark.rapids.memory.gpu.allocFraction} of the
 * GPU's free memory (default 1.0) and leaves {@code spark.rapids.memory.gpu.reserve} (default
 * 640m) to CUDA itself (contexts, kernels, libraries). fusedcomm's own GPU memory (twice {@code
 * spark.fusedcomm.cuda.symmetricBytes} of symmetric memory plus {@value #WORKSPACE_BYTES} bytes
 * of flags, staging and workspaces) is allocated outside that pool, so it must fit in what the
 * pool leaves: the reserve beyond its default plus, with an allocFraction below 1, the share of
 * the GPU the pool does not take. Where it cannot, the executor's barrier tasks fail with a
 * sentence naming what to set, rather than with an out-of-memory error in the middle of a job.
 *
 * <p>Pure logic over the Spark configuration (unit-tested without a GPU or RAPIDS).
 */
final class RapidsMemoryRule {
  /** The RAPIDS Accelerator's SparkPlugin, as it appears in {@code spark.plugins}. */
  static final String RAPIDS_PLUGIN = "com.nvidia.spark.SQLPlugin";
  static final String ALLOC_FRACTION = "spark.rapids.memory.gpu.allocFraction";
  static final String RESERVE = "spark.rapids.memory.gpu.reserve";
  /** The Accelerator's defaults for the two settings. */
  static final double DEFAULT_ALLOC_FRACTION = 1.0;
  static final long DEFAULT_RESERVE = 640L << 20;
  /** fusedcomm's GPU memory besides symmetric memory: flags, staging, GEMM workspaces. */
  static final long WORKSPACE_BYTES = 64L << 20;

  private RapidsMemoryRule() {}

  /** True when the RAPIDS Accelerator is among {@code spark.plugins}. */
  static boolean rapidsEnabled(SparkConf conf) {
    return Arrays.stream(conf.get("spark.plugins", "").split(","))
        .map(String::trim)
        .anyMatch(RAPIDS_PLUGIN::equals);
  }

  /**
   * Checks fusedcomm's GPU memory against the RAPIDS Accelerator's settings.
   *
   * @param gpuTotalBytes the GPU's memory, or 0 if unknown (then only the reserve counts)
   * @return the decision to log, or empty without the Accelerator
   * @throws BackendUnavailableException when fusedcomm's memory does not fit beside the pool,
   *     naming the settings that make it fit
   */
  static Optional<String> check(SparkConf conf, long symmetricBytes, long gpuTotalBytes) {
    if (!rapidsEnabled(conf)) {
      return Optional.empty();
    }
    double fraction = conf.getDouble(ALLOC_FRACTION, DEFAULT_ALLOC_FRACTION);
    long reserve = conf.contains(RESERVE) ? JavaUtils.byteStringAsBytes(conf.get(RESERVE)) : DEFAULT_RESERVE;
    long need = 2 * symmetricBytes + WORKSPACE_BYTES;
    long outsidePool = Math.max(0, reserve - DEFAULT_RESERVE)
        + (long) (Math.max(0.0, 1.0 - fraction) * gpuTotalBytes);
    String settings = ALLOC_FRACTION + "=" + fraction + ", " + RESERVE + "=" + mib(reserve);
    if (need <= outsidePool) {
      return Optional.of("beside the RAPIDS Accelerator (" + settings + "): fusedcomm's " + mib(need)
          + " of GPU memory (2 x spark.fusedcomm.cuda.symmetricBytes + " + mib(WORKSPACE_BYTES)
          + ") fits in the " + mib(outsidePool) + " its RMM pool leaves");
    }
    long reserveNeeded = DEFAULT_RESERVE + need;
    throw new BackendUnavailableException("cuda",
        "the RAPIDS Accelerator's RMM pool (" + settings + ") leaves " + mib(outsidePool) + " of GPU memory"
            + " beyond its own reserve, but fusedcomm needs " + mib(need) + " outside the pool (2 x"
            + " spark.fusedcomm.cuda.symmetricBytes + " + mib(WORKSPACE_BYTES) + "). Set " + RESERVE + "="
            + mib(reserveNeeded) + " (or more), or lower " + ALLOC_FRACTION + " so that the rest of the GPU"
            + " holds it, or lower spark.fusedcomm.cuda.symmetricBytes.",
        null);
  }

  private static String mib(long bytes) {
    return ((bytes + (1L << 20) - 1) >> 20) + "m";
  }
}
