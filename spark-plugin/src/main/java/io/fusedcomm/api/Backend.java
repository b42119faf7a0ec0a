package io.fusedcomm.api;

import io.fusedcomm.errors.ConfigException;
import java.util.Locale;

/**
 * Which implementation runs the fused ops, as chosen by {@code spark.fusedcomm.backend}.
 *
 * <p>A communicator always runs on a resolved backend ({@link #CUDA} or {@link #HOST}); {@link
 * #AUTO} only exists in configuration and is resolved per executor at start-up. Mirrors {@code
 * fc_backend_t} of the native C API ({@code FC_BACKEND_<name>}): the same names and {@link #code()
 * values}.
 */
public enum Backend {
  /** CUDA when this executor has a GPU and the CUDA backend is available, else HOST. */
  AUTO("auto", 0),
  /** The GPU kernels; it is an error if the executor has no usable GPU. */
  CUDA("cuda", 1),
  /** The C++ reference implementation on the CPU (oracle and GPU-less CI). */
  HOST("host", 2);

  private final String configName;
  private final int code;

  Backend(String configName, int code) {
    this.configName = configName;
    this.code = code;
  }

  /** The value of {@code FC_BACKEND_<name>} in the native C API. */
  public int code() {
    return code;
  }

  /**
   * The backend whose {@link #code()} is {@code code}.
   *
   * @throws IllegalArgumentException for a value no backend has
   */
  public static Backend fromCode(int code) {
    for (Backend b : values()) {
      if (b.code == code) {
        return b;
      }
    }
    throw new IllegalArgumentException("unknown backend code " + code);
  }

  /** The spelling used in configuration and messages: {@code auto}, {@code cuda} or {@code host}. */
  public String configName() {
    return configName;
  }

  /** True for {@link #CUDA} and {@link #HOST}, the backends a communicator can run on. */
  public boolean isResolved() {
    return this != AUTO;
  }

  /**
   * Parses a configuration spelling, ignoring case and surrounding blanks.
   *
   * @throws ConfigException naming {@code key} when {@code value} is not a backend
   */
  public static Backend fromConfig(String key, String value) {
    String v = value == null ? "" : value.trim().toLowerCase(Locale.ROOT);
    for (Backend b : values()) {
      if (b.configName.equals(v)) {
        return b;
      }
    }
    throw ConfigException.invalidValue(key, value, "one of auto|cuda|host");
  }

  @Override
  public String toString() {
    return configName;
  }
}
