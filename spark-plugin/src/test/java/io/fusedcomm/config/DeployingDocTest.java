package io.fusedcomm.config;

import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Set;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import java.util.stream.Collectors;
import java.util.stream.Stream;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/**
 * Keeps docs/deploying.md true as the code moves: every error message its table quotes still
 * exists in the sources, and every {@code spark.fusedcomm.*} key it names is declared.
 */
class DeployingDocTest {
  private static final String DOC = "docs/deploying.md";
  /**
   * Where the messages a user can meet are written: the product sources of these trees (tests
   * and benchmarks left out), whatever their layout inside.
   */
  private static final List<String> SOURCE_DIRS =
      List.of("spark-plugin/src/main/java", "executor-native", "rdma", "kernels");
  private static final Pattern SOURCE_FILE = Pattern.compile(".*\\.(java|cc|h|cu|cuh)");

  private static String doc;
  private static String sources;

  @BeforeAll
  static void read() throws IOException {
    Path root = ConfigDocs.repoRoot();
    doc = Files.readString(root.resolve(DOC), StandardCharsets.UTF_8);
    StringBuilder sb = new StringBuilder();
    for (String dir : SOURCE_DIRS) {
      try (Stream<Path> files = Files.walk(root.resolve(dir))) {
        for (Path f : files.filter(p -> Files.isRegularFile(p) && isProductSource(root.relativize(p))).toList()) {
          sb.append(read(f)).append('\n');
        }
      }
    }
    sources = sb.toString();
  }

  @Test
  void everyQuotedMessageExistsInTheSources() {
    List<String> messages = quotedMessages();
    assertTrue(messages.size() >= 8, "the error table lost its rows: " + messages);
    for (String message : messages) {
      // "..." stands for the parts the code fills in; each literal part must be in one string.
      for (String part : message.split("\\.\\.\\.")) {
        String literal = part.strip();
        if (literal.length() < 4) {
          continue;
        }
        assertTrue(
            sources.contains(literal),
            DOC + " quotes '" + message + "', but no source under " + SOURCE_DIRS + " contains '"
                + literal + "'");
      }
    }
  }

  @Test
  void everyNamedKeyIsDeclared() {
    Set<String> keys = FusedCommConf.all().stream().map(ConfigEntry::key).collect(Collectors.toSet());
    Matcher m = Pattern.compile("spark\\.fusedcomm\\.[A-Za-z.]*[A-Za-z]").matcher(doc);
    List<String> named = new ArrayList<>();
    while (m.find()) {
      named.add(m.group());
    }
    assertFalse(named.isEmpty(), DOC + " names no key");
    for (String key : named) {
      assertTrue(keys.contains(key), DOC + " names " + key + ", which FusedCommConf does not declare");
    }
  }

  /** The first cells of the table under "When something fails": `message` with "..." holes. */
  private static List<String> quotedMessages() {
    String section = doc.substring(doc.indexOf("## When something fails"));
    Matcher m = Pattern.compile("(?m)^\\| `([^`]+)` \\|").matcher(section);
    List<String> out = new ArrayList<>();
    while (m.find()) {
      out.add(m.group(1));
    }
    return out;
  }

  /** {@code f}: relative to the repository root. */
  private static boolean isProductSource(Path f) {
    for (Path part : f) {
      String name = part.toString();
      if (name.equals("tests") || name.equals("test") || name.equals("bench") || name.equals("target")) {
        return false;
      }
    }
    return SOURCE_FILE.matcher(f.getFileName().toString()).matches();
  }

  private static String read(Path f) {
    try {
      return new String(Files.readAllBytes(f), StandardCharsets.ISO_8859_1);
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
  }
}
