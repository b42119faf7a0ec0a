package io.fusedcomm.gpu;

import io.fusedcomm.runtime.JCudaNatives;
import java.nio.file.Files;
import java.nio.file.Path;
import jcuda.driver.JCudaDriver;

/**
 * A child JVM of {@link JCudaNativesRaceTest}: waits for the start file, loads JCuda's native
 * libraries (under {@link JCudaNatives}' host lock, or with {@code unlocked} the way JCuda does
 * on its own), makes a driver-API call and prints {@code ok}. Exit 3: no start signal in 30 s.
 *
 * <pre>java -Djava.io.tmpdir=DIR -cp ... io.fusedcomm.gpu.JCudaLoadChild START_FILE locked|unlocked</pre>
 */
public final class JCudaLoadChild {
  private JCudaLoadChild() {}

  public static void main(String[] args) throws Exception {
    Path start = Path.of(args[0]);
    long deadline = System.currentTimeMillis() + 30_000;
    while (!Files.exists(start)) {
      if (System.currentTimeMillis() > deadline) {
        System.out.println("no start signal");
        System.exit(3);
      }
      Thread.onSpinWait();
    }
    if (args[1].equals("locked")) {
      JCudaNatives.load();
    } else {
      Class.forName("jcuda.runtime.JCuda");
      Class.forName("jcuda.driver.JCudaDriver");
    }
    int[] count = {0};
    JCudaDriver.cuInit(0);
    JCudaDriver.cuDeviceGetCount(count);
    System.out.println("ok devices=" + count[0]);
  }
}
