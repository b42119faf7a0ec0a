package io.fusedcomm.plugin;

import java.io.Serializable;

/**
 * What an executor plugin tells the driver plugin (plugin RPC) when fusedcomm cannot start on the
 * executor, so that the reason is in the driver's log.
 */
record ExecutorStartFailure(String executorId, String host, String reason) implements Serializable {
  private static final long serialVersionUID = 1L;
}
