package io.fusedcomm.examples;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.fusedcomm.api.Bf16;
import io.fusedcomm.api.Backend;
import io.fusedcomm.api.DType;
import io.fusedcomm.api.SequenceLayout;
import io.fusedcomm.examples.ContextParallelAttentionExample.Problem;
import io.fusedcomm.examples.ContextParallelAttentionExample.Reference;
import io.fusedcomm.examples.ContextParallelAttentionExample.Shard;
import io.fusedcomm.examples.ContextParallelAttentionExample.TrainShard;
import io.fusedcomm.examples.ContextParallelAttentionExample.Verdict;
import java.util.ArrayList;
import java.util.List;
import java.util.SplittableRandom;
import org.junit.jupiter.api.Test;

/**
 * Example 04's check without Spark or the native library: the ranks' positions cover the
 * sequence once, zigzag balances the causal work, and the bounds accept each rank's rows of the
 * reference rounded as an implementation may round them, and reject a row of another position,
 * an element just outside its bound and an element never written.
 */
class ContextParallelAttentionCheckTest {
  private static final int S = 37;
  private static final int HQ = 4;
  private static final int D = 8;

  private static Problem problem(int world, SequenceLayout layout) {
    return new Problem(world, S, HQ, 2, D, DType.BF16, 5, layout);
  }

  /** A stand-in reference (any values: the check compares rows, not attention). */
  private static Reference reference() {
    SplittableRandom rnd = new SplittableRandom(9);
    float[] o = new float[S * HQ * D];
    float[] lse = new float[HQ * S];
    for (int i = 0; i < o.length; i++) {
      o[i] = (float) (rnd.nextDouble() * 2 - 1);
    }
    for (int i = 0; i < lse.length; i++) {
      lse[i] = (float) (rnd.nextDouble() * 8);
    }
    return new Reference(o, lse);
  }

  /** Each rank's rows of the reference, O rounded to bf16 as a rank's output is. */
  private static List<Shard> shards(Problem p, Reference ref) {
    List<Shard> out = new ArrayList<>();
    int width = HQ * D;
    for (int r = 0; r < p.world(); r++) {
      int[] pos = p.positions(r);
      float[] o = new float[pos.length * width];
      float[] lse = new float[HQ * pos.length];
      for (int i = 0; i < pos.length; i++) {
        for (int x = 0; x < width; x++) {
          o[i * width + x] = Bf16.round(ref.o()[pos[i] * width + x]);
        }
        for (int h = 0; h < HQ; h++) {
          lse[h * pos.length + i] = ref.lse()[h * S + pos[i]];
        }
      }
      out.add(new Shard(r, pos, o, lse, "host", "test", 0));
    }
    return out;
  }

  @Test
  void positionsCoverTheSequenceAndZigzagBalancesCausalWork() {
    for (SequenceLayout layout : SequenceLayout.values()) {
      for (int w = 1; w <= 4; w++) {
        Problem p = problem(w, layout);
        boolean[] seen = new boolean[S];
        for (int r = 0; r < w; r++) {
          for (int pos : p.positions(r)) {
            assertTrue(!seen[pos], layout + " W=" + w + ": position " + pos + " held twice");
            seen[pos] = true;
          }
        }
        for (int pos = 0; pos < S; pos++) {
          assertTrue(seen[pos], layout + " W=" + w + ": position " + pos + " held by nobody");
        }
      }
    }
    // 4 ranks over 4096 positions: contiguous gives the last rank 7/4 of the mean, zigzag ~1.
    assertTrue(ContextParallelAttentionExample.imbalance(4096, 4, SequenceLayout.CONTIGUOUS) > 1.7);
    assertTrue(ContextParallelAttentionExample.imbalance(4096, 4, SequenceLayout.ZIGZAG) < 1.001);
  }

  @Test
  void boundsAcceptTheRoundedRowsAndRejectMistakes() {
    Problem p = problem(3, SequenceLayout.ZIGZAG);
    Reference ref = reference();
    List<Shard> good = shards(p, ref);
    Verdict o = ContextParallelAttentionExample.checkO(p, ref, good, 1.0);
    Verdict lse = ContextParallelAttentionExample.checkLse(p, ref, good);
    assertEquals(0, o.bad());
    assertEquals((long) S * HQ * D, o.checked());
    assertEquals(0, lse.bad());
    assertEquals((long) S * HQ, lse.checked());

    // Rank 1's first two rows swapped: rows of other positions.
    List<Shard> swapped = shards(p, ref);
    float[] o1 = swapped.get(1).o();
    for (int x = 0; x < HQ * D; x++) {
      float t = o1[x];
      o1[x] = o1[HQ * D + x];
      o1[HQ * D + x] = t;
    }
    assertTrue(ContextParallelAttentionExample.checkO(p, ref, swapped, 1.0).bad() > 0);

    // One element just outside its bound, one never written, one LSE off.
    List<Shard> off = shards(p, ref);
    int at = 5;
    double want = ref.o()[off.get(2).positions()[0] * HQ * D + at];
    off.get(2).o()[at] = (float) (want + 1.01 * ContextParallelAttentionExample.oTolerance(DType.BF16, want, 1.0));
    assertEquals(1, ContextParallelAttentionExample.checkO(p, ref, off, 1.0).bad());
    off.get(0).o()[3] = Float.NaN;
    assertEquals(2, ContextParallelAttentionExample.checkO(p, ref, off, 1.0).bad());
    off.get(0).lse()[0] += 0.1f;
    assertEquals(1, ContextParallelAttentionExample.checkLse(p, ref, off).bad());
  }

  /** Each rank's rows of a (S × width) gradient, rounded to bf16, as TrainShards. */
  private static List<TrainShard> gradShards(Problem p, float[] ref, int width) {
    List<TrainShard> out = new ArrayList<>();
    for (int r = 0; r < p.world(); r++) {
      int[] pos = p.positions(r);
      float[] g = new float[pos.length * width];
      for (int i = 0; i < pos.length; i++) {
        for (int x = 0; x < width; x++) {
          g[i * width + x] = Bf16.round(ref[pos[i] * width + x]);
        }
      }
      Shard fwd = new Shard(r, pos, new float[0], new float[0], "host", "test", 0);
      out.add(new TrainShard(fwd, new float[0], g, g, g, new double[] {1, 0}, 0));
    }
    return out;
  }

  @Test
  void gradientBoundsAcceptTheRoundedRowsAndRejectMistakes() {
    Problem p = problem(3, SequenceLayout.ZIGZAG);
    int width = 2 * D;
    SplittableRandom rnd = new SplittableRandom(4);
    float[] ref = new float[S * width];
    for (int i = 0; i < ref.length; i++) {
      ref[i] = (float) ((rnd.nextDouble() * 2 - 1) * (1 + i % 7));
    }
    Verdict ok = ContextParallelAttentionExample.checkGrad(p, ref, gradShards(p, ref, width), width, TrainShard::dk);
    assertEquals(0, ok.bad());
    assertEquals((long) S * width, ok.checked());
    // Rank 2's first two rows swapped, and one element never written.
    List<TrainShard> swapped = gradShards(p, ref, width);
    float[] g = swapped.get(2).dk();
    for (int x = 0; x < width; x++) {
      float t = g[x];
      g[x] = g[width + x];
      g[width + x] = t;
    }
    assertTrue(ContextParallelAttentionExample.checkGrad(p, ref, swapped, width, TrainShard::dk).bad() > width / 2);
    List<TrainShard> unwritten = gradShards(p, ref, width);
    unwritten.get(0).dk()[7] = Float.NaN;
    assertEquals(1, ContextParallelAttentionExample.checkGrad(p, ref, unwritten, width, TrainShard::dk).bad());
  }

  @Test
  void trainingTargetIsOneVectorPerKvHead() {
    Problem p = new Problem(2, S, 4, 2, D, DType.BF16, 3, SequenceLayout.ZIGZAG);
    float[] t = ContextParallelAttentionExample.targetRows(p, new int[] {0, 5, 36});
    int width = 4 * D;
    for (int i = 0; i < 3; i++) {
      for (int h = 0; h < 4; h++) {
        for (int x = 0; x < D; x++) {
          // Query heads 0, 1 share K/V head 0; 2, 3 share K/V head 1; every position the same.
          assertEquals(t[(h / 2) * 2 * D + x], t[i * width + h * D + x], "position " + i + " head " + h);
        }
      }
    }
    boolean differ = false;
    for (int x = 0; x < D; x++) {
      differ |= t[x] != t[2 * D + x];
    }
    assertTrue(differ, "the two K/V heads' targets differ");
    assertThrows(IllegalArgumentException.class, () -> ContextParallelAttentionExample.parseMode("fit"));
    assertThrows(IllegalArgumentException.class, () -> ContextParallelAttentionExample.parseLearningRate("-1"));
  }

  @Test
  void cudaRefusesWhatItsKernelDoesNotTake() {
    Problem f32 = new Problem(2, S, HQ, 2, 64, DType.F32, 1, SequenceLayout.ZIGZAG);
    Problem d96 = new Problem(2, S, HQ, 2, 96, DType.BF16, 1, SequenceLayout.ZIGZAG);
    Problem heads = new Problem(2, S, 6, 4, 64, DType.BF16, 1, SequenceLayout.ZIGZAG);
    assertThrows(IllegalArgumentException.class,
        () -> ContextParallelAttentionExample.requireSupported(f32, Backend.CUDA));
    assertThrows(IllegalArgumentException.class,
        () -> ContextParallelAttentionExample.requireSupported(d96, Backend.CUDA));
    assertThrows(IllegalArgumentException.class,
        () -> ContextParallelAttentionExample.requireSupported(heads, Backend.HOST));
    ContextParallelAttentionExample.requireSupported(f32, Backend.HOST);
    ContextParallelAttentionExample.requireSupported(new Problem(2, S, HQ, 2, 128, DType.BF16, 1,
        SequenceLayout.CONTIGUOUS), Backend.CUDA);
  }
}
