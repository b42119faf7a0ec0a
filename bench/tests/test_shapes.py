#!/usr/bin/env python3
"""The bench tools' shape lists without a GPU: torch_gemm.py's explicit and seeded random shapes
and its sets, torch_fused.py's explicit shapes, refusals and row split for any M and
random_shapes.py's set, torch_moe.py's
points, routings and variants, nccl_bench.py's seeded random counts (coll_bench.cc's),
torch_allreduce.py's sizes, impls, reference check and whole flow on a fake torch (fake_torch.py)."""
import contextlib
import io
import os
import sys
import tempfile
import types
import unittest

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "gemm"))
sys.path.insert(0, os.path.join(here, "..", "fused"))
sys.path.insert(0, os.path.join(here, "..", "moe"))
sys.path.insert(0, os.path.join(here, "..", "collectives"))
sys.path.insert(0, os.path.join(here, "..", "attention"))
import torch_gemm  # noqa: E402
import torch_fused  # noqa: E402
import random_shapes  # noqa: E402
import torch_moe  # noqa: E402
import nccl_bench  # noqa: E402
import torch_allreduce  # noqa: E402
import torch_ring  # noqa: E402


def gemm_args(**kw):
    a = dict(shapes=None, m=None, n=None, k=None, random=0, seed=None, layouts="nk,kn", align=1)
    a.update(kw)
    return types.SimpleNamespace(**a)


class CollectiveCountsTest(unittest.TestCase):
    def test_random_counts_match_coll_bench(self):
        # coll_bench.cc's random_bytes(5, 42) (splitmix64): both tools must draw the same counts.
        self.assertEqual(nccl_bench.random_bytes(5, 42), [13492742, 479577896, 1160716, 54288200, 50261852])

    def test_random_counts_range_and_ragged(self):
        v = nccl_bench.random_bytes(500, 7)
        self.assertEqual(v, nccl_bench.random_bytes(500, 7))
        self.assertTrue(all(1 << 20 <= b < 1 << 30 and b % 2 == 0 for b in v))
        self.assertTrue(any((b // 2) % 3 for b in v) and any((b // 2) % 8 for b in v))


class Vec(list):
    """The elementwise arithmetic torch_allreduce's check applies to its tensors, on a list (the
    check runs here without torch or numpy)."""
    @staticmethod
    def arange(a, b):
        return Vec(range(a, b))

    def _map(self, other, fn):
        return Vec(fn(x, y) for x, y in zip(self, other if isinstance(other, list) else [other] * len(self)))

    def __getitem__(self, i):
        got = list.__getitem__(self, i)
        return Vec(got) if isinstance(i, slice) else got

    __add__ = __radd__ = lambda self, o: self._map(o, lambda x, y: x + y)
    __mul__ = __rmul__ = lambda self, o: self._map(o, lambda x, y: x * y)
    __sub__ = lambda self, o: self._map(o, lambda x, y: x - y)
    __mod__ = lambda self, o: self._map(o, lambda x, y: x % y)
    __ne__ = lambda self, o: self._map(o, lambda x, y: x != y)

    def sum(self):
        return sum(list(self))


class TorchAllReduceTest(unittest.TestCase):
    def test_the_size_list_parses_and_other_ops_are_refused(self):
        sizes = torch_allreduce.read_sizes(os.path.join(here, "..", "shapes", "allreduce_small.txt"))
        self.assertEqual(sizes, [4096, 16384, 65536, 262144] + [(1 << 20) << i for i in range(6)])
        for text in ("allGather 4096\n", "allReduce 4097\n", "allReduce 0\n", "allReduce 4k\n", "# none\n"):
            with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
                f.write(text)
            try:
                with self.assertRaises(SystemExit, msg=text):
                    torch_allreduce.read_sizes(f.name)
            finally:
                os.unlink(f.name)

    def test_impls_and_iterations(self):
        self.assertEqual(torch_allreduce.parse_impls("torch_symm_two_shot_graph,nccl"),
                         ["nccl", "torch_symm_two_shot_graph"])
        self.assertEqual(torch_allreduce.parse_impls(",".join(torch_allreduce.IMPLS)), list(torch_allreduce.IMPLS))
        for bad in ("", "nccl,multimem", "one_shot"):
            with self.assertRaises(SystemExit):
                torch_allreduce.parse_impls(bad)
        # coll_bench.cc's batch sizes
        self.assertEqual([torch_allreduce.iters_for(b) for b in (4096, 1 << 20, (1 << 20) + 2, 64 << 20, 1 << 30)],
                         [200, 200, 20, 20, 5])
        self.assertAlmostEqual(torch_allreduce.busbw_factor(4), 1.5)

    def test_reference_is_check_h_values_summed(self):
        # check.h: rank r's element i is ((7 i + 13 r + 5) mod 31) - 15.
        self.assertEqual([torch_allreduce.value(i, 0) for i in range(3)], [-10, -3, 4])
        self.assertEqual(torch_allreduce.value(0, 1), 3)
        self.assertEqual(torch_allreduce.allreduce_sum(0, 2), -7)
        for world in (2, 3, 4, 8):
            n = 1000
            out = Vec(float(torch_allreduce.allreduce_sum(i, world)) for i in range(n))
            self.assertTrue(all(abs(x) <= 15 * world for x in out))  # small integers: exact in bf16
            self.assertEqual(torch_allreduce.mismatches(out, world, Vec.arange, chunk=64), 0)
            wrong = Vec(out)
            for i in (0, 63, 64, 999):  # across chunk edges
                wrong[i] += 1
            wrong[500] = float("nan")  # a NaN never passes
            self.assertEqual(torch_allreduce.mismatches(wrong, world, Vec.arange, chunk=64), 5)
            # One rank's values missing from the sum is caught almost everywhere.
            partial = Vec(float(torch_allreduce.allreduce_sum(i, world - 1)) for i in range(n))
            self.assertGreater(torch_allreduce.mismatches(partial, world, Vec.arange), n * 9 // 10)

    def test_help_needs_no_torch(self):
        with self.assertRaises(SystemExit) as e, contextlib.redirect_stdout(io.StringIO()) as out:
            torch_allreduce.main(["--help"])
        self.assertEqual(e.exception.code, 0)
        self.assertIn("two_shot_all_reduce_", out.getvalue())


class TorchAllReduceFlowTest(unittest.TestCase):
    """torch_allreduce.main on fake_torch (numpy, one rank): every impl's rows, the placements,
    an op torch lacks, a wrong result."""

    def run_main(self, **fake):
        try:
            import numpy as np
        except ImportError:
            self.skipTest("numpy missing: fake_torch needs it")
        import json
        import fake_torch
        from unittest import mock
        modules = {}
        fake_torch.install(np, modules, **fake)
        with tempfile.TemporaryDirectory() as d:
            sizes, out = os.path.join(d, "sizes.txt"), os.path.join(d, "rows.jsonl")
            with open(sizes, "w") as f:
                f.write("allReduce 4096 4194304\n")
            env = dict(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", NCCL_NVLS_ENABLE="0",
                       TORCH_SYMM_MEM_DISABLE_MULTICAST="1")
            with mock.patch.dict(sys.modules, modules), mock.patch.dict(os.environ, env), \
                    contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as err:
                rc = torch_allreduce.main(["--shapes", sizes, "--out", out])
            with open(out) as f:
                rows = [json.loads(line) for line in f]
        return rc, rows, err.getvalue()

    def test_every_impl_checked_and_timed(self):
        rc, rows, _ = self.run_main()
        self.assertEqual(rc, 0)
        self.assertEqual([(r["impl"], r["shape"]["bytes"]) for r in rows],
                         [(i, b) for b in (4096, 4194304) for i in torch_allreduce.IMPLS])
        for r in rows:
            self.assertEqual((r["family"], r["op"], r["world"], r["dtype"], r["set"]),
                             ("collectives", "allReduce", 1, "bf16", "small-medium"))
            self.assertNotIn("error", r)
            iters = 200 if r["shape"]["bytes"] == 4096 else 20
            self.assertEqual(r["iters"], iters)
            self.assertAlmostEqual(r["ms_median"], 2.0 / iters)  # the fake events' 2 ms per batch
            self.assertEqual(r["placement"], "out-of-place" if "one_shot" in r["impl"] else "in-place")

    def test_a_missing_op_gets_error_rows_not_times(self):
        rc, rows, err = self.run_main(two_shot=False)
        self.assertEqual(rc, 0)  # torch's gap, not a failed check
        missing = [r for r in rows if r["impl"].startswith("torch_symm_two_shot")]
        self.assertEqual(len(missing), 4)
        self.assertTrue(all(r["ms_median"] is None and "lacks" in r["error"] for r in missing))
        self.assertIn("two_shot_all_reduce_", err)
        self.assertTrue(all(r["ms_median"] for r in rows if r not in missing))

    def test_a_wrong_result_fails_its_check(self):
        rc, rows, _ = self.run_main(wrong=True)
        self.assertEqual(rc, 1)
        bad = [r for r in rows if r.get("error")]
        self.assertEqual({r["impl"] for r in bad}, {"torch_symm_one_shot", "torch_symm_one_shot_graph"})
        self.assertTrue(all("check FAILED" in r["error"] and r["ms_median"] is None for r in bad))


class GemmShapesTest(unittest.TestCase):
    def test_explicit_lists_zip_and_broadcast(self):
        self.assertEqual(torch_gemm.explicit_shapes(["1000,1"], ["4104,8192"], ["2056"]),
                         [(1000, 4104, 2056), (1, 8192, 2056)])
        self.assertEqual(torch_gemm.explicit_shapes(["7"], ["3"], ["5"]), [(7, 3, 5)])
        self.assertEqual(torch_gemm.explicit_shapes(None, None, None), [])
        for bad in ((["1,2"], ["1,2,3"], ["4"]), (["0"], ["1"], ["1"]), (["x"], ["1"], ["1"]),
                    (["1"], None, ["1"])):
            with self.assertRaises(SystemExit):
                torch_gemm.explicit_shapes(*bad)

    def test_random_set_is_seeded_bounded_and_aligned_on_request(self):
        a, b = torch_gemm.random_shapes(200, 42), torch_gemm.random_shapes(200, 42)
        self.assertEqual(a, b)
        self.assertNotEqual(a, torch_gemm.random_shapes(200, 43))
        self.assertTrue(all(1 <= x <= torch_gemm.MAX_DIM for s in a for x in s))
        self.assertTrue(any(s[1] % 8 or s[2] % 8 for s in a))  # off the grid, not padded
        al = torch_gemm.random_shapes(200, 42, 8)
        self.assertTrue(all(n % 8 == 0 and k % 8 == 0 and 8 <= n <= 16384 and 8 <= k <= 16384
                            for _, n, k in al))
        self.assertEqual([s[0] for s in al], [s[0] for s in a])  # M as drawn

    def test_shape_list_sets_layouts_and_seed(self):
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
            f.write("# comment\nsquare 8192 8192 8192 nk\n")
        try:
            with contextlib.redirect_stdout(io.StringIO()) as out:
                shapes, seed = torch_gemm.shape_list(gemm_args(shapes=[f.name], m=["1000"], n=["4104"], k=["2056"],
                                                               random=3))
        finally:
            os.unlink(f.name)
        self.assertIsNotNone(seed)
        self.assertIn(f"seed {seed}", out.getvalue())  # chosen at run time, printed
        self.assertEqual(shapes[0], (None, "square", 8192, 8192, 8192, False))
        self.assertEqual(shapes[1:3], [("explicit", "1000x4104x2056", 1000, 4104, 2056, False),
                                       ("explicit", "1000x4104x2056", 1000, 4104, 2056, True)])
        self.assertEqual(len(shapes), 1 + 2 + 3 * 2)
        self.assertTrue(all(s[0] == f"random-{seed}" for s in shapes[3:]))
        with contextlib.redirect_stdout(io.StringIO()):
            again, s2 = torch_gemm.shape_list(gemm_args(random=3, seed=seed, layouts="kn", align=8))
        self.assertEqual(s2, seed)
        self.assertEqual({s[0] for s in again}, {f"random-{seed}-align8"})
        self.assertTrue(all(s[5] for s in again))
        for bad in (gemm_args(), gemm_args(layouts="nt", random=1), gemm_args(seed=1)):
            with self.assertRaises(SystemExit), contextlib.redirect_stdout(io.StringIO()):
                torch_gemm.shape_list(bad)


class FusedShapesTest(unittest.TestCase):
    def test_row_split_covers_any_m(self):
        for m in (1, 7, 1000, 1001, 16384):
            for w in (1, 2, 3, 4, 8):
                parts = [torch_fused.row_split(m, w, r) for r in range(w)]
                self.assertEqual(sum(c for c, _, _ in parts), m)
                self.assertEqual([o for _, o, _ in parts], [sum(c for c, _, _ in parts[:r]) for r in range(w)])
                self.assertTrue(all(b == -(-m // w) and c <= b for c, _, b in parts))

    def test_explicit_shapes_split_or_are_refused(self):
        ops = set(torch_fused.OPS.values())
        got = torch_fused.read_shapes(None, 3, ops, [(1000, 4104 * 3, 2064 * 3)])
        self.assertEqual(got, [(op, "explicit", 1000, n, k, "") for op, n, k in (
            ("allGatherGemm", 4104, 2064 * 3), ("gemmReduceScatter", 4104 * 3, 2064),
            ("gemmAllReduce", 4104 * 3, 2064))])
        with self.assertRaises(SystemExit) as e:
            torch_fused.read_shapes(None, 2, {"gemmReduceScatter"}, [(1000, 4104, 2056)])
        self.assertIn("1000 x 4104 x 2056", str(e.exception))
        self.assertEqual(torch_fused.read_shapes(None, 2, {"allGatherGemm"}, [(1000, 4112, 2056)]),
                         [("allGatherGemm", "explicit", 1000, 2056, 2056, "")])

    def test_random_set_reads_alike_at_every_world(self):
        # random_shapes.py's file: per op `count` shapes in range, each split a multiple of 8 at
        # W = 2, 3 and 4 (torch_fused.py refuses nothing), the set in every tuple, and the same
        # seed giving the same file.
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "random.txt")
            with contextlib.redirect_stderr(io.StringIO()):
                self.assertEqual(random_shapes.main(["--count", "24", "--seed", "99", "--out", path]), 99)
            text = open(path).read()
            with contextlib.redirect_stderr(io.StringIO()):
                random_shapes.main(["--count", "24", "--seed", "99", "--out", path])
            self.assertEqual(open(path).read(), text)
            whole = torch_fused.read_shapes(path, 1, set(torch_fused.OPS.values()))
            self.assertEqual(len(whole), 72)
            for op, label, m, n, k, sname in whole:
                self.assertEqual((sname, label), ("random-99", f"r{m}x{n}x{k}"))
                self.assertTrue(1 <= m <= 16384 and 256 <= n <= 16384 and 256 <= k <= 16384)
                self.assertEqual((n if op == "allGatherGemm" else k) % 96, 0)
                self.assertEqual((k if op == "allGatherGemm" else n) % 8, 0)
            for w in (2, 3, 4):
                self.assertEqual(len(torch_fused.read_shapes(path, w, set(torch_fused.OPS.values()))), 72)
            self.assertGreater(len({m % 128 for _, _, m, _, _, _ in whole}), 10)  # M off the tiles


class RingShapesTest(unittest.TestCase):
    def test_the_shape_file_parses(self):
        pts = torch_ring.read_shapes(os.path.join(here, "..", "shapes", "ring.txt"))
        self.assertIn(("ring-s32k-d128-c", 1, 32768, 16, 16, 128, 1), pts)
        self.assertTrue(any(p[6] == 0 for p in pts) and any(p[3] != p[4] for p in pts))
        for _, _, s, *_ in pts:  # every shape splits into 2W equal chunks at W = 2 and 4
            self.assertEqual(s % 8, 0)

    def test_positions_are_the_products_layouts(self):
        # contiguous: rank r holds [r·S/W, (r+1)·S/W); zigzag: chunks r and 2W-1-r of 2W
        self.assertEqual(torch_ring.positions(8, 2, 1, False), [4, 5, 6, 7])
        self.assertEqual(torch_ring.positions(8, 2, 0, True), [0, 1, 6, 7])
        self.assertEqual(torch_ring.positions(8, 2, 1, True), [2, 3, 4, 5])
        for w in (1, 2, 3, 4):
            for zigzag in (False, True):
                got = sorted(p for r in range(w) for p in torch_ring.positions(48, w, r, zigzag))
                self.assertEqual(got, list(range(48)))

    def test_zigzag_steps_see_what_causality_allows(self):
        # Each (query rows, key rows) pair of a step must be exactly what the causal mask leaves
        # between the rank's positions and the block's: nothing missed, nothing masked out.
        W, S = 3, 24
        for r in range(W):
            ring = torch_ring.Ring(r, W, True, 2, 2)
            qp = torch_ring.positions(S, W, r, True)
            for step in range(W):
                kp = torch_ring.positions(S, W, (r - step) % W, True)
                seen = set()
                for qs, ks, causal in ring.pairs(step, len(qp)):
                    for i, q in enumerate(qp[qs]):
                        for j, k in enumerate(kp[ks]):
                            if not causal or (qs.start or 0) + i >= (ks.start or 0) + j:
                                seen.add((q, k))
                want = {(q, k) for q in qp for k in kp if k <= q}
                self.assertEqual(seen, want, (r, step))


class MoeShapesTest(unittest.TestCase):
    def test_the_shape_file_parses(self):
        pts = torch_moe.read_shapes(os.path.join(here, "..", "shapes", "moe.txt"))
        self.assertGreaterEqual(len(pts), 30)
        self.assertIn(("ds_up_w4", 7168, 2048, 64, 128, "balanced", False), pts)
        self.assertTrue(any(p[6] for p in pts))  # some kn points
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
            f.write("x 64 64 4 8 uniform nk\n")
        try:
            with self.assertRaises(SystemExit):
                torch_moe.read_shapes(f.name)
        finally:
            os.unlink(f.name)

    def test_routings_keep_the_total_and_skew_is_seeded_with_empty_experts(self):
        self.assertEqual(torch_moe.segment_sizes(4, 128, "balanced"), [128] * 4)
        for experts in (2, 8, 64, 256):
            a = torch_moe.segment_sizes(experts, 256, "skewed-7")
            self.assertEqual(sum(a), experts * 256)
            self.assertEqual(a.count(0), max(1, experts // 8))
            self.assertEqual(a, torch_moe.segment_sizes(experts, 256, "skewed-7"))
        self.assertNotEqual(torch_moe.segment_sizes(64, 256, "skewed-7"),
                            torch_moe.segment_sizes(64, 256, "skewed-8"))

    def test_variants(self):
        self.assertEqual(torch_moe.parse_variant("t128g1c66s1"),
                         dict(tile_n=128, group_m=1, num_ctas=66, tma_store=1))
        for bad in ("x1", "t128x", "128", ""):
            with self.assertRaises(SystemExit):
                torch_moe.parse_variant(bad)


if __name__ == "__main__":
    unittest.main()
