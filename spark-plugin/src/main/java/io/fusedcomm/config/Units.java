package io.fusedcomm.config;

import java.time.Duration;
import java.util.Locale;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * Parsing and canonical formatting of the duration and byte-size spellings accepted in
 * configuration.
 *
 * <ul>
 *   <li>Durations: a whole number with unit {@code us}, {@code ms}, {@code s}, {@code m} or
 *       {@code min}, or {@code h}; a plain number means milliseconds. Examples: {@code 60s},
 *       {@code 500ms}, {@code 2m}, {@code 1500}, {@code 200us}.
 *   <li>Byte sizes: a whole number with unit {@code k}, {@code m} or {@code g} (binary: 1k = 1024
 *       bytes; {@code kb}/{@code kib} etc. are accepted too); a plain number or {@code b} means
 *       bytes. Examples: {@code 4m}, {@code 64k}, {@code 1g}.
 * </ul>
 *
 * Units are case-insensitive; blanks around the value and between number and unit are ignored.
 */
public final class Units {
  private static final Pattern NUMBER_UNIT = Pattern.compile("(\\d+)\\s*([a-z]*)");

  private Units() {}

  /**
   * Parses a duration.
   *
   * @throws IllegalArgumentException when {@code text} is not a duration or overflows
   */
  public static Duration parseDuration(String text) {
    Matcher m = match(text);
    long n = Long.parseLong(m.group(1));
    long unitMicros;
    switch (m.group(2)) {
      case "us":
        unitMicros = 1;
        break;
      case "":
      case "ms":
        unitMicros = 1_000;
        break;
      case "s":
        unitMicros = 1_000_000;
        break;
      case "m":
      case "min":
        unitMicros = 60_000_000;
        break;
      case "h":
        unitMicros = 3_600_000_000L;
        break;
      default:
        throw new IllegalArgumentException("unknown duration unit '" + m.group(2) + "'");
    }
    return Duration.ofNanos(Math.multiplyExact(Math.multiplyExact(n, unitMicros), 1_000L));
  }

  /**
   * Formats a duration as whole seconds ({@code 60s}) where exact, else milliseconds, else
   * microseconds ({@code 200us}); parseDuration reads each back (sub-microsecond parts are
   * dropped).
   */
  public static String formatDuration(Duration d) {
    long us = d.toNanos() / 1_000;
    if (us % 1_000 != 0) {
      return us + "us";
    }
    long ms = us / 1_000;
    return ms % 1000 == 0 && ms != 0 ? (ms / 1000) + "s" : ms + "ms";
  }

  /**
   * Parses a byte size.
   *
   * @throws IllegalArgumentException when {@code text} is not a byte size or overflows
   */
  public static long parseBytes(String text) {
    Matcher m = match(text);
    long n = Long.parseLong(m.group(1));
    int shift;
    switch (m.group(2)) {
      case "":
      case "b":
        shift = 0;
        break;
      case "k":
      case "kb":
      case "kib":
        shift = 10;
        break;
      case "m":
      case "mb":
      case "mib":
        shift = 20;
        break;
      case "g":
      case "gb":
      case "gib":
        shift = 30;
        break;
      default:
        throw new IllegalArgumentException("unknown byte unit '" + m.group(2) + "'");
    }
    return Math.multiplyExact(n, 1L << shift);
  }

  /** Formats a byte size with the largest of g, m, k that divides it exactly, else plain bytes. */
  public static String formatBytes(long bytes) {
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

  private static Matcher match(String text) {
    if (text == null) {
      throw new IllegalArgumentException("missing value");
    }
    Matcher m = NUMBER_UNIT.matcher(text.trim().toLowerCase(Locale.ROOT));
    if (!m.matches()) {
      throw new IllegalArgumentException("not a whole number with an optional unit");
    }
    return m;
  }
}
