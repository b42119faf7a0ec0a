package io.fusedcomm.config;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

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

  private static void assertCommitted(String relative, String expected) throws IOException {
    Path file = ConfigDocs.repoRoot().resolve(relative);
    String actual =
        Files.exists(file) ? Files.readString(file, StandardCharsets.UTF_8) : "<missing>";
    assertEquals(
        expected,
        actual,
        file
            + " is out of date with the declarations in FusedCommConf. Regenerate it from the"
            + " repository root with: "
            + ConfigDocs.REGENERATE_COMMAND);
  }
}
