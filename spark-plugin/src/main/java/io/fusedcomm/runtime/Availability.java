package io.fusedcomm.runtime;

/**
 * Prints the native library's availability report, one line per backend and transport ({@code
 * name: available|unavailable: reason}), to check a host before a job: {@code java -cp
 * fusedcomm-<version>.jar io.fusedcomm.runtime.Availability}. Its {@code transport.libfabric} line
 * says, per libfabric provider, whether the libfabric transport can run on it and how.
 */
public final class Availability {
  private Availability() {}

  public static void main(String[] args) {
    System.out.print(NativeApi.availability());
  }
}
