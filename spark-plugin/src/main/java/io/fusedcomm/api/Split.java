package io.fusedcomm.api;

/**
 * The uneven-split rule every op and backend follows: {@code n} items over {@code w} ranks give
 * rank {@code r} {@code n / w + (r < n % w ? 1 : 0)} items, starting at {@code r·(n / w) +
 * min(r, n % w)}; the first {@code n % w} ranks hold one more (as numpy.array_split). For
 * example 10 rows over 4 ranks: 3, 3, 2, 2.
 */
public final class Split {
  private Split() {}

  /** Items rank {@code r} of {@code w} holds. */
  public static long count(long n, int w, int r) {
    check(n, w, r);
    return n / w + (r < n % w ? 1 : 0);
  }

  /** Index of rank {@code r}'s first item. */
  public static long offset(long n, int w, int r) {
    check(n, w, r);
    return (long) r * (n / w) + Math.min(r, n % w);
  }

  private static void check(long n, int w, int r) {
    if (n < 0 || w < 1 || r < 0 || r >= w) {
      throw new IllegalArgumentException(
          "split of " + n + " items over " + w + " ranks for rank " + r + " is undefined");
    }
  }
}
