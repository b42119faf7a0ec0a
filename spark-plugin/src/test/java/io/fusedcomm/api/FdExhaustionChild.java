package io.fusedcomm.api;

import io.fusedcomm.config.FusedCommConf;
import io.fusedcomm.internal.bootstrap.RankInfo;
import io.fusedcomm.runtime.ExecutorRuntime;
import java.io.FileInputStream;
import java.io.IOException;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;

/**
 * The child process of {@link ErrorClassesLoadedTest}: starts a host runtime, opens files until
 * the process has no descriptor left ("Too many open files"), then makes a native call fail
 * (a communicator dialling a peer needs a socket) and prints the exception it got: "THROWN
 * <class>: <message>". Argument: the native library directory, or "" for the jar's.
 */
public final class FdExhaustionChild {
  private FdExhaustionChild() {}

  public static void main(String[] args) throws Exception {
    Map<String, String> settings = new HashMap<>(Map.of("spark.fusedcomm.backend", "host",
        "spark.fusedcomm.timeout", "2s", "spark.fusedcomm.connectTimeout", "2s",
        "spark.fusedcomm.transport.bindHost", "127.0.0.1"));
    if (args.length > 0 && !args[0].isEmpty()) {
      settings.put("spark.fusedcomm.native.libraryPath", args[0]);
    }
    Throwable thrown = null;
    String exhausted = "";
    FusedCommConf conf = FusedCommConf.fromMap(settings);
    try (ExecutorRuntime rt = ExecutorRuntime.create(conf, "0", Optional.empty(), 1L)) {
      long comm = NativeOps.commCreate(rt.handle(), 1, 2);
      String mine = NativeOps.commEndpoint(comm);
      report("warm-up", new RuntimeException("loads the report's code before the descriptors run out"));
      List<FileInputStream> held = new ArrayList<>();
      try {
        while (true) {
          held.add(new FileInputStream("/dev/null"));
        }
      } catch (IOException e) {
        exhausted = e.getMessage();
      }
      try {
        // Rank 1 dials rank 0, whose address no one listens on; it needs a socket first.
        byte[] share = new byte[RankInfo.AUTH_SHARE_BYTES];
        NativeOps.commConnect(comm, new String[] {"127.0.0.1:1#1", mine}, 1, 99L,
            new byte[][] {share, share}, new byte[][] {new byte[0], new byte[0]}, new int[] {0, 0});
      } catch (Throwable t) {
        thrown = t;
      }
      for (FileInputStream f : held) {
        f.close();
      }
      NativeOps.commAbort(comm);
      NativeOps.commClose(comm);
    }
    System.out.println("EXHAUSTED after opening files: " + exhausted);
    report("THROWN", thrown);
  }

  private static void report(String what, Throwable t) {
    System.out.println(what + " " + (t == null ? "nothing" : t.getClass().getName() + ": " + t.getMessage()));
  }
}
