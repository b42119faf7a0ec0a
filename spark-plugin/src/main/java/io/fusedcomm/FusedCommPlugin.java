package io.fusedcomm;

import io.fusedcomm.plugin.FusedCommDriverPlugin;
import io.fusedcomm.plugin.FusedCommExecutorPlugin;
import org.apache.spark.api.plugin.DriverPlugin;
import org.apache.spark.api.plugin.ExecutorPlugin;
import org.apache.spark.api.plugin.SparkPlugin;

/**
 * fusedcomm's Spark entry point: {@code spark.plugins=io.fusedcomm.FusedCommPlugin}.
 *
 * <p>This class name is the stable public contract users put in their configuration; it only
 * delegates. The driver side validates the configuration and issues the application's job token
 * ({@link FusedCommDriverPlugin}); the executor side checks the executor's GPU assignment and
 * starts the per-executor runtime ({@link FusedCommExecutorPlugin}).
 */
public final class FusedCommPlugin implements SparkPlugin {
  /** Called by Spark through reflection. */
  public FusedCommPlugin() {}

  @Override
  public DriverPlugin driverPlugin() {
    return new FusedCommDriverPlugin();
  }

  @Override
  public ExecutorPlugin executorPlugin() {
    return new FusedCommExecutorPlugin();
  }
}
