package io.fusedcomm.config;

/**
 * The inter-process transport, as chosen by {@code spark.fusedcomm.transport}. Mirrors {@code
 * fc_transport_t} of the native C API: the same names and {@link #code()} values.
 */
public enum TransportKind {
  /**
   * {@link #LIBFABRIC} where libfabric finds an RDMA provider (efa, or verbs on InfiniBand /
   * RoCE), else {@link #SOCKET}; each executor logs what it chose.
   */
  AUTO("auto", 0),
  /** TCP sockets; works on every host. */
  SOCKET("socket", 1),
  /** libfabric, opened at run time, on {@code spark.fusedcomm.libfabric.provider}. */
  LIBFABRIC("libfabric", 2);

  private final String configName;
  private final int code;

  TransportKind(String configName, int code) {
    this.configName = configName;
    this.code = code;
  }

  /** The spelling used in configuration. */
  public String configName() {
    return configName;
  }

  /** The value of {@code FC_TRANSPORT_<name>} in the native C API. */
  public int code() {
    return code;
  }

  @Override
  public String toString() {
    return configName;
  }
}
