package io.fusedcomm.runtime;

import java.io.IOException;
import java.nio.channels.FileChannel;
import java.nio.channels.FileLock;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Loads JCuda's two native libraries (runtime API and driver API) with the other processes of
 * this host that call here held off, so that executors starting together never load a library
 * file another one is still writing.
 *
 * <p>Why: JCuda extracts each library from its jar into {@code java.io.tmpdir} under a fixed name,
 * and writes it only if the file does not exist yet. Two JVMs loading the same library at the
 * same time race: one creates the file and writes it, the other sees it exist and loads it half
 * written, and the dynamic loader dies with SIGBUS (seen on 4 x H200: two executors reached
 * their first driver-API call, a CUDA graph capture, in the same instant on a host where the
 * file did not exist yet; exit code 134). Holding an exclusive lock on a
 * file beside them while the classes initialise (initialisation extracts and loads) makes the
 * second JVM find the file complete. Libraries already loaded in this JVM make this a no-op.
 *
 * <p>fusedcomm itself does not need JCuda (its tensors and streams are raw addresses and
 * handles); this runs only where the application brought JCuda, so that the application's own
 * JCuda calls find the executor's GPU current and its libraries whole.
 */
public final class JCudaNatives {
  private static final Logger LOG = LoggerFactory.getLogger(JCudaNatives.class);
  private static final String[] CLASSES = {"jcuda.runtime.JCuda", "jcuda.driver.JCudaDriver"};
  private static volatile boolean loaded;

  private JCudaNatives() {}

  /** True when JCuda's classes are on this class loader's classpath (nothing is loaded). */
  public static boolean onClasspath() {
    try {
      Class.forName(CLASSES[0], false, JCudaNatives.class.getClassLoader());
      return true;
    } catch (ClassNotFoundException | LinkageError e) {
      return false;
    }
  }

  /** True once {@link #load} succeeded. */
  public static boolean loaded() {
    return loaded;
  }

  /** Makes {@code ordinal} JCuda's current device on the calling thread; only after {@link #load}. */
  static void setDevice(int ordinal) {
    jcuda.runtime.JCuda.cudaSetDevice(ordinal);
  }

  /**
   * Initialises JCuda's runtime and driver classes (which load their libraries) under this
   * host's lock {@code java.io.tmpdir/fusedcomm-jcuda-natives.lock}. Without the lock (a file
   * another user owns, a file system without locks) it logs why and loads anyway.
   */
  public static synchronized void load() {
    if (loaded) {
      return;
    }
    Path lockFile = Path.of(System.getProperty("java.io.tmpdir"), "fusedcomm-jcuda-natives.lock");
    try (FileChannel channel =
            FileChannel.open(lockFile, StandardOpenOption.CREATE, StandardOpenOption.WRITE);
        FileLock lock = channel.lock()) {
      initialiseClasses();
    } catch (IOException e) {
      LOG.warn("loading JCuda's native libraries without the host lock {}: {}", lockFile, e.toString());
      initialiseClasses();
    }
    loaded = true;
  }

  private static void initialiseClasses() {
    for (String name : CLASSES) {
      try {
        Class.forName(name, true, JCudaNatives.class.getClassLoader());
      } catch (ClassNotFoundException e) {
        throw new IllegalStateException("JCuda is not on the classpath (" + name + ")", e);
      }
    }
  }
}
