package io.fusedcomm.config;

/** The inter-process transport, as chosen by {@code spark.fusedcomm.transport}. */
public enum TransportKind {
  /** The best transport available between the executors' processes: {@link #SOCKET} today. */
  AUTO("auto"),
  /** TCP sockets; works on every host. */
  SOCKET("socket");

  private final String configName;

  TransportKind(String configName) {
    this.configName = configName;
  }

  /** The spelling used in configuration. */
  public String configName() {
    return configName;
  }

  @Override
  public String toString() {
    return configName;
  }
}
