package io.fusedcomm.runtime;

import io.fusedcomm.errors.BackendUnavailableException;
import java.io.IOException;
import java.io.InputStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.nio.file.StandardCopyOption;
import java.util.Locale;

/**
 * Loads libfusedcomm.so once per JVM: from the directory named by {@link #setDirectory} (config
 * {@code spark.fusedcomm.native.libraryPath}, for development) or else from the jar, under
 * {@code <os>/<arch>/}. The jar's copy is extracted to a file unique to this process, so executors
 * starting together on one host never race on it.
 */
public final class NativeLibrary {
  static final String NAME = "libfusedcomm.so";
  private static volatile String directory = "";
  private static volatile boolean loaded;
  private static Throwable failure;

  private NativeLibrary() {}

  /** Loads from {@code dir} instead of the jar; only effective before the first load. */
  public static void setDirectory(String dir) {
    directory = dir == null ? "" : dir;
  }

  /** The jar resource path for this platform, e.g. {@code linux/amd64/libfusedcomm.so}. */
  static String resourcePath() {
    String os = System.getProperty("os.name", "").toLowerCase(Locale.ROOT);
    String arch = System.getProperty("os.arch", "").toLowerCase(Locale.ROOT);
    if (!os.contains("linux")) {
      throw new BackendUnavailableException(
          "fusedcomm's native library is built for Linux only; this JVM runs on " + os);
    }
    if (!arch.equals("amd64") && !arch.equals("x86_64")) {
      throw new BackendUnavailableException(
          "fusedcomm's native library is built for x86-64 only; this JVM runs on " + arch);
    }
    return "linux/amd64/" + NAME;
  }

  /** Loads the library if it is not loaded yet; throws with the reason when it cannot. */
  public static synchronized void ensureLoaded() {
    if (loaded) {
      return;
    }
    if (failure != null) {
      throw new BackendUnavailableException(
          null, "fusedcomm's native library failed to load earlier: " + failure.getMessage(), failure);
    }
    try {
      if (!directory.isEmpty()) {
        Path p = Paths.get(directory, NAME).toAbsolutePath();
        if (!Files.isRegularFile(p)) {
          throw new BackendUnavailableException(
              "spark.fusedcomm.native.libraryPath is " + directory + " but " + p + " does not exist");
        }
        System.load(p.toString());
      } else {
        System.load(extract(resourcePath()).toString());
      }
      loaded = true;
    } catch (BackendUnavailableException e) {
      failure = e;
      throw e;
    } catch (IOException | LinkageError e) {
      // LinkageError: UnsatisfiedLinkError, or NoClassDefFoundError from JNI_OnLoad, which loads
      // the exception classes the error paths throw (jni_onload.cc) and names one it cannot load.
      failure = e;
      throw new BackendUnavailableException(
          null, "fusedcomm's native library could not be loaded (" + e.getMessage() + ")", e);
    }
  }

  private static Path extract(String resource) throws IOException {
    try (InputStream in = NativeLibrary.class.getClassLoader().getResourceAsStream(resource)) {
      if (in == null) {
        throw new BackendUnavailableException(
            "the native library "
                + resource
                + " is missing from the classpath: pass the fusedcomm plugin jar (not the thin"
                + " jar) with --jars, or set spark.fusedcomm.native.libraryPath");
      }
      Path dir = Files.createTempDirectory("fusedcomm-native-");
      Path file = dir.resolve(NAME);
      Files.copy(in, file, StandardCopyOption.REPLACE_EXISTING);
      file.toFile().deleteOnExit();
      dir.toFile().deleteOnExit();
      return file;
    }
  }
}
