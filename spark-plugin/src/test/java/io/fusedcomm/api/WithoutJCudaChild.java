package io.fusedcomm.api;

import io.fusedcomm.config.FusedCommConf;
import io.fusedcomm.runtime.ExecutorRuntime;
import io.fusedcomm.testing.InJvmExchange;
import java.util.HashMap;
import java.util.Map;
import java.util.Optional;

/**
 * The child process of {@link WithoutJCudaTest}, started without JCuda on its classpath: a host
 * runtime, a communicator, ops with and without the stream argument, and the device tensor's
 * checks, then "OK". Argument: the native library directory, or "" for the jar's.
 */
public final class WithoutJCudaChild {
  private WithoutJCudaChild() {}

  public static void main(String[] args) throws Exception {
    try {
      Class.forName("jcuda.Pointer");
      throw new AssertionError("JCuda is on the classpath: the test proves nothing");
    } catch (ClassNotFoundException expected) {
      System.out.println("no JCuda on the classpath");
    }
    Map<String, String> settings = new HashMap<>(Map.of("spark.fusedcomm.backend", "host",
        "spark.fusedcomm.transport.bindHost", "127.0.0.1"));
    if (args.length > 0 && !args[0].isEmpty()) {
      settings.put("spark.fusedcomm.native.libraryPath", args[0]);
    }
    try (ExecutorRuntime rt = ExecutorRuntime.create(FusedCommConf.fromMap(settings), "0", Optional.empty(), 1L);
         Communicator comm = CommBootstrap.bootstrap(rt, InJvmExchange.group(1, 5L, 30_000).get(0),
             CommOptions.defaults());
         HostTensor x = HostTensor.of(new float[] {1, 2, 3, 4}, DType.F32, 4);
         HostTensor y = HostTensor.allocate(DType.F32, 4)) {
      rt.pinGpu();
      comm.allReduce(x, y);
      comm.allReduce(x, y, 0L);
      if (y.toFloatArray()[3] != 4f) {
        throw new AssertionError("allReduce at world 1 copies its input");
      }
      try {
        DeviceTensor.wrap(0L, DType.F32, 4);
        throw new AssertionError("wrapping null was accepted");
      } catch (IllegalArgumentException expected) {
        System.out.println("DeviceTensor loads and checks: " + expected.getMessage());
      }
    }
    System.out.println("OK");
  }
}
