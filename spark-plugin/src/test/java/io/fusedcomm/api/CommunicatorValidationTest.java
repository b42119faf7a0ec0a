package io.fusedcomm.api;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.fusedcomm.errors.CommTimeoutException;
import io.fusedcomm.errors.CommunicatorException;
import io.fusedcomm.testing.Check;
import io.fusedcomm.testing.Data;
import io.fusedcomm.testing.HostWorld;
import io.fusedcomm.testing.Reference;
import io.fusedcomm.testing.TensorScope;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.function.Consumer;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.ValueSource;

/**
 * The Communicator's contract beyond arithmetic, with ranks as threads on the host backend:
 * arguments are checked before any data moves (and a bad call caught identically on every rank
 * leaves the communicator usable), a closed communicator refuses ops, ranks that disagree fail
 * all together naming the rank, a rank that leaves or stalls is reported by the others within
 * the timeout, and many small ops run back to back.
 */
class CommunicatorValidationTest {
  private static final long TIMEOUT_MS = 5_000;
  private static HostWorld world;

  @BeforeAll
  static void start() {
    world = new HostWorld(4, Map.of("spark.fusedcomm.timeout", TIMEOUT_MS + "ms"), 60_000);
  }

  @AfterAll
  static void stop() {
    if (world != null) {
      world.close();
    }
  }

  /** A named call that must be refused with {@code expected} before anything moves. */
  private record BadCall(String name, Class<? extends RuntimeException> expected, String messagePart, Runnable call) {}

  // ---- argument validation -------------------------------------------------------------------

  @ParameterizedTest(name = "W={0}")
  @ValueSource(ints = {1, 2, 3})
  void badArgumentsFailBeforeDataMovesAndTheCommunicatorStaysUsable(int w) {
    final DType t = DType.F32;
    final int n = 10;
    List<Map<String, String>> messages = world.run(w, comm -> {
      int r = comm.rank();
      Map<String, String> seen = new LinkedHashMap<>();
      try (TensorScope s = new TensorScope()) {
        HostTensor in = s.of(Data.uniform(r, n, t), t, n);
        HostTensor out = s.poisoned(t, n);
        HostTensor outBf16 = s.poisoned(DType.BF16, n);
        HostTensor out11 = s.poisoned(t, n + 1);
        HostTensor ints = s.ints(new int[n], n);
        HostTensor closed = HostTensor.allocate(t, n);
        closed.close();
        HostTensor mine = s.poisoned(t, Split.count(n, w, r));
        HostTensor a = s.of(Data.uniform(r + 10, (int) Split.count(8, w, r) * 4, t), t, Split.count(8, w, r), 4);
        HostTensor wNk = s.of(Data.uniform(r + 20, 3 * 4, t), t, 3, 4);
        HostTensor c = s.poisoned(t, 8, 3);
        HostTensor x = s.of(Data.uniform(r + 30, 4 * 6, t), t, 4, 6);
        HostTensor ids = s.ints(new int[] {0, 0, 0, 0}, 4, 1);
        HostTensor weights = s.of(new float[] {1, 1, 1, 1}, DType.F32, 4, 1);
        HostTensor w1 = s.poisoned(t, Split.count(3, w, r), 5, 6);
        long sr = Split.count(4, w, r);
        HostTensor q = s.of(new float[(int) (sr * 4 * 2)], t, 1, sr, 4, 2);
        HostTensor kv = s.of(new float[(int) (sr * 2 * 2)], t, 1, sr, 2, 2);
        HostTensor kv3 = s.of(new float[(int) (sr * 3 * 2)], t, 1, sr, 3, 2);
        HostTensor o = s.poisoned(t, 1, sr, 4, 2);
        HostTensor lse = s.poisoned(DType.F32, 1, 4, sr);
        HostTensor lseBf16 = s.poisoned(DType.BF16, 1, 4, sr);
        HostTensor dq = s.poisoned(t, 1, sr, 4, 2);
        HostTensor dk = s.poisoned(t, 1, sr, 2, 2);
        HostTensor dv = s.poisoned(t, 1, sr, 2, 2);
        HostTensor dqOther = s.poisoned(t == DType.F32 ? DType.BF16 : DType.F32, 1, sr, 4, 2);
        DeviceTensor device = new DeviceTensor(0x1000, 0, t, new long[] {n}, false, null);  // never touched
        AttentionOptions attn = AttentionOptions.sequence(4);
        Class<IllegalArgumentException> iae = IllegalArgumentException.class;

        List<BadCall> calls = new ArrayList<>();
        calls.add(new BadCall("null input", iae, "in must not be null", () -> comm.allReduce(null, out)));
        calls.add(new BadCall("null output", iae, "out must not be null", () -> comm.allReduce(in, null)));
        calls.add(new BadCall("i32 input", iae, "f32 or bf16", () -> comm.allReduce(ints, ints)));
        calls.add(new BadCall("dtype mismatch", iae, "bf16", () -> comm.allReduce(in, outBf16)));
        calls.add(new BadCall("device tensor on host backend", iae, "DeviceTensor", () -> comm.allReduce(device, out)));
        calls.add(new BadCall("allReduce wrong count", iae, "elements", () -> comm.allReduce(in, mine.numel() == n ? c : mine)));
        calls.add(new BadCall("allGather input of the wrong count", iae, "elements", () -> comm.allGather(in, out11)));
        calls.add(new BadCall("reduceScatter full output", iae, "elements",
            () -> comm.reduceScatter(in, w == 1 ? c : out)));
        calls.add(new BadCall("allToAll short output", iae, "elements", () -> comm.allToAll(in, w == 1 ? c : mine)));
        calls.add(new BadCall("closed tensor", IllegalStateException.class, "closed", () -> comm.allReduce(closed, out)));
        calls.add(new BadCall("allGatherGemm 1-D a", iae, "dimensions", () -> comm.allGatherGemm(in, wNk, c, WeightLayout.NK)));
        calls.add(new BadCall("allGatherGemm null layout", iae, "layout", () -> comm.allGatherGemm(a, wNk, c, null)));
        calls.add(new BadCall("allGatherGemm KN given NK weight", iae, "layout KN",
            () -> comm.allGatherGemm(a, wNk, c, WeightLayout.KN)));
        calls.add(new BadCall("allGatherGemm gatheredA shape", iae, "gatheredA",
            () -> comm.allGatherGemm(a, wNk, c, c, WeightLayout.NK)));
        calls.add(new BadCall("gemmReduceScatter full-height c", iae, "c ",
            () -> comm.gemmReduceScatter(x, s.of(new float[18], t, 3, 6), w == 1 ? s.zeros(t, 5, 3) : s.zeros(t, 4, 3),
                WeightLayout.NK)));
        long stream = 0x10;  // not a stream: refused before any use
        calls.add(new BadCall("allReduce on a stream, host backend", iae, "a CUDA stream was given",
            () -> comm.allReduce(in, out, stream)));
        calls.add(new BadCall("allGatherGemm on a stream, host backend", iae, "a CUDA stream was given",
            () -> comm.allGatherGemm(a, wNk, c, null, WeightLayout.NK, stream)));
        calls.add(new BadCall("gemmReduceScatter on a stream, host backend", iae, "a CUDA stream was given",
            () -> comm.gemmReduceScatter(x, s.of(new float[18], t, 3, 6), s.zeros(t, Split.count(4, w, r), 3),
                WeightLayout.NK, PartialPrecision.F32, stream)));
        calls.add(new BadCall("gemmReduceScatter null partials", iae, "partials must not be null",
            () -> comm.gemmReduceScatter(x, s.of(new float[18], t, 3, 6), s.zeros(t, Split.count(4, w, r), 3),
                WeightLayout.NK, null)));
        calls.add(new BadCall("gemmAllReduce wrong K", iae, "w ",
            () -> comm.gemmAllReduce(x, wNk, s.zeros(t, 4, 3), WeightLayout.NK)));
        calls.add(new BadCall("moe f32 ids", iae, "topkIds", () -> comm.moeDispatchGemm(x, weights, weights, 3, w1)));
        calls.add(new BadCall("moe bf16 weights", iae, "topkWeights",
            () -> comm.moeDispatchGemm(x, ids, s.of(new float[4], DType.BF16, 4, 1), 3, w1)));
        calls.add(new BadCall("moe no experts", iae, "numExperts", () -> comm.moeDispatchGemm(x, ids, weights, 0, w1)));
        calls.add(new BadCall("moe wrong local experts", iae, "w1Local",
            () -> comm.moeDispatchGemm(x, ids, weights, 3 + w, w1)));
        calls.add(new BadCall("moe null dispatch", iae, "dispatch", () -> comm.moeCombine(null, c, c)));
        calls.add(new BadCall("moeGemmCombine null dispatch", iae, "dispatch",
            () -> comm.moeGemmCombine(c, c, null, c)));
        calls.add(new BadCall("attention null options", iae, "options", () -> comm.ringAttention(q, kv, kv, o, lse, null)));
        calls.add(new BadCall("attention heads not a multiple", iae, "multiple",
            () -> comm.ringAttention(q, kv3, kv3, o, lse, attn)));
        calls.add(new BadCall("attention bf16 lse", iae, "lse", () -> comm.ringAttention(q, kv, kv, o, lseBf16, attn)));
        calls.add(new BadCall("attention wrong sequence", iae, "q ",
            () -> comm.ringAttention(q, kv, kv, o, lse, AttentionOptions.sequence(4L * w + 4))));
        calls.add(new BadCall("ringAttention on a stream, host backend", iae, "a CUDA stream was given",
            () -> comm.ringAttention(q, kv, kv, o, lse, attn, stream)));
        calls.add(new BadCall("ringAttentionBackward on a stream, host backend", iae, "a CUDA stream was given",
            () -> comm.ringAttentionBackward(q, kv, kv, q, lse, q, dq, dk, dv, attn, stream)));
        // The single-rank op (static: no communicator involved).
        calls.add(new BadCall("local attention null q", iae, "attention: q must not be null",
            () -> Communicator.attention(null, kv, kv, o, lse, false, 0f)));
        calls.add(new BadCall("local attention heads not a multiple", iae, "multiple",
            () -> Communicator.attention(q, kv3, kv3, o, lse, true, 0f)));
        calls.add(new BadCall("local attention bf16 lse", iae, "lse", () -> Communicator.attention(q, kv, kv, o, lseBf16,
            false, 0f)));
        calls.add(new BadCall("local attention wrong o", iae, "o ", () -> Communicator.attention(q, kv, kv, kv, lse,
            false, 0f)));
        calls.add(new BadCall("local attention negative scale", iae, "scale",
            () -> Communicator.attention(q, kv, kv, o, lse, false, -1f)));
        calls.add(new BadCall("local attention device q with host tensors", iae, "DeviceTensor",
            () -> Communicator.attention(q, device, kv, o, null, false, 0f)));
        calls.add(new BadCall("local attention on a stream, host tensors", iae, "a CUDA stream was given",
            () -> Communicator.attention(q, kv, kv, o, lse, false, 0f, stream)));
        calls.add(new BadCall("attention backward null options", iae, "options",
            () -> comm.ringAttentionBackward(q, kv, kv, q, lse, q, dq, dk, dv, null)));
        calls.add(new BadCall("attention backward without lse", iae,
            "ringAttentionBackward: lse (the forward's log-sum-exp, f32) is required",
            () -> comm.ringAttentionBackward(q, kv, kv, q, null, q, dq, dk, dv, attn)));
        calls.add(new BadCall("attention backward bf16 lse", iae, "lse",
            () -> comm.ringAttentionBackward(q, kv, kv, q, lseBf16, q, dq, dk, dv, attn)));
        calls.add(new BadCall("attention backward heads not a multiple", iae, "multiple",
            () -> comm.ringAttentionBackward(q, kv3, kv3, q, lse, q, dq, kv3, kv3, attn)));
        calls.add(new BadCall("attention backward dQ of another dtype", iae, "dQ",
            () -> comm.ringAttentionBackward(q, kv, kv, q, lse, q, dqOther, dk, dv, attn)));
        calls.add(new BadCall("attention backward wrong dK", iae, "dK ",
            () -> comm.ringAttentionBackward(q, kv, kv, q, lse, q, dq, kv3, dv, attn)));
        calls.add(new BadCall("attention backward wrong dO", iae, "dO ",
            () -> comm.ringAttentionBackward(q, kv, kv, q, lse, kv, dq, dk, dv, attn)));
        calls.add(new BadCall("attention backward wrong sequence", iae, "q ",
            () -> comm.ringAttentionBackward(q, kv, kv, q, lse, q, dq, dk, dv, AttentionOptions.sequence(4L * w + 4))));
        calls.add(new BadCall("local attention backward without lse", iae,
            "attentionBackward: lse (the forward's log-sum-exp, f32) is required",
            () -> Communicator.attentionBackward(q, kv, kv, q, null, q, dq, dk, dv, false, 0f)));
        calls.add(new BadCall("local attention backward wrong dV", iae, "dV ",
            () -> Communicator.attentionBackward(q, kv, kv, q, lse, q, dq, dk, kv3, false, 0f)));
        calls.add(new BadCall("local attention backward dQ of another dtype", iae, "dQ",
            () -> Communicator.attentionBackward(q, kv, kv, q, lse, q, dqOther, dk, dv, true, 0f)));
        calls.add(new BadCall("local attention backward device k with host tensors", iae, "DeviceTensor",
            () -> Communicator.attentionBackward(q, device, kv, q, lse, q, dq, dk, dv, false, 0f)));
        calls.add(new BadCall("local attention backward on a stream, host tensors", iae, "a CUDA stream was given",
            () -> Communicator.attentionBackward(q, kv, kv, q, lse, q, dq, dk, dv, false, 0f, stream)));

        for (BadCall call : calls) {
          RuntimeException e = assertThrows(RuntimeException.class, call.call()::run, call.name());
          assertInstanceOf(call.expected(), e, call.name() + ": " + e);
          assertNotNull(e.getMessage(), call.name());
          assertTrue(e.getMessage().contains(call.messagePart()), call.name() + ": '" + e.getMessage() + "' lacks '"
              + call.messagePart() + "'");
          seen.put(call.name(), e.getMessage());
          // Nothing moved: every output is still poisoned.
          for (HostTensor p : new HostTensor[] {out, outBf16, out11, mine, c, o, lse, dq, dk, dv, dqOther}) {
            for (float f : p.toFloatArray()) {
              if (!Float.isNaN(f)) {
                throw new AssertionError(call.name() + " wrote into " + p + " before failing");
              }
            }
          }
        }

        // The same communicator still works, on every rank.
        comm.allReduce(in, out);
        float[][] all = new float[w][];
        for (int p = 0; p < w; p++) {
          all[p] = Data.uniform(p, n, t);
        }
        Check.close("allReduce after refused calls, rank " + r, Reference.sum(all), out.toFloatArray(), t);
      }
      return seen;
    });
    assertEquals(w, messages.size());
    for (Map<String, String> m : messages) {
      assertEquals(messages.get(0).keySet(), m.keySet());
    }
  }

  /**
   * The static grouped GEMM checks its arguments before the native layer, with messages naming
   * the argument and what was expected, and writes nothing when it refuses.
   */
  @Test
  void groupedGemmArgumentsAreCheckedFirst() {
    DType t = DType.F32;
    try (TensorScope s = new TensorScope()) {
      HostTensor a = s.of(Data.uniform(1, 6 * 4, t), t, 6, 4);
      HostTensor w = s.of(Data.uniform(2, 3 * 5 * 4, t), t, 3, 5, 4);  // 3 groups, NK: 5 x 4
      HostTensor w2d = s.of(Data.uniform(3, 5 * 4, t), t, 5, 4);
      HostTensor c = s.poisoned(t, 6, 5);
      HostTensor cShort = s.poisoned(t, 5, 5);
      HostTensor bf16 = s.poisoned(DType.BF16, 6, 5);
      DeviceTensor device = new DeviceTensor(0x1000, 0, t, new long[] {3, 5, 4}, false, null);  // never touched
      long[] ok = {0, 2, 2, 6};
      Class<IllegalArgumentException> iae = IllegalArgumentException.class;
      List<BadCall> calls = List.of(
          new BadCall("null a", iae, "groupedGemm: a must not be null",
              () -> Communicator.groupedGemm(null, w, c, ok, WeightLayout.NK)),
          new BadCall("null offsets", iae, "offsets must hold groups + 1 row offsets, got null",
              () -> Communicator.groupedGemm(a, w, c, null, WeightLayout.NK)),
          new BadCall("empty offsets", iae, "offsets must hold groups + 1 row offsets, got none",
              () -> Communicator.groupedGemm(a, w, c, new long[0], WeightLayout.NK)),
          new BadCall("2-D weight", iae, "w must have 3 dimensions",
              () -> Communicator.groupedGemm(a, w2d, c, ok, WeightLayout.NK)),
          new BadCall("weight of the other layout", iae, "w [3, 5, 4] must be [3, 4, 5] for 3 groups and layout KN",
              () -> Communicator.groupedGemm(a, w, c, ok, WeightLayout.KN)),
          new BadCall("groups and weights disagree", iae, "must be [2, 5, 4] for 2 groups",
              () -> Communicator.groupedGemm(a, w, c, new long[] {0, 3, 6}, WeightLayout.NK)),
          new BadCall("offsets out of order", iae, "offsets[2] = 1 must be in [offsets[1] = 3, rows = 6]",
              () -> Communicator.groupedGemm(a, w, c, new long[] {0, 3, 1, 6}, WeightLayout.NK)),
          new BadCall("offsets past the rows", iae, "offsets[3] = 7 must be in [offsets[2] = 2, rows = 6]",
              () -> Communicator.groupedGemm(a, w, c, new long[] {0, 2, 2, 7}, WeightLayout.NK)),
          new BadCall("negative first offset", iae, "offsets[0] = -1 must be in [0, rows = 6]",
              () -> Communicator.groupedGemm(a, w, c, new long[] {-1, 2, 2, 6}, WeightLayout.NK)),
          new BadCall("c of other rows", iae, "c [5, 5] has dimension 0 = 5, expected 6",
              () -> Communicator.groupedGemm(a, w, cShort, ok, WeightLayout.NK)),
          new BadCall("dtype mismatch", iae, "c is bf16 but must match f32",
              () -> Communicator.groupedGemm(a, w, bf16, ok, WeightLayout.NK)),
          new BadCall("device weight with host a", iae, "w is a DeviceTensor",
              () -> Communicator.groupedGemm(a, device, c, ok, WeightLayout.NK)),
          new BadCall("null layout", iae, "layout must not be null",
              () -> Communicator.groupedGemm(a, w, c, ok, null)));
      for (BadCall call : calls) {
        RuntimeException e = assertThrows(RuntimeException.class, call.call()::run, call.name());
        assertInstanceOf(call.expected(), e, call.name() + ": " + e);
        assertTrue(e.getMessage().contains(call.messagePart()), call.name() + ": '" + e.getMessage() + "' lacks '"
            + call.messagePart() + "'");
        for (HostTensor p : new HostTensor[] {c, cShort, bf16}) {
          for (float f : p.toFloatArray()) {
            assertTrue(Float.isNaN(f), call.name() + " wrote into " + p + " before failing");
          }
        }
      }
    }
  }

  /**
   * describeFusedOp on the host backend: each op's one path, with the sizes named as the op takes
   * them and the rank; bad arguments refused before the native layer; nothing exchanged (ranks
   * ask different questions and the communicator stays usable).
   */
  @Test
  void describeFusedOpNamesTheHostPath() {
    List<List<String>> seen = world.run(2, comm -> {
      List<String> d = new ArrayList<>();
      d.add(comm.describeFusedOp("allGatherGemm", 10, 3, 4));
      d.add(comm.describeFusedOp("gemmReduceScatter", 10 + comm.rank(), 3, 4, PartialPrecision.BF16));
      d.add(comm.describeFusedOp("gemmAllReduce", 10, 3, 4));
      for (Runnable bad : List.<Runnable>of(() -> comm.describeFusedOp("allGather", 10, 3, 4),
          () -> comm.describeFusedOp("allGatherGemm", 0, 3, 4),
          () -> comm.describeFusedOp("gemmReduceScatter", 10, 3, -4),
          () -> comm.describeFusedOp("gemmAllReduce", 10, 3, 4, null))) {
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class, bad::run);
        assertTrue(e.getMessage().startsWith("describeFusedOp: "), e.getMessage());
      }
      // Nothing was exchanged: an allReduce of the ranks' ones gives the world size.
      try (TensorScope s = new TensorScope()) {
        HostTensor ones = s.of(new float[] {1, 1, 1}, DType.F32, 3);
        comm.allReduce(ones, ones);
        d.add(java.util.Arrays.toString(ones.toFloatArray()));
      }
      return d;
    });
    for (int r = 0; r < 2; r++) {
      List<String> d = seen.get(r);
      assertEquals("allGatherGemm M=10 N_r=3 K=4 on rank " + r + " of 2 (host): host backend: allGather over the"
          + " executors' transport, then the GEMM on the CPU", d.get(0));
      assertEquals("gemmReduceScatter M=" + (10 + r) + " N=3 K_r=4 bf16 partials on rank " + r + " of 2 (host):"
          + " host backend: the GEMM on the CPU, then reduceScatter over the executors' transport", d.get(1));
      assertEquals("gemmAllReduce M=10 N=3 K_r=4 f32 partials on rank " + r + " of 2 (host): host backend: the"
          + " GEMM on the CPU, then reduceScatter and allGather over the executors' transport", d.get(2));
      assertEquals("[2.0, 2.0, 2.0]", d.get(3));
    }
  }

  @Test
  void pureJavaArgumentsAreChecked() {
    assertThrows(IllegalArgumentException.class, () -> AttentionOptions.sequence(0));
    assertThrows(IllegalArgumentException.class, () -> AttentionOptions.sequence(4).scale(Float.NaN));
    assertThrows(IllegalArgumentException.class, () -> AttentionOptions.sequence(4).scale(-1f));
    assertThrows(IllegalArgumentException.class, () -> AttentionOptions.sequence(4).layout(null));
    assertThrows(IllegalArgumentException.class, () -> Split.positions(4, 2, 0, null));
    assertThrows(IllegalArgumentException.class, () -> Split.positions(4, 2, 2, SequenceLayout.ZIGZAG));
    assertThrows(IllegalArgumentException.class, () -> CommOptions.defaults().name("a;b"));
    assertThrows(IllegalArgumentException.class, () -> HostTensor.allocate(null, 3));
    assertThrows(IllegalArgumentException.class, () -> HostTensor.allocate(DType.F32, 2, -1));
    assertThrows(IllegalArgumentException.class, () -> HostTensor.of(new float[3], DType.F32, 4));
    assertThrows(IllegalArgumentException.class, () -> Split.count(4, 0, 0));
    assertThrows(IllegalArgumentException.class, () -> Split.count(4, 2, 2));
    // The split rule: first n % w ranks hold one more, as numpy.array_split.
    long[] expected = {3, 3, 2, 2};
    for (int r = 0; r < 4; r++) {
      assertEquals(expected[r], Split.count(10, 4, r));
      assertEquals(Reference.offset(10, 4, r), Split.offset(10, 4, r));
    }
  }

  @ParameterizedTest(name = "W={0}")
  @ValueSource(ints = {1, 2})
  void closedCommunicatorRefusesOps(int w) {
    List<Communicator> comms = world.run(w, comm -> comm);
    try (TensorScope s = new TensorScope()) {
      HostTensor x = s.of(new float[] {1, 2, 3}, DType.F32, 3);
      for (Communicator comm : comms) {
        assertTrue(comm.isClosed());
        IllegalStateException e = assertThrows(IllegalStateException.class, () -> comm.allReduce(x, x));
        assertTrue(e.getMessage().contains("closed"), e.getMessage());
        assertThrows(IllegalStateException.class, comm::finish);
        assertThrows(IllegalStateException.class, () -> comm.allGather(x, x));
        comm.abort();  // harmless after close
        comm.close();  // idempotent
      }
      assertEquals(3f, x.getFloat(2), "refused ops left the tensor alone");
    }
  }

  // ---- inconsistency across ranks ------------------------------------------------------------

  /** A per-rank op where rank 1 departs from the others; all must fail naming the odd rank. */
  private void expectMismatch(int w, String what, Consumer<Communicator> op) {
    List<HostWorld.Outcome<String>> outcomes = world.runAll(w, comm -> {
      try {
        op.accept(comm);
      } catch (CommunicatorException e) {
        // After the error the communicator is unusable, and says why.
        CommunicatorException again;
        try (TensorScope s = new TensorScope()) {
          HostTensor x = s.of(new float[] {1}, DType.F32, 1);
          again = assertThrows(CommunicatorException.class, () -> comm.allReduce(x, x), what + ": op after the error");
        }
        return e.getClass().getSimpleName() + ": " + e.getMessage() + " || then: " + again.getMessage();
      }
      return null;
    });
    outcomes.forEach(o -> System.out.println(what + " W=" + w + " " + o));
    boolean culpritNamed = false;
    for (HostWorld.Outcome<String> o : outcomes) {
      String c = what + " W=" + w + " rank " + o.rank;
      assertNull(o.error, c + ": unexpected error " + o.error);
      assertNotNull(o.value, c + ": the op succeeded though rank 1 disagreed");
      assertTrue(o.millis < TIMEOUT_MS, c + ": took " + o.millis + " ms, not detected before the timeout");
      assertTrue(namesAPeer(o.value, o.rank, w), c + ": the message names no peer: " + o.value);
      culpritNamed |= o.value.contains("differ across ranks") && o.value.contains("rank 1 ");
    }
    // Every rank names a peer, and at least one reports the mismatch with rank 1's parameters.
    // The others may only learn that a peer which detected it has left: an abort carries no
    // reason across the transport (reported to the lead).
    assertTrue(culpritNamed, what + " W=" + w + ": no rank reported the mismatch with rank 1's parameters");
  }

  /** True when {@code message} names some rank other than {@code self}. */
  private static boolean namesAPeer(String message, int self, int w) {
    for (int p = 0; p < w; p++) {
      if (p != self && message.contains("rank " + p + " ")) {
        return true;
      }
    }
    return false;
  }

  @ParameterizedTest(name = "W={0}")
  @ValueSource(ints = {2, 3, 4})
  void inconsistentCountFailsOnEveryRank(int w) {
    expectMismatch(w, "allReduce count", comm -> {
      int n = comm.rank() == 1 ? 13 : 12;
      try (TensorScope s = new TensorScope()) {
        HostTensor x = s.of(new float[n], DType.F32, n);
        comm.allReduce(x, x);
      }
    });
  }

  @ParameterizedTest(name = "W={0}")
  @ValueSource(ints = {2, 3})
  void inconsistentGemmShapeFailsOnEveryRank(int w) {
    expectMismatch(w, "gemmReduceScatter M", comm -> {
      int m = comm.rank() == 1 ? 2 * w + 1 : 2 * w;
      try (TensorScope s = new TensorScope()) {
        comm.gemmReduceScatter(s.zeros(DType.F32, m, 4), s.zeros(DType.F32, 3, 4),
            s.zeros(DType.F32, Split.count(m, w, comm.rank()), 3), WeightLayout.NK);
      }
    });
  }

  @ParameterizedTest(name = "W={0}")
  @ValueSource(ints = {2, 3})
  void inconsistentPartialPrecisionFailsOnEveryRank(int w) {
    expectMismatch(w, "gemmReduceScatter partials", comm -> {
      int m = 2 * w;
      PartialPrecision p = comm.rank() == 1 ? PartialPrecision.BF16 : PartialPrecision.F32;
      try (TensorScope s = new TensorScope()) {
        comm.gemmReduceScatter(s.zeros(DType.F32, m, 4), s.zeros(DType.F32, 3, 4),
            s.zeros(DType.F32, Split.count(m, w, comm.rank()), 3), WeightLayout.NK, p);
      }
    });
  }

  @ParameterizedTest(name = "W={0}")
  @ValueSource(ints = {2, 3})
  void inconsistentOpFailsOnEveryRank(int w) {
    expectMismatch(w, "allGather vs allReduce", comm -> {
      try (TensorScope s = new TensorScope()) {
        HostTensor x = s.zeros(DType.F32, 2L * w);
        if (comm.rank() == 1) {
          comm.allReduce(x, x);
        } else {
          comm.allGather(s.zeros(DType.F32, 2), x);
        }
      }
    });
  }

  @ParameterizedTest(name = "W={0}")
  @ValueSource(ints = {2, 3})
  void inconsistentDtypeFailsOnEveryRank(int w) {
    expectMismatch(w, "allReduce dtype", comm -> {
      DType t = comm.rank() == 1 ? DType.BF16 : DType.F32;
      try (TensorScope s = new TensorScope()) {
        HostTensor x = s.zeros(t, 6);
        comm.allReduce(x, x);
      }
    });
  }

  // ---- ranks that leave, stall or are aborted ------------------------------------------------

  @ParameterizedTest(name = "W={0}")
  @ValueSource(ints = {2, 3})
  void rankThatThrowsMidSequenceIsReportedByTheOthers(int w) {
    List<HostWorld.Outcome<Integer>> outcomes = world.runAll(w, comm -> {
      try (TensorScope s = new TensorScope()) {
        HostTensor x = s.zeros(DType.F32, 5);
        for (int i = 0; i < 6; i++) {
          if (comm.rank() == 1 && i == 2) {
            throw new IllegalStateException("injected failure in rank 1");
          }
          comm.allReduce(x, x);
        }
      }
      return 6;
    });
    outcomes.forEach(o -> System.out.println("throw mid-sequence W=" + w + " " + o));
    boolean culpritNamed = false;
    for (HostWorld.Outcome<Integer> o : outcomes) {
      assertNotNull(o.error, "rank " + o.rank + " should have failed");
      if (o.rank == 1) {
        assertEquals("injected failure in rank 1", o.error.getMessage());
        continue;
      }
      assertInstanceOf(CommunicatorException.class, o.error, "rank " + o.rank);
      assertTrue(namesAPeer(o.error.getMessage(), o.rank, w), "rank " + o.rank + " names no peer: " + o.error.getMessage());
      assertTrue(o.millis < TIMEOUT_MS, "rank " + o.rank + " took " + o.millis + " ms: the abort did not reach it");
      culpritNamed |= o.error.getMessage().contains("rank 1 ");
    }
    // Every survivor names a peer; at least one names rank 1 (others may name a survivor that
    // gave up first: the abort carries no reason, see the report).
    assertTrue(culpritNamed, "no survivor named rank 1");
  }

  @Test
  void stalledRankTimesOutNamingThePeer() {
    long timeout = 1_000;
    try (HostWorld quick = new HostWorld(2, Map.of("spark.fusedcomm.timeout", timeout + "ms"), 30_000)) {
      List<HostWorld.Outcome<Long>> outcomes = quick.runAll(2, comm -> {
        try (TensorScope s = new TensorScope()) {
          HostTensor x = s.zeros(DType.F32, 5);
          comm.allReduce(x, x);
          if (comm.rank() == 1) {
            Thread.sleep(3 * timeout);  // stalls without aborting: rank 0 must give up by itself
            return -1L;
          }
          long start = System.nanoTime();
          try {
            comm.allReduce(x, x);
          } catch (CommTimeoutException e) {
            long ms = (System.nanoTime() - start) / 1_000_000;
            assertTrue(e.getMessage().contains("rank 1"), "timeout does not name rank 1: " + e.getMessage());
            assertTrue(e.getMessage().contains("allReduce"), "timeout does not name the op: " + e.getMessage());
            return ms;
          }
          throw new AssertionError("the op returned although rank 1 never joined");
        }
      });
      System.out.println("stalled rank: " + outcomes);
      HostWorld.Outcome<Long> waiter = outcomes.get(0);
      assertNull(waiter.error, String.valueOf(waiter.error));
      assertTrue(waiter.value >= timeout * 9 / 10 && waiter.value < 2 * timeout + 500,
          "rank 0 gave up after " + waiter.value + " ms, timeout " + timeout + " ms");
    }
  }

  @Test
  void abortFromAnotherThreadStopsAWaitingOp() {
    List<HostWorld.Outcome<Long>> outcomes = world.runAll(2, comm -> {
      try (TensorScope s = new TensorScope()) {
        HostTensor x = s.zeros(DType.F32, 5);
        if (comm.rank() == 1) {
          Thread.sleep(2_000);  // never joins; rank 0 is aborted by its own watchdog first
          return -1L;
        }
        Thread killer = new Thread(() -> {
          try {
            Thread.sleep(300);
          } catch (InterruptedException e) {
            return;
          }
          comm.abort();
        });
        killer.start();
        long start = System.nanoTime();
        CommunicatorException e = assertThrows(CommunicatorException.class, () -> comm.allReduce(x, x));
        killer.join();
        assertTrue(e.getMessage().contains("abort"), e.getMessage());
        return (System.nanoTime() - start) / 1_000_000;
      }
    });
    System.out.println("abort from another thread: " + outcomes);
    assertNull(outcomes.get(0).error, String.valueOf(outcomes.get(0).error));
    assertTrue(outcomes.get(0).value < 1_500, "abort took " + outcomes.get(0).value + " ms to stop the op");
  }

  @Test
  void freshCommunicatorsConnectAfterAbortedOnes() {
    for (int round = 0; round < 6; round++) {
      int w = 2 + round % 3;
      // A world that breaks (rank 1 disagrees, the others abort) ...
      List<HostWorld.Outcome<Boolean>> broken = world.runAll(w, comm -> {
        int n = comm.rank() == 1 ? 5 : 4;
        try (TensorScope s = new TensorScope()) {
          HostTensor x = s.zeros(DType.F32, n);
          comm.allReduce(x, x);
          return true;
        }
      });
      broken.forEach(o -> assertNotNull(o.error, "mismatched op succeeded: " + o));
      // ... must not disturb the next communicator on the same runtimes.
      int next = 4 - round % 3;
      List<HostWorld.Outcome<Float>> ok = world.runAll(next, comm -> {
        try (TensorScope s = new TensorScope()) {
          HostTensor x = s.of(new float[] {comm.rank() + 1}, DType.F32, 1);
          comm.allReduce(x, x);
          return x.getFloat(0);
        }
      });
      for (HostWorld.Outcome<Float> o : ok) {
        assertNull(o.error, "round " + round + ": W=" + next + " after a broken W=" + w + ": " + o);
        assertEquals(next * (next + 1) / 2f, o.value, "round " + round + " rank " + o.rank);
      }
    }
  }

  // ---- many small ops ------------------------------------------------------------------------

  @Test
  void thousandBackToBackSmallAllReduces() {
    final int w = 3;
    final int n = 7;  // blocks of 3, 2, 2
    final int iterations = 1000;
    long start = System.nanoTime();
    List<Integer> done = world.run(w, comm -> {
      try (TensorScope s = new TensorScope()) {
        HostTensor in = s.zeros(DType.F32, n);
        HostTensor out = s.zeros(DType.F32, n);
        float[] v = new float[n];
        for (int it = 0; it < iterations; it++) {
          for (int i = 0; i < n; i++) {
            v[i] = it * 16 + comm.rank() * 4 + i;  // small integers: sums are exact in f32
          }
          in.copyFrom(v);
          out.fill(Float.NaN);
          comm.allReduce(in, out);
          for (int i = 0; i < n; i++) {
            float want = w * (it * 16 + i) + 4 * (0 + 1 + 2);
            if (out.getFloat(i) != want) {
              throw new AssertionError("iteration " + it + " element " + i + ": " + out.getFloat(i) + " != " + want);
            }
          }
        }
        comm.finish();
        return iterations;
      }
    });
    long ms = (System.nanoTime() - start) / 1_000_000;
    System.out.println(iterations + " back-to-back allReduce on " + w + " ranks: " + ms + " ms");
    assertEquals(List.of(iterations, iterations, iterations), done);
  }
}
