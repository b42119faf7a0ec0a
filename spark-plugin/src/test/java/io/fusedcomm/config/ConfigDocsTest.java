package io.fusedcomm.config;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

class ConfigDocsTest {

  @Test
  void committedConfigsMdIsUpToDate() throws IOException {
    assertCommitted(ConfigDocs.CONFIGS_MD, ConfigDocs.configsMarkdown());
  }

  @Test
  void committedDefaultsTemplateIsUpToDate() throws IOException {
    assertCommitted(ConfigDocs.DEFAULTS_TEMPLATE, ConfigDocs.sparkDefaultsTemplate());
  }

  @Test
  void generatedContentCoversEveryKey() {
    String md = ConfigDocs.configsMarkdown();
    String template = ConfigDocs.sparkDefaultsTemplate();
    for (ConfigEntry<?> e : FusedCommConf.all()) {
      assertTrue(md.contains("| `" + e.key() + "` |"), e.key());
      assertTrue(template.contains("\n#" + e.key()), e.key());
    }
    assertTrue(md.contains("| `spark.fusedcomm.timeout` | `60s` | duration |"), md);
    assertTrue(md.contains("auto\\|cuda\\|host"), md);
    // Angle brackets would be read as HTML tags by markdown renderers.
    assertTrue(md.contains("spark.executor.resource.&lt;name&gt;.amount"), md);
    for (String line :
        List.of(
            "\nspark.plugins ",
            "\nspark.executor.resource.gpu.amount ",
            "\nspark.task.resource.gpu.amount ",
            "\nspark.executor.resource.gpu.discoveryScript ")) {
      assertTrue(template.contains(line), line);
    }
    assertTrue(template.contains("io.fusedcomm.FusedCommPlugin\n"));
    assertTrue(template.contains("<path>/conf/gpu-discovery.sh\n"));
  }

  @Test
  void mainWritesBothFiles(@TempDir Path root) throws IOException {
    ConfigDocs.main(new String[] {root.toString()});
    assertEquals(
        ConfigDocs.configsMarkdown(),
        Files.readString(root.resolve(ConfigDocs.CONFIGS_MD), StandardCharsets.UTF_8));
    assertEquals(
        ConfigDocs.sparkDefaultsTemplate(),
        Files.readString(root.resolve(ConfigDocs.DEFAULTS_TEMPLATE), StandardCharsets.UTF_8));
  }

  @Test
  void wrapKeepsWordsAndWidth() {
    List<String> lines = ConfigDocs.wrap("aa bb cc dd", 5);
    assertEquals(List.of("aa bb", "cc dd"), lines);
    assertEquals(List.of("averyverylongword"), ConfigDocs.wrap("averyverylongword", 5));
  }

  @Test
  void differenceNamesTheLine() {
    assertEquals("line 2 should be 'b' but is 'x'", firstDifference("a\nb\n", "a\nx\n"));
    assertEquals(
        "line 3 should be '' but is '<end of file>'", firstDifference("a\nb\n", "a\nb"));
  }

  private static void assertCommitted(String relative, String expected) throws IOException {
    Path file = ConfigDocs.repoRoot().resolve(relative);
    String actual = Files.exists(file) ? Files.readString(file, StandardCharsets.UTF_8) : null;
    if (!expected.equals(actual)) {
      String problem =
          actual == null
              ? " is missing"
              : " is out of date (" + firstDifference(expected, actual) + ")";
      fail(
          file
              + problem
              + "; it is generated from the declarations in FusedCommConf. Regenerate it from the"
              + " repository root with: "
              + ConfigDocs.REGENERATE_COMMAND);
    }
  }

  private static String firstDifference(String expected, String actual) {
    String[] e = expected.split("\n", -1);
    String[] a = actual.split("\n", -1);
    for (int i = 0; i < Math.max(e.length, a.length); i++) {
      String el = i < e.length ? e[i] : "<end of file>";
      String al = i < a.length ? a[i] : "<end of file>";
      if (!el.equals(al)) {
        return "line " + (i + 1) + " should be '" + el + "' but is '" + al + "'";
      }
    }
    return "line endings differ";
  }
}
