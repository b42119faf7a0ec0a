package io.fusedcomm.config;

/**
 * The libfabric provider the libfabric transport runs on, as chosen by {@code
 * spark.fusedcomm.libfabric.provider}. Mirrors {@code fc_libfabric_provider_t} of the native C
 * API: the same names and {@link #code()} values.
 */
public enum LibfabricProvider {
  /** efa where present, else verbs, else tcp. */
  AUTO("auto", 0),
  /** AWS Elastic Fabric Adapter (SRD). */
  EFA("efa", 1),
  /** {@code verbs;ofi_rxm}: InfiniBand and RoCE NICs. */
  VERBS("verbs", 2),
  /** {@code tcp;ofi_rxm}: any network; what CI tests. */
  TCP("tcp", 3),
  /** Shared memory: executors of one host only. */
  SHM("shm", 4);

  private final String configName;
  private final int code;

  LibfabricProvider(String configName, int code) {
    this.configName = configName;
    this.code = code;
  }

  /** The spelling used in configuration. */
  public String configName() {
    return configName;
  }

  /** The value of {@code FC_LIBFABRIC_<name>} in the native C API. */
  public int code() {
    return code;
  }

  @Override
  public String toString() {
    return configName;
  }
}
