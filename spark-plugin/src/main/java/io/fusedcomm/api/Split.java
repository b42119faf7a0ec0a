package io.fusedcomm.api;

import java.util.List;

/**
 * The uneven-split rule every op and backend follows: {@code n} items over {@code w} ranks give
 * rank {@code r} {@code n / w + (r < n % w ? 1 : 0)} items, starting at {@code r·(n / w) +
 * min(r, n % w)}; the first {@code n % w} ranks hold one more (as numpy.array_split). For
 * example 10 rows over 4 ranks: 3, 3, 2, 2. {@link #positions} applies it to the sequence
 * layouts of ring attention.
 */
public final class Split {
  private Split() {}

  /** A run of {@code count} consecutive positions from {@code offset}. */
  public record Run(long offset, long count) {}

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

  /**
   * The positions of a sequence of {@code n} that rank {@code r} of {@code w} holds under {@code
   * layout}, as the runs they form, in the order they sit in the rank's tensors: {@link
   * SequenceLayout#CONTIGUOUS} one run ({@link #offset}, {@link #count}); {@link
   * SequenceLayout#ZIGZAG} two, chunks {@code r} and {@code 2w-1-r} of the sequence split into
   * {@code 2w} chunks by this rule (either may be empty). For example 10 positions over 2 ranks,
   * zigzag: chunks of 3, 3, 2, 2; rank 0 holds 0-2 then 8-9, rank 1 holds 3-5 then 6-7.
   */
  public static List<Run> positions(long n, int w, int r, SequenceLayout layout) {
    check(n, w, r);
    if (layout == null) {
      throw new IllegalArgumentException("the sequence layout must not be null");
    }
    if (layout == SequenceLayout.CONTIGUOUS) {
      return List.of(new Run(offset(n, w, r), count(n, w, r)));
    }
    int chunks = Math.multiplyExact(2, w);
    int last = chunks - 1 - r;
    return List.of(new Run(offset(n, chunks, r), count(n, chunks, r)),
        new Run(offset(n, chunks, last), count(n, chunks, last)));
  }

  /** How many positions rank {@code r} holds under {@code layout}: the sum of its {@link #positions}. */
  public static long count(long n, int w, int r, SequenceLayout layout) {
    long total = 0;
    for (Run run : positions(n, w, r, layout)) {
      total += run.count();
    }
    return total;
  }

  private static void check(long n, int w, int r) {
    if (n < 0 || w < 1 || r < 0 || r >= w) {
      throw new IllegalArgumentException(
          "split of " + n + " items over " + w + " ranks for rank " + r + " is undefined");
    }
  }
}
