package io.fusedcomm.api;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.fusedcomm.config.LibfabricProvider;
import io.fusedcomm.config.TransportKind;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import java.util.function.ToIntFunction;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.junit.jupiter.api.Test;

/**
 * The enums that cross the JNI are defined once, in the native C API
 * (executor-native/include/fusedcomm/fusedcomm.h); their Java mirrors must carry exactly the same
 * names and values. Parses the header, so a value added or changed on one side only fails here.
 */
class NativeEnumsTest {
  /** C enums without a Java mirror, and why. */
  private static final Set<String> NOT_MIRRORED =
      Set.of(
          "fc_status_t", // the JNI maps each status to a Java exception class
          "fc_seq_layout_t"); // AttentionOptions carries no sequence layout yet: Java runs the contiguous one

  private record Mirror<E extends Enum<E>>(String prefix, Class<E> type, ToIntFunction<E> code) {
    Map<String, Integer> entries() {
      Map<String, Integer> m = new TreeMap<>();
      for (E e : type.getEnumConstants()) {
        m.put(prefix + e.name(), code.applyAsInt(e));
      }
      return m;
    }
  }

  private static final Map<String, Mirror<?>> MIRRORS =
      Map.of(
          "fc_dtype_t", new Mirror<>("FC_DTYPE_", DType.class, DType::code),
          "fc_weight_layout_t", new Mirror<>("FC_LAYOUT_", WeightLayout.class, WeightLayout::code),
          "fc_partials_t", new Mirror<>("FC_PARTIALS_", PartialPrecision.class, PartialPrecision::code),
          "fc_backend_t", new Mirror<>("FC_BACKEND_", Backend.class, Backend::code),
          "fc_op_t", new Mirror<>("FC_OP_", Op.class, Op::code),
          "fc_transport_t", new Mirror<>("FC_TRANSPORT_", TransportKind.class, TransportKind::code),
          "fc_libfabric_provider_t",
              new Mirror<>("FC_LIBFABRIC_", LibfabricProvider.class, LibfabricProvider::code),
          "fc_memory_type_t", new Mirror<>("FC_MEMORY_", MemoryType.class, MemoryType::code));

  /** Every {@code typedef enum { ... } name;} of the header: name -> (enumerator -> value). */
  static Map<String, Map<String, Integer>> parseEnums(String header) {
    String code = header.replaceAll("(?s)/\\*.*?\\*/", " ").replaceAll("//[^\n]*", " ");
    Map<String, Map<String, Integer>> enums = new TreeMap<>();
    Matcher m = Pattern.compile("(?s)typedef\\s+enum\\s*\\{(.*?)\\}\\s*(\\w+)\\s*;").matcher(code);
    while (m.find()) {
      Map<String, Integer> entries = new TreeMap<>();
      for (String item : m.group(1).split(",")) {
        if (item.isBlank()) {
          continue;
        }
        Matcher e = Pattern.compile("\\s*(\\w+)\\s*=\\s*(\\d+)\\s*").matcher(item);
        assertTrue(e.matches(), m.group(2) + ": every enumerator needs an explicit value: '" + item.trim() + "'");
        entries.put(e.group(1), Integer.parseInt(e.group(2)));
      }
      enums.put(m.group(2), entries);
    }
    return enums;
  }

  private static String header() throws IOException {
    Path root = Path.of(System.getProperty("fusedcomm.repo.root", ".."));
    return Files.readString(root.resolve("executor-native/include/fusedcomm/fusedcomm.h"), StandardCharsets.UTF_8);
  }

  @Test
  void javaMirrorsMatchTheCApi() throws IOException {
    Map<String, Map<String, Integer>> enums = parseEnums(header());
    assertFalse(enums.isEmpty(), "no enum found in fusedcomm.h");
    for (String name : enums.keySet()) {
      assertTrue(MIRRORS.containsKey(name) || NOT_MIRRORED.contains(name),
          name + " has no Java mirror: add one (and to this test) or say why in NOT_MIRRORED");
    }
    for (Map.Entry<String, Mirror<?>> mirror : MIRRORS.entrySet()) {
      Map<String, Integer> c = enums.get(mirror.getKey());
      assertTrue(c != null, mirror.getKey() + " is not in fusedcomm.h");
      assertEquals(c, mirror.getValue().entries(),
          mirror.getValue().type().getSimpleName() + " differs from " + mirror.getKey() + " (names and values)");
    }
  }

  @Test
  void parserReadsValuesAndRejectsImplicitOnes() {
    Map<String, Map<String, Integer>> enums =
        parseEnums("typedef enum {\n  FC_A_X = 0, /* x, y */\n  FC_A_Y = 7 // z\n} fc_a_t;\n");
    assertEquals(Map.of("fc_a_t", Map.of("FC_A_X", 0, "FC_A_Y", 7)), enums);
    AssertionError e =
        assertThrows(AssertionError.class, () -> parseEnums("typedef enum { FC_B_X = 0, FC_B_Y } fc_b_t;"));
    assertTrue(e.getMessage().contains("explicit value"), e.getMessage());
  }

  @Test
  void fusedOpsAreTheOnesDescribeFusedOpKnows() {
    assertEquals(List.of("allGatherGemm", "gemmReduceScatter", "gemmAllReduce"), Op.fusedLabels());
    assertEquals(Op.GEMM_ALL_REDUCE, Op.fusedByLabel("gemmAllReduce"));
    assertNull(Op.fusedByLabel("allGather"));
  }
}
