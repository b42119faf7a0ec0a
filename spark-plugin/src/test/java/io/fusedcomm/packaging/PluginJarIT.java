package io.fusedcomm.packaging;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.Enumeration;
import java.util.List;
import java.util.jar.JarFile;
import java.util.zip.ZipEntry;
import org.junit.jupiter.api.Test;

/**
 * The plugin jar users pass with {@code --jars} (what {@code unzip -l} shows): our classes and
 * our native library, nothing of anyone else's. A third-party class there would clash with the
 * application's own copy (another JCuda version), and a native library nothing loads only makes
 * the jar bigger. Runs after package (failsafe), on the shaded jar.
 */
class PluginJarIT {
  @Test
  void onlyOurClassesAndOurNativeLibrary() throws IOException {
    Path jar = Paths.get(System.getProperty("fusedcomm.plugin.jar"));
    assertTrue(Files.isRegularFile(jar), jar + " is missing");
    List<String> foreign = new ArrayList<>();
    List<String> natives = new ArrayList<>();
    int ourClasses = 0;
    try (JarFile file = new JarFile(jar.toFile())) {
      for (Enumeration<? extends ZipEntry> e = file.entries(); e.hasMoreElements(); ) {
        String name = e.nextElement().getName();
        if (name.endsWith(".so") || name.endsWith(".dll") || name.endsWith(".dylib") || name.endsWith(".jnilib")) {
          natives.add(name);
        } else if (name.startsWith("io/fusedcomm/")) {
          ourClasses += name.endsWith(".class") ? 1 : 0;
        } else if (!(name.equals("META-INF/") || name.equals("META-INF/MANIFEST.MF")
            || name.startsWith("META-INF/maven/io.fusedcomm/") || name.equals("META-INF/maven/")
            || name.equals("io/") || name.equals("linux/") || name.equals("linux/amd64/"))) {
          foreign.add(name);
        }
      }
    }
    System.out.println(jar.getFileName() + ": " + ourClasses + " classes of ours, natives " + natives + ", "
        + Files.size(jar) / 1024 + " KiB");
    assertEquals(List.of(), foreign, "entries that are not fusedcomm's");
    assertEquals(List.of("linux/amd64/libfusedcomm.so"), natives, "native libraries");
    assertTrue(ourClasses > 50, "only " + ourClasses + " classes of ours");
  }
}
