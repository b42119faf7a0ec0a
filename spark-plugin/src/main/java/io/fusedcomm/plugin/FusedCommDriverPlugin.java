package io.fusedcomm.plugin;

import io.fusedcomm.api.Backend;
import io.fusedcomm.config.FusedCommConf;
import io.fusedcomm.errors.ConfigException;
import java.security.SecureRandom;
import java.util.Map;
import org.apache.spark.SparkConf;
import org.apache.spark.SparkContext;
import org.apache.spark.api.plugin.DriverPlugin;
import org.apache.spark.api.plugin.PluginContext;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Driver side of fusedcomm: validates the configuration when the application starts, so a bad
 * setting fails the application with a {@link ConfigException} before any executor runs, and
 * issues the application's random job token, which Spark hands to every executor plugin.
 *
 * <p>Every rank puts the token in its bootstrap blob; ranks with different tokens (tasks from
 * different applications or a stale peer) refuse to form a communicator.
 *
 * <p>Executors that cannot start fusedcomm tell this plugin why ({@link ExecutorStartFailure}),
 * and it logs the reason as an error in the driver's log; their barrier tasks fail with it.
 */
public final class FusedCommDriverPlugin implements DriverPlugin {
  /** Key of the job token, as a decimal long, in the map passed to executor plugins. */
  public static final String JOB_TOKEN_KEY = "fusedcomm.jobToken";

  private static final Logger LOG = LoggerFactory.getLogger(FusedCommDriverPlugin.class);

  /** Called by {@code FusedCommPlugin}. */
  public FusedCommDriverPlugin() {}

  @Override
  public Map<String, String> init(SparkContext sc, PluginContext pluginContext) {
    SparkConf sparkConf = pluginContext.conf();
    FusedCommConf conf = FusedCommConf.fromSparkConf(sparkConf);
    warnOnGpuScheduling(conf, sparkConf);
    LOG.info("fusedcomm driver plugin started; configuration {}", conf.toMap());
    return Map.of(JOB_TOKEN_KEY, Long.toString(newJobToken(new SecureRandom())));
  }

  @Override
  public Object receive(Object message) {
    if (message instanceof ExecutorStartFailure failure) {
      LOG.error("fusedcomm cannot start on executor {} ({}); its barrier tasks will fail: {}", failure.executorId(),
          failure.host(), failure.reason());
      return Boolean.TRUE;
    }
    throw new IllegalArgumentException("fusedcomm's driver plugin got an unknown message: " + message);
  }

  /** A random non-zero 64-bit token (zero is reserved for "no token"). */
  static long newJobToken(SecureRandom random) {
    long token;
    do {
      token = random.nextLong();
    } while (token == 0);
    return token;
  }

  private static void warnOnGpuScheduling(FusedCommConf conf, SparkConf sparkConf) {
    String amountKey = "spark.executor.resource." + conf.gpuResourceName() + ".amount";
    if (conf.backend() == Backend.CUDA && !sparkConf.contains(amountKey)) {
      // Only a warning: in local mode the "executor" is the driver and uses driver resources.
      LOG.warn(
          "spark.fusedcomm.backend=cuda but {} is not set; barrier tasks will fail"
              + " unless Spark assigns each executor one GPU",
          amountKey);
    }
  }
}
