package io.fusedcomm.api;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.fusedcomm.internal.bootstrap.RankInfo;
import io.fusedcomm.testing.HostWorld;
import io.fusedcomm.testing.TensorScope;
import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/**
 * The JNI layer with arguments Java's own checks would never pass (host backend, one rank):
 * device rows of a host dispatch; arrays of the wrong length or null for {@code moeRowMeta},
 * which must be refused before the first copy (a copy that throws leaves a Java exception
 * pending, after which no JNI call may follow); a null op description; descriptions that take the long and the non-BMP paths of the
 * UTF-8 conversion. Each ends in a clear exception and the communicator stays usable.
 */
class JniBoundaryTest {
  private static HostWorld world;

  @BeforeAll
  static void start() {
    world = new HostWorld(1, Map.of(), 60_000);
  }

  @AfterAll
  static void stop() {
    if (world != null) {
      world.close();
    }
  }

  @Test
  void moeRowMetaRefusesArraysOfTheWrongLengthBeforeCopying() {
    List<String> seen = world.run(1, comm -> {
      try (TensorScope s = new TensorScope()) {
        // Three tokens, top-1, one expert: three routed rows.
        HostTensor x = s.of(new float[] {1, 2, 3, 4, 5, 6}, DType.F32, 3, 2);
        HostTensor ids = s.ints(new int[] {0, 0, 0}, 3, 1);
        HostTensor weights = s.of(new float[] {0.5f, 0.25f, 1f}, DType.F32, 3, 1);
        HostTensor w1 = s.of(new float[] {1, 0, 0, 1}, DType.F32, 1, 2, 2);
        try (MoeDispatch d = comm.moeDispatchGemm(x, ids, weights, 1, w1)) {
          assertEquals(3, d.rows());
          long h = d.acquire();  // the raw handle, held for the direct calls below
          int[] three = new int[3];
          float[] threeF = new float[3];
          IllegalArgumentException shortArray = assertThrows(IllegalArgumentException.class,
              () -> NativeOps.moeRowMeta(h, three, new int[2], three, threeF));
          assertTrue(shortArray.getMessage().contains("srcToken has 2 elements for 3 rows"), shortArray.getMessage());
          IllegalArgumentException longArray = assertThrows(IllegalArgumentException.class,
              () -> NativeOps.moeRowMeta(h, three, three, three, new float[4]));
          assertTrue(longArray.getMessage().contains("weight has 4 elements for 3 rows"), longArray.getMessage());
          IllegalArgumentException nullArray = assertThrows(IllegalArgumentException.class,
              () -> NativeOps.moeRowMeta(h, null, three, three, threeF));
          assertTrue(nullArray.getMessage().contains("null srcRank"), nullArray.getMessage());
          // The host backend's rows are in host memory: no device addresses to hand out.
          IllegalStateException noDevice = assertThrows(IllegalStateException.class, () -> NativeOps.moeDeviceRows(h));
          assertTrue(noDevice.getMessage().contains("holds its rows in host memory"), noDevice.getMessage());
          assertTrue(d.expertOutput() instanceof HostTensor && d.routedTokens() instanceof HostTensor,
              "host-backend dispatch rows are host tensors");
          d.release();
          // Nothing was copied into the arrays of the refused calls, and the dispatch still works.
          assertArrayEquals(new int[3], three);
          assertEquals(0.25f, d.weight(1));
          assertEquals(2, d.sourceToken(2));
          return shortArray.getMessage();
        }
      }
    });
    System.out.println("moeRowMeta with a short array: " + seen.get(0));
  }

  @Test
  void opDescriptionsCrossTheJniWhateverTheirText() {
    // A bare one-rank native communicator, so that the test can hand the JNI any description.
    long h = NativeOps.commCreate(world.runtime(0).handle(), 0, 1);
    try (TensorScope s = new TensorScope()) {
      NativeOps.commConnect(h, new String[] {NativeOps.commEndpoint(h)}, 0, 77,
          new byte[][] {new byte[RankInfo.AUTH_SHARE_BYTES]}, new byte[][] {new byte[0]}, new int[] {0});
      HostTensor x = s.of(new float[] {1, 2}, DType.F32, 2);
      IllegalArgumentException nullText = assertThrows(IllegalArgumentException.class,
          () -> NativeOps.allReduce(h, null, 1, DType.F32.code(), x.address(), x.address(), 2, 0));
      assertTrue(nullText.getMessage().contains("null string"), nullText.getMessage());
      // Longer than the conversion's stack buffer, and characters outside the BMP.
      String text = "allReduce " + "\uD83D\uDE80".repeat(300) + " end";
      NativeOps.allReduce(h, text, 2, DType.F32.code(), x.address(), x.address(), 2, 0);
      assertArrayEquals(new float[] {1, 2}, x.toFloatArray());
    } finally {
      NativeOps.commClose(h);
    }
  }
}
