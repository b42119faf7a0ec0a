package io.fusedcomm.plugin;

import io.fusedcomm.config.FusedCommConf;
import io.fusedcomm.runtime.ExecutorRuntime;
import java.util.Map;
import org.apache.spark.api.plugin.ExecutorPlugin;
import org.apache.spark.api.plugin.PluginContext;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Executor side of fusedcomm: at {@code init}, validates the configuration and the executor's GPU
 * assignment (exactly one GPU, or none with the host backend) and starts the long-lived {@link
 * ExecutorRuntime}; at {@code shutdown}, closes it.
 *
 * <p>A wrong setup fails the executor at start-up with a sentence the user can act on, rather than
 * the first barrier task later.
 */
public final class FusedCommExecutorPlugin implements ExecutorPlugin {
  private static final Logger LOG = LoggerFactory.getLogger(FusedCommExecutorPlugin.class);

  private ExecutorRuntime runtime;

  /** Called by {@code FusedCommPlugin}. */
  public FusedCommExecutorPlugin() {}

  @Override
  public void init(PluginContext ctx, Map<String, String> extraConf) {
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
