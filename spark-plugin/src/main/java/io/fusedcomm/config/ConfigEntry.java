package io.fusedcomm.config;

import io.fusedcomm.errors.ConfigException;
import java.time.Duration;
import java.util.Locale;
import java.util.Objects;
import java.util.StringJoiner;
import java.util.concurrent.TimeUnit;
import java.util.function.Function;
import java.util.function.Predicate;
import org.apache.spark.network.util.JavaUtils;

/**
 * One typed configuration setting: its key, type, default, documentation, parser and bounds.
 *
 * <p>Settings are declared once, as constants of {@link FusedCommConf}; parsing, validation,
 * {@code docs/configs.md} and {@code conf/spark-defaults.conf.template} all derive from the
 * declaration. Build one with {@link #builder(String)}:
 *
 * <pre>{@code
 * ConfigEntry<Duration> TIMEOUT = ConfigEntry.builder("spark.fusedcomm.timeout")
 *     .doc("Bound on every wait inside an op.")
 *     .durationConf()
 *     .check(d -> !d.isNegative() && !d.isZero(), "a duration > 0")
 *     .createWithDefault(Duration.ofSeconds(60));
 * }</pre>
 *
 * @param <T> the value type
 */
public final class ConfigEntry<T> {
  private final String key;
  private final String doc;
  private final String typeName;
  private final String expected;
  private final T defaultValue;
  private final Function<String, T> parser;
  private final Function<T, String> formatter;
  private final Predicate<T> check;

  private ConfigEntry(
      String key,
      String doc,
      String typeName,
      String expected,
      T defaultValue,
      Function<String, T> parser,
      Function<T, String> formatter,
      Predicate<T> check) {
    this.key = key;
    this.doc = doc;
    this.typeName = typeName;
    this.expected = expected;
    this.defaultValue = defaultValue;
    this.parser = parser;
    this.formatter = formatter;
    this.check = check;
  }

  /** Starts declaring the setting {@code key}. */
  public static Builder builder(String key) {
    return new Builder(key);
  }

  /** The full key, e.g. {@code spark.fusedcomm.timeout}. */
  public String key() {
    return key;
  }

  /** What the setting means, for users. */
  public String doc() {
    return doc;
  }

  /** The type as shown in the documentation, e.g. {@code duration} or {@code auto|cuda|host}. */
  public String typeName() {
    return typeName;
  }

  /** What a valid value looks like, as used in error messages. */
  public String expected() {
    return expected;
  }

  /** The value when the key is not set. */
  public T defaultValue() {
    return defaultValue;
  }

  /** The default in its canonical configuration spelling. */
  public String defaultString() {
    return format(defaultValue);
  }

  /** A value in its canonical configuration spelling; {@code parse(format(v))} equals {@code v}. */
  public String format(T value) {
    return formatter.apply(value);
  }

  /**
   * Parses and bounds-checks a configured value.
   *
   * @throws ConfigException naming this key, the value and what is expected
   */
  public T parse(String raw) {
    T value;
    try {
      value = parser.apply(raw);
    } catch (IllegalArgumentException | ArithmeticException e) {
      throw ConfigException.invalidValue(key, raw, expected);
    }
    if (!check.test(value)) {
      throw ConfigException.invalidValue(key, raw, expected);
    }
    return value;
  }

  @Override
  public String toString() {
    return key + " (" + typeName + ", default " + defaultString() + ")";
  }

  /**
   * A duration as Spark parses its own ({@code JavaUtils.timeStringAs}): a whole number, optionally
   * negative, with unit {@code us}, {@code ms}, {@code s}, {@code m} or {@code min}, {@code h} or
   * {@code d}, case-insensitive, no blank between number and unit; a plain number means
   * milliseconds (as for {@code spark.network.timeout}-style settings read in milliseconds).
   * Kept to the microsecond.
   *
   * @throws IllegalArgumentException when {@code text} is not a duration
   * @throws ArithmeticException when it overflows
   */
  static Duration parseDuration(String text) {
    String t = Objects.requireNonNull(text, "value").trim();
    long micros = t.matches("-?[0-9]+")
        ? Math.multiplyExact(JavaUtils.timeStringAsMs(t), 1000L)
        : JavaUtils.timeStringAs(t, TimeUnit.MICROSECONDS);
    // TimeUnit.convert saturates instead of overflowing: a saturated value overflows here.
    return Duration.ofNanos(Math.multiplyExact(micros, 1000L));
  }

  /**
   * Whole seconds ({@code 60s}) where exact, else milliseconds, else microseconds ({@code 200us});
   * {@link #parseDuration} reads each back (sub-microsecond parts are dropped).
   */
  static String formatDuration(Duration d) {
    long us = d.toNanos() / 1_000;
    if (us % 1_000 != 0) {
      return us + "us";
    }
    long ms = us / 1_000;
    return ms % 1000 == 0 && ms != 0 ? (ms / 1000) + "s" : ms + "ms";
  }

  /**
   * A byte size as Spark parses its own ({@code JavaUtils.byteStringAsBytes}): a whole number
   * with unit {@code b}, {@code k} or {@code kb}, {@code m} or {@code mb}, {@code g} or {@code gb},
   * {@code t} or {@code tb}, {@code p} or {@code pb} (binary: 1k = 1024 bytes), case-insensitive,
   * no blank between number and unit; a plain number means bytes.
   *
   * @throws IllegalArgumentException when {@code text} is not a byte size or overflows
   */
  static long parseBytes(String text) {
    return JavaUtils.byteStringAsBytes(Objects.requireNonNull(text, "value"));
  }

  /** The largest of g, m, k that divides {@code bytes} exactly, else plain bytes. */
  static String formatBytes(long bytes) {
    if (bytes != 0) {
      if (bytes % (1L << 30) == 0) {
        return (bytes >> 30) + "g";
      }
      if (bytes % (1L << 20) == 0) {
        return (bytes >> 20) + "m";
      }
      if (bytes % (1L << 10) == 0) {
        return (bytes >> 10) + "k";
      }
    }
    return Long.toString(bytes);
  }

  /** First stage of a declaration: key and documentation, then the type. */
  public static final class Builder {
    private final String key;
    private String doc = "";

    private Builder(String key) {
      this.key = Objects.requireNonNull(key, "key");
    }

    /** Sets the documentation: one or a few sentences for users. */
    public Builder doc(String doc) {
      this.doc = Objects.requireNonNull(doc, "doc");
      return this;
    }

    /** A duration, spelled as Spark's own time settings: see {@link #parseDuration}. */
    public TypedBuilder<Duration> durationConf() {
      return new TypedBuilder<>(
          this,
          "duration",
          "a duration such as 60s, 500ms or 2m (a plain number means milliseconds)",
          ConfigEntry::parseDuration,
          ConfigEntry::formatDuration);
    }

    /** A byte size, as a {@code long} number of bytes, spelled as Spark's: see {@link #parseBytes}. */
    public TypedBuilder<Long> bytesConf() {
      return new TypedBuilder<>(
          this,
          "bytes",
          "a byte size such as 64k, 4m or 1g (a plain number means bytes)",
          ConfigEntry::parseBytes,
          ConfigEntry::formatBytes);
    }

    /** A decimal {@code int}. */
    public TypedBuilder<Integer> intConf() {
      return new TypedBuilder<>(
          this, "int", "a whole number such as 2", s -> Integer.valueOf(s.trim()), String::valueOf);
    }

    /** {@code true} or {@code false}, ignoring case. */
    public TypedBuilder<Boolean> booleanConf() {
      return new TypedBuilder<>(
          this,
          "boolean",
          "true or false",
          s -> {
            String v = s == null ? "" : s.trim().toLowerCase(Locale.ROOT);
            if (v.equals("true")) {
              return Boolean.TRUE;
            }
            if (v.equals("false")) {
              return Boolean.FALSE;
            }
            throw new IllegalArgumentException("not a boolean");
          },
          String::valueOf);
    }

    /** Any string, taken as is. */
    public TypedBuilder<String> stringConf() {
      return new TypedBuilder<>(
          this,
          "string",
          "a string",
          s -> Objects.requireNonNull(s, "value"),
          s -> s);
    }

    /**
     * One constant of {@code type}, written as {@code spelling} gives it (ignoring case).
     *
     * @param type the enum class
     * @param spelling the configuration spelling of each constant
     */
    public <E extends Enum<E>> TypedBuilder<E> enumConf(Class<E> type, Function<E, String> spelling) {
      StringJoiner names = new StringJoiner("|");
      for (E e : type.getEnumConstants()) {
        names.add(spelling.apply(e));
      }
      return new TypedBuilder<>(
          this,
          names.toString(),
          "one of " + names,
          s -> {
            String v = s == null ? "" : s.trim();
            for (E e : type.getEnumConstants()) {
              if (spelling.apply(e).equalsIgnoreCase(v)) {
                return e;
              }
            }
            throw new IllegalArgumentException("not a " + type.getSimpleName());
          },
          spelling);
    }
  }

  /**
   * Second stage of a declaration: optional bounds, then the default.
   *
   * @param <T> the value type
   */
  public static final class TypedBuilder<T> {
    private final Builder base;
    private final String typeName;
    private String expected;
    private final Function<String, T> parser;
    private final Function<T, String> formatter;
    private Predicate<T> check = v -> true;

    private TypedBuilder(
        Builder base,
        String typeName,
        String expected,
        Function<String, T> parser,
        Function<T, String> formatter) {
      this.base = base;
      this.typeName = typeName;
      this.expected = expected;
      this.parser = parser;
      this.formatter = formatter;
    }

    /**
     * Adds a bound.
     *
     * @param valid true for acceptable values
     * @param expected what an acceptable value is, replacing the type's generic description in
     *     error messages (e.g. {@code "a duration > 0 such as 60s"})
     */
    public TypedBuilder<T> check(Predicate<T> valid, String expected) {
      Predicate<T> previous = check;
      this.check = v -> previous.test(v) && valid.test(v);
      this.expected = expected;
      return this;
    }

    /**
     * Finishes the declaration.
     *
     * @throws IllegalStateException if the default itself fails the bounds (a programming error)
     */
    public ConfigEntry<T> createWithDefault(T defaultValue) {
      Objects.requireNonNull(defaultValue, "defaultValue");
      if (!check.test(defaultValue)) {
        throw new IllegalStateException("default of " + base.key + " violates its own bounds");
      }
      return new ConfigEntry<>(
          base.key, base.doc, typeName, expected, defaultValue, parser, formatter, check);
    }
  }
}
