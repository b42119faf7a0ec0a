package io.fusedcomm.gpu;

import io.fusedcomm.runtime.NativeApi;
import org.junit.jupiter.api.Assumptions;

/** GPU test gate: skips (with the probe's reason, printed) where the cuda backend is unavailable. */
final class Gpu {
  private Gpu() {}

  /** The probe's line for the cuda backend, e.g. "cuda: unavailable: no usable NVIDIA GPU ...". */
  static String cudaLine() {
    for (String line : NativeApi.availability().split("\n")) {
      if (line.startsWith("cuda:")) {
        return line;
      }
    }
    throw new AssertionError("the availability report has no cuda line: " + NativeApi.availability());
  }

  static boolean present() {
    return cudaLine().startsWith("cuda: available");
  }

  static void require() {
    if (!present()) {
      System.out.println("SKIPPED (no GPU): " + cudaLine());
    }
    Assumptions.assumeTrue(present(), "no GPU: " + cudaLine());
  }
}
