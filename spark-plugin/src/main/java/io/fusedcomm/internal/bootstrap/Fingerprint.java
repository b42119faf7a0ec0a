package io.fusedcomm.internal.bootstrap;

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Objects;

/**
 * A stable 64-bit hash of an op's parameters (op name, dtype, shapes, ...) together with the
 * human-readable description it was computed from.
 *
 * <p>Every rank puts its fingerprint and description in its bootstrap blob; if the values differ,
 * the ranks were asked for different ops and the communicator is refused, with the differing
 * parameters named (see {@link #describeDifference}). The hash is 64-bit FNV-1a over the UTF-8
 * bytes of the description, so it is identical across JVMs, hosts and releases as long as the
 * description is.
 *
 * <p>Description format: {@code op: name=value; name=value}, parameters in the order added, e.g.
 * {@code allGatherGemm: dtype=bf16; A=512x1024; W=256x1024}.
 */
public final class Fingerprint {
  /** FNV-1a 64-bit offset basis. */
  static final long FNV_OFFSET_BASIS = 0xcbf29ce484222325L;

  /** FNV-1a 64-bit prime. */
  static final long FNV_PRIME = 0x100000001b3L;

  private final long value;
  private final String description;

  private Fingerprint(String description) {
    this.description = description;
    this.value = fnv1a64(description.getBytes(StandardCharsets.UTF_8));
  }

  /** Starts a fingerprint of the op named {@code op}. */
  public static Builder builder(String op) {
    return new Builder(op);
  }

  /** The 64-bit hash. */
  public long value() {
    return value;
  }

  /** The description the hash was computed from. */
  public String description() {
    return description;
  }

  /** 64-bit FNV-1a of {@code data}. */
  public static long fnv1a64(byte[] data) {
    long h = FNV_OFFSET_BASIS;
    for (byte b : data) {
      h ^= b & 0xff;
      h *= FNV_PRIME;
    }
    return h;
  }

  /**
   * Names the parameters that differ between two descriptions, e.g. {@code "A is 256x1024 on rank
   * 1 but 512x1024 on rank 0"}.
   *
   * @param first one description
   * @param firstLabel how to name its owner, e.g. {@code "rank 1"}
   * @param second the other description
   * @param secondLabel how to name its owner
   * @return the differences, comma-separated; both descriptions verbatim when they cannot be
   *     parsed; empty when they are equal
   */
  public static String describeDifference(
      String first, String firstLabel, String second, String secondLabel) {
    if (first.equals(second)) {
      return "";
    }
    Parsed a = Parsed.of(first);
    Parsed b = Parsed.of(second);
    if (a == null || b == null) {
      return "'" + first + "' on " + firstLabel + " but '" + second + "' on " + secondLabel;
    }
    List<String> diffs = new ArrayList<>();
    if (!a.op.equals(b.op)) {
      diffs.add("the op is " + a.op + " on " + firstLabel + " but " + b.op + " on " + secondLabel);
    }
    Map<String, String> union = new LinkedHashMap<>(a.params);
    b.params.forEach(union::putIfAbsent);
    for (String name : union.keySet()) {
      String va = a.params.get(name);
      String vb = b.params.get(name);
      if (!Objects.equals(va, vb)) {
        diffs.add(
            name
                + " is "
                + (va == null ? "absent" : va)
                + " on "
                + firstLabel
                + " but "
                + (vb == null ? "absent" : vb)
                + " on "
                + secondLabel);
      }
    }
    if (diffs.isEmpty()) {
      // Same parameters in a different order.
      diffs.add("parameters in different order: '" + first + "' vs '" + second + "'");
    }
    return String.join(", ", diffs);
  }

  @Override
  public boolean equals(Object o) {
    return o instanceof Fingerprint && ((Fingerprint) o).description.equals(description);
  }

  @Override
  public int hashCode() {
    return Long.hashCode(value);
  }

  @Override
  public String toString() {
    return String.format("%016x (%s)", value, description);
  }

  /** Collects an op's parameters in order. */
  public static final class Builder {
    private final StringBuilder sb;
    private int count;

    private Builder(String op) {
      checkToken("op name", op, ":;=");
      sb = new StringBuilder(op).append(':');
    }

    /** Adds a text parameter such as the dtype. */
    public Builder add(String name, String value) {
      checkToken("parameter name", name, ":;= ");
      checkToken("value of " + name, value, ";");
      sb.append(count++ == 0 ? " " : "; ").append(name).append('=').append(value);
      return this;
    }

    /** Adds an integer parameter such as a world size or a flag count. */
    public Builder add(String name, long value) {
      return add(name, Long.toString(value));
    }

    /** Adds a boolean parameter such as causal. */
    public Builder add(String name, boolean value) {
      return add(name, Boolean.toString(value));
    }

    /** Adds a shape, written {@code 512x1024} ({@code scalar} for no dimensions). */
    public Builder addShape(String name, long... dims) {
      StringBuilder s = new StringBuilder();
      for (long d : dims) {
        s.append(s.length() == 0 ? "" : "x").append(d);
      }
      return add(name, dims.length == 0 ? "scalar" : s.toString());
    }

    /** The fingerprint of the parameters added so far. */
    public Fingerprint build() {
      return new Fingerprint(sb.toString());
    }

    private static void checkToken(String what, String s, String forbidden) {
      Objects.requireNonNull(s, what);
      if (s.isEmpty() && !what.startsWith("value")) {
        throw new IllegalArgumentException(what + " is empty");
      }
      for (int i = 0; i < s.length(); i++) {
        if (forbidden.indexOf(s.charAt(i)) >= 0) {
          throw new IllegalArgumentException(
              what + " '" + s + "' contains '" + s.charAt(i) + "', which fingerprints reserve");
        }
      }
    }
  }

  /** A description split back into op and parameters. */
  private static final class Parsed {
    final String op;
    final Map<String, String> params = new LinkedHashMap<>();

    private Parsed(String op) {
      this.op = op;
    }

    static Parsed of(String description) {
      int colon = description.indexOf(':');
      if (colon <= 0) {
        return null;
      }
      Parsed p = new Parsed(description.substring(0, colon));
      String rest = description.substring(colon + 1).trim();
      if (rest.isEmpty()) {
        return p;
      }
      for (String part : rest.split("; ")) {
        int eq = part.indexOf('=');
        if (eq <= 0) {
          return null;
        }
        p.params.put(part.substring(0, eq), part.substring(eq + 1));
      }
      return p;
    }
  }
}
