package io.fusedcomm.errors;

/**
 * A fusedcomm configuration value or key is wrong. Thrown at application or executor start-up,
 * before any work runs, with the key, the offending value and what is expected.
 */
public class ConfigException extends IllegalArgumentException {
  private static final long serialVersionUID = 1L;

  private final String key;
  private final String value;

  /**
   * A configuration error.
   *
   * @param message the full sentence shown to the user
   * @param key the configuration key concerned, or null
   * @param value the offending value, or null
   */
  public ConfigException(String message, String key, String value) {
    super(message);
    this.key = key;
    this.value = value;
  }

  /** {@code key}'s {@code value} does not parse or is out of range; {@code expected} says what would. */
  public static ConfigException invalidValue(String key, String value, String expected) {
    return new ConfigException(
        "Invalid value '" + value + "' for " + key + ": expected " + expected + ".", key, value);
  }

  /** The key concerned, or null. */
  public String key() {
    return key;
  }

  /** The offending value, or null. */
  public String value() {
    return value;
  }
}
