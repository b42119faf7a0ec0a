package io.fusedcomm.api;

/** bfloat16 conversions, bit-compatible with the native library's. */
public final class Bf16 {
  private Bf16() {}

  /** Rounds to nearest, ties to even; NaN stays a (quiet) NaN. */
  public static short fromFloat(float f) {
    int bits = Float.floatToRawIntBits(f);
    if (Float.isNaN(f)) {
      return (short) ((bits >>> 16) | 0x0040);
    }
    int rounding = 0x7FFF + ((bits >>> 16) & 1);
    return (short) ((bits + rounding) >>> 16);
  }

  /** Exact widening. */
  public static float toFloat(short b) {
    return Float.intBitsToFloat((b & 0xFFFF) << 16);
  }

  /** The float nearest to {@code f} that bf16 can hold. */
  public static float round(float f) {
    return toFloat(fromFloat(f));
  }
}
