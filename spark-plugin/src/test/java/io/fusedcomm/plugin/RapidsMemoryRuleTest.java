package io.fusedcomm.plugin;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.fusedcomm.errors.BackendUnavailableException;
import java.util.Optional;
import org.apache.spark.SparkConf;
import org.junit.jupiter.api.Test;

/** The GPU memory rule beside the RAPIDS Accelerator, from the configuration alone. */
class RapidsMemoryRuleTest {
  private static final long MIB = 1L << 20;
  private static final long H200 = 141L << 30;

  private static SparkConf withRapids(String plugins) {
    return new SparkConf(false).set("spark.plugins", plugins);
  }

  @Test
  void withoutTheAcceleratorThereIsNothingToDecide() {
    assertEquals(Optional.empty(), RapidsMemoryRule.check(
        withRapids("io.fusedcomm.FusedCommPlugin"), 128 * MIB, H200));
  }

  @Test
  void theDefaultPoolLeavesNoRoomAndTheMessageSaysWhatToSet() {
    // Either order in spark.plugins: the pool is sized by the settings, not by the order.
    for (String plugins : new String[] {"io.fusedcomm.FusedCommPlugin,com.nvidia.spark.SQLPlugin",
        "com.nvidia.spark.SQLPlugin, io.fusedcomm.FusedCommPlugin"}) {
      BackendUnavailableException e = assertThrows(BackendUnavailableException.class,
          () -> RapidsMemoryRule.check(withRapids(plugins), 128 * MIB, H200));
      String m = e.getMessage();
      assertTrue(m.contains("needs 320m"), m);  // 2 x 128m + 64m
      assertTrue(m.contains("spark.rapids.memory.gpu.reserve=960m"), m);  // 640m + 320m
      assertTrue(m.contains("spark.rapids.memory.gpu.allocFraction"), m);
      assertTrue(m.contains("spark.fusedcomm.cuda.symmetricBytes"), m);
    }
  }

  @Test
  void aLargerReserveOrASmallerFractionMakesRoom() {
    SparkConf reserve = withRapids("com.nvidia.spark.SQLPlugin").set("spark.rapids.memory.gpu.reserve", "960m");
    String line = RapidsMemoryRule.check(reserve, 128 * MIB, 0).orElseThrow();
    assertTrue(line.contains("fits in the 320m"), line);

    SparkConf fraction = withRapids("com.nvidia.spark.SQLPlugin").set("spark.rapids.memory.gpu.allocFraction", "0.9");
    assertTrue(RapidsMemoryRule.check(fraction, 128 * MIB, H200).isPresent());
    // Without the GPU's size only the reserve counts.
    assertThrows(BackendUnavailableException.class, () -> RapidsMemoryRule.check(fraction, 128 * MIB, 0));
    // One byte short of the rule fails.
    SparkConf tight = withRapids("com.nvidia.spark.SQLPlugin")
        .set("spark.rapids.memory.gpu.reserve", Long.toString(640 * MIB + 320 * MIB - 1));
    assertThrows(BackendUnavailableException.class, () -> RapidsMemoryRule.check(tight, 128 * MIB, 0));
  }
}
