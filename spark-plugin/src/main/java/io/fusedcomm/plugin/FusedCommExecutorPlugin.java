package io.fusedcomm.plugin;

import io.fusedcomm.config.FusedCommConf;
import io.fusedcomm.runtime.ExecutorRuntime;
import java.net.InetAddress;
import java.util.Map;
import org.apache.spark.api.plugin.ExecutorPlugin;
import org.apache.spark.api.plugin.PluginContext;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Executor side of fusedcomm: at {@code init}, validates the configuration and the executor's GPU
 * assignment (exactly one GPU, or none with the host backend) and starts the long-lived {@link
 * ExecutorRuntime}; at {@code shutdown}, closes it. The runtime's metrics go to the plugin's
 * metric registry (docs/monitoring.md).
 *
 * <p>When the runtime cannot start (e.g. {@code backend=cuda} and no usable GPU), the executor
 * still starts: failing it would make Spark relaunch it for as long as the application waits,
 * and a barrier job waiting for slots would never end. Instead the reason is logged here, sent
 * to the driver plugin (which logs it where users look), and every communicator a task asks
 * for on this executor fails with it, so a barrier job fails at once, saying why.
 */
public final class FusedCommExecutorPlugin implements ExecutorPlugin {
  private static final Logger LOG = LoggerFactory.getLogger(FusedCommExecutorPlugin.class);

  private ExecutorRuntime runtime;

  /** Called by {@code FusedCommPlugin}. */
  public FusedCommExecutorPlugin() {}

  @Override
  public void init(PluginContext ctx, Map<String, String> extraConf) {
    try {
      start(ctx, extraConf);
    } catch (RuntimeException | LinkageError e) {
      String reason = e.getMessage() == null ? e.toString() : e.getMessage();
      LOG.error("fusedcomm cannot start on executor {}; its barrier tasks will fail with: {}", ctx.executorID(),
          reason, e);
      ExecutorRuntime.recordStartFailure(reason);
      try {
        ctx.send(new ExecutorStartFailure(ctx.executorID(), hostName(), reason));
      } catch (Exception sendFailure) {
        LOG.warn("could not tell the driver why fusedcomm cannot start here: {}", sendFailure.toString());
      }
    }
  }

  private void start(PluginContext ctx, Map<String, String> extraConf) {
    FusedCommConf conf = FusedCommConf.fromSparkConf(ctx.conf());
    GpuAssignment gpu = GpuAssignment.fromResources(ctx.resources(), conf.gpuResourceName());
    gpu.checkBackend(conf.backend());
    long jobToken = jobToken(extraConf);
    LOG.info(
        "fusedcomm executor plugin starting on executor {} ({}, backend {})",
        ctx.executorID(),
        gpu,
        conf.backend());
    runtime = ExecutorRuntime.start(conf, ctx.executorID(), gpu.address(), jobToken);
    if (runtime.backend() == io.fusedcomm.api.Backend.CUDA) {
      // Beside the RAPIDS Accelerator: decided now, before any communicator allocates.
      try {
        RapidsMemoryRule.check(ctx.conf(), conf.cudaSymmetricBytes(), runtime.gpuTotalBytes())
            .ifPresent(decision -> LOG.info("fusedcomm GPU memory {}", decision));
      } catch (RuntimeException e) {
        ExecutorRuntime r = runtime;
        runtime = null;
        r.close();
        throw e;
      }
    }
    // Spark takes a plugin's metrics once, right after init: every metric exists by now.
    ctx.metricRegistry().registerAll(runtime.metrics().registry());
  }

  private static String hostName() {
    try {
      return InetAddress.getLocalHost().getHostName();
    } catch (java.io.IOException e) {
      return "unknown host";
    }
  }

  @Override
  public void shutdown() {
    ExecutorRuntime r = runtime;
    runtime = null;
    if (r != null) {
      r.close();
    }
  }

  /**
   * The job token the driver plugin sent.
   *
   * @throws IllegalStateException if it is missing or malformed (the driver side of the plugin did
   *     not run)
   */
  static long jobToken(Map<String, String> extraConf) {
    String raw = extraConf == null ? null : extraConf.get(FusedCommDriverPlugin.JOB_TOKEN_KEY);
    if (raw == null) {
      throw new IllegalStateException(
          "fusedcomm's driver plugin sent no job token; load fusedcomm through"
              + " spark.plugins=io.fusedcomm.FusedCommPlugin so its driver side runs too");
    }
    try {
      return Long.parseLong(raw);
    } catch (NumberFormatException e) {
      throw new IllegalStateException("malformed fusedcomm job token '" + raw + "'", e);
    }
  }
}
